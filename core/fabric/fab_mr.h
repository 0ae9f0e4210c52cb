/*
 * Memory registration. Every regMr returns its own handle (an objtab handle to
 * a fab_mr); the libfabric registration behind it comes from a per-domain
 * cache keyed by page-aligned range, so a sub-range of a live registration
 * costs a lookup and a reference (this makes regIsGlobal=1 honest).
 *
 * fi_mr_reg is called when the provider or the transport needs it: FI_MR_LOCAL
 * (every buffer needs a descriptor), device memory (FI_HMEM), or a transport
 * whose peers access our memory (dev->reg_host). Each registration asks for
 * the transport's access flags and keeps its remote key. Otherwise the
 * handle still exists, validates, and carries a NULL descriptor.
 */
#ifndef FAB_MR_H
#define FAB_MR_H

#include "fab_engine.h"

typedef struct fab_mr_entry {
  uintptr_t base;
  size_t len;
  int type; /* FAB_PTR_HOST / CUDA */
  int cuda_dev;
  int refs;
  int cached; /* 0: private registration (dma-buf), not in the cache */
  struct fid_mr* mr;
  void* desc;
  uint64_t key;    /* remote key (FI_KEY_NOTAVAIL without a registration) */
  uint64_t access; /* access flags granted */
  const fab_endpoint* owner; /* FI_MR_ENDPOINT: the endpoint it is bound to (NULL: the whole domain's) */
} fab_mr_entry;

typedef struct fab_mr {
  uintptr_t addr;
  size_t len;
  int type;
  int cuda_dev;
  void* desc; /* what goes to libfabric; NULL when the provider needs none */
  uint64_t key; /* remote key; FI_KEY_NOTAVAIL when not registered */
  _Atomic int refs;  /* the handle, plus each posted receive announced with it (rdma): the last frees it */
  _Atomic int gone;  /* deregistered while receives still held it: those receives fail */
  fab_mr_entry* entry;
  fab_device* dev; /* physical device whose domain holds entry */
  const fab_endpoint* owner; /* FI_MR_ENDPOINT: the one endpoint it serves (the comm's); NULL: any */
  void* handle;
  fab_list node; /* in the cache's handle list */
  /* offered to a connection's peer (Neuron's one-sided calls,
   * core/onesided/fab_p2p_rma.c): the comm's handle and the offer's id there; NULL
   * when not offered */
  void* offered_on;
  uint64_t offer_id;
} fab_mr;

/* The registration backend, replaceable so unit tests can count calls. */
typedef int (*fab_mr_reg_fn)(void* arg, fab_mr_entry* e);
typedef void (*fab_mr_close_fn)(void* arg, fab_mr_entry* e);

struct fab_mr_cache {
  pthread_mutex_t lock;
  fab_mr_entry** v; /* sorted by base */
  size_t n, cap;
  size_t max_len; /* longest entry ever: bounds the backward scan */
  uint64_t hits, misses;
  fab_list handles; /* every live fab_mr of the domain */
};

fab_mr_cache* fab_mr_cache_create(void);
/* Closes whatever is left (close may be NULL) and frees the cache. */
void fab_mr_cache_destroy(fab_mr_cache* c, fab_mr_close_fn close, void* arg);
/* A registration covering [addr, addr+len) of this type for owner (NULL:
 * the domain's; else one endpoint's, FI_MR_ENDPOINT), new or shared.
 * Returns NULL with *err (negative fi errno) set when registering failed. */
fab_mr_entry* fab_mr_cache_acquire(fab_mr_cache* c, uintptr_t addr, size_t len, int type, int cuda_dev,
                                   const fab_endpoint* owner, fab_mr_reg_fn reg, void* arg, int* err);
void fab_mr_cache_release(fab_mr_cache* c, fab_mr_entry* e, fab_mr_close_fn close, void* arg);

/* The API behind fab_reg_mr / fab_reg_mr_dmabuf / fab_dereg_mr, on the
 * domain of comm's device. */
