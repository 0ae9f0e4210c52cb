/*
 * rmabench: one-sided operations through a plugin's ncclRmaPlugin_vN table
 * against raw libfabric doing the same writes, side by side in one run.
 *
 *   rmabench [--provider tcp|shm] [--api 13..17] [--reps N] [--smoke] [--csv FILE] PLUGIN.so
 *
 * Two processes on this host (forked; a socketpair carries handles and
 * barriers). Modes alternate raw, plugin, plugin, raw, ... for every point and
 * the report gives medians over the repetitions and plugin/raw ratios:
 *  - lat:  put ping-pong, one-way time = round trip / 2. Each side writes
 *          size bytes into the other's window and waits for the last word of
 *          the other's write to change (as ib_write_lat does), driving
 *          progress while it waits. raw: fi_write. plugin: iput.
 *  - bw:   one-way put bandwidth, 32 in flight, then one signal the target
 *          waits for. raw: fi_write, and fi_writedata for the signal.
 *  - sigrate: 8-byte puts with a signal each (ADD 1), 32 in flight, counted by
 *          the target until all have shown. raw: fi_writedata whose CQ data
 *          the target counts (one write per signalled put: the floor).
 * Every point checks its data (sampled words, and the last message whole).
 */
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fab_drivers.h"

enum { M_RAW = 0, M_PLUGIN = 1, NMODES = 2, MAX_REPS = 32, WINDOW = 32 };
static const char* const mode_name[NMODES] = {"raw", "plugin"};

static struct {
  const char* provider;
  const char* plugin;
  int api;
  int reps;
  int smoke;
  const char* csv;
} opt = {"tcp", NULL, 17, 5, 0, NULL};

static int rank, ctl;
static size_t win_bytes = (size_t)64 << 20;

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rmabench rank %d: ", rank);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  _exit(1);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void ctl_send(const void* p, size_t n) {
  if (write(ctl, p, n) != (ssize_t)n) die("control channel write: %s", strerror(errno));
}
static void ctl_recv(void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(ctl, (char*)p + got, n - got);
    if (r <= 0) die("control channel closed (the other rank failed)");
    got += (size_t)r;
  }
}
static void barrier(void) {
  char c = 'b';
  ctl_send(&c, 1);
  ctl_recv(&c, 1);
}

static inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 31);
}
static void fill(void* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t w = mix(seed ^ i);
    memcpy((char*)p + i, &w, 8);
  }
}
static void check(const void* p, size_t n, uint64_t seed, const char* what) {
  size_t step = n > 65536 ? 4096 : 8;
  for (size_t i = 0; i + 8 <= n; i += step) {
    uint64_t w;
    memcpy(&w, (const char*)p + i, 8);
    if (w != mix(seed ^ i)) die("%s: word at %zu of %zu is wrong", what, i, n);
  }
}

/* --- one mode's transport ----------------------------------------------------------- */

typedef struct mode {
  int m;
  /* raw */
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_ep* ep;
  struct fid_cq* cq;
  struct fid_av* av;
  struct fid_mr* mr;
  fi_addr_t peer;
  uint64_t peer_addr, peer_key;
  long remote_seen; /* raw: remote writes with CQ data seen */
  long local_posted, local_seen; /* raw: our writes posted, and their completions read (wherever read) */
  /* plugin */
  void* dl;
  fab_rma_api api;
  fab_ctx* ctx;
  void *coll, *rctx, *win_mh;
  /* both: the window (first half: what peers write; second half: our source) */
  unsigned char* win;
  uint64_t* sig; /* the signal words (plugin: registered with the window, at its start) */
} bmode;

static bmode modes[NMODES];

static void rc_check(int rc, const char* what) {
  if (rc) die("%s: %s", what, fi_strerror(-rc));
}

