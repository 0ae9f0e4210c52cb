/*
 * 6. Error paths. Each must return an error code and log a WARN; none may
 * crash or hang, and the plugin must keep working afterwards.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ft_criterion.h"

enum { T_MS = 30000, CONNECT_TIMEOUT_MS = 1500 };

/* Corrupted handles from the peer: the first connect with each fails with
 * exactly one WARN (the handle's checksum is checked before anything is
 * sent) and never yields a comm, the peer's accept never yields one either;
 * then clean handles still connect and move data. */
FT_PAIR_TEST(corrupt_handle, 60) {
  setenv("FABRIC_CONNECT_TIMEOUT_MS", "1500", 1);
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  void* lc = NULL;
  unsigned char handle[FAB_HANDLE_SIZE], theirs[FAB_HANDLE_SIZE];
  memset(handle, 0, sizeof handle);
  FT_OK(s.api->listen(s.ctx, s.dev, handle, &lc));
  ft_xchg(peer, "handle", handle, theirs, sizeof handle, T_MS);

  /* Gross corruption, then one flipped bit at a time across the bytes in
   * use (the header, 24 bytes, and the address whose length it gives: the
   * checksum covers them, fab_wire.h; what follows is not part of it). */
  enum { NGROSS = 4, NBIT = FAB_HANDLE_SIZE / 8, NV = NGROSS + NBIT };
  uint16_t alen;
  memcpy(&alen, theirs + 6, sizeof alen);
  int used = 24 + alen;
  FT_CHECK(used <= s.api->max_handle_size, "the handle uses %d bytes of %d", used, s.api->max_handle_size);
  unsigned char bad[NV][FAB_HANDLE_SIZE];
  char desc[NV][48] = {"every byte inverted", "all zero", "first 16 bytes inverted", "random bytes"};
  for (int k = 0; k < FAB_HANDLE_SIZE; k++) {
    bad[0][k] = (unsigned char)~theirs[k];
    bad[1][k] = 0;
    bad[2][k] = k < 16 ? (unsigned char)~theirs[k] : theirs[k];
    bad[3][k] = (unsigned char)(ft_seed(7, (uint64_t)k, 0) >> 13);
  }
  for (int v = NGROSS; v < NV; v++) {
    int off = ((v - NGROSS) * 8 + (v % 8)) % used, bit = v % 8;
    memcpy(bad[v], theirs, FAB_HANDLE_SIZE);
    bad[v][off] ^= (unsigned char)(1u << bit);
    snprintf(desc[v], sizeof desc[v], "bit %d of byte %d flipped", bit, off);
  }
  void* sc[NV];
  fab_result rc[NV];
  int failed[NV], calls[NV];
  memset(sc, 0, sizeof sc);
  memset(failed, 0, sizeof failed);
  memset(calls, 0, sizeof calls);
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  ft_phase("connect with corrupted handles");
  int64_t deadline = ft_now_ms() + CONNECT_TIMEOUT_MS + 10000;
  int left = NV;
  while (left > 0 && ft_now_ms() < deadline) {
    for (int v = 0; v < NV; v++) {
      if (failed[v]) continue;
      void* dh = NULL;
      rc[v] = s.api->connect(s.ctx, s.dev, &s.config, bad[v], &sc[v], &dh);
      calls[v]++;
      FT_CHECK(sc[v] == NULL, "connect with a corrupted handle (%s) returned a comm (rc %d)", desc[v], (int)rc[v]);
      if (rc[v] != FAB_OK) {
        failed[v] = 1;
        left--;
      }
    }
    if (ft_blocking(&s.lib)) continue; /* its accept would wait for a peer that never comes */
    void* rcomm = NULL;
    void* dh = NULL;
    fab_result arc = s.api->accept(lc, &rcomm, &dh);
    FT_CHECK(arc == FAB_OK, "accept failed (%d) while the peer tried corrupted handles", (int)arc);
    FT_CHECK(rcomm == NULL, "accept produced a comm from a peer that only sent corrupted handles");
  }
  ft_log_expect_warns(0);
  for (int v = 0; v < NV; v++) {
    FT_CHECK(failed[v], "connect with a corrupted handle (%s) neither failed nor connected within %d ms (the connect "
             "timeout is %d ms)", desc[v], CONNECT_TIMEOUT_MS + 10000, CONNECT_TIMEOUT_MS);
    FT_CHECK(calls[v] == 1, "connect with a corrupted handle (%s) failed only at call %d; the first must refuse it",
             desc[v], calls[v]);
  }
  int dw = ft_log_warns() - w0;
  FT_CHECK(dw == NV, "%d connects failed and %d WARN lines were logged (one each); last: %s", NV, dw,
           ft_log_last_warn());
  ft_sync(peer, "corrupt done", T_MS);
  FT_OK(s.api->close_listen(lc));

  /* Clean handles on fresh listen comms still work. */
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_exchange(&s, &c, 100003, 800, T_MS);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* The end of a refusal case: each side connects to the other's keep listen
 * comm and accepts the other's connect (rc: already accepted, or NULL), which makes the wait for the peer
 * one that progresses this side's endpoint. A side that stopped calling the
 * plugin (ft_sync) would answer nothing, and the peer's connects still on
 * their way to its closed listen comm would wait out their timeout. A side
 * has both comms only once the peer is past its own connects. */
static void meet_then_close(ft_side* s, void* keep, const unsigned char* their_keep, void* rc) {
  ft_phase("meet over the kept listen comms");
  void* sc = NULL;
  unsigned char peer_handle[FAB_HANDLE_SIZE];
  memcpy(peer_handle, their_keep, FAB_HANDLE_SIZE);
  int64_t t0 = ft_now_ms();
  while ((!sc || !rc) && ft_now_ms() - t0 < T_MS) {
    void* dh = NULL;
    if (!sc) FT_OK(s->api->connect(s->ctx, s->dev, &s->config, peer_handle, &sc, &dh));
    if (!rc && (sc || !ft_blocking(&s->lib))) FT_OK(s->api->accept(keep, &rc, &dh));
  }
  FT_CHECK(sc && rc, "the peer did not connect to the kept listen comm within %d ms (send comm %p, recv comm %p)",
           T_MS, sc, rc);
  for (int64_t t1 = ft_now_ms(); !ft_blocking(&s->lib) && ft_now_ms() - t1 < 200;) {
    void *extra = NULL, *dh = NULL;
    FT_OK(s->api->accept(keep, &extra, &dh));
    FT_CHECK(extra == NULL, "the kept listen comm accepted a second comm: a request for the closed one reached it");
  }
  FT_OK(s->api->close_send(sc));
  FT_OK(s->api->close_recv(rc));
  FT_OK(s->api->close_listen(keep));
}

/* A connect to a listen comm that was closed is refused: the connector fails
 * fast with ncclRemoteError and one WARN instead of waiting out
 * FABRIC_CONNECT_TIMEOUT_MS (120 s by default), and another listen comm of
 * the same endpoint gets nothing of it (meet_then_close). */
FT_PAIR_TEST(refused, 60) {
  enum { REFUSED_MS = 20000 };
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  void *keep = NULL, *gone = NULL;
  unsigned char keep_handle[FAB_HANDLE_SIZE], handle[FAB_HANDLE_SIZE], theirs[FAB_HANDLE_SIZE];
  unsigned char their_keep[FAB_HANDLE_SIZE];
  FT_OK(s.api->listen(s.ctx, s.dev, keep_handle, &keep)); /* the endpoint stays up */
  FT_OK(s.api->listen(s.ctx, s.dev, handle, &gone));
  FT_OK(s.api->close_listen(gone));
  ft_xchg(peer, "closed listen handle", handle, theirs, sizeof handle, T_MS);
  ft_xchg(peer, "kept listen handle", keep_handle, their_keep, sizeof keep_handle, T_MS);
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  ft_phase("connect to a closed listen comm");
  void *sc = NULL, *met = NULL;
  fab_result rc = FAB_OK;
  int64_t t0 = ft_now_ms();
  while (rc == FAB_OK && !sc && ft_now_ms() - t0 < REFUSED_MS) {
    void* dh = NULL;
    rc = s.api->connect(s.ctx, s.dev, &s.config, theirs, &sc, &dh);
    if (ft_blocking(&s.lib)) continue; /* a blocking connect progresses by itself; accept would wait */
    if (!met) FT_OK(s.api->accept(keep, &met, &dh)); /* keeps this side progressing; a comm here is the
                                                       * peer's, done with its connects (meet_then_close) */
  }
  ft_log_expect_warns(0);
  FT_CHECK(rc == FAB_ERR_REMOTE && sc == NULL,
           "connect to a closed listen comm: rc %d, comm %p after %lld ms; expected ncclRemoteError (%d) at once",
           (int)rc, sc, (long long)(ft_now_ms() - t0), (int)FAB_ERR_REMOTE);
  FT_CHECK(ft_log_warns() - w0 == 1, "%d WARN lines for one refusal; last: %s", ft_log_warns() - w0,
           ft_log_last_warn());
  meet_then_close(&s, keep, their_keep, met);
  ft_side_close(&s);
}

/* Many connects at once from each side to the other's closed listen comm:
 * every one is refused, none waits out FABRIC_CONNECT_TIMEOUT_MS. The
 * refusals leave the listener's endpoint back to back, more than shm's queue
 * to one peer takes at once, so a refusal the provider cannot take now
 * (-FI_EAGAIN) must be retried, not dropped: dropped, some connects here
 * waited out the whole connect timeout on shm in every run. */
FT_PAIR_TEST(refused_many, 90) {
  enum { K = 96, REFUSED_MS = 20000 };
  setenv("FABRIC_CONNECT_TIMEOUT_MS", "60000", 1);
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  void *keep = NULL, *gone = NULL;
  unsigned char keep_handle[FAB_HANDLE_SIZE], handle[FAB_HANDLE_SIZE], theirs[FAB_HANDLE_SIZE];
  unsigned char their_keep[FAB_HANDLE_SIZE];
  FT_OK(s.api->listen(s.ctx, s.dev, keep_handle, &keep));
  FT_OK(s.api->listen(s.ctx, s.dev, handle, &gone));
  FT_OK(s.api->close_listen(gone));
  ft_xchg(peer, "closed listen handle", handle, theirs, sizeof handle, T_MS);
  ft_xchg(peer, "kept listen handle", keep_handle, their_keep, sizeof keep_handle, T_MS);
  static unsigned char copies[K][FAB_HANDLE_SIZE]; /* one pending connect per handle buffer */
  for (int v = 0; v < K; v++) memcpy(copies[v], theirs, FAB_HANDLE_SIZE);
  fab_result rc[K];
  void *sc[K], *met = NULL;
  memset(sc, 0, sizeof sc);
  for (int v = 0; v < K; v++) rc[v] = FAB_OK;
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  ft_phase("many connects to a closed listen comm");
  int64_t t0 = ft_now_ms();
  for (int left = K; left > 0 && ft_now_ms() - t0 < REFUSED_MS;) {
    for (int v = 0; v < K; v++) {
      if (rc[v] != FAB_OK || sc[v]) continue;
      void* dh = NULL;
      rc[v] = s.api->connect(s.ctx, s.dev, &s.config, copies[v], &sc[v], &dh);
      if (rc[v] != FAB_OK || sc[v]) left--;
    }
    if (ft_blocking(&s.lib)) continue;
    void* dh = NULL;
    if (!met) FT_OK(s.api->accept(keep, &met, &dh)); /* keeps this side progressing (see refused) */
  }
  ft_log_expect_warns(0);
  for (int v = 0; v < K; v++)
    FT_CHECK(rc[v] == FAB_ERR_REMOTE && sc[v] == NULL,
             "connect %d of %d to a closed listen comm: rc %d, comm %p after %lld ms; expected ncclRemoteError (%d)",
             v, K, (int)rc[v], sc[v], (long long)(ft_now_ms() - t0), (int)FAB_ERR_REMOTE);
  FT_CHECK(ft_log_warns() - w0 == K, "%d WARN lines for %d refusals; last: %s", ft_log_warns() - w0, K,
           ft_log_last_warn());
  meet_then_close(&s, keep, their_keep, met);
  ft_side_close(&s);
}

/* NULL and out-of-range arguments on every entry point that takes them. */
FT_PAIR_TEST(bad_arguments, 60) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  const fab_api* a = s.api;
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, 4096);
  ft_mr_alloc(&s, &rm, c.recv_comm, 4096);
  void* req = NULL;
  void* d = rm.buf;
  void* null_data = NULL;
  size_t len = 64;
  int tag = 1;
  int done = 0;
  int sizes[FAB_MAX_RECVS];
  int max_recvs = s.props.max_recvs;

  ft_phase("bad arguments: listen/connect/accept");
  unsigned char h[FAB_HANDLE_SIZE];
  void* lc = NULL;
  FT_EXPECT_ERROR(a->listen(s.ctx, -1, h, &lc));
  FT_EXPECT_ERROR(a->listen(s.ctx, s.ndev, h, &lc));
  FT_EXPECT_ERROR(a->listen(s.ctx, s.dev, NULL, &lc));
  FT_EXPECT_ERROR(a->listen(s.ctx, s.dev, h, NULL));
  void* sc = NULL;
  void* dh = NULL;
  FT_EXPECT_ERROR(a->connect(s.ctx, s.dev, &s.config, NULL, &sc, &dh));
  FT_EXPECT_ERROR(a->connect(s.ctx, -1, &s.config, c.peer_handle, &sc, &dh));
  FT_EXPECT_ERROR(a->connect(s.ctx, s.dev, &s.config, c.peer_handle, NULL, &dh));
  FT_EXPECT_ERROR(a->accept(NULL, &sc, &dh));
  FT_EXPECT_ERROR(a->accept(c.listen_comm, NULL, &dh));

  ft_phase("bad arguments: regMr/deregMr");
  void* mh = NULL;
  FT_EXPECT_ERROR(a->reg_mr(NULL, sm.buf, 4096, FAB_PTR_HOST, &mh));
  FT_EXPECT_ERROR(a->reg_mr(c.send_comm, NULL, 4096, FAB_PTR_HOST, &mh));
  FT_EXPECT_ERROR(a->reg_mr(c.send_comm, sm.buf, 4096, 0, &mh));
  FT_EXPECT_ERROR(a->reg_mr(c.send_comm, sm.buf, 4096, 0x40, &mh));
  FT_EXPECT_ERROR(a->reg_mr(c.send_comm, sm.buf, 4096, FAB_PTR_HOST, NULL));
  FT_EXPECT_ERROR(a->dereg_mr(c.send_comm, NULL));
  /* Ranges no registration can cover: refused, not registered. */
  FT_EXPECT_ERROR(a->reg_mr(c.send_comm, sm.buf, SIZE_MAX, FAB_PTR_HOST, &mh));
  FT_EXPECT_ERROR(a->reg_mr(c.send_comm, sm.buf, SIZE_MAX - 4095, FAB_PTR_HOST, &mh));
  if (!ft_int_reg_size(&s.lib)) /* v6/v7 carry an int size: tested as negative above */
    FT_EXPECT_ERROR(a->reg_mr(c.recv_comm, (char*)sm.buf + 4096, UINTPTR_MAX - (uintptr_t)sm.buf, FAB_PTR_HOST,
                              &mh));

  ft_phase("bad arguments: isend");
  FT_EXPECT_ERROR(a->isend(NULL, sm.buf, 64, tag, sm.mh, NULL, &req));
  FT_EXPECT_ERROR(a->isend(c.send_comm, NULL, 64, tag, sm.mh, NULL, &req));
  FT_EXPECT_ERROR(a->isend(c.send_comm, sm.buf, 64, tag, sm.mh, NULL, NULL));
  FT_EXPECT_ERROR(a->isend(c.send_comm, sm.buf, 64, tag, NULL, NULL, &req)); /* no memory handle */

  ft_phase("bad arguments: irecv");
  FT_EXPECT_ERROR(a->irecv(NULL, 1, &d, &len, &tag, &rm.mh, NULL, &req));
  FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &null_data, &len, &tag, &rm.mh, NULL, &req));
  FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, &len, &tag, &rm.mh, NULL, NULL));
  {
    void* no_mh = NULL;
    FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, &len, &tag, &no_mh, NULL, &req)); /* no memory handle */
    FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, &len, &tag, NULL, NULL, &req));   /* no handle array */
  }
  if (!ft_single_recv(&s.lib)) { /* counts and arrays: a version with one buffer per receive has none */
  FT_EXPECT_ERROR(a->irecv(c.recv_comm, 0, &d, &len, &tag, &rm.mh, NULL, &req));
  FT_EXPECT_ERROR(a->irecv(c.recv_comm, -1, &d, &len, &tag, &rm.mh, NULL, &req));
  {
    /* n = maxRecvs + 1, with valid arrays that long. */
    void* dd[FAB_MAX_RECVS + 1];
    size_t ll[FAB_MAX_RECVS + 1];
    int tt[FAB_MAX_RECVS + 1];
    void* mm[FAB_MAX_RECVS + 1];
    for (int i = 0; i <= FAB_MAX_RECVS; i++) dd[i] = rm.buf, ll[i] = 8, tt[i] = 60 + i, mm[i] = rm.mh;
    FT_EXPECT_ERROR(a->irecv(c.recv_comm, max_recvs + 1, dd, ll, tt, mm, NULL, &req));
  }
  FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, NULL, &tag, &rm.mh, NULL, &req));
  FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, NULL, &len, &tag, &rm.mh, NULL, &req));
  }

  ft_phase("bad arguments: memory handles");
  {
    /* A buffer that runs past its registration. */
    FT_EXPECT_ERROR(a->isend(c.send_comm, (char*)sm.buf + 4096 - 10, 64, tag, sm.mh, NULL, &req));
    void* d2 = (char*)rm.buf + 4090;
    size_t l2 = 64;
    FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d2, &l2, &tag, &rm.mh, NULL, &req));
    /* A handle that was deregistered already. */
    void* stale = NULL;
    FT_OK(a->reg_mr(c.send_comm, sm.buf, 4096, FAB_PTR_HOST, &stale));
    /* resolved once (the comm remembers its last handle), refused for its range */
    FT_EXPECT_ERROR(a->isend(c.send_comm, (char*)sm.buf + 4096 - 10, 64, tag, stale, NULL, &req));
    FT_OK(a->dereg_mr(c.send_comm, stale));
    FT_EXPECT_ERROR(a->isend(c.send_comm, sm.buf, 64, tag, stale, NULL, &req));
    FT_EXPECT_ERROR(a->dereg_mr(c.send_comm, stale));
    /* A comm of the wrong kind. */
    FT_EXPECT_ERROR(a->isend(c.recv_comm, sm.buf, 64, tag, sm.mh, NULL, &req));
    FT_EXPECT_ERROR(a->irecv(c.send_comm, 1, &d, &len, &tag, &rm.mh, NULL, &req));
    FT_EXPECT_ERROR(a->accept(c.send_comm, &sc, &dh));
  }

  ft_phase("bad arguments: test");
  FT_EXPECT_ERROR(a->test(NULL, &done, sizes));
  {
    /* Pointers that were never requests are refused without being read: a
     * forged header (the right magic, "active", a wild kind and comm), an
     * unmapped page, an address beyond user space, a comm handle. */
    uint64_t forged[8] = {0x0000000151455246ull, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10};
    FT_EXPECT_ERROR(a->test(forged, &done, sizes));
    long page = sysconf(_SC_PAGESIZE);
    void* gone = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FT_CHECK(gone != MAP_FAILED, "mmap");
    munmap(gone, (size_t)page);
    FT_EXPECT_ERROR(a->test(gone, &done, sizes));
    FT_EXPECT_ERROR(a->test((void*)(uintptr_t)0xdead0000beef0000ull, &done, sizes));
    FT_EXPECT_ERROR(a->test(c.send_comm, &done, sizes));
  }

  /* After all that, the comms still carry data; test() with done == NULL is
   * rejected on a live request, which then completes normally. */
  ft_phase("bad arguments: traffic afterwards");
  ft_fill(sm.buf, 64, ft_seed(900, (uint64_t)ft_role(), 0));
  memset(rm.buf, FT_POISON, 4096);
  void* rreq = ft_irecv(&s, c.recv_comm, 1, &d, &len, &tag, &rm.mh, T_MS);
  void* sreq = ft_isend(&s, c.send_comm, sm.buf, 64, tag, sm.mh, T_MS);
  FT_EXPECT_ERROR(a->test(rreq, NULL, sizes));
  FT_EXPECT_ERROR(a->test((char*)rreq + 4, &done, sizes)); /* misaligned */
  FT_EXPECT_ERROR(a->test((char*)rreq + 8, &done, sizes)); /* inside a live request */
  void* reqs[2] = {rreq, sreq};
  int sz[2][FAB_MAX_RECVS];
  ft_wait_all(&s, reqs, 2, &sz[0][0], FAB_MAX_RECVS, T_MS, "traffic after bad arguments");
  FT_CHECK(sz[0][0] == 64, "received %d bytes", sz[0][0]);
  ft_verify_or_fail(rm.buf, 64, ft_seed(900, (uint64_t)(1 - ft_role()), 0), "receive after bad arguments");
  ft_check_poison((char*)rm.buf + 64, 4096 - 64, "receive after bad arguments");

  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_sync(peer, "bad args done", T_MS);

  ft_phase("bad arguments: close");
  FT_EXPECT_ERROR(a->close_send(NULL));
  FT_EXPECT_ERROR(a->close_recv(NULL));
  FT_EXPECT_ERROR(a->close_listen(NULL));
  FT_EXPECT_ERROR(a->close_send(c.recv_comm));
  FT_EXPECT_ERROR(a->close_listen(c.send_comm));
  ft_conn old = c;
  ft_close_all(&s, &c, 1);
  /* Handles of closed comms: every use is an error, never a use-after-free. */
  FT_EXPECT_ERROR(a->close_send(old.send_comm));
  FT_EXPECT_ERROR(a->close_recv(old.recv_comm));
  FT_EXPECT_ERROR(a->close_listen(old.listen_comm));
  {
    char b[64];
    void* r2 = NULL;
    void* db = b;
    size_t l2 = sizeof b;
    FT_EXPECT_ERROR(a->isend(old.send_comm, b, sizeof b, tag, NULL, NULL, &r2));
    FT_EXPECT_ERROR(a->irecv(old.recv_comm, 1, &db, &l2, &tag, NULL, NULL, &r2));
    void* mh2 = NULL;
    FT_EXPECT_ERROR(a->reg_mr(old.send_comm, b, sizeof b, FAB_PTR_HOST, &mh2));
    void* rc2 = NULL;
    FT_EXPECT_ERROR(a->accept(old.listen_comm, &rc2, &dh));
  }
  ft_side_close(&s);
}

