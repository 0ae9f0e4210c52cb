/*
 * netbench: drives any NCCL net plugin through its ncclNetPlugin_vN table
 * and, in the same run, plain libfabric with the same provider, sizes and
 * window, so plugin overhead is a ratio measured side by side.
 *
 * Two ranks: rank 0 (the client, which prints the report) and rank 1 (the
 * server). On one host they are a fork over a socketpair; across hosts
 * --server / --connect open a TCP control socket that carries the 128-byte
 * handles, barriers and the server's measurements. Data moves only through
 * the transport under test.
 *
 * Every measured point runs its repetitions interleaved, raw and plugin
 * alternating (raw,plugin / plugin,raw ...), and every transfer's data is
 * checked: sampled words with a per-iteration pattern on every transfer, and
 * one full-buffer transfer per point and mode.
 */
#define _GNU_SOURCE /* POLLRDHUP */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nb.h"

#define MAX_REPS 64
#define MAX_POINTS 256
#define MAX_SIZES 32
#define NMODES 2
enum { M_RAW = 0, M_PLUGIN = 1 };
static const char* mode_name[NMODES] = {"raw", "plugin"};

/* ------------------------------------------------------------------------ */
/* Configuration (a POD so rank 0 can send it to a remote rank 1).           */

enum {
  T_LAT = 1 << 0,
  T_BW = 1 << 1,
  T_BIBW = 1 << 2,
  T_RATE = 1 << 3,
  T_SETUP = 1 << 4,
  T_MR = 1 << 5,
  T_MEM = 1 << 6,
  T_ALL = 0x7f,
};
static const struct { const char* name; int bit; } test_names[] = {
    {"lat", T_LAT}, {"bw", T_BW}, {"bibw", T_BIBW}, {"rate", T_RATE},
    {"setup", T_SETUP}, {"mr", T_MR}, {"mem", T_MEM},
};

typedef struct {
  uint32_t magic, cfg_size;
  char provider[64];
  int version;
  int dev;
  int modes;          /* bit per mode */
  int tests;
  int reps;
  int smoke;
  int verbose;
  int raw_minimal_hints;
  int nlat, nbw;
  size_t lat_sizes[MAX_SIZES];
  size_t bw_sizes[MAX_SIZES];
  int lat_iters;
  size_t lat_bytes;   /* per-point byte budget that caps iterations of large sizes */
  int window;
  size_t bw_bytes;    /* bytes per bandwidth point and run */
  size_t max_mem;     /* buffer bytes per side and direction */
  int rate_window;
  size_t rate_size;
  int rate_msgs;
  int setup_comms;
  int mem_comms;
  int mr_iters;
  uint64_t seed;
} nb_cfg;
#define CFG_MAGIC 0x4e424346u

static nb_cfg cfg;
static char plugin_path[4096];
static char csv_path[4096];
static int ctl = -1; /* control socket to the other rank */
static int loopback = 1;

/* ------------------------------------------------------------------------ */
/* Control channel.                                                          */

static void ctl_send(const void* p, size_t n) {
  const char* c = p;
  while (n) {
    ssize_t k = write(ctl, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) nb_die("control socket write: %s", k ? strerror(errno) : "closed");
    c += k;
    n -= (size_t)k;
  }
}

static void ctl_recv(void* p, size_t n) {
  char* c = p;
  while (n) {
    ssize_t k = read(ctl, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) nb_die("control socket read: %s (peer rank failed?)", k ? strerror(errno) : "closed");
    c += k;
    n -= (size_t)k;
  }
}

/* A rank that fails exits at once; its peer may be spinning in a test loop
 * that would never end, so a watchdog thread ends this rank when the control
 * socket reports the peer gone. Both ranks set `finishing` before the last
 * barrier, so a normal exit never trips it. */
static volatile int finishing;

static void* watchdog(void* arg) {
  (void)arg;
  struct pollfd p = {.fd = ctl, .events = POLLRDHUP};
  for (;;) {
    int n = poll(&p, 1, 200);
    if (finishing) return NULL;
    if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      fprintf(stderr, "netbench[rank %d]: the other rank exited early (see its message); stopping\n", nb_rank);
      _exit(3);
    }
  }
}

static void watchdog_start(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, watchdog, NULL)) nb_die("pthread_create");
  pthread_detach(t);
}

static void barrier(void) {
  char b = 'b', r;
  ctl_send(&b, 1);
  ctl_recv(&r, 1);
  if (r != 'b') nb_die("control protocol out of step (barrier got %d)", r);
}

static double xchg_double(double mine) {
  double theirs;
  ctl_send(&mine, sizeof(mine));
  ctl_recv(&theirs, sizeof(theirs));
  return theirs;
}

/* ------------------------------------------------------------------------ */
/* Data patterns: every transfer carries words derived from a per-transfer   */
/* seed; the receiver checks them, so stale or misplaced data cannot pass.   */

static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline uint64_t pat(uint64_t seed, size_t off) { return mix64(seed ^ ((uint64_t)off * 0x2545f4914f6cdd1dull)); }

#define NSAMPLES 6
/* Sample offsets: first and last aligned word, 4 pseudo-random aligned
 * words, and the last byte when size is not a multiple of 8. */
static int sample_offsets(uint64_t seed, size_t size, size_t* off) {
  if (size < 8) return 0;
  size_t nw = size / 8;
  off[0] = 0;
  off[1] = (nw - 1) * 8;
  for (int i = 2; i < NSAMPLES; i++) off[i] = (mix64(seed + (uint64_t)i) % nw) * 8;
  return NSAMPLES;
}

static void fill_samples(void* buf, size_t size, uint64_t seed) {
  unsigned char* b = buf;
  if (size < 8) {
    for (size_t i = 0; i < size; i++) b[i] = (unsigned char)pat(seed, i);
    return;
  }
  size_t off[NSAMPLES];
  int n = sample_offsets(seed, size, off);
  for (int i = 0; i < n; i++) {
    uint64_t v = pat(seed, off[i]);
    memcpy(b + off[i], &v, 8);
  }
  if (size % 8) b[size - 1] = (unsigned char)pat(seed, size - 1);
}

static int check_samples(const void* buf, size_t size, uint64_t seed) {
  const unsigned char* b = buf;
  if (size < 8) {
    for (size_t i = 0; i < size; i++)
      if (b[i] != (unsigned char)pat(seed, i)) return -1;
    return 0;
  }
  size_t off[NSAMPLES];
  int n = sample_offsets(seed, size, off);
  for (int i = 0; i < n; i++) {
    uint64_t v;
    memcpy(&v, b + off[i], 8);
    if (v != pat(seed, off[i])) return -1;
  }
  if (size % 8 && b[size - 1] != (unsigned char)pat(seed, size - 1)) return -1;
  return 0;
}

static void fill_full(void* buf, size_t size, uint64_t seed) {
  uint64_t* w = buf;
  size_t nw = size / 8;
  for (size_t i = 0; i < nw; i++) w[i] = pat(seed, i * 8);
  for (size_t i = nw * 8; i < size; i++) ((unsigned char*)buf)[i] = (unsigned char)pat(seed, i);
}

static long check_full(const void* buf, size_t size, uint64_t seed) {
  const uint64_t* w = buf;
  size_t nw = size / 8;
  for (size_t i = 0; i < nw; i++)
    if (w[i] != pat(seed, i * 8)) return (long)(i * 8);
  for (size_t i = nw * 8; i < size; i++)
    if (((const unsigned char*)buf)[i] != (unsigned char)pat(seed, i)) return (long)i;
  return -1;
}

/* ------------------------------------------------------------------------ */
/* Results.                                                                  */

