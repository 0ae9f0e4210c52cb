/* Unit tests of the request header (core/base/fab_reqhead.h): the check of a
 * pointer the runtime passes to test, and the one sequence of a test that
 * every kind of request runs through. No provider. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fab_log.h"
#include "fab_reqhead.h"
#include "unit_util.h"

static void quiet_setup(void) {
  fab_log_set_logger(ut_logger);
  ut_reset_warns();
}

/* --- the pointer check --------------------------------------------------------------- */

static fab_result fake_test(fab_req_head* h, int* done, int* sizes) {
  (void)h, (void)sizes;
  *done = 1;
  return FAB_OK;
}
static const fab_req_kind net_kind = {.name = "fake", .api = FAB_REQ_API_NET, .test = fake_test};

Test(reqhead, memory_is_marked_and_unmarked, .init = quiet_setup) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  char* m = fab_reqmem_alloc(3 * page);
  cr_assert_not_null(m);
  for (size_t i = 0; i < 3 * page; i += 8) cr_assert(fab_reqmem_holds(m + i) || i + 16 > 3 * page, "offset %zu", i);
  cr_assert_not(fab_reqmem_holds(m + 3 * page - 8), "a header running past the last page is not held");
  fab_reqmem_free(m, 3 * page);
  cr_assert_not(fab_reqmem_holds(m), "freed request memory is not request memory any more");
  int on_stack = 0;
  cr_assert_not(fab_reqmem_holds(&on_stack));
  void* heap = malloc(64);
  cr_assert_not(fab_reqmem_holds(heap));
  free(heap);
  cr_assert_not(fab_reqmem_holds((void*)(uintptr_t)0xdead0000beef0000ull), "beyond 2^48");
  cr_assert_not(fab_reqmem_holds(NULL));
}

Test(reqhead, check_refuses_what_is_not_a_live_request, .init = quiet_setup) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  /* a header of FAB_REQ_MAGIC outside request memory: never read */
  fab_req_head forged = {.magic = FAB_REQ_MAGIC, .state = FAB_REQ_ACTIVE, .kind = (const fab_req_kind*)0x10};
  cr_assert_null(fab_req_head_check(&forged, FAB_REQ_API_NET, "test"));
  cr_assert_eq(ut_warns(), 1);
  /* unmapped memory: never read */
  void* gone = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  munmap(gone, page);
  cr_assert_null(fab_req_head_check(gone, FAB_REQ_API_NET, "test"));
  cr_assert_null(fab_req_head_check(NULL, FAB_REQ_API_NET, "test"));
  cr_assert_eq(ut_warns(), 3);

  char* m = fab_reqmem_alloc(page);
  fab_req_head* h = (fab_req_head*)(m + 64);
  *h = (fab_req_head){.magic = FAB_REQ_MAGIC, .state = FAB_REQ_ACTIVE, .kind = &net_kind};
  cr_assert_eq(fab_req_head_check(h, FAB_REQ_API_NET, "test"), h);
  cr_assert_eq(ut_warns(), 3, "a live request is taken without a WARN");
  cr_assert_null(fab_req_head_check(m + 68, FAB_REQ_API_NET, "test"), "misaligned");
  cr_assert_null(fab_req_head_check(m + 72, FAB_REQ_API_NET, "test"), "aligned, but not at a header");
  cr_assert_null(fab_req_head_check(h, FAB_REQ_API_RMA, "test"), "a kind the other API tests");
  h->state = FAB_REQ_FREE;
  cr_assert_null(fab_req_head_check(h, FAB_REQ_API_NET, "test"), "completed already");
  h->state = FAB_REQ_ORPHAN;
  cr_assert_null(fab_req_head_check(h, FAB_REQ_API_NET, "test"), "reported failed already");
  cr_assert_eq(ut_warns(), 8, "one WARN per refusal");
  fab_reqmem_free(m, page);
  cr_assert_null(fab_req_head_check(h, FAB_REQ_API_NET, "test"), "its memory was freed: not read");
}

/* --- the sequence --------------------------------------------------------------------- */

