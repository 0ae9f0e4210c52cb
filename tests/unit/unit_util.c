#include "unit_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int g_warns;
static int g_role = -1; /* -1: no pair running */

void ut_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  if (level != FAB_LOG_WARN) return;
  __atomic_add_fetch(&g_warns, 1, __ATOMIC_SEQ_CST);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "[%s] WARN %s:%d %s\n", g_role == UT_CHILD ? "child" : "parent", file, line, msg);
}

int ut_warns(void) { return __atomic_load_n(&g_warns, __ATOMIC_SEQ_CST); }
void ut_reset_warns(void) { __atomic_store_n(&g_warns, 0, __ATOMIC_SEQ_CST); }

void ut_use_provider(const char* prov) {
  setenv("FABRIC_PROVIDER", prov, 1);
  if (!strcmp(prov, "tcp")) setenv("FI_TCP_IFACE", "lo", 1);
}

void ut_fail(const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (g_role == UT_CHILD) {
    fprintf(stderr, "[child] FAILED %s:%d: %s\n", file, line, msg);
    _exit(10);
  }
  cr_assert_fail("%s:%d: %s", file, line, msg);
  abort(); /* not reached */
}

int64_t ut_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --- pair ---------------------------------------------------------------------- */

void ut_pair_start(ut_pair* p) {
  int a[2], b[2];
  UT_CHECK(pipe(a) == 0 && pipe(b) == 0, "pipe: %s", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  UT_CHECK(pid >= 0, "fork: %s", strerror(errno));
  p->child = pid;
  p->role = pid == 0 ? UT_CHILD : UT_PARENT;
  g_role = p->role;
  if (p->role == UT_CHILD) {
    alarm(120); /* a hung child must not outlive the test */
    p->wfd = b[1];
    p->rfd = a[0];
    close(a[1]);
    close(b[0]);
  } else {
    p->wfd = a[1];
    p->rfd = b[0];
    close(a[0]);
    close(b[1]);
  }
}

void ut_pair_send(ut_pair* p, const void* buf, size_t len) {
  const char* c = buf;
  while (len) {
    ssize_t n = write(p->wfd, c, len);
    if (n < 0 && errno == EINTR) continue;
    UT_CHECK(n > 0, "pipe write: %s", strerror(errno));
    c += n;
    len -= (size_t)n;
  }
}

void ut_pair_recv(ut_pair* p, void* buf, size_t len) {
  char* c = buf;
  while (len) {
    ssize_t n = read(p->rfd, c, len);
    if (n < 0 && errno == EINTR) continue;
    UT_CHECK(n > 0, "pipe read: %s (peer gone?)", n == 0 ? "EOF" : strerror(errno));
    c += n;
    len -= (size_t)n;
  }
}

void ut_pair_sync(ut_pair* p) {
  char x = 's';
  ut_pair_send(p, &x, 1);
  ut_pair_recv(p, &x, 1);
}

void ut_pair_finish(ut_pair* p) {
  close(p->wfd);
  if (p->role == UT_CHILD) _exit(0);
  int status = 0;
  waitpid(p->child, &status, 0);
  g_role = -1;
  close(p->rfd);
  UT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status 0x%x); see its output", status);
}

/* --- engine ---------------------------------------------------------------------- */

void ut_connect_many(ut_side* s, ut_pair* p, int n, void** send_comms, void** recv_comms, void** listen_comms) {
  unsigned char(*mine)[FAB_HANDLE_SIZE] = calloc((size_t)n, FAB_HANDLE_SIZE);
  unsigned char(*theirs)[FAB_HANDLE_SIZE] = calloc((size_t)n, FAB_HANDLE_SIZE);
  for (int i = 0; i < n; i++) {
    UT_OK(s->api->listen(s->ctx, 0, mine[i], &listen_comms[i]));
    send_comms[i] = recv_comms[i] = NULL;
  }
  ut_pair_send(p, mine, (size_t)n * FAB_HANDLE_SIZE);
  ut_pair_recv(p, theirs, (size_t)n * FAB_HANDLE_SIZE);
  int64_t deadline = ut_now_ms() + 30000;
  for (int left = 2 * n; left > 0;) {
    UT_CHECK(ut_now_ms() < deadline, "connect/accept of %d comms timed out (%d left)", n, left);
    for (int i = 0; i < n; i++) {
      if (!send_comms[i]) {
        UT_OK(s->api->connect(s->ctx, 0, NULL, theirs[i], &send_comms[i], NULL));
        left -= send_comms[i] != NULL;
      }
      if (!recv_comms[i]) {
        UT_OK(s->api->accept(listen_comms[i], &recv_comms[i], NULL));
        left -= recv_comms[i] != NULL;
      }
    }
  }
  free(mine);
  free(theirs);
}

