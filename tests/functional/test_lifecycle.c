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

/* 8. The child dies (_exit, nothing closed) with a receive and an 8 MiB send
 *    outstanding on both sides. On every provider the survivor must not
 *    crash, must not complete the receive (no data ever came), and must close
 *    and finalize promptly.
 *
 *    tcp: the engine must notice the death. tcp;ofi_rxm never fails an
 *    operation to a dead peer (it retries the refused connection), so the
 *    engine's liveness check does: after FABRIC_PEER_TIMEOUT_MS (2 s here)
 *    without a sign of life, the old receive, the old send and a new send
 *    fail with ncclRemoteError, each with exactly one WARN that names the
 *    liveness check, within the timeout plus DETECT_SLACK_MS.
 *
 *    shm: not asserted, and said so in the output. The provider delivers the
 *    engine's liveness probes into the dead peer's shared-memory region, so
 *    they complete and count as signs of life: the engine cannot tell. */
enum { PEER_TIMEOUT_MS = 2000, DETECT_SLACK_MS = 4000 };

static int detection_warn(const char* w) {
  return strstr(w, "no sign of life from the peer") || strstr(w, "liveness probe to the peer failed");
}

FT_PAIR_TEST(peer_death, 40) {
  enum { BIG = 8 << 20 };
  char env[16];
  snprintf(env, sizeof env, "%d", PEER_TIMEOUT_MS);
  setenv("FABRIC_PEER_TIMEOUT_MS", env, 1);
  const int detects = ft_provider_is("tcp");
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
  /* A receive nobody will match, a large send nobody will receive. */
  int rtag = 11;
  size_t rlen = BIG;
  void* d = rm.buf;
  void* rreq = ft_irecv(&s, c.recv_comm, 1, &d, &rlen, &rtag, &rm.mh, T_MS);
  void* sreq = ft_isend(&s, c.send_comm, sm.buf, BIG, 12, sm.mh, T_MS);
  ft_sync(peer, "outstanding", T_MS);
  if (peer->role == FT_CHILD) {
    /* Mid-transfer: a little progress, then gone without closing anything. */
    int done = 0;
    (void)s.api->test(rreq, &done, NULL);
    (void)s.api->test(sreq, &done, NULL);
    _exit(0);
  }
  ft_phase("waiting for the child to die");
  FT_CHECK(ft_wait_child(peer, 10000), "the child did not exit");

  ft_phase("polling after the peer died");
  const int window_ms = detects ? PEER_TIMEOUT_MS + DETECT_SLACK_MS : 1000;
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  int rdone = 0, sdone = 0, ndone = 0;
  fab_result rrc = FAB_OK, src = FAB_OK, nrc = FAB_OK;
  void* nreq = NULL;
  int64_t t0 = ft_now_ms(), deadline = t0 + window_ms;
  while (ft_now_ms() < deadline) {
    if (rrc == FAB_OK && !rdone) rrc = s.api->test(rreq, &rdone, NULL);
    if (src == FAB_OK && !sdone) src = s.api->test(sreq, &sdone, NULL);
    if (rrc != FAB_OK && src != FAB_OK) break;
    sched_yield();
  }
  int64_t detected_ms = ft_now_ms() - t0;
  /* A new send after the death (after the detection, where there is one). */
  deadline = ft_now_ms() + 1000;
  while (ft_now_ms() < deadline && nrc == FAB_OK && !ndone) {
    if (!nreq)
      nrc = s.api->isend(c.send_comm, sm.buf, 1 << 20, 13, sm.mh, NULL, &nreq);
    else
      nrc = s.api->test(nreq, &ndone, NULL);
    sched_yield();
  }
  ft_log_expect_warns(0);
  int dw = ft_log_warns() - w0;
  int errors = (rrc != FAB_OK) + (src != FAB_OK) + (nrc != FAB_OK);
  fprintf(stderr,
          "[peer_death %s] after the peer died (%lld ms): old recv rc %d done %d; old send rc %d done %d; "
          "new send %s rc %d done %d; %d WARN lines\n",
          s.lib.desc, (long long)detected_ms, (int)rrc, rdone, (int)src, sdone, nreq ? "posted," : "not posted,",
          (int)nrc, ndone, dw);

  FT_CHECK(!(rrc == FAB_OK && rdone), "a receive completed although the dead peer never sent a matching message");
  ft_check_poison(rm.buf, 4096, "receive from the dead peer");
  FT_CHECK(dw == errors, "%d calls failed after the peer died but %d WARN lines were logged (one each); last: %s",
           errors, dw, ft_log_last_warn());
  if (detects) {
    FT_CHECK(rrc == FAB_ERR_REMOTE && src == FAB_ERR_REMOTE,
             "the peer's death was not detected within %d ms (FABRIC_PEER_TIMEOUT_MS=%d): the old receive "
             "returned %d (done %d), the old send %d (done %d); both must fail with ncclRemoteError (%d)",
             window_ms, PEER_TIMEOUT_MS, (int)rrc, rdone, (int)src, sdone, (int)FAB_ERR_REMOTE);
    FT_CHECK(nrc == FAB_ERR_REMOTE, "a 1 MiB send posted after the death was detected returned %d (done %d), "
             "not ncclRemoteError", (int)nrc, ndone);
    FT_CHECK(detection_warn(ft_log_last_warn()), "the WARN does not name the liveness check: %s",
             ft_log_last_warn());
  } else {
    fprintf(stderr, "[peer_death %s] note: on %s the engine cannot detect a dead peer (its liveness probes "
            "complete into the dead peer's shared memory); only tcp asserts detection\n", s.lib.desc, ft_provider());
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
  FT_CHECK(ft_now_ms() - tc < 5000, "closing and finalizing after the peer died took %lld ms",
           (long long)(ft_now_ms() - tc));
}