/* Sizes the version cannot carry. v6..v8 (int sizes): a size_t above INT_MAX
 * reaches the plugin as a negative int and must be rejected. v9+ and the core
 * (size_t): a size above maxP2pBytes must be rejected. */
FT_PAIR_TEST(oversize, 60) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  const fab_api* a = s.api;
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  void* req = NULL;
  int tag = 4;
  if (ft_int_sizes(&s.lib)) {
    FT_CHECK(a->size_is_int == 1, "the %s driver does not say its sizes are int", s.lib.desc);
    ft_mr sm, rm;
    ft_mr_alloc(&s, &sm, c.send_comm, 4096);
    ft_mr_alloc(&s, &rm, c.recv_comm, 4096);
    const size_t bad[] = {(size_t)INT_MAX + 1, (size_t)UINT_MAX, (size_t)UINT_MAX - 4095};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
      ft_phase("oversize int: %zu", bad[i]);
      FT_EXPECT_ERROR(a->isend(c.send_comm, sm.buf, bad[i], tag, sm.mh, NULL, &req));
      void* d = rm.buf;
      size_t l = bad[i];
      FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, &l, &tag, &rm.mh, NULL, &req));
      if (ft_int_reg_size(&s.lib)) {
        void* mh = NULL;
        FT_EXPECT_ERROR(a->reg_mr(c.send_comm, sm.buf, bad[i], FAB_PTR_HOST, &mh));
      }
    }
    ft_mr_free(&s, &sm);
    ft_mr_free(&s, &rm);
  } else {
    size_t maxp = s.props.max_p2p_bytes;
    FT_CHECK(maxp > 0, "maxP2pBytes is 0");
    /* Address space only: the plugin must refuse before touching it. */
    size_t map = (maxp + 1 + 4095) & ~(size_t)4095;
    void* big = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    FT_CHECK(big != MAP_FAILED, "mmap of %zu bytes failed", map);
    void *smh = NULL, *rmh = NULL;
    FT_OK(a->reg_mr(c.send_comm, big, map, FAB_PTR_HOST, &smh));
    FT_OK(a->reg_mr(c.recv_comm, big, map, FAB_PTR_HOST, &rmh));
    ft_phase("oversize: %zu > maxP2pBytes %zu", maxp + 1, maxp);
    FT_EXPECT_ERROR(a->isend(c.send_comm, big, maxp + 1, tag, smh, NULL, &req));
    void* d = big;
    size_t l = maxp + 1;
    FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, &l, &tag, &rmh, NULL, &req));
    l = (size_t)INT_MAX + 1;
    if (l > maxp) FT_EXPECT_ERROR(a->irecv(c.recv_comm, 1, &d, &l, &tag, &rmh, NULL, &req));
    FT_OK(a->dereg_mr(c.send_comm, smh));
    FT_OK(a->dereg_mr(c.recv_comm, rmh));
    munmap(big, map);
  }
  /* Still works. */
  ft_exchange(&s, &c, 5000, 1000, T_MS);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* A send larger than the matching receive: an error at test() of the receive
 * (the send may fail too), one WARN per failed call, never a silent
 * truncation, never a write past the receive buffer.
 *
 * strict (truncation_error_code): the side that reports the mismatch says
 * ncclInvalidUsage, as docs/abi-facts.md §2 asks for size mismatches and as the
 * engine maps FI_ETRUNC (whatever sign the provider gives it: shm reports
 * -FI_ETRUNC; the endpoint normalises it, core/fabric/fab_endpoint.c). */
