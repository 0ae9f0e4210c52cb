/*
 * 7. init/finalize and library lifetime: two contexts, reloads, finalize with
 * comms open, connect/close cycles, stale shm regions; 8. a peer that dies
 * mid-transfer.
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
  if (!ft_has_ctx(&s.lib)) {
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

/* finalize of a context with what NCCL may leave when it gives up: comms, a
 * posted receive, a send the peer never receives, registrations. finalize
 * closes all of it; its comm and request handles are refused afterwards
 * (never used), its registrations stay valid until deregistered (they belong
 * to the device), and a second context on the same endpoint keeps working
 * without a WARN. Then the last context is finalized with its comms open
 * too: with the engine down, stale handles are still refused. v11+ and the
 * core: older versions have no finalize. */
static void finalize_open_body(ft_peer* peer, void* arg) {
  enum { LEN = 1 << 20 };
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_side s2 = s;
  FT_OK(s2.api->init(&s2.ctx, 0x5eed, &s2.config, ft_logger, NULL));
  ft_conn c1, c2;
  ft_connect_all(&s, &c1, 1, T_MS);
  ft_connect_all(&s2, &c2, 1, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c1.send_comm, LEN);
  ft_mr_alloc(&s, &rm, c1.recv_comm, LEN);
  void* d = rm.buf;
  size_t len = LEN;
  int tag = 5;
  (void)ft_irecv(&s, c1.recv_comm, 1, &d, &len, &tag, &rm.mh, T_MS); /* never matched */
  void* sreq = ft_isend(&s, c1.send_comm, sm.buf, 100, 6, sm.mh, T_MS); /* never received */
  ft_sync(peer, "left open", T_MS);

  ft_phase("finalize the first context with its comms open");
  FT_OK(s.api->finalize(s.ctx));
  void* q = (void*)0x1;
  int done = 0;
  FT_EXPECT_ERROR(s.api->isend(c1.send_comm, sm.buf, 8, 1, sm.mh, NULL, &q));
  FT_CHECK(q == NULL, "isend on a comm finalize closed left %p in *request", q);
  FT_EXPECT_ERROR(s.api->test(sreq, &done, NULL));
  FT_EXPECT_ERROR(s.api->close_recv(c1.recv_comm));
  /* Registrations belong to the device, not to a context (regIsGlobal): they
   * outlive this one, and NCCL may still deregister them. */
  FT_OK(s.api->dereg_mr(c1.send_comm, sm.mh));
  FT_OK(s.api->dereg_mr(c1.recv_comm, rm.mh));

  ft_phase("the second context after the first was finalized");
  int w0 = ft_log_warns();
  for (int i = 0; i < 4; i++) ft_exchange(&s2, &c2, 65536, 1600 + (uint64_t)i, T_MS);
  FT_CHECK(ft_log_warns() == w0, "%d WARN lines in the surviving context; last: %s", ft_log_warns() - w0,
           ft_log_last_warn());
  ft_mr m2;
  ft_mr_alloc(&s2, &m2, c2.send_comm, 4096);
  ft_sync(peer, "second context done", T_MS);

  ft_phase("finalize the last context with its comms open");
  FT_OK(s2.api->finalize(s2.ctx));
  /* The engine is down, its logger with it: no WARN count to check. */
  q = (void*)0x1;
  FT_CHECK(s2.api->isend(c2.send_comm, m2.buf, 8, 1, m2.mh, NULL, &q) != FAB_OK && q == NULL,
           "isend on a comm of a finalized engine");
  FT_CHECK(s2.api->close_recv(c2.recv_comm) != FAB_OK, "closeRecv after the last finalize");
  FT_CHECK(s2.api->dereg_mr(c2.send_comm, m2.mh) != FAB_OK, "deregMr after the last finalize");
  FT_CHECK(s2.api->test(NULL, &done, NULL) != FAB_OK, "test(NULL) after the last finalize");
  s.inited = 0; /* both finalized: ft_side_close only unloads */
  ft_side_close(&s);
  ft_free(sm.buf, sm.len);
  ft_free(rm.buf, rm.len);
  ft_free(m2.buf, m2.len);
}

Test(functional, finalize_with_open_comms, .init = ft_test_init, .timeout = 90) {
  int api = ft_api_selected();
  if (api > FT_API_NEURON || (api >= 6 && api <= 10)) cr_skip_test("net v6..v10 and Neuron have no finalize per context");
  ft_run_pair("finalize_with_open_comms", finalize_open_body, NULL, 60);
}

