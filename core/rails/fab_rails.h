/*
 * Comms over several rails: a comm on a virtual device (makeVDevice) with
 * members d0..dN-1 is N single-rail comms, one on each member's endpoint,
 * set up by the ordinary handshake rail by rail:
 *
 *   listen:  a listen comm on every member; rail 0's handle goes to NCCL, and
 *            rail 0's answer carries the handles of rails 1..N-1.
 *   connect: rail 0 with NCCL's handle, then rail k with the k-th handle from
 *            the answer. Every connect request names the rail count and its
 *            rail; a listener with another count refuses it (both ends WARN).
 *   accept:  rail 0 (after which rail 0's listen comm closes: one connection
 *            per listen comm, so rails 1.. can only be this connector's), then
 *            rails 1..N-1.
 *
 * Data: the k-th message of a tag (counted per tag on both ends, as NCCL
 * matches per tag in order) goes whole on rail (k + tag) mod N, so both ends
 * agree on the rail without knowing the size, and a stream of messages of a
 * tag, and the tags of a grouped receive, spread over all rails. A send is
 * the rail's own request; a grouped receive whose buffers land on several
 * rails is a parent request over one receive per rail. Registration
 * registers on every member. Rail k's comms name the rail in their peer name,
 * so every WARN about them says which rail failed.
 *
 * Floor: above connection management, below the API (fab_data.c dispatches
 * here on the kinds FAB_OBJ_RAILS_*). The public listen/connect/accept/close
 * calls live here and hand single-rail devices to fab_conn_*.
 */
#ifndef FAB_RAILS_H
#define FAB_RAILS_H

#include "fab_core.h"

/* fab_data.c's data calls on a comm or memory handle of several rails. */
fab_result fab_rails_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                           void** request);
fab_result fab_rails_irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags,
                           void** mhandles, void** phandles, void** request);
fab_result fab_rails_iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request);
fab_result fab_rails_reg_mr(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle,
                            const char* fn);
fab_result fab_rails_dereg_mr(void* mhandle);
/* finalize of ctx: closes the listen comms and comms over several rails it
 * left open (before their members, which the connection floor closes), and
 * drops its connects in progress. Returns how many. */
int fab_rails_close_owned(fab_ctx* ctx);

/* --- internals of fab_rails.c and fab_rails_data.c ------------------------ */
#include "fab_engine.h"
#include "fab_tagmap.h"

enum { FAB_RAILS_PARENTS = 256 }; /* parent requests per comm */

/* --- stripes (fab_rails_stripe.c) ---------------------------------------------
 * A message of at least the sender's threshold is split: its first stripe
 * (never smaller than the threshold) goes as the message itself, on the
 * message's rail with its tag; a notice {tag, k, size, stripe lengths} goes
 * on the same rail with the control tag; stripe j goes on rail
 * (rail + j) mod N with a stripe tag naming the split (seq). A receiver
 * whose buffer got at least the threshold on its rail knows the message was
 * split and waits for its notice; it posts the other stripes as soon as the
 * notice is in, often before the first stripe has landed. The threshold is
 * the sender's, carried in the handshake. Tags below FAB_RAILS_TAG_MIN are
 * these; the runtime's tags on comms over several rails must be above. */
enum {
  FAB_STRIPE_SEQS = 1024,   /* stripe tags; more than sends a comm can have in flight */
  FAB_STRIPE_SENDS = 64,    /* split sends in flight per comm */
  FAB_STRIPE_RECVS = 64,    /* buffers in flight per comm that may be split */
  FAB_STRIPE_NOTICES = 64,  /* notices held per comm for buffers not posted or not matched yet */
  FAB_STRIPE_CTRL_RX = 4,   /* notice receives kept posted per rail */
  FAB_STRIPE_ALIGN = 4096,  /* stripes start at multiples of this */
};
#define FAB_STRIPE_TAG_CTRL INT32_MIN
#define FAB_STRIPE_TAG(seq) (INT32_MIN + 1 + (int32_t)(seq))
#define FAB_RAILS_TAG_MIN (INT32_MIN + 1 + FAB_STRIPE_SEQS)
#define FAB_STRIPE_MAGIC 0x50525453u /* "STRP" */

/* A notice: sender -> receiver, with the control tag. */
typedef struct fab_stripe_notice {
  uint32_t magic;
  int32_t tag;
  uint32_t k;   /* the message's number among the comm's messages with its tag */
  uint16_t seq; /* its stripes' tag: FAB_STRIPE_TAG(seq) */
  uint8_t m;    /* stripes, 1..rails (1: exactly the threshold) */
  uint8_t reserved;
  uint64_t size;
  uint32_t len[FAB_MAX_RAILS]; /* stripe j: len[j] bytes after stripes 0..j-1 */
  uint32_t check;              /* fab_stripe_check */
  uint32_t reserved2;
} fab_stripe_notice;
_Static_assert(sizeof(fab_stripe_notice) == 64, "stripe notice layout");