static void send_larger_body(ft_peer* peer, int strict, int RLEN, int SLEN) {
  enum { GUARD = 4096 };
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, SLEN);
  ft_mr_alloc(&s, &rm, c.recv_comm, RLEN + GUARD);
  memset(rm.buf, FT_POISON, RLEN + GUARD);
  ft_fill(sm.buf, SLEN, ft_seed(1100, (uint64_t)ft_role(), 0));
  int tag = 5;
  size_t rlen = RLEN;
  void* d = rm.buf;
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  void* rreq = ft_irecv(&s, c.recv_comm, 1, &d, &rlen, &tag, &rm.mh, T_MS);
  void* sreq = ft_isend(&s, c.send_comm, sm.buf, SLEN, tag, sm.mh, T_MS);
  ft_phase("oversize send: polling");
  int rdone = 0, sdone = 0, sizes[FAB_MAX_RECVS];
  fab_result rrc = FAB_OK, src = FAB_OK;
  int64_t deadline = ft_now_ms() + 5000;
  while (ft_now_ms() < deadline && (rrc == FAB_OK && !rdone)) {
    if (rrc == FAB_OK && !rdone) rrc = s.api->test(rreq, &rdone, sizes);
    if (src == FAB_OK && !sdone) src = s.api->test(sreq, &sdone, NULL);
    sched_yield();
  }
  /* Give the send side a moment to see its error too. */
  deadline = ft_now_ms() + 2000;
  while (ft_now_ms() < deadline && src == FAB_OK && !sdone) {
    src = s.api->test(sreq, &sdone, NULL);
    sched_yield();
  }
  ft_log_expect_warns(0);
  fprintf(stderr, "[send_larger_than_recv %s %s] receive: rc %d done %d; send: rc %d done %d\n", s.lib.desc,
          ft_role_name(), (int)rrc, rdone, (int)src, sdone);
  FT_CHECK(!(rrc == FAB_OK && rdone),
           "SILENT TRUNCATION: a %d-byte send into a %d-byte receive completed successfully (reported size %d)", SLEN,
           RLEN, sizes[0]);
  FT_CHECK(rrc != FAB_OK, "the receive of a %d-byte message into %d bytes did not fail (rc %d, done %d; the send: "
           "rc %d, done %d): the receiver must report the mismatch", SLEN, RLEN, (int)rrc, rdone, (int)src, sdone);
  int failed_calls = (rrc != FAB_OK) + (src != FAB_OK);
  FT_CHECK(ft_log_warns() - w0 == failed_calls, "%d calls failed and %d WARN lines were logged (one each); last: %s",
           failed_calls, ft_log_warns() - w0, ft_log_last_warn());
  ft_check_poison((char*)rm.buf + RLEN, GUARD, "truncated receive guard");
  if (strict) {
    FT_CHECK((rrc == FAB_OK || rrc == FAB_ERR_INVALID_USAGE) && (src == FAB_OK || src == FAB_ERR_INVALID_USAGE),
             "a %d-byte send into a %d-byte receive failed with receive rc %d / send rc %d; a size mismatch is "
             "ncclInvalidUsage (%d): is FI_ETRUNC (or -FI_ETRUNC, as shm reports it) still mapped to it? last WARN: %s",
             SLEN, RLEN, (int)rrc, (int)src, (int)FAB_ERR_INVALID_USAGE, ft_log_last_warn());
  }
  ft_sync(peer, "mismatch seen", T_MS);
  /* Hardening 8: after a truncation the receiving comm is failed, the same on
   * every provider and transport (tcp;ofi_rxm's sendrecv path resets the
   * connection under it, and the next message was lost): the next call on it
   * returns the error with one WARN. */
  void* again = NULL;
  int w1 = ft_log_warns();
  ft_log_expect_warns(1);
  fab_result arc = s.api->irecv(c.recv_comm, 1, &d, &rlen, &tag, &rm.mh, NULL, &again);
  ft_log_expect_warns(0);
  FT_CHECK(arc == FAB_ERR_INVALID_USAGE && again == NULL,
           "irecv on a comm that saw a truncation returned %d (request %p), expected the failure (%d)", (int)arc, again,
           (int)FAB_ERR_INVALID_USAGE);
  FT_CHECK(ft_log_warns() - w1 == 1, "the refused irecv logged %d WARN lines, expected 1", ft_log_warns() - w1);
  /* The sending comm is failed too (issue 26 item 8): on sendrecv its send
   * may have completed, and the receiver's notice fails it once this side has
   * read it (accept polls the endpoint the send comm shares). A blocking
   * accept (Neuron v4) cannot poll. */
  if (!ft_blocking(&s.lib)) {
    for (int64_t t1 = ft_now_ms(); ft_now_ms() - t1 < 300;) {
      void *none = NULL, *dh = NULL;
      FT_OK(s.api->accept(c.listen_comm, &none, &dh));
    }
    w1 = ft_log_warns();
    ft_log_expect_warns(1);
    arc = s.api->isend(c.send_comm, sm.buf, 8, tag, sm.mh, NULL, &again);
    ft_log_expect_warns(0);
    FT_CHECK(arc == FAB_ERR_INVALID_USAGE && again == NULL,
             "isend on a comm whose receiver saw a truncation returned %d (request %p), expected the failure (%d)",
             (int)arc, again, (int)FAB_ERR_INVALID_USAGE);
    FT_CHECK(ft_log_warns() - w1 == 1, "the refused isend logged %d WARN lines, expected 1", ft_log_warns() - w1);
  }
  /* The comms are in error: NCCL deregisters, then closes; both must be clean. */
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* A truncation on one connection costs no other (issue 26 item 8): on
 * tcp;ofi_rxm a message larger than its receive made the provider reset its
 * connection between the two processes, which every comm between them shares;
 * messages on another comm were lost while their sender was told they
 * succeeded. Comm 0 gets 8 KiB sent into 4 KiB (both ways, eager size on
 * rxm), then comm 1 exchanges eager and rendezvous sizes, every byte checked. */