/* Automatically registered buffers (see mh_or_auto). */
enum { UT_AUTO_MH = 2048 };
static struct {
  fab_ctx* ctx;
  const void* buf;
  size_t len;
  void* mh;
} auto_mh[UT_AUTO_MH];

void ut_side_open(ut_side* s, ut_pair* p) {
  memset(s, 0, sizeof(*s));
  s->api = &fab_api_core;
  UT_OK(s->api->init(&s->ctx, 42, NULL, ut_logger, NULL));
  int ndev = 0;
  UT_OK(s->api->devices(&ndev));
  UT_CHECK(ndev >= 1, "no device");
  ut_connect_many(s, p, 1, &s->send_comm, &s->recv_comm, &s->listen_comm);
}

void ut_side_close(ut_side* s) {
  for (int i = 0; i < UT_AUTO_MH; i++)
    if (auto_mh[i].ctx == s->ctx) auto_mh[i].ctx = NULL;
  UT_OK(s->api->close_send(s->send_comm));
  UT_OK(s->api->close_recv(s->recv_comm));
  UT_OK(s->api->close_listen(s->listen_comm));
  UT_OK(s->api->finalize(s->ctx));
}

/* Tests that do not care about registration pass NULL: the plugin refuses a
 * NULL memory handle for a non-empty buffer (NCCL always registers), so the
 * buffer is registered here once per context and stays registered until
 * finalize drops it. */

static void* mh_or_auto(ut_side* s, void* comm, const void* buf, size_t len, void* mh) {
  if (mh || !len) return mh;
  int free_slot = -1;
  for (int i = 0; i < UT_AUTO_MH; i++) {
    if (auto_mh[i].ctx == s->ctx && auto_mh[i].buf == buf && auto_mh[i].len >= len) return auto_mh[i].mh;
    if (free_slot < 0 && auto_mh[i].ctx != s->ctx) free_slot = i;
  }
  UT_CHECK(free_slot >= 0, "more than %d automatically registered buffers", UT_AUTO_MH);
  void* h = NULL;
  UT_OK(s->api->reg_mr(comm, (void*)buf, len, FAB_PTR_HOST, &h));
  auto_mh[free_slot].ctx = s->ctx;
  auto_mh[free_slot].buf = buf;
  auto_mh[free_slot].len = len;
  auto_mh[free_slot].mh = h;
  return h;
}

void* ut_isend(ut_side* s, void* comm, void* data, size_t size, int tag, void* mh) {
  mh = mh_or_auto(s, comm, data, size, mh);
  int64_t deadline = ut_now_ms() + 20000;
  for (;;) {
    void* req = NULL;
    UT_OK(s->api->isend(comm, data, size, tag, mh, NULL, &req));
    if (req) return req;
    UT_CHECK(ut_now_ms() < deadline, "isend of %zu bytes: no request for 20 s", size);
  }
}

void* ut_irecv(ut_side* s, void* comm, int n, void** data, const size_t* sizes, const int* tags, void** mhs) {
  void* auto_mhs[FAB_MAX_RECVS];
  if (!mhs && n > 0 && n <= FAB_MAX_RECVS) {
    for (int i = 0; i < n; i++) auto_mhs[i] = mh_or_auto(s, comm, data[i], sizes[i], NULL);
    mhs = auto_mhs;
  }
  int64_t deadline = ut_now_ms() + 20000;
  for (;;) {
    void* req = (void*)0x1; /* NCCL's hint: must be overwritten */
    UT_OK(s->api->irecv(comm, n, data, sizes, tags, mhs, NULL, &req));
    UT_CHECK(req != (void*)0x1, "irecv left the 0x1 hint in *request");
    if (req) return req;
    UT_CHECK(ut_now_ms() < deadline, "irecv: no request for 20 s");
  }
}

fab_result ut_wait(ut_side* s, void* req, int* sizes, int timeout_ms) {
  int64_t deadline = ut_now_ms() + timeout_ms;
  for (;;) {
    int done = 0;
    fab_result rc = s->api->test(req, &done, sizes);
    if (rc != FAB_OK || done) return rc;
    UT_CHECK(ut_now_ms() < deadline, "request %p not done after %d ms", req, timeout_ms);
  }
}

static uint64_t next(uint64_t* x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

void ut_fill(void* buf, size_t len, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  unsigned char* c = buf;
  for (size_t i = 0; i < len; i++) c[i] = (unsigned char)(i % 8 == 0 ? next(&x) : x >> (8 * (i % 8)));
}

long ut_verify(const void* buf, size_t len, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  const unsigned char* c = buf;
  for (size_t i = 0; i < len; i++) {
    unsigned char want = (unsigned char)(i % 8 == 0 ? next(&x) : x >> (8 * (i % 8)));
    if (c[i] != want) return (long)i;
  }
  return -1;
}
