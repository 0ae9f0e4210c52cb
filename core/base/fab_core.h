/*
 * The core engine's public interface: one version-free API that every
 * generated ABI shim calls. Nothing here knows which NCCL table version is in
 * use; shims widen, narrow, default and stash arguments as the specs in abi/
 * say, then call these functions.
 *
 * Conventions
 *  - Every function returns fab_result. Its numeric values equal ncclResult_t
 *    so shims pass results straight through.
 *  - Every failure logs exactly one WARN line saying what went wrong and what
 *    to do about it.
 *  - Sizes are size_t. Where every ABI version uses int (test and iflush
 *    sizes), the core takes int and guarantees it never writes a value that
 *    does not fit.
 *  - Comms, requests and memory handles are opaque pointers owned by the core.
 */
#ifndef FAB_CORE_H
#define FAB_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  FAB_OK = 0,
  FAB_ERR_CUDA = 1,          /* ncclUnhandledCudaError */
  FAB_ERR_SYSTEM = 2,        /* ncclSystemError: network, library or kernel failure */
  FAB_ERR_INTERNAL = 3,      /* ncclInternalError: the runtime misused the API */
  FAB_ERR_INVALID_ARG = 4,   /* ncclInvalidArgument */
  FAB_ERR_INVALID_USAGE = 5, /* ncclInvalidUsage: user or configuration error */
  FAB_ERR_REMOTE = 6,        /* ncclRemoteError: the peer failed or sent garbage */
} fab_result;

/* Log levels and subsystem flags, numerically equal to NCCL's. */
enum { FAB_LOG_NONE = 0, FAB_LOG_VERSION = 1, FAB_LOG_WARN = 2, FAB_LOG_INFO = 3, FAB_LOG_ABORT = 4, FAB_LOG_TRACE = 5 };
enum { FAB_SUBSYS_INIT = 0x1, FAB_SUBSYS_NET = 0x10, FAB_SUBSYS_ENV = 0x80, FAB_SUBSYS_ALLOC = 0x100, FAB_SUBSYS_ALL = ~0 };

typedef void (*fab_logger_fn)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
typedef fab_result (*fab_profiler_fn)(void** event_handle, int type, void* profiler_handle, int64_t plugin_id,
                                      void* ext_data);

/* Pointer kinds (NCCL_PTR_*). */
enum { FAB_PTR_HOST = 0x1, FAB_PTR_CUDA = 0x2, FAB_PTR_DMABUF = 0x4 };
/* regMrSym's mrFlags (NCCL_NET_MR_FLAG_*): the runtime never writes the
 * registration's signal words itself (only the network adds to them). */
enum { FAB_MR_FLAG_FORCE_SO = 0x1, FAB_MR_FLAG_SIGNAL_NEVER_RESET = 0x2 };

enum {
  FAB_HANDLE_SIZE = 128,     /* the connection handle NCCL carries between ranks */
  FAB_MAX_RECVS = 8,         /* largest n of a grouped receive */
  FAB_MAX_REQUESTS = 32,     /* outstanding requests per comm (per sub-receive slot) */
  FAB_MAX_VDEV_DEVS = 8,     /* largest vProps devs[] of any version */
  FAB_NAME_MAX = 256,
};

/* NCCL_NET_OPTIONAL_RECV_COMPLETION: what NCCL may store in *request before irecv. */
#define FAB_REQUEST_HINT_OPTIONAL_COMPLETION ((void*)0x1)

typedef struct {
  int ndevs;
  int devs[FAB_MAX_VDEV_DEVS];
} fab_vdevice_props;

/* Superset of every version's device properties. Strings are owned by the core
 * and stay valid until the last finalize. */
typedef struct {
  const char* name;
  const char* pci_path;       /* NULL when the provider gives no PCI device */
  uint64_t guid;
  int ptr_support;            /* FAB_PTR_* bits */
  int reg_is_global;
  int force_flush;
  int speed_mbps;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  int net_device_type;        /* 0 = host */
  int net_device_version;
  fab_vdevice_props vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
  int16_t rail_id;
  int16_t plane_id;
  /* one-sided calls on a connection (Neuron tables; fab_p2p_get_properties) */
  size_t max_write_inline_size; /* iwriteInline's largest size */
  size_t max_mr_key_size;       /* bytes of a key getMrKey returns */
  int rma_supported;            /* getMrKey, iwrite, iwriteInline and iread work */
} fab_properties;

