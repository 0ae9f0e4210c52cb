/*
 * The engine's object model, shared by the core and the transports.
 *
 *   engine (one per process, while some init is live)
 *    +- device[]         one per (provider, domain), then virtual devices
 *    |   +- domain       fabric + domain + MR cache, opened on first use
 *    +- ctx[]            one per fab_init (v11+) plus the process context;
 *    |                   owns the comms, listeners and connects made in it
 *    +- endpoint[]       one per physical device, shared by all contexts,
 *        |               created on first use: ep + CQ + AV + lock
 *        +- listen comms, pending connects, send/recv comms,
 *        |  parked objects (closed, waiting for completions)
 *        +- private endpoints: on local-only providers (shm), one for
 *           each further send comm to a peer the shared endpoint already
 *           sends to, owned by the comm, up to a cap; one whose
 *           comm closed with sends in flight retires (progressed by its
 *           shared endpoint, destroyed once they complete)
 *
 * Every libfabric operation carries a fab_op as its context; completions are
 * dispatched through fab_op.fn. Control operations (handshake, probes) are
 * dispatched under the endpoint's lock, which serialises handshake state;
 * data operations (fab_op.unlocked) without it. The data path takes no lock
 * and no atomic read-modify-write of ours: like NCCL's own transports, it
 * relies on NCCL calling the data functions of one comm from one thread at a
 * time, so a comm's request pool belongs to that thread.
 */
#ifndef FAB_ENGINE_H
#define FAB_ENGINE_H

#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdatomic.h>

#include "fab_core.h"
#include "fab_log.h"
#include "fab_objtab.h"
#include "fab_params.h"
#include "fab_pool.h"
#include "fab_util.h"
#include "fab_wire.h"

enum { FAB_MAX_DEVICES = 64 };

typedef struct fab_transport_ops fab_transport_ops;
typedef struct fab_mr_cache fab_mr_cache;
typedef struct fab_endpoint fab_endpoint;
typedef struct fab_comm fab_comm;
typedef struct fab_req fab_req;

/* --- operations and parked objects ---------------------------------------- */

typedef struct fab_op fab_op;
/* Exactly one of done / err is non-NULL. Runs with the endpoint lock held,
 * except a successful completion of an unlocked operation. */
typedef void (*fab_op_fn)(fab_op* op, const struct fi_cq_msg_entry* done, const struct fi_cq_err_entry* err);

struct fab_op {
  struct fi_context2 ctx; /* first: libfabric's op_context points here */
  fab_op_fn fn;
  void* owner;
  uint32_t index;
  uint32_t unlocked; /* data operation: its success is dispatched without the endpoint lock */
};

static inline void fab_op_init(fab_op* op, fab_op_fn fn, void* owner, uint32_t index) {
  op->fn = fn;
  op->owner = owner;
  op->index = index;
  op->unlocked = 0;
}

/* A data operation. Its fn, when called without the lock, may touch only its
 * own request and the comm's completion counter, and must make the request's
 * pending count its last write: a comm closed meanwhile is freed by whoever
 * next sees all its requests' pending counts at zero (fab_comm_sweep_closed). */
static inline void fab_op_init_unlocked(fab_op* op, fab_op_fn fn, void* owner, uint32_t index) {
  fab_op_init(op, fn, owner, index);
  op->unlocked = 1;
}

/* An object with operations in flight that nobody owns any more waits on its
 * endpoint's parked list until its last completion frees it; endpoint
 * teardown destroys whatever is left after the endpoint is closed. */
typedef struct fab_parked {
  fab_list node;
  void (*destroy)(struct fab_parked* p);
} fab_parked;

/* --- devices -------------------------------------------------------------- */

typedef struct fab_domain {
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  fab_mr_cache* mr_cache;
  _Atomic uint64_t next_key; /* requested_key when the provider does not pick keys */
} fab_domain;

