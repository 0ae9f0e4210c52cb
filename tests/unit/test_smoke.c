/*
 * Two-process smoke tests through fab_api_core over tcp;ofi_rxm (lo) and shm:
 * both processes run the same body, each with a send comm to the other and a
 * recv comm from it, and the 128-byte handles go through a pipe.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unit_util.h"

#define PAIR_TEST(name, timeout_s)                                    \
  static void name##_body(const char* prov);                          \
  Test(smoke_tcp, name, .timeout = timeout_s) { name##_body("tcp"); } \
  Test(smoke_shm, name, .timeout = timeout_s) { name##_body("shm"); } \
  static void name##_body(const char* prov)

enum { WAIT_MS = 30000 };

static uint64_t seed_of(int role, size_t size, int i) { return (uint64_t)role * 1000003u + size * 31u + (uint64_t)i; }

/* Sends one message each way of every size and verifies every byte. */
PAIR_TEST(sizes, 120) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  const size_t sizes[] = {0, 1, 7, 4097, 65537, 4u << 20};
  size_t max = 4u << 20;
  char* sb = malloc(max);
  char* rb = malloc(max + 64);
  void *smh, *rmh;
  UT_OK(s.api->reg_mr(s.send_comm, sb, max, FAB_PTR_HOST, &smh));
  UT_OK(s.api->reg_mr(s.recv_comm, rb, max + 64, FAB_PTR_HOST, &rmh));
  for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
    size_t sz = sizes[k];
    ut_fill(sb, sz, seed_of(p.role, sz, 0));
    memset(rb, 0xa5, max + 64);
    void* d = rb;
    size_t rsz = sz + 64; /* a receive may be larger than its send */
    int tag = (int)k;
    void* rq = ut_irecv(&s, s.recv_comm, 1, &d, &rsz, &tag, &rmh);
    void* sq = ut_isend(&s, s.send_comm, sb, sz, tag, smh);
    int got[FAB_MAX_RECVS] = {-1};
    UT_OK(ut_wait(&s, sq, NULL, WAIT_MS));
    UT_OK(ut_wait(&s, rq, got, WAIT_MS));
    UT_CHECK(got[0] == (int)sz, "size %zu: received %d bytes", sz, got[0]);
    long bad = ut_verify(rb, sz, seed_of(!p.role, sz, 0));
    UT_CHECK(bad < 0, "size %zu: byte %ld differs", sz, bad);
    UT_CHECK((unsigned char)rb[sz] == 0xa5, "size %zu: wrote past the message", sz);
  }
  UT_OK(s.api->dereg_mr(s.send_comm, smh));
  UT_OK(s.api->dereg_mr(s.recv_comm, rmh));
  ut_pair_sync(&p);
  ut_side_close(&s);
  free(sb);
  free(rb);
  UT_CHECK(ut_warns() == 0, "%d unexpected WARN lines", ut_warns());
  ut_pair_finish(&p);
}

/* Grouped receives with mixed tags: each message lands in the buffer of its
 * tag, in the oldest outstanding group, and test reports every size. */
