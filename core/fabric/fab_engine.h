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
#include <sched.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <stdatomic.h>

#include "fab_core.h"
#include "fab_log.h"
#include "fab_objtab.h"
#include "fab_params.h"
#include "fab_pool.h"
#include "fab_reqhead.h"
#include "fab_util.h"
#include "fab_wire.h"

enum { FAB_MAX_DEVICES = 64 };

typedef struct fab_transport_ops fab_transport_ops;
typedef struct fab_mr_cache fab_mr_cache;
typedef struct fab_endpoint fab_endpoint;
typedef struct fab_comm fab_comm;
typedef struct fab_req fab_req;
typedef struct fab_bounce_pool fab_bounce_pool;

/* --- operations and parked objects ---------------------------------------- */

typedef struct fab_op fab_op;
/* Exactly one of done / err is non-NULL. Runs with the endpoint lock held,
 * except a successful completion of an unlocked operation. Every CQ is opened
 * with FI_CQ_FORMAT_DATA, so a completion carries its remote CQ data. */
typedef struct fi_cq_data_entry fab_cqe;
typedef void (*fab_op_fn)(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err);

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
  /* Intra-host providers (local_only): a receive is posted with this
   * (virtual, never touched by a well-behaved peer) region after its buffer,
   * so a message larger than the receive lands its excess here and the
   * transport reports the truncation itself. libfabric 1.17's shm loops
   * forever in its copy on a truncated receive above 4 KiB. NULL elsewhere. */
  void* sink;
  size_t sink_len;
} fab_domain;

