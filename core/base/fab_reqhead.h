/*
 * The header every request handed to the runtime starts with, whatever made
 * it: a send or receive of one comm (fab_req), a Neuron iwrite/iread
 * (fab_osreq), a grouped receive or a split send over several rails, an RMA
 * put, get or flush. The API's test reads the header, checks it, and makes
 * one indirect call to its kind's test.
 *
 * A pointer the runtime passes is checked before it is read: every request
 * lives in request memory (whole pages, fab_reqmem_*), and a pointer outside
 * it, misaligned, or not at a header of a live request is refused with a
 * WARN instead of faulting.
 *
 * The sequence of a test (progress, liveness, give up with one WARN, report,
 * release) is written once, in fab_req_run; each kind fills in its steps.
 */
#ifndef FAB_REQHEAD_H
#define FAB_REQHEAD_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fab_core.h"
#include "fab_log.h"
#include "fab_util.h"

#define FAB_REQ_MAGIC 0x51455246u /* "FREQ": every kind */

/* FREE: in its pool. ACTIVE: handed to the runtime. ORPHAN: reported failed
 * while an operation of it is still in the provider's hands: kept out of its
 * pool until its owner is freed. */
enum { FAB_REQ_FREE = 0, FAB_REQ_ACTIVE = 1, FAB_REQ_ORPHAN = 2 };

/* Which API call tests a kind: the net table's test, or the RMA table's. */
enum { FAB_REQ_API_NET = 0, FAB_REQ_API_RMA = 1 };

typedef struct fab_req_head fab_req_head;

typedef struct fab_req_kind {
  const char* name; /* what the runtime called to get it: "isend/irecv", "iwrite/iread", ... */
  int api;          /* FAB_REQ_API_* */
  /* The test (fab_req_run with the kind's steps). The header was checked:
   * h is a live request of this kind. */
  fab_result (*test)(fab_req_head* h, int* done, int* sizes);
} fab_req_kind;

struct fab_req_head {
  uint32_t magic; /* FAB_REQ_MAGIC from its first use on; kept while free */
  uint8_t state;  /* FAB_REQ_* */
  uint8_t spare[3];
  const fab_req_kind* kind;
};

/* --- request memory --------------------------------------------------------------- */

/* bytes of zeroed request memory (whole pages), or NULL when out of memory. */
void* fab_reqmem_alloc(size_t bytes);
void fab_reqmem_free(void* p, size_t bytes);
/* Marks [p, p + bytes) (whole pages, page-aligned p) as request memory, or
 * not; for memory its owner maps itself (request pools). */
void fab_reqmem_mark(void* p, size_t bytes, int on);

/* The bitmap of request pages (fab_reqhead.c): a top table of leaves, each
 * the bits of 2^FAB_REQMEM_LEAF_BITS pages, made on first use and kept. */
enum { FAB_REQMEM_PAGE_SHIFT = 12, FAB_REQMEM_LEAF_BITS = 20 };
#define FAB_REQMEM_TOP (1u << (48 - FAB_REQMEM_PAGE_SHIFT - FAB_REQMEM_LEAF_BITS))
extern _Atomic(_Atomic uint64_t*) fab_reqmem_top[FAB_REQMEM_TOP];

/* 1 when page (an address >> FAB_REQMEM_PAGE_SHIFT) is request memory, in two
 * loads; 0 also when it may be but could not be marked (fab_reqmem_holds then
 * decides). */
static inline int fab_reqmem_page_marked(uint64_t page) {
  uint64_t top = page >> FAB_REQMEM_LEAF_BITS;
  if (FAB_UNLIKELY(top >= FAB_REQMEM_TOP)) return 0;
  _Atomic uint64_t* leaf = atomic_load_explicit(&fab_reqmem_top[top], memory_order_acquire);
  if (FAB_UNLIKELY(!leaf)) return 0;
  uint64_t word = atomic_load_explicit(&leaf[(page & ((1u << FAB_REQMEM_LEAF_BITS) - 1)) >> 6], memory_order_acquire);
  return (int)((word >> (page & 63)) & 1);
}

/* Frees the bitmap, at library unload (a library that is unloaded takes the
 * table that holds the leaves with it). */
void fab_reqmem_release(void);

/* 1 when the 16 bytes at p (a header) lie in request memory; nothing is read
 * but the bitmap. */