static void raw_open(bmode* x) {
  struct fi_info* h = fi_allocinfo();
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  h->domain_attr->cq_data_size = 8;
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->fabric_attr->prov_name = strdup(strcmp(opt.provider, "tcp") == 0 ? "tcp;ofi_rxm" : opt.provider);
  rc_check(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &x->info), "fi_getinfo (raw)");
  fi_freeinfo(h);
  rc_check(fi_fabric(x->info->fabric_attr, &x->fabric, NULL), "fi_fabric");
  rc_check(fi_domain(x->fabric, x->info, &x->domain, NULL), "fi_domain");
  struct fi_cq_attr ca = {.format = FI_CQ_FORMAT_DATA};
  rc_check(fi_cq_open(x->domain, &ca, &x->cq, NULL), "fi_cq_open");
  struct fi_av_attr aa = {.type = FI_AV_TABLE};
  rc_check(fi_av_open(x->domain, &aa, &x->av, NULL), "fi_av_open");
  rc_check(fi_endpoint(x->domain, x->info, &x->ep, NULL), "fi_endpoint");
  rc_check(fi_ep_bind(x->ep, &x->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  rc_check(fi_ep_bind(x->ep, &x->av->fid, 0), "fi_ep_bind(av)");
  rc_check(fi_enable(x->ep), "fi_enable");
  char name[256], peer[256];
  size_t n = sizeof name;
  rc_check(fi_getname(&x->ep->fid, name, &n), "fi_getname");
  ctl_send(&n, sizeof n);
  ctl_send(name, n);
  size_t pn;
  ctl_recv(&pn, sizeof pn);
  ctl_recv(peer, pn);
  if (fi_av_insert(x->av, peer, 1, &x->peer, 0, NULL) != 1) die("fi_av_insert");
  int prov_key = (x->info->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0;
  rc_check(fi_mr_reg(x->domain, x->win, win_bytes, FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ, 0,
                     prov_key ? 0 : 0x5000 + (uint64_t)rank, 0, &x->mr, NULL), "fi_mr_reg");
  uint64_t mine[2] = {(x->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)x->win : 0,
                      fi_mr_key(x->mr)};
  uint64_t theirs[2];
  ctl_send(mine, sizeof mine);
  ctl_recv(theirs, sizeof theirs);
  x->peer_addr = theirs[0];
  x->peer_key = theirs[1];
}

static void raw_close(bmode* x) {
  fi_close(&x->mr->fid);
  fi_close(&x->ep->fid);
  fi_close(&x->av->fid);
  fi_close(&x->cq->fid);
  fi_close(&x->domain->fid);
  fi_close(&x->fabric->fid);
  fi_freeinfo(x->info);
}

/* Reads the raw CQ: counts local completions and remote writes. */
static void raw_poll(bmode* x) {
  struct fi_cq_data_entry e[16];
  ssize_t n = fi_cq_read(x->cq, e, 16);
  if (n == -FI_EAGAIN) return;
  if (n < 0) {
    struct fi_cq_err_entry err = {0};
    fi_cq_readerr(x->cq, &err, 0);
    die("raw completion error: %s", fi_strerror(err.err));
  }
  for (ssize_t i = 0; i < n; i++) {
    if (e[i].flags & FI_REMOTE_WRITE) x->remote_seen++;
    else x->local_seen++;
  }
}

static void plugin_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  if (level != 2) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "rank %d WARN %s:%d ", rank, file, line);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static void ok(fab_result rc, const char* what) {
  if (rc != FAB_OK) die("%s returned %d", what, (int)rc);
}

static void plugin_open(bmode* x) {
  x->dl = dlopen(opt.plugin, RTLD_NOW | RTLD_LOCAL);
  if (!x->dl) die("dlopen(%s): %s", opt.plugin, dlerror());
  char sym[64];
  snprintf(sym, sizeof sym, "ncclRmaPlugin_v%d", opt.api);
  void* table = dlsym(x->dl, sym);
  if (!table || fab_driver_bind(sym, table, &x->api) != 0) die("%s: no %s (or no driver for it)", opt.plugin, sym);
  ok(x->api.init(&x->ctx, 0xbe7c, plugin_logger), "init");
  unsigned char handle[128], peer[128];
  void* listen = NULL;
  ok(x->api.listen(x->ctx, 0, handle, &listen), "listen");
  ctl_send(handle, sizeof handle);
  ctl_recv(peer, sizeof peer);
  void* handles[2] = {rank == 0 ? handle : peer, rank == 0 ? peer : handle};
  ok(x->api.connect(x->ctx, handles, 2, rank, 1, listen, &x->coll, NULL), "connect");
  ok(x->api.close_listen(listen), "closeListen");
  fab_rma_config cfg = {.n_contexts = 1, .traffic_class = INT_MIN, .rank_stride = 1};
  ok(x->api.create_context(x->coll, &cfg, &x->rctx, NULL), "createContext");
  ok(x->api.reg_mr_sym(x->coll, x->win, win_bytes, FAB_PTR_HOST, 0, &x->win_mh, NULL), "regMrSym");
}

static void plugin_close(bmode* x) {
  ok(x->api.destroy_context(x->rctx), "destroyContext");
  ok(x->api.dereg_mr_sym(x->coll, x->win_mh), "deregMrSym");
  barrier();
  ok(x->api.close_group(x->coll), "closeColl");
  ok(x->api.finalize(x->ctx), "finalize");
}

/* --- operations, the same shape in both modes ------------------------------------------ */

enum { SIG_BYTES = 4096 }; /* the window starts with the signal words; data follows */
static size_t data_off(void) { return SIG_BYTES; }
static size_t half(void) { return (win_bytes - SIG_BYTES) / 2; }
static size_t src_off(void) { return data_off() + half(); }

static void* put(bmode* x, size_t off, size_t size, int with_signal) {
  int peer = 1 - rank;
  if (x->m == M_RAW) {
    void* src = x->win + src_off() + off - data_off();
    ssize_t rc;
    do {
      rc = with_signal ? fi_writedata(x->ep, src, size, fi_mr_desc(x->mr), 1, x->peer, x->peer_addr + off,
                                      x->peer_key, NULL)
                       : fi_write(x->ep, src, size, fi_mr_desc(x->mr), x->peer, x->peer_addr + off, x->peer_key, NULL);
      if (rc == -FI_EAGAIN) raw_poll(x);
    } while (rc == -FI_EAGAIN);
    rc_check((int)rc, "fi_write");
    x->local_posted++;
    return (void*)1;
  }
  void* req = NULL;
  if (with_signal)
    ok(x->api.iput_signal(x->rctx, 0, src_off() + off - data_off(), x->win_mh, size, off, x->win_mh, (uint32_t)peer,
                          (uint64_t)rank * 8, x->win_mh, 1, FAB_SIGNAL_ADD, true, 0, &req),
       "iputSignal");
  else
    ok(x->api.iput(x->rctx, 0, src_off() + off - data_off(), x->win_mh, size, off, x->win_mh, (uint32_t)peer, 0, &req),
       "iput");
  return req;
}

/* Waits for every write posted (raw: completions read while posting count
 * too) or for each request in reqs (plugin). */
static void complete(bmode* x, void** reqs, int n) {
  uint64_t t0 = now_ns();
  if (x->m == M_RAW) {
    while (x->local_seen < x->local_posted) {
      raw_poll(x);
      if (now_ns() - t0 > 60ull * 1000000000ull)
        die("raw: %ld writes not complete after 60 s", x->local_posted - x->local_seen);
    }
    return;
  }
  for (int i = 0; i < n; i++) {
    int done = 0;
    while (!done) {
      ok(x->api.test(x->coll, reqs[i], &done), "test");
      if (!done && now_ns() - t0 > 60ull * 1000000000ull) die("plugin: a put not complete after 60 s");
    }
  }
}

static void progress(bmode* x) {
  if (x->m == M_RAW) raw_poll(x);
  else ok(x->api.progress(x->rctx), "rmaProgress");
}

/* The control channel's waits inside a measurement keep driving the mode's
 * progress: a write reported complete may still need its sender's progress
 * to reach the target (a provider's queue, a connection's flow), and a rank
 * blocked in read() would leave the other rank waiting for it forever. */
static void ctl_recv_driving(bmode* x, void* p, size_t n) {
  struct pollfd pfd = {.fd = ctl, .events = POLLIN};
  while (poll(&pfd, 1, 0) == 0) progress(x);
  ctl_recv(p, n);
}
static void barrier_driving(bmode* x) {
  char c = 'b';
  ctl_send(&c, 1);
  ctl_recv_driving(x, &c, 1);
}

/* Signals seen from the peer: raw counts remote writes with CQ data, the
 * plugin reads the signal word the peer adds to. */
static uint64_t signals(bmode* x) {
  if (x->m == M_RAW) return (uint64_t)x->remote_seen;
  return __atomic_load_n(&((uint64_t*)x->win)[1 - rank], __ATOMIC_ACQUIRE);
}

static void wait_signals(bmode* x, uint64_t want) {
  uint64_t t0 = now_ns();
  while (signals(x) < want) {
    progress(x);
    if (now_ns() - t0 > 60ull * 1000000000ull) die("%s: %llu signals of %llu after 60 s (local %ld of %ld)", mode_name[x->m],
                                                    (unsigned long long)signals(x), (unsigned long long)want, x->local_seen, x->local_posted);
  }
}

/* --- measurements ---------------------------------------------------------------------- */

typedef struct point {
  char test[16];
  size_t size;
  const char* unit;
  int higher;
  double v[NMODES][MAX_REPS];
  int n[NMODES];
} point;
static point points[64];
static int npoints;

static point* point_get(const char* test, size_t size, const char* unit, int higher) {
  for (int i = 0; i < npoints; i++)
    if (!strcmp(points[i].test, test) && points[i].size == size) return &points[i];
  point* p = &points[npoints++];
  memset(p, 0, sizeof *p);
  snprintf(p->test, sizeof p->test, "%s", test);
  p->size = size;
  p->unit = unit;
  p->higher = higher;
  return p;
}

/* Waits until the last 8 bytes of [off, off+size) hold seq. */
static void wait_word(bmode* x, size_t off, size_t size, uint64_t seq) {
  volatile uint64_t* w = (volatile uint64_t*)(x->win + off + size - 8);
  uint64_t t0 = now_ns();
  while (*w != seq) {
    progress(x);
    if (now_ns() - t0 > 30ull * 1000000000ull) die("%s lat: no message %llu after 30 s", mode_name[x->m],
                                                    (unsigned long long)seq);
  }
}

static double lat_once(bmode* x, size_t size, int iters, uint64_t salt) {
  size_t off = data_off();
  unsigned char* src = x->win + src_off();
  fill(src, size, salt);
  barrier_driving(x);
  uint64_t t0 = now_ns();
  for (int i = 1; i <= iters; i++) {
    uint64_t seq = salt + (uint64_t)i;
    if (rank == 0) {
      memcpy(src + size - 8, &seq, 8);
      void* r = put(x, off, size, 0);
      complete(x, &r, 1);
      wait_word(x, off, size, seq);
    } else {
      wait_word(x, off, size, seq);
      memcpy(src + size - 8, &seq, 8);
      void* r = put(x, off, size, 0);
      complete(x, &r, 1);
    }
  }
  double us = (double)(now_ns() - t0) / 1e3 / iters / 2;
  if (size > 8) check(x->win + off, size - 8, salt, "lat data");
  barrier_driving(x);
  return us;
}

static double bw_once(bmode* x, size_t size, size_t total, uint64_t salt) {
  size_t off = data_off();
  size_t slots = half() / size < WINDOW ? half() / size : WINDOW;
  if (slots < 1) die("bw: %zu bytes do not fit the window", size);
  long n = (long)(total / size);
  if (n < 4) n = 4;
  unsigned char* src = x->win + src_off();
  fill(src, size * slots, salt);
  uint64_t base = signals(x);
  barrier_driving(x);
  uint64_t t0 = now_ns();
  double gbs = 0;
  if (rank == 0) {
    void* reqs[WINDOW];
    for (long i = 0; i < n; i += (long)slots) {
      int k = (int)(n - i < (long)slots ? n - i : (long)slots);
      for (int j = 0; j < k; j++) reqs[j] = put(x, off + (size_t)j * size, size, 0);
      complete(x, reqs, k);
    }
    void* r = put(x, off, 8, 1); /* the signal the target waits for, behind every put */
    complete(x, &r, 1);
    double t;
    ctl_recv_driving(x, &t, sizeof t);
    gbs = t;
  } else {
    wait_signals(x, base + 1);
    double t = (double)n * size / (double)(now_ns() - t0);
    check(x->win + off, size * ((size_t)n < slots ? (size_t)n : slots), salt, "bw data");
    ctl_send(&t, sizeof t);
    gbs = t;
  }
  barrier_driving(x);
  return gbs;
}

static double sigrate_once(bmode* x, long n) {
  size_t off = data_off();
  uint64_t base = signals(x);
  barrier_driving(x);
  uint64_t t0 = now_ns();
  double rate = 0;
  if (rank == 0) {
    void* reqs[WINDOW];
    for (long i = 0; i < n; i += WINDOW) {
      int k = (int)(n - i < WINDOW ? n - i : WINDOW);
      for (int j = 0; j < k; j++) reqs[j] = put(x, off + (size_t)j * 8, 8, 1);
      complete(x, reqs, k);
    }
    ctl_recv_driving(x, &rate, sizeof rate);
  } else {
    wait_signals(x, base + (uint64_t)n);
    rate = (double)n / ((double)(now_ns() - t0) / 1e9) / 1e6;
    ctl_send(&rate, sizeof rate);
  }
  barrier_driving(x);
  return rate;
}

/* 0 during the warm-up round (connections, caches, page faults), whose figures are dropped. */
static int recording;

static void record(point* p, int m, double v) {
  if (recording) p->v[m][p->n[m]++] = v;
}

static void run_point(int rep, bmode* x) {
  static const size_t lat_sizes[] = {8, 4096, 65536, 1 << 20};
  static const size_t bw_sizes[] = {65536, 1 << 20, 16 << 20};
  uint64_t salt = mix((uint64_t)(rep + 1) * 1000 + (uint64_t)x->m + 1);
  for (size_t i = 0; i < sizeof lat_sizes / sizeof *lat_sizes; i++) {
    int iters = opt.smoke ? 20 : lat_sizes[i] >= (1 << 20) ? 200 : 2000;
    point* p = point_get("lat", lat_sizes[i], "us", 0);
    record(p, x->m, lat_once(x, lat_sizes[i], recording ? iters : iters / 10 + 1, salt + i * 7777));
  }
  for (size_t i = 0; i < sizeof bw_sizes / sizeof *bw_sizes; i++) {
    point* p = point_get("bw", bw_sizes[i], "GB/s", 1);
    record(p, x->m, bw_once(x, bw_sizes[i], opt.smoke || !recording ? (4u << 20) : (1u << 30), salt + i * 31));
  }
  point* p = point_get("sigrate", 8, "Mmsg/s", 1);
  record(p, x->m, sigrate_once(x, opt.smoke || !recording ? 256 : 50000));
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}
static double median(const double* v, int n) {
  double t[MAX_REPS];
  memcpy(t, v, (size_t)n * sizeof *v);
  qsort(t, (size_t)n, sizeof *t, cmp);
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static void report(void) {
  FILE* csv = opt.csv ? fopen(opt.csv, "w") : NULL;
  if (csv) fprintf(csv, "test,size,unit,raw,plugin,ratio,reps\n");
  printf("rmabench: %s, ncclRmaPlugin_v%d of %s, %d reps (medians; ratio = plugin / raw)\n", opt.provider, opt.api,
         opt.plugin, opt.reps);
  printf("%-8s %10s %8s %10s %10s %7s  %s\n", "test", "size", "unit", "raw", "plugin", "ratio", "target");
  for (int i = 0; i < npoints; i++) {
    point* p = &points[i];
    double r = median(p->v[M_RAW], p->n[M_RAW]), g = median(p->v[M_PLUGIN], p->n[M_PLUGIN]);
    double ratio = g / r;
    const char* target = !strcmp(p->test, "lat") && p->size == 8 ? "<= 1.10"
                         : !strcmp(p->test, "bw") && p->size >= (1 << 20) ? ">= 0.95" : "";
    printf("%-8s %10zu %8s %10.3f %10.3f %7.3f  %s\n", p->test, p->size, p->unit, r, g, ratio, target);
    if (csv) fprintf(csv, "%s,%zu,%s,%.4f,%.4f,%.4f,%d\n", p->test, p->size, p->unit, r, g, ratio, opt.reps);
  }
  if (csv) fclose(csv);
}

static void rank_main(void) {
  for (int m = 0; m < NMODES; m++) {
    modes[m].m = m;
    modes[m].win = aligned_alloc(4096, win_bytes);
    if (!modes[m].win) die("out of memory");
    memset(modes[m].win, 0, win_bytes);
  }
  raw_open(&modes[M_RAW]);
  plugin_open(&modes[M_PLUGIN]);
  run_point(-1, &modes[M_RAW]); /* warm-up, not recorded */
  run_point(-1, &modes[M_PLUGIN]);
  recording = 1;
  for (int rep = 0; rep < opt.reps; rep++) {
    int first = rep % 2 ? M_PLUGIN : M_RAW; /* raw, plugin, plugin, raw, ... */
    run_point(rep, &modes[first]);
    run_point(rep, &modes[1 - first]);
  }
  plugin_close(&modes[M_PLUGIN]);
  raw_close(&modes[M_RAW]);
}

static int usage(const char* argv0, FILE* to, int status) {
  fprintf(to, "usage: %s [--provider tcp|shm] [--api 13..17] [--reps N] [--smoke] [--csv FILE] [PLUGIN.so]\n"
          "  One-sided puts with signals through the plugin's RMA table against raw libfabric RMA, side by side.\n",
          argv0);
  return status;
}

/* An integer option in [lo, hi], or exit 2 naming it. */
static int int_arg(const char* argv0, const char* name, const char* text, int lo, int hi) {
  char* end = NULL;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || end == text || *end || v < lo || v > hi) {
    fprintf(stderr, "%s: --%s wants a number in %d..%d, not '%s'\n", argv0, name, lo, hi, text);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char** argv) {
  enum { O_PROVIDER = 256, O_API, O_REPS, O_CSV, O_SMOKE, O_HELP };
  static const struct option lo[] = {{"provider", 1, 0, O_PROVIDER}, {"api", 1, 0, O_API}, {"reps", 1, 0, O_REPS},
                                     {"csv", 1, 0, O_CSV}, {"smoke", 0, 0, O_SMOKE}, {"help", 0, 0, O_HELP},
                                     {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    switch (c) {
      case O_PROVIDER: opt.provider = optarg; break;
      case O_API: opt.api = int_arg(argv[0], "api", optarg, 13, 99); break;
      case O_REPS: opt.reps = int_arg(argv[0], "reps", optarg, 1, MAX_REPS / 2); break;
      case O_CSV: opt.csv = optarg; break;
      case O_SMOKE: opt.smoke = 1; break;
      case 'h':
      case O_HELP: return usage(argv[0], stdout, 0);
      default: return usage(argv[0], stderr, 2);
    }
  }
  if (optind < argc) opt.plugin = argv[optind++];
  if (optind < argc) return usage(argv[0], stderr, 2);
  if (!opt.plugin) opt.plugin = RMABENCH_PLUGIN;
  if (opt.smoke) {
    opt.reps = 2;
    win_bytes = (size_t)40 << 20;
  }
  setenv("FI_PROVIDER", strcmp(opt.provider, "tcp") == 0 ? "tcp;ofi_rxm" : opt.provider, 1);
  if (!strcmp(opt.provider, "tcp")) setenv("FI_TCP_IFACE", "lo", 0);
  setenv("FABRIC_TRANSPORT", "rdma", 1);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair: %s", strerror(errno));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    rank = 1;
    ctl = sv[1];
    close(sv[0]);
    rank_main();
    _exit(0);
  }
  ctl = sv[0];
  close(sv[1]);
  rank_main();
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "rmabench: rank 1 failed\n");
    return 1;
  }
  report();
  printf("all transfers verified\n");
  return 0;
}