typedef struct fab_device {
  int index;
  int physical;          /* 0 for a virtual device */
  int carrier;           /* physical device that carries the traffic (itself, or vprops.devs[0]) */
  struct fi_info* info;  /* physical only */
  fab_domain* dom;       /* physical only; opened on first endpoint */
  const fab_transport_ops* ops;
  /* the transport's handler of peers' writes with remote CQ data (may be NULL) */
  void (*remote_data)(fab_endpoint* ep, const fab_cqe* e);
  fab_tag_layout tags;
  int mr_local;          /* FI_MR_LOCAL: every buffer needs a descriptor */
  int mr_local_emulated; /* FABRIC_NIC_PROFILE imposed it: the carrier itself needs no registration */
  int mr_endpoint;       /* FI_MR_ENDPOINT (cxi): a registration serves the one endpoint it is bound to */
  int mr_endpoint_emulated; /* FABRIC_NIC_PROFILE imposed it: registrations are kept per endpoint and checked,
                             * but the carrier is not asked to bind them */
  int mr_hmem;           /* FI_MR_HMEM: device memory needs registration */
  int prov_key;          /* FI_MR_PROV_KEY granted */
  int hmem;              /* FI_HMEM granted */
  _Atomic int calls_cuda; /* an endpoint's provider did not take FI_OPT_CUDA_API_PERMITTED=false: it may call
                           * the CUDA runtime from inside our calls (fab_endpoint.c), so one-sided GPU windows
                           * are staged, not handed to it */
  int virt_addr;         /* FI_MR_VIRT_ADDR: peers address registered memory by virtual address */
  uint64_t mr_access;    /* access flags of every registration: what the transport needs */
  int reg_host;          /* host memory is registered (FI_MR_LOCAL, or remote access needed) */
  size_t inject_size;    /* largest fi_inject / fi_inject_write; 0: none (fab_dev_injects) */
  size_t tagged_max;     /* rdma transport: the largest message sent tagged (fab_rxm_tagged_max) */
  int cq_narrow;         /* the provider carries 4 bytes of remote CQ data, not 8 (EFA, verbs) */
  int local_only;        /* no FI_REMOTE_COMM: a further send comm to a peer gets its own endpoint */
  int ordered_writes;    /* FI_ORDER_WAW asked and granted: RMA writes to a peer are placed in order */
  uint64_t write_flags;  /* FI_DELIVERY_COMPLETE where a write would complete before the peer holds it */
  int one_stream;        /* over kernel sockets (tcp, sockets): every operation to a peer goes, in post order,
                          * through one byte stream, so a later one's completion says the earlier ones left */
  uint32_t prov_hash;
  fab_properties props;   /* as the runtime sees it: vprops in its device indices */
  int nmembers;           /* a virtual device's rails: our indices of its physical members; 0 when physical */
  int members[FAB_MAX_VDEV_DEVS];
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

enum { FAB_ID_PAGE = 1024, FAB_ID_PAGES = 1024 }; /* comm id table: up to 2^20 ids */
enum { FAB_CTRL_RX = 16 }; /* untagged receive buffers (connect requests, probes) per endpoint */
enum { FAB_SWEEP_EVERY_MIN = 64, FAB_SWEEP_EVERY_MAX = 4096 }; /* data polls between sweeps */
enum { FAB_CLOSE_DRAIN_MS = 1000 }; /* how long an endpoint's destruction waits for its closed comms */
enum { FAB_RETIRING_MAX = 8 }; /* own endpoints kept for closed comms' sends, per shared endpoint (fab_comm.c) */
enum { FAB_ANSWER_RETRY_MS = 5000 }; /* how long a listener retries an answer the provider cannot post */

typedef struct fab_av_entry {
  uint64_t hash;
  size_t len;
  uint8_t addr[FAB_ADDR_MAX];
  fi_addr_t fi_addr;
  uint32_t refs; /* comms and refusals using it */
  struct fab_endpoint* owner; /* an endpoint of this process with this address, referenced (fab_ep_local.c) */
} fab_av_entry;

/* What the connection layer does with an endpoint it created: sweep its
 * closed comms (while nclosing > 0) and free its objects once the libfabric
 * endpoint is closed. Hooks, so the provider layer never calls upwards. */
typedef struct fab_ep_hooks {
  int (*sweep)(fab_endpoint* ep);    /* ep lock held; returns how many objects went */
  void (*teardown)(fab_endpoint* ep); /* after fi_close(ep) */
  void (*pump)(fab_endpoint* ep);     /* ep lock held, on its polling thread: post what comms left to it */
} fab_ep_hooks;

struct fab_endpoint {
  pthread_mutex_t lock;
  const fab_ep_hooks* hooks;
  fab_device* dev; /* physical */
  struct fid_ep* ep;
  struct fid_cq* cq;
  struct fid_av* av;
  uint8_t addr[FAB_ADDR_MAX];
  size_t addr_len;
  int cq_batch;
  _Atomic fab_result failed; /* sticky after the CQ itself failed; read without the lock */
  fab_op rxm_warm[2];         /* fab_rxm_warm_pool's send and receive */
  uint8_t rxm_warm_buf[8];
  fi_addr_t silent_peer;      /* a peer that left a window's withdrawal unanswered (fab_pwin.h): its next
                               * withdrawals are not waited for until it answers one (ep lock) */
  int64_t bad_ctrl_warned_ms; /* the last WARN about a malformed control message (fab_ctrl.c, ep lock) */
  uint32_t bad_ctrl_quiet;    /* malformed control messages ignored without a WARN since then */
  _Atomic int nclosing;       /* what the sweep hook must revisit: closed comms parked until their data
                               * operations complete, own endpoints retiring (privates), control
                               * messages not sent yet; changed under the lock (fab_ep_nclosing_add) */
  _Atomic uint32_t sweep_tick;  /* data polls since the last sweep (relaxed, approximate) */
  _Atomic uint32_t sweep_every; /* data polls between sweeps: 64, doubling up to 4096 while
                                 * sweeps free nothing (a send that never completes) */
  int retiring;                 /* own endpoint whose comm closed with sends in flight; it no
                                 * longer counts in its home's nprivates */
  int64_t retiring_since_ms;    /* when it began retiring; given up FABRIC_PEER_TIMEOUT_MS later */
  int given_up;                 /* destroyed with sends in flight: no drain */
  int destroying;             /* teardown under way: no AV removals */
  int hol_blocked;            /* (local-only) a dead peer never took a send of this endpoint, which holds
                               * up its later sends: new send comms get endpoints of their own (ep lock) */
  /* handshake state, under lock */
  struct fab_ctrl_rx* ctrl_rx; /* FAB_CTRL_RX untagged receives for connect requests and probes */
  fab_list listens;
  fab_list connects; /* pending connects */
  fab_list comms;    /* live send and recv comms */
  fab_list parked;
  fab_list ctl_owed; /* control messages the provider could not take yet, in order per peer (fab_ep_ctl.c) */
  fab_list retired;  /* buffers peers may still write into (fab_remote_buf_retire) */
  _Atomic(fab_bounce_pool*) bounce; /* slots for small writes the provider cannot inject (fab_remote_buf.c) */
  uint32_t next_conn_id;
  int conn_wrapped;
  uint32_t next_connector_id;
  fab_av_entry* av_cache;
  size_t av_count, av_cap;
  _Atomic(_Atomic(fab_comm*)*) ids[FAB_ID_PAGES]; /* id table (fab_ep_id_*): pages of FAB_ID_PAGE */
  /* private endpoints of send comms (local-only providers), owned here */
  fab_list privates;
  fab_list private_node;
  int nprivates; /* length of privates (home lock) */
  /* in-process addressing on intra-host providers (fab_ep_local.c; its lock) */
  fab_list local_node;
  int local_registered;
  uint32_t local_refs; /* AV entries of endpoints of this process that address this one */
  int buried;          /* destroyed while referenced: kept open and idle until reaped */
  /* local-only providers (shm): one thread at a time reads the CQ or posts a
   * tagged data operation (fab_ep_serial_*): libfabric 1.17's shm matched
   * messages of one tag out of order when one thread posted while another
   * progressed (docs/known-bugs.md) */
  int cq_serial;
  _Atomic int cq_gated;   /* a polling thread runs: it takes cq_lock too, after the runtime's threads */
  _Atomic int cq_waiting; /* runtime threads waiting for cq_lock (the polling thread yields to them) */
  atomic_flag cq_lock;    /* a spinlock: one exchange and a store where nobody else wants it */
  /* the polling thread of a rail (fab_ep_helper_*; FABRIC_RAIL_THREADS), under helper_lock */
  pthread_mutex_t helper_lock;
  pthread_t helper;
  int helper_users;       /* comms over several rails using it */
  _Atomic int helper_run; /* the thread polls while set */
  _Atomic int pump_wanted; /* a comm left posts to the thread (fab_ep_want_pump) */
  _Atomic int helper_busy;   /* requests live on ep's comms while the thread runs (fab_req_get/put) */
  _Atomic int helper_large;  /* ... of them large (FABRIC_RAIL_SMALL_MAX, fab_req_sized) */
  _Atomic int helper_asleep; /* FAB_HELPER_*: the thread sleeps on this word (a futex) after FAB_HELPER_IDLE_MS
                              * idle */
};

/* --- comms and requests --------------------------------------------------- */

#define FAB_COMM_MAGIC 0x4d4d4f43u /* "COMM" */

/* A request's state is its header's (fab_reqhead.h): FAB_REQ_ORPHAN when test
 * reported it failed (its comm failed for good) while a libfabric operation
 * still references it; it stays out of the pool until the comm is freed. */
enum { FAB_REQ_SEND = 1, FAB_REQ_RECV = 2 };
/* state of one posted operation (a sub-receive, a handshake message) */
enum { FAB_SUB_IDLE = 0, FAB_SUB_POSTED = 1, FAB_SUB_DONE = 2 };

/* A request: the part every transport shares (pool slot, pending count,
 * result, what test reports) followed by the transport's private area
 * (fab_req_tp), sized by the transport's req_size. The lifecycle (get, put,
 * test, failure, orphaning) is the core's (fab_req.c). */
struct fab_req {
  fab_req_head head; /* magic, state (FAB_REQ_*), kind: fab_req_kind_net */
  uint8_t type;  /* FAB_REQ_SEND / RECV */
  uint8_t n;     /* buffers: the sizes test reports */
  uint8_t prof;  /* profiler events started for it (their handles: comm->prof_eh) */
  uint8_t busy;  /* counted in its endpoint's helper_busy (a polling thread ran when it was handed out);
                  * 2: in its helper_large too; 3: a receive posted large that its comm's tiny run counts
                  * small (in comm->recv_guessed: fab_req_sized_recv) */
  _Atomic int pending; /* operations not completed yet (posted or not); the last
                        * write of a completion: 0 hands r back to its owner */
  fab_result result;   /* first error of an operation */
  uint32_t pool_index; /* its slot in comm->reqs */
  int tag;             /* NCCL tag of the first buffer (for messages) */
  size_t size;         /* size of the first buffer (for messages) */
  char* errmsg;        /* its description (error path only) */
  fab_comm* comm;
  _Alignas(16) unsigned char tp[]; /* the transport's */
};

static inline void* fab_req_tp(fab_req* r) { return r->tp; }

/* The ids of an endpoint's comms (recv comms' ids are also the tag prefix of
 * their data): a two-level table readable without the lock, so a completion
 * that names a comm by id (remote CQ data) finds it on the data path. Pages
 * are allocated under the endpoint lock and live as long as the endpoint. */

/* A comm holds the connection's state. What another floor keeps on a comm
 * lives in that floor's extension slot: made by it on first use, set under
 * the ep lock or by the owner thread as the slot says, and handed to its fini
 * when the comm is freed (as a transport's private area is the transport's). */
typedef enum {
  FAB_EXT_PROF = 0,     /* profiler events of its requests (fab_prof.c; owner thread) */
  FAB_EXT_PWIN = 1,     /* one-sided calls on this connection (fab_pwin.c; ep lock) */
  FAB_EXT_ONESIDED = 2, /* a one-sided group's handler of the peer's writes (fab_onesided_hook; ep lock) */
  FAB_EXT_COUNT
} fab_ext_id;

typedef struct fab_comm_ext {
  void* data;
  void (*fini)(void* data); /* NULL: its floor frees it (and clears the slot) itself */
} fab_comm_ext;

/* FAB_EXT_ONESIDED: a recv comm of a one-sided group (core/onesided/) hands
 * each of the peer's writes with remote CQ data to it. */
typedef struct fab_onesided_hook {
  void (*landed)(struct fab_comm* c, void* arg, uint32_t low);
  void* arg;
} fab_onesided_hook;

struct fab_comm {
  uint32_t magic;
  fab_obj_kind kind; /* FAB_OBJ_SEND / RECV */
  void* handle;
  fab_endpoint* ep;
  fab_device* dev; /* as named by the runtime (may be virtual) */
  const fab_transport_ops* ops;
  fi_addr_t peer;
  uint32_t conn_id;  /* recv: assigned here, the tag prefix of its data; send: from the answer */
  uint32_t local_id; /* its id in ep's id table (recv: == conn_id) */
  uint32_t peer_id;  /* the peer comm's local_id on its endpoint */
  uint64_t tag_base; /* fab_tag_data(conn_id, 0) */
  size_t max_bytes;
  int mr_local;
  int closing;
  uint8_t rail; /* its rail in a comm over several (fab_rails.h); 0 otherwise */
  uint8_t helped; /* its endpoint has a polling thread (FABRIC_RAIL_THREADS) and it has no home endpoint to drive:
                   * tests of its requests leave the CQ to that thread (fab_comm_test_polls, fab_req_test_helped) */
  _Atomic uint8_t tests_unpolled; /* helped: tests since one last read the CQ itself */
  uint8_t rails; /* rails its connection runs over, as the handshake agreed: rail 0's ends take the smaller of their
                  * counts, the other rails are told it; 1 for a connection of one rail */
  uint32_t stripe_from; /* rail of a comm over several: its sender's FABRIC_STRIPE_THRESHOLD (0: never splits);
                         * these four fill what was padding before mr_last_handle: the hot fields keep their lines */
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
  /* recv, helped: messages of at most FABRIC_RAIL_TINY_MAX in a row (up to FAB_TINY_RUN), its live
   * receives counted small by that run (guessed), and whether it holds its endpoint's thread polling for
   * them (FAB_RECV_HOLD_*; fab_comm_recv_seen) */
  _Atomic uint8_t recv_tiny_run;
  _Atomic uint8_t recv_hold;
  _Atomic uint32_t recv_guessed;
  fab_parked park;      /* in ep->comms while live, ep->parked once closed */
  fab_pool reqs;
  uint32_t req_size;    /* bytes per request, transport area included */
  fab_op answer_op;     /* recv: the accept answer in flight */
  fab_wire_accept answer;
  uint8_t* answer_rails; /* recv, rail 0 of several: the answer followed by the other rails' handles */
  struct fid_mr* answer_mr;
  uint8_t* rail_handles; /* send, rail 0 of several: the listener's handles of rails 1.. (from its answer) */
  /* peer liveness (ep lock; ncompl and stall_polls are relaxed counters
   * bumped without it) */
  _Atomic uint64_t ncompl;
  uint64_t ncompl_seen;
  int64_t stall_since_ms, last_probe_ms;
  int probe_posted;
  int peer_in_process; /* no liveness check: see fab_ep_addr_in_process */
  _Atomic uint32_t stall_polls;
  fab_op probe_op;
  /* delivery proof once closed (fab_delivery.c; ep lock): the transport's
   * count of messages sent that the last delivery probe carried, the largest
   * the peer answered, and when the comm began to wait for one */
  uint64_t proof_asked, proof_got;
  int64_t proof_since_ms, proof_retry_ms; /* ... and when a probe the provider refused is tried again */
  fab_op ctl_op; /* the transport's control writes (fab_remote_ctl_write) */
  int awaiting_answer;         /* send: its connect has not read the listener's answer yet; window
                                * messages that come first are held (fab_pwin_hold) */
  fab_comm_ext ext[FAB_EXT_COUNT]; /* the other floors' state on it */
  char peer_name[96];
  _Alignas(16) unsigned char tp[]; /* the transport's (comm_size bytes) */
};

static inline void* fab_comm_tp(fab_comm* c) { return c->tp; }

static inline void* fab_comm_ext_get(const fab_comm* c, fab_ext_id id) { return c->ext[id].data; }
static inline void fab_comm_ext_set(fab_comm* c, fab_ext_id id, void* data, void (*fini)(void* data)) {
  c->ext[id].fini = fini;
  c->ext[id].data = data;
}

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
  /* the runtime's device indices: view[i] is ours of its device i (with FABRIC_NIC_RAILS, a NIC's rails fused;
   * else every device, in order); makeVDevice appends */
  int view[FAB_MAX_DEVICES];
  _Atomic int nview;
  int nic_rails;      /* rails per NIC: FABRIC_NIC_RAILS, or the count its 0 chose (fab_nic_rails.c) */
  int nic_rails_auto; /* FABRIC_NIC_RAILS=0 chose several: their comms get polling threads */
  fab_list ctxs;
  /* one endpoint per physical device, shared by every context, created on
   * first use and closed when the engine goes down */
  _Atomic(fab_endpoint*) eps[FAB_MAX_DEVICES];
  int cuda_ok;
} fab_engine;

