/*
 * Several threads in each of two processes drive connections of their own
 * over the shared endpoint at once, as the proxy threads of several NCCL
 * communicators do: while one thread posts, another reads the same
 * endpoint's completions. Sizes that take the providers' different paths
 * (8 KiB, 64 KiB, 1 MiB), every byte checked.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "ft_criterion.h"

enum { T_MS = 60000, NT = 3, BATCHES = 40, WIN = 8, MAXSZ = 1 << 20 };

typedef struct {
  ft_side* s;
  ft_conn* c;
  int id;
} worker;

static size_t size_of(int id, int k) {
  static const size_t sizes[] = {8192, 65536, 8192, MAXSZ, 65536};
  return sizes[(k + id) % 5] - (size_t)(k % 3);
}

static void* work(void* arg) {
  worker* w = arg;
  ft_side* s = w->s;
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, w->c->send_comm, (size_t)WIN * MAXSZ);
  ft_mr_alloc(s, &rm, w->c->recv_comm, (size_t)WIN * MAXSZ);
  for (int b = 0; b < BATCHES; b++) {
    void* reqs[2 * WIN];
    for (int i = 0; i < WIN; i++) {
      int k = b * WIN + i;
      char* rb = (char*)rm.buf + (size_t)i * MAXSZ;
      char* sb = (char*)sm.buf + (size_t)i * MAXSZ;
      ft_fill(sb, size_of(w->id, k), (uint64_t)(w->id * 1000003 + k));
      reqs[2 * i] = ft_irecv(s, w->c->recv_comm, 1, (void**)&rb, &(size_t){MAXSZ}, &(int){5}, &rm.mh, T_MS);
      reqs[2 * i + 1] = ft_isend(s, w->c->send_comm, sb, size_of(w->id, k), 5, sm.mh, T_MS);
    }
    int got[2 * WIN][FAB_MAX_RECVS];
    ft_wait_all(s, reqs, 2 * WIN, &got[0][0], FAB_MAX_RECVS, T_MS, "a thread's batch");
    for (int i = 0; i < WIN; i++) {
      int k = b * WIN + i;
      FT_CHECK(got[2 * i][0] == (int)size_of(w->id, k), "thread %d message %d: %d bytes, expected %zu", w->id, k,
               got[2 * i][0], size_of(w->id, k));
      ft_verify_or_fail((char*)rm.buf + (size_t)i * MAXSZ, size_of(w->id, k), (uint64_t)(w->id * 1000003 + k),
                        "a message of one of several threads");
    }
  }
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
  return NULL;
}

FT_PAIR_TEST(threads_shared_endpoint, 120) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c[NT];
  ft_connect_all(&s, c, NT, T_MS);
  pthread_t th[NT];
  worker w[NT];
  for (int i = 0; i < NT; i++) {
    w[i] = (worker){&s, &c[i], i};
    FT_CHECK(pthread_create(&th[i], NULL, work, &w[i]) == 0, "pthread_create");
  }
  for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
  ft_sync(peer, "threads done", T_MS);
  ft_close_all(&s, c, NT);
  ft_side_close(&s);
}

/* Issue 26 item 1 (and 2 on shm): in each process two threads stream over
 * comms of their own while a third closes other comms mid-transfer,
 * deregistering and unmapping their buffers at once, as a runtime tearing
 * down one communicator while others between the same processes live.
 * The bystanders must lose nothing and see no error; the closed comms may
 * fail, but nothing may crash, hang or write into the unmapped buffers. */
enum { CB_DATA = 2, CB_CLOSERS = 4, CB_MSGS = 4, CB_LEN = 4 << 20 };

typedef struct {
  ft_side* s;
  ft_conn* c;
  _Atomic int closers_done; /* this process's closer is through */
  int closed_mid_data;
} closer_arg;

typedef struct {
  worker w;
  closer_arg* ca;
  int batches;
} streamer;

/* A bystander: batches of checked messages until both processes' closers
 * are through. Each batch carries this side's "closer done" flag, so both
 * sides end after the same batch. */
static void* stream_until_closed(void* arg) {
  streamer* st = arg;
  ft_side* s = st->w.s;
  ft_conn* c = st->w.c;
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, (size_t)(WIN + 1) * MAXSZ);
  ft_mr_alloc(s, &rm, c->recv_comm, (size_t)(WIN + 1) * MAXSZ);
  for (int b = 0;; b++) {
    void* reqs[2 * (WIN + 1)];
    int mine = atomic_load(&st->ca->closers_done);
    for (int i = 0; i <= WIN; i++) {
      int k = b * WIN + i;
      char* rb = (char*)rm.buf + (size_t)i * MAXSZ;
      char* sb = (char*)sm.buf + (size_t)i * MAXSZ;
      size_t len = i < WIN ? size_of(st->w.id, k) : sizeof(int);
      if (i < WIN) ft_fill(sb, len, (uint64_t)(st->w.id * 1000003 + k));
      else memcpy(sb, &mine, sizeof mine);
      reqs[2 * i] = ft_irecv(s, c->recv_comm, 1, (void**)&rb, &(size_t){MAXSZ}, &(int){i < WIN ? 5 : 6}, &rm.mh, T_MS);
      reqs[2 * i + 1] = ft_isend(s, c->send_comm, sb, len, i < WIN ? 5 : 6, sm.mh, T_MS);
    }
    int got[2 * (WIN + 1)][FAB_MAX_RECVS];
    ft_wait_all(s, reqs, 2 * (WIN + 1), &got[0][0], FAB_MAX_RECVS, T_MS, "a bystander's batch");
    for (int i = 0; i < WIN; i++) {
      int k = b * WIN + i;
      FT_CHECK(got[2 * i][0] == (int)size_of(st->w.id, k), "bystander %d message %d: %d bytes, expected %zu",
               st->w.id, k, got[2 * i][0], size_of(st->w.id, k));
      ft_verify_or_fail((char*)rm.buf + (size_t)i * MAXSZ, size_of(st->w.id, k), (uint64_t)(st->w.id * 1000003 + k),
                        "a bystander's message");
    }
    int theirs;
    memcpy(&theirs, (char*)rm.buf + (size_t)WIN * MAXSZ, sizeof theirs);
    if (mine && theirs) {
      st->batches = b + 1;
      break;
    }
  }
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
  return NULL;
}

