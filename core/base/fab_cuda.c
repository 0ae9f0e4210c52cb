#include "fab_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "fab_core.h"
#include "fab_log.h"

/* The few driver types and constants used, with the values of cuda.h. */
typedef int fab_CUresult;
typedef unsigned long long fab_CUdeviceptr;
enum {
  FAB_CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  FAB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  FAB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  FAB_CU_MEMORYTYPE_DEVICE = 2,
  FAB_CU_FLUSH_TARGET_CURRENT_CTX = 0,
  FAB_CU_FLUSH_TO_OWNER = 100,
  FAB_CU_STREAM_NON_BLOCKING = 1,
  FAB_CU_MEMHOSTREGISTER_PORTABLE = 1,
  FAB_CUDA_MAX_CONTEXTS = 16,
  FAB_CUDA_KNOWN = 32, /* allocations whose context is remembered (a copy then asks the driver nothing) */
};

#ifdef FAB_HAVE_CUDA_H
#include <cuda.h>
_Static_assert((int)CU_POINTER_ATTRIBUTE_CONTEXT == (int)FAB_CU_POINTER_ATTRIBUTE_CONTEXT, "cuda.h value");
_Static_assert((int)CU_POINTER_ATTRIBUTE_MEMORY_TYPE == (int)FAB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, "cuda.h value");
_Static_assert((int)CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL == (int)FAB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
               "cuda.h value");
_Static_assert((int)CU_MEMORYTYPE_DEVICE == (int)FAB_CU_MEMORYTYPE_DEVICE, "cuda.h value");
_Static_assert((int)CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX == (int)FAB_CU_FLUSH_TARGET_CURRENT_CTX,
               "cuda.h value");
_Static_assert((int)CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER == (int)FAB_CU_FLUSH_TO_OWNER, "cuda.h value");
#endif

static struct {
  void* lib;
  int usable;
  fab_CUresult (*init)(unsigned int);
  fab_CUresult (*device_count)(int*);
  fab_CUresult (*pointer_attr)(void*, int, fab_CUdeviceptr);
  fab_CUresult (*flush)(int, int);
  /* for copies to and from GPU memory (optional: without them such a copy fails) */
  fab_CUresult (*ctx_push)(void*);
  fab_CUresult (*ctx_pop)(void**);
  /* for the one-sided engine's copies (fab_cuda_copy; optional as well) */
  fab_CUresult (*copy_async)(fab_CUdeviceptr, fab_CUdeviceptr, size_t, void*);
  fab_CUresult (*stream_create)(void**, unsigned int);
  fab_CUresult (*stream_sync)(void*);
  fab_CUresult (*host_register)(void*, size_t, unsigned int);
  fab_CUresult (*host_unregister)(void*);
  fab_CUresult (*write_value64)(void*, fab_CUdeviceptr, uint64_t, unsigned int);
  fab_CUresult (*address_range)(fab_CUdeviceptr*, size_t*, fab_CUdeviceptr);
  fab_CUresult (*device_get)(int*, int);
  fab_CUresult (*primary_retain)(void**, int);
  void* primary[FAB_CUDA_MAX_CONTEXTS]; /* retained primary contexts, by ordinal */
  struct {
    uintptr_t base, end; /* an allocation whose context was resolved */
    void* ctx;
  } known[FAB_CUDA_KNOWN];
  int known_next;
  pthread_mutex_t streams_lock;
  struct {
    void* ctx;
    void* stream;
  } streams[FAB_CUDA_MAX_CONTEXTS];
  int nstreams;
} g_cu = {.streams_lock = PTHREAD_MUTEX_INITIALIZER};

static void* sym(const char* name) { return g_cu.lib ? dlsym(g_cu.lib, name) : NULL; }

