#include "fab_pool.h"

#include "fab_reqhead.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Released pool mappings are kept (emptied with MADV_DONTNEED: no resident
 * memory, zero on next touch) and reused, never unmapped. A request pointer
 * the runtime keeps past closing its comm then still reads as a zeroed, or
 * reused, object that fab_test refuses with a WARN instead of faulting. */
typedef struct spare_mapping {
  char* base;
  size_t bytes;
} spare_mapping;

static pthread_mutex_t spares_lock = PTHREAD_MUTEX_INITIALIZER;
static spare_mapping* spares;
static size_t nspares, spares_cap;

static char* mapping_get(size_t bytes) {
  char* base = NULL;
  pthread_mutex_lock(&spares_lock);
  for (size_t i = 0; i < nspares; i++) {
    if (spares[i].bytes != bytes) continue;
    base = spares[i].base;
    spares[i] = spares[--nspares];
    break;
  }
  pthread_mutex_unlock(&spares_lock);
  if (base) return base;
  void* m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  fab_reqmem_mark(m, bytes, 1); /* a pool's objects are requests (fab_reqhead.h), until unmapped */
  return m;
}

static void mapping_put(char* base, size_t bytes) {
  madvise(base, bytes, MADV_DONTNEED);
  pthread_mutex_lock(&spares_lock);
  if (nspares == spares_cap) {
    size_t cap = spares_cap ? 2 * spares_cap : 64;
    spare_mapping* more = realloc(spares, cap * sizeof(*more));
    if (!more) {
      pthread_mutex_unlock(&spares_lock);
      fab_reqmem_mark(base, bytes, 0);
      munmap(base, bytes); /* out of memory: give it back after all */
      return;
    }
    spares = more;
    spares_cap = cap;
  }
  spares[nspares++] = (spare_mapping){base, bytes};
  pthread_mutex_unlock(&spares_lock);
}

void fab_pool_release_spares(void) {
  pthread_mutex_lock(&spares_lock);
  for (size_t i = 0; i < nspares; i++) {
    fab_reqmem_mark(spares[i].base, spares[i].bytes, 0);
    munmap(spares[i].base, spares[i].bytes);
  }
  free(spares);
  spares = NULL;
  nspares = spares_cap = 0;
  pthread_mutex_unlock(&spares_lock);
}

int fab_pool_init(fab_pool* p, uint32_t count, size_t size) {
  memset(p, 0, sizeof(*p));
  if (!count || !size) return -1;
  p->stride = (size + 63) & ~(size_t)63;
  /* Anonymous pages: zero and not resident until an object on them is first
   * handed out. Objects go out lowest index first, so a comm that never has
   * more than k requests in flight only ever touches its first k objects. */
  p->bytes = (p->stride * count + 4095) & ~(size_t)4095;
  p->base = mapping_get(p->bytes);
  if (!p->base) return -1;
  p->free_idx = malloc(sizeof(uint32_t) * count);
  if (!p->free_idx) {
    mapping_put(p->base, p->bytes);
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
  if (p->base) mapping_put(p->base, p->bytes);
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