typedef struct fab_device {
  int index;
  int physical;          /* 0 for a virtual device */
  int carrier;           /* physical device that carries the traffic (itself, or vprops.devs[0]) */
  struct fi_info* info;  /* physical only */
  fab_domain* dom;       /* physical only; opened on first endpoint */
  const fab_transport_ops* ops;
  fab_tag_layout tags;
  int mr_local;          /* FI_MR_LOCAL: every buffer needs a descriptor */
  int mr_hmem;           /* FI_MR_HMEM: device memory needs registration */
  int prov_key;          /* FI_MR_PROV_KEY granted */
  int hmem;              /* FI_HMEM granted */
  int local_only;        /* no FI_REMOTE_COMM: a further send comm to a peer gets its own endpoint */
  uint32_t prov_hash;
  fab_properties props;
  char name[FAB_NAME_MAX];
  char* pci_path;
} fab_device;

/* --- contexts ------------------------------------------------------------- */

struct fab_ctx {
  void* handle; /* objtab handle given to the runtime */
  uint64_t comm_id;
  int is_process;
  fab_comm_config config;
  fab_net_attr net_attr;
  fab_list node; /* engine's context list */
};

/* --- endpoints ------------------------------------------------------------ */

enum { FAB_CTRL_RX = 16 }; /* untagged receive buffers (connect requests, probes) per endpoint */
enum { FAB_SWEEP_EVERY_MIN = 64, FAB_SWEEP_EVERY_MAX = 4096 }; /* data polls between sweeps */

typedef struct fab_av_entry {
  uint64_t hash;
  size_t len;
  uint8_t addr[FAB_ADDR_MAX];
  fi_addr_t fi_addr;
  uint32_t refs; /* comms and refusals using it */
} fab_av_entry;

struct fab_endpoint {
  pthread_mutex_t lock;
  fab_device* dev; /* physical */
  struct fid_ep* ep;
  struct fid_cq* cq;
  struct fid_av* av;
  uint8_t addr[FAB_ADDR_MAX];
  size_t addr_len;
  int cq_batch;
  _Atomic fab_result failed; /* sticky after the CQ itself failed; read without the lock */
  _Atomic int nclosing;       /* closed comms parked until their data operations complete,
                               * and own endpoints retiring (privates) */
  _Atomic uint32_t sweep_tick;  /* data polls since the last sweep (relaxed, approximate) */
  _Atomic uint32_t sweep_every; /* data polls between sweeps: 64, doubling up to 4096 while
                                 * sweeps free nothing (a send that never completes) */
  int retiring;                 /* own endpoint whose comm closed with sends in flight; it no
                                 * longer counts in its home's nprivates */
  int destroying;             /* teardown under way: no AV removals */
  int hol_blocked;            /* (local-only) a dead peer never took a send of this endpoint, which holds
                               * up its later sends: new send comms get endpoints of their own (ep lock) */
  /* handshake state, under lock */
  struct fab_ctrl_rx* ctrl_rx; /* FAB_CTRL_RX untagged receives for connect requests and probes */
  fab_list listens;
  fab_list connects; /* pending connects */
  fab_list comms;    /* live send and recv comms */
  fab_list parked;
  uint32_t next_conn_id;
  int conn_wrapped;
  uint32_t next_connector_id;
  fab_av_entry* av_cache;
  size_t av_count, av_cap;
  /* private endpoints of send comms (local-only providers), owned here */
  fab_list privates;
  fab_list private_node;
  int nprivates; /* length of privates (home lock) */
};

/* --- comms and requests --------------------------------------------------- */

#define FAB_COMM_MAGIC 0x4d4d4f43u /* "COMM" */
#define FAB_REQ_MAGIC 0x51455246u  /* "FREQ" */

/* ORPHAN: test reported it failed (its comm failed for good) while a libfabric
 * operation still references it; it stays out of the pool until the comm is
 * freed. */
