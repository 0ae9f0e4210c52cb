/*
 * Fixed-capacity pool of equally sized objects, allocated once when a comm is
 * created: the data path takes and returns objects without calling malloc.
 * A pool has one owner at a time (the thread driving its comm: NCCL calls the
 * data functions of one comm from one thread at a time, and its own
 * transports keep their requests the same way), so get and put take no lock.
 * Objects keep their contents while free, so a freed request still reads as
 * "not active". A pool's pages are request memory (fab_reqhead.h) for as long
 * as they are mapped: the pools hold the comms' requests.
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
} fab_pool;

/* count objects of size bytes each (rounded up to 64-byte lines), zeroed;
 * their pages become resident only when first used. Returns 0, or -1 when
 * out of memory. */
int fab_pool_init(fab_pool* p, uint32_t count, size_t size);
void fab_pool_fini(fab_pool* p);
/* Unmaps the released pool mappings kept for reuse; at library unload. */
void fab_pool_release_spares(void);

static inline void* fab_pool_get(fab_pool* p) {
  if (FAB_UNLIKELY(p->nfree == 0)) return NULL;
  return p->base + (size_t)p->free_idx[--p->nfree] * p->stride;
}

/* Returns the object at index idx (callers that keep the index avoid the
 * division of fab_pool_put). */
static inline void fab_pool_put_index(fab_pool* p, uint32_t idx) { p->free_idx[p->nfree++] = idx; }

static inline void fab_pool_put(fab_pool* p, void* obj) {
  fab_pool_put_index(p, (uint32_t)(((char*)obj - p->base) / p->stride));
}

static inline void* fab_pool_at(const fab_pool* p, uint32_t idx) { return p->base + (size_t)idx * p->stride; }

/* 1 when obj is the start of one of the pool's objects. */
int fab_pool_owns(const fab_pool* p, const void* obj);
uint32_t fab_pool_in_use(const fab_pool* p);

#endif /* FAB_POOL_H */