FT_PAIR_TEST(truncation_bystander, 60) {
  enum { RLEN = 4096, SLEN = 8192, GUARD = 4096 };
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c[2];
  ft_connect_all(&s, c, 2, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c[0].send_comm, SLEN);
  ft_mr_alloc(&s, &rm, c[0].recv_comm, RLEN + GUARD);
  memset(rm.buf, FT_POISON, RLEN + GUARD);
  int tag = 9;
  size_t rlen = RLEN;
  void* d = rm.buf;
  ft_log_expect_warns(1);
  void* rreq = ft_irecv(&s, c[0].recv_comm, 1, &d, &rlen, &tag, &rm.mh, T_MS);
  void* sreq = ft_isend(&s, c[0].send_comm, sm.buf, SLEN, tag, sm.mh, T_MS);
  ft_phase("truncation on comm 0");
  int rdone = 0, sdone = 0;
  fab_result rrc = FAB_OK, src = FAB_OK;
  for (int64_t t0 = ft_now_ms(); ft_now_ms() - t0 < 5000 && (rrc == FAB_OK && !rdone);) {
    rrc = s.api->test(rreq, &rdone, NULL);
    if (src == FAB_OK && !sdone) src = s.api->test(sreq, &sdone, NULL);
  }
  FT_CHECK(rrc == FAB_ERR_INVALID_USAGE, "the truncated receive on comm 0 returned %d (done %d), expected %d", (int)rrc,
           rdone, (int)FAB_ERR_INVALID_USAGE);
  ft_check_poison((char*)rm.buf + RLEN, GUARD, "truncated receive guard");
  ft_sync(peer, "truncated", T_MS);
  ft_log_expect_warns(0);
  ft_phase("exchanges on comm 1");
  const size_t sizes[] = {64, 8192, 1 << 20};
  for (int i = 0; i < 3; i++) ft_exchange(&s, &c[1], sizes[i], 4000 + (uint64_t)i, T_MS);
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_close_all(&s, c, 2);
  ft_side_close(&s);
}