enum { FAB_REQ_FREE = 0, FAB_REQ_ACTIVE = 1, FAB_REQ_ORPHAN = 2 };
enum { FAB_REQ_SEND = 1, FAB_REQ_RECV = 2 };
enum { FAB_SUB_IDLE = 0, FAB_SUB_POSTED = 1, FAB_SUB_DONE = 2 };

typedef struct fab_sub {
  fab_op op;
  void* data;
  size_t size; /* posted size */
  size_t got;  /* bytes received */
  void* desc;
  uint64_t tag;
  _Atomic int state; /* FAB_SUB_*; set DONE by its completion, in any thread */
} fab_sub;

static inline void fab_sub_set_state(fab_sub* s, int state) {
  atomic_store_explicit(&s->state, state, memory_order_relaxed);
}
static inline int fab_sub_state(fab_sub* s) { return atomic_load_explicit(&s->state, memory_order_relaxed); }

struct fab_req {
  uint32_t magic;
  uint8_t state; /* FAB_REQ_* */
  uint8_t type;  /* FAB_REQ_SEND / RECV */
  uint8_t n;
  uint8_t nposted;
  _Atomic int pending; /* sub-operations not completed yet (posted or not); the last
                        * write of a completion: 0 hands r back to its owner */
  fab_result result;   /* first error of a sub-operation */
  uint32_t pool_index; /* its slot in comm->reqs */
  char* errmsg;        /* its description (error path only) */
  fab_comm* comm;
  fab_sub sub[];
};

struct fab_comm {
  uint32_t magic;
  fab_obj_kind kind; /* FAB_OBJ_SEND / RECV */
  void* handle;
  fab_endpoint* ep;
  fab_device* dev; /* as named by the runtime (may be virtual) */
  const fab_transport_ops* ops;
  fi_addr_t peer;
  uint32_t conn_id;
  uint64_t tag_base; /* fab_tag_data(conn_id, 0) */
  size_t max_bytes;
  int mr_local;
  int closing;
  /* the memory handle resolved last (owner thread only), valid while
   * fab_mr_generation has not moved: NCCL sends and receives a connection's
   * steps out of one registered buffer, so this skips the handle lookup */
  void* mr_last_handle;
  struct fab_mr* mr_last;
  uint64_t mr_last_gen;
  fab_endpoint* home; /* shared endpoint that owns ep when ep is the comm's own */
  fab_ctx* owner;     /* the context it was created in: finalize closes it */
  _Atomic fab_result error; /* sticky failure of the connection itself (set under ep lock) */
  char error_why[160];
  fab_comm_config config;
  _Atomic int inflight; /* control operations (probe, answer) posted and not completed; data
                         * operations are tracked by their requests (fab_comm_busy) */
  fab_parked park;      /* in ep->comms while live, ep->parked once closed */
  fab_pool reqs;
  fab_req* backlog;     /* recv: grouped receive not fully posted yet */
  fab_op answer_op;     /* recv: the accept answer in flight */
  fab_wire_accept answer;
  struct fid_mr* answer_mr;
  /* peer liveness (ep lock; ncompl and stall_polls are relaxed counters
   * bumped without it) */
  _Atomic uint64_t ncompl;
  uint64_t ncompl_seen;
  int64_t stall_since_ms, last_probe_ms;
  int probe_posted;
  int peer_in_process; /* no liveness check: see fab_ep_addr_in_process */
  _Atomic uint32_t stall_polls;
  fab_op probe_op;
  char peer_name[96];
};

/* --- engine --------------------------------------------------------------- */

typedef struct fab_engine {
  pthread_mutex_t lock;
  _Atomic int up;
  int ninit;         /* live fab_init contexts */
  fab_ctx* process;  /* fab_init_process context */
  struct fab_params params;
  fab_device* devs[FAB_MAX_DEVICES];
  _Atomic int ndevs;
  int nphys;
  fab_list ctxs;
  /* one endpoint per physical device, shared by every context, created on
   * first use and closed when the engine goes down */
  _Atomic(fab_endpoint*) eps[FAB_MAX_DEVICES];
  int cuda_ok;
} fab_engine;