int fab_reqmem_holds(const void* p);

/* fab_req_head_check's full check: also a header that crosses a page, and
 * the WARN that says why p is refused. */
__attribute__((cold)) fab_req_head* fab_req_head_check_slow(void* p, int api, const char* fn);

/* The live request at p, or NULL (after one WARN naming fn) when p is NULL,
 * outside request memory, misaligned, not at a request, not handed out, or
 * of a kind the other API call tests. Inline: the runtime calls test in a
 * loop. */
static inline fab_req_head* fab_req_head_check(void* p, int api, const char* fn) {
  uintptr_t a = (uintptr_t)p;
  /* a header of 16 bytes at an 8-aligned address in one page (the rare
   * header that crosses a page takes the slow path) */
  if (FAB_LIKELY(a && !(a & 7) && (a & 4095) <= 4096 - 16 && fab_reqmem_page_marked(a >> FAB_REQMEM_PAGE_SHIFT))) {
    fab_req_head* h = p;
    if (FAB_LIKELY(h->magic == FAB_REQ_MAGIC && h->state == FAB_REQ_ACTIVE && h->kind && h->kind->api == api))
      return h;
  }
  return fab_req_head_check_slow(p, api, fn);
}

/* --- the one sequence of a test ----------------------------------------------------- */

/* What differs between kinds. Every step gets the header; a kind's steps are
 * static functions and its steps a static const table, so fab_req_run is
 * compiled into each kind's test with direct calls. */
typedef struct fab_req_steps {
  /* 1 while an operation of h is in flight; with poll, drives progress
   * first (the runtime's test is the engine's progress). */
  int (*busy)(fab_req_head* h, int poll);
  /* h is still in flight: the liveness check. FAB_OK while it may still
   * complete, else the failure that ends it. */
  fab_result (*stalled)(fab_req_head* h);
  /* h failed with rc while in flight: 1 when it stays out of its pool
   * (FAB_REQ_ORPHAN) until its operations return, 0 when it turned out to be
   * complete after all (then it finishes as usual). */
  int (*give_up)(fab_req_head* h, fab_result rc);
  /* h is complete: its result, and on success its sizes (sizes may be NULL). */
  fab_result (*finish)(fab_req_head* h, int* sizes);
  /* The text of the WARN for failure rc; 0 when nothing is to be said (a
   * part of h said it already). */
  int (*explain)(fab_req_head* h, fab_result rc, char* buf, size_t len);
  /* h goes back to its pool (or its owner's list). */
  void (*release)(fab_req_head* h);
} fab_req_steps;

void fab_req_warn(fab_req_head* h, const fab_req_steps* s, fab_result rc);
/* The runtime tested h after closing its comm: one WARN, and the error. */
fab_result fab_req_refuse_closed(const fab_req_head* h);

/* The steps of a request made of other requests (the rails' grouped receive
 * and split send): its parts' own tests watch liveness, give up and WARN, so
 * its busy step records a part's failure and reports it complete. */
static inline fab_result fab_req_parts_stalled(fab_req_head* h) {
  (void)h;
  return FAB_OK;
}
static inline int fab_req_parts_give_up(fab_req_head* h, fab_result rc) {
  (void)h, (void)rc;
  return 0;
}
static inline int fab_req_parts_explain(fab_req_head* h, fab_result rc, char* buf, size_t len) {
  (void)h, (void)rc, (void)buf, (void)len;
  return 0; /* the failed part, or its rail, said why */
}

/* The test of every kind: done is set once h is over (completed, or failed
 * for good); a failure is reported once, with one WARN. */
static inline __attribute__((always_inline)) fab_result fab_req_run(fab_req_head* h, int* done, int* sizes,
                                                                    const fab_req_steps* s, int poll) {
  if (s->busy(h, poll)) {
    fab_result rc = s->stalled(h);
    if (FAB_LIKELY(rc == FAB_OK)) return FAB_OK;
    if (s->give_up(h, rc)) {
      h->state = FAB_REQ_ORPHAN;
      *done = 1;
      fab_req_warn(h, s, rc);
      return rc;
    }
  }
  *done = 1;
  fab_result rc = s->finish(h, sizes);
  if (FAB_UNLIKELY(rc != FAB_OK)) fab_req_warn(h, s, rc);
  s->release(h);
  return rc;
}

#endif /* FAB_REQHEAD_H */