FT_PAIR_TEST(send_larger_than_recv, 60) { send_larger_body(peer, 0, 1000, 2000); }
FT_PAIR_TEST(truncation_error_code, 60) { send_larger_body(peer, 1, 1000, 2000); }
FT_PAIR_TEST(truncation_small, 60) { send_larger_body(peer, 1, 50, 100); }
FT_PAIR_TEST(truncation_large, 60) { send_larger_body(peer, 1, 4096, 8192); }
/* Hardening 7: the other sizes of the report (64M into 1M; shm copies these by
 * CMA), on every provider and transport. */
FT_PAIR_TEST(truncation_huge, 60) { send_larger_body(peer, 1, 1 << 20, 64 << 20); }

/* rdma transport: a send waiting for its receive's announcement whose buffer
 * is deregistered meanwhile is refused with an error when the announcement
 * comes, never written from the closed registration (libfabric 2.x's shm
 * dereferences a closed one's descriptor and crashes). Both ranks at once. */
static void dereg_waiting_send_body(ft_peer* peer, void* arg) {
  enum { LEN = 8 << 20 }; /* above FABRIC_TAGGED_MAX's largest value (4 MiB): it waits for its announcement */
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, LEN);
  ft_mr_alloc(&s, &rm, c.recv_comm, LEN);
  ft_fill(sm.buf, LEN, ft_seed(1200, (uint64_t)ft_role(), 0));
  int tag = 9;
  void* sreq = ft_isend(&s, c.send_comm, sm.buf, LEN, tag, sm.mh, T_MS);
  ft_sync(peer, "sends waiting", T_MS); /* neither rank has posted its receive */
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  FT_OK(s.api->dereg_mr(c.send_comm, sm.mh)); /* WARNs: it backs a waiting send */
  sm.mh = NULL;
  ft_sync(peer, "deregistered", T_MS);
  size_t rlen = LEN;
  void* d = rm.buf;
  void* rreq = ft_irecv(&s, c.recv_comm, 1, &d, &rlen, &tag, &rm.mh, T_MS);
  int done = 0;
  fab_result rc = ft_test_until(&s, sreq, NULL, 5000, &done);
  ft_log_expect_warns(0);
  FT_CHECK(rc == FAB_ERR_INVALID_USAGE,
           "a send whose buffer was deregistered while it waited returned %d (done %d); expected ncclInvalidUsage "
           "(%d): it must not be written from a closed registration", (int)rc, done, (int)FAB_ERR_INVALID_USAGE);
  FT_CHECK(ft_log_warns() - w0 == 2, "%d WARN lines for the deregistration and the refused send, expected 2 (last: "
           "%s)", ft_log_warns() - w0, ft_log_last_warn());
  FT_CHECK(strstr(ft_log_last_warn(), "deregistered before the send") != NULL, "the refusal says: %s",
           ft_log_last_warn());
  /* Issue 26 item 7: the receive posted for it must not wait for ever: the
   * sender's plugin tells it the message was given up. */
  ft_log_expect_warns(1);
  rc = ft_test_until(&s, rreq, NULL, 5000, &done);
  ft_log_expect_warns(0);
  FT_CHECK(rc == FAB_ERR_REMOTE, "the receive for a send given up by its sender returned %d (done %d); expected "
           "ncclRemoteError (%d) within 5 s", (int)rc, done, (int)FAB_ERR_REMOTE);
  FT_CHECK(strstr(ft_log_last_warn(), "gave its message up") != NULL, "the failed receive says: %s",
           ft_log_last_warn());
  ft_sync(peer, "refused", T_MS);
  ft_log_expect_warns(1);
  ft_close_all(&s, &c, 1);
  ft_mr_free(&s, &rm);
  ft_mr_free(&s, &sm);
  ft_log_expect_warns(0);
  ft_side_close(&s);
}

