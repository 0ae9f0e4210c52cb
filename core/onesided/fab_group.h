/*
 * The one-sided engine behind NCCL's RMA (and GIN proxy) tables: a group of
 * ranks connected all to all (a one-sided group), symmetric windows, and put, get,
 * put-with-signal and flush between them.
 *
 * Built on the point-to-point layer: connect makes one send comm and one
 * recv comm per peer with the ordinary handshake (so addresses, checks and
 * the transport's comm ids come for free), and the collective exchanges
 * (hello, windows) are tagged messages on those comms. Data never goes
 * through them: puts, gets and signals are RDMA operations posted directly
 * on the endpoint (core/fabric/fab_remote.c, window-checked), and what lands at a
 * target is named by the rdma transport's remote CQ data with its one-sided
 * slot (transports/rdma/rd_proto.h), dispatched to fab_group_target_landed
 * under the target endpoint's lock.
 *
 * Signals are applied by the target, never by the provider: every put carries
 * its number, the target tracks the prefix of its source's puts that have all
 * landed (whatever order they complete in), and a signal record
 * (fab_group_sig) applies once that prefix covers every put its source
 * posted before it. Where the provider places one source's writes in order
 * (FI_ORDER_WAW granted: dev->ordered_writes), a record already lands after
 * every earlier put, so puts are plain writes with no completion at the
 * target at all. So a signal is never visible
 * before its own data nor before any earlier put of the same source, on any
 * provider, whatever ordering it offers (every signal is strong). Records
 * go into a ring per (target, source); the target gives slots back with
 * acknowledgements.
 */
#ifndef FAB_GROUP_H
#define FAB_GROUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

#include "fab_engine.h"
#include "fab_mr.h"
#include "fab_remote.h"

enum {
  FAB_GROUP_RING = 64,          /* signal records in flight per (source, target) */
  FAB_GROUP_SCRATCH = 64,       /* bytes past a ring where acknowledgements land */
  FAB_GROUP_MAX_CONTEXTS = 256, /* contexts per createContext */
  FAB_GROUP_REQ_CHUNK = 256,    /* requests are allocated this many at a time */
  FAB_GROUP_XCHG_BYTES = 64,    /* one rank's part of a collective exchange */
  FAB_GROUP_SHADOW_MAX = 65536, /* largest GPU window whose signal words are shadowed */
  FAB_GROUP_SERVE_OTHERS_EVERY = 16, /* progress calls between services of the other groups' due work */
};

/* What the low 32 bits of a one-sided write's remote CQ data say. */
enum {
  FAB_GROUP_PUT = 1,
  FAB_GROUP_SIGNAL = 2,
  FAB_GROUP_ACK = 3,
  FAB_GROUP_ACK_PUTS = 4,
  FAB_GROUP_STAGED = 5,     /* a chunk landed in the target's staging slot (value: the slot) */
  FAB_GROUP_ACK_STAGED = 6, /* chunks the target has copied out of its staging ring */
};
/* Values ride in 11 bits, so that a write's whole identity fits the 4 bytes
 * of remote CQ data EFA and verbs carry (transports/rdma/rd_proto.h): puts
 * carry their number mod 2^11; a target tracks which landed in a window of
 * FAB_GROUP_PUT_WINDOW past the prefix that all did, and a source never runs
 * further ahead of the prefix the target acknowledged. Counts acknowledged
 * are widened against the receiver's own, never 2^10 apart. */
enum { FAB_GROUP_VALUE_BITS = 11, FAB_GROUP_VALUE_MASK = (1u << FAB_GROUP_VALUE_BITS) - 1 };
enum { FAB_GROUP_PUT_WINDOW = 1 << 9 };
/* The room a put of n chunks (numbered puts) waits for before it is queued:
 * at most 3/4 of the window, since a target acknowledges every quarter and
 * may hold up to a quarter landed but unacknowledged; a larger put's chunks
 * each wait for theirs as the staging pump posts them. */
static inline uint64_t fab_group_window_need(uint64_t n) {
  return n < FAB_GROUP_PUT_WINDOW / 4 * 3 ? n : FAB_GROUP_PUT_WINDOW / 4 * 3;
}
static inline uint32_t fab_group_cq_low(unsigned kind, uint32_t value) {
  return (uint32_t)kind << 28 | (value & FAB_GROUP_VALUE_MASK);
}