extern fab_engine fab_g;

/* --- the provider layer's interface ----------------------------------------- */

/* fab_signals.c: puts handlers a PSM library installed (they write *.btr
 * files and call exit()) back to the default action; returns how many. */
int fab_signals_reset_psm(void);

/* 1 when the provider takes a write of len bytes inline (fi_inject*): its
 * inject size is not 0 and len fits. */
static inline int fab_dev_injects(const fab_device* d, size_t len) {
  return d->inject_size > 0 && len <= d->inject_size;
}

/* 1 when a tagged message of len bytes from host memory may go inline
 * (fi_tinject*), with no completion to wait for: the provider takes it in
 * one post, and either places it in the peer's memory before the post
 * returns (local_only), or sends it through the peer's one stream
 * (one_stream), where a delivery probe posted later proves, once the peer
 * answers it, that the message arrived too (fab_delivery.c). Elsewhere
 * (EFA, verbs, cxi) nothing orders a later probe after it. Over tcp this
 * saves the provider's completion, which costs a wake-up write and read on a
 * socket pair per batch (libfabric 1.17's tcp CQ signals every completion). */
static inline int fab_dev_tagged_inline(const fab_device* d, size_t len) {
  return fab_dev_injects(d, len) && (d->local_only || d->one_stream);
}

