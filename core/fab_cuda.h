/*
 * The CUDA driver, loaded at run time with dlopen("libcuda.so.1"): the plugin
 * never links libcuda, so it loads and runs host-only where no driver exists.
 */
#ifndef FAB_CUDA_H
#define FAB_CUDA_H

#include <stddef.h>

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

/* Copies n host bytes into GPU memory at dst, in dst's own context (any
 * thread may call it). Returns 0, or the CUresult (-1: the driver lacks the
 * calls); *what names the failing call. */
int fab_cuda_copy_to_device(void* dst, const void* src, size_t n, const char** what);

/* Copies n bytes between any two of host and GPU memory (unified
 * addressing), on a non-blocking stream of our own in dev_ptr's context (the
 * GPU side of the copy), and waits for it: when this returns 0 the bytes are
 * in place, after every earlier copy made here. Returns 0, or the CUresult
 * (-1: the driver lacks the calls, or more than 16 contexts); *what names the
 * failing call. */
int fab_cuda_copy(void* dst, const void* src, size_t n, const void* dev_ptr, const char** what);

#endif /* FAB_CUDA_H */