int fab_cuda_init(void) {
  if (g_cu.lib) return g_cu.usable;
  g_cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!g_cu.lib) {
    FAB_INFO(FAB_SUBSYS_INIT, "CUDA driver not loaded (%s): host memory only", dlerror());
    return 0;
  }
  g_cu.init = (fab_CUresult(*)(unsigned int))sym("cuInit");
  g_cu.device_count = (fab_CUresult(*)(int*))sym("cuDeviceGetCount");
  g_cu.pointer_attr = (fab_CUresult(*)(void*, int, fab_CUdeviceptr))sym("cuPointerGetAttribute");
  g_cu.flush = (fab_CUresult(*)(int, int))sym("cuFlushGPUDirectRDMAWrites");
  g_cu.ctx_push = (fab_CUresult(*)(void*))sym("cuCtxPushCurrent_v2");
  g_cu.ctx_pop = (fab_CUresult(*)(void**))sym("cuCtxPopCurrent_v2");
  g_cu.copy_async = (fab_CUresult(*)(fab_CUdeviceptr, fab_CUdeviceptr, size_t, void*))sym("cuMemcpyAsync");
  g_cu.stream_create = (fab_CUresult(*)(void**, unsigned int))sym("cuStreamCreate");
  g_cu.stream_sync = (fab_CUresult(*)(void*))sym("cuStreamSynchronize");
  g_cu.host_register = (fab_CUresult(*)(void*, size_t, unsigned int))sym("cuMemHostRegister_v2");
  g_cu.host_unregister = (fab_CUresult(*)(void*))sym("cuMemHostUnregister");
  g_cu.write_value64 = (fab_CUresult(*)(void*, fab_CUdeviceptr, uint64_t, unsigned int))sym("cuStreamWriteValue64_v2");
  g_cu.address_range = (fab_CUresult(*)(fab_CUdeviceptr*, size_t*, fab_CUdeviceptr))sym("cuMemGetAddressRange_v2");
  g_cu.device_get = (fab_CUresult(*)(int*, int))sym("cuDeviceGet");
  g_cu.primary_retain = (fab_CUresult(*)(void**, int))sym("cuDevicePrimaryCtxRetain");
  if (!g_cu.init || !g_cu.device_count || !g_cu.pointer_attr || !g_cu.flush) {
    FAB_INFO(FAB_SUBSYS_INIT, "CUDA driver lacks cuInit/cuDeviceGetCount/cuPointerGetAttribute/"
                              "cuFlushGPUDirectRDMAWrites: host memory only");
    return 0;
  }
  int n = 0;
  fab_CUresult rc = g_cu.init(0);
  if (rc == 0) rc = g_cu.device_count(&n);
  if (rc != 0 || n <= 0) {
    FAB_INFO(FAB_SUBSYS_INIT, "CUDA unusable (CUresult %d, %d devices): host memory only", rc, n);
    return 0;
  }
  g_cu.usable = 1;
  FAB_INFO(FAB_SUBSYS_INIT, "CUDA driver loaded, %d devices", n);
  return 1;
}

void fab_cuda_fini(void) {
  if (g_cu.lib) dlclose(g_cu.lib);
  g_cu.lib = NULL;
  g_cu.usable = 0;
  g_cu.init = NULL;
  g_cu.device_count = NULL;
  g_cu.pointer_attr = NULL;
  g_cu.flush = NULL;
  g_cu.ctx_push = NULL;
  g_cu.ctx_pop = NULL;
  g_cu.copy_async = NULL;
  g_cu.stream_create = NULL;
  g_cu.stream_sync = NULL;
  g_cu.device_get = NULL;
  g_cu.address_range = NULL;
  memset(g_cu.known, 0, sizeof(g_cu.known));
  g_cu.primary_retain = NULL;
  g_cu.host_register = NULL;
  g_cu.host_unregister = NULL;
  g_cu.write_value64 = NULL;
  g_cu.nstreams = 0; /* streams die with their contexts; the driver is unloaded here */
  memset(g_cu.primary, 0, sizeof(g_cu.primary)); /* retained for the process's life, as the runtime does */
}

int fab_cuda_ptr_device(const void* ptr) {
  if (!g_cu.usable) return -1;
  unsigned int mem_type = 0;
  int dev = -1;
  if (g_cu.pointer_attr(&mem_type, FAB_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (fab_CUdeviceptr)(uintptr_t)ptr) != 0 ||
      mem_type != FAB_CU_MEMORYTYPE_DEVICE)
    return -1;
  if (g_cu.pointer_attr(&dev, FAB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (fab_CUdeviceptr)(uintptr_t)ptr) != 0)
    return -1;
  return dev;
}