/* The device's provider name (virtual devices: their carrier's). */
static inline const char* fab_device_provider(const fab_device* d) {
  const fab_device* c = d->physical ? d : fab_g.devs[d->carrier];
  return c->info->fabric_attr->prov_name;
}

/* fab_nic_profile.c: FABRIC_NIC_PROFILE (test only) narrows what fi_getinfo
 * returned (asked with ordering bits asked_order on top of the transport's)
 * to another NIC's limits: the list, or NULL (freed) when that NIC would
 * grant none; and whether a provider reports a remote write's length in its
 * completion. */
struct fi_info* fab_nic_profile_apply(struct fi_info* list, uint64_t asked_order);
int fab_reports_write_len(const struct fi_info* fi);
int fab_nic_profile_mr_local(void); /* the profile's NIC asks FI_MR_LOCAL (the engine honours it alone) */
int fab_nic_profile_mr_endpoint(void); /* ... FI_MR_ENDPOINT (the engine keeps registrations per endpoint) */

/* fab_iface.c: whether entry fi is an interface FABRIC_EXCLUDE_IF names
 * (loopback, container bridges) while FI_TCP_IFACE chose none; discovery
 * leaves it out unless nothing else remains. */
int fab_iface_listed(const struct fi_info* fi);
/* The link speed of a socket provider's interface in Mb/s, as NCCL's Socket
 * transport reads it (/sys/class/net/<interface>/speed), or
 * FAB_IFACE_UNKNOWN_SPEED_MBPS where it has none (loopback, most virtual
 * NICs), as Socket reports there; 0 for other providers. */
