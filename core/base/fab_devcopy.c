#include "fab_devcopy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_cuda.h"

enum { BACKEND_NONE = 0, BACKEND_CUDA = 1, BACKEND_EMULATED = 2, BOUNCE = 1 << 20 };

static struct {
  int backend;
  int memfd; /* /proc/self/mem, emulation only */
} g_dc = {.memfd = -1};

void fab_devcopy_init(int cuda_ok, int emulate) {
  fab_devcopy_fini();
  if (emulate) {
    g_dc.memfd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    if (g_dc.memfd >= 0) g_dc.backend = BACKEND_EMULATED;
    return;
  }
  g_dc.backend = cuda_ok ? BACKEND_CUDA : BACKEND_NONE;
}

void fab_devcopy_fini(void) {
  if (g_dc.memfd >= 0) close(g_dc.memfd);
  g_dc.memfd = -1;
  g_dc.backend = BACKEND_NONE;
}

int fab_devcopy_ready(void) { return g_dc.backend != BACKEND_NONE; }

const char* fab_devcopy_backend(void) {
  return g_dc.backend == BACKEND_CUDA ? "CUDA driver" : g_dc.backend == BACKEND_EMULATED ? "emulated (FABRIC_GPU_EMULATE)" : "none";
}

int fab_devcopy_is_device(const void* p) {
  if (g_dc.backend == BACKEND_EMULATED) return p != NULL;
  return g_dc.backend == BACKEND_CUDA && fab_cuda_ptr_device(p) >= 0;
}

int fab_devcopy_flush(const char** what) { return g_dc.backend == BACKEND_CUDA ? fab_cuda_flush(what) : 0; }

/* Emulation: "device" addresses are reached only through /proc/self/mem. */
static int mem_io(int write, void* host, const void* dev, size_t n) {
  size_t done = 0;
  while (done < n) {
    off_t at = (off_t)(uintptr_t)((const char*)dev + done);
    ssize_t k = write ? pwrite(g_dc.memfd, (char*)host + done, n - done, at)
                      : pread(g_dc.memfd, (char*)host + done, n - done, at);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    done += (size_t)k;
  }
  return 0;
}

static int emulated_copy(void* dst, int dst_dev, const void* src, int src_dev, size_t n) {
  if (!dst_dev && !src_dev) {
    memmove(dst, src, n);
    return 0;
  }
  if (!dst_dev) return mem_io(0, dst, src, n);
  if (!src_dev) return mem_io(1, (void*)src, dst, n);
  char* bounce = malloc(n < BOUNCE ? n : BOUNCE); /* device to device, through host memory */
  if (!bounce) return -1;
  int rc = 0;
  for (size_t at = 0; at < n && rc == 0;) {
    size_t k = n - at < BOUNCE ? n - at : BOUNCE;
    /* overlapping ranges: copy from the end when dst lies after src */
    size_t pos = (uintptr_t)dst > (uintptr_t)src ? n - at - k : at;
    rc = mem_io(0, bounce, (const char*)src + pos, k);
    if (rc == 0) rc = mem_io(1, bounce, (char*)dst + pos, k);
    at += k;
  }
  free(bounce);
  return rc;
}

int fab_devcopy(void* dst, int dst_dev, const void* src, int src_dev, size_t n, const char** what) {
  *what = "a copy to or from GPU memory";
  if (!n) return 0;
  if (g_dc.backend == BACKEND_EMULATED) {
    *what = "pread/pwrite on /proc/self/mem";
    return emulated_copy(dst, dst_dev, src, src_dev, n);
  }
  if (!dst_dev && !src_dev) {
    memmove(dst, src, n);
    return 0;
  }
  if (g_dc.backend != BACKEND_CUDA) return -1;
  return fab_cuda_copy(dst, src, n, dst_dev ? dst : src, what);
}

int fab_devcopy_async(void* dst, int dst_dev, const void* src, int src_dev, size_t n, const char** what) {
  if (g_dc.backend != BACKEND_CUDA || (!dst_dev && !src_dev)) return fab_devcopy(dst, dst_dev, src, src_dev, n, what);
  return fab_cuda_copy_async(dst, src, n, dst_dev ? dst : src, what);
}

int fab_devcopy_wait(const void* dev_ptr, const char** what) {
  return g_dc.backend == BACKEND_CUDA ? fab_cuda_wait(dev_ptr, what) : 0;
}

int fab_devcopy_load64(const void* word, uint64_t* v, const char** what) {
  return fab_devcopy(v, 0, word, 1, sizeof(*v), what);
}

int fab_devcopy_store64(void* word, uint64_t v, const char** what) {
  if (g_dc.backend == BACKEND_CUDA) return fab_cuda_write64(word, v, what);
  return fab_devcopy(word, 1, &v, 0, sizeof(v), what);
}

int fab_devcopy_pin(void* host, size_t n, const void* dev_hint) {
  return g_dc.backend == BACKEND_CUDA ? fab_cuda_pin(host, n, dev_hint) : -1;
}

void fab_devcopy_forget(const void* dev, size_t len) {
  if (g_dc.backend == BACKEND_CUDA) fab_cuda_forget(dev, len);
}

void fab_devcopy_unpin(void* host) {
  if (g_dc.backend == BACKEND_CUDA) fab_cuda_unpin(host);
}
