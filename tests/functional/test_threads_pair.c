/*
 * Several threads in each of two processes drive connections of their own
 * over the shared endpoint at once, as the proxy threads of several NCCL
 * communicators do: while one thread posts, another reads the same
 * endpoint's completions. Sizes that take the providers' different paths
 * (8 KiB, 64 KiB, 1 MiB), every byte checked.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
