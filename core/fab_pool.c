#include "fab_pool.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int fab_pool_init(fab_pool* p, uint32_t count, size_t size) {
  memset(p, 0, sizeof(*p));
  fab_spin_init(&p->lock);
  if (!count || !size) return -1;
  p->stride = (size + 63) & ~(size_t)63;
  /* Anonymous pages: zero and not resident until an object on them is first
   * handed out. Objects go out lowest index first, so a comm that never has
   * more than k requests in flight only ever touches its first k objects. */
  p->bytes = (p->stride * count + 4095) & ~(size_t)4095;
  void* base = mmap(NULL, p->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return -1;
  p->base = base;
  p->free_idx = malloc(sizeof(uint32_t) * count);
  if (!p->free_idx) {
    munmap(p->base, p->bytes);
    p->base = NULL;
    return -1;
  }
  /* Hand out low indices first: the hot set stays in few cache lines. */
  for (uint32_t i = 0; i < count; i++) p->free_idx[i] = count - 1 - i;
  p->count = count;
  p->nfree = count;
  return 0;
}

void fab_pool_fini(fab_pool* p) {
  if (p->base) munmap(p->base, p->bytes);
  free(p->free_idx);
  p->base = NULL;
  p->free_idx = NULL;
  p->count = p->nfree = 0;
}

int fab_pool_owns(const fab_pool* p, const void* obj) {
  const char* c = obj;
  if (!p->base || c < p->base || c >= p->base + p->stride * p->count) return 0;
  return (size_t)(c - p->base) % p->stride == 0;
}

uint32_t fab_pool_in_use(const fab_pool* p) { return p->count - p->nfree; }