PAIR_TEST(grouped_mixed_tags, 120) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  enum { N = 8, ROUNDS = 3 };
  static char rbuf[ROUNDS][N][8192], sbuf[ROUNDS][N][8192];
  const int tags[N] = {70, 3, -9, 1, 2000000000, 0, 5, 6};
  void* rq[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    void* data[N];
    size_t sizes[N];
    for (int i = 0; i < N; i++) {
      data[i] = rbuf[r][i];
      sizes[i] = sizeof(rbuf[r][i]);
    }
    rq[r] = ut_irecv(&s, s.recv_comm, N, data, sizes, tags, NULL);
  }
  ut_pair_sync(&p);
  /* Send in another order than posted, different size per (round, buffer). */
  void* sq[ROUNDS * N];
  int k = 0;
  for (int r = 0; r < ROUNDS; r++) {
    for (int j = 0; j < N; j++) {
      int i = (j * 5 + 3) % N;
      size_t sz = (size_t)(r * 997 + i * 131) % 8192;
      ut_fill(sbuf[r][i], sz, seed_of(p.role, sz, r * N + i));
      sq[k++] = ut_isend(&s, s.send_comm, sbuf[r][i], sz, tags[i], NULL);
    }
  }
  for (int r = 0; r < ROUNDS; r++) {
    int got[N];
    UT_OK(ut_wait(&s, rq[r], got, WAIT_MS));
    for (int i = 0; i < N; i++) {
      size_t sz = (size_t)(r * 997 + i * 131) % 8192;
      UT_CHECK(got[i] == (int)sz, "round %d buffer %d (tag %d): %d bytes, expected %zu", r, i, tags[i], got[i], sz);
      UT_CHECK(ut_verify(rbuf[r][i], sz, seed_of(!p.role, sz, r * N + i)) < 0, "round %d buffer %d: bad data", r, i);
    }
  }
  for (int i = 0; i < k; i++) UT_OK(ut_wait(&s, sq[i], NULL, WAIT_MS));
  ut_pair_sync(&p);
  ut_side_close(&s);
  ut_pair_finish(&p);
}

/* 32 grouped receives of 8 (256 messages) and 256 sends in flight at once. */
PAIR_TEST(many_in_flight, 120) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  enum { R = FAB_MAX_REQUESTS, N = FAB_MAX_RECVS, SZ = 1000 };
  char* rb = malloc(R * N * SZ);
  char* sb = malloc(R * N * SZ);
  void* rq[R];
  for (int r = 0; r < R; r++) {
    void* data[N];
    size_t sizes[N];
    int tags[N];
    for (int i = 0; i < N; i++) {
      data[i] = rb + (r * N + i) * SZ;
      sizes[i] = SZ;
      tags[i] = i;
    }
    rq[r] = ut_irecv(&s, s.recv_comm, N, data, sizes, tags, NULL);
  }
  ut_pair_sync(&p);
  void* sq[R * N];
  for (int m = 0; m < R * N; m++) {
    ut_fill(sb + m * SZ, SZ, seed_of(p.role, SZ, m));
    sq[m] = ut_isend(&s, s.send_comm, sb + m * SZ, SZ, m % N, NULL);
  }
  for (int r = 0; r < R; r++) {
    int got[N];
    UT_OK(ut_wait(&s, rq[r], got, WAIT_MS));
    for (int i = 0; i < N; i++) {
      UT_CHECK(got[i] == SZ, "request %d buffer %d: %d bytes", r, i, got[i]);
      UT_CHECK(ut_verify(rb + (r * N + i) * SZ, SZ, seed_of(!p.role, SZ, r * N + i)) < 0,
               "request %d buffer %d: out of order or corrupt", r, i);
    }
  }
  for (int m = 0; m < R * N; m++) UT_OK(ut_wait(&s, sq[m], NULL, WAIT_MS));
  ut_pair_sync(&p);
  ut_side_close(&s);
  free(rb);
  free(sb);
  ut_pair_finish(&p);
}

/* 64 connections at once, a message over each. */
PAIR_TEST(many_comms, 120) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  memset(&s, 0, sizeof(s));
  s.api = &fab_api_core;
  UT_OK(s.api->init(&s.ctx, 7, NULL, ut_logger, NULL));
  enum { C = 64 };
  void *sc[C], *rc[C], *lc[C];
  ut_connect_many(&s, &p, C, sc, rc, lc);
  static int sv[C], rv[C];
  void *rq[C], *sq[C];
  for (int i = 0; i < C; i++) {
    void* d = &rv[i];
    size_t sz = sizeof(int);
    int tag = 1;
    rv[i] = -1;
    rq[i] = ut_irecv(&s, rc[i], 1, &d, &sz, &tag, NULL);
  }
  for (int i = 0; i < C; i++) {
    sv[i] = p.role * 1000 + i;
    sq[i] = ut_isend(&s, sc[i], &sv[i], sizeof(int), 1, NULL);
  }
  for (int i = 0; i < C; i++) {
    UT_OK(ut_wait(&s, rq[i], NULL, WAIT_MS));
    UT_OK(ut_wait(&s, sq[i], NULL, WAIT_MS));
    UT_CHECK(rv[i] == (!p.role) * 1000 + i, "comm %d got %d: crossed connections", i, rv[i]);
  }
  ut_pair_sync(&p);
  for (int i = 0; i < C; i++) {
    UT_OK(s.api->close_send(sc[i]));
    UT_OK(s.api->close_recv(rc[i]));
    UT_OK(s.api->close_listen(lc[i]));
  }
  UT_OK(s.api->finalize(s.ctx));
  ut_pair_finish(&p);
}

