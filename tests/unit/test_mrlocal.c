/*
 * Registration through libfabric for real: no provider here requires
 * FI_MR_LOCAL, so these tests switch the device's mr_local on after discovery
 * (before any endpoint exists). Every buffer, control messages included, then
 * travels with a descriptor from fi_mr_reg, and the cache must serve
 * sub-ranges of a registration without registering again.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fab_engine.h"
#include "fab_mr.h"
#include "unit_util.h"

static const fab_api* api = &fab_api_core;

static void loopback(fab_ctx* ctx, void** s, void** r, void** l) {
  unsigned char h[FAB_HANDLE_SIZE];
  cr_assert_eq(api->listen(ctx, 0, h, l), FAB_OK);
  *s = *r = NULL;
  int64_t end = ut_now_ms() + 20000;
  while (!*s || !*r) {
    cr_assert_lt(ut_now_ms(), end, "loopback connect timed out");
    if (!*s) cr_assert_eq(api->connect(ctx, 0, NULL, h, s, NULL), FAB_OK);
    if (!*r) cr_assert_eq(api->accept(*l, r, NULL), FAB_OK);
  }
}

static void run(const char* prov) {
  ut_use_provider(prov);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  fab_g.devs[0]->mr_local = 1;
  fab_g.devs[0]->reg_host = 1; /* what discovery derives from FI_MR_LOCAL */
  void *s, *r, *l;
  loopback(ctx, &s, &r, &l);
  enum { LEN = 1 << 20 };
  char* sb = malloc(LEN);
  char* rb = malloc(LEN);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(s, sb, LEN, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(r, rb, LEN, FAB_PTR_HOST, &rmh), FAB_OK);
  fab_mr_cache* cache = fab_g.devs[0]->dom->mr_cache;
  uint64_t misses = cache->misses;
  /* NCCL's regIsGlobal pattern: sub-ranges registered again, near free. */
  void* sub[16];
  for (int i = 0; i < 16; i++) cr_assert_eq(api->reg_mr(s, sb + i * 4096 + 3, 1000, FAB_PTR_HOST, &sub[i]), FAB_OK);
  cr_assert_eq(cache->misses, misses, "sub-ranges must hit the cache");
  ut_reset_warns();
  void* q = NULL;
  cr_assert_neq(api->isend(s, sb, 10, 1, NULL, NULL, &q), FAB_OK, "FI_MR_LOCAL needs a memory handle");
  cr_assert_neq(api->isend(s, sb + 5000, 1000, 1, sub[0], NULL, &q), FAB_OK, "outside the registration");
  cr_assert_eq(ut_warns(), 2);
  for (int k = 0; k < 20; k++) {
    size_t sz = (size_t)(k * 52361) % LEN;
    ut_fill(sb, sz, k);
    void* d = rb;
    size_t rsz = LEN;
    int tag = k;
    void *rq = NULL, *sq = NULL;
    while (!rq) cr_assert_eq(api->irecv(r, 1, &d, &rsz, &tag, &rmh, NULL, &rq), FAB_OK);
    void* mh = (k % 2 && sz <= 1000) ? sub[0] : smh; /* send from a sub-range handle too */
    char* src = mh == sub[0] ? sb + 3 : sb;
    if (mh == sub[0]) ut_fill(src, sz, k);
    while (!sq) cr_assert_eq(api->isend(s, src, sz, k, mh, NULL, &sq), FAB_OK);
    int got = -1, done = 0;
    for (int64_t end = ut_now_ms() + 20000; !done;) {
      cr_assert_lt(ut_now_ms(), end);
      cr_assert_eq(api->test(rq, &done, &got), FAB_OK);
    }
    for (done = 0; !done;) cr_assert_eq(api->test(sq, &done, NULL), FAB_OK);
    cr_assert_eq(got, (int)sz);
    cr_assert_lt(ut_verify(rb, sz, k), 0, "message %d corrupt", k);
  }
  for (int i = 0; i < 16; i++) cr_assert_eq(api->dereg_mr(s, sub[i]), FAB_OK);
  cr_assert_eq(api->dereg_mr(s, smh), FAB_OK);
  ut_reset_warns();
  cr_assert_neq(api->dereg_mr(s, smh), FAB_OK, "double deregMr");
  cr_assert_eq(ut_warns(), 1);
  /* A handle still registered at finalize is cleaned up (no leak under ASan). */
  cr_assert_eq(api->close_send(s), FAB_OK);
  cr_assert_eq(api->close_recv(r), FAB_OK);
  cr_assert_eq(api->close_listen(l), FAB_OK);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
  free(sb);
  free(rb);
}