typedef struct {
  char test[32];
  long param;          /* message size, comm count or buffer size */
  int window;
  char unit[16];
  int higher_better;
  double v[NMODES][MAX_REPS];
  int n[NMODES];
  char note[96];
} point_t;

static point_t points[MAX_POINTS];
static int npoints;

static point_t* point_new(const char* test, long param, int window, const char* unit, int higher_better) {
  if (npoints == MAX_POINTS) nb_die("too many result points");
  point_t* p = &points[npoints++];
  memset(p, 0, sizeof(*p));
  snprintf(p->test, sizeof(p->test), "%s", test);
  p->param = param;
  p->window = window;
  snprintf(p->unit, sizeof(p->unit), "%s", unit);
  p->higher_better = higher_better;
  return p;
}

static void point_add(point_t* p, int mode, double v) {
  if (p->n[mode] < MAX_REPS) p->v[mode][p->n[mode]++] = v;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(const double* v, int n) {
  if (n <= 0) return NAN;
  double t[MAX_REPS > 1 ? MAX_REPS : 1];
  double* s = n <= MAX_REPS ? t : malloc(sizeof(double) * (size_t)n);
  memcpy(s, v, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  if (s != t) free(s);
  return m;
}

static double vmin(const double* v, int n) {
  double m = INFINITY;
  for (int i = 0; i < n; i++) m = v[i] < m ? v[i] : m;
  return n ? m : NAN;
}

static double vmax(const double* v, int n) {
  double m = -INFINITY;
  for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
  return n ? m : NAN;
}

/* ------------------------------------------------------------------------ */
/* Transports, comms and buffers.                                            */

typedef struct {
  nb_xport x;
  int open;
  void* sc; /* send comm to the peer */
  void* rc; /* recv comm from the peer */
} mode_t_;
static mode_t_ modes[NMODES];

static int mode_on(int m) { return cfg.modes & (1 << m); }

static void xport_open(int m) {
  nb_xport_opts o = {.provider = cfg.provider[0] ? cfg.provider : NULL,
                     .plugin = plugin_path,
                     .version = cfg.version,
                     .dev = cfg.dev,
                     .verbose = cfg.verbose,
                     .raw_minimal_hints = cfg.raw_minimal_hints};
  memset(&modes[m], 0, sizeof(modes[m]));
  if (m == M_RAW)
    nb_raw_open(&modes[m].x, &o);
  else
    nb_plugin_open(&modes[m].x, &o);
  modes[m].open = 1;
}

static void xport_close(int m) {
  if (!modes[m].open) return;
  modes[m].x.ops->fini(&modes[m].x);
  modes[m].open = 0;
}

#define X(m) (&modes[m].x)
#define OPS(m) (modes[m].x.ops)

static void chk(int rc, int m, const char* what) {
  if (rc) nb_die("%s: %s returned %d", mode_name[m], what, rc);
}

/* Establishes n comm pairs with the peer: each rank gets n send comms and n
 * recv comms (either may be NULL to skip one direction: then the peer must
 * pass the opposite). Connect and accept are polled together, NCCL-style. */
static void comms_establish(int m, int n, void** sc, void** rc) {
  char (*mine)[NB_HANDLE_SIZE] = rc ? calloc((size_t)n, NB_HANDLE_SIZE) : NULL;
  char (*peer)[NB_HANDLE_SIZE] = sc ? calloc((size_t)n, NB_HANDLE_SIZE) : NULL;
  void** lc = rc ? calloc((size_t)n, sizeof(void*)) : NULL;
  for (int i = 0; rc && i < n; i++) {
    chk(OPS(m)->listen(X(m), mine[i], &lc[i]), m, "listen");
    if (!lc[i]) nb_die("%s: listen returned no listen comm", mode_name[m]);
  }
  /* Exchange: the side that listens sends, the side that connects receives.
   * Both directions at once when both are requested; write first is safe
   * because the peer reads in the same order below. */
  if (rc) ctl_send(mine, (size_t)n * NB_HANDLE_SIZE);
  if (sc) ctl_recv(peer, (size_t)n * NB_HANDLE_SIZE);
  for (int i = 0; i < n; i++) {
    if (sc) sc[i] = NULL;
    if (rc) rc[i] = NULL;
  }
  int left = (sc ? n : 0) + (rc ? n : 0);
  uint64_t t0 = nb_now_ns();
  while (left) {
    for (int i = 0; i < n; i++) {
      if (sc && !sc[i]) {
        chk(OPS(m)->connect(X(m), peer[i], &sc[i]), m, "connect");
        if (sc[i]) left--;
      }
      if (rc && !rc[i]) {
        chk(OPS(m)->accept(X(m), lc[i], &rc[i]), m, "accept");
        if (rc[i]) left--;
      }
    }
    if (nb_now_ns() - t0 > 120ull * 1000000000ull) nb_die("%s: connection setup of %d comms timed out", mode_name[m], n);
  }
  for (int i = 0; rc && i < n; i++) chk(OPS(m)->close_listen(X(m), lc[i]), m, "closeListen");
  free(mine);
  free(peer);
  free(lc);
}

/* One send comm and one recv comm each way: the data comms of a mode. */
static void data_comms_up(int m) {
  comms_establish(m, 1, &modes[m].sc, &modes[m].rc);
}

static void data_comms_down(int m) {
  if (modes[m].sc) chk(OPS(m)->close_send(X(m), modes[m].sc), m, "closeSend");
  if (modes[m].rc) chk(OPS(m)->close_recv(X(m), modes[m].rc), m, "closeRecv");
  modes[m].sc = modes[m].rc = NULL;
}

static void* buf_alloc(size_t size) {
  size_t len = size ? size : 8;
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) nb_die("mmap(%zu): %s", len, strerror(errno));
  memset(p, 0x5a, len); /* fault the pages in, outside any timing */
  return p;
}

static void buf_free(void* p, size_t size) { munmap(p, size ? size : 8); }

/* A set of buffers, registered with every open mode. */
typedef struct {
  int n;
  size_t size;
  void** buf;
  void** mh[NMODES];
} bufset;

static void bufset_init(bufset* b, int n, size_t size, int is_send) {
  b->n = n;
  b->size = size;
  b->buf = calloc((size_t)n, sizeof(void*));
  for (int i = 0; i < n; i++) b->buf[i] = buf_alloc(size);
  for (int m = 0; m < NMODES; m++) {
    b->mh[m] = NULL;
    if (!mode_on(m)) continue;
    b->mh[m] = calloc((size_t)n, sizeof(void*));
    void* comm = is_send ? modes[m].sc : modes[m].rc;
    for (int i = 0; i < n; i++) chk(OPS(m)->reg_mr(X(m), comm, b->buf[i], size ? size : 8, &b->mh[m][i]), m, "regMr");
  }
}

static void bufset_fini(bufset* b, int is_send) {
  for (int m = 0; m < NMODES; m++) {
    if (!b->mh[m]) continue;
    void* comm = is_send ? modes[m].sc : modes[m].rc;
    for (int i = 0; i < b->n; i++) chk(OPS(m)->dereg_mr(X(m), comm, b->mh[m][i]), m, "deregMr");
    free(b->mh[m]);
  }
  for (int i = 0; i < b->n; i++) buf_free(b->buf[i], b->size);
  free(b->buf);
}

/* Posting helpers: retry while the transport answers "not now" (NULL). */
static void* post_send(int m, void* comm, void* buf, size_t size, int tag, void* mh) {
  void* req = NULL;
  for (;;) {
    chk(OPS(m)->isend(X(m), comm, buf, size, tag, mh, &req), m, "isend");
    if (req) return req;
  }
}

static void* post_recv(int m, void* comm, void* buf, size_t size, int tag, void* mh) {
  void* req = NULL;
  for (;;) {
    chk(OPS(m)->irecv(X(m), comm, buf, size, tag, mh, &req), m, "irecv");
    if (req) return req;
  }
}

static int wait_req(int m, void* req) {
  int done = 0, size = -1;
  uint64_t spins = 0;
  while (!done) {
    chk(OPS(m)->test(X(m), req, &done, &size), m, "test");
    if (!done && ++spins % (1u << 24) == 0 && cfg.verbose) nb_log("%s: still waiting for a request", mode_name[m]);
  }
  return size;
}

/* Seed of one transfer: unique per run, point, iteration and direction. */
static uint64_t run_salt;
static inline uint64_t tseed(uint64_t it, int dir) { return mix64(run_salt ^ (it << 1) ^ (uint64_t)dir); }

static void verify_fail(int m, const char* what, size_t size, uint64_t it) {
  nb_die("%s: DATA MISMATCH in %s, size %zu, iteration %llu: the transport delivered wrong or stale bytes", mode_name[m],
         what, size, (unsigned long long)it);
}

/* One full-buffer transfer each way (untimed): every byte checked. */
static void full_check(int m, bufset* s, bufset* r, size_t size, int both_ways) {
  uint64_t seed = mix64(run_salt ^ 0xf011ull);
  for (int dir = 0; dir < (both_ways ? 2 : 1); dir++) {
    int sender = dir; /* rank 0 sends first */
    if (nb_rank == sender) {
      fill_full(s->buf[0], size, seed + (uint64_t)dir);
      barrier();
      void* q = post_send(m, modes[m].sc, s->buf[0], size, 7, s->mh[m][0]);
      wait_req(m, q);
      barrier();
    } else {
      memset(r->buf[0], 0xa5, size ? size : 8);
      void* q = post_recv(m, modes[m].rc, r->buf[0], size, 7, r->mh[m][0]);
      barrier();
      int got = wait_req(m, q);
      if ((size_t)got != size) nb_die("%s: full check: received %d bytes, expected %zu", mode_name[m], got, size);
      long bad = check_full(r->buf[0], size, seed + (uint64_t)dir);
      if (bad >= 0) nb_die("%s: DATA MISMATCH in full-buffer check, size %zu, first bad byte at %ld", mode_name[m], size, bad);
      barrier();
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Ping-pong latency.                                                        */

static double run_pingpong(int m, bufset* s, bufset* r, size_t size, int iters, int warm) {
  void* sc = modes[m].sc;
  void* rc = modes[m].rc;
  void* sb = s->buf[0];
  void* rb = r->buf[0];
  void* smh = s->mh[m][0];
  void* rmh = r->mh[m][0];
  double* lat = calloc((size_t)iters, sizeof(double));
  int total = iters + warm;
  barrier();
  if (nb_rank == 0) {
    for (int it = 0; it < total; it++) {
      fill_samples(sb, size, tseed((uint64_t)it, 0));
      uint64_t t0 = nb_now_ns();
      void* rq = post_recv(m, rc, rb, size, 1, rmh);
      void* sq = post_send(m, sc, sb, size, 1, smh);
      int sd = 0, rd = 0, got = -1;
      while (!sd || !rd) {
        if (!sd) chk(OPS(m)->test(X(m), sq, &sd, NULL), m, "test");
        if (!rd) chk(OPS(m)->test(X(m), rq, &rd, &got), m, "test");
      }
      uint64_t t1 = nb_now_ns();
      if ((size_t)got != size || check_samples(rb, size, tseed((uint64_t)it, 1))) verify_fail(m, "ping-pong", size, (uint64_t)it);
      if (it >= warm) lat[it - warm] = (double)(t1 - t0) / 2e3; /* one-way, us */
    }
  } else {
    void* rq = post_recv(m, rc, rb, size, 1, rmh);
    for (int it = 0; it < total; it++) {
      int got = wait_req(m, rq);
      if ((size_t)got != size || check_samples(rb, size, tseed((uint64_t)it, 0))) verify_fail(m, "ping-pong", size, (uint64_t)it);
      fill_samples(sb, size, tseed((uint64_t)it, 1));
      if (it + 1 < total) rq = post_recv(m, rc, rb, size, 1, rmh);
      void* sq = post_send(m, sc, sb, size, 1, smh);
      wait_req(m, sq);
    }
  }
  barrier();
  double med = nb_rank == 0 ? median(lat, iters) : 0;
  free(lat);
  return med;
}

/* ------------------------------------------------------------------------ */
/* Streaming: a window of in-flight sends and/or receives.                   */

typedef struct {
  void* req;
  uint64_t msg; /* message index carried by this slot */
  int busy;
} slot_t;

/* Runs one stream of nmsg messages. send/recv select the directions this
 * rank takes part in. Returns this rank's elapsed seconds from the start
 * barrier to its last completion. */
static double run_stream(int m, bufset* s, bufset* r, size_t size, int window, long nmsg, int do_send, int do_recv) {
  void* sc = modes[m].sc;
  void* rc = modes[m].rc;
  slot_t* ss = calloc((size_t)window, sizeof(slot_t));
  slot_t* rs = calloc((size_t)window, sizeof(slot_t));
  long sent_posted = 0, sent_done = 0, recv_posted = 0, recv_done = 0;
  /* The receiver pre-posts its window before the start barrier. */
  if (do_recv)
    for (int i = 0; i < window && recv_posted < nmsg; i++) {
      rs[i].msg = (uint64_t)recv_posted++;
      rs[i].req = post_recv(m, rc, r->buf[i], size, 2, r->mh[m][i]);
      rs[i].busy = 1;
    }
  barrier();
  uint64_t t0 = nb_now_ns();
  while ((do_send && sent_done < nmsg) || (do_recv && recv_done < nmsg)) {
    for (int i = 0; i < window; i++) {
      if (do_send) {
        slot_t* q = &ss[i];
        if (!q->busy && sent_posted < nmsg) {
          uint64_t msg = (uint64_t)sent_posted;
          fill_samples(s->buf[i], size, tseed(msg, nb_rank));
          void* req = NULL;
          chk(OPS(m)->isend(X(m), sc, s->buf[i], size, 2, s->mh[m][i], &req), m, "isend");
          if (req) {
            q->req = req;
            q->msg = msg;
            q->busy = 1;
            sent_posted++;
          }
        } else if (q->busy) {
          int done = 0;
          chk(OPS(m)->test(X(m), q->req, &done, NULL), m, "test");
          if (done) {
            q->busy = 0;
            sent_done++;
          }
        }
      }
      if (do_recv) {
        slot_t* q = &rs[i];
        if (q->busy) {
          int done = 0, got = -1;
          chk(OPS(m)->test(X(m), q->req, &done, &got), m, "test");
          if (done) {
            if ((size_t)got != size || check_samples(r->buf[i], size, tseed(q->msg, 1 - nb_rank)))
              verify_fail(m, "stream", size, q->msg);
            q->busy = 0;
            recv_done++;
          }
        }
        if (!q->busy && recv_posted < nmsg) {
          void* req = NULL;
          chk(OPS(m)->irecv(X(m), rc, r->buf[i], size, 2, r->mh[m][i], &req), m, "irecv");
          if (req) {
            q->req = req;
            q->msg = (uint64_t)recv_posted++;
            q->busy = 1;
          }
        }
      }
    }
  }
  uint64_t t1 = nb_now_ns();
  free(ss);
  free(rs);
  barrier();
  return (double)(t1 - t0) / 1e9;
}

/* ------------------------------------------------------------------------ */
/* The schedule: points x repetitions x modes, interleaved.                  */

static int order_of(int rep, int k) { return (rep % 2 == 0) ? k : 1 - k; } /* ABBA */

#define FOR_REPS_MODES(rep, m)                                   \
  for (int rep = 0; rep < cfg.reps; rep++)                       \
    for (int k_ = 0; k_ < NMODES; k_++)                          \
      for (int m = order_of(rep, k_), once_ = 1; once_; once_ = 0) \
        if (mode_on(m))

static void set_salt(int test, size_t param, int rep, int m) {
  run_salt = mix64(cfg.seed ^ mix64(((uint64_t)test << 48) ^ ((uint64_t)param << 8) ^ ((uint64_t)rep << 2) ^ (uint64_t)m));
}

static void test_latency(void) {
  for (int i = 0; i < cfg.nlat; i++) {
    size_t size = cfg.lat_sizes[i];
    int iters = cfg.lat_iters;
    if (size && cfg.lat_bytes / size < (size_t)iters) iters = (int)(cfg.lat_bytes / size);
    if (iters < 20) iters = 20;
    int warm = iters / 20 + 10;
    point_t* p = point_new("lat", (long)size, 1, "us", 0);
    bufset s, r;
    bufset_init(&s, 1, size, 1);
    bufset_init(&r, 1, size, 0);
    FOR_REPS_MODES(rep, m) {
      set_salt(T_LAT, size, rep, m);
      double v = run_pingpong(m, &s, &r, size, iters, warm);
      full_check(m, &s, &r, size, 1);
      point_add(p, m, v);
    }
    snprintf(p->note, sizeof(p->note), "%d iters", iters);
    bufset_fini(&s, 1);
    bufset_fini(&r, 0);
  }
}

static int bw_window(size_t size, int window) {
  int w = window;
  while (w > 1 && (size_t)w * size > cfg.max_mem) w--;
  return w;
}

static void test_stream(int test, const char* name, size_t size, int window, long nmsg, const char* unit) {
  int bidir = test == T_BIBW;
  point_t* p = point_new(name, (long)size, window, unit, 1);
  bufset s, r;
  int is_sender = bidir || nb_rank == 0, is_receiver = bidir || nb_rank == 1;
  bufset_init(&s, is_sender ? window : 1, size, 1);
  bufset_init(&r, is_receiver ? window : 1, size, 0);
  long warm = 2L * window < nmsg ? 2L * window : nmsg;
  FOR_REPS_MODES(rep, m) {
    set_salt(test, size, rep, m);
    run_stream(m, &s, &r, size, window, warm, is_sender, is_receiver);
    set_salt(test, size, rep + 1000, m);
    double mine = run_stream(m, &s, &r, size, window, nmsg, is_sender, is_receiver);
    double theirs = xchg_double(mine);
    double t = mine > theirs ? mine : theirs; /* the slower side bounds the transfer */
    double v;
    if (test == T_RATE)
      v = (double)nmsg / t / 1e6; /* Mmsg/s */
    else
      v = (double)nmsg * (double)size * (bidir ? 2.0 : 1.0) / t / 1e9; /* GB/s */
    set_salt(test, size, rep + 2000, m);
    full_check(m, &s, &r, size, bidir);
    point_add(p, m, v);
  }
  snprintf(p->note, sizeof(p->note), "%ld msgs", nmsg);
  bufset_fini(&s, 1);
  bufset_fini(&r, 0);
}

static void test_bandwidth(int test) {
  const char* name = test == T_BW ? "bw" : "bibw";
  for (int i = 0; i < cfg.nbw; i++) {
    size_t size = cfg.bw_sizes[i];
    int w = bw_window(size, cfg.window);
    long nmsg = (long)(cfg.bw_bytes / size);
    if (nmsg < 4L * w) nmsg = 4L * w;
    test_stream(test, name, size, w, nmsg, "GB/s");
  }
}

static void test_rate(void) {
  test_stream(T_RATE, "rate", cfg.rate_size, cfg.rate_window, cfg.rate_msgs, "Mmsg/s");
}

/* Connection setup: rank 1 listens n times and sends the handles, rank 0
 * connects, both poll; timed on rank 0 from "go" to rank 1's "all accepted".
 * Every new comm then carries one verified 8-byte message (untimed). */
static double run_setup(int m, int n) {
  void** sc = calloc((size_t)n, sizeof(void*));
  void** rc = calloc((size_t)n, sizeof(void*));
  barrier();
  uint64_t t0 = nb_now_ns();
  comms_establish(m, n, nb_rank == 0 ? sc : NULL, nb_rank == 1 ? rc : NULL);
  barrier();
  uint64_t t1 = nb_now_ns();
  /* Verify each comm: 8 bytes carrying its index. */
  uint64_t* b = buf_alloc(8);
  void* mh;
  for (int i = 0; i < n; i++) {
    void* comm = nb_rank == 0 ? sc[i] : rc[i];
    chk(OPS(m)->reg_mr(X(m), comm, b, 8, &mh), m, "regMr");
    if (nb_rank == 0) {
      b[0] = pat(run_salt, (size_t)i);
      wait_req(m, post_send(m, comm, b, 8, 3, mh));
    } else {
      b[0] = 0;
      int got = wait_req(m, post_recv(m, comm, b, 8, 3, mh));
      if (got != 8 || b[0] != pat(run_salt, (size_t)i)) verify_fail(m, "new comm", 8, (uint64_t)i);
    }
    chk(OPS(m)->dereg_mr(X(m), comm, mh), m, "deregMr");
  }
  buf_free(b, 8);
  for (int i = 0; i < n; i++) {
    if (nb_rank == 0) chk(OPS(m)->close_send(X(m), sc[i]), m, "closeSend");
    else chk(OPS(m)->close_recv(X(m), rc[i]), m, "closeRecv");
  }
  barrier();
  free(sc);
  free(rc);
  return (double)(t1 - t0) / 1e6; /* ms */
}

static void test_setup(void) {
  int counts[2] = {1, cfg.setup_comms};
  for (int c = 0; c < 2; c++) {
    int n = counts[c];
    if (c == 1 && n == 1) break;
    point_t* p = point_new("setup", n, 1, "ms", 0);
    FOR_REPS_MODES(rep, m) {
      set_salt(T_SETUP, (size_t)n, rep, m);
      point_add(p, m, run_setup(m, n));
    }
    snprintf(p->note, sizeof(p->note), "total for %d comm%s", n, n > 1 ? "s" : "");
  }
}

/* Memory registration, on rank 0's data send comm (rank 1 idles). Three
 * measurements per buffer size:
 *   mr_fresh:  register a buffer never registered before (distinct address)
 *   mr_cached: register a sub-range of a registered buffer (the
 *              registration cache's hit path; raw has no cache, so its
 *              figure is again a full fi_mr_reg)
 *   mr_dereg:  deregister a fresh registration. */
static void test_mr(void) {
  size_t sizes[] = {4096, 1 << 20, 64 << 20};
  int nsizes = cfg.smoke ? 2 : 3;
  for (int si = 0; si < nsizes; si++) {
    size_t size = sizes[si];
    int iters = cfg.mr_iters;
    size_t budget = (size_t)256 << 20;
    if ((size_t)iters * size > budget) iters = (int)(budget / size);
    if (iters < 5) iters = 5;
    point_t* pf = point_new("mr_fresh", (long)size, 1, "us", 0);
    point_t* pc = point_new("mr_cached", (long)size, 1, "us", 0);
    point_t* pd = point_new("mr_dereg", (long)size, 1, "us", 0);
    FOR_REPS_MODES(rep, m) {
      barrier();
      if (nb_rank != 0) {
        barrier();
        continue;
      }
      double* tf = calloc((size_t)iters, sizeof(double));
      double* tc = calloc((size_t)iters, sizeof(double));
      double* td = calloc((size_t)iters, sizeof(double));
      void** bufs = calloc((size_t)iters, sizeof(void*));
      void** mhs = calloc((size_t)iters, sizeof(void*));
      void* comm = modes[m].sc;
      for (int i = 0; i < iters; i++) bufs[i] = buf_alloc(size); /* all live: distinct addresses */
      for (int i = 0; i < iters; i++) {
        uint64_t t0 = nb_now_ns();
        chk(OPS(m)->reg_mr(X(m), comm, bufs[i], size, &mhs[i]), m, "regMr");
        tf[i] = (double)(nb_now_ns() - t0) / 1e3;
      }
      /* Sub-ranges of the (still registered) buffers: a cache hit. */
      for (int i = 0; i < iters; i++) {
        size_t off = size >= 8192 ? 4096 : 0, len = size >= 8192 ? size / 2 : size;
        void* mh;
        uint64_t t0 = nb_now_ns();
        chk(OPS(m)->reg_mr(X(m), comm, (char*)bufs[i] + off, len, &mh), m, "regMr(sub-range)");
        tc[i] = (double)(nb_now_ns() - t0) / 1e3;
        chk(OPS(m)->dereg_mr(X(m), comm, mh), m, "deregMr(sub-range)");
      }
      for (int i = 0; i < iters; i++) {
        uint64_t t0 = nb_now_ns();
        chk(OPS(m)->dereg_mr(X(m), comm, mhs[i]), m, "deregMr");
        td[i] = (double)(nb_now_ns() - t0) / 1e3;
      }
      for (int i = 0; i < iters; i++) buf_free(bufs[i], size);
      point_add(pf, m, median(tf, iters));
      point_add(pc, m, median(tc, iters));
      point_add(pd, m, median(td, iters));
      free(tf), free(tc), free(td), free(bufs), free(mhs);
      barrier();
    }
    snprintf(pf->note, sizeof(pf->note), "%d bufs, median", iters);
    snprintf(pc->note, sizeof(pc->note), "half of a registered buf");
    snprintf(pd->note, sizeof(pd->note), "%d bufs, median", iters);
  }
}

/* ------------------------------------------------------------------------ */
/* Resident memory per comm, measured in freshly forked processes so no     */
/* earlier test's freed memory hides the growth.                             */

static double rss_kib(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, res = 0;
  if (!f || fscanf(f, "%ld %ld", &size, &res) != 2) nb_die("cannot read /proc/self/statm");
  fclose(f);
  return (double)res * (double)sysconf(_SC_PAGESIZE) / 1024.0;
}

enum { MEM_INIT_KIB, MEM_FIRST_MS, MEM_IDLE_KIB, MEM_USED_KIB, MEM_NRES };

static void mem_child(int m, int rep, int wfd) {
  watchdog_start(); /* threads do not survive fork */
  double res[MEM_NRES];
  int n = cfg.mem_comms;
  void** sc = calloc((size_t)n + 1, sizeof(void*));
  void** rc = calloc((size_t)n + 1, sizeof(void*));
  int s = nb_rank == 0; /* rank 0 holds send comms, rank 1 recv comms */
  /* Cold start: transport init plus the first comm, which pays the one-time
   * costs (the plugin creates its endpoint on first use, raw at open). */
  barrier();
  uint64_t t0 = nb_now_ns();
  double r0 = rss_kib();
  xport_open(m);
  res[MEM_INIT_KIB] = rss_kib() - r0;
  comms_establish(m, 1, s ? sc : NULL, s ? NULL : rc);
  barrier();
  res[MEM_FIRST_MS] = (double)(nb_now_ns() - t0) / 1e6;
  double r1 = rss_kib();
  comms_establish(m, n, s ? sc + 1 : NULL, s ? NULL : rc + 1);
  barrier();
  double r2 = rss_kib();
  res[MEM_IDLE_KIB] = (r2 - r1) / n;
  /* Use each comm once (8 bytes, verified) and measure again. */
  set_salt(T_MEM, (size_t)n, rep, m);
  uint64_t* b = buf_alloc(8);
  void* mhs[1];
  for (int i = 1; i <= n; i++) {
    void* comm = s ? sc[i] : rc[i];
    chk(OPS(m)->reg_mr(X(m), comm, b, 8, &mhs[0]), m, "regMr");
    if (s) {
      b[0] = pat(run_salt, (size_t)i);
      wait_req(m, post_send(m, comm, b, 8, 4, mhs[0]));
    } else {
      b[0] = 0;
      int got = wait_req(m, post_recv(m, comm, b, 8, 4, mhs[0]));
      if (got != 8 || b[0] != pat(run_salt, (size_t)i)) verify_fail(m, "mem comm", 8, (uint64_t)i);
    }
    chk(OPS(m)->dereg_mr(X(m), comm, mhs[0]), m, "deregMr");
  }
  barrier();
  res[MEM_USED_KIB] = (rss_kib() - r1) / n;
  for (int i = 0; i <= n; i++) {
    if (s) chk(OPS(m)->close_send(X(m), sc[i]), m, "closeSend");
    else chk(OPS(m)->close_recv(X(m), rc[i]), m, "closeRecv");
  }
  barrier();
  xport_close(m);
  if (write(wfd, res, sizeof(res)) != (ssize_t)sizeof(res)) nb_die("result pipe");
  finishing = 1; /* the parent keeps the socket open: no hang-up to see */
  _exit(0);
}

static void test_mem(void) {
  point_t* pi = point_new("mem_init", 0, 1, "KiB", 0);
  point_t* pf = point_new("setup_first", 1, 1, "ms", 0);
  point_t* ps = point_new("mem_send_comm", cfg.mem_comms, 1, "KiB", 0);
  point_t* pr = point_new("mem_recv_comm", cfg.mem_comms, 1, "KiB", 0);
  point_t* pu = point_new("mem_send_used", cfg.mem_comms, 1, "KiB", 0);
  point_t* pv = point_new("mem_recv_used", cfg.mem_comms, 1, "KiB", 0);
  FOR_REPS_MODES(rep, m) {
    int fds[2];
    if (pipe(fds)) nb_die("pipe");
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) nb_die("fork");
    if (pid == 0) {
      close(fds[0]);
      mem_child(m, rep, fds[1]);
    }
    close(fds[1]);
    double res[MEM_NRES];
    ssize_t k = read(fds[0], res, sizeof(res));
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    if (k != (ssize_t)sizeof(res) || !WIFEXITED(st) || WEXITSTATUS(st)) nb_die("%s: memory test process failed", mode_name[m]);
    double peer[MEM_NRES];
    ctl_send(res, sizeof(res));
    ctl_recv(peer, sizeof(peer));
    double* s = nb_rank == 0 ? res : peer;
    double* r = nb_rank == 0 ? peer : res;
    point_add(pi, m, s[MEM_INIT_KIB]);
    point_add(pf, m, s[MEM_FIRST_MS]);
    point_add(ps, m, s[MEM_IDLE_KIB]);
    point_add(pr, m, r[MEM_IDLE_KIB]);
    point_add(pu, m, s[MEM_USED_KIB]);
    point_add(pv, m, r[MEM_USED_KIB]);
  }
  snprintf(pi->note, sizeof(pi->note), "RSS growth of init (plugin: no endpoint yet)");
  snprintf(pf->note, sizeof(pf->note), "cold start: init + first comm, fresh process");
  snprintf(ps->note, sizeof(ps->note), "RSS/comm, idle, over %d comms", cfg.mem_comms);
  snprintf(pr->note, sizeof(pr->note), "RSS/comm, idle, over %d comms", cfg.mem_comms);
  snprintf(pu->note, sizeof(pu->note), "RSS/comm after one message each");
  snprintf(pv->note, sizeof(pv->note), "RSS/comm after one message each");
}

/* ------------------------------------------------------------------------ */
/* Report.                                                                   */

static const char* target_of(const point_t* p, double ratio, char* buf, size_t len) {
  buf[0] = 0;
  if (isnan(ratio)) return buf;
  if (!strcmp(p->test, "lat") && p->param == 8)
    snprintf(buf, len, "<=1.10 %s", ratio <= 1.10 ? "met" : "MISSED");
  else if (!strcmp(p->test, "bw") && p->param >= (1 << 20))
    snprintf(buf, len, ">=0.95 %s", ratio >= 0.95 ? "met" : "MISSED");
  else if (!strcmp(p->test, "bibw") && p->param >= (1 << 20))
    snprintf(buf, len, ">=0.95 %s", ratio >= 0.95 ? "met" : "MISSED");
  else if (!strcmp(p->test, "rate"))
    snprintf(buf, len, ">=0.90 %s", ratio >= 0.90 ? "met" : "MISSED");
  return buf;
}

static void fmt_size(long v, char* buf, size_t len) {
  if (v >= (1L << 20) && v % (1L << 20) == 0)
    snprintf(buf, len, "%ldM", v >> 20);
  else if (v >= 1024 && v % 1024 == 0)
    snprintf(buf, len, "%ldK", v >> 10);
  else
    snprintf(buf, len, "%ld", v);
}

static void report(FILE* out, const char* header) {
  fprintf(out, "\n%s\n", header);
  fprintf(out, "%-14s %8s %4s %-7s %10s %21s %10s %21s %7s %-12s %s\n", "test", "param", "win", "unit", "raw", "raw min..max",
          "plugin", "plugin min..max", "ratio", "target", "note");
  for (int i = 0; i < npoints; i++) {
    point_t* p = &points[i];
    double mr = median(p->v[M_RAW], p->n[M_RAW]), mp = median(p->v[M_PLUGIN], p->n[M_PLUGIN]);
    double ratio = (p->n[M_RAW] && p->n[M_PLUGIN] && mr != 0) ? mp / mr : NAN;
    char sz[32], rr[48], pr[48], tg[32], rt[16];
    fmt_size(p->param, sz, sizeof(sz));
    snprintf(rr, sizeof(rr), "%.3g..%.3g", vmin(p->v[M_RAW], p->n[M_RAW]), vmax(p->v[M_RAW], p->n[M_RAW]));
    snprintf(pr, sizeof(pr), "%.3g..%.3g", vmin(p->v[M_PLUGIN], p->n[M_PLUGIN]), vmax(p->v[M_PLUGIN], p->n[M_PLUGIN]));
    if (isnan(ratio)) snprintf(rt, sizeof(rt), "-");
    else snprintf(rt, sizeof(rt), "%.3f", ratio);
    char ms[2][24];
    snprintf(ms[0], sizeof(ms[0]), p->n[M_RAW] ? "%.4g" : "-", mr);
    snprintf(ms[1], sizeof(ms[1]), p->n[M_PLUGIN] ? "%.4g" : "-", mp);
    fprintf(out, "%-14s %8s %4d %-7s %10s %21s %10s %21s %7s %-12s %s\n", p->test, sz, p->window, p->unit, ms[0],
            p->n[M_RAW] ? rr : "-", ms[1], p->n[M_PLUGIN] ? pr : "-", rt, target_of(p, ratio, tg, sizeof(tg)), p->note);
  }
}

static void write_csv(const char* path, const char* xdesc[NMODES]) {
  FILE* f = fopen(path, "w");
  if (!f) nb_die("cannot write %s: %s", path, strerror(errno));
  fprintf(f, "# netbench; provider=%s; plugin=%s; %s; %s\n", cfg.provider, plugin_path, xdesc[M_RAW] ? xdesc[M_RAW] : "",
          xdesc[M_PLUGIN] ? xdesc[M_PLUGIN] : "");
  fprintf(f, "test,param,window,unit,higher_is_better,reps,raw_median,raw_min,raw_max,plugin_median,plugin_min,plugin_max,"
             "ratio_plugin_over_raw,raw_values,plugin_values,note\n");
  for (int i = 0; i < npoints; i++) {
    point_t* p = &points[i];
    double mr = median(p->v[M_RAW], p->n[M_RAW]), mp = median(p->v[M_PLUGIN], p->n[M_PLUGIN]);
    double ratio = (p->n[M_RAW] && p->n[M_PLUGIN] && mr != 0) ? mp / mr : NAN;
    fprintf(f, "%s,%ld,%d,%s,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,", p->test, p->param, p->window, p->unit,
            p->higher_better, p->n[M_RAW] > p->n[M_PLUGIN] ? p->n[M_RAW] : p->n[M_PLUGIN], mr,
            vmin(p->v[M_RAW], p->n[M_RAW]), vmax(p->v[M_RAW], p->n[M_RAW]), mp, vmin(p->v[M_PLUGIN], p->n[M_PLUGIN]),
            vmax(p->v[M_PLUGIN], p->n[M_PLUGIN]), ratio);
    for (int m = 0; m < NMODES; m++) {
      for (int j = 0; j < p->n[m]; j++) fprintf(f, "%s%.6g", j ? ";" : "", p->v[m][j]);
      fprintf(f, ",");
    }
    fprintf(f, "\"%s\"\n", p->note);
  }
  fclose(f);
}

/* ------------------------------------------------------------------------ */
/* One rank's whole run.                                                     */

static int rank_main(void) {
  char xdesc_buf[NMODES][256];
  const char* xdesc[NMODES] = {NULL, NULL};
  /* Memory first: it forks clean processes before this one touches libfabric. */
  if (cfg.tests & T_MEM) test_mem();
  for (int m = 0; m < NMODES; m++) {
    if (!mode_on(m)) continue;
    xport_open(m);
    snprintf(xdesc_buf[m], sizeof(xdesc_buf[m]), "%s", modes[m].x.desc);
    xdesc[m] = xdesc_buf[m];
    if (nb_rank == 0) printf("%-6s: %s\n", mode_name[m], modes[m].x.desc);
    barrier();
    data_comms_up(m);
  }
  if (nb_rank == 0) fflush(stdout);
  if (cfg.tests & T_LAT) test_latency();
  if (cfg.tests & T_BW) test_bandwidth(T_BW);
  if (cfg.tests & T_BIBW) test_bandwidth(T_BIBW);
  if (cfg.tests & T_RATE) test_rate();
  if (cfg.tests & T_SETUP) test_setup();
  if (cfg.tests & T_MR) test_mr();
  for (int m = 0; m < NMODES; m++) {
    if (!mode_on(m)) continue;
    barrier();
    data_comms_down(m);
    barrier();
    xport_close(m);
  }
  finishing = 1;
  barrier();
  if (nb_rank == 0) {
    char hdr[512];
    snprintf(hdr, sizeof(hdr),
             "netbench results: provider %s, %d reps per mode interleaved (ABBA), medians; ratio = plugin/raw%s",
             cfg.provider[0] ? cfg.provider : "(default)", cfg.reps, cfg.smoke ? " [SMOKE: timings meaningless]" : "");
    report(stdout, hdr);
    if (csv_path[0]) {
      write_csv(csv_path, xdesc);
      printf("CSV written to %s\n", csv_path);
    }
    printf("all transfers verified (sampled words on every transfer, full buffer once per point and mode)\n");
  } else if (!loopback) {
    fprintf(stderr, "netbench: server side done; all transfers it received verified\n");
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Options.                                                                  */

static int parse_sizes(const char* s, size_t* out) {
  int n = 0;
  char* dup = strdup(s);
  for (char* tok = strtok(dup, ","); tok && n < MAX_SIZES; tok = strtok(NULL, ",")) {
    char* end;
    double v = strtod(tok, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    out[n++] = (size_t)v;
  }
  free(dup);
  return n;
}

static size_t parse_size(const char* s) {
  size_t v[1];
  return parse_sizes(s, v) ? v[0] : 0;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: netbench [options] [PLUGIN.so]\n"
          "  Drives an NCCL net plugin (ncclNetPlugin_vN table) and plain libfabric side by side.\n"
          "  --plugin PATH        plugin library (default: $NETBENCH_PLUGIN, else libnccl-net-fabric.so)\n"
          "  --version N          ncclNetPlugin_vN to drive (default: newest both sides support)\n"
          "  --provider NAME      libfabric provider for both modes (default tcp; sets FI_PROVIDER and\n"
          "                       FABRIC_PROVIDER; with tcp on one host FI_TCP_IFACE defaults to lo)\n"
          "  --modes LIST         raw,plugin (default both)\n"
          "  --tests LIST         lat,bw,bibw,rate,setup,mr,mem (default all)\n"
          "  --reps N             repetitions per mode, interleaved (default 5)\n"
          "  --smoke              short run for CTest: tiny counts, data verified, no timing claims\n"
          "  --server PORT        be rank 1 of a two-host run, listening on PORT\n"
          "  --connect HOST:PORT  be rank 0 of a two-host run (prints the report)\n"
          "  --csv FILE           also write the results as CSV (plot with tests/bench/plot.py)\n"
          "  --lat-sizes LIST     ping-pong sizes (default 0,8,64,512,4K,32K,256K,1M)\n"
          "  --lat-iters N        ping-pong iterations for small sizes (default 10000)\n"
          "  --bw-sizes LIST      bandwidth sizes (default 64K,256K,1M,4M,16M,64M,256M)\n"
          "  --window N           in-flight requests for bw/bibw (default 16; capped by --max-mem)\n"
          "  --bw-bytes SIZE      bytes per bandwidth point and run (default 1G)\n"
          "  --max-mem SIZE       buffer bytes per side and direction (default 512M)\n"
          "  --rate-size SIZE     message rate size (default 8) --rate-window N (32) --rate-msgs N (100000)\n"
          "  --setup-comms N      comms for the setup test (default 256)\n"
          "  --mem-comms N        comms for the memory test (default 256)\n"
          "  --dev N              plugin device (default 0)\n"
          "  --raw-minimal-hints  raw mode asks only for FI_TAGGED (default: the plugin's hint set)\n"
          "  -v                   verbose\n");
}

static void defaults(void) {
  memset(&cfg, 0, sizeof(cfg));
  cfg.magic = CFG_MAGIC;
  cfg.cfg_size = sizeof(cfg);
  snprintf(cfg.provider, sizeof(cfg.provider), "tcp");
  cfg.modes = (1 << M_RAW) | (1 << M_PLUGIN);
  cfg.tests = T_ALL;
  cfg.reps = 5;
  cfg.nlat = parse_sizes("0,8,64,512,4K,32K,256K,1M", cfg.lat_sizes);
  cfg.nbw = parse_sizes("64K,256K,1M,4M,16M,64M,256M", cfg.bw_sizes);
  cfg.lat_iters = 10000;
  cfg.lat_bytes = (size_t)256 << 20;
  cfg.window = 16;
  cfg.bw_bytes = (size_t)1 << 30;
  cfg.max_mem = (size_t)512 << 20;
  cfg.rate_window = 32;
  cfg.rate_size = 8;
  cfg.rate_msgs = 100000;
  cfg.setup_comms = 256;
  cfg.mem_comms = 256;
  cfg.mr_iters = 200;
  cfg.seed = 0x6e657462656e6368ull;
}

static void apply_smoke(void) {
  cfg.reps = cfg.reps > 2 ? 2 : cfg.reps;
  cfg.nlat = parse_sizes("0,8,4K,1M", cfg.lat_sizes);
  cfg.nbw = parse_sizes("64K,4M", cfg.bw_sizes);
  cfg.lat_iters = 50;
  cfg.lat_bytes = (size_t)8 << 20;
  cfg.window = 4;
  cfg.bw_bytes = (size_t)16 << 20;
  cfg.rate_msgs = 2000;
  cfg.setup_comms = 8;
  cfg.mem_comms = 8;
  cfg.mr_iters = 5;
}

static int tcp_listen_accept(int port) {
  int s = socket(AF_INET6, SOCK_STREAM, 0);
  int fam6 = s >= 0;
  if (!fam6) s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) nb_die("socket: %s", strerror(errno));
  int one = 1, zero = 0;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fam6) {
    setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
    if (bind(s, (struct sockaddr*)&a, sizeof(a))) nb_die("bind port %d: %s", port, strerror(errno));
  } else {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = INADDR_ANY};
    if (bind(s, (struct sockaddr*)&a, sizeof(a))) nb_die("bind port %d: %s", port, strerror(errno));
  }
  if (listen(s, 1)) nb_die("listen: %s", strerror(errno));
  fprintf(stderr, "netbench: server waiting on port %d\n", port);
  int c = accept(s, NULL, NULL);
  if (c < 0) nb_die("accept: %s", strerror(errno));
  close(s);
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return c;
}

static int tcp_connect(const char* hostport) {
  char host[256];
  snprintf(host, sizeof(host), "%s", hostport);
  char* colon = strrchr(host, ':');
  if (!colon) nb_die("--connect wants HOST:PORT");
  *colon = 0;
  const char* port = colon + 1;
  char* h = host;
  if (*h == '[') { /* [v6]:port */
    h++;
    char* e = strchr(h, ']');
    if (e) *e = 0;
  }
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai;
  int rc = getaddrinfo(h, port, &hints, &ai);
  if (rc) nb_die("cannot resolve %s: %s", hostport, gai_strerror(rc));
  int c = -1;
  for (int tries = 0; tries < 100 && c < 0; tries++) {
    for (struct addrinfo* p = ai; p; p = p->ai_next) {
      c = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
      if (c >= 0 && connect(c, p->ai_addr, p->ai_addrlen) == 0) break;
      if (c >= 0) close(c);
      c = -1;
    }
    if (c < 0) usleep(100000);
  }
  freeaddrinfo(ai);
  if (c < 0) nb_die("cannot connect to %s", hostport);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return c;
}

int main(int argc, char** argv) {
  defaults();
  const char* server_port = NULL;
  const char* connect_to = NULL;
  int smoke = 0, reps_set = 0;
  const char* env_plugin = getenv("NETBENCH_PLUGIN");
  snprintf(plugin_path, sizeof(plugin_path), "%s", env_plugin ? env_plugin : "libnccl-net-fabric.so");
  enum { O_PLUGIN = 256, O_VERSION, O_PROVIDER, O_MODES, O_TESTS, O_REPS, O_SMOKE, O_SERVER, O_CONNECT, O_CSV,
         O_LATSIZES, O_LATITERS, O_BWSIZES, O_WINDOW, O_BWBYTES, O_MAXMEM, O_RATESIZE, O_RATEWIN, O_RATEMSGS,
         O_SETUP, O_MEMCOMMS, O_DEV, O_MINHINTS, O_HELP };
  static const struct option lo[] = {
      {"plugin", 1, 0, O_PLUGIN}, {"version", 1, 0, O_VERSION}, {"provider", 1, 0, O_PROVIDER},
      {"modes", 1, 0, O_MODES}, {"tests", 1, 0, O_TESTS}, {"reps", 1, 0, O_REPS}, {"smoke", 0, 0, O_SMOKE},
      {"server", 1, 0, O_SERVER}, {"connect", 1, 0, O_CONNECT}, {"csv", 1, 0, O_CSV},
      {"lat-sizes", 1, 0, O_LATSIZES}, {"lat-iters", 1, 0, O_LATITERS}, {"bw-sizes", 1, 0, O_BWSIZES},
      {"window", 1, 0, O_WINDOW}, {"bw-bytes", 1, 0, O_BWBYTES}, {"max-mem", 1, 0, O_MAXMEM},
      {"rate-size", 1, 0, O_RATESIZE}, {"rate-window", 1, 0, O_RATEWIN}, {"rate-msgs", 1, 0, O_RATEMSGS},
      {"setup-comms", 1, 0, O_SETUP}, {"mem-comms", 1, 0, O_MEMCOMMS}, {"dev", 1, 0, O_DEV},
      {"raw-minimal-hints", 0, 0, O_MINHINTS}, {"help", 0, 0, O_HELP}, {0, 0, 0, 0}};
  /* Sizes given on the command line win over --smoke's. */
  char lat_arg[512] = "", bw_arg[512] = "";
  int c;
  while ((c = getopt_long(argc, argv, "vh", lo, NULL)) != -1) {
    switch (c) {
      case O_PLUGIN: snprintf(plugin_path, sizeof(plugin_path), "%s", optarg); break;
      case O_VERSION: cfg.version = atoi(optarg); break;
      case O_PROVIDER: snprintf(cfg.provider, sizeof(cfg.provider), "%s", optarg); break;
      case O_MODES:
        cfg.modes = 0;
        if (strstr(optarg, "raw")) cfg.modes |= 1 << M_RAW;
        if (strstr(optarg, "plugin")) cfg.modes |= 1 << M_PLUGIN;
        if (!cfg.modes) nb_die("--modes wants raw and/or plugin");
        break;
      case O_TESTS: {
        cfg.tests = 0;
        char* dup = strdup(optarg);
        for (char* t = strtok(dup, ","); t; t = strtok(NULL, ",")) {
          int found = 0;
          for (size_t i = 0; i < sizeof(test_names) / sizeof(test_names[0]); i++)
            if (!strcmp(t, test_names[i].name)) cfg.tests |= test_names[i].bit, found = 1;
          if (!strcmp(t, "all")) cfg.tests = T_ALL, found = 1;
          if (!found) nb_die("unknown test '%s'", t);
        }
        free(dup);
        break;
      }
      case O_REPS: cfg.reps = atoi(optarg), reps_set = 1; break;
      case O_SMOKE: smoke = 1; break;
      case O_SERVER: server_port = optarg; break;
      case O_CONNECT: connect_to = optarg; break;
      case O_CSV: snprintf(csv_path, sizeof(csv_path), "%s", optarg); break;
      case O_LATSIZES: snprintf(lat_arg, sizeof(lat_arg), "%s", optarg); break;
      case O_LATITERS: cfg.lat_iters = atoi(optarg); break;
      case O_BWSIZES: snprintf(bw_arg, sizeof(bw_arg), "%s", optarg); break;
      case O_WINDOW: cfg.window = atoi(optarg); break;
      case O_BWBYTES: cfg.bw_bytes = parse_size(optarg); break;
      case O_MAXMEM: cfg.max_mem = parse_size(optarg); break;
      case O_RATESIZE: cfg.rate_size = parse_size(optarg); break;
      case O_RATEWIN: cfg.rate_window = atoi(optarg); break;
      case O_RATEMSGS: cfg.rate_msgs = atoi(optarg); break;
      case O_SETUP: cfg.setup_comms = atoi(optarg); break;
      case O_MEMCOMMS: cfg.mem_comms = atoi(optarg); break;
      case O_DEV: cfg.dev = atoi(optarg); break;
      case O_MINHINTS: cfg.raw_minimal_hints = 1; break;
      case 'v': cfg.verbose++; break;
      case 'h': case O_HELP: usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  if (optind < argc) snprintf(plugin_path, sizeof(plugin_path), "%s", argv[optind]);
  if (smoke) {
    int reps = cfg.reps;
    apply_smoke();
    if (reps_set) cfg.reps = reps;
    cfg.smoke = 1;
  }
  if (lat_arg[0]) cfg.nlat = parse_sizes(lat_arg, cfg.lat_sizes);
  if (bw_arg[0]) cfg.nbw = parse_sizes(bw_arg, cfg.bw_sizes);
  if (cfg.reps < 1 || cfg.reps > MAX_REPS) nb_die("--reps must be 1..%d", MAX_REPS);
  if (cfg.window < 1 || cfg.rate_window < 1) nb_die("windows must be >= 1");
  if (cfg.setup_comms < 1 || cfg.mem_comms < 1) nb_die("comm counts must be >= 1");
  for (int i = 0; i < cfg.nbw; i++)
    if (!cfg.bw_sizes[i]) nb_die("bandwidth sizes must be > 0");
  signal(SIGPIPE, SIG_IGN);

  loopback = !server_port && !connect_to;

  pid_t child = -1;
  if (loopback) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) nb_die("socketpair: %s", strerror(errno));
    fflush(NULL);
    child = fork();
    if (child < 0) nb_die("fork: %s", strerror(errno));
    nb_rank = child == 0 ? 1 : 0;
    ctl = sv[nb_rank];
    close(sv[1 - nb_rank]);
    if (nb_rank == 1) prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive rank 0 */
  } else if (server_port) {
    nb_rank = 1;
    ctl = tcp_listen_accept(atoi(server_port));
  } else {
    nb_rank = 0;
    ctl = tcp_connect(connect_to);
  }
  /* Rank 0's configuration rules; a remote rank 1 adopts it. */
  if (!loopback) {
    if (nb_rank == 0) ctl_send(&cfg, sizeof(cfg));
    else {
      nb_cfg theirs;
      ctl_recv(&theirs, sizeof(theirs));
      if (theirs.magic != CFG_MAGIC || theirs.cfg_size != sizeof(cfg)) nb_die("peer runs a different netbench build");
      cfg = theirs;
    }
  }
  /* Environment for the plugin and raw libfabric alike. */
  if (cfg.provider[0]) {
    setenv("FI_PROVIDER", cfg.provider, 1);
    setenv("FABRIC_PROVIDER", cfg.provider, 1);
    if (loopback && !strncmp(cfg.provider, "tcp", 3)) setenv("FI_TCP_IFACE", "lo", 0);
  }
  if (nb_rank == 0) {
    printf("netbench: rank 0 of %s; provider %s%s%s; plugin %s; tests 0x%x; reps %d%s\n",
           loopback ? "a loopback pair (fork)" : "a two-host run", cfg.provider,
           getenv("FI_TCP_IFACE") ? ", FI_TCP_IFACE=" : "", getenv("FI_TCP_IFACE") ? getenv("FI_TCP_IFACE") : "",
           mode_on(M_PLUGIN) ? plugin_path : "(not used)", cfg.tests, cfg.reps, cfg.smoke ? " (smoke)" : "");
    fflush(stdout);
  }
  watchdog_start();
  int rc = rank_main();
  close(ctl);
  if (loopback && nb_rank == 0) {
    int st;
    if (waitpid(child, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "netbench: rank 1 failed\n");
      return 1;
    }
  }
  return rc;
}