/* Closing comms with receives posted and sends unreceived, then finalizing:
 * no crash, no leak (ASan), no hang. */
PAIR_TEST(close_in_flight, 120) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  enum { BIG = 1 << 20 };
  char* rb = malloc(4 * BIG);
  char* sb = calloc(1, 4 * BIG);
  void* smh = NULL;
  UT_OK(s.api->reg_mr(s.send_comm, sb, 4 * BIG, FAB_PTR_HOST, &smh));
  for (int i = 0; i < 4; i++) {
    void* d = rb + i * BIG;
    size_t sz = BIG;
    int tag = 100 + i; /* never sent */
    (void)ut_irecv(&s, s.recv_comm, 1, &d, &sz, &tag, NULL);
    /* Never received. Large unreceived sends may meet back-pressure (shm):
     * then fewer of them are in flight, which is fine. */
    void* sq = NULL;
    for (int t = 0; t < 1000 && !sq; t++)
      UT_OK(s.api->isend(s.send_comm, sb + i * BIG, i ? BIG : 10, 200 + i, smh, NULL, &sq));
  }
  ut_pair_sync(&p);
  UT_OK(s.api->close_recv(s.recv_comm));
  UT_OK(s.api->close_send(s.send_comm));
  UT_OK(s.api->close_listen(s.listen_comm));
  ut_pair_sync(&p);
  UT_OK(s.api->finalize(s.ctx));
  free(rb); /* the endpoint is closed: nothing references the buffers */
  free(sb);
  UT_CHECK(ut_warns() == 0, "%d WARN lines for a clean close", ut_warns());
  ut_pair_finish(&p);
}

/* A send larger than its receive is an error on the receiver, not a silent cut. */
PAIR_TEST(truncation, 60) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  char sb[1000], rb[1000];
  memset(sb, 1, sizeof(sb));
  if (p.role == UT_PARENT) {
    void* d = rb;
    size_t sz = 100;
    int tag = 3;
    void* rq = ut_irecv(&s, s.recv_comm, 1, &d, &sz, &tag, NULL);
    ut_reset_warns();
    fab_result rc = ut_wait(&s, rq, NULL, WAIT_MS);
    UT_CHECK(rc != FAB_OK, "a 1000-byte send into a 100-byte receive completed without error");
    UT_CHECK(ut_warns() == 1, "%d WARN lines for one truncation", ut_warns());
  } else {
    void* sq = ut_isend(&s, s.send_comm, sb, sizeof(sb), 3, NULL);
    (void)ut_wait(&s, sq, NULL, WAIT_MS); /* the sender may or may not see it */
  }
  ut_pair_sync(&p);
  ut_side_close(&s);
  ut_pair_finish(&p);
}