/* One signal record, written into the target's ring slot seq % FAB_GROUP_RING. */
typedef struct fab_group_sig {
  uint64_t puts_before; /* puts from this source that land before the signal applies */
  uint64_t offset;      /* in the target's window */
  uint64_t value;
  uint32_t seq;         /* the signal's number from this source */
  uint32_t window;      /* the symmetric registration's id */
  uint32_t op;          /* FAB_SIGNAL_INC / FAB_SIGNAL_ADD */
  uint32_t token;       /* the group's token: a record of another group is refused */
  uint32_t check;       /* fab_group_sig_check */
  uint32_t get;         /* FAB_GROUP_OP_GET: the get's number from this source */
} fab_group_sig;
_Static_assert(sizeof(fab_group_sig) == 48, "fab_group_sig layout");

/* A record's op besides NCCL's signal ops: "send me value bytes of window
 * at offset" (a get from or into a staged window: the target answers with
 * chunks into our staging ring, fab_group_stage.c). */
enum { FAB_GROUP_OP_GET = 0x100, FAB_GROUP_GETS = 256 /* gets in flight per (source, target) */ };
/* ... and "my registration `window` is gone": applied after every earlier
 * put of the sender, the target marks the sender's window withdrawn
 * (operations into it are refused from then on); its acknowledgement, or
 * its own withdrawal of the same window, tells the sender so
 * (fab_group_withdraw). */
enum { FAB_GROUP_OP_WITHDRAW = 0x200, FAB_GROUP_WITHDRAW_WAIT_MS = 5000 };

static inline uint32_t fab_group_sig_check(const fab_group_sig* s) {
  return (uint32_t)(s->puts_before ^ s->offset ^ s->value) ^ s->seq ^ s->window ^ s->op ^ s->token ^ s->get ^
         0x47495346u;
}

/* At the head of a staging slot: where the chunk after it goes. Windows in
 * GPU memory on a provider without FI_HMEM are not registered with the
 * provider; a put into one is written in chunks into the target's staging
 * ring for its source, and the target copies each into the window
 * (fab_group_stage.c). */
typedef struct fab_group_chunk {
  uint64_t put;      /* the put number this chunk counts as */
  uint64_t offset;   /* in the target's window */
  uint32_t len;      /* bytes after this header */
  uint32_t window;   /* the symmetric registration's id */
  uint32_t seq;      /* the chunk's number from this source */
  uint32_t token;    /* the source group's token */
  uint32_t check;    /* fab_group_chunk_check */
  uint32_t get;      /* window FAB_GROUP_GET_REPLY: the get it answers (offset: within the get) */
  uint32_t reserved[6];
} fab_group_chunk;
_Static_assert(sizeof(fab_group_chunk) == 64, "fab_group_chunk layout");
enum { FAB_GROUP_GET_REPLY = 0xffffffffu };

static inline uint32_t fab_group_chunk_check(const fab_group_chunk* c) {
  return (uint32_t)(c->put ^ c->offset ^ (c->put >> 32) ^ (c->offset >> 32)) ^ c->len ^ c->window ^ c->seq ^
         c->token ^ c->get ^ 0x43484e4bu;
}

struct fab_group_win;
/* A get of ours waiting for its data (source side, group->lock). */
typedef struct fab_group_inflight_get {
  struct fab_group_req* req; /* NULL: the slot is free */
  struct fab_group_win* local;
  uint64_t local_off, size, done;
  uint32_t id;
} fab_group_inflight_get;

/* A peer's get to serve (target side). */
typedef struct fab_group_ask {
  uint64_t offset, size;
  uint32_t window, id;
} fab_group_ask;

typedef struct fab_group fab_group;
struct fab_group_req;

/* One slot of a source's staging ring towards a peer: a chunk copied out of
 * the source window, being written. */
typedef struct fab_group_txslot {
  fab_op op;
  struct fab_group_req* req;
  _Atomic int busy;
} fab_group_txslot;