static void close_one_mid_transfer(ft_side* s, ft_conn* c, int round) {
  const fab_api* a = s->api;
  void* rbuf[CB_MSGS];
  void* rmh[CB_MSGS];
  void* rreq[CB_MSGS];
  void* sreq[CB_MSGS];
  void* sbuf = mmap(NULL, CB_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* smh = NULL;
  FT_CHECK(sbuf != MAP_FAILED, "mmap");
  ft_fill(sbuf, CB_LEN, (uint64_t)round);
  FT_OK(a->reg_mr(c->send_comm, sbuf, CB_LEN, FAB_PTR_HOST, &smh));
  for (int i = 0; i < CB_MSGS; i++) {
    rbuf[i] = mmap(NULL, CB_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FT_CHECK(rbuf[i] != MAP_FAILED, "mmap");
    FT_OK(a->reg_mr(c->recv_comm, rbuf[i], CB_LEN, FAB_PTR_HOST, &rmh[i]));
    size_t len = CB_LEN;
    int tag = i;
    rreq[i] = ft_irecv(s, c->recv_comm, 1, &rbuf[i], &len, &tag, &rmh[i], T_MS);
    sreq[i] = NULL;
    int64_t until = ft_now_ms() + 2000;
    while (!sreq[i] && ft_now_ms() < until)
      if (a->isend(c->send_comm, sbuf, CB_LEN, i, smh, NULL, &sreq[i]) != FAB_OK) break;
  }
  /* until the first message of either direction is in, or the peer closed */
  int64_t until = ft_now_ms() + 2000;
  for (int moving = 0; !moving && ft_now_ms() < until;) {
    for (int i = 0; i < CB_MSGS && !moving; i++) {
      int done = 0;
      if (rreq[i] && a->test(rreq[i], &done, NULL) != FAB_OK) rreq[i] = NULL, moving = 1;
      if (done) moving = 1, rreq[i] = NULL;
      done = 0;
      if (sreq[i] && a->test(sreq[i], &done, NULL) != FAB_OK) sreq[i] = NULL, moving = 1;
      if (done) moving = 1, sreq[i] = NULL;
    }
  }
  for (int i = 0; i < CB_MSGS; i++) FT_OK(a->dereg_mr(c->recv_comm, rmh[i]));
  FT_OK(a->dereg_mr(c->send_comm, smh));
  FT_OK(a->close_recv(c->recv_comm));
  FT_OK(a->close_send(c->send_comm));
  c->recv_comm = c->send_comm = NULL;
  for (int i = 0; i < CB_MSGS; i++) munmap(rbuf[i], CB_LEN); /* a late write now faults */
  munmap(sbuf, CB_LEN);
}

static void* closer(void* arg) {
  closer_arg* ca = arg;
  for (int i = 0; i < CB_CLOSERS; i++) {
    close_one_mid_transfer(ca->s, &ca->c[i], i);
    ca->closed_mid_data++;
  }
  atomic_store(&ca->closers_done, 1);
  return NULL;
}

FT_PAIR_TEST(close_mid_transfer_bystanders, 180) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  ft_conn c[CB_DATA + CB_CLOSERS];
  ft_connect_all(&s, c, CB_DATA + CB_CLOSERS, T_MS);
  ft_log_expect_warns(1); /* the closed comms may WARN; the bystanders are checked */
  ft_sync(peer, "start", T_MS);
  pthread_t th[CB_DATA], cl;
  closer_arg ca = {&s, &c[CB_DATA], 0, 0};
  streamer st[CB_DATA];
  for (int i = 0; i < CB_DATA; i++) {
    st[i] = (streamer){{&s, &c[i], i}, &ca, 0};
    FT_CHECK(pthread_create(&th[i], NULL, stream_until_closed, &st[i]) == 0, "pthread_create");
  }
  FT_CHECK(pthread_create(&cl, NULL, closer, &ca) == 0, "pthread_create");
  for (int i = 0; i < CB_DATA; i++) pthread_join(th[i], NULL);
  pthread_join(cl, NULL);
  FT_CHECK(ca.closed_mid_data == CB_CLOSERS && st[0].batches > 1 && st[1].batches > 1,
           "the bystanders streamed %d and %d batches around %d closes", st[0].batches, st[1].batches,
           ca.closed_mid_data);
  ft_sync(peer, "threads done", T_MS);
  ft_phase("the bystanders after the closes");
  for (int i = 0; i < CB_DATA; i++) ft_exchange(&s, &c[i], (size_t)1 << 20, 77 + (uint64_t)i, T_MS);
  ft_close_all(&s, c, CB_DATA + CB_CLOSERS);
  ft_side_close(&s);
}