/* A corrupted handle is refused with one WARN; the good one still works. */
PAIR_TEST(corrupted_handle, 60) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  fab_ctx* ctx;
  UT_OK(fab_api_core.init(&ctx, 1, NULL, ut_logger, NULL));
  unsigned char mine[FAB_HANDLE_SIZE], theirs[FAB_HANDLE_SIZE];
  void* l;
  UT_OK(fab_api_core.listen(ctx, 0, mine, &l));
  ut_pair_send(&p, mine, sizeof(mine));
  ut_pair_recv(&p, theirs, sizeof(theirs));
  const int spots[] = {0, 5, 9, 20, 30, 127};
  for (size_t i = 0; i < sizeof(spots) / sizeof(spots[0]); i++) {
    unsigned char bad[FAB_HANDLE_SIZE];
    memcpy(bad, theirs, sizeof(bad));
    bad[spots[i]] ^= 0x40;
    void* sc = (void*)0x77;
    ut_reset_warns();
    fab_result rc = fab_api_core.connect(ctx, 0, NULL, bad, &sc, NULL);
    UT_CHECK(rc != FAB_OK && sc == NULL, "byte %d corrupted: rc %d comm %p", spots[i], rc, sc);
    UT_CHECK(ut_warns() == 1, "byte %d corrupted: %d WARN lines", spots[i], ut_warns());
  }
  void *sc = NULL, *rc = NULL;
  int64_t deadline = ut_now_ms() + WAIT_MS;
  while (!sc || !rc) {
    UT_CHECK(ut_now_ms() < deadline, "connect after the corrupted attempts timed out");
    if (!sc) UT_OK(fab_api_core.connect(ctx, 0, NULL, theirs, &sc, NULL));
    if (!rc) UT_OK(fab_api_core.accept(l, &rc, NULL));
  }
  ut_pair_sync(&p);
  UT_OK(fab_api_core.close_send(sc));
  UT_OK(fab_api_core.close_recv(rc));
  UT_OK(fab_api_core.close_listen(l));
  ut_reset_warns();
  UT_CHECK(fab_api_core.close_listen(l) != FAB_OK && ut_warns() == 1, "double closeListen");
  UT_CHECK(fab_api_core.close_send(rc) != FAB_OK, "closeSend of a (closed) recv comm");
  UT_OK(fab_api_core.finalize(ctx));
  ut_pair_finish(&p);
}

/* The child dies with requests outstanding; the parent's requests fail within
 * FABRIC_PEER_TIMEOUT_MS (+ a probe interval) with a WARN, and closing works. */
PAIR_TEST(peer_death, 60) {
  ut_use_provider(prov);
  setenv("FABRIC_PEER_TIMEOUT_MS", "2000", 1);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  enum { BIG = 8 << 20 };
  char* rb = malloc(BIG);
  char* sb = calloc(1, BIG);
  void* d = rb;
  size_t sz = BIG;
  int tag = 1;
  void* rq = ut_irecv(&s, s.recv_comm, 1, &d, &sz, &tag, NULL);
  void* sq = ut_isend(&s, s.send_comm, sb, BIG, 2, NULL);
  ut_pair_sync(&p);
  if (p.role == UT_CHILD) _exit(0); /* gone, nothing closed */
  ut_pair_finish(&p);
  int64_t t0 = ut_now_ms();
  int rdone = 0, sdone = 0;
  fab_result rrc = FAB_OK, src = FAB_OK;
  while (ut_now_ms() - t0 < 15000 && (!rdone || !sdone)) {
    if (!rdone) rrc = s.api->test(rq, &rdone, NULL);
    if (!sdone) src = s.api->test(sq, &sdone, NULL);
    rdone |= rrc != FAB_OK;
    sdone |= src != FAB_OK;
  }
  if (!strcmp(prov, "tcp")) {
    UT_CHECK(rrc != FAB_OK && src != FAB_OK, "tcp: requests to the dead peer still pending after %lld ms (recv rc %d "
             "done %d, send rc %d done %d)", (long long)(ut_now_ms() - t0), rrc, rdone, src, sdone);
    UT_CHECK(ut_warns() >= 2, "failures without WARN");
  }
  int64_t tc = ut_now_ms();
  UT_OK(s.api->close_send(s.send_comm));
  UT_OK(s.api->close_recv(s.recv_comm));
  UT_OK(s.api->close_listen(s.listen_comm));
  UT_OK(s.api->finalize(s.ctx));
  UT_CHECK(ut_now_ms() - tc < 5000, "closing after the peer died took %lld ms", (long long)(ut_now_ms() - tc));
  free(rb);
  free(sb);
}

/* Connecting to a listen comm that was closed is refused: the connector fails
 * fast with one WARN instead of waiting for FABRIC_CONNECT_TIMEOUT_MS. */