Test(functional, dereg_waiting_send, .init = ft_test_init, .timeout = 90) {
  const char* tp = getenv("FABRIC_TRANSPORT");
  if (!tp || strcmp(tp, "rdma") != 0) cr_skip_test("only the rdma transport keeps sends waiting for their receive");
  ft_run_pair("dereg_waiting_send", dereg_waiting_send_body, NULL, 60);
}

/* Close with requests in flight: receives that will never match, sends the
 * peer never receives; close every comm; no crash, no leak, no hang. */
FT_PAIR_TEST(close_inflight, 60) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c[2];
  ft_connect_all(&s, c, 2, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c[0].send_comm, (size_t)4 << 20);
  ft_mr_alloc(&s, &rm, c[0].recv_comm, (size_t)4 << 20);
  ft_fill(sm.buf, (size_t)4 << 20, 1);
  ft_phase("close in flight: post");
  /* On comm 1: a grouped receive of which only the first buffer is ever
   * matched (the peer sends that one and waits until it is sent). This comes
   * first: comm_independence covers sends behind unmatched ones. */
  int n = s.props.max_recvs < 3 ? s.props.max_recvs : 3;
  ft_mr rm1;
  ft_mr_alloc(&s, &rm1, c[1].recv_comm, 3 * 4096);
  {
    void* gd[3];
    size_t gl[3] = {4096, 4096, 4096};
    int gt[3] = {80, 81, 82};
    void* gm[3];
    for (int i = 0; i < 3; i++) gd[i] = (char*)rm1.buf + (size_t)i * 4096, gm[i] = rm1.mh;
    (void)ft_irecv(&s, c[1].recv_comm, n, gd, gl, gt, gm, T_MS);
  }
  ft_mr sm1;
  ft_mr_alloc(&s, &sm1, c[1].send_comm, 4096);
  void* sreq = ft_isend(&s, c[1].send_comm, sm1.buf, 4096, 80, sm1.mh, T_MS);
  ft_wait(&s, sreq, NULL, T_MS, "the one send a grouped receive gets");
  /* Where writes complete on delivery (tcp: the peer's provider acknowledges
   * them as it progresses), the peer's send may still wait for this side to
   * progress: one exchange on the same comms before this side goes quiet. */
  ft_exchange(&s, &c[1], 64, 1460, T_MS);
  for (int k = 0; k < 4; k++) {
    int tag = 70 + k;
    size_t len = (size_t)1 << 20;
    void* d = (char*)rm.buf + (size_t)k * len;
    (void)ft_irecv(&s, c[0].recv_comm, 1, &d, &len, &tag, &rm.mh, T_MS);
  }
  /* Small and large sends to tags the peer never posts. Some protocols
   * cannot post a send before the receiver asks: then isend returns no
   * request, which is fine here. */
  for (int k = 0; k < 4; k++) {
    void* req = NULL;
    size_t len = k < 2 ? 16 : (size_t)1 << 20;
    FT_OK(s.api->isend(c[0].send_comm, (char*)sm.buf + (size_t)k * ((size_t)1 << 20), len, 90 + k, sm.mh, NULL,
                       &req));
  }
  /* Give the requests a chance to get going, without completing anything. */
  int64_t until = ft_now_ms() + 100;
  while (ft_now_ms() < until) sched_yield();
  ft_sync(peer, "posted", T_MS);
  ft_phase("close in flight: closing");
  /* NCCL's proxy deregisters, then closes, with whatever is in flight. A
   * deregMr refused because of in-flight requests is acceptable (the close
   * must then release it); the buffers stay alive until after the close. */
  ft_mr_free(&s, &sm1); /* its send completed */
  fab_result d1 = s.api->dereg_mr(sm.comm, sm.mh);
  fab_result d2 = s.api->dereg_mr(rm.comm, rm.mh);
  fab_result d3 = s.api->dereg_mr(rm1.comm, rm1.mh);
  if (d3 != FAB_OK) fprintf(stderr, "[close_inflight %s] deregMr of a partly received buffer returned %d\n",
                            ft_role_name(), (int)d3);
  if (d1 != FAB_OK || d2 != FAB_OK)
    fprintf(stderr, "[close_inflight %s] deregMr with requests in flight returned %d/%d\n", ft_role_name(), (int)d1,
            (int)d2);
  int w0 = ft_log_warns();
  ft_close_all(&s, c, 2);
  ft_sync(peer, "closed", T_MS);
  ft_side_close(&s); /* the provider may touch the buffers until the endpoint is gone */
  /* One exception: with sendrecv the provider took the 1 MiB sends (a
   * rendezvous it cannot take back) and may still read their buffers after
   * close: closeSend waits for them, then says so in one WARN. */
  const char* tp = getenv("FABRIC_TRANSPORT");
  int sendrecv = tp && strcmp(tp, "sendrecv") == 0;
  int warns = ft_log_warns() - w0;
  FT_CHECK(warns == 0 || (sendrecv && warns == 1 && strstr(ft_log_last_warn(), "closeSend: sends to")),
           "closing and finalizing with requests in flight logged %d WARN lines; last: %s", warns,
           ft_log_last_warn());
  ft_free(sm.buf, sm.len);
  ft_free(rm.buf, rm.len);
  ft_free(rm1.buf, rm1.len);
}