Test(mr_local, tcp) { run("tcp"); }
Test(mr_local, shm) { run("shm"); }

/* FI_MR_ENDPOINT (cxi), under FABRIC_NIC_PROFILE=cxi on shm: a further send
 * comm to the same peer gets an endpoint of its own there, so a buffer
 * registered with the first comm is another endpoint's registration for the
 * second. Using it there is refused with one WARN that says to register with
 * that comm (regIsGlobal is 0), and registering it with that comm works. */
Test(mr_endpoint, registration_serves_its_endpoint) {
  setenv("FABRIC_NIC_PROFILE", "cxi", 1);
  setenv("FABRIC_TRANSPORT", "sendrecv", 1);
  ut_use_provider("shm");
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_assert(fab_g.devs[0]->mr_endpoint, "the cxi profile keeps registrations per endpoint");
  fab_properties p;
  cr_assert_eq(api->get_properties(0, &p), FAB_OK);
  cr_expect_eq(p.reg_is_global, 0);
  void *s1, *r1, *l1, *s2 = NULL, *r2 = NULL;
  loopback(ctx, &s1, &r1, &l1);
  unsigned char h[FAB_HANDLE_SIZE];
  void* l2;
  cr_assert_eq(api->listen(ctx, 0, h, &l2), FAB_OK);
  for (int64_t end = ut_now_ms() + 20000; !s2 || !r2;) { /* a second pair to the same peer endpoint */
    cr_assert_lt(ut_now_ms(), end);
    if (!s2) cr_assert_eq(api->connect(ctx, 0, NULL, h, &s2, NULL), FAB_OK);
    if (!r2) cr_assert_eq(api->accept(l2, &r2, NULL), FAB_OK);
  }
  fab_comm* c1 = fab_obj_get(s1, FAB_OBJ_SEND);
  fab_comm* c2 = fab_obj_get(s2, FAB_OBJ_SEND);
  cr_assert_neq(c1->ep, c2->ep, "on shm, a second send comm to a peer gets an endpoint of its own");
  char buf[256];
  void *mh1, *mh2, *q = NULL;
  cr_assert_eq(api->reg_mr(s1, buf, sizeof buf, FAB_PTR_HOST, &mh1), FAB_OK);
  ut_reset_warns();
  cr_expect_eq(api->isend(s2, buf, 64, 3, mh1, NULL, &q), FAB_ERR_INTERNAL, "another endpoint's registration");
  cr_expect_eq(ut_warns(), 1);
  cr_assert_eq(api->reg_mr(s2, buf, sizeof buf, FAB_PTR_HOST, &mh2), FAB_OK);
  void* d = buf + 128;
  size_t rsz = 64;
  int tag = 3;
  void* rq = NULL;
  void* rmh;
  cr_assert_eq(api->reg_mr(r2, buf + 128, 128, FAB_PTR_HOST, &rmh), FAB_OK);
  while (!rq) cr_assert_eq(api->irecv(r2, 1, &d, &rsz, &tag, &rmh, NULL, &rq), FAB_OK);
  while (!q) cr_assert_eq(api->isend(s2, buf, 64, 3, mh2, NULL, &q), FAB_OK);
  for (int done = 0, n = 0; !done; n++) {
    cr_assert_lt(n, 10000000);
    cr_assert_eq(api->test(rq, &done, NULL), FAB_OK);
  }
  for (int done = 0; !done;) cr_assert_eq(api->test(q, &done, NULL), FAB_OK);
  cr_assert_eq(api->dereg_mr(s1, mh1), FAB_OK);
  cr_assert_eq(api->dereg_mr(s2, mh2), FAB_OK);
  cr_assert_eq(api->dereg_mr(r2, rmh), FAB_OK);
  cr_assert_eq(api->close_send(s2), FAB_OK);
  cr_assert_eq(api->close_recv(r2), FAB_OK);
  cr_assert_eq(api->close_listen(l2), FAB_OK);
  cr_assert_eq(api->close_send(s1), FAB_OK);
  cr_assert_eq(api->close_recv(r1), FAB_OK);
  cr_assert_eq(api->close_listen(l1), FAB_OK);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}
