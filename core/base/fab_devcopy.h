/*
 * The one place the engine moves bytes to or from GPU memory (one-sided
 * windows in GPU memory, their signals). Nothing else in the engine reads or
 * writes such memory with the CPU.
 *
 * Two backends: the CUDA driver (core/base/fab_cuda.c: a non-blocking stream of
 * our own per context, each copy waited for), or, for the CPU-only test
 * suite, emulation (FABRIC_GPU_EMULATE=1): "GPU memory" is host memory the
 * tests map without access, so any direct touch by the CPU or the provider
 * faults, and copies reach it through /proc/self/mem.
 *
 * Every copy is complete (visible to the GPU and to later copies) when the
 * call returns 0.
 */
#ifndef FAB_DEVCOPY_H
#define FAB_DEVCOPY_H

#include <stddef.h>
#include <stdint.h>

/* cuda_ok: the driver loaded (fab_cuda_init); emulate: FABRIC_GPU_EMULATE. */
void fab_devcopy_init(int cuda_ok, int emulate);
void fab_devcopy_fini(void);
/* 1 when GPU memory can be copied (a usable driver, or emulation). */
int fab_devcopy_ready(void);
/* "CUDA driver", "emulated (FABRIC_GPU_EMULATE)" or "none". */
const char* fab_devcopy_backend(void);
/* 1 when p is GPU memory (under emulation: any pointer). */
int fab_devcopy_is_device(const void* p);
/* Makes GPU memory a provider wrote by DMA visible to the GPU
 * (cuFlushGPUDirectRDMAWrites; nothing to do when emulated). 0 or non-zero
 * with *what. */
int fab_devcopy_flush(const char** what);

/* Copies n bytes from src to dst; *_dev says which side is GPU memory
 * (either, both or neither). Returns 0, or non-zero with *what naming the
 * call that failed. */
int fab_devcopy(void* dst, int dst_dev, const void* src, int src_dev, size_t n, const char** what);

/* The same, only enqueued (GPU work of the device side's context, in order);
 * fab_devcopy_wait(dev_ptr) waits for everything enqueued in dev_ptr's
 * context. Emulated: done at once. */
int fab_devcopy_async(void* dst, int dst_dev, const void* src, int src_dev, size_t n, const char** what);
int fab_devcopy_wait(const void* dev_ptr, const char** what);
/* Reads the 64-bit GPU word at word (after everything enqueued before). */
int fab_devcopy_load64(const void* word, uint64_t* v, const char** what);
/* Stores v into the GPU word at word as one 8-byte store, after everything
 * enqueued before it; not waited for. */
int fab_devcopy_store64(void* word, uint64_t v, const char** what);
/* Page-locks host memory that copies will use (dev_hint: GPU memory of the
 * context to do it in); 0 when it did. Unpin before freeing. */
int fab_devcopy_pin(void* host, size_t n, const void* dev_hint);
void fab_devcopy_unpin(void* host);
/* GPU memory in [dev, dev + len) goes away (a window deregistered): what
 * the copy layer remembers of it is dropped. */
void fab_devcopy_forget(const void* dev, size_t len);

#endif /* FAB_DEVCOPY_H */