PAIR_TEST(refused, 60) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  fab_ctx* ctx;
  UT_OK(fab_api_core.init(&ctx, 1, NULL, ut_logger, NULL));
  unsigned char mine[FAB_HANDLE_SIZE], theirs[FAB_HANDLE_SIZE];
  void *l, *keep;
  unsigned char h2[FAB_HANDLE_SIZE];
  UT_OK(fab_api_core.listen(ctx, 0, h2, &keep)); /* the endpoint stays up */
  UT_OK(fab_api_core.listen(ctx, 0, mine, &l));
  UT_OK(fab_api_core.close_listen(l));
  ut_pair_send(&p, mine, sizeof(mine));
  ut_pair_recv(&p, theirs, sizeof(theirs));
  void* sc = NULL;
  fab_result rc = FAB_OK;
  int64_t t0 = ut_now_ms();
  ut_reset_warns();
  while (rc == FAB_OK && !sc && ut_now_ms() - t0 < 20000) {
    rc = fab_api_core.connect(ctx, 0, NULL, theirs, &sc, NULL);
    void* none = NULL;
    UT_OK(fab_api_core.accept(keep, &none, NULL)); /* keep our side progressing */
    UT_CHECK(none == NULL, "nobody connects to this listen comm");
  }
  UT_CHECK(rc == FAB_ERR_REMOTE && !sc, "connect to a closed listen comm: rc %d comm %p after %lld ms", rc, sc,
           (long long)(ut_now_ms() - t0));
  UT_CHECK(ut_warns() == 1, "%d WARN lines for one refusal", ut_warns());
  ut_pair_sync(&p);
  UT_OK(fab_api_core.close_listen(keep));
  UT_OK(fab_api_core.finalize(ctx));
  ut_pair_finish(&p);
}

/* finalize with comms, requests and registrations left open (the runtime
 * gave up): everything is released (ASan: no leak), and the stale handles
 * are refused afterwards instead of crashing. */
PAIR_TEST(finalize_with_open_comms, 60) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  enum { LEN = 1 << 20 };
  char* rb = malloc(LEN);
  char* sb = calloc(1, LEN);
  void *rmh, *smh;
  UT_OK(s.api->reg_mr(s.recv_comm, rb, LEN, FAB_PTR_HOST, &rmh));
  UT_OK(s.api->reg_mr(s.send_comm, sb, LEN, FAB_PTR_HOST, &smh));
  void* d = rb;
  size_t sz = LEN;
  int tag = 5;
  void* rq = ut_irecv(&s, s.recv_comm, 1, &d, &sz, &tag, &rmh);
  void* sq = NULL;
  UT_OK(s.api->isend(s.send_comm, sb, 100, 6, smh, NULL, &sq)); /* never received */
  ut_pair_sync(&p);
  UT_OK(s.api->finalize(s.ctx));
  /* The engine is down (its logger too: these WARNs go to stderr). */
  void* q = (void*)0x1;
  UT_CHECK(s.api->isend(s.send_comm, sb, 10, 1, smh, NULL, &q) != FAB_OK && q == NULL, "isend on a finalized comm");
  UT_CHECK(s.api->close_recv(s.recv_comm) != FAB_OK, "closeRecv after finalize");
  UT_CHECK(s.api->dereg_mr(s.send_comm, smh) != FAB_OK, "deregMr after finalize");
  int done = 0;
  UT_CHECK(s.api->test(NULL, &done, NULL) != FAB_OK, "test(NULL)");
  (void)rq;
  ut_pair_sync(&p);
  free(rb);
  free(sb);
  ut_pair_finish(&p);
}

/* A region under /dev/shm named after our pid, as a killed process with the
 * same pid leaves behind, must not keep shm endpoints from opening: the
 * engine names its endpoints itself. Blocks every default name of the form
 * <pid>:<domain>:<endpoint> the provider would pick first. */
enum { STALE_DOMS = 4, STALE_EPS = 16 };

