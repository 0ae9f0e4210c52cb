/*
 * netbench: where the buffers live. Host memory (mmap), or GPU memory from
 * the CUDA driver (--mem cuda, or --mem dmabuf: the same memory registered
 * through a dma-buf fd; libcuda is dlopen'ed, so netbench still builds and
 * runs where there is none). Both transports get the same buffers; the data
 * checks reach GPU memory through copies to and from the host.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "nb.h"

int nb_mem_kind = NB_MEM_HOST;

typedef int cu_result;
typedef unsigned long long cu_ptr;
static struct {
  cu_result (*alloc)(cu_ptr*, size_t);
  cu_result (*free)(cu_ptr);
  cu_result (*htod)(cu_ptr, const void*, size_t);
  cu_result (*dtoh)(void*, cu_ptr, size_t);
  cu_result (*memset8)(cu_ptr, unsigned char, size_t);
  cu_result (*set_attr)(const void*, int, cu_ptr);
  cu_result (*range_handle)(void*, cu_ptr, size_t, int, unsigned long long);
} cu;

/* dma-buf ranges must be page aligned: GPU buffers are whole 2 MiB pages. */
static size_t gpu_len(size_t size) { return ((size ? size : 8) + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1); }

static void* need(void* lib, const char* name) {
  void* p = dlsym(lib, name);
  if (!p) nb_die("--mem cuda: the CUDA driver lacks %s", name);
  return p;
}

#define CU(call, what)                                            \
  do {                                                            \
    cu_result rc_ = (call);                                       \
    if (rc_ != 0) nb_die("--mem cuda: %s failed: CUresult %d", what, rc_); \
  } while (0)

void nb_mem_open(int kind) {
  nb_mem_kind = kind;
  if (kind == NB_MEM_HOST) return;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) nb_die("--mem cuda: cannot load the CUDA driver: %s", dlerror());
  cu_result (*init)(unsigned) = (cu_result(*)(unsigned))need(lib, "cuInit");
  cu_result (*device_get)(int*, int) = (cu_result(*)(int*, int))need(lib, "cuDeviceGet");
  cu_result (*retain)(void**, int) = (cu_result(*)(void**, int))need(lib, "cuDevicePrimaryCtxRetain");
  cu_result (*set_current)(void*) = (cu_result(*)(void*))need(lib, "cuCtxSetCurrent");
  *(void**)&cu.alloc = need(lib, "cuMemAlloc_v2");
  *(void**)&cu.free = need(lib, "cuMemFree_v2");
  *(void**)&cu.htod = need(lib, "cuMemcpyHtoD_v2");
  *(void**)&cu.dtoh = need(lib, "cuMemcpyDtoH_v2");
  *(void**)&cu.memset8 = need(lib, "cuMemsetD8_v2");
  *(void**)&cu.set_attr = need(lib, "cuPointerSetAttribute");
  if (kind == NB_MEM_DMABUF) *(void**)&cu.range_handle = need(lib, "cuMemGetHandleForAddressRange");
  int dev;
  void* ctx;
  CU(init(0), "cuInit");
  CU(device_get(&dev, 0), "cuDeviceGet");
  CU(retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  CU(set_current(ctx), "cuCtxSetCurrent");
}

void* nb_mem_alloc(size_t size) {
  size_t len = size ? size : 8;
  if (nb_mem_kind != NB_MEM_HOST) {
    cu_ptr p;
    len = gpu_len(size);
    CU(cu.alloc(&p, len), "cuMemAlloc");
    int one = 1; /* as NCCL sets on GPUDirect buffers */
    CU(cu.set_attr(&one, 6 /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS */, p), "cuPointerSetAttribute");
    CU(cu.memset8(p, 0x5a, len), "cuMemsetD8");
    return (void*)(uintptr_t)p;
  }
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) nb_die("mmap(%zu): %s", len, strerror(errno));
  memset(p, 0x5a, len); /* fault the pages in, outside any timing */
  return p;
}

void nb_mem_free(void* p, size_t size) {
  if (nb_mem_kind != NB_MEM_HOST) CU(cu.free((cu_ptr)(uintptr_t)p), "cuMemFree");
  else munmap(p, size ? size : 8);
}

void nb_mem_put(void* dst, const void* src, size_t n) {
  if (!n) return;
  if (nb_mem_kind != NB_MEM_HOST) CU(cu.htod((cu_ptr)(uintptr_t)dst, src, n), "cuMemcpyHtoD");
  else memcpy(dst, src, n);
}

void nb_mem_get(void* dst, const void* src, size_t n) {
  if (!n) return;
  if (nb_mem_kind != NB_MEM_HOST) CU(cu.dtoh(dst, (cu_ptr)(uintptr_t)src, n), "cuMemcpyDtoH");
  else memcpy(dst, src, n);
}

void nb_mem_set(void* dst, int byte, size_t n) {
  if (!n) return;
  if (nb_mem_kind != NB_MEM_HOST) CU(cu.memset8((cu_ptr)(uintptr_t)dst, (unsigned char)byte, n), "cuMemsetD8");
  else memset(dst, byte, n);
}

int nb_mem_dmabuf_fd(void* p, size_t size) {
  int fd = -1;
  CU(cu.range_handle(&fd, (cu_ptr)(uintptr_t)p, gpu_len(size), 1 /* CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD */, 0),
     "cuMemGetHandleForAddressRange");
  return fd;
}