extern fab_engine fab_g;

/* fab_plugin.c */
fab_ctx* fab_ctx_resolve(fab_ctx* handle, const char* fn); /* NULL -> process context; WARNs */
fab_device* fab_device_get(int dev, const char* fn);        /* WARNs */
/* listen/connect prologue: the context (NULL handle: the process context),
 * device dev and its shared endpoint; WARNs and returns the error. */
fab_result fab_ctx_endpoint(fab_ctx* handle, int dev, const char* fn, fab_ctx** ctx, fab_device** d,
                            fab_endpoint** ep);

/* fab_signals.c: puts handlers a PSM library installed (they write *.btr
 * files and call exit()) back to the default action; returns how many. */
int fab_signals_reset_psm(void);

/* fab_device.c */
fab_result fab_devices_discover(void);
void fab_devices_release(void);
fab_result fab_domain_open(fab_device* dev);
fab_result fab_vdevice_create(const fab_vdevice_props* vp, int* out); /* engine lock held */
const char* fab_device_provider(const fab_device* dev);

/* fab_comm.c */
void fab_comm_free(fab_comm* c);
/* Initialises a pooled request the first time it is handed out. */
void fab_comm_req_first_use(fab_comm* c, fab_req* r);
/* Marks the connection failed (sticky); later calls on it return the error.
 * ep lock held. Does not WARN: the calls that return the error do. Posted
 * receives stay posted until the comm closes: the comm's owner may be
 * using its requests in another thread right now. */
void fab_comm_fail(fab_comm* c, fab_result rc, const char* why);
/* A transport's test calls this while a request of c stays pending: after
 * FAB_STALL_POLLS polls it looks for signs of life from the peer, probes it,
 * and fails the comm after FABRIC_PEER_TIMEOUT_MS without any. */
enum { FAB_STALL_POLLS = 256, FAB_PROBE_INTERVAL_MS = 1000 };
void fab_comm_check_peer(fab_comm* c);
static inline void fab_comm_stalled(fab_comm* c) {
  /* A load and a store, not an atomic add: this runs on every poll that
   * finds its request pending, and a lost count between racing threads only
   * delays the check a little. */
  uint32_t polls = atomic_load_explicit(&c->stall_polls, memory_order_relaxed) + 1;
  atomic_store_explicit(&c->stall_polls, polls, memory_order_relaxed);
  if (FAB_UNLIKELY(polls >= FAB_STALL_POLLS)) {
    atomic_store_explicit(&c->stall_polls, 0, memory_order_relaxed);
    fab_comm_check_peer(c);
  }
}
void fab_conn_endpoint_teardown(fab_endpoint* ep);
/* fab_listen.c: posts the endpoint's control receives (connect requests and
 * liveness probes); called once when the endpoint is created. */
fab_result fab_ctrl_rx_setup(fab_endpoint* ep);

/* fab_endpoint.c */
fab_result fab_endpoint_create(fab_device* dev, fab_endpoint** out);
void fab_endpoint_destroy(fab_endpoint* ep);
/* Reads one batch of completions and dispatches them. Caller holds ep->lock. */
fab_result fab_ep_progress_locked(fab_endpoint* ep);
/* Data-path progress (test, and isend/irecv on -FI_EAGAIN). The provider is
 * FI_THREAD_SAFE, so the CQ is read without the endpoint lock; the lock is
 * taken only to dispatch what was read. An empty poll -- nearly every poll
 * of a spinning test -- then costs what fi_cq_read costs, with no lock
 * round trip of ours on top of the provider's own. */
fab_result fab_ep_poll(fab_endpoint* ep);
static inline void fab_ep_try_progress(fab_endpoint* ep) { fab_ep_poll(ep); }
/* Inserts (or finds) a peer address and takes a reference on it. Caller
 * holds ep->lock. */