/* Communicators come and go in a long-lived process: connect and close two
 * comm pairs 300 times in one context, with traffic on some rounds. On shm
 * the second send comm to a peer gets an endpoint (and an address) of its
 * own, and an endpoint maps at most 256 peers: the addresses of closed comms
 * must be released, or accept fails after about 255 rounds. A request of a
 * closed comm is refused by test() with one WARN, never a fault. */
FT_PAIR_TEST(connect_close_cycles, 120) {
  enum { CYCLES = 300, LEN = 256 };
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  void* stale = NULL;
  for (int cyc = 0; cyc < CYCLES; cyc++) {
    ft_conn pair[2], c;
    ft_connect_all(&s, pair, 2, T_MS);
    c = pair[cyc % 2]; /* traffic on either */
    if (cyc % 60 == 0 || cyc == CYCLES - 1) {
      ft_mr sm, rm;
      ft_mr_alloc(&s, &sm, c.send_comm, LEN);
      ft_mr_alloc(&s, &rm, c.recv_comm, LEN);
      ft_fill(sm.buf, LEN, ft_seed(1700, (uint64_t)ft_role(), (uint64_t)cyc));
      size_t len = LEN;
      int tag = cyc;
      void* d = rm.buf;
      void* reqs[2];
      reqs[0] = ft_irecv(&s, c.recv_comm, 1, &d, &len, &tag, &rm.mh, T_MS);
      reqs[1] = ft_isend(&s, c.send_comm, sm.buf, LEN, tag, sm.mh, T_MS);
      ft_wait_all(&s, reqs, 2, NULL, 0, T_MS, "a round's message");
      ft_verify_or_fail(rm.buf, LEN, ft_seed(1700, (uint64_t)(1 - ft_role()), (uint64_t)cyc), "a round's message");
      if (!stale) stale = reqs[1];
      ft_mr_free(&s, &sm);
      ft_mr_free(&s, &rm);
    }
    ft_sync(peer, "round done", T_MS);
    ft_close_all(&s, pair, 2);
    if (cyc == 0) {
      int done = 0;
      FT_EXPECT_ERROR(s.api->test(stale, &done, NULL));
      FT_CHECK(!done, "test() of a closed comm's request reported it done");
    }
  }
  int warns = ft_log_warns();
  FT_CHECK(warns == 1, "%d WARN lines over %d rounds, one expected (the stale request); last: %s", warns, CYCLES,
           ft_log_last_warn());
  ft_side_close(&s);
}

/* shm: regions under /dev/shm that a killed process with our pid left behind,
 * named as the shm provider names them by default (<pid>:<domain>:<endpoint>),
 * must not keep our endpoints from opening: the engine names its endpoints
 * itself. Each process blocks every such name it would be given first. */
enum { STALE_DOMS = 4, STALE_EPS = 16 };

static void stale_regions_body(ft_peer* peer, void* arg) {
  static char paths[STALE_DOMS * STALE_EPS][64];
  int planted = 0;
  for (int d = 0; d < STALE_DOMS; d++)
    for (int e = 0; e < STALE_EPS; e++) {
      snprintf(paths[planted], sizeof paths[planted], "/dev/shm/%d:%d:%d", (int)getpid(), d, e);
      FILE* f = fopen(paths[planted], "wx");
      if (!f) continue; /* exists already: not ours to remove */
      fputs("stale", f);
      fclose(f);
      planted++;
    }
  FT_CHECK(planted > 0, "could not plant stale regions under /dev/shm");
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_exchange(&s, &c, 64, 1800, T_MS);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
  for (int i = 0; i < planted; i++) unlink(paths[i]);
  FT_CHECK(ft_log_warns() == 0, "%d WARN lines; last: %s", ft_log_warns(), ft_log_last_warn());
}