enum { FAB_IFACE_UNKNOWN_SPEED_MBPS = 10000 };
int fab_iface_speed_mbps(const struct fi_info* fi);
/* The same where the interface says it; 0 where it does not (or fi is not a
 * socket provider's). */
int fab_iface_known_speed_mbps(const struct fi_info* fi);
/* Whether fi is a socket provider's (tcp, sockets): its copies run on the
 * host's CPUs, one connection on one core at a time. */
int fab_iface_socket_provider(const struct fi_info* fi);

/* fab_nic_rails.c: FABRIC_NIC_RAILS=0 (the default), rails per NIC chosen by the plugin. The rule:
 * a socket provider, an interface not known to be slower than
 * FAB_NIC_RAILS_FAST_MBPS, and at least 2 * (rails + 1) CPUs for
 * FAB_NIC_RAILS_AUTO_MAX rails, then half as many, with at most
 * FAB_MAX_VDEV_DEVS over all nics; else 1. why says which. */
enum { FAB_NIC_RAILS_AUTO_MAX = 4, FAB_NIC_RAILS_FAST_MBPS = 40000 };
int fab_nic_rails_rule(int socket_provider, int cpus, const int* known_mbps, int nics, char* why, size_t why_len);
/* The count for the first nics devices found (fab_g.devs), with one INFO
 * line saying why. */
int fab_nic_rails_choose(int nics);
/* The positive number of Mb/s in a sysfs speed file; 0 for none. */
int fab_iface_read_speed(const char* path);

/* fab_rxm.c: over tcp, ofi_rxm sends a message of up to its eager limit as
 * one message, straight into the posted receive. For a transport that
 * confirms large tagged messages before close, the engine raises that limit
 * (FABRIC_RXM_EAGER_LIMIT) before any endpoint opens unless the environment
 * sets it, and a device on provider prov sends tagged (FABRIC_TAGGED_MAX,
 * unless set) what its rxm sends at once; on libfabric 2.x's own tcp, which
 * sends every size at once, FABRIC_RXM_EAGER_LIMIT. */
void fab_rxm_raise_eager_limit(const fab_transport_ops* t);
size_t fab_rxm_tagged_max(const char* prov);
/* Before libfabric's first call: over tcp, the receive buffers rxm posts per
 * endpoint (FABRIC_RXM_RX_SIZE), unless the environment sets them or rxm
 * may run over verbs. */
void fab_rxm_size_receive_pool(void);
/* One INFO line on the count rxm posts, where provider prov is tcp;ofi_rxm. */
void fab_rxm_tell_receive_pool(const char* prov);
/* As an endpoint on tcp;ofi_rxm opens, before anything else is posted on it:
 * makes rxm grow its buffer pools now rather than at the first message that
 * arrives before its receive (FABRIC_RXM_WARM_POOL). Best effort: INFO on
 * failure. */
void fab_rxm_warm_pool(fab_endpoint* ep);

/* fab_device.c: discovery asks for what the candidate transports need, in
 * order of preference (fab_transport.c), and gives each device the first
 * one its provider entry can run. */
fab_result fab_devices_discover(const fab_transport_ops* const* candidates, int ncandidates);
void fab_devices_release(void);
fab_result fab_domain_open(fab_device* dev);
/* Gives back the pages a truncated receive wrote into the domain's sink. */
void fab_domain_sink_release(fab_domain* dom);
/* makeVDevice: vp and *out in the runtime's device indices. Engine lock held. */
fab_result fab_vdevice_create(const fab_vdevice_props* vp, int* out);
/* Our index of the runtime's device dev, or -1 (no WARN). */
static inline int fab_device_index(int dev) {
  return dev >= 0 && dev < atomic_load_explicit(&fab_g.nview, memory_order_acquire) ? fab_g.view[dev] : -1;
}

/* fab_endpoint.c */
fab_result fab_endpoint_create(fab_device* dev, const fab_ep_hooks* hooks, fab_endpoint** out);
/* Closes the libfabric endpoint (its own endpoints first), runs the
 * teardown hook, frees the rest. */
