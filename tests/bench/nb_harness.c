/* netbench harness: control channel, data patterns, results, transports,
 * comms and buffers. See nb_bench.h. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nb_bench.h"

const char* const mode_name[NMODES] = {"raw", "plugin", "plugin-b"};
nb_cfg cfg;
char plugin_path[4096];
char plugin_b_path[4096];
char plugin_b_env[NB_ENV_B_MAX][256]; /* NAME=VALUE each, set while plugin-b initialises */
int plugin_b_nenv;
int ctl = -1;
nb_mode modes[NMODES];
point_t points[MAX_POINTS];
int npoints;
uint64_t run_salt;

/* ------------------------------------------------------------------------ */
/* Control channel.                                                          */

void ctl_send(const void* p, size_t n) {
  const char* c = p;
  while (n) {
    ssize_t k = write(ctl, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) nb_die("control socket write: %s", k ? strerror(errno) : "closed");
    c += k;
    n -= (size_t)k;
  }
}

void ctl_recv(void* p, size_t n) {
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
volatile int finishing;

static void* watchdog(void* arg) {
  (void)arg;
  struct pollfd p = {.fd = ctl, .events = POLLRDHUP};
  for (;;) {
    int n = poll(&p, 1, 200);
    if (finishing) return NULL;
    if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      fprintf(stderr, "netbench[rank %d]: the other rank exited early (see its message); stopping\n", nb_rank);
      nb_cleanup_shm();
      _exit(3);
    }
  }
}

void watchdog_start(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, watchdog, NULL)) nb_die("pthread_create");
  pthread_detach(t);
}

void barrier(void) {
  char b = 'b', r;
  ctl_send(&b, 1);
  ctl_recv(&r, 1);
  if (r != 'b') nb_die("control protocol out of step (barrier got %d)", r);
}

double xchg_double(double mine) {
  double theirs;
  ctl_send(&mine, sizeof(mine));
  ctl_recv(&theirs, sizeof(theirs));
  return theirs;
}

/* ------------------------------------------------------------------------ */
/* Data patterns: every transfer carries words derived from a per-transfer   */
/* seed; the receiver checks them, so stale or misplaced data cannot pass.   */

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

/* The sampled words go to and come from the buffer through nb_mem (a copy
 * for GPU memory). */
void fill_samples(void* buf, size_t size, uint64_t seed) {
  unsigned char* b = buf;
  if (size < 8) {
    unsigned char v[8];
    for (size_t i = 0; i < size; i++) v[i] = (unsigned char)pat(seed, i);
    nb_mem_put(b, v, size);
    return;
  }
  size_t off[NSAMPLES];
  int n = sample_offsets(seed, size, off);
  for (int i = 0; i < n; i++) {
    uint64_t v = pat(seed, off[i]);
    nb_mem_put(b + off[i], &v, 8);
  }
  if (size % 8) {
    unsigned char last = (unsigned char)pat(seed, size - 1);
    nb_mem_put(b + size - 1, &last, 1);
  }
}

int check_samples(const void* buf, size_t size, uint64_t seed) {
  const unsigned char* b = buf;
  if (size < 8) {
    unsigned char v[8];
    nb_mem_get(v, b, size);
    for (size_t i = 0; i < size; i++)
      if (v[i] != (unsigned char)pat(seed, i)) return -1;
    return 0;
  }
  size_t off[NSAMPLES];
  int n = sample_offsets(seed, size, off);
  for (int i = 0; i < n; i++) {
    uint64_t v;
    nb_mem_get(&v, b + off[i], 8);
    if (v != pat(seed, off[i])) return -1;
  }
  unsigned char last;
  if (size % 8) nb_mem_get(&last, b + size - 1, 1);
  if (size % 8 && last != (unsigned char)pat(seed, size - 1)) return -1;
  return 0;
}

static void fill_host(unsigned char* buf, size_t size, uint64_t seed) {
  uint64_t* w = (uint64_t*)buf;
  size_t nw = size / 8;
  for (size_t i = 0; i < nw; i++) w[i] = pat(seed, i * 8);
  for (size_t i = nw * 8; i < size; i++) buf[i] = (unsigned char)pat(seed, i);
}

static long check_host(const unsigned char* buf, size_t size, uint64_t seed) {
  const uint64_t* w = (const uint64_t*)buf;
  size_t nw = size / 8;
  for (size_t i = 0; i < nw; i++)
    if (w[i] != pat(seed, i * 8)) return (long)(i * 8);
  for (size_t i = nw * 8; i < size; i++)
    if (buf[i] != (unsigned char)pat(seed, i)) return (long)i;
  return -1;
}

/* GPU memory goes through a host copy of the whole buffer (untimed). */
void fill_full(void* buf, size_t size, uint64_t seed) {
  if (nb_mem_kind == NB_MEM_HOST) {
    fill_host(buf, size, seed);
    return;
  }
  unsigned char* h = malloc(size ? size : 1);
  if (!h) nb_die("out of memory for a %zu-byte host copy", size);
  fill_host(h, size, seed);
  nb_mem_put(buf, h, size);
  free(h);
}

long check_full(const void* buf, size_t size, uint64_t seed) {
  if (nb_mem_kind == NB_MEM_HOST) return check_host(buf, size, seed);
  unsigned char* h = malloc(size ? size : 1);
  if (!h) nb_die("out of memory for a %zu-byte host copy", size);
  nb_mem_get(h, buf, size);
  long bad = check_host(h, size, seed);
  free(h);
  return bad;
}

/* ------------------------------------------------------------------------ */
/* Results.                                                                  */