Test(functional, stale_shm_regions_of_our_pid, .init = ft_test_init, .timeout = 60) {
  if (!ft_provider_is("shm")) cr_skip_test("shm only: the regions are the shm provider's");
  ft_run_pair("stale_shm_regions_of_our_pid", stale_regions_body, NULL, 40);
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

/* The liveness check, or the provider (libfabric 2.x cancels a peer's operations itself). */
static int detection_warn(const char* w) {
  return strstr(w, "no sign of life from the peer") || strstr(w, "liveness probe to the peer failed") ||
         strstr(w, "the connection to the peer was lost");
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
  /* A receive nobody will match, a large send nobody will receive (without
   * tags, Neuron v4, a send would match the peer's receive: none then). */
  int rtag = 11;
  size_t rlen = BIG;
  void* d = rm.buf;
  void* rreq = ft_irecv(&s, c.recv_comm, 1, &d, &rlen, &rtag, &rm.mh, T_MS);
  int untagged = ft_single_recv(&s.lib);
  void* sreq = untagged ? NULL : ft_isend(&s, c.send_comm, sm.buf, BIG, 12, sm.mh, T_MS);
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

  ft_phase("polling after the peer died");
  const int window_ms = detects ? PEER_TIMEOUT_MS + DETECT_SLACK_MS : 1000;
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  int rdone = 0, sdone = 0, ndone = 0;
  fab_result rrc = FAB_OK, src = untagged ? FAB_ERR_REMOTE : FAB_OK, nrc = FAB_OK; /* no send: as if failed */
  void* nreq = NULL;
  int64_t t0 = ft_now_ms(), deadline = t0 + window_ms;
  while (ft_now_ms() < deadline) {
    if (rrc == FAB_OK && !rdone) rrc = s.api->test(rreq, &rdone, NULL);
    if (src == FAB_OK && !sdone) src = s.api->test(sreq, &sdone, NULL);
    if (rrc != FAB_OK && src != FAB_OK) break;
    sched_yield();
  }
  int64_t detected_ms = ft_now_ms() - t0;
  /* A new send after the death (after the detection, where there is one;
   * without an old send its comm has yet to detect it: the whole window). */
  deadline = ft_now_ms() + (untagged ? window_ms : 1000);
  while (ft_now_ms() < deadline && nrc == FAB_OK && !ndone) {
    if (!nreq)
      nrc = s.api->isend(c.send_comm, sm.buf, 1 << 20, 13, sm.mh, NULL, &nreq);
    else
      nrc = s.api->test(nreq, &ndone, NULL);
    sched_yield();
  }
  ft_log_expect_warns(0);
  int dw = ft_log_warns() - w0;
  int errors = (rrc != FAB_OK) + (!untagged && src != FAB_OK) + (nrc != FAB_OK);
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

/* A send reported complete must reach the peer even when its sender shuts
 * down right after: NCCL may destroy a communicator as soon as its last sends
 * completed. On tcp a write used to complete once it was in the local socket;
 * closing the endpoint with unread bytes from the peer then reset the
 * connection, the bytes still queued were dropped, and the peer's receive
 * never completed (seen in dlopen_cycle under load). The same holds for a
 * large tagged message on tcp, which completes once it is in the socket.
 * Made certain here: the receiver does not progress for a while after
 * posting its receive, and meanwhile posts a second receive (whose
 * announcement, where buffers are announced, the sender never reads before it
 * closes) and sends the sender a message it never receives: unread bytes
 * either way. LEN: the largest message sent tagged on tcp by default. */
FT_PAIR_TEST(close_right_after_send, 60) {
  enum { LEN = 512 << 10, WAIT_MS = 10000 };
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_mr m;
  ft_mr_alloc(&s, &m, ft_role() == 0 ? c.send_comm : c.recv_comm, 2 * LEN);
  ft_sync(peer, "registered", T_MS);
  if (ft_role() == 0) {
    ft_fill(m.buf, LEN, 1801);
    void* req = ft_isend(&s, c.send_comm, m.buf, LEN, 1, m.mh, WAIT_MS);
    ft_wait(&s, req, NULL, WAIT_MS, "send");
    ft_phase("close without progress");
    usleep(300 * 1000); /* the second announcement arrives and stays unread */
    ft_close_all(&s, &c, 1);
    ft_side_close(&s);
    ft_sync(peer, "received", T_MS);
    return;
  }
  memset(m.buf, FT_POISON, 2 * LEN);
  void* d1 = m.buf;
  void* d2 = (char*)m.buf + LEN;
  size_t len = LEN;
  int tag1 = 1, tag2 = 2;
  void* r1 = ft_irecv(&s, c.recv_comm, 1, &d1, &len, &tag1, &m.mh, WAIT_MS);
  usleep(100 * 1000); /* the sender's write completes meanwhile */
  void* r2 = ft_irecv(&s, c.recv_comm, 1, &d2, &len, &tag2, &m.mh, WAIT_MS);
  (void)r2;
  ft_mr note;
  ft_mr_alloc(&s, &note, c.send_comm, 64);
  void* sq = ft_isend(&s, c.send_comm, note.buf, 8, 3, note.mh, WAIT_MS); /* never received */
  (void)sq;
  usleep(400 * 1000); /* the sender has closed */
  int size = -1;
  ft_wait(&s, r1, &size, WAIT_MS, "the receive of a send its sender saw complete before it closed");
  FT_CHECK(size == LEN, "received %d bytes of %d", size, (int)LEN);
  ft_verify_or_fail(m.buf, LEN, 1801, "the receive of a send its sender closed after");
  ft_sync(peer, "received", T_MS);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* Send comms closed with a send in flight that nobody receives: on shm each
 * has an endpoint of its own, kept until its send completes so the receiver
 * may still take it (issue 26 item 11: memory grew by one shared-memory region
 * per such close, for FABRIC_PEER_TIMEOUT_MS). At most FAB_RETIRING_MAX (8)
 * wait; beyond, the oldest closes with its send. The sender's regions are
 * counted after each close. Only shm gives send comms endpoints of their own. */
static void closed_with_sends_bounded_body(ft_peer* peer, void* arg) {
  enum { ROUNDS = 12, LEN = 1 << 20, MAX_REGIONS = 8 + 2 };
  setenv("FABRIC_PEER_TIMEOUT_MS", "120000", 1); /* nothing retires by time here */
  /* regions a dead process with our pid left behind (pids wrap at 32768 within a CI run, and a process
   * killed mid-test keeps its regions): not ours, not counted */
  int stale = ft_shm_count(getpid());
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  unsigned char handle[FAB_HANDLE_SIZE];
  if (ft_role() == FT_CHILD) {
    void* lc = NULL;
    void* rc[ROUNDS] = {0};
    int n = 0;
    FT_OK(s.api->listen(s.ctx, s.dev, handle, &lc));
    ft_send(peer, "handle", handle, sizeof handle);
    ft_phase("accept, never receive");
    while (!ft_peer_sent(peer, 0)) {
      void* dh = NULL;
      if (n < ROUNDS) FT_OK(s.api->accept(lc, &rc[n], &dh));
      if (n < ROUNDS && rc[n]) n++;
      if (n == ROUNDS) usleep(1000);
    }
    ft_recv(peer, "done", NULL, 0, T_MS);
    for (int i = 0; i < n; i++) FT_OK(s.api->close_recv(rc[i]));
    FT_OK(s.api->close_listen(lc));
    ft_side_close(&s);
    return;
  }
  ft_recv(peer, "handle", handle, sizeof handle, T_MS);
  int most = 0;
  for (int i = 0; i < ROUNDS; i++) {
    ft_phase("round %d: connect, send, close", i);
    void *sc = NULL, *dh = NULL;
    for (int64_t t0 = ft_now_ms(); !sc && ft_now_ms() - t0 < T_MS;)
      FT_OK(s.api->connect(s.ctx, s.dev, &s.config, handle, &sc, &dh));
    FT_CHECK(sc != NULL, "connect %d did not complete", i);
    ft_mr m;
    ft_mr_alloc(&s, &m, sc, LEN); /* the buffer is never freed: the provider may read it until the end */
    void* req = ft_isend(&s, sc, m.buf, LEN, 1, m.mh, T_MS);
    (void)req; /* never received: in flight at the close */
    FT_OK(s.api->dereg_mr(sc, m.mh));
    FT_OK(s.api->close_send(sc));
    int n = ft_shm_count(getpid()) - stale;
    if (n > most) most = n;
  }
  ft_send(peer, "done", NULL, 0);
  fprintf(stderr, "[closed_with_sends_bounded] at most %d shared-memory regions of this process (%d stale ones of "
          "an earlier process with its pid left out)\n", most, stale);
  FT_CHECK(most <= MAX_REGIONS, "this process held %d shared-memory regions after %d closes with a send in flight; at "
           "most %d expected (8 endpoints waiting for their sends, the device's own, one spare)", most, ROUNDS, MAX_REGIONS);
  ft_side_close(&s);
}

Test(functional, closed_with_sends_bounded, .init = ft_test_init, .timeout = 150) {
  if (!ft_provider_is("shm")) cr_skip_test("only shm gives send comms endpoints of their own");
  ft_run_pair("closed_with_sends_bounded", closed_with_sends_bounded_body, NULL, 120);
}