typedef struct fab_group_peer {
  fab_group* group;
  int rank;
  void* send_h;         /* handles of the point-to-point comms */
  void* recv_h;
  fab_comm* sc;         /* our writes to the peer go out through sc */
  fab_comm* rc;         /* the peer's writes to us are named by rc's id */
  fab_onesided_hook hook; /* rc's FAB_EXT_ONESIDED while the group lives: fab_group_target_landed, this peer */
  fab_window ring;      /* the peer's ring for our signal records (+ scratch) */
  uint32_t token;       /* the peer's: its records carry it */
  /* source side (group->lock, except the atomics) */
  uint64_t puts_posted;
  _Atomic uint64_t puts_acked;  /* the peer's landed prefix, as it acknowledged it */
  _Atomic uint32_t sig_seq;     /* signals issued (written under group->lock) */
  _Atomic uint32_t sig_acked;  /* records the peer has consumed */
  fab_list waiting;            /* signal requests waiting for ring room */
  uint64_t ops_posted;         /* every operation posted to the peer */
  _Atomic uint64_t ops_done;
  _Atomic int ack_inflight;    /* an acknowledgement write of ours is in flight */
  fab_op ack_op;
  uint64_t ack_word;
  /* target side (the target endpoint's lock) */
  uint64_t puts_landed;        /* every put numbered below this one has landed */
  uint64_t* put_seen;          /* bit per put in [puts_landed, puts_landed + FAB_GROUP_PUT_WINDOW) */
  _Atomic uint64_t puts_landed_pub; /* = puts_landed, for the acknowledging side */
  uint64_t puts_acked_sent;    /* prefix last acknowledged (group->lock) */
  uint64_t puts_acked_seen;    /* prefix when the last acknowledgement was flagged due (target lock) */
  uint32_t sig_next;           /* the next record to apply */
  _Atomic uint32_t sig_applied; /* = sig_next, for the acknowledging side */
  uint32_t consumed_acked;     /* applied count last acknowledged (group->lock) */
  uint8_t landed[FAB_GROUP_RING];
  fab_group_sig* ring_mem;      /* our ring for the peer's records */
  fab_remote_buf ring_reg;
  char bad[96];                /* the protocol error that failed the peer, if any */
  _Atomic int gpu_sig_due;     /* a record waits to be applied to a GPU window (progress does it) */
  /* staging, source side (group->lock, except the atomics) */
  fab_window stage;            /* the peer's staging ring for our chunks; len 0: it has none */
  uint32_t stage_slots, stage_slot_bytes;
  _Atomic uint32_t chunk_seq;  /* chunks written into the peer's ring (counted before each is posted) */
  _Atomic uint32_t chunk_acked; /* chunks the peer has copied out */
  char* tx_mem;                /* our slots for chunks to the peer (FABRIC_RMA_STAGE_*) */
  fab_remote_buf tx_reg;
  int tx_pinned;
  fab_group_txslot* tx;
  uint32_t tx_next;            /* slots are used in turn */
  fab_list staging;            /* requests with bytes still to stage, in order */
  /* staging, target side: the peer's chunks in our ring (landed: target lock; the rest group->lock) */
  uint8_t* rx_landed;
  uint32_t rx_next;            /* the next chunk to copy out */
  _Atomic uint32_t rx_done;    /* = rx_next, for the acknowledging side */
  uint32_t rx_acked_sent;      /* copied-out count last acknowledged */
  /* gets by request: ours to the peer (group->lock), and the peer's to us (added under the target lock,
   * served under group->lock) */
  fab_group_inflight_get* gets;          /* FAB_GROUP_GETS, by id */
  uint32_t get_seq;
  fab_group_ask* asks;          /* FAB_GROUP_GETS, a ring */
  _Atomic uint32_t ask_head, ask_tail;
} fab_group_peer;

/* A symmetric registration: ours, and every rank's window for it. */
typedef struct fab_group_win {
  uint32_t magic;
  uint32_t id;           /* the same on every rank: registrations are collective */
  void* handle;
  fab_group* group;
  void* mr_handle;       /* the point-to-point registration behind it */
  fab_mr* mr;
  uintptr_t base;
  size_t len;
  int gpu;               /* our window is GPU memory: only fab_devcopy touches it */
  int staged;            /* ... not registered with the provider: puts into it are staged */
  uint64_t* shadow;      /* a GPU window's signal words as we last stored them (only the network writes
                          * them: NEVER_RESET), so a signal is one store, not a read and a store */
  uint8_t* shadow_known;
  fab_window* remote;    /* per rank */
  uint8_t* remote_staged; /* per rank: that rank's window is staged */
  _Atomic uint8_t* remote_gone; /* per rank: that rank deregistered its window (FAB_GROUP_OP_WITHDRAW) */
} fab_group_win;

