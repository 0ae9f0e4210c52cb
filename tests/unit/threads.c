/*
 * Thread-safety stress (a plain program: Criterion does not run under TSan).
 * One process, one context: T threads each own a loopback connection on the
 * shared endpoint and exchange messages with verification, so completions of
 * one thread's requests are routinely reaped by another thread's test().
 * A second phase gives every thread its own context and connects across
 * contexts while the others transfer. Every CHURN_EVERY messages a thread
 * also opens a side connection, closes its send comm right after starting
 * two sends (8 B and 17.5 KB) whose receives are posted, waits for those
 * receives and closes the recv comm with two more receives never matched:
 * closed comms are freed while other threads dispatch their completions (run
 * it under TSan and ASan). At the end of a phase every closed comm must have
 * been freed and every retiring own endpoint destroyed.
 *
 * "unmatched" (4th argument) instead closes both comms with the large send
 * possibly unmatched: its sender never completes (its comm stays parked, its
 * own shm endpoint retiring, until finalize). A quarter as often (twice per
 * thread and phase): on rdma each such close and deregistration waits out
 * its bounded 1 s, and the run sits in every CI stage.
 *
 *   fabric-unit-threads [tcp|shm] [phases 1|2|3] [threads] [unmatched]   (exit 0 = pass)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fab_api.h"
#include "fab_engine.h"

extern const fab_api fab_api_core;
static const fab_api* api = &fab_api_core;

enum { TMAX = 16, MSGS = 2000, INFLIGHT = 8, MAXSZ = 70000, CHURN_EVERY = 250 };
static int T = 4;
static int unmatched; /* churn closes comms with the large send possibly unmatched */

#define CHECK(c, ...)                                       \
  do {                                                      \
    if (!(c)) {                                             \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                         \
      fprintf(stderr, "\n");                                \
      exit(1);                                              \
    }                                                       \
  } while (0)
#define OK(e) CHECK((e) == FAB_OK, "%s", #e)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void connect_pair(fab_ctx* a, fab_ctx* b, void** s, void** r, void** l) {
  unsigned char h[FAB_HANDLE_SIZE];
  OK(api->listen(b, 0, h, l));
  *s = *r = NULL;
  double end = now_s() + 30;
  while (!*s || !*r) {
    CHECK(now_s() < end, "connect timed out");
    if (!*s) OK(api->connect(a, 0, NULL, h, s, NULL));
    if (!*r) OK(api->accept(*l, r, NULL));
  }
}

/* NCCL registers every buffer; so do the workers (the plugin refuses a NULL handle). */
static void* reg(void* comm, void* buf) {
  void* mh = NULL;
  OK(api->reg_mr(comm, buf, MAXSZ, FAB_PTR_HOST, &mh));
  return mh;
}

static size_t size_of(int t, int m) { return (size_t)((m * 7919 + t * 104729) % MAXSZ); }

typedef struct {
  int id;
  fab_ctx* ctx;       /* shared or own */
  fab_ctx* peer_ctx;  /* where the listen happens */
  char* sbuf[INFLIGHT];
  char* rbuf[INFLIGHT];
  char *churn_s, *churn_r; /* side connections' buffers: freed after finalize */
} worker;

/* A side connection: receives for tags 1..4, sends for tags 1 and 2, the
 * send comm closed with its sends in flight (never tested), the recv comm
 * closed with tags 3 and 4 still posted. */
