/* Request memory and the check of a request pointer (fab_reqhead.h). */
#include "fab_reqhead.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Request memory is a set of 4 KiB pages, kept as a bitmap in two levels:
 * a top table of FAB_REQMEM_TOP leaves, each the bits of 2^LEAF_BITS pages
 * (4 GiB of address space, 128 KiB of bits). A leaf is made the first time
 * a page in its span is marked and kept until unload, so a check is two
 * loads and never takes a lock. Addresses above 2^48 are never request
 * memory; should one be mapped, the check is off (see reqmem_unchecked). */
enum { PAGE_SHIFT = FAB_REQMEM_PAGE_SHIFT, LEAF_BITS = FAB_REQMEM_LEAF_BITS };
#define LEAF_WORDS ((1u << LEAF_BITS) / 64)

_Atomic(_Atomic uint64_t*) fab_reqmem_top[FAB_REQMEM_TOP];
/* Set when request memory could not be marked (a mapping above 2^48, or no
 * memory for a leaf): the pointer check then only asks for alignment. */
static atomic_int reqmem_unchecked;

static _Atomic uint64_t* leaf_of(uint64_t page, int make) {
  uint64_t top = page >> LEAF_BITS;
  if (top >= FAB_REQMEM_TOP) return NULL;
  _Atomic uint64_t* leaf = atomic_load_explicit(&fab_reqmem_top[top], memory_order_acquire);
  if (leaf || !make) return leaf;
  _Atomic uint64_t* fresh = calloc(LEAF_WORDS, sizeof(uint64_t));
  if (!fresh) return NULL;
  if (!atomic_compare_exchange_strong_explicit(&fab_reqmem_top[top], &leaf, fresh, memory_order_acq_rel,
                                               memory_order_acquire)) {
    free((void*)fresh); /* another thread made it first: leaf is theirs */
    return leaf;
  }
  return fresh;
}

void fab_reqmem_mark(void* p, size_t bytes, int on) {
  uint64_t first = (uint64_t)(uintptr_t)p >> PAGE_SHIFT;
  uint64_t last = ((uint64_t)(uintptr_t)p + bytes - 1) >> PAGE_SHIFT;
  for (uint64_t page = first; bytes && page <= last; page++) {
    _Atomic uint64_t* leaf = leaf_of(page, on);
    if (!leaf) {
      if (on) atomic_store(&reqmem_unchecked, 1);
      continue;
    }
    uint64_t bit = 1ull << (page & 63);
    _Atomic uint64_t* word = &leaf[(page & ((1u << LEAF_BITS) - 1)) >> 6];
    if (on)
      atomic_fetch_or_explicit(word, bit, memory_order_release);
    else
      atomic_fetch_and_explicit(word, ~bit, memory_order_release);
  }
}

void fab_reqmem_release(void) {
  for (uint32_t i = 0; i < FAB_REQMEM_TOP; i++) free((void*)atomic_exchange(&fab_reqmem_top[i], NULL));
}

static size_t whole_pages(size_t bytes) {
  size_t page = (size_t)1 << PAGE_SHIFT;
  return (bytes + page - 1) & ~(page - 1);
}

void* fab_reqmem_alloc(size_t bytes) {
  size_t len = whole_pages(bytes);
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  fab_reqmem_mark(p, len, 1);
  return p;
}

void fab_reqmem_free(void* p, size_t bytes) {
  if (!p) return;
  size_t len = whole_pages(bytes);
  fab_reqmem_mark(p, len, 0);
  munmap(p, len);
}

static int page_held(uint64_t page) {
  if (FAB_LIKELY(fab_reqmem_page_marked(page))) return 1;
  return atomic_load_explicit(&reqmem_unchecked, memory_order_relaxed) && page > 0;
}

int fab_reqmem_holds(const void* p) {
  uint64_t first = (uint64_t)(uintptr_t)p >> PAGE_SHIFT, last = ((uint64_t)(uintptr_t)p + 15) >> PAGE_SHIFT;
  return page_held(first) && (first == last || page_held(last));
}

static const char* api_name(int api) { return api == FAB_REQ_API_RMA ? "the RMA table's" : "the net table's"; }

fab_req_head* fab_req_head_check_slow(void* p, int api, const char* fn) {
  if (FAB_UNLIKELY(!p || ((uintptr_t)p & 7) || !fab_reqmem_holds(p))) {
    FAB_WARN("%s: %p is not a request (NULL, or never returned by this plugin): pass the request the call that "
             "started the operation returned", fn, p);
    return NULL;
  }
  fab_req_head* h = p;
  if (FAB_UNLIKELY(h->magic != FAB_REQ_MAGIC || !h->kind)) {
    FAB_WARN("%s: %p is not a request of this plugin (it points into request memory, but not at a request)", fn, p);
    return NULL;
  }
  if (FAB_UNLIKELY(h->state != FAB_REQ_ACTIVE)) {
    FAB_WARN("%s: %p is not an active %s request: it %s; test a request until done is set, then not again", fn, p,
             h->kind->name,
             h->state == FAB_REQ_ORPHAN ? "was reported failed already" : "completed already (or was never handed out)");
    return NULL;
  }
  if (FAB_UNLIKELY(h->kind->api != api)) {
    FAB_WARN("%s: %p is a request of %s (%s); test it with %s test", fn, p, h->kind->name, api_name(h->kind->api),
             api_name(h->kind->api));
    return NULL;
  }
  return h;
}

void fab_req_warn(fab_req_head* h, const fab_req_steps* s, fab_result rc) {
  char buf[512];
  buf[0] = 0;
  if (s->explain(h, rc, buf, sizeof(buf))) FAB_WARN("%s", buf);
}

fab_result fab_req_refuse_closed(const fab_req_head* h) {
  FAB_WARN("test: request %p belongs to a comm that was closed; a closed comm's requests cannot be tested",
           (const void*)h);
  return FAB_ERR_INTERNAL;
}