void fab_endpoint_destroy(fab_endpoint* ep);
/* Removes the names of this process's shared-memory regions (/dev/shm/<our
 * endpoint names>) without closing anything: for a process that ends with
 * endpoints open. Mappings stay valid; a peer sees the region gone. */
void fab_endpoint_unlink_names(void);
/* Closes the buried endpoints no longer referenced (fab_ep_local.c); engine
 * shutdown calls it last. Returns how many stay buried. */
int fab_endpoint_reap(void);

/* --- in-process addressing (fab_ep_local.c) --- */
void fab_local_register(fab_endpoint* ep);
/* The registered endpoint with this address, referenced; NULL when none. */
fab_endpoint* fab_local_ref(const void* addr, size_t len);
void fab_local_unref(fab_endpoint* owner);
/* Unregisters ep unless it is still referenced; then it is buried: returns 1. */
int fab_local_leave(fab_endpoint* ep);
fab_endpoint* fab_local_next_reapable(void);
int fab_local_buried_count(void);
#define FAB_RAIL_THREAD_NAME "fabric-rail" /* the polling thread's name (top -H, /proc) */
/* A helped comm left posts to ep's polling thread: it runs the pump hook
 * after its next poll; a retry (the provider refused a post for now) waits
 * for its next round of polls, so a full queue does not keep it taking the
 * endpoint lock. */
enum { FAB_PUMP_NOW = 1, FAB_PUMP_RETRY = 2 };
/* How the polling thread sleeps: not (AWAKE); with no request live (IDLE:
 * the next one handed out wakes it); with only small ones live (SMALL: a
 * large one, a post left to it or a closing comm wakes it). */
enum { FAB_HELPER_AWAKE = 0, FAB_HELPER_ASLEEP_IDLE = 1, FAB_HELPER_ASLEEP_SMALL = 2 };
void fab_ep_helper_wake(fab_endpoint* ep);
static inline void fab_ep_want_pump(fab_endpoint* ep) {
  atomic_store(&ep->pump_wanted, FAB_PUMP_NOW); /* before the asleep load: pairs with helper_sleep */
  if (FAB_UNLIKELY(atomic_load(&ep->helper_asleep))) fab_ep_helper_wake(ep);
}
static inline void fab_ep_want_pump_retry(fab_endpoint* ep) {
  int idle = 0;
  if (atomic_compare_exchange_strong(&ep->pump_wanted, &idle, FAB_PUMP_RETRY) &&
      FAB_UNLIKELY(atomic_load(&ep->helper_asleep)))
    fab_ep_helper_wake(ep);
}
/* A thread polling ep's completion queue for the comms over several rails
 * that use ep (FABRIC_RAIL_THREADS): the first acquire starts it, the last
 * release stops and joins it (no ep lock held). 0, or -1 when no thread
 * could be started (the caller's polling still drives ep). */
int fab_ep_helper_acquire(fab_endpoint* ep);
void fab_ep_helper_release(fab_endpoint* ep);
/* A request of a comm on ep was handed out while ep's polling thread runs:
 * the thread stays awake until none is live, and wakes if it slept with
 * none live. */
static inline void fab_ep_helper_busy(fab_endpoint* ep) {
  atomic_fetch_add(&ep->helper_busy, 1); /* before the asleep load: pairs with the thread's store and load */
  if (FAB_UNLIKELY(atomic_load(&ep->helper_asleep) == FAB_HELPER_ASLEEP_IDLE)) fab_ep_helper_wake(ep);
}
static inline void fab_ep_helper_idle(fab_endpoint* ep) {
  atomic_fetch_sub_explicit(&ep->helper_busy, 1, memory_order_release);
}
/* A live request moving more than FABRIC_RAIL_SMALL_MAX bytes (a send's
 * bytes, a receive's largest buffer), or a receive that may get a split
 * message, is large (fab_req_sized). While none is live on an endpoint, its
 * polling thread leaves the CQ to the runtime's tests, which then find
 * small messages at once: the thread's polls in between cost netbench's
 * 8-byte ping-pong over four rails 2.1x raw against 1.2x. */
static inline void fab_ep_helper_large(fab_endpoint* ep, int delta) {
  if (delta < 0) {
    atomic_fetch_add_explicit(&ep->helper_large, delta, memory_order_relaxed);
    return;
  }
  atomic_fetch_add(&ep->helper_large, delta); /* before the asleep load: pairs with helper_sleep */
  if (FAB_UNLIKELY(atomic_load(&ep->helper_asleep))) fab_ep_helper_wake(ep);
}
static inline int fab_ep_helper_small_only(fab_endpoint* ep) {
  return atomic_load_explicit(&ep->helper_large, memory_order_relaxed) <= 0;
}
/* Counts one live request of ep's comms where its thread runs (then 1; to
 * be given back with fab_ep_helper_idle), else 0. */
static inline int fab_ep_helper_hold(fab_endpoint* ep) {
  if (FAB_LIKELY(!atomic_load_explicit(&ep->cq_gated, memory_order_relaxed))) return 0;
  fab_ep_helper_busy(ep);
  return 1;
}
/* Takes ep's cq_lock as a runtime thread: when it is held, counted in
 * cq_waiting while it waits, so that the polling thread leaves it alone until
 * this thread has had it. Returns 1. */