fab_result fab_mr_register(fab_comm* c, void* data, size_t size, int type, uint64_t offset, int fd,
                           void** mhandle, const char* fn);
/* The same without a comm: named is the device the runtime named (it may be
 * virtual), ep the endpoint that will use the registration (its physical
 * device's domain registers; FI_MR_ENDPOINT binds it to ep). */
fab_result fab_mr_register_on(fab_device* named, fab_endpoint* ep, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle, const char* fn);
fab_result fab_mr_deregister(void* mhandle);
/* The same without its WARN for a registration that still backs operations:
 * *held says how many (0: none), and fab_mr_warn_held says it, once for a
 * handle made of several (the rails floor's). */
fab_result fab_mr_deregister_held(void* mhandle, int* held);
void fab_mr_warn_held(const void* mhandle, int held);

/* A posted receive announced to a peer, or a send waiting for its receive
 * (rdma transport), holds m (refs) so that it stays valid for their
 * bookkeeping after a deregistration, which marks it gone; fab_mr_unhold
 * drops the hold. */
static inline void fab_mr_hold(fab_mr* m) { atomic_fetch_add_explicit(&m->refs, 1, memory_order_acq_rel); }
void fab_mr_unhold(fab_mr* m);

/* Moves with every deregistration (after the handle is dead): a comm's
 * cached last handle is only trusted while it has not moved. */
extern _Atomic uint64_t fab_mr_generation;

/* Data path: resolves mhandle for [data, data+size) on comm c. NULL mhandle
 * is accepted when the provider needs no descriptor for host memory. WARNs. */
__attribute__((cold)) fab_result fab_mr_resolve_fail(fab_comm* c, void* mhandle, const void* data, size_t size,
                                                     const char* fn);
static inline __attribute__((always_inline)) fab_result fab_mr_resolve(fab_comm* c, void* mhandle, const void* data, size_t size, const char* fn,
                                        fab_mr** out) {
  if (!mhandle) {
    *out = NULL;
    return FAB_LIKELY(!c->mr_local) ? FAB_OK : fab_mr_resolve_fail(c, mhandle, data, size, fn);
  }
  uint64_t gen = atomic_load_explicit(&fab_mr_generation, memory_order_acquire);
  fab_mr* m = c->mr_last;
  if (FAB_UNLIKELY(mhandle != c->mr_last_handle || gen != c->mr_last_gen)) {
    m = fab_obj_get(mhandle, FAB_OBJ_MR);
    if (FAB_UNLIKELY(!m || (m->desc && m->dev != c->ep->dev) || (m->owner && m->owner != c->ep)))
      return *out = NULL, fab_mr_resolve_fail(c, mhandle, data, size, fn);
    c->mr_last_handle = mhandle;
    c->mr_last = m;
    c->mr_last_gen = gen;
  }
  uintptr_t a = (uintptr_t)data;
  if (FAB_UNLIKELY(a < m->addr || size > m->len || a - m->addr > m->len - size))
    return *out = NULL, fab_mr_resolve_fail(c, mhandle, data, size, fn);
  *out = m;
  return FAB_OK;
}

/* The address a peer uses to reach addr inside m's registration: the
 * virtual address, or its offset in the registration (no FI_MR_VIRT_ADDR). */
static inline uint64_t fab_mr_remote_addr(const fab_mr* m, const void* addr) {
  return m->dev->virt_addr ? (uint64_t)(uintptr_t)addr : (uint64_t)((uintptr_t)addr - m->entry->base);
}

/* iflush for any transport: nothing for host memory (the receive's
 * completion already made it visible); cuFlushGPUDirectRDMAWrites when a
 * buffer is CUDA memory. Completes before returning (*request = NULL). */
fab_result fab_mr_iflush(fab_comm* c, int n, void** data, const int* sizes, struct fab_mr** mrs, void** request);

/* Domain teardown: drops every handle still registered on dom's device. */
void fab_mr_domain_close(fab_device* dev);

#endif /* FAB_MR_H */