typedef struct {
  int traffic_class;          /* -1 = unset */
} fab_comm_config;

typedef struct {
  int32_t max_concurrent_peers, min_concurrent_peers, max_flows_per_peer, min_flows_per_peer;
} fab_comm_attr;

typedef struct {
  fab_comm_attr send_attr;
  fab_comm_attr recv_attr;
  uint32_t op, algo, proto;
} fab_net_attr;

typedef struct fab_ctx fab_ctx;

/* --- lifetime ---------------------------------------------------------- */

/* Per-communicator init (net v11+): creates a context; the first one also
 * brings the engine up. Reference counted: each successful fab_init is paired
 * with one fab_finalize; the last one tears everything down. */
fab_result fab_init(fab_ctx** ctx, uint64_t comm_id, const fab_comm_config* config, fab_logger_fn logger,
                    fab_profiler_fn profiler);
fab_result fab_finalize(fab_ctx* ctx);

/* Process-wide init (net v10 and older): idempotent, never finalized by NCCL.
 * Comms created with ctx == NULL use the process context. The engine tears it
 * down when the library is unloaded. */
fab_result fab_init_process(fab_logger_fn logger, fab_profiler_fn profiler);

/* --- devices ------------------------------------------------------------ */

fab_result fab_devices(int* ndev);
fab_result fab_get_properties(int dev, fab_properties* props);
/* Fuses props->ndevs physical devices into a virtual one; returns its index. */
fab_result fab_make_vdevice(int* dev, const fab_vdevice_props* props);
fab_result fab_set_net_attr(fab_ctx* ctx, const fab_net_attr* attr);

/* --- connections (all non-blocking) --------------------------------------- */

/* ctx may be NULL (process context). handle points to FAB_HANDLE_SIZE bytes. */
fab_result fab_listen(fab_ctx* ctx, int dev, void* handle, void** listen_comm);
/* config may be NULL (use the context's). *send_comm stays NULL until the
 * connection is ready; call again with the same handle. dev_handle may be
 * NULL; a host plugin leaves *dev_handle untouched. */
fab_result fab_connect(fab_ctx* ctx, int dev, const fab_comm_config* config, void* handle, void** send_comm,
                       void** dev_handle);
fab_result fab_accept(void* listen_comm, void** recv_comm, void** dev_handle);
fab_result fab_close_send(void* send_comm);
fab_result fab_close_recv(void* recv_comm);
fab_result fab_close_listen(void* listen_comm);

/* --- memory --------------------------------------------------------------- */

/* comm is a send or recv comm. type is FAB_PTR_HOST or FAB_PTR_CUDA. */
fab_result fab_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle);
fab_result fab_reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                             void** mhandle);
fab_result fab_dereg_mr(void* comm, void* mhandle);

/* --- data ----------------------------------------------------------------- */

/* On success *request is either a request to test, or NULL meaning "cannot
 * post now, call again". Input values of *request are ignored (the irecv hint
 * FAB_REQUEST_HINT_OPTIONAL_COMPLETION included): output is always written. */
fab_result fab_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                     void** request);
fab_result fab_irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags, void** mhandles,
                     void** phandles, void** request);
/* *request == NULL on success means the flush is already complete. */
fab_result fab_iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request);
/* sizes may be NULL; otherwise receives one entry per buffer of the request
 * (n for a grouped receive, 1 for a send). Once *done is 1 the request is
 * freed. */
fab_result fab_test(void* request, int* done, int* sizes);

/* --- one-sided (NCCL's RMA tables, GIN proxy) ------------------------------ */