static inline int fab_ep_lock_cq(fab_endpoint* ep) {
  /* free at once, the usual case: one atomic, not three */
  if (FAB_LIKELY(!atomic_flag_test_and_set_explicit(&ep->cq_lock, memory_order_acquire))) return 1;
  atomic_fetch_add_explicit(&ep->cq_waiting, 1, memory_order_relaxed);
  for (unsigned spins = 0; atomic_flag_test_and_set_explicit(&ep->cq_lock, memory_order_acquire); spins++)
    if (spins % 64 == 63) sched_yield(); /* the holder may be copying a large message */
  atomic_fetch_sub_explicit(&ep->cq_waiting, 1, memory_order_relaxed);
  return 1;
}
/* Around a tagged data post or a CQ read on ep: serialised with the
 * endpoint's CQ reads and other posts on local-only providers, and with a
 * rail's polling thread where one runs (which then waits for the runtime's
 * threads instead of making them sleep in the provider's lock). Returns
 * whether it locked; fab_ep_serial_leave takes that. */
static inline int fab_ep_serial_needed(fab_endpoint* ep) {
  return FAB_UNLIKELY(ep->cq_serial) || FAB_UNLIKELY(atomic_load_explicit(&ep->cq_gated, memory_order_relaxed));
}
static inline int fab_ep_serial_enter(fab_endpoint* ep) {
  return fab_ep_serial_needed(ep) ? fab_ep_lock_cq(ep) : 0;
}
/* The same without waiting: -1 while another thread holds the lock (it is
 * progressing the endpoint or posting), else as fab_ep_serial_enter. */
static inline int fab_ep_serial_try(fab_endpoint* ep) {
  if (!fab_ep_serial_needed(ep)) return 0;
  return atomic_flag_test_and_set_explicit(&ep->cq_lock, memory_order_acquire) ? -1 : 1;
}
/* Around a one-sided post: only where a polling thread runs. */
static inline int fab_ep_gate_enter(fab_endpoint* ep) {
  if (FAB_LIKELY(!atomic_load_explicit(&ep->cq_gated, memory_order_relaxed))) return 0;
  return fab_ep_lock_cq(ep);
}
static inline void fab_ep_serial_leave(fab_endpoint* ep, int held) {
  if (held) atomic_flag_clear_explicit(&ep->cq_lock, memory_order_release);
}
/* Whether a test of c's requests reads its endpoint's CQ: unless a rail's
 * polling thread does (c->helped), where only one test in
 * FAB_HELPED_POLL_EVERY still does, so that progress never waits for that
 * thread to be scheduled. */
enum { FAB_HELPED_POLL_EVERY = 64 };
static inline int fab_comm_test_polls(fab_comm* c) {
  if (FAB_LIKELY(!c->helped) || fab_ep_helper_small_only(c->ep)) return 1;
  uint8_t n = (uint8_t)(atomic_load_explicit(&c->tests_unpolled, memory_order_relaxed) + 1);
  if (n < FAB_HELPED_POLL_EVERY) {
    atomic_store_explicit(&c->tests_unpolled, n, memory_order_relaxed);
    return 0;
  }
  atomic_store_explicit(&c->tests_unpolled, 0, memory_order_relaxed);
  return 1;
}
/* Reads one batch of completions and dispatches them. Caller holds ep->lock. */
fab_result fab_ep_progress_locked(fab_endpoint* ep);
/* Data-path progress (test, and isend/irecv on -FI_EAGAIN). The provider is
 * FI_THREAD_SAFE, so the CQ is read without the endpoint lock; the lock is
 * taken only to dispatch what was read. An empty poll -- nearly every poll
 * of a spinning test -- then costs what fi_cq_read costs, with no lock
 * round trip of ours on top of the provider's own. Where reads and posts
 * are serialised (cq_lock), it returns at once while another thread holds
 * that lock: that thread is progressing the endpoint. */
fab_result fab_ep_poll(fab_endpoint* ep);
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
/* Counts d more (or fewer) objects the sweep hook must revisit; ep lock held. */
void fab_ep_nclosing_add(fab_endpoint* ep, int d);
/* Registers a control-message buffer where the provider needs descriptors
 * (FI_MR_LOCAL); returns 0 or a negative fi errno. */
int fab_ep_ctrl_reg(fab_endpoint* ep, void* buf, size_t len, struct fid_mr** mr, void** desc);
/* FI_MR_ENDPOINT: binds registration mr to ep and enables it (nothing where
 * the device does not ask it); 0 or a negative fi errno. Inline here, below
 * the registration and endpoint code that both call it. */