struct fab_group {
  uint32_t magic;
  void* handle;
  pthread_mutex_t lock;  /* source-side state, requests */
  pthread_mutex_t xchg_lock; /* collective calls: one exchange at a time */
  fab_device* dev;
  fab_endpoint* target_ep; /* where the peers' writes land (every rc lives there) */
  int nranks, rank;
  uint32_t token;
  fab_group_peer* peers;  /* per rank; peers[rank] is unused */
  fab_endpoint* eps[FAB_MAX_DEVICES + 16]; /* distinct endpoints to poll */
  int neps;
  uint32_t next_win;     /* id of the next symmetric registration */
  fab_group_win** wins;   /* by id (NULL once deregistered); target_ep lock to change */
  uint32_t nwins;
  uint32_t xchg_seq;     /* collective exchanges so far (their tags) */
  void* xchg_buf;        /* registered: nranks parts to send, nranks to receive */
  void* xchg_mh;
  fab_list free_reqs;
  fab_list chunks;
  fab_list ctxs;         /* live contexts */
  int own_contexts;      /* contexts the comm stands for itself (GIN v11/v12) */
  const volatile uint32_t* abort_flag; /* NCCL's, while connect waits (RMA v17+; NULL: none) */
  int ordered;           /* the provider places our writes in order (dev->ordered_writes): puts need no
                          * number and no completion at the target; every rank must agree */
  _Atomic int failed;    /* a peer or the group failed: every call after returns the error */
  _Atomic int due;       /* waiting records or acknowledgements to post: progress takes the lock */
  char why[192];
  /* our staging ring: every peer's chunks for our staged windows (fab_group_stage.c) */
  char* rx_mem;
  fab_remote_buf rx_reg;
  int rx_pinned;
  uint32_t rx_slots, rx_slot_bytes;
  int gpu_direct;        /* a window of ours is GPU memory the provider writes into (flush before signals) */
  int gpu_path_said;     /* the INFO line naming the GPU windows' path was logged */
  fab_list owned;        /* requests of our own (answers to peers' gets, withdrawals): freed once complete */
  fab_list live;         /* in the process's list of groups (fab_group_register) */
  _Atomic int op_failed; /* an operation failed (queryLastError), whether or not the group did */
  _Atomic uint32_t progress_calls; /* every FAB_GROUP_SERVE_OTHERS_EVERY-th serves the other groups */
};

/* A context: an ordering domain to NCCL; here a validated name for a range of
 * contexts (the engine orders every source's signals after all its puts). */
typedef struct fab_group_ctx {
  void* handle;
  fab_group* group;
  int ncontexts;
  fab_list node; /* group->ctxs */
} fab_group_ctx;

/* A put, get, signal or flush: a request of kind fab_group_req_kind
 * (fab_reqhead.h); FAB_REQ_ORPHAN: failed, kept out of the pool until close. */
typedef struct fab_group_req {
  fab_req_head head;
  uint8_t flush;        /* a flush: done once the peer's ops_done reaches flush_target */
  fab_group* group;
  fab_group_peer* peer;
  _Atomic int pending;  /* operations posted and not complete */
  _Atomic int failed;
  fab_result result;
  char why[160];
  uint64_t flush_target;
  fab_op ops[2];        /* the data write or read, the signal record */
  fab_group_sig sig;     /* staged until the ring has room */
  fab_list node;        /* free list, or the peer's waiting list */
  fab_list own_node;    /* group->owned: a request of the group's own (nobody tests it), freed once complete */
  /* a staged put: what is still to be copied out and written (group->lock) */
  fab_group_win *st_src, *st_dst;
  uint64_t st_src_off, st_dst_off, st_put;
  size_t st_left;
  int st_ring;          /* into the peer's staging ring (its window is staged), else into its window */
  int st_get;           /* an answer to the peer's get st_get_id: st_dst_off counts within the get */
  uint32_t st_get_id;
  fab_list st_node;     /* the peer's staging list */
} fab_group_req;

/* One operation of r is over (err: it failed, with that text): only r and
 * its peer's atomic count are touched, and the pending count is the last
 * write. Any thread, no lock. */
static inline void fab_group_req_op_over(fab_group_req* r, int fi_err, const char* what) {
  /* a completed write or read is a sign of the peer's life (liveness: fab_comm_stalled) */
  if (!fi_err && r->peer->sc) fab_comm_count_completion(r->peer->sc);
  if (fi_err && !atomic_exchange(&r->failed, 1)) {
    r->result = fab_result_from_fi(fi_err);
    snprintf(r->why, sizeof(r->why), "%s to rank %d failed: %s", what, r->peer->rank, fi_strerror(fi_err));
  }
  atomic_fetch_add_explicit(&r->peer->ops_done, 1, memory_order_release);
  atomic_fetch_sub_explicit(&r->pending, 1, memory_order_acq_rel);
}

/* The files call down this list only: target <- stage <- ops <- xchg <-
 * fab_group (connect, close) <- api. */