int fab_cuda_flush(const char** what) {
  *what = "cuFlushGPUDirectRDMAWrites";
  if (!g_cu.usable) return -1;
  return g_cu.flush(FAB_CU_FLUSH_TARGET_CURRENT_CTX, FAB_CU_FLUSH_TO_OWNER);
}

int fab_cuda_copy_to_device(void* dst, const void* src, size_t n, const char** what) {
  return fab_cuda_copy(dst, src, n, dst, what);
}

/* Our stream in ctx (created on first use, non-blocking: a copy on the
 * legacy default stream would wait for every kernel of the context, among
 * them one that waits for the signal this copy precedes). */
static void* stream_of(void* ctx, fab_CUresult* rc) {
  void* st = NULL;
  pthread_mutex_lock(&g_cu.streams_lock);
  for (int i = 0; i < g_cu.nstreams && !st; i++)
    if (g_cu.streams[i].ctx == ctx) st = g_cu.streams[i].stream;
  if (!st && g_cu.nstreams < FAB_CUDA_MAX_CONTEXTS) {
    *rc = g_cu.stream_create(&st, FAB_CU_STREAM_NON_BLOCKING);
    if (*rc == 0) {
      g_cu.streams[g_cu.nstreams].ctx = ctx;
      g_cu.streams[g_cu.nstreams++].stream = st;
    } else {
      st = NULL;
    }
  } else if (!st) {
    *rc = -1;
  }
  pthread_mutex_unlock(&g_cu.streams_lock);
  return st;
}

/* The context to copy in for GPU memory at p: the one it was allocated in,
 * or, for memory mapped with cuMemMap (ncclMemAlloc), which belongs to no
 * context, its device's primary context. */
static fab_CUresult resolve_context(const void* p, void** ctx) {
  *ctx = NULL;
  fab_CUresult rc = g_cu.pointer_attr(ctx, FAB_CU_POINTER_ATTRIBUTE_CONTEXT, (fab_CUdeviceptr)(uintptr_t)p);
  if (rc == 0 && *ctx) return 0;
  int ordinal = -1, dev = 0;
  rc = g_cu.pointer_attr(&ordinal, FAB_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (fab_CUdeviceptr)(uintptr_t)p);
  if (rc != 0) return rc;
  if (ordinal < 0 || ordinal >= FAB_CUDA_MAX_CONTEXTS || !g_cu.device_get || !g_cu.primary_retain) return -1;
  pthread_mutex_lock(&g_cu.streams_lock);
  if (!g_cu.primary[ordinal] && (rc = g_cu.device_get(&dev, ordinal)) == 0)
    rc = g_cu.primary_retain(&g_cu.primary[ordinal], dev);
  *ctx = g_cu.primary[ordinal];
  pthread_mutex_unlock(&g_cu.streams_lock);
  return rc ? rc : *ctx ? 0 : -1;
}

/* The same, remembered by allocation: the windows' copies ask the driver
 * nothing after the first (fab_cuda_forget drops an allocation going away). */
static fab_CUresult context_of(const void* p, void** ctx) {
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&g_cu.streams_lock);
  for (int i = 0; i < FAB_CUDA_KNOWN; i++)
    if (g_cu.known[i].ctx && a >= g_cu.known[i].base && a < g_cu.known[i].end) {
      *ctx = g_cu.known[i].ctx;
      pthread_mutex_unlock(&g_cu.streams_lock);
      return 0;
    }
  pthread_mutex_unlock(&g_cu.streams_lock);
  fab_CUresult rc = resolve_context(p, ctx);
  fab_CUdeviceptr base = 0;
  size_t size = 0;
  if (rc != 0 || !g_cu.address_range || g_cu.address_range(&base, &size, (fab_CUdeviceptr)a) != 0) return rc;
  pthread_mutex_lock(&g_cu.streams_lock);
  int i = g_cu.known_next++ % FAB_CUDA_KNOWN;
  g_cu.known[i].base = (uintptr_t)base;
  g_cu.known[i].end = (uintptr_t)base + size;
  g_cu.known[i].ctx = *ctx;
  pthread_mutex_unlock(&g_cu.streams_lock);
  return 0;
}