static void churn(worker* w, char* sbuf, char* rbuf) {
  void *s, *r, *l;
  connect_pair(w->ctx, w->peer_ctx, &s, &r, &l);
  void* smh = reg(s, sbuf);
  void* rmh = reg(r, rbuf);
  void* rq[4] = {0};
  for (int tag = 1; tag <= 4; tag++) {
    void* d = rbuf + (size_t)(tag - 1) * (MAXSZ / 4);
    size_t rsz = MAXSZ / 4;
    double end = now_s() + 30;
    while (!rq[tag - 1]) {
      CHECK(now_s() < end, "thread %d: side irecv never accepted", w->id);
      OK(api->irecv(r, 1, &d, &rsz, &tag, &rmh, NULL, &rq[tag - 1]));
    }
  }
  for (int tag = 1; tag <= 2; tag++) {
    void* sq = NULL;
    double end = now_s() + 30;
    while (!sq) {
      CHECK(now_s() < end, "thread %d: side isend never accepted", w->id);
      OK(api->isend(s, sbuf, tag == 1 ? 8 : MAXSZ / 4, tag, smh, NULL, &sq));
    }
  }
  if (unmatched && (w->id & 1)) OK(api->dereg_mr(r, rmh));
  if (unmatched && (w->id & 1)) OK(api->close_recv(r)); /* before the sends may have matched */
  OK(api->close_send(s));
  /* As NCCL does: a buffer is deregistered once its sends are done, which the
   * closed comm still sees to (a send waiting for its receive is refused if
   * its buffer goes first). Unmatched: they never will be. */
  if (unmatched) OK(api->dereg_mr(s, smh));
  if (!unmatched) {
    for (int k = 0; k < 2; k++) {
      int done = 0, got = -1;
      double end = now_s() + 30;
      while (!done) {
        CHECK(now_s() < end, "thread %d: side receive %d never completed", w->id, k + 1);
        OK(api->test(rq[k], &done, &got));
      }
      CHECK(got == (k == 0 ? 8 : MAXSZ / 4), "thread %d: side receive %d got %d bytes", w->id, k + 1, got);
    }
  }
  if (!unmatched) OK(api->dereg_mr(s, smh));
  if (!(unmatched && (w->id & 1))) OK(api->dereg_mr(r, rmh));
  if (!(unmatched && (w->id & 1))) OK(api->close_recv(r));
  OK(api->close_listen(l));
}

/* Every comm closed with operations in flight must be freed once they
 * complete, by the progress of whoever polls the endpoint. */
static void check_closed_freed(const char* prov) {
  if (unmatched) return; /* sends that never complete keep their comms, by design */
  fab_endpoint* ep = atomic_load(&fab_g.eps[0]);
  CHECK(ep, "no endpoint on device 0");
  double end = now_s() + 20;
  for (;;) {
    pthread_mutex_lock(&ep->lock);
    fab_ep_progress_locked(ep);
    int left = atomic_load(&ep->nclosing);
    pthread_mutex_unlock(&ep->lock);
    if (left == 0) return;
    CHECK(now_s() < end, "%s: %d closed comms or retiring endpoints never freed", prov, left);
  }
}

