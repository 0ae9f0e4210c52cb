/*
 * netbench: shared declarations.
 *
 * Two "transports" implement the same small request/test interface, so the
 * benchmark loops in netbench.c are written once and run unchanged over
 *   - raw:    plain libfabric (RDM, FI_TAGGED, fi_tsend/fi_trecv, busy-polled
 *             fi_cq_read) -- the floor any plugin can reach, and
 *   - plugin: any NCCL net plugin library, driven through its
 *             ncclNetPlugin_vN table by the generated driver (fab_api).
 * The interface mirrors the NCCL net API (listen/connect/accept, regMr,
 * isend/irecv/test), so the raw transport is the "minimal plugin".
 */
#ifndef NB_H
#define NB_H

#include <stddef.h>
#include <stdint.h>

#define NB_HANDLE_SIZE 128

typedef struct nb_xport nb_xport;

typedef struct nb_ops {
  const char* name;                                   /* "raw" or "plugin" */
  /* Connections. All are non-blocking like NCCL's: connect/accept return 0
   * with *comm == NULL until ready. */
  int (*listen)(nb_xport* x, void* handle /* NB_HANDLE_SIZE */, void** lcomm);
  int (*connect)(nb_xport* x, void* handle, void** scomm);
  int (*accept)(nb_xport* x, void* lcomm, void** rcomm);
  int (*close_send)(nb_xport* x, void* scomm);
  int (*close_recv)(nb_xport* x, void* rcomm);
  int (*close_listen)(nb_xport* x, void* lcomm);
  /* Memory. comm is a send or recv comm. */
  int (*reg_mr)(nb_xport* x, void* comm, void* buf, size_t size, void** mh);
  int (*dereg_mr)(nb_xport* x, void* comm, void* mh);
  /* Data. *req == NULL after a 0 return means "not posted, call again". */
  int (*isend)(nb_xport* x, void* scomm, void* buf, size_t size, int tag, void* mh, void** req);
  int (*irecv)(nb_xport* x, void* rcomm, void* buf, size_t size, int tag, void* mh, void** req);
  int (*test)(nb_xport* x, void* req, int* done, int* size);
  void (*fini)(nb_xport* x);
} nb_ops;

struct nb_xport {
  const nb_ops* ops;
  char desc[256];        /* what it is, for the report (provider, version, library) */
  void* priv;
};

/* Where buffers live (--mem; nb_mem.c). */
enum { NB_MEM_HOST = 0, NB_MEM_CUDA = 1, NB_MEM_DMABUF = 2 }; /* DMABUF: CUDA memory registered by dma-buf fd */
extern int nb_mem_kind;
void nb_mem_open(int kind); /* in each rank, after the fork */
void* nb_mem_alloc(size_t size);
void nb_mem_free(void* p, size_t size);
void nb_mem_put(void* dst, const void* src, size_t n); /* host -> buffer */
void nb_mem_get(void* dst, const void* src, size_t n); /* buffer -> host */
void nb_mem_set(void* dst, int byte, size_t n);
/* A dma-buf fd for the GPU buffer p of size bytes (from nb_mem_alloc, which
 * starts it on a 2 MiB page); the caller closes it. */
int nb_mem_dmabuf_fd(void* p, size_t size);

enum { NB_RAW_HINTS_PLUGIN = 0, NB_RAW_HINTS_NOHMEM = 1, NB_RAW_HINTS_MINIMAL = 2 };

/* Options both transports need. */
typedef struct nb_xport_opts {
  const char* provider;  /* libfabric provider name ("tcp", "shm", ...) or NULL */
  const char* plugin;    /* plugin library path */
  int version;           /* requested ncclNetPlugin_vN, 0 = newest common */
  int dev;               /* plugin device index */
  int verbose;
  int raw_hints;         /* NB_RAW_HINTS_*: which fi_getinfo hints raw mode uses */
  int raw_rma;           /* raw mode's RMA flavour (nb_raw_rma.c) */
  int raw_socket;        /* raw mode over plain TCP sockets (nb_sock.c) */
  int nccl_profiler;     /* drive the plugin as NCCL does with no profiler loaded: a callback that returns at
                          * once, and a parent handle with every isend and irecv (nb_plugin.c) */
  int mem;               /* NB_MEM_*: the buffers' kind (registered as such) */
  int rails;             /* > 1: the plugin runs on a virtual device fusing that many copies of device 0
                          * (FABRIC_RAILS, set by netbench when unset) */
  int nvdevs;            /* > 0: the plugin runs on a virtual device fusing these devices (--vdevice) */
  int vdevs[8];
} nb_xport_opts;

int nb_raw_open(nb_xport* x, const nb_xport_opts* o);
int nb_sock_open(nb_xport* x, const nb_xport_opts* o); /* --raw-socket (nb_sock.c) */
int nb_plugin_open(nb_xport* x, const nb_xport_opts* o);
/* The ncclNetPlugin_vN symbols a library exports, as a bitmask of N. */
unsigned nb_plugin_versions_in_lib(const char* path);

/* Raw-only extra: time fi_mr_reg/fi_close on the raw domain (for the MR test).
 * Returns ns for reg and dereg. */
int nb_raw_mr_cost(nb_xport* x, void* buf, size_t size, uint64_t* reg_ns, uint64_t* dereg_ns);

uint64_t nb_now_ns(void);
void nb_die(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void nb_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void nb_cleanup_shm(void); /* removes this process's libfabric shm regions (failure exits) */
extern int nb_rank;

#endif /* NB_H */