/* A handle from a plugin on another provider (the child runs shm when the
 * parent runs tcp and the other way round): connect refuses it with a WARN
 * on both sides (the handle names its provider: fab_wire.h). */
static void foreign_handle_body(ft_peer* peer, void* arg) {
  if (peer->role == FT_CHILD) {
    int tcp = ft_provider_is("tcp");
    setenv("FI_PROVIDER", tcp ? "shm" : "tcp", 1);
    setenv("FABRIC_PROVIDER", tcp ? "shm" : "tcp", 1);
    setenv("FI_TCP_IFACE", "lo", 1);
  }
  setenv("FABRIC_CONNECT_TIMEOUT_MS", "1500", 1);
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  void* lc = NULL;
  unsigned char handle[FAB_HANDLE_SIZE], theirs[FAB_HANDLE_SIZE];
  FT_OK(s.api->listen(s.ctx, s.dev, handle, &lc));
  ft_xchg(peer, "handle", handle, theirs, sizeof handle, T_MS);
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  void* sc = NULL;
  fab_result rc = FAB_OK;
  int64_t deadline = ft_now_ms() + CONNECT_TIMEOUT_MS + 10000;
  while (rc == FAB_OK && ft_now_ms() < deadline) {
    void* dh = NULL;
    rc = s.api->connect(s.ctx, s.dev, &s.config, theirs, &sc, &dh);
    FT_CHECK(sc == NULL, "connect accepted a handle written by a plugin on another provider");
    if (ft_blocking(&s.lib)) continue; /* its accept would wait for a peer that never comes */
    void* rcomm = NULL;
    FT_OK(s.api->accept(lc, &rcomm, &dh));
    FT_CHECK(rcomm == NULL, "accept produced a comm for a peer on another provider");
  }
  ft_log_expect_warns(0);
  FT_CHECK(rc != FAB_OK, "connect with a handle from another provider neither failed nor connected");
  FT_CHECK(ft_log_warns() > w0, "the refused handle was not logged as a WARN");
  ft_sync(peer, "foreign done", T_MS);
  FT_OK(s.api->close_listen(lc));
  ft_side_close(&s);
}

Test(functional, foreign_handle, .init = ft_test_init, .timeout = 60) {
  if (!ft_provider_is("tcp") && !ft_provider_is("shm")) cr_skip_test("needs FI_PROVIDER tcp or shm");
  ft_run_pair("foreign_handle", foreign_handle_body, NULL, 40);
}

/* Hardening 12, aws-ofi-nccl's inflight_close: the receiver deregisters and
 * closes while the peer's large messages are landing in its posted buffers,
 * then unmaps them at once. close must not return while the provider can
 * still write into them (tcp;ofi_rxm cannot cancel a receive it has matched:
 * it wrote on into the freed memory, and the next progress faulted), and the
 * connection must stay usable for the other comms (a write into a
 * deregistered buffer must not take it down). */
enum { CTF_N = 8, CTF_LEN = 16 << 20 };