static inline int fab_ep_bind_mr(fab_endpoint* ep, struct fid_mr* mr) {
  if (!ep->dev->mr_endpoint) return 0;
  int rc = fi_mr_bind(mr, &ep->ep->fid, 0);
  if (rc == 0) rc = fi_mr_enable(mr);
  /* emulated (FABRIC_NIC_PROFILE=cxi): the calls are made as on cxi; a carrier that does not bind says so */
  if (ep->dev->mr_endpoint_emulated && (rc == -FI_ENOSYS || rc == -FI_EOPNOTSUPP)) rc = 0;
  return rc;
}
void fab_ep_ctrl_dereg(struct fid_mr* mr);
/* Where a control message goes (fab_ep_ctl.c), and what its loss means. */
typedef struct fab_ctl_dest {
  fi_addr_t peer;
  int tagged;       /* 1: a tagged send with tag; 0: untagged */
  uint64_t tag;
  int holds_av;     /* 1: the message owns a reference on peer's address and releases it when it goes */
  const char* what; /* for the WARN if it is given up: "a refusal of a connect request" */
  const char* then; /* and what follows from that: "that connect waits out ..." */
  int once;         /* 1: posted now or not at all (-FI_EAGAIN returned, nothing kept): for a note whose
                     * peer may be gone, whose retries would keep the provider reconnecting to it */
} fab_ctl_dest;
/* Sends a copy of msg, best effort: the copy frees itself when the send
 * completes or fails. Posted now, or (provider busy, and not to->once)
 * kept on ep->ctl_owed behind earlier ones to the same peer and posted by
 * the sweep, given up with one WARN after FAB_ANSWER_RETRY_MS. Never drives
 * ep: safe inside a completion. 0, or a negative fi errno when it cannot
 * even be kept (then nothing was sent and to->holds_av's reference is
 * released). ep lock held. */
int fab_ep_ctl_send(fab_endpoint* ep, const fab_ctl_dest* to, const void* msg, size_t len);
/* The sweep's part: posts what ep->ctl_owed holds; how many left it. */
int fab_ep_ctl_retry(fab_endpoint* ep);
/* Endpoint teardown (after fi_close): frees the messages never posted. */
void fab_ep_ctl_drop(fab_endpoint* ep);

/* The comm id table. set/clear under ep->lock (set returns -1 when out of
 * memory); get is lock-free and returns NULL for an unknown or cleared id. */
int fab_ep_id_set(fab_endpoint* ep, uint32_t id, fab_comm* c);
static inline fab_comm* fab_ep_id_get(fab_endpoint* ep, uint32_t id) {
  if (FAB_UNLIKELY(id >= FAB_ID_PAGE * FAB_ID_PAGES)) return NULL;
  _Atomic(fab_comm*)* page = atomic_load_explicit(&ep->ids[id / FAB_ID_PAGE], memory_order_acquire);
  if (FAB_UNLIKELY(!page)) return NULL;
  return atomic_load_explicit(&page[id % FAB_ID_PAGE], memory_order_acquire);
}

/* Maps libfabric errors onto result codes: peer loss -> REMOTE, else SYSTEM. */
fab_result fab_result_from_fi(int fi_err);

/* A sign of life for the liveness check: a load and a store, not an atomic
 * add, since completions of one comm may be dispatched by several threads
 * and a lost count only delays the check. */
static inline void fab_comm_count_completion(fab_comm* c) {
  atomic_store_explicit(&c->ncompl, atomic_load_explicit(&c->ncompl, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

/* How many requests of c still wait for a completion (at most `enough`). */
uint32_t fab_req_pending(fab_comm* c, uint32_t enough);
/* 1 while libfabric still holds an operation context of c: a control
 * operation (inflight) or a request with a posted operation that has not
 * completed (pending > 0; a grouped receive's unposted part is abandoned when
 * the comm closes). Scans the comm's used requests: for close time and a
 * stalled comm only. */
int fab_comm_busy(fab_comm* c);
/* Marks the connection failed (sticky); later calls on it return the error.
 * ep lock held. Does not WARN: the calls that return the error do. Posted
 * receives stay posted until the comm closes: the comm's owner may be
 * using its requests in another thread right now. */
void fab_comm_fail(fab_comm* c, fab_result rc, const char* why);
/* A message larger than its receive on c (either side that learns of it):
 * the connection is failed, on every provider and transport alike, since
 * the two ends disagree on what they exchange (and some providers reset the
 * connection under it). ep lock held. */
void fab_comm_truncated(fab_comm* c);
/* A message on recv comm c was larger than its receive, and its sender may
 * not know: its send may have completed (sendrecv: the overflow went into the
 * provider's sink; rdma: an eager write). The sending comm is told (a
 * FAB_NOTE_TRUNCATED message, fab_pwin_apply) and fails at its next call.
 * Best effort, one try: a sender that is gone, or a provider busy at that
 * instant, and the sender learns nothing (an INFO line says so). ep lock
 * held. */
void fab_comm_tell_truncated(fab_comm* c, int tag, size_t size, size_t over);

/* fab_peer.c: peers on this host (local-only providers with our endpoint
 * names). 1 with why set when the peer at addr is gone (its process or its
 * shared-memory region); 0 when alive or not such a peer. */
int fab_peer_local_gone(const fab_endpoint* ep, const void* addr, size_t len, char* why, size_t why_len);
/* The peer at AV address peer, when it is such a peer: 1 gone (why set),
 * 0 alive; -1 when it is not one (probe it instead). ep lock held. */
int fab_peer_local_state(const fab_endpoint* ep, fi_addr_t peer, char* why, size_t why_len);
/* 0 when addr has the form the provider's addresses have (fab_endpoint.c);
 * else -1 with why set. */
int fab_ep_addr_check(const fab_endpoint* ep, const void* addr, size_t len, char* why, size_t why_len);

#endif /* FAB_ENGINE_H */
