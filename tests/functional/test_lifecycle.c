/*
 * 7. init/finalize and library lifetime; 8. a peer that dies mid-transfer.
 */
#include <dlfcn.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "ft_criterion.h"

enum { T_MS = 30000 };

/* v11+ (and the core): two contexts at once, finalized one at a time, the
 * survivor still working; then a fresh init after everything was finalized.
 * v6..v10: init is process-wide and idempotent; calling it twice is fine. */
FT_PAIR_TEST(init_twice, 60) {
  int version = ft_api_selected();
  ft_side s;
  ft_side_open(&s, peer, version);
  if (!ft_version_has_ctx(version)) {
    fab_ctx* again = NULL;
    FT_OK(s.api->init(&again, 2, &s.config, ft_logger, NULL));
    ft_conn c;
    ft_connect_all(&s, &c, 1, T_MS);
    ft_exchange(&s, &c, 4099, 1200, T_MS);
    ft_close_all(&s, &c, 1);
    ft_side_close(&s);
    return;
  }
  FT_CHECK(s.api->finalize != NULL, "%s has no finalize", s.lib.desc);
  /* Second context, same library. */
  ft_side s2 = s;
  s2.ctx = NULL;
  FT_OK(s2.api->init(&s2.ctx, 0x5eed, &s2.config, ft_logger, NULL));
  FT_CHECK(s2.ctx != NULL && s2.ctx != s.ctx, "the second init returned context %p (first %p)", (void*)s2.ctx,
           (void*)s.ctx);
  ft_conn c1, c2;
  ft_connect_all(&s, &c1, 1, T_MS);
  ft_connect_all(&s2, &c2, 1, T_MS);
  ft_exchange(&s, &c1, 70001, 1201, T_MS);
  ft_exchange(&s2, &c2, 70001, 1202, T_MS);
  /* Finalize the first; the second keeps working. */
  ft_close_all(&s, &c1, 1);
  ft_phase("finalize the first context");
  FT_OK(s.api->finalize(s.ctx));
  ft_exchange(&s2, &c2, 1 << 20, 1203, T_MS);
  ft_close_all(&s2, &c2, 1);
  ft_phase("finalize the second context");
  FT_OK(s2.api->finalize(s2.ctx));
  /* Everything finalized: init again in the same process. */
  ft_sync(peer, "all finalized", T_MS);
  ft_phase("init after the last finalize");
  ft_side_init(&s);
  ft_conn c3;
  ft_connect_all(&s, &c3, 1, T_MS);
  ft_exchange(&s, &c3, 12345, 1204, T_MS);
  ft_close_all(&s, &c3, 1);
  ft_side_close(&s);
}

/* NCCL 2.28+ dlcloses the library after the last communicator and dlopens it
 * again for the next: load, use, unload, three times over. */
FT_PAIR_TEST(dlopen_cycle, 90) {
  int version = ft_api_selected();
  if (version == FT_API_CORE) {
    /* The core is linked in; cycle init/finalize instead. */
    for (int cycle = 0; cycle < 3; cycle++) {
      ft_side s;
      ft_side_open(&s, peer, version);
      ft_conn c;
      ft_connect_all(&s, &c, 1, T_MS);
      ft_exchange(&s, &c, (size_t)1 << 20, 1300 + (uint64_t)cycle, T_MS);
      ft_close_all(&s, &c, 1);
      ft_side_close(&s);
      ft_sync(peer, "cycle", T_MS);
    }
    return;
  }
  int unloaded = 0;
  for (int cycle = 0; cycle < 3; cycle++) {
    ft_side s;
    ft_phase("cycle %d: load", cycle);
    ft_side_open(&s, peer, version);
    ft_conn c;
    ft_connect_all(&s, &c, 1, T_MS);
    ft_exchange(&s, &c, (size_t)1 << 20, 1300 + (uint64_t)cycle, T_MS);
    ft_exchange(&s, &c, 3, 1310 + (uint64_t)cycle, T_MS);
    ft_close_all(&s, &c, 1);
    ft_side_close(&s); /* finalize (v11+) and dlclose */
    void* still = dlopen(ft_plugin_path(), RTLD_NOW | RTLD_NOLOAD);
    if (still)
      dlclose(still);
    else
      unloaded++;
    ft_sync(peer, "cycle", T_MS);
  }
  if (unloaded == 0)
    fprintf(stderr, "[dlopen_cycle %s] note: the library stayed mapped after dlclose (RTLD_NODELETE or a unique "
                    "symbol?); the reload path was not really exercised\n", ft_role_name());
  FT_CHECK(!ft_leak_check(), "LeakSanitizer found leaks after three load/unload cycles");
}

/* 8. The child dies (_exit, nothing closed) with requests outstanding on both
 *    sides. The survivor's test() returns an error or keeps returning
 *    not-done; it must not crash, report data that never came, or hang in
 *    close.
 *
 *    strict (peer_death_sends_fail): in addition, where the provider can see
 *    the peer's death (tcp: the connection is refused), sends must error out
 *    within a bounded time instead of staying pending or unpostable forever.
 *    That part currently fails: see the ENGINE BUG message below. */