/* NCCL_NET_DEVICE_GIN_PROXY: what the RMA tables report as netDeviceType. */
enum { FAB_NET_DEVICE_GIN_PROXY = 2 };
/* NCCL_NET_SIGNAL_OP_*. */
enum { FAB_SIGNAL_INC = 1, FAB_SIGNAL_ADD = 2 };

typedef struct {
  int n_contexts;             /* independent ordering domains */
  int traffic_class;          /* INT_MIN or -1: unset */
  int rank_stride;            /* peers rank +- k*stride only (1: all); RMA v14-v16 */
  const int* peers;           /* the ranks the context talks to (RMA v17+); NULL: every rank */
  int npeers;
} fab_rma_config;

typedef struct {
  bool flushes_all_puts_on_any_signal;
} fab_rma_properties;

/* init for the RMA family: fab_init, then fails (one WARN) when device 0
 * cannot do one-sided operations, so NCCL does not pick this plugin for
 * them. */
fab_result fab_rma_init(fab_ctx** ctx, uint64_t comm_id, fab_logger_fn logger);
/* The device's properties with netDeviceType GIN_PROXY. */
fab_result fab_rma_get_properties(int dev, fab_properties* props);
/* Collective and blocking: every rank calls it with all ranks' listen
 * handles; returns once every peer is connected. ctx is ignored (NCCL passes
 * its net context): the listen comm's context owns the group. n_contexts:
 * the contexts the comm itself stands for where an ABI passes the comm in
 * place of a context (GIN v11/v12; v12's connectionId picks one).
 * abort_flag (RMA v17+; may be NULL): while the call waits for peers, a
 * non-zero value ends it with an error. */
fab_result fab_group_connect(fab_ctx* ctx, void** handles, int nranks, int rank, int n_contexts, void* listen_comm,
                            void** group, const volatile uint32_t* abort_flag);
fab_result fab_group_rma_properties(void* group, fab_rma_properties* props);
/* config may be NULL (one context). dev_handle (GIN v13 layout) may be NULL;
 * a proxy plugin writes NULL there. */
fab_result fab_rma_create_context(void* group, const fab_rma_config* config, void** rma_ctx, void** dev_handle);
fab_result fab_rma_destroy_context(void* rma_ctx);
fab_result fab_close_group(void* group);
/* Collective: every rank registers, in the same order; the windows are
 * exchanged inside the call. gin_handle (GIN layouts) may be NULL; it
 * receives the memory handle. */
fab_result fab_reg_mr_sym(void* group, void* data, size_t size, int type, uint64_t mr_flags, void** mhandle,
                          void** gin_handle);
fab_result fab_reg_mr_sym_dmabuf(void* group, void* data, size_t size, int type, uint64_t offset, int fd,
                                 uint64_t mr_flags, void** mhandle, void** gin_handle);
fab_result fab_dereg_mr_sym(void* group, void* mhandle);
/* rma_ctx: a context from createContext, or the collective comm itself (its
 * own n_contexts). Every operation returns a request to test (never NULL on
 * success). */
fab_result fab_rma_iput(void* rma_ctx, int context, uint64_t src_off, void* src_mhandle, size_t size,
                        uint64_t dst_off, void* dst_mhandle, uint32_t rank, uint32_t opt_flags, void** request);
/* size 0 with NULL src/dst handles: the signal alone. */
fab_result fab_rma_iput_signal(void* rma_ctx, int context, uint64_t src_off, void* src_mhandle, size_t size,
                               uint64_t dst_off, void* dst_mhandle, uint32_t rank, uint64_t signal_off,
                               void* signal_mhandle, uint64_t signal_value, uint32_t signal_op, bool strong,
                               uint32_t opt_flags, void** request);
fab_result fab_rma_iget(void* rma_ctx, int context, uint64_t remote_off, void* remote_mhandle, size_t size,
                        uint64_t local_off, void* local_mhandle, uint32_t rank, uint32_t opt_flags, void** request);
/* *request == NULL: nothing earlier to wait for. */
fab_result fab_rma_iflush(void* rma_ctx, int context, void* mhandle, uint32_t rank, void** request);
fab_result fab_rma_test(void* group, void* request, int* done);
fab_result fab_rma_progress(void* rma_ctx);
fab_result fab_rma_query_last_error(void* rma_ctx, bool* has_error);