static int plant_stale_regions(char paths[][64]) {
  int n = 0;
  for (int d = 0; d < STALE_DOMS; d++) {
    for (int e = 0; e < STALE_EPS; e++) {
      snprintf(paths[n], 64, "/dev/shm/%d:%d:%d", (int)getpid(), d, e);
      FILE* f = fopen(paths[n], "wx");
      if (!f) continue; /* exists already: not ours to remove */
      fputs("stale", f);
      fclose(f);
      n++;
    }
  }
  return n;
}

Test(smoke_shm, stale_regions_of_our_pid, .timeout = 60) {
  ut_use_provider("shm");
  ut_pair p;
  ut_pair_start(&p);
  static char paths[STALE_DOMS * STALE_EPS][64];
  int planted = plant_stale_regions(paths);
  UT_CHECK(planted > 0, "could not plant stale regions under /dev/shm");
  ut_side s;
  ut_side_open(&s, &p);
  char sb[64], rb[64];
  ut_fill(sb, sizeof(sb), seed_of(p.role, sizeof(sb), 1));
  void *smh, *rmh;
  UT_OK(s.api->reg_mr(s.send_comm, sb, sizeof(sb), FAB_PTR_HOST, &smh));
  UT_OK(s.api->reg_mr(s.recv_comm, rb, sizeof(rb), FAB_PTR_HOST, &rmh));
  void* d = rb;
  size_t rsz = sizeof(rb);
  int tag = 9;
  void* rq = ut_irecv(&s, s.recv_comm, 1, &d, &rsz, &tag, &rmh);
  void* sq = ut_isend(&s, s.send_comm, sb, sizeof(sb), tag, smh);
  int got[FAB_MAX_RECVS] = {-1};
  UT_OK(ut_wait(&s, sq, NULL, WAIT_MS));
  UT_OK(ut_wait(&s, rq, got, WAIT_MS));
  UT_CHECK(got[0] == (int)sizeof(rb), "received %d bytes", got[0]);
  UT_CHECK(ut_verify(rb, sizeof(rb), seed_of(!p.role, sizeof(sb), 1)) < 0, "data differs");
  UT_OK(s.api->dereg_mr(s.send_comm, smh));
  UT_OK(s.api->dereg_mr(s.recv_comm, rmh));
  ut_pair_sync(&p);
  ut_side_close(&s);
  for (int i = 0; i < planted; i++) unlink(paths[i]);
  UT_CHECK(ut_warns() == 0, "%d unexpected WARN lines", ut_warns());
  ut_pair_finish(&p);
}

/* Contexts share one endpoint per device. Finalizing a context closes what
 * the runtime left open in it (here a recv comm with a receive posted) and
 * nothing else: another context's comms on the same endpoint keep working. */
PAIR_TEST(finalize_leaves_other_contexts, 120) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s1, s2;
  ut_side_open(&s1, &p);
  ut_side_open(&s2, &p);
  enum { LEN = 65536 };
  char* b1 = malloc(LEN);
  char* sb = malloc(LEN);
  char* rb = malloc(LEN);
  void *m1, *smh, *rmh;
  UT_OK(s1.api->reg_mr(s1.recv_comm, b1, LEN, FAB_PTR_HOST, &m1));
  void* d = b1;
  size_t sz = LEN;
  int tag = 77; /* never sent */
  (void)ut_irecv(&s1, s1.recv_comm, 1, &d, &sz, &tag, &m1);
  UT_OK(s1.api->finalize(s1.ctx)); /* leaves send, recv and listen comms open */
  void* q = (void*)0x1;
  UT_CHECK(s1.api->isend(s1.send_comm, b1, 8, 1, NULL, NULL, &q) != FAB_OK && q == NULL,
           "isend on a comm of a finalized context succeeded");
  UT_CHECK(s1.api->close_recv(s1.recv_comm) != FAB_OK, "closeRecv of a comm finalize closed succeeded");
  ut_reset_warns();
  UT_OK(s2.api->reg_mr(s2.send_comm, sb, LEN, FAB_PTR_HOST, &smh));
  UT_OK(s2.api->reg_mr(s2.recv_comm, rb, LEN, FAB_PTR_HOST, &rmh));
  for (int i = 0; i < 4; i++) {
    ut_fill(sb, LEN, seed_of(p.role, LEN, i));
    d = rb;
    sz = LEN;
    tag = i;
    void* rq = ut_irecv(&s2, s2.recv_comm, 1, &d, &sz, &tag, &rmh);
    void* sq = ut_isend(&s2, s2.send_comm, sb, LEN, tag, smh);
    int got[FAB_MAX_RECVS] = {-1};
    UT_OK(ut_wait(&s2, sq, NULL, WAIT_MS));
    UT_OK(ut_wait(&s2, rq, got, WAIT_MS));
    UT_CHECK(got[0] == LEN, "received %d bytes", got[0]);
    UT_CHECK(ut_verify(rb, LEN, seed_of(!p.role, LEN, i)) < 0, "message %d differs", i);
  }
  UT_OK(s2.api->dereg_mr(s2.send_comm, smh));
  UT_OK(s2.api->dereg_mr(s2.recv_comm, rmh));
  UT_CHECK(ut_warns() == 0, "%d unexpected WARN lines", ut_warns());
  ut_pair_sync(&p);
  ut_side_close(&s2);
  free(b1);
  free(sb);
  free(rb);
  ut_pair_finish(&p);
}