/* fab_group_target.c: the group's failure, and what lands at a target. */
fab_group* fab_group_get(void* handle, const char* fn);
/* Fails the group (sticky), with one WARN naming fn and why. */
fab_result fab_group_fail(fab_group* g, fab_result rc, const char* fn, const char* why);
/* Set when NCCL raised the abort flag it gave connect: a waiting collective call gives up. */
static inline int fab_group_aborted(const fab_group* g) { return g->abort_flag && *g->abort_flag; }
static inline fab_result fab_group_fail_aborted(fab_group* g, const char* fn) {
  return fab_group_fail(g, FAB_ERR_INTERNAL, fn, "NCCL raised its abort flag (ncclCommAbort, or an error on another "
                       "rank) while this call waited for peers; giving up");
}
/* A peer's write with remote CQ data on its recv comm rc (the comm's
 * FAB_EXT_ONESIDED hook; arg: its fab_group_peer). ep lock held. */
void fab_group_target_landed(fab_comm* rc, void* arg, uint32_t low);
/* Applies what waits for progress: staged chunks copied into their windows,
 * signals into GPU windows. group->lock held. */
void fab_group_target_drain(fab_group* g);
/* Adds add to the signal word at off in our GPU window w, after the data
 * before it (a GPUDirect flush where a provider wrote into GPU memory): one
 * 8-byte store, ordered after every copy into GPU memory made before it. A
 * failure fails the group. Target lock held. */
fab_result fab_group_gpu_signal(fab_group* g, fab_group_win* w, uint64_t off, uint64_t add, const char* fn);

/* fab_group_stage.c: staging through host memory for GPU windows the
 * provider cannot reach. */
/* Our staging ring for peers' chunks, made at the first staged window. */
fab_result fab_group_stage_rx_make(fab_group* g, const void* gpu_window, const char* fn);
/* Queues a staged put of r (chunks counted in r->pending) and posts what the
 * slots allow. group->lock held. */
void fab_group_stage_put(fab_group_peer* p, fab_group_req* r);
/* Posts queued chunks while slots allow; 1 while some still wait. group->lock. */
int fab_group_stage_pump(fab_group_peer* p);
/* Chunks a staged put of size bytes takes to p (ring: into its staging ring). */
uint64_t fab_group_stage_chunks(fab_group_peer* p, size_t size, int ring);
/* The ring of p's gets to serve and of ours in flight (made on first use). */
int fab_group_gets_make(fab_group_peer* p);
/* Fails and unqueues the staged puts and gets reading or writing w (deregistered). */
void fab_group_stage_drop_window(fab_group* g, fab_group_win* w);
/* Releases the staging rings (ours retired: peers may still write; target
 * lock held). leak: operations are still in flight, their slots stay. */
void fab_group_stage_free(fab_group* g, int leak);

/* fab_group_xchg.c. One round of an all-to-all exchange: part[i]
 * (FAB_GROUP_XCHG_BYTES) goes to rank i, and out[i] receives rank i's part
 * for us. Blocking, with the connect timeout; xchg_lock held. */
fab_result fab_group_exchange(fab_group* g, const void* parts, void* out, const char* fn);
/* The same with the parts already in place (fab_group_part_out), receiving
 * rank r's part into fab_group_part_in(r) from recv_h[r]. */
fab_result fab_group_exchange_on(fab_group* g, void** recv_h, int tag, const char* fn);
static inline char* fab_group_part_out(fab_group* g, int rank) {
  return (char*)g->xchg_buf + (size_t)rank * FAB_GROUP_XCHG_BYTES;
}
static inline char* fab_group_part_in(fab_group* g, int rank) {
  return (char*)g->xchg_buf + (size_t)(g->nranks + rank) * FAB_GROUP_XCHG_BYTES;
}

/* fab_group.c: connect, close. */
void fab_group_ctxs_drop(fab_group* g);
void fab_group_win_free(fab_group_win* w);

/* fab_group_ops.c: requests and one-sided operations. */
/* The process's live groups: progress of any serves every group's due work. */
void fab_group_register(fab_group* g);
void fab_group_unregister(fab_group* g);
/* Drives every endpoint of the group, then its waiting signals and acks. */
fab_result fab_group_poll(fab_group* g);
fab_result fab_group_progress(fab_group* g);
/* Completion of an acknowledgement write (a peer's ack_op). */
void fab_group_ack_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err);
fab_result fab_group_post_waiting(fab_group* g);
/* Our window w is being deregistered: every peer is told (a WITHDRAW
 * record) and, for at most FAB_GROUP_WITHDRAW_WAIT_MS, confirms it has seen
 * it (its writes into w before that have landed: they precede its
 * acknowledgement), so that none writes into w once its registration
 * closes. No lock held. */
void fab_group_withdraw(fab_group* g, fab_group_win* w);
void fab_group_reqs_free(fab_group* g);
/* 1 while any request of the group is posted and not complete. */
int fab_group_busy(fab_group* g);

#endif /* FAB_GROUP_H */