int fab_ep_av_insert(fab_endpoint* ep, const void* addr, size_t len, fi_addr_t* out);
/* 1 with *out set when addr is in ep's address vector (no reference taken).
 * Caller holds ep->lock. */
int fab_ep_av_find(const fab_endpoint* ep, const void* addr, size_t len, fi_addr_t* out);
/* Drops a reference. On local-only providers the last one removes the address
 * from the AV: their send endpoints are per comm, so without removal the
 * shared endpoint would accumulate one address per comm ever connected (shm
 * maps at most 256). Caller holds ep->lock, or ep is being destroyed. */
void fab_ep_av_release(fab_endpoint* ep, fi_addr_t a);
void fab_ep_peer_name(fab_endpoint* ep, fi_addr_t a, char* buf, size_t len);
/* 1 when addr names an endpoint of this very process (intra-host providers
 * with our endpoint names): such a peer cannot die on its own, and once its
 * endpoint is closed, libfabric 1.17's shm faults on anything sent to it
 * from the same process (unit.threads.shm). */
int fab_ep_addr_in_process(const fab_endpoint* ep, const void* addr, size_t len);
void fab_ep_park(fab_endpoint* ep, fab_parked* p);
/* Registers a control-message buffer where the provider needs descriptors
 * (FI_MR_LOCAL); returns 0 or a negative fi errno. */
int fab_ep_ctrl_reg(fab_endpoint* ep, void* buf, size_t len, struct fid_mr** mr, void** desc);
void fab_ep_ctrl_dereg(struct fid_mr* mr);

/* 1 while libfabric still holds an operation context of c: a control
 * operation (inflight) or a request with a posted sub-operation that has not
 * completed (pending > 0; a grouped receive's unposted part is abandoned when
 * the comm closes). Scans the comm's used requests: for close time only. */
int fab_comm_busy(fab_comm* c);

/* A sign of life for the liveness check: a load and a store, not an atomic
 * add, since completions of one comm may be dispatched by several threads
 * and a lost count only delays the check. */
static inline void fab_comm_count_completion(fab_comm* c) {
  atomic_store_explicit(&c->ncompl, atomic_load_explicit(&c->ncompl, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* Accounting of one completed control operation (probe, accept answer) of
 * comm c; frees a closed comm with its last completion. ep lock held. */
void fab_comm_op_done(fab_comm* c);

/* Frees the closed comms parked on ep whose operations have all completed,
 * and progresses ep's retiring own endpoints, destroying those left idle;
 * returns how many went. ep lock held. Called while ep->nclosing > 0 by
 * every locked progress of ep and by one data-path poll in ep->sweep_every. */
int fab_comm_sweep_closed(fab_endpoint* ep);
/* Parks a closed comm that libfabric still references (ep lock held). */
void fab_comm_park_closed(fab_endpoint* ep, fab_comm* c);
/* 1 when a parked object (or an entry of ep->comms) is a comm. */
int fab_parked_is_comm(const fab_parked* p);


/* fab_peer.c: peers on this host (local-only providers with our endpoint
 * names). 1 with why set when the peer at addr is gone (its process or its
 * shared-memory region); 0 when alive or not such a peer. */
int fab_peer_local_gone(const fab_endpoint* ep, const void* addr, size_t len, char* why, size_t why_len);
/* The liveness check of c when its peer is such a peer: fails c when the
 * peer is gone, else counts its process as a sign of life. 0 when c's peer
 * is not one (probe it instead). ep lock held. */
int fab_peer_check_local_locked(fab_comm* c);
/* 0 when addr has the form the provider's addresses have (fab_endpoint.c);
 * else -1 with why set. */
int fab_ep_addr_check(const fab_endpoint* ep, const void* addr, size_t len, char* why, size_t why_len);

/* Maps libfabric errors onto result codes: peer loss -> REMOTE, else SYSTEM. */
fab_result fab_result_from_fi(int fi_err);

#endif /* FAB_ENGINE_H */
