/*
 * fabric-demo: two processes on this host move data through the plugin, the
 * way NCCL would (dlopen, newest ncclNetPlugin_vN table, listen/connect/accept,
 * regMr, isend/irecv/test), verify every byte and print the throughput and
 * the 8-byte round-trip latency.
 *
 *   fabric-demo [--total BYTES] [--msg BYTES] [--window N] [--iters N] [--plugin PATH | PATH]
 *
 * BYTES takes K/M/G suffixes. The provider comes from FABRIC_PROVIDER or
 * FI_PROVIDER; when neither is set the demo uses tcp on loopback
 * (FI_PROVIDER=tcp, FI_TCP_IFACE=lo).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ft_api.h"

typedef struct {
  size_t total, msg;
  int window, iters;
} demo_opts;

typedef struct {
  double seconds;
  uint64_t bytes;
  uint64_t messages;
} demo_result;

static size_t parse_size(const char* s) {
  char* end = NULL;
  double v = strtod(s, &end);
  if (!end || end == s || v < 0) {
    fprintf(stderr, "fabric-demo: bad size '%s'\n", s);
    exit(2);
  }
  switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    case 0: break;
    default: fprintf(stderr, "fabric-demo: bad size suffix in '%s'\n", s); exit(2);
  }
  return (size_t)v;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double now_precise(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parent sends, child receives; W messages in flight; each message i uses
 * slot i % W, whose pattern depends on the slot, so a message landing in the
 * wrong buffer or out of order is caught. */
static void bandwidth(ft_side* s, ft_conn* c, const demo_opts* o, demo_result* r) {
  int w = o->window;
  uint64_t n = (o->total + o->msg - 1) / o->msg;
  ft_mr* m = calloc((size_t)w, sizeof *m);
  void** reqs = calloc((size_t)w, sizeof *reqs);
  uint64_t* msg_of = calloc((size_t)w, sizeof *msg_of);
  if (!m || !reqs || !msg_of) FT_FAIL("out of memory");
  int sender = ft_role() == FT_PARENT;
  /* The receiver compares against expected copies with memcmp, so checking
   * every byte costs little of the receiver's time (it also drives progress). */
  void** expect = calloc((size_t)w, sizeof *expect);
  if (!expect) FT_FAIL("out of memory");
  for (int k = 0; k < w; k++) {
    ft_mr_alloc(s, &m[k], sender ? c->send_comm : c->recv_comm, o->msg);
    ft_fill(sender ? m[k].buf : (expect[k] = ft_alloc(o->msg)), o->msg, ft_seed(42, (uint64_t)k, o->msg));
  }
  ft_sync(s->peer, "bw start", 30000);
  double t0 = now_precise();
  uint64_t posted = 0, completed = 0;
  int tag = 1;
  while (completed < n) {
    for (int k = 0; k < w; k++) {
      if (!reqs[k] && posted < n && posted % (uint64_t)w == (uint64_t)k) {
        size_t len = o->msg;
        if (sender) {
          fab_result rc = s->api->isend(c->send_comm, m[k].buf, len, tag, m[k].mh, NULL, &reqs[k]);
          if (rc != FAB_OK) FT_FAIL("isend returned %d: %s", (int)rc, ft_log_last_warn());
        } else {
          void* d = m[k].buf;
          fab_result rc = s->api->irecv(c->recv_comm, 1, &d, &len, &tag, &m[k].mh, NULL, &reqs[k]);
          if (rc != FAB_OK) FT_FAIL("irecv returned %d: %s", (int)rc, ft_log_last_warn());
        }
        if (reqs[k]) msg_of[k] = posted++;
      }
      if (reqs[k]) {
        int done = 0, size = 0;
        fab_result rc = s->api->test(reqs[k], &done, &size);
        if (rc != FAB_OK) FT_FAIL("test returned %d: %s", (int)rc, ft_log_last_warn());
        if (done) {
          reqs[k] = NULL;
          completed++;
          if (!sender) {
            if ((size_t)size != o->msg) FT_FAIL("message %llu: received %d bytes", (unsigned long long)msg_of[k], size);
            if (memcmp(m[k].buf, expect[k], o->msg) != 0) {
              char what[64];
              snprintf(what, sizeof what, "message %llu", (unsigned long long)msg_of[k]);
              ft_verify_or_fail(m[k].buf, o->msg, ft_seed(42, (uint64_t)k, o->msg), what);
            }
            memset(m[k].buf, FT_POISON, 64); /* a stale buffer would fail the next check */
          }
        }
      }
    }
  }
  r->seconds = now_precise() - t0;
  r->bytes = n * o->msg;
  r->messages = n;
  for (int k = 0; k < w; k++) {
    ft_mr_free(s, &m[k]);
    if (expect[k]) ft_free(expect[k], o->msg);
  }
  free(expect);
  free(m);
  free(reqs);
  free(msg_of);
}