static void* run(void* arg) {
  worker* w = arg;
  void *s, *r, *l;
  connect_pair(w->ctx, w->peer_ctx, &s, &r, &l);
  void *smh[INFLIGHT], *rmh[INFLIGHT];
  for (int i = 0; i < INFLIGHT; i++) {
    w->sbuf[i] = malloc(MAXSZ);
    w->rbuf[i] = malloc(MAXSZ);
    smh[i] = reg(s, w->sbuf[i]);
    rmh[i] = reg(r, w->rbuf[i]);
  }
  void* sreq[INFLIGHT] = {0};
  void* rreq[INFLIGHT] = {0};
  w->churn_s = malloc(MAXSZ);
  w->churn_r = malloc(MAXSZ);
  int next_post = 0, next_done = 0, churned = 0;
  double end = now_s() + 120;
  while (next_done < MSGS) {
    CHECK(now_s() < end, "thread %d stuck at message %d", w->id, next_done);
    while (next_post < MSGS && next_post - next_done < INFLIGHT) {
      int slot = next_post % INFLIGHT;
      size_t sz = size_of(w->id, next_post);
      void* d = w->rbuf[slot];
      size_t rsz = MAXSZ;
      int tag = next_post & 0xff;
      void* rq = NULL;
      OK(api->irecv(r, 1, &d, &rsz, &tag, &rmh[slot], NULL, &rq));
      if (!rq) break;
      memset(w->sbuf[slot], (char)(next_post * 13 + w->id), sz);
      void* sq = NULL;
      while (!sq) OK(api->isend(s, w->sbuf[slot], sz, tag, smh[slot], NULL, &sq));
      rreq[slot] = rq;
      sreq[slot] = sq;
      next_post++;
    }
    /* Test the send too: with one context per thread, the send's endpoint is
     * progressed only by its own requests (as in NCCL, where each side polls
     * its own requests). */
    int slot = next_done % INFLIGHT;
    int rdone = 0, sdone = 0, got = -1;
    if (rreq[slot]) OK(api->test(rreq[slot], &rdone, &got));
    if (sreq[slot]) OK(api->test(sreq[slot], &sdone, NULL));
    if (sdone) sreq[slot] = NULL;
    if (rdone) {
      size_t sz = size_of(w->id, next_done);
      CHECK(got == (int)sz, "thread %d message %d: %d bytes, expected %zu", w->id, next_done, got, sz);
      for (size_t k = 0; k < sz; k++)
        CHECK(w->rbuf[slot][k] == (char)(next_done * 13 + w->id), "thread %d message %d: bad byte %zu", w->id,
              next_done, k);
      rreq[slot] = NULL;
    }
    if (!rreq[slot] && !sreq[slot]) next_done++;
    if (next_done / (unmatched ? 4 * CHURN_EVERY : CHURN_EVERY) > churned) {
      churned++;
      churn(w, w->churn_s, w->churn_r);
    }
  }
  for (int i = 0; i < INFLIGHT; i++) {
    OK(api->dereg_mr(s, smh[i]));
    OK(api->dereg_mr(r, rmh[i]));
  }
  OK(api->close_send(s));
  OK(api->close_recv(r));
  OK(api->close_listen(l));
  for (int i = 0; i < INFLIGHT; i++) {
    free(w->sbuf[i]);
    free(w->rbuf[i]);
  }
  return NULL;
}

static void phase(int own_ctx) {
  fab_ctx* shared;
  OK(api->init(&shared, 1, NULL, NULL, NULL));
  worker w[TMAX];
  pthread_t th[TMAX];
  for (int i = 0; i < T; i++) {
    w[i].id = i;
    w[i].ctx = shared;
    w[i].peer_ctx = shared;
    if (own_ctx) OK(api->init(&w[i].ctx, 100 + i, NULL, NULL, NULL));
  }
  for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, run, &w[i]);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  check_closed_freed(getenv("FABRIC_PROVIDER"));
  for (int i = 0; i < T; i++)
    if (own_ctx) OK(api->finalize(w[i].ctx));
  OK(api->finalize(shared));
  for (int i = 0; i < T; i++) { /* a closed comm's transfer may write until its endpoint is gone */
    free(w[i].churn_s);
    free(w[i].churn_r);
  }
}

int main(int argc, char** argv) {
  const char* prov = argc > 1 ? argv[1] : "shm";
  setenv("FABRIC_PROVIDER", prov, 1);
  setenv("FI_TCP_IFACE", "lo", 1);
  int phases = argc > 2 ? atoi(argv[2]) : 3; /* bit 0: shared context, bit 1: one context per thread */
  if (argc > 3) T = atoi(argv[3]);
  unmatched = argc > 4 && !strcmp(argv[4], "unmatched");
  CHECK(T >= 1 && T <= TMAX, "1..%d threads", TMAX);
  double t0 = now_s();
  if (phases & 1) phase(0);
  if (phases & 2) phase(1);
  printf("threads %s: %d threads x %d messages, shared and own contexts: PASS (%.1f s)\n", prov, T, MSGS,
         now_s() - t0);
  return 0;
}