typedef struct fab_stripe_part {
  int rail;
  size_t off, len;
  void* req; /* the rail's request while posted */
  uint8_t posted, done;
} fab_stripe_part;

/* A send split over the rails: part 0 is the message on its own rail. */
typedef struct fab_stripe_send {
  fab_req_head head; /* a request of its own kind (fab_reqhead.h) */
  fab_result result; /* what its parts' tests found */
  struct fab_rails_comm* rc;
  int m, slot; /* slot: its notice's buffer */
  uint64_t size;
  char* data;
  void* mhandle;
  void* notice_req;
  uint8_t notice_posted, notice_done;
  fab_stripe_part part[FAB_MAX_RAILS];
  struct fab_stripe_send* next; /* free list */
} fab_stripe_send;

/* A posted buffer that may receive a split message. */
typedef struct fab_stripe_recv {
  int32_t tag;
  uint32_t k;
  int rail; /* its own rail (stripe 0) */
  char* data;
  size_t cap;
  void* mhandle;
  int noticed, m;
  int done; /* complete: the parent's size for it is the message's */
  uint64_t size;
  uint16_t seq;
  fab_stripe_part part[FAB_MAX_RAILS]; /* part[0] is the buffer's own receive (a child of the parent) */
  struct fab_stripe_recv* next; /* free list */
} fab_stripe_recv;

typedef struct fab_stripes {
  uint32_t threshold; /* send: ours; recv: the sender's */
  uint32_t stripe;
  uint16_t next_seq;
  fab_stripe_send send[FAB_STRIPE_SENDS];
  fab_stripe_send* send_free;
  fab_stripe_send* blocked; /* a split whose stripe 0 could not be posted yet: later sends wait */
  fab_stripe_notice tx[FAB_STRIPE_SENDS]; /* registered on every rail */
  fab_stripe_recv recv[FAB_STRIPE_RECVS];
  fab_stripe_recv* recv_free;
  fab_stripe_notice rx[FAB_MAX_RAILS][FAB_STRIPE_CTRL_RX]; /* rx[k] registered on rail k */
  void* rx_req[FAB_MAX_RAILS][FAB_STRIPE_CTRL_RX];
  fab_stripe_notice held[FAB_STRIPE_NOTICES]; /* notices in, not matched yet (magic 0: free) */
  void* mh[FAB_MAX_RAILS]; /* this struct's registration on each rail */
} fab_stripes;

typedef struct fab_rails_listen {
  uint32_t magic;
  void* handle;
  fab_ctx* owner; /* finalize closes it (fab_rails_close_owned) */
  fab_list node;  /* on fab_rails.c's list of live comms over rails */
  fab_device* dev;
  int n;
  void* listen[FAB_MAX_RAILS];   /* the members' listen comms (rail 0's closes once accepted) */
  void* accepted[FAB_MAX_RAILS]; /* the rails accepted so far */
  int naccepted;
  int use;  /* rails its connection runs over: n, or fewer once rail 0 agreed the peer's smaller count */
  int done; /* its connection is accepted */
} fab_rails_listen;

typedef struct fab_rails_comm fab_rails_comm;

/* One rail's share of a parent request: a receive of some of its buffers. */
typedef struct fab_rails_child {
  int rail;
  int n;
  int idx[FAB_MAX_RECVS]; /* the parent's buffers it receives */
  void* req;              /* the rail's request; NULL until posted or once done */
  int posted, done;
} fab_rails_child;

typedef struct fab_rails_parent {
  fab_req_head head; /* a request of its own kind (fab_reqhead.h) */
  fab_result result; /* what its children's tests found */
  int n, nchild;
  fab_rails_comm* rc;
  fab_rails_child child[FAB_MAX_RAILS];
  int sizes[FAB_MAX_RECVS];
  /* what its children post (kept for children posted later, in order) */
  void* data[FAB_MAX_RECVS];
  size_t len[FAB_MAX_RECVS];
  int tags[FAB_MAX_RECVS];
  struct fab_mr* mrs[FAB_MAX_RECVS]; /* buffer i's registration on its rail */
  void* phandles[FAB_MAX_RECVS];
  uint8_t prof, prof_taken; /* its children announce profiler events (asked once, as one post); one was taken */
  int nposted; /* children posted so far (in order) */
  uint32_t k[FAB_MAX_RECVS];               /* buffer i's number among the comm's buffers with its tag */
  struct fab_stripe_recv* st[FAB_MAX_RECVS]; /* buffer i may receive a split message: its state */
  uint8_t got[FAB_MAX_RECVS];              /* buffer i's own receive (its child) completed */
  int nstriped;                            /* buffers with a stripe state */
  uint32_t held_rails; /* rails whose thread it keeps awake while a buffer may get a split message */
  struct fab_rails_parent* next; /* free list, or the comm's list of parents not fully posted */
} fab_rails_parent;