static void close_then_free_receiver(ft_side* s, ft_conn* c) {
  void* bufs[CTF_N];
  void* mhs[CTF_N];
  void* reqs[CTF_N];
  for (int i = 0; i < CTF_N; i++) {
    bufs[i] = mmap(NULL, CTF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FT_CHECK(bufs[i] != MAP_FAILED, "mmap of a receive buffer failed");
    FT_OK(s->api->reg_mr(c[0].recv_comm, bufs[i], CTF_LEN, FAB_PTR_HOST, &mhs[i]));
    size_t len = CTF_LEN;
    int tag = i;
    reqs[i] = ft_irecv(s, c[0].recv_comm, 1, &bufs[i], &len, &tag, &mhs[i], T_MS);
  }
  ft_sync(s->peer, "posted", T_MS);
  ft_sync(s->peer, "sending", T_MS);
  /* The first message in: the provider has seen and matched the others, whose data is on its way. */
  ft_wait(s, reqs[0], NULL, T_MS, "the first message");
  ft_phase("deregister, close and unmap while the data lands");
  int w0 = ft_log_warns();
  for (int i = 0; i < CTF_N; i++) FT_OK(s->api->dereg_mr(c[0].recv_comm, mhs[i]));
  FT_OK(s->api->close_recv(c[0].recv_comm));
  c[0].recv_comm = NULL;
  FT_CHECK(ft_log_warns() == w0, "deregistering and closing while the peer's data landed logged %d WARN lines; "
           "last: %s", ft_log_warns() - w0, ft_log_last_warn());
  for (int i = 0; i < CTF_N; i++) munmap(bufs[i], CTF_LEN); /* a late write now faults */
}

static void close_then_free_sender(ft_side* s, ft_conn* c) {
  ft_mr sm;
  ft_mr_alloc(s, &sm, c[0].send_comm, CTF_LEN);
  ft_fill(sm.buf, CTF_LEN, 12);
  ft_sync(s->peer, "posted", T_MS);
  void* req[CTF_N];
  for (int i = 0; i < CTF_N; i++) req[i] = ft_isend(s, c[0].send_comm, sm.buf, CTF_LEN, i, sm.mh, T_MS);
  ft_sync(s->peer, "sending", T_MS);
  /* The receiver may close before every message went: a send then
   * completes, fails, or stays pending; none may crash or hang. */
  int64_t until = ft_now_ms() + 3000;
  ft_log_expect_warns(1);
  for (int i = 0; i < CTF_N && ft_now_ms() < until; i++) {
    int done = 0;
    while (!done && ft_now_ms() < until && req[i])
      if (s->api->test(req[i], &done, NULL) != FAB_OK) req[i] = NULL;
  }
  ft_log_expect_warns(0);
  ft_sync(s->peer, "closed", T_MS);
  FT_OK(s->api->dereg_mr(sm.comm, sm.mh));
  FT_OK(s->api->close_send(c[0].send_comm));
  c[0].send_comm = NULL;
  ft_free(sm.buf, sm.len);
}

FT_PAIR_TEST(close_then_free, 90) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c[2];
  ft_connect_all(&s, c, 2, T_MS);
  if (peer->role == FT_PARENT) {
    close_then_free_receiver(&s, c);
    ft_sync(peer, "closed", T_MS);
    FT_OK(s.api->close_send(c[0].send_comm));
    c[0].send_comm = NULL;
  } else {
    close_then_free_sender(&s, c);
    FT_OK(s.api->close_recv(c[0].recv_comm));
    c[0].recv_comm = NULL;
  }
  ft_phase("the other comm after the close");
  ft_exchange(&s, &c[1], (size_t)4 << 20, 1200, T_MS); /* progress that would hit a late write */
  ft_exchange(&s, &c[1], 100, 1201, T_MS);
  ft_close_all(&s, c, 2);
  ft_side_close(&s);
}

/* Issue 26 item 7: the sender deregisters, closes and unmaps in the middle
 * of a 16 MiB message. The receive must end (complete with the right bytes,
 * or fail with one WARN) within a bound, never stay pending, and the other
 * comm between the two processes must go on working. */
enum { SCM_LEN = 16 << 20 };

FT_PAIR_TEST(sender_closes_mid_message, 90) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c[2];
  ft_connect_all(&s, c, 2, T_MS);
  if (peer->role == FT_PARENT) { /* receiver */
    ft_mr rm;
    ft_mr_alloc(&s, &rm, c[0].recv_comm, SCM_LEN);
    size_t len = SCM_LEN;
    int tag = 3;
    void* d = rm.buf;
    void* rreq = ft_irecv(&s, c[0].recv_comm, 1, &d, &len, &tag, &rm.mh, T_MS);
    ft_sync(peer, "posted", T_MS);
    int done = 0, got = -1;
    ft_log_expect_warns(1);
    int64_t t0 = ft_now_ms();
    fab_result rc = ft_test_until(&s, rreq, &got, 20000, &done);
    ft_log_expect_warns(0);
    FT_CHECK(rc != FAB_OK || done, "the receive was still pending %d ms after its sender closed mid-message",
             (int)(ft_now_ms() - t0));
    if (rc == FAB_OK) {
      FT_CHECK(got == SCM_LEN, "received %d bytes, expected %d", got, SCM_LEN);
      ft_verify_or_fail(rm.buf, SCM_LEN, 1300, "a message whose sender closed mid-way");
    }
    ft_sync(peer, "ended", T_MS);
    ft_log_expect_warns(1);
    FT_OK(s.api->close_recv(c[0].recv_comm));
    ft_log_expect_warns(0);
    c[0].recv_comm = NULL;
    ft_mr_free(&s, &rm);
  } else { /* sender */
    void* buf = mmap(NULL, SCM_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FT_CHECK(buf != MAP_FAILED, "mmap");
    ft_fill(buf, SCM_LEN, 1300);
    void* mh = NULL;
    FT_OK(s.api->reg_mr(c[0].send_comm, buf, SCM_LEN, FAB_PTR_HOST, &mh));
    ft_sync(peer, "posted", T_MS);
    void* sreq = ft_isend(&s, c[0].send_comm, buf, SCM_LEN, 3, mh, T_MS);
    int done = 0;
    int64_t until = ft_now_ms() + 2;
    while (!done && ft_now_ms() < until && s.api->test(sreq, &done, NULL) == FAB_OK) {}
    ft_log_expect_warns(1);
    FT_OK(s.api->dereg_mr(c[0].send_comm, mh));
    FT_OK(s.api->close_send(c[0].send_comm));
    ft_log_expect_warns(0);
    c[0].send_comm = NULL;
    munmap(buf, SCM_LEN); /* the provider must be done reading it */
    ft_sync(peer, "ended", T_MS);
  }
  ft_exchange(&s, &c[1], (size_t)4 << 20, 1301, T_MS);
  ft_close_all(&s, c, 2);
  ft_side_close(&s);
}
