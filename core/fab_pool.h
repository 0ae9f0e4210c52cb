/*
 * Fixed-capacity pool of equally sized objects, allocated once when a comm is
 * created: the data path takes and returns objects without calling malloc.
 * A short spin lock makes get/put safe from several threads; objects keep
 * their contents while free, so a freed request still reads as "not active".
 */
#ifndef FAB_POOL_H
#define FAB_POOL_H

#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fab_util.h"

typedef struct fab_pool {
  char* base;
  size_t stride;
  size_t bytes;    /* mapped length */
  _Atomic uint32_t used; /* objects [0, used) have been handed out at least once */
  uint32_t count;
  uint32_t nfree;
  uint32_t* free_idx; /* stack of free indices */
  fab_spin lock;
} fab_pool;

/* count objects of size bytes each (rounded up to 64-byte lines), zeroed;
 * their pages become resident only when first used. Returns 0, or -1 when
 * out of memory. */
int fab_pool_init(fab_pool* p, uint32_t count, size_t size);
void fab_pool_fini(fab_pool* p);
/* Unmaps the released pool mappings kept for reuse; at library unload. */
void fab_pool_release_spares(void);

static inline void* fab_pool_get(fab_pool* p) {
  void* obj = NULL;
  fab_spin_lock(&p->lock);
  if (p->nfree) obj = p->base + (size_t)p->free_idx[--p->nfree] * p->stride;
  fab_spin_unlock(&p->lock);
  return obj;
}

/* Returns the object at index idx (callers that keep the index avoid the
 * division of fab_pool_put). */
static inline void fab_pool_put_index(fab_pool* p, uint32_t idx) {
  fab_spin_lock(&p->lock);
  p->free_idx[p->nfree++] = idx;
  fab_spin_unlock(&p->lock);
}

static inline void fab_pool_put(fab_pool* p, void* obj) {
  uint32_t idx = (uint32_t)(((char*)obj - p->base) / p->stride);
  fab_spin_lock(&p->lock);
  p->free_idx[p->nfree++] = idx;
  fab_spin_unlock(&p->lock);
}

static inline void* fab_pool_at(const fab_pool* p, uint32_t idx) { return p->base + (size_t)idx * p->stride; }

/* 1 when obj is the start of one of the pool's objects. */
int fab_pool_owns(const fab_pool* p, const void* obj);
uint32_t fab_pool_in_use(const fab_pool* p);

#endif /* FAB_POOL_H */