void fab_cuda_forget(const void* p, size_t len) {
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&g_cu.streams_lock);
  for (int i = 0; i < FAB_CUDA_KNOWN; i++)
    if (g_cu.known[i].ctx && g_cu.known[i].base < a + len && a < g_cu.known[i].end) g_cu.known[i].ctx = NULL;
  pthread_mutex_unlock(&g_cu.streams_lock);
}

/* Pushes dev_ptr's context and finds our stream in it; 0 or the CUresult. */
static fab_CUresult enter(const void* dev_ptr, void** st, const char** what) {
  *what = "cuPointerGetAttribute(CONTEXT or DEVICE_ORDINAL)";
  if (!g_cu.usable || !g_cu.ctx_push || !g_cu.ctx_pop || !g_cu.copy_async || !g_cu.stream_create ||
      !g_cu.stream_sync)
    return -1;
  void* ctx = NULL;
  fab_CUresult rc = context_of(dev_ptr, &ctx);
  if (rc != 0) return rc;
  *what = "cuCtxPushCurrent";
  if ((rc = g_cu.ctx_push(ctx)) != 0) return rc;
  *what = "cuStreamCreate";
  *st = stream_of(ctx, &rc);
  if (*st) return 0;
  void* popped;
  g_cu.ctx_pop(&popped);
  return rc;
}

static void leave(void) {
  void* popped;
  g_cu.ctx_pop(&popped);
}

/* One copy on our stream in dev_ptr's context; wait: and waited for. */
static int copy_on_stream(void* dst, const void* src, size_t n, const void* dev_ptr, int wait, const char** what) {
  if (!n) return 0;
  void* st = NULL;
  fab_CUresult rc = enter(dev_ptr, &st, what);
  if (rc != 0) return rc;
  *what = "cuMemcpyAsync";
  rc = g_cu.copy_async((fab_CUdeviceptr)(uintptr_t)dst, (fab_CUdeviceptr)(uintptr_t)src, n, st);
  if (rc == 0 && wait) {
    *what = "cuStreamSynchronize";
    rc = g_cu.stream_sync(st);
  }
  leave();
  return rc;
}

int fab_cuda_copy_async(void* dst, const void* src, size_t n, const void* dev_ptr, const char** what) {
  return copy_on_stream(dst, src, n, dev_ptr, 0, what);
}

int fab_cuda_wait(const void* dev_ptr, const char** what) {
  void* st = NULL;
  fab_CUresult rc = enter(dev_ptr, &st, what);
  if (rc != 0) return rc;
  *what = "cuStreamSynchronize";
  rc = g_cu.stream_sync(st);
  leave();
  return rc;
}

int fab_cuda_copy(void* dst, const void* src, size_t n, const void* dev_ptr, const char** what) {
  return copy_on_stream(dst, src, n, dev_ptr, 1, what);
}

int fab_cuda_write64(void* word, uint64_t v, const char** what) {
  if (!g_cu.write_value64) {
    *what = "cuStreamWriteValue64 (missing: the value is copied instead)";
    return fab_cuda_copy(word, &v, sizeof(v), word, what);
  }
  void* st = NULL;
  fab_CUresult rc = enter(word, &st, what);
  if (rc != 0) return rc;
  *what = "cuStreamWriteValue64";
  rc = g_cu.write_value64(st, (fab_CUdeviceptr)(uintptr_t)word, v, 0);
  leave();
  return rc;
}

int fab_cuda_pin(void* host, size_t n, const void* dev_ptr) {
  if (!g_cu.host_register) return -1;
  void* st = NULL;
  const char* what;
  fab_CUresult rc = enter(dev_ptr, &st, &what);
  if (rc != 0) return rc;
  rc = g_cu.host_register(host, n, FAB_CU_MEMHOSTREGISTER_PORTABLE);
  leave();
  return rc;
}

void fab_cuda_unpin(void* host) {
  if (g_cu.usable && g_cu.host_unregister) g_cu.host_unregister(host);
}
