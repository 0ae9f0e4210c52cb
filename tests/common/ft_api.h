/*
 * Loading the plugin through one ABI version's table (or the core directly)
 * and the NCCL-like driving helpers the functional tests and the demo share:
 * init, connect/accept until both comms exist, post with retry, poll until
 * done, all with deadlines.
 *
 * Which API: FABRIC_TEST_API = "core" | "6".."12" (a leading "v" is fine).
 * Which library: FABRIC_TEST_PLUGIN, else the path compiled in as
 * FT_PLUGIN_PATH.
 */
#ifndef FT_API_H
#define FT_API_H

#include "fab_api.h"
#include "ft_harness.h"

#ifdef __cplusplus
extern "C" {
#endif

/* API ids: 0 = the core, 6..12 = NCCL's ncclNetPlugin_vN, FT_API_NEURON + N
 * = Neuron's ncclNetPlugin_vN (from the Neuron library; FABRIC_TEST_API=neuronN). */
enum { FT_API_CORE = 0, FT_API_NEWEST = -1, FT_API_NEURON = 1000 };

/* The selected API id; fails on a value it cannot parse. */
int ft_api_selected(void);
/* 1 when this binary can use the core directly (links fabric_engine). */
int ft_api_core_available(void);
/* The library for an API id: FABRIC_TEST_PLUGIN (FABRIC_TEST_NEURON_PLUGIN
 * for Neuron), else the path compiled in. */
const char* ft_plugin_path_for(int api);
const char* ft_plugin_path(void);

typedef struct ft_lib {
  void* dl;       /* dlopen handle; NULL for the core */
  fab_api api;    /* filled by the driver (or a copy of fab_api_core) */
  int version;    /* the table's version in its family; 0 = core */
  int neuron;     /* 1: a Neuron table (version is Neuron's) */
  char desc[64];  /* "core" or the symbol */
} ft_lib;

/* What the table at hand has, by family and version rather than by number. */
/* NCCL net version since or later, or the core (which has everything net has). */
static inline int ft_net_since(const ft_lib* l, int since) { return !l->neuron && (l->version == 0 || l->version >= since); }
/* isend/irecv take int sizes (net v6..v8, Neuron). */
static inline int ft_int_sizes(const ft_lib* l) { return l->neuron || (l->version >= 6 && l->version <= 8); }
/* regMr takes an int size (net v6..v7). */
static inline int ft_int_reg_size(const ft_lib* l) { return !l->neuron && l->version >= 6 && l->version <= 7; }
/* per-communicator contexts (net v11+, and the core). */
static inline int ft_has_ctx(const ft_lib* l) { return ft_net_since(l, 11); }
/* connect and accept block until they have a comm (Neuron v4). */
static inline int ft_blocking(const ft_lib* l) { return l->neuron && l->version == 4; }
/* irecv takes one untagged buffer, not arrays (Neuron v4). */
static inline int ft_single_recv(const ft_lib* l) { return l->neuron && l->version == 4; }
/* regIsGlobal in the properties (net v8+, Neuron v5+). */
static inline int ft_has_reg_is_global(const ft_lib* l) { return l->neuron ? l->version >= 5 : ft_net_since(l, 8); }

/* version FT_API_NEWEST picks the newest table the library exports. Fails the
 * test on error. */
void ft_lib_open(ft_lib* lib, int version);
void ft_lib_close(ft_lib* lib);

/* One side of the test: the loaded plugin, its context and device 0. */
typedef struct ft_side {
  ft_peer* peer;
  ft_lib lib;
  const fab_api* api;
  fab_ctx* ctx;
  int inited;
  int ndev;
  int dev;
  fab_properties props; /* of dev */
  fab_comm_config config;
} ft_side;

/* Load, init (with ft_logger), devices, properties of device 0. */
void ft_side_open(ft_side* s, ft_peer* peer, int version);
/* init only (library already loaded); used by the lifecycle tests. */
void ft_side_init(ft_side* s);
/* finalize (where the version has it) and unload. */
void ft_side_close(ft_side* s);

/* A bidirectional connection to the peer: this side's send comm goes to the
 * peer's recv comm and the other way round. */
typedef struct ft_conn {
  void* listen_comm;
  void* send_comm;
  void* recv_comm;
  unsigned char handle[FAB_HANDLE_SIZE];
  unsigned char peer_handle[FAB_HANDLE_SIZE];
} ft_conn;

/* listen on n comms, exchange the handles, then call connect and accept in
 * turn (non-blocking, like NCCL) until all 2n comms exist or timeout_ms.
 * Blocking versions (Neuron v4) return from each call with its comm; both
 * ranks connect first, as a runtime may. */
void ft_connect_all(ft_side* s, ft_conn* c, int n, int timeout_ms);
void ft_close_all(ft_side* s, ft_conn* c, int n);

/* Memory: an allocated, registered (NCCL_PTR_HOST) buffer. */
typedef struct ft_mr {
  void* buf;
  size_t len;
  void* comm;
  void* mh;
} ft_mr;
void ft_mr_alloc(ft_side* s, ft_mr* m, void* comm, size_t len);
void ft_mr_free(ft_side* s, ft_mr* m);

/* Post with retry while the plugin returns success with *request == NULL;
 * fails on an error or when timeout_ms passes without a request. */
void* ft_isend(ft_side* s, void* comm, void* data, size_t size, int tag, void* mh, int timeout_ms);
void* ft_irecv(ft_side* s, void* comm, int n, void** data, const size_t* sizes, const int* tags, void** mhs,
               int timeout_ms);

/* test() until done, an error, or timeout_ms. Returns the last result; *done
 * tells whether it completed. Never fails the test itself. */
fab_result ft_test_until(ft_side* s, void* req, int* sizes, int timeout_ms, int* done);
/* test() until done; fails on an error or timeout. */
void ft_wait(ft_side* s, void* req, int* sizes, int timeout_ms, const char* what);
/* Waits for n requests, testing them round-robin; sizes (may be NULL) has
 * stride sizes_stride ints per request. */
void ft_wait_all(ft_side* s, void** reqs, int n, int* sizes, int sizes_stride, int timeout_ms, const char* what);

/* Sends size bytes each way on conn and verifies them (symmetric). */
void ft_exchange(ft_side* s, ft_conn* c, size_t size, uint64_t seed, int timeout_ms);
/* The same into a receive of recv_len >= size bytes: the reported size must
 * be the message's, and nothing may land past it. */
void ft_exchange_into(ft_side* s, ft_conn* c, size_t size, size_t recv_len, uint64_t seed, int timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* FT_API_H */