/* --- one-sided calls on a connection (Neuron tables) ----------------------- */

/* Neuron v4's blocking calls: listen into a 64-byte handle (fails with a
 * WARN when the endpoint's address does not fit), and connect and accept
 * that return only with a comm or an error (FABRIC_CONNECT_TIMEOUT_MS). A
 * blocking connect answers connect requests queued on our listeners while it
 * waits, since the peer may itself be blocked in connect; accept then returns
 * the comms so answered. */
fab_result fab_listen_short(fab_ctx* ctx, int dev, void* handle, void** listen_comm);
/* listen and connect on the first rail of a device of several (FABRIC_NIC_RAILS, or fused NICs): the tables
 * whose calls need one connection per comm (Neuron's one-sided windows are offered on a comm; RMA and GIN
 * groups connect single-rail) use these, and on a device of one rail they are fab_listen and fab_connect. */
fab_result fab_listen_one_rail(fab_ctx* ctx, int dev, void* handle, void** listen_comm);
fab_result fab_connect_one_rail(fab_ctx* ctx, int dev, const fab_comm_config* config, void* handle, void** send_comm,
                                void** dev_handle);
fab_result fab_connect_wait(fab_ctx* ctx, int dev, const fab_comm_config* config, void* handle, void** send_comm,
                            void** dev_handle);
fab_result fab_accept_wait(void* listen_comm, void** recv_comm, void** dev_handle);
/* Process-wide fini (Neuron v6): ends what fab_init_process began. */
fab_result fab_fini_process(void);
/* fab_get_properties, seen by a runtime that registers per connection and
 * may write and read its peer's windows: rma_supported (the device runs the
 * rdma transport), max_write_inline_size, max_mr_key_size; reg_is_global 0
 * (a window is offered to the peer of the comm it is registered on); host
 * memory only. */
fab_result fab_p2p_get_properties(int dev, fab_properties* props);
/* fab_reg_mr / fab_reg_mr_dmabuf that also offer [data, data + size) to the
 * comm's peer for its iwrite and iread (where the device supports them), and
 * the deregistration that withdraws the offer. */
fab_result fab_reg_mr_offered(void* comm, void* data, size_t size, int type, void** mhandle);
fab_result fab_reg_mr_dmabuf_offered(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                     void** mhandle);
fab_result fab_dereg_mr_offered(void* comm, void* mhandle);
/* The remote key of a registration, as the peer passes it to iwrite/iread. */
fab_result fab_get_mr_key(void* mhandle, uint64_t* mr_key);
/* Writes size bytes from src into the peer's memory at dest (its virtual
 * address), inside a window the peer offered on this connection with key
 * mr_key; reads the same way on a recv comm. *request NULL on success: call
 * again (the peer's offer may still be on its way, or every request is in
 * flight). Completion means the data is placed (read: here; write: at the
 * peer, as far as the provider can tell). */
fab_result fab_iwrite(void* send_comm, void* src, size_t size, void* src_mhandle, uint64_t dest, uint64_t mr_key,
                      void** request);
/* size <= max_write_inline_size; src needs no registration and may be reused
 * at once. */
fab_result fab_iwrite_inline(void* send_comm, void* src, size_t size, uint64_t dest, uint64_t mr_key,
                             void** request);
fab_result fab_iread(void* recv_comm, void* dest, size_t size, void* dest_mhandle, uint64_t src, uint64_t mr_key,
                     void** request);

/* --- helpers the generated shims use ------------------------------------- */

/* Logs one WARN line naming the ABI function, the argument, its value and
 * what was expected, and returns FAB_ERR_INTERNAL (NCCL misused the API).
 * Shims call it when a range check of a conversion (narrow, widen of a
 * negative int, array longer than the version allows) fails. */
fab_result fab_bad_argument(const char* function, const char* argument, long long value, const char* expected);

#ifdef __cplusplus
}
#endif
#endif /* FAB_CORE_H */