struct fab_rails_comm {
  uint32_t magic;
  void* handle;
  fab_obj_kind kind; /* FAB_OBJ_RAILS_SEND / RECV */
  fab_ctx* owner;    /* its members' context: finalize closes it (fab_rails_close_owned) */
  fab_list node;     /* on fab_rails.c's list of live comms over rails */
  fab_device* dev;
  int n;
  void* rail[FAB_MAX_RAILS];     /* the members' comm handles */
  fab_comm* c[FAB_MAX_RAILS];    /* the members' comms */
  fab_tagmap tags;               /* messages (send) or buffers (recv) per tag so far: the owner thread's */
  fab_rails_parent* parents;     /* FAB_RAILS_PARENTS, from the first grouped receive over several rails */
  fab_rails_parent* free_list;
  unsigned threads;              /* bit k: this comm holds rail k's polling thread (FABRIC_RAIL_THREADS) */
  fab_rails_parent* unposted_head; /* parents with children still to post, oldest first */
  fab_rails_parent* unposted_tail;
  uint32_t stripe_from;          /* messages of at least this many bytes are split (0: never) */
  fab_stripes* stripes;          /* from the first split or possibly split message */
};

typedef struct fab_rails_mr {
  uint32_t magic;
  void* handle;
  int n;
  fab_device* dev;
  void* mh[FAB_MAX_RAILS]; /* the members' memory handles */
} fab_rails_mr;

#define FAB_RAILS_MAGIC 0x4c494152u /* "RAIL" */

/* fab_rails_data.c: a comm's parents, when it closes. */
/* Gives back the rail threads its receives still hold (before its rails close). */
void fab_rails_data_let_go(fab_rails_comm* rc);
void fab_rails_data_free(fab_rails_comm* rc);

/* The rail of the k-th message of a tag. */
static inline int fab_rails_rail_for(const fab_rails_comm* rc, int tag, uint32_t k) {
  return (int)((k + (uint32_t)tag) % (uint32_t)rc->n);
}

/* The profiler state whose pause a comm over rails asks (fab_prof_wanted):
 * rail 0's, where all its rails' posts count (fab_prof_count). */
static inline void* fab_rails_prof(const fab_rails_comm* rc) { return fab_comm_ext_get(rc->c[0], FAB_EXT_PROF); }

/* The rail's own memory handle inside a handle registered on the comm (another
 * handle is passed through: resolving it WARNs). */
static inline void* fab_rails_member_mh(void* mhandle, int rail) {
  if (!mhandle) return NULL;
  fab_rails_mr* m = fab_obj_get(mhandle, FAB_OBJ_RAILS_MR);
  return m && rail < m->n ? m->mh[rail] : mhandle;
}

/* fab_rails_stripe.c */
uint32_t fab_stripe_notice_check(const fab_stripe_notice* n);
/* A send of size >= rc->stripe_from, split: *request NULL when not now. */
fab_result fab_stripe_isend(fab_rails_comm* rc, void* data, size_t size, int tag, uint32_t k, void* mhandle,
                            void* phandle, void** request);
/* Posts the stripe 0 that could not go yet: FAB_OK, then sends may go when
 * rc->stripes->blocked is NULL. */
fab_result fab_stripe_unblock(fab_rails_comm* rc);
/* A state for a buffer that may receive a split message; NULL when none is
 * free (not now) or out of memory (*res). */
fab_stripe_recv* fab_stripe_recv_get(fab_rails_comm* rc, fab_result* res);
void fab_stripe_recv_put(fab_rails_comm* rc, fab_stripe_recv* sr);
/* Reads the notices that came in (and keeps their receives posted). */
fab_result fab_stripe_pump(fab_rails_comm* rc);
/* Where buffer sr stands; got: its own receive completed with *size bytes.
 * 1 pending, 0 done (*size: the whole message), -1 failed (*res). */
int fab_stripe_recv_test(fab_rails_comm* rc, fab_stripe_recv* sr, int got, int* size, fab_result* res);
/* The comm closes (its rails are closed): registrations and memory. */
void fab_stripe_free(fab_rails_comm* rc);

#endif /* FAB_RAILS_H */