point_t* point_new(const char* test, long param, int window, const char* unit, int higher_better) {
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

void point_add(point_t* p, int mode, double v) {
  if (p->n[mode] < MAX_REPS) p->v[mode][p->n[mode]++] = v;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

double median(const double* v, int n) {
  if (n <= 0) return NAN;
  double t[MAX_REPS > 1 ? MAX_REPS : 1];
  double* s = n <= MAX_REPS ? t : malloc(sizeof(double) * (size_t)n);
  memcpy(s, v, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  if (s != t) free(s);
  return m;
}

double vmin(const double* v, int n) {
  double m = INFINITY;
  for (int i = 0; i < n; i++) m = v[i] < m ? v[i] : m;
  return n ? m : NAN;
}

double vmax(const double* v, int n) {
  double m = -INFINITY;
  for (int i = 0; i < n; i++) m = v[i] > m ? v[i] : m;
  return n ? m : NAN;
}

/* ------------------------------------------------------------------------ */
/* Transports, comms and buffers.                                            */

void xport_open(int m) {
  nb_xport_opts o = {.provider = cfg.provider[0] ? cfg.provider : NULL,
                     .plugin = m == M_PLUGIN_B ? plugin_b_path : plugin_path,
                     .version = cfg.version,
                     .dev = cfg.dev,
                     .verbose = cfg.verbose,
                     .raw_hints = cfg.raw_hints,
                     .raw_rma = cfg.raw_rma,
                     .raw_socket = cfg.raw_socket,
                     .nccl_profiler = cfg.nccl_profiler,
                     .mem = cfg.mem,
                     .rails = cfg.rails,
                     .nvdevs = cfg.nvdevs};
  memcpy(o.vdevs, cfg.vdevs, sizeof(o.vdevs));
  memset(&modes[m], 0, sizeof(modes[m]));
  if (m == M_RAW && cfg.raw_socket) {
    nb_sock_open(&modes[m].x, &o);
  } else if (m == M_RAW) {
    nb_raw_open(&modes[m].x, &o);
  } else if (m == M_PLUGIN_B && plugin_b_nenv > 0) {
    char* saved[NB_ENV_B_MAX] = {0};
    char names[NB_ENV_B_MAX][256];
    for (int i = 0; i < plugin_b_nenv; i++) {
      snprintf(names[i], sizeof(names[i]), "%s", plugin_b_env[i]);
      *strchr(names[i], '=') = '\0';
      const char* old = getenv(names[i]);
      saved[i] = old ? strdup(old) : NULL;
      setenv(names[i], strchr(plugin_b_env[i], '=') + 1, 1);
    }
    nb_plugin_open(&modes[m].x, &o); /* the plugin reads its parameters at init */
    for (int i = 0; i < plugin_b_nenv; i++) {
      if (saved[i]) setenv(names[i], saved[i], 1);
      else unsetenv(names[i]);
      free(saved[i]);
    }
  } else {
    nb_plugin_open(&modes[m].x, &o);
  }
  modes[m].open = 1;
}

void xport_close(int m) {
  if (!modes[m].open) return;
  modes[m].x.ops->fini(&modes[m].x);
  modes[m].open = 0;
}

void chk(int rc, int m, const char* what) {
  if (rc) nb_die("%s: %s returned %d", mode_name[m], what, rc);
}

/* Establishes n comm pairs with the peer: each rank gets n send comms and n
 * recv comms (either may be NULL to skip one direction: then the peer must
 * pass the opposite). Connect and accept are polled together, NCCL-style. */
void comms_establish(int m, int n, void** sc, void** rc) {
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
void data_comms_up(int m) {
  comms_establish(m, 1, &modes[m].sc, &modes[m].rc);
}

void data_comms_down(int m) {
  if (modes[m].sc) chk(OPS(m)->close_send(X(m), modes[m].sc), m, "closeSend");
  if (modes[m].rc) chk(OPS(m)->close_recv(X(m), modes[m].rc), m, "closeRecv");
  modes[m].sc = modes[m].rc = NULL;
}

void* buf_alloc(size_t size) { return nb_mem_alloc(size); }

void buf_free(void* p, size_t size) { nb_mem_free(p, size); }

void bufset_init(bufset* b, int n, size_t size, int is_send) {
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

void bufset_fini(bufset* b, int is_send) {
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
void* post_send(int m, void* comm, void* buf, size_t size, int tag, void* mh) {
  void* req = NULL;
  for (;;) {
    chk(OPS(m)->isend(X(m), comm, buf, size, tag, mh, &req), m, "isend");
    if (req) return req;
  }
}

void* post_recv(int m, void* comm, void* buf, size_t size, int tag, void* mh) {
  void* req = NULL;
  for (;;) {
    chk(OPS(m)->irecv(X(m), comm, buf, size, tag, mh, &req), m, "irecv");
    if (req) return req;
  }
}

int wait_req(int m, void* req) {
  int done = 0, size = -1;
  uint64_t spins = 0;
  while (!done) {
    chk(OPS(m)->test(X(m), req, &done, &size), m, "test");
    if (!done && ++spins % (1u << 24) == 0 && cfg.verbose) nb_log("%s: still waiting for a request", mode_name[m]);
  }
  return size;
}

void verify_fail(int m, const char* what, size_t size, uint64_t it) {
  nb_die("%s: DATA MISMATCH in %s, size %zu, iteration %llu: the transport delivered wrong or stale bytes", mode_name[m],
         what, size, (unsigned long long)it);
}

/* One full-buffer transfer each way (untimed): every byte checked. */
void full_check(int m, bufset* s, bufset* r, size_t size, int both_ways) {
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
      nb_mem_set(r->buf[0], 0xa5, size ? size : 8);
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
