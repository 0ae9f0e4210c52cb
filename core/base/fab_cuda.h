/*
 * The CUDA driver, loaded at run time with dlopen("libcuda.so.1"): the plugin
 * never links libcuda, so it loads and runs host-only where no driver exists.
 */
#ifndef FAB_CUDA_H
#define FAB_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* Loads the driver, cuInit(0), counts devices. Returns 1 when CUDA is usable
 * (at least one device and cuFlushGPUDirectRDMAWrites), else 0. Never WARNs:
 * a host without GPUs is normal; the reason goes to INFO. */
int fab_cuda_init(void);
void fab_cuda_fini(void);
/* Device ordinal of a device pointer; -1 when not CUDA memory or unknown. */
int fab_cuda_ptr_device(const void* ptr);
/* Makes prior GPUDirect RDMA writes visible to the GPU (the iflush). Returns
 * 0 or the CUresult; *what names the failing call. */
int fab_cuda_flush(const char** what);

/* Copies n host bytes into GPU memory at dst (fab_cuda_copy: dst's context,
 * or its device's primary one for cuMemMap memory; our own non-blocking
 * stream; any thread may call it). Returns 0, or the CUresult (-1: the driver
 * lacks the calls); *what names the failing call. */
int fab_cuda_copy_to_device(void* dst, const void* src, size_t n, const char** what);

/* Copies n bytes between any two of host and GPU memory (unified
 * addressing), on a non-blocking stream of our own in dev_ptr's context (the
 * GPU side of the copy), and waits for it: when this returns 0 the bytes are
 * in place, after every earlier copy made here. Returns 0, or the CUresult
 * (-1: the driver lacks the calls, or more than 16 contexts); *what names the
 * failing call. */
int fab_cuda_copy(void* dst, const void* src, size_t n, const void* dev_ptr, const char** what);
/* The same, only enqueued on that stream; fab_cuda_wait(dev_ptr) waits for
 * everything enqueued in dev_ptr's context. */
int fab_cuda_copy_async(void* dst, const void* src, size_t n, const void* dev_ptr, const char** what);
int fab_cuda_wait(const void* dev_ptr, const char** what);
/* Enqueues a store of v into the GPU word at word (cuStreamWriteValue64: one
 * 8-byte store, after everything enqueued before it on our stream); not
 * waited for. */
int fab_cuda_write64(void* word, uint64_t v, const char** what);
/* Page-locks host memory for fast copies (cuMemHostRegister, portable), in
 * dev_ptr's context; 0 when it did. fab_cuda_unpin undoes it. */
int fab_cuda_pin(void* host, size_t n, const void* dev_ptr);
/* Forgets the context remembered for GPU memory in [p, p + len) (its
 * allocation goes away; the address may come back in another). */
void fab_cuda_forget(const void* p, size_t len);
void fab_cuda_unpin(void* host);

#endif /* FAB_CUDA_H */