static void peer_death_body(ft_peer* peer, int strict) {
  enum { BIG = 8 << 20 };
  const int poll_ms = strict ? 15000 : 500, new_send_ms = strict ? 15000 : 700;
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_exchange(&s, &c, 4096, 1400, T_MS); /* the connection really works */
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, BIG);
  ft_mr_alloc(&s, &rm, c.recv_comm, BIG);
  ft_fill(sm.buf, BIG, 3);
  memset(rm.buf, FT_POISON, BIG);
  /* Receives nobody will match, a large send nobody will receive. */
  int rtag = 11, stag = 12;
  size_t rlen = BIG;
  void* d = rm.buf;
  void* rreq = ft_irecv(&s, c.recv_comm, 1, &d, &rlen, &rtag, &rm.mh, T_MS);
  void* sreq = NULL;
  FT_OK(s.api->isend(c.send_comm, sm.buf, BIG, stag, sm.mh, NULL, &sreq));
  ft_sync(peer, "outstanding", T_MS);
  if (peer->role == FT_CHILD) {
    /* Mid-transfer: a little progress, then gone without closing anything. */
    int done = 0;
    (void)s.api->test(rreq, &done, NULL);
    if (sreq) (void)s.api->test(sreq, &done, NULL);
    _exit(0);
  }
  ft_phase("waiting for the child to die");
  FT_CHECK(ft_wait_child(peer, 10000), "the child did not exit");
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  ft_phase("polling after the peer died");
  int rdone = 0, sdone = 0;
  fab_result rrc = FAB_OK, src = FAB_OK;
  int64_t t0 = ft_now_ms(), deadline = t0 + poll_ms;
  while (ft_now_ms() < deadline && ((rrc == FAB_OK && !rdone) || (sreq && src == FAB_OK && !sdone))) {
    if (rrc == FAB_OK && !rdone) rrc = s.api->test(rreq, &rdone, NULL);
    if (sreq && src == FAB_OK && !sdone) src = s.api->test(sreq, &sdone, NULL);
    if (strict && src != FAB_OK) break;
    sched_yield();
  }
  FT_CHECK(!(rrc == FAB_OK && rdone), "a receive completed although the dead peer never sent a matching message");
  ft_check_poison(rm.buf, 4096, "receive from the dead peer");
  /* A new send after the death. */
  fab_result nrc = FAB_OK;
  int ndone = 0, nposted = 0;
  void* nreq = NULL;
  deadline = ft_now_ms() + new_send_ms;
  while (ft_now_ms() < deadline) {
    if (!nreq) {
      nrc = s.api->isend(c.send_comm, sm.buf, 1 << 20, 13, sm.mh, NULL, &nreq);
      if (nrc != FAB_OK) break;
      nposted += nreq != NULL;
    } else {
      nrc = s.api->test(nreq, &ndone, NULL);
      if (nrc != FAB_OK || ndone) break;
    }
    sched_yield();
  }
  ft_log_expect_warns(0);
  int dw = ft_log_warns() - w0;
  int64_t took = ft_now_ms() - t0;
  fprintf(stderr,
          "[%s %s] after the peer died (%lld ms): old recv rc %d done %d; old send %s rc %d done %d; "
          "new send %s rc %d done %d; %d WARN lines\n",
          strict ? "peer_death_sends_fail" : "peer_death", s.lib.desc, (long long)took, (int)rrc, rdone,
          sreq ? "posted," : "never posted,", (int)src, sdone, nposted ? "posted," : "never posted,", (int)nrc, ndone,
          dw);
  int any_error = rrc != FAB_OK || src != FAB_OK || nrc != FAB_OK;
  if (any_error) FT_CHECK(dw >= 1, "errors after the peer died were not logged as WARN");
  if (ft_provider_is("tcp")) {
    /* tcp;ofi_rxm sends large messages by rendezvous: without the peer they
     * cannot have completed. */
    FT_CHECK(!(nrc == FAB_OK && ndone), "a 1 MiB send to a dead peer completed successfully over tcp");
  }
  if (strict) {
    FT_CHECK(src != FAB_OK || nrc != FAB_OK,
             "ENGINE BUG (reported): %lld ms after the peer process died, its send comm still reports nothing: the "
             "8 MiB send in flight is %s and a new 1 MiB send %s. tcp;ofi_rxm only retries the refused connection "
             "(FI_LOG_LEVEL=warn shows it) and never completes these operations, so the engine must bound them "
             "itself (for example a send/connection timeout) and fail them with a WARN",
             (long long)took, src == FAB_OK ? (sdone ? "done" : "still pending") : "failed",
             nposted ? "is still pending" : "is refused forever with a NULL request (EAGAIN)");
  }
  ft_phase("closing after the peer died");
  /* NCCL's order: deregister, then close, whatever is still in flight. */
  (void)s.api->dereg_mr(sm.comm, sm.mh);
  (void)s.api->dereg_mr(rm.comm, rm.mh);
  int64_t tc = ft_now_ms();
  FT_OK(s.api->close_send(c.send_comm));
  FT_OK(s.api->close_recv(c.recv_comm));
  FT_OK(s.api->close_listen(c.listen_comm));
  ft_side_close(&s); /* the provider may touch the buffers until the endpoint is gone */
  ft_free(sm.buf, sm.len);
  ft_free(rm.buf, rm.len);
  FT_CHECK(ft_now_ms() - tc < 10000, "closing and finalizing after the peer died took %lld ms",
           (long long)(ft_now_ms() - tc));
}

FT_PAIR_TEST(peer_death, 40) { peer_death_body(peer, 0); }

/* Run as its own CTest entry (functional.tcp.peer_death_sends_fail); the
 * per-version entries leave it out. */
static void peer_death_strict(ft_peer* peer, void* arg) { peer_death_body(peer, 1); }
Test(functional, peer_death_sends_fail, .init = ft_test_init, .timeout = 90) {
  /* shm has no connection whose loss the provider could report. */
  if (!ft_provider_is("tcp")) cr_skip_test("only tcp can see a dead peer");
  ft_run_pair("peer_death_sends_fail", peer_death_strict, NULL, 60);
}