typedef struct fake_req {
  fab_req_head head;
  int polls_left;   /* busy until polled this many times */
  fab_result fails; /* stalled returns it */
  int in_flight;    /* give_up: still in the provider's hands */
  fab_result result;
  int explained, released, gave_up;
} fake_req;

static int f_busy(fab_req_head* h, int poll) {
  fake_req* r = (fake_req*)h;
  if (poll && r->polls_left > 0) r->polls_left--;
  return r->polls_left > 0;
}
static fab_result f_stalled(fab_req_head* h) { return ((fake_req*)h)->fails; }
static int f_give_up(fab_req_head* h, fab_result rc) {
  (void)rc;
  ((fake_req*)h)->gave_up++;
  return ((fake_req*)h)->in_flight;
}
static fab_result f_finish(fab_req_head* h, int* sizes) {
  if (sizes) sizes[0] = 42;
  return ((fake_req*)h)->result;
}
static int f_explain(fab_req_head* h, fab_result rc, char* buf, size_t len) {
  ((fake_req*)h)->explained++;
  snprintf(buf, len, "fake request failed with %d", (int)rc);
  return 1;
}
static void f_release(fab_req_head* h) {
  ((fake_req*)h)->released++;
  h->state = FAB_REQ_FREE;
}
static const fab_req_steps steps = {f_busy, f_stalled, f_give_up, f_finish, f_explain, f_release};

static fake_req fresh(void) {
  return (fake_req){.head = {.magic = FAB_REQ_MAGIC, .state = FAB_REQ_ACTIVE, .kind = &net_kind}};
}

Test(reqhead, pending_then_complete, .init = quiet_setup) {
  fake_req r = fresh();
  r.polls_left = 2;
  int done = 0, sizes[1] = {0};
  cr_assert_eq(fab_req_run(&r.head, &done, sizes, &steps, 1), FAB_OK);
  cr_assert_eq(done, 0);
  cr_assert_eq(fab_req_run(&r.head, &done, sizes, &steps, 0), FAB_OK);
  cr_assert_eq(done, 0, "without polling nothing moves");
  cr_assert_eq(fab_req_run(&r.head, &done, sizes, &steps, 1), FAB_OK);
  cr_assert_eq(done, 1);
  cr_assert_eq(sizes[0], 42);
  cr_assert_eq(r.released, 1);
  cr_assert_eq(r.head.state, FAB_REQ_FREE);
  cr_assert_eq(ut_warns(), 0);
}

Test(reqhead, failed_result_is_one_warn, .init = quiet_setup) {
  fake_req r = fresh();
  r.result = FAB_ERR_REMOTE;
  int done = 0;
  cr_assert_eq(fab_req_run(&r.head, &done, NULL, &steps, 1), FAB_ERR_REMOTE);
  cr_assert_eq(done, 1);
  cr_assert_eq(r.explained, 1);
  cr_assert_eq(r.released, 1);
  cr_assert_eq(ut_warns(), 1);
}

Test(reqhead, given_up_in_flight_is_kept_out, .init = quiet_setup) {
  fake_req r = fresh();
  r.polls_left = 100;
  r.fails = FAB_ERR_SYSTEM;
  r.in_flight = 1;
  int done = 0;
  cr_assert_eq(fab_req_run(&r.head, &done, NULL, &steps, 1), FAB_ERR_SYSTEM);
  cr_assert_eq(done, 1, "a failure ends the request for the runtime");
  cr_assert_eq(r.head.state, FAB_REQ_ORPHAN, "kept out of its pool while the provider holds it");
  cr_assert_eq(r.released, 0);
  cr_assert_eq(ut_warns(), 1);
}

Test(reqhead, given_up_but_complete_after_all, .init = quiet_setup) {
  fake_req r = fresh();
  r.polls_left = 100;
  r.fails = FAB_ERR_SYSTEM;
  r.in_flight = 0;
  int done = 0;
  cr_assert_eq(fab_req_run(&r.head, &done, NULL, &steps, 1), FAB_OK, "its own result: it completed");
  cr_assert_eq(done, 1);
  cr_assert_eq(r.gave_up, 1);
  cr_assert_eq(r.released, 1);
  cr_assert_eq(ut_warns(), 0);
}