/* 8-byte ping-pong; the parent starts. Returns the median round trip in us. */
static double latency(ft_side* s, ft_conn* c, int iters) {
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, 8);
  ft_mr_alloc(s, &rm, c->recv_comm, 8);
  double* rtt = calloc((size_t)iters, sizeof *rtt);
  if (!rtt) FT_FAIL("out of memory");
  int warm = iters / 10 + 10;
  int tag = 2;
  ft_sync(s->peer, "lat start", 30000);
  for (int i = -warm; i < iters; i++) {
    uint64_t v = (uint64_t)(i + warm) * 2 + (ft_role() == FT_PARENT ? 0 : 1);
    double t0 = now_precise();
    size_t len = 8;
    void* d = rm.buf;
    void* rreq = ft_irecv(s, c->recv_comm, 1, &d, &len, &tag, &rm.mh, 10000);
    if (ft_role() == FT_PARENT) {
      memcpy(sm.buf, &v, 8);
      void* sreq = ft_isend(s, c->send_comm, sm.buf, 8, tag, sm.mh, 10000);
      ft_wait(s, sreq, NULL, 10000, "ping");
      ft_wait(s, rreq, NULL, 10000, "pong");
    } else {
      ft_wait(s, rreq, NULL, 10000, "ping");
      uint64_t got;
      memcpy(&got, rm.buf, 8);
      memcpy(sm.buf, &got, 8);
      void* sreq = ft_isend(s, c->send_comm, sm.buf, 8, tag, sm.mh, 10000);
      ft_wait(s, sreq, NULL, 10000, "pong");
    }
    if (ft_role() == FT_PARENT) {
      uint64_t got;
      memcpy(&got, rm.buf, 8);
      if (got != v) FT_FAIL("ping %d: sent %llu, got back %llu", i, (unsigned long long)v, (unsigned long long)got);
      if (i >= 0) rtt[i] = (now_precise() - t0) * 1e6;
    }
  }
  double median = 0;
  if (ft_role() == FT_PARENT) {
    qsort(rtt, (size_t)iters, sizeof *rtt, cmp_double);
    median = rtt[iters / 2];
  }
  free(rtt);
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
  return median;
}

static void body(ft_peer* peer, void* arg) {
  const demo_opts* o = arg;
  ft_side s;
  ft_side_open(&s, peer, FT_API_NEWEST);
  ft_conn c;
  ft_connect_all(&s, &c, 1, 60000);
  demo_result r = {0};
  ft_phase("bandwidth");
  bandwidth(&s, &c, o, &r);
  demo_result theirs = {0};
  ft_xchg(peer, "bw result", &r, &theirs, sizeof r, 60000);
  ft_phase("latency");
  double rtt = latency(&s, &c, o->iters);
  ft_sync(peer, "done", 60000);
  ft_close_all(&s, &c, 1);
  if (peer->role == FT_PARENT) {
    const demo_result* rx = &theirs; /* the receiver's clock: first post to last byte verified */
    const char* prov = getenv("FABRIC_PROVIDER");
    if (!prov || !*prov) prov = getenv("FI_PROVIDER");
    printf("fabric-demo: %s of %s, provider %s, device 0 \"%s\" (%d device%s)\n", s.lib.desc, ft_plugin_path(),
           prov ? prov : "(auto)", s.props.name, s.ndev, s.ndev == 1 ? "" : "s");
    printf("moved %.2f GiB in %llu messages of %.2f MiB, process to process: %.3f s, %.2f GB/s "
           "(every byte verified)\n",
           (double)rx->bytes / (1024.0 * 1024 * 1024), (unsigned long long)rx->messages,
           (double)o->msg / (1024.0 * 1024), rx->seconds, (double)rx->bytes / rx->seconds / 1e9);
    printf("8-byte round trip: median %.1f us (one way ~%.1f us) over %d iterations\n", rtt, rtt / 2, o->iters);
    fflush(stdout);
  }
  ft_side_close(&s);
}

static void demo_fail(const char* msg) {
  fprintf(stderr, "fabric-demo: FAILED: %s\n", msg);
  exit(1);
}

int main(int argc, char** argv) {
  demo_opts o = {.total = (size_t)1 << 30, .msg = (size_t)4 << 20, .window = 8, .iters = 1000};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: %s [--total BYTES] [--msg BYTES] [--window N] [--iters N] [--plugin PATH | PATH]\n"
             "Moves BYTES (default 1G) in --msg messages (default 4M) between two processes through the\n"
             "plugin's newest NCCL net table, verifies every byte, prints GB/s and the 8-byte round trip.\n"
             "Provider: FABRIC_PROVIDER or FI_PROVIDER; default tcp on loopback.\n",
             argv[0]);
      return 0;
    }
    if (a[0] != '-') { /* a bare argument is the plugin library */
      setenv("FABRIC_TEST_PLUGIN", a, 1);
      continue;
    }
    if (!v) {
      fprintf(stderr, "fabric-demo: %s needs a value\n", a);
      return 2;
    }
    if (!strcmp(a, "--total")) o.total = parse_size(v);
    else if (!strcmp(a, "--msg")) o.msg = parse_size(v);
    else if (!strcmp(a, "--window")) o.window = atoi(v);
    else if (!strcmp(a, "--iters")) o.iters = atoi(v);
    else if (!strcmp(a, "--plugin")) setenv("FABRIC_TEST_PLUGIN", v, 1);
    else {
      fprintf(stderr, "fabric-demo: unknown option %s (try --help)\n", a);
      return 2;
    }
    i++;
  }
  if (o.msg == 0 || o.total == 0 || o.window < 1 || o.window > 32 || o.iters < 1) {
    fprintf(stderr, "fabric-demo: need --msg > 0, --total > 0, 1 <= --window <= 32, --iters >= 1\n");
    return 2;
  }
  const char* fp = getenv("FABRIC_PROVIDER");
  const char* ip = getenv("FI_PROVIDER");
  if ((!fp || !*fp) && (!ip || !*ip)) {
    setenv("FI_PROVIDER", "tcp", 1);
    if (!getenv("FI_TCP_IFACE")) setenv("FI_TCP_IFACE", "lo", 1);
  }
  if (!getenv("FABRIC_TEST_QUIET")) setenv("FABRIC_TEST_QUIET", "0", 1);
  ft_set_fail_hook(demo_fail);
  ft_run_pair("demo", body, &o, 300);
  return 0;
}