/* Communicators come and go in a long-lived process: connect and close a
 * pair of comms many times while the context (and the shared endpoint) stays.
 * On shm every send comm's own endpoint has a new address, and an endpoint
 * maps at most 256 peers: the addresses of closed comms must be released or
 * accept fails after about 255 rounds. */
PAIR_TEST(connect_close_cycles, 300) {
  ut_use_provider(prov);
  ut_pair p;
  ut_pair_start(&p);
  ut_side s;
  ut_side_open(&s, &p);
  enum { CYCLES = 300 };
  char sb[256], rb[256];
  void* stale = NULL; /* a request of a comm closed since: test must refuse it, not fault */
  for (int cyc = 0; cyc < CYCLES; cyc++) {
    void *sc, *rc, *lc;
    ut_connect_many(&s, &p, 1, &sc, &rc, &lc);
    if (cyc % 60 == 0 || cyc == CYCLES - 1) { /* traffic on some rounds: the comms work */
      void *smh, *rmh;
      UT_OK(s.api->reg_mr(sc, sb, sizeof(sb), FAB_PTR_HOST, &smh));
      UT_OK(s.api->reg_mr(rc, rb, sizeof(rb), FAB_PTR_HOST, &rmh));
      ut_fill(sb, sizeof(sb), seed_of(p.role, sizeof(sb), cyc));
      void* d = rb;
      size_t rsz = sizeof(rb);
      int tag = cyc;
      void* rq = ut_irecv(&s, rc, 1, &d, &rsz, &tag, &rmh);
      void* sq = ut_isend(&s, sc, sb, sizeof(sb), tag, smh);
      UT_OK(ut_wait(&s, sq, NULL, WAIT_MS));
      UT_OK(ut_wait(&s, rq, NULL, WAIT_MS));
      if (!stale) stale = sq;
      UT_CHECK(ut_verify(rb, sizeof(rb), seed_of(!p.role, sizeof(sb), cyc)) < 0, "round %d: data differs", cyc);
      UT_OK(s.api->dereg_mr(sc, smh));
      UT_OK(s.api->dereg_mr(rc, rmh));
    }
    ut_pair_sync(&p);
    UT_OK(s.api->close_send(sc));
    UT_OK(s.api->close_recv(rc));
    UT_OK(s.api->close_listen(lc));
    ut_pair_sync(&p);
    if (cyc == 0) {
      int done = 0;
      UT_CHECK(s.api->test(stale, &done, NULL) != FAB_OK && !done, "test of a closed comm's request succeeded");
      UT_CHECK(ut_warns() == 1, "%d WARN lines for one stale request", ut_warns());
      ut_reset_warns();
    }
  }
  UT_CHECK(ut_warns() == 0, "%d unexpected WARN lines", ut_warns());
  ut_side_close(&s);
  ut_pair_finish(&p);
}
