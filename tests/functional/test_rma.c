/*
 * One-sided operations through NCCL's RMA tables, in N processes:
 *   fabric-rma --ranks N [--max-size BYTES]
 * with FI_PROVIDER, FABRIC_TRANSPORT=rdma and FABRIC_TEST_RMA_API (13..17 or
 * core) from the environment. Phases:
 *  - transfer: put-with-signal of 0 B .. max-size at odd offsets to every
 *    rank (itself included); each target checks every byte at the moment
 *    the signal becomes visible (a signal before its data fails here);
 *  - get: every rank reads every rank's region and checks it;
 *  - strong: 200 puts and then a signal-only put (size 0, NULL handles): the
 *    signal is visible only once all 200 are in;
 *  - burst: 300 signal-only puts per peer held at once (more than a signal
 *    ring holds: slots come back while they wait);
 *  - stream: 3 x 65536 puts to the next rank, more than a target tracks
 *    unacknowledged (where puts are counted), then a signal;
 *  - flush: iflush after puts completes only once they have;
 *  - errors (rank 0): windows, ranks, contexts, handles, signal arguments,
 *    a deregistered window, a bogus request: each an error and one WARN;
 *    and at teardown every rank checks the guard pages around its window;
 *  - teardown and init again in the same process.
 * --case connect_abort: NCCL raises the abort flag (RMA v17+) while connect
 * waits for a peer that never connects: the call ends within a second, with
 * one WARN, long before the connect timeout.
 * --mem gpu registers every window as NCCL_PTR_CUDA and --mem mixed the data
 * window only as host memory: with FABRIC_GPU_EMULATE=1 (set here) such
 * "GPU memory" is mapped without access, so the plugin and the provider
 * fault if they touch it other than through the plugin's GPU copies; the
 * test itself reads and writes it through /proc/self/mem.
 */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rma_ranks.h"

enum { NCTX = 2, STRONG_PUTS = 200, BURST = 300, CHUNK = 4096, TIMEOUT_MS = 60000, GUARD = 4096 };

static size_t max_size = 64u << 20;

/* Where the windows live: host memory, or emulated GPU memory (no access
 * from the CPU but through /proc/self/mem). */
enum { MEM_HOST, MEM_GPU, MEM_MIXED };
static int mem_kind = MEM_HOST;
static int memfd = -1;

static int data_is_gpu(void) { return mem_kind == MEM_GPU; }
static int src_is_gpu(void) { return mem_kind != MEM_HOST; }
static int sig_is_gpu(void) { return mem_kind != MEM_HOST; }

/* Emulated GPU memory: a page-aligned mapping with no access. */
static void* gpu_alloc(size_t n) {
  void* p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void mem_io(int write, void* host, const void* at, size_t n, int gpu) {
  if (!gpu) {
    if (write) memcpy((void*)at, host, n);
    else memcpy(host, at, n);
    return;
  }
  if (memfd < 0) memfd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
  for (size_t done = 0; done < n;) {
    off_t o = (off_t)(uintptr_t)((const char*)at + done);
    ssize_t k = write ? pwrite(memfd, (char*)host + done, n - done, o) : pread(memfd, (char*)host + done, n - done, o);
    if (k <= 0) {
      fprintf(stderr, "/proc/self/mem %s at %p failed\n", write ? "write" : "read", (const void*)at);
      abort();
    }
    done += (size_t)k;
  }
}

typedef struct grp {
  fab_ctx* ctx;
  void* coll;
  void* rctx;
  size_t region;    /* per source rank, in the data window */
  unsigned char* data; /* nranks regions: rank s writes into region s */
  unsigned char* data_alloc; /* data with a guard page on each side */
  unsigned char* src;  /* one region: what this rank sends, and where gets land */
  uint64_t* sig;    /* nranks * NCTX words */
  void *data_mh, *src_mh, *sig_mh;
  void* listen_gone; /* a handle that is no comm or context any more */
} grp;

static inline unsigned char pat(size_t k, unsigned seed) { return (unsigned char)(k * 131u + seed * 7u + (k >> 9)); }

enum { IO_CHUNK = 1 << 20 };

/* Fills the source window (which may be GPU memory). */
static void fill(unsigned char* p, size_t n, unsigned seed) {
  static unsigned char tmp[IO_CHUNK];
  for (size_t at = 0; at < n; at += IO_CHUNK) {
    size_t m = n - at < IO_CHUNK ? n - at : IO_CHUNK;
    for (size_t k = 0; k < m; k++) tmp[k] = pat(at + k, seed);
    mem_io(1, tmp, p + at, m, src_is_gpu());
  }
}

static void check_mem(rr_ctx* c, const unsigned char* p, size_t n, unsigned seed, const char* what, int gpu) {
  static unsigned char tmp[IO_CHUNK];
  for (size_t at = 0; at < n; at += IO_CHUNK) {
    size_t m = n - at < IO_CHUNK ? n - at : IO_CHUNK;
    mem_io(0, tmp, p + at, m, gpu);
    for (size_t k = 0; k < m; k++)
      if (tmp[k] != pat(at + k, seed))
        RR_FAIL("%s: byte %zu of %zu is %u, want %u", what, at + k, n, tmp[k], pat(at + k, seed));
  }
}

/* Checks bytes of the data window. */
static void check_bytes(rr_ctx* c, const unsigned char* p, size_t n, unsigned seed, const char* what) {
  check_mem(c, p, n, seed, what, data_is_gpu());
}

static void zero(void* p, size_t n, int gpu) {
  static unsigned char tmp[IO_CHUNK];
  for (size_t at = 0; at < n; at += IO_CHUNK) mem_io(1, tmp, (char*)p + at, n - at < IO_CHUNK ? n - at : IO_CHUNK, gpu);
}

static void wait_req(rr_ctx* c, grp* g, void* req, const char* what) {
  int64_t deadline = rr_now_ms() + TIMEOUT_MS;
  int done = 0;
  while (!done) {
    RR_OK(c->api.test(g->coll, req, &done));
    if (!done && rr_now_ms() > deadline) RR_FAIL("%s: request not done after %d ms", what, TIMEOUT_MS);
    if (!done) sched_yield(); /* as NCCL's proxy thread does: ranks may share cores */
  }
}

static uint64_t load_sig(const uint64_t* w) {
  if (!sig_is_gpu()) return __atomic_load_n(w, __ATOMIC_ACQUIRE);
  uint64_t v;
  mem_io(0, &v, w, sizeof(v), 1);
  return v;
}

/* Drives progress until *w reaches want; fails if it overshoots. */
static void wait_sig(rr_ctx* c, grp* g, const uint64_t* w, uint64_t want, const char* what) {
  int64_t deadline = rr_now_ms() + TIMEOUT_MS;
  uint64_t v;
  while ((v = load_sig(w)) != want) {
    RR_CHECK(v < want, "%s: signal is %llu, past %llu", what, (unsigned long long)v, (unsigned long long)want);
    if (c->api.progress) RR_OK(c->api.progress(g->rctx));
    sched_yield();
    if (rr_now_ms() > deadline) RR_FAIL("%s: signal %llu, want %llu after %d ms", what, (unsigned long long)v,
                                        (unsigned long long)want, TIMEOUT_MS);
  }
}

static rr_ctx* idle_c;
static void idle(void* arg) {
  grp* g = arg;
  if (idle_c->api.progress) idle_c->api.progress(g->rctx);
}

static void setup(rr_ctx* c, grp* g, size_t region) {
  memset(g, 0, sizeof *g);
  rr_phase(c, "init");
  RR_OK(c->api.init(&g->ctx, 0x5eed, rr_logger));
  int ndev = 0;
  RR_OK(c->api.devices(&ndev));
  RR_CHECK(ndev > 0, "no devices");
  fab_properties props;
  RR_OK(c->api.get_properties(0, &props));
  RR_CHECK(props.net_device_type == FAB_NET_DEVICE_GIN_PROXY, "netDeviceType %d", props.net_device_type);
  void* listen = NULL;
  RR_OK(c->api.listen(g->ctx, 0, rr_handle(c->rank), &listen));
  rr_barrier(c, "listen");
  void* handles[RR_MAX_RANKS];
  for (int r = 0; r < c->nranks; r++) handles[r] = rr_handle(r);
  rr_phase(c, "connect");
  RR_OK(c->api.connect(g->ctx, handles, c->nranks, c->rank, NCTX, listen, &g->coll, NULL));
  RR_OK(c->api.close_listen(listen));
  g->listen_gone = listen;
  if (c->api.get_rma_properties) {
    fab_rma_properties rp = {.flushes_all_puts_on_any_signal = true};
    RR_OK(c->api.get_rma_properties(g->coll, &rp));
    RR_CHECK(!rp.flushes_all_puts_on_any_signal, "a signal orders its own source's puts only");
  }
  if (c->api.create_context) {
    int peers[RR_MAX_RANKS], npeers = 0; /* RMA v17's peer list: every other rank */
    for (int r = 0; r < c->nranks; r++)
      if (r != c->rank) peers[npeers++] = r;
    fab_rma_config cfg = {.n_contexts = NCTX, .traffic_class = INT_MIN, .rank_stride = 1, .peers = peers,
                          .npeers = npeers};
    void* dev_handle = (void*)1;
    RR_OK(c->api.create_context(g->coll, &cfg, &g->rctx, &dev_handle));
    if (c->version == 13 || c->version == 0) /* the GIN v13 layout has one */
      RR_CHECK(dev_handle == NULL, "a proxy backend has no device handle");
  } else {
    g->rctx = g->coll; /* GIN v11/v12: the comm stands for its connections (contexts) */
  }
  region = (region + 4095) & ~(size_t)4095;
  g->region = region;
  /* the data window sits between two guard pages that nothing may write */
  size_t data_len = region * (size_t)c->nranks;
  g->data_alloc = mmap(NULL, data_len + 2 * GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  RR_CHECK(g->data_alloc != MAP_FAILED, "out of memory");
  g->data = g->data_alloc + GUARD;
  g->src = src_is_gpu() ? gpu_alloc(region) : aligned_alloc(4096, region);
  g->sig = sig_is_gpu() ? gpu_alloc(4096) : aligned_alloc(4096, 4096);
  RR_CHECK(g->src && g->sig, "out of memory");
  idle_c = c;
  rr_set_idle(idle, g);
  memset(g->data_alloc, 0xa5, GUARD);
  memset(g->data + data_len, 0xa5, GUARD);
  if (data_is_gpu()) RR_CHECK(mprotect(g->data, data_len, PROT_NONE) == 0, "mprotect");
  zero(g->data, data_len, data_is_gpu());
  zero(g->sig, 4096, sig_is_gpu());
  int data_type = data_is_gpu() ? FAB_PTR_CUDA : FAB_PTR_HOST;
  rr_phase(c, "regMrSym");
  RR_OK(c->api.reg_mr_sym(g->coll, g->data, data_len, data_type, 0, &g->data_mh, NULL));
  RR_OK(c->api.reg_mr_sym(g->coll, g->src, region, src_is_gpu() ? FAB_PTR_CUDA : FAB_PTR_HOST, 0, &g->src_mh, NULL));
  /* the signal array as NCCL registers its own (FORCE_SO | SIGNAL_NEVER_RESET) */
  RR_OK(c->api.reg_mr_sym(g->coll, g->sig, (size_t)c->nranks * NCTX * 8, sig_is_gpu() ? FAB_PTR_CUDA : FAB_PTR_HOST,
                          FAB_MR_FLAG_FORCE_SO | FAB_MR_FLAG_SIGNAL_NEVER_RESET, &g->sig_mh, NULL));
  rr_barrier(c, "setup");
}

static void teardown(rr_ctx* c, grp* g) {
  rr_phase(c, "teardown");
  rr_set_idle(NULL, NULL);
  if (c->api.destroy_context) RR_OK(c->api.destroy_context(g->rctx));
  RR_OK(c->api.dereg_mr_sym(g->coll, g->data_mh));
  RR_OK(c->api.dereg_mr_sym(g->coll, g->src_mh));
  RR_OK(c->api.dereg_mr_sym(g->coll, g->sig_mh));
  rr_barrier(c, "deregistered");
  RR_OK(c->api.close_group(g->coll));
  RR_OK(c->api.finalize(g->ctx));
  for (size_t i = 0; i < GUARD; i++) {
    RR_CHECK(g->data_alloc[i] == 0xa5, "byte %zu before the data window was written", GUARD - i);
    RR_CHECK(g->data[g->region * (size_t)c->nranks + i] == 0xa5, "byte %zu after the data window was written", i);
  }
  munmap(g->data_alloc, g->region * (size_t)c->nranks + 2 * GUARD);
  if (src_is_gpu()) munmap(g->src, g->region);
  else free(g->src);
  if (sig_is_gpu()) munmap(g->sig, 4096);
  else free(g->sig);
}

static uint64_t* sig_word(rr_ctx* c, grp* g, int src, int ctx) { return &g->sig[src + ctx * c->nranks]; }
static uint64_t sig_off(rr_ctx* c, int src, int ctx) { return (uint64_t)(src + ctx * c->nranks) * 8; }

/* --- transfer: put with signal, checked when the signal shows ------------------------------ */

static void transfer(rr_ctx* c, grp* g) {
  static const size_t sizes[] = {0, 1, 7, 8, 63, 4095, 4096, 4097, 65539, (1u << 20) + 5, (16u << 20) + 1,
                                 64u << 20};
  uint64_t expect[RR_MAX_RANKS * NCTX] = {0};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t size = sizes[i];
    if (size + 64 > g->region) break;
    uint64_t src_off = 3 + i, dst_off = 5 + 2 * i;
    int ctx = (int)(i % NCTX);
    for (int k = 0; k < c->nranks; k++) {
      int d = (c->rank + k) % c->nranks;
      rr_phase(c, "transfer %zu B to rank %d", size, d);
      fill(g->src + src_off, size, (unsigned)(c->rank * 97 + d * 13 + i));
      void* req = NULL;
      RR_OK(c->api.iput_signal(g->rctx, ctx, src_off, size ? g->src_mh : NULL, size,
                               (uint64_t)c->rank * g->region + dst_off, size ? g->data_mh : NULL, (uint32_t)d,
                               sig_off(c, c->rank, ctx), g->sig_mh, i + 1, FAB_SIGNAL_ADD, true, 0, &req));
      RR_CHECK(req != NULL, "a put never answers NULL");
      wait_req(c, g, req, "put with signal");
    }
    for (int s = 0; s < c->nranks; s++) {
      rr_phase(c, "transfer %zu B from rank %d", size, s);
      uint64_t* w = sig_word(c, g, s, ctx);
      expect[s + ctx * c->nranks] += i + 1;
      wait_sig(c, g, w, expect[s + ctx * c->nranks], "transfer signal");
      check_bytes(c, g->data + (size_t)s * g->region + dst_off, size, (unsigned)(s * 97 + c->rank * 13 + i),
                  "data seen when its signal showed");
    }
    rr_barrier(c, "transfer size");
  }
}

/* --- get ------------------------------------------------------------------------------ */

static void get(rr_ctx* c, grp* g) {
  if (!c->api.iget) return; /* GIN v11/v12 have no get */
  size_t size = g->region / 2 + 3;
  fill(g->data + (size_t)c->rank * g->region + 1, size, 500u + (unsigned)c->rank);
  rr_barrier(c, "get filled");
  for (int k = 0; k < c->nranks; k++) {
    int p = (c->rank + k) % c->nranks;
    rr_phase(c, "get %zu B from rank %d", size, p);
    zero(g->src, g->region, src_is_gpu());
    void* req = NULL;
    RR_OK(c->api.iget(g->rctx, 1, (uint64_t)p * g->region + 1, g->data_mh, size, 7, g->src_mh, (uint32_t)p, 0, &req));
    RR_CHECK(req != NULL, "a get never answers NULL");
    wait_req(c, g, req, "get");
    check_mem(c, g->src + 7, size, 500u + (unsigned)p, "data read", src_is_gpu());
  }
  rr_barrier(c, "get");
}

/* --- strong: a signal after many puts ----------------------------------------------------- */

static void strong(rr_ctx* c, grp* g) {
  static void* reqs[STRONG_PUTS + 1];
  RR_CHECK((size_t)STRONG_PUTS * CHUNK <= g->region, "region too small");
  int ctx = 1;
  uint64_t base[RR_MAX_RANKS];
  for (int s = 0; s < c->nranks; s++) base[s] = load_sig(sig_word(c, g, s, ctx));
  rr_barrier(c, "strong start");
  for (int k = 1; k < c->nranks; k++) {
    int d = (c->rank + k) % c->nranks;
    rr_phase(c, "strong: %d puts and a signal to rank %d", STRONG_PUTS, d);
    fill(g->src, (size_t)STRONG_PUTS * CHUNK, 900u + (unsigned)(c->rank * 7 + d));
    for (int j = 0; j < STRONG_PUTS; j++)
      RR_OK(c->api.iput(g->rctx, j % NCTX, (uint64_t)j * CHUNK, g->src_mh, CHUNK,
                        (uint64_t)c->rank * g->region + (uint64_t)j * CHUNK, g->data_mh, (uint32_t)d, 0, &reqs[j]));
    RR_OK(c->api.iput_signal(g->rctx, ctx, 0, NULL, 0, 0, NULL, (uint32_t)d, sig_off(c, c->rank, ctx), g->sig_mh, 1,
                             FAB_SIGNAL_INC, true, 0, &reqs[STRONG_PUTS]));
    for (int j = 0; j <= STRONG_PUTS; j++) wait_req(c, g, reqs[j], "strong");
  }
  for (int k = 1; k < c->nranks; k++) {
    int s = (c->rank + c->nranks - k) % c->nranks;
    rr_phase(c, "strong: signal from rank %d", s);
    uint64_t* w = sig_word(c, g, s, ctx);
    wait_sig(c, g, w, base[s] + 1, "strong signal");
    check_bytes(c, g->data + (size_t)s * g->region, (size_t)STRONG_PUTS * CHUNK, 900u + (unsigned)(s * 7 + c->rank),
                "puts seen when the signal after them showed");
  }
  rr_barrier(c, "strong");
}

/* --- burst: more signals in flight than a ring holds ----------------------------------------- */

static void burst(rr_ctx* c, grp* g) {
  static void* reqs[BURST];
  uint64_t base[RR_MAX_RANKS];
  for (int s = 0; s < c->nranks; s++) base[s] = load_sig(sig_word(c, g, s, 0));
  rr_barrier(c, "burst start");
  for (int k = 1; k < c->nranks; k++) {
    int d = (c->rank + k) % c->nranks;
    rr_phase(c, "burst: %d signals to rank %d", BURST, d);
    for (int j = 0; j < BURST; j++)
      RR_OK(c->api.iput_signal(g->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)d, sig_off(c, c->rank, 0), g->sig_mh, 1,
                               FAB_SIGNAL_INC, j % 2 == 0, 0, &reqs[j]));
    for (int j = 0; j < BURST; j++) wait_req(c, g, reqs[j], "burst");
  }
  for (int k = 1; k < c->nranks; k++) {
    int s = (c->rank + c->nranks - k) % c->nranks;
    rr_phase(c, "burst: signals from rank %d", s);
    wait_sig(c, g, sig_word(c, g, s, 0), base[s] + BURST, "burst signal");
  }
  rr_barrier(c, "burst");
}

/* --- stream: more puts than a target's put window, acknowledged as they land ---------------- */

enum { STREAM_PUTS = 3 * 65536, STREAM_WINDOW = 64 };

static void stream(rr_ctx* c, grp* g) {
  if (c->nranks < 2) return;
  int d = (c->rank + 1) % c->nranks, s = (c->rank + c->nranks - 1) % c->nranks;
  uint64_t base = load_sig(sig_word(c, g, s, 0));
  rr_barrier(c, "stream start");
  rr_phase(c, "stream: %d puts to rank %d", STREAM_PUTS, d);
  static void* reqs[STREAM_WINDOW];
  for (int j = 0; j < STREAM_PUTS; j++) {
    int k = j % STREAM_WINDOW;
    if (j >= STREAM_WINDOW) wait_req(c, g, reqs[k], "stream put");
    uint64_t off = (uint64_t)(j % 1024) * 8;
    RR_OK(c->api.iput(g->rctx, 0, off, g->src_mh, 8, (uint64_t)c->rank * g->region + off, g->data_mh, (uint32_t)d, 0,
                      &reqs[k]));
  }
  for (int j = 0; j < STREAM_WINDOW; j++) wait_req(c, g, reqs[j], "stream put");
  void* sreq = NULL;
  RR_OK(c->api.iput_signal(g->rctx, 0, 0, NULL, 0, 0, NULL, (uint32_t)d, sig_off(c, c->rank, 0), g->sig_mh, 1,
                           FAB_SIGNAL_INC, true, 0, &sreq));
  wait_req(c, g, sreq, "stream signal");
  rr_phase(c, "stream: signal from rank %d", s);
  wait_sig(c, g, sig_word(c, g, s, 0), base + 1, "stream signal");
  rr_barrier(c, "stream");
}

/* --- flush -------------------------------------------------------------------------------- */

static void flush(rr_ctx* c, grp* g) {
  if (c->nranks < 2 || !c->api.iflush) return; /* GIN v11/v12 have no flush */
  int d = (c->rank + 1) % c->nranks;
  void* reqs[16];
  rr_phase(c, "flush to rank %d", d);
  for (int j = 0; j < 16; j++)
    RR_OK(c->api.iput(g->rctx, 0, 0, g->src_mh, 65536, (uint64_t)c->rank * g->region, g->data_mh, (uint32_t)d, 0,
                      &reqs[j]));
  void* fr = NULL;
  RR_OK(c->api.iflush(g->rctx, 0, g->data_mh, (uint32_t)d, &fr));
  if (fr) wait_req(c, g, fr, "flush");
  for (int j = 0; j < 16; j++) {
    int done = 0;
    RR_OK(c->api.test(g->coll, reqs[j], &done));
    RR_CHECK(done, "put %d not complete after its flush", j);
  }
  void* none = (void*)1;
  RR_OK(c->api.iflush(g->rctx, 0, g->data_mh, (uint32_t)c->rank, &none));
  RR_CHECK(none == NULL, "a flush of our own rank has nothing to wait for");
  rr_barrier(c, "flush");
}

/* --- errors ------------------------------------------------------------------------------- */

#define EXPECT_ERR(call, what)                                                                 \
  do {                                                                                         \
    int w0 = rr_warns();                                                                       \
    rr_expect_warns(1);                                                                        \
    fab_result rc_ = (call);                                                                   \
    RR_CHECK(rc_ != FAB_OK, "%s was accepted", what);                                          \
    RR_CHECK(rr_warns() == w0 + 1, "%s: %d WARN lines, want 1", what, rr_warns() - w0);        \
  } while (0)

static void errors(rr_ctx* c, grp* g) {
  void* tmp_mh = NULL;
  unsigned char* tmp = aligned_alloc(4096, 4096);
  RR_CHECK(tmp, "out of memory");
  RR_OK(c->api.reg_mr_sym(g->coll, tmp, 4096, FAB_PTR_HOST, 0, &tmp_mh, NULL));
  RR_OK(c->api.dereg_mr_sym(g->coll, tmp_mh));
  rr_barrier(c, "errors: deregistered");
  if (c->rank == 0) {
    uint32_t d = c->nranks > 1 ? 1 : 0;
    void* req = NULL;
    size_t win = g->region * (size_t)c->nranks;
    rr_phase(c, "errors");
    EXPECT_ERR(c->api.iput(g->rctx, 0, 0, g->src_mh, 16, win - 8, g->data_mh, d, 0, &req), "a put past the window");
    RR_CHECK(req == NULL, "no request for a refused put");
    EXPECT_ERR(c->api.iput(g->rctx, 0, g->region - 8, g->src_mh, 16, 0, g->data_mh, d, 0, &req),
               "a put from past the source window");
    EXPECT_ERR(c->api.iput(g->rctx, 0, 0, g->src_mh, 16, UINT64_MAX - 4, g->data_mh, d, 0, &req),
               "a put at an offset that wraps");
    EXPECT_ERR(c->api.iput(g->rctx, 0, 0, g->src_mh, 16, 0, g->data_mh, (uint32_t)c->nranks, 0, &req),
               "a put to a rank out of range");
    if (c->version != 11) /* GIN v11 has no context argument */
      EXPECT_ERR(c->api.iput(g->rctx, NCTX, 0, g->src_mh, 16, 0, g->data_mh, d, 0, &req), "a context out of range");
    EXPECT_ERR(c->api.iput(g->rctx, 0, 0, (void*)0x1234, 16, 0, g->data_mh, d, 0, &req), "a made-up handle");
    EXPECT_ERR(c->api.iput(g->rctx, 0, 0, tmp_mh, 16, 0, g->data_mh, d, 0, &req), "a deregistered handle");
    if (c->api.iget)
      EXPECT_ERR(c->api.iget(g->rctx, 0, win, g->data_mh, 1, 0, g->src_mh, d, 0, &req), "a get past the window");
    EXPECT_ERR(c->api.iput_signal(g->rctx, 0, 0, NULL, 0, 0, NULL, d, 4, g->sig_mh, 1, FAB_SIGNAL_ADD, true, 0, &req),
               "a signal offset that is not a multiple of 8");
    EXPECT_ERR(c->api.iput_signal(g->rctx, 0, 0, NULL, 0, 0, NULL, d, (uint64_t)c->nranks * NCTX * 8, g->sig_mh, 1,
                                  FAB_SIGNAL_ADD, true, 0, &req),
               "a signal past its window");
    EXPECT_ERR(c->api.iput_signal(g->rctx, 0, 0, NULL, 0, 0, NULL, d, 0, g->sig_mh, 1, 7, true, 0, &req),
               "an unknown signal operation");
    int done = 0;
    EXPECT_ERR(c->api.test(g->coll, (void*)&done, &done), "testing something that is not a request");
    uint64_t forged[8] = {0x0000000151455246ull, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10};
    EXPECT_ERR(c->api.test(g->coll, forged, &done), "testing a forged request header (never read)");
    EXPECT_ERR(c->api.test(g->coll, (void*)(uintptr_t)0xdead0000beef0000ull, &done), "testing a wild pointer");
    EXPECT_ERR(c->api.iput(g->listen_gone, 0, 0, g->src_mh, 16, 0, g->data_mh, d, 0, &req),
               "a closed listen comm passed as a context");
    EXPECT_ERR(c->api.dereg_mr_sym(g->coll, tmp_mh), "deregistering twice");
    if (c->api.create_context && (c->version == 0 || c->version >= 17)) { /* the peer list reaches the core */
      void* x = NULL;
      int out_of_range[1] = {c->nranks};
      fab_rma_config bad = {.n_contexts = 1, .traffic_class = INT_MIN, .rank_stride = 1, .peers = out_of_range,
                            .npeers = 1};
      EXPECT_ERR(c->api.create_context(g->coll, &bad, &x, NULL), "a peer list naming a rank out of range");
      bad.npeers = -1;
      EXPECT_ERR(c->api.create_context(g->coll, &bad, &x, NULL), "a negative peer count");
      bad.peers = NULL;
      bad.npeers = 1;
      EXPECT_ERR(c->api.create_context(g->coll, &bad, &x, NULL), "a peer count without a list");
      RR_CHECK(x == NULL, "no context for a refused config");
    }
    if (mem_kind == MEM_HOST) { /* no driver here (or host memory): a CUDA window is refused, not taken */
      void* bad_mh = (void*)1;
      EXPECT_ERR(c->api.reg_mr_sym(g->coll, tmp, 4096, FAB_PTR_CUDA, 0, &bad_mh, NULL),
                 "a CUDA window where the CUDA driver is unusable (or the memory is not GPU memory)");
      RR_CHECK(bad_mh == NULL, "no handle for a refused registration");
    }
  }
  free(tmp);
  rr_barrier(c, "errors");
}

/* A target killed while puts stream into it: the source's operations end in
 * an error (each failing test with one WARN) within the peer timeout, never a
 * hang, and the group closes cleanly after. */
static void peer_killed(rr_ctx* c) {
  grp g;
  setup(c, &g, 8u << 20);
  if (c->rank == 1) {
    rr_expect_death(c);
    rr_barrier(c, "streaming");
    usleep(20000);
    kill(getpid(), SIGKILL);
  }
  rr_set_idle(NULL, NULL); /* the barrier below must not wait on a dead peer's progress */
  rr_barrier(c, "streaming");
  rr_phase(c, "putting into a rank being killed");
  int64_t deadline = rr_now_ms() + TIMEOUT_MS;
  fab_result rc = FAB_OK;
  int warns0 = rr_warns(), failed_tests = 0;
  rr_expect_warns(1000);
  while (rc == FAB_OK && rr_now_ms() < deadline) {
    void* reqs[8] = {0};
    int n = 0;
    for (; n < 8 && rc == FAB_OK; n++)
      rc = c->api.iput_signal(g.rctx, 0, 0, g.src_mh, 1u << 20, 0, g.data_mh, 1, 0, g.sig_mh, 1, FAB_SIGNAL_ADD,
                              true, 0, &reqs[n]);
    for (int i = 0; i < n && reqs[i]; i++) {
      int done = 0;
      fab_result trc = FAB_OK;
      while (!done && trc == FAB_OK && rr_now_ms() < deadline) trc = c->api.test(g.coll, reqs[i], &done);
      if (trc != FAB_OK) {
        failed_tests++;
        rc = trc;
      }
    }
  }
  RR_CHECK(rc != FAB_OK, "no operation failed within %d ms of the peer's death", TIMEOUT_MS);
  RR_CHECK(rr_warns() - warns0 >= 1, "the failure came without a WARN");
  printf("rank 0: an operation failed after the peer was killed (result %d, %d failed tests, %d WARN lines)\n",
         (int)rc, failed_tests, rr_warns() - warns0);
  if (c->api.query_last_error) { /* a failed operation is an error to report, whether or not the group failed */
    bool has_error = false;
    RR_OK(c->api.query_last_error(g.rctx, &has_error));
    RR_CHECK(has_error, "queryLastError says no error after an operation failed");
  }
  RR_OK(c->api.close_group(g.coll)); /* close after a failure: no hang, no crash */
  RR_OK(c->api.finalize(g.ctx));
}

static volatile uint32_t abort_flag;

static void* raise_abort(void* arg) {
  usleep(300 * 1000);
  __atomic_store_n(&abort_flag, 1, __ATOMIC_RELEASE);
  return arg;
}

/* Rank 0 connects to a rank 1 that listens but never connects; NCCL raises
 * its abort flag 300 ms in (RMA v17 passes it to connect). */
static void connect_abort(rr_ctx* c) {
  fab_ctx* ctx = NULL;
  RR_OK(c->api.init(&ctx, 0xab047, rr_logger));
  void* listen = NULL;
  RR_OK(c->api.listen(ctx, 0, rr_handle(c->rank), &listen));
  rr_barrier(c, "listen");
  if (c->rank == 0) {
    RR_CHECK(c->version == 0 || c->version >= 17, "RMA v%d has no abort flag: run this case through v17+",
             c->version);
    void* handles[RR_MAX_RANKS];
    for (int r = 0; r < c->nranks; r++) handles[r] = rr_handle(r);
    pthread_t t;
    RR_CHECK(pthread_create(&t, NULL, raise_abort, NULL) == 0, "pthread_create");
    rr_phase(c, "connect with the abort flag raised 300 ms in");
    rr_expect_warns(1);
    int warns0 = rr_warns();
    int64_t t0 = rr_now_ms();
    void* coll = NULL;
    fab_result rc = c->api.connect(ctx, handles, c->nranks, c->rank, 1, listen, &coll, &abort_flag);
    int64_t took = rr_now_ms() - t0;
    pthread_join(t, NULL);
    RR_CHECK(rc != FAB_OK && coll == NULL, "connect returned %d and %p with the abort flag raised", (int)rc, coll);
    RR_CHECK(took < 3000, "connect took %lld ms to see the abort flag", (long long)took);
    RR_CHECK(rr_warns() - warns0 == 1, "%d WARN lines for an abort (want 1)", rr_warns() - warns0);
    printf("rank 0: connect gave up %lld ms after it started, 300 ms after the abort flag (result %d)\n",
           (long long)took, (int)rc);
  }
  rr_barrier(c, "aborted");
  RR_OK(c->api.close_listen(listen));
  RR_OK(c->api.finalize(ctx));
}

/* NCCL's shape: a proxy thread streams puts with signals and drives progress
 * while the main thread registers and deregisters windows (collectively) on
 * the same group. Every signal arrives, with its data, and every
 * registration round completes. */
enum { THREAD_PUTS = 20000, THREAD_WINDOW = 16, THREAD_REGS = 40 };

typedef struct proxy_arg {
  rr_ctx* c;
  grp* g;
  _Atomic int done;
} proxy_arg;

static void* proxy(void* arg) {
  proxy_arg* a = arg;
  rr_ctx* c = a->c;
  grp* g = a->g;
  int d = (c->rank + 1) % c->nranks;
  void* reqs[THREAD_WINDOW] = {0};
  for (int j = 0; j < THREAD_PUTS; j++) {
    int k = j % THREAD_WINDOW;
    if (reqs[k]) wait_req(c, g, reqs[k], "proxy put");
    uint64_t off = (uint64_t)(j % 64) * 4096;
    RR_OK(c->api.iput_signal(g->rctx, 0, off, g->src_mh, 4096, (uint64_t)c->rank * g->region + off, g->data_mh,
                             (uint32_t)d, sig_off(c, c->rank, 0), g->sig_mh, 1, FAB_SIGNAL_ADD, true, 0, &reqs[k]));
  }
  for (int k = 0; k < THREAD_WINDOW; k++)
    if (reqs[k]) wait_req(c, g, reqs[k], "proxy put");
  atomic_store(&a->done, 1);
  return NULL;
}

static void threads(rr_ctx* c) {
  grp g;
  setup(c, &g, 1u << 20);
  fill(g.src, 64 * 4096, 4242u + (unsigned)c->rank);
  rr_barrier(c, "threads start");
  proxy_arg a = {.c = c, .g = &g};
  pthread_t t;
  RR_CHECK(pthread_create(&t, NULL, proxy, &a) == 0, "pthread_create");
  unsigned char* tmp = aligned_alloc(4096, 65536);
  RR_CHECK(tmp, "out of memory");
  for (int i = 0; i < THREAD_REGS; i++) {
    rr_phase(c, "threads: registration %d while the proxy thread puts", i);
    void* mh = NULL;
    RR_OK(c->api.reg_mr_sym(g.coll, tmp, 65536, FAB_PTR_HOST, 0, &mh, NULL));
    RR_OK(c->api.dereg_mr_sym(g.coll, mh));
  }
  free(tmp);
  int s = (c->rank + c->nranks - 1) % c->nranks;
  rr_phase(c, "threads: waiting for rank %d's signals", s);
  uint64_t* w = sig_word(c, &g, s, 0);
  int64_t deadline = rr_now_ms() + TIMEOUT_MS;
  while (load_sig(w) < THREAD_PUTS && rr_now_ms() < deadline) { /* as NCCL's proxy keeps calling rmaProgress */
    RR_OK(c->api.progress(g.rctx));
    sched_yield(); /* ranks may share cores */
  }
  RR_CHECK(load_sig(w) == THREAD_PUTS, "%llu signals of %d", (unsigned long long)load_sig(w), THREAD_PUTS);
  check_bytes(c, g.data + (size_t)s * g.region, 64 * 4096, 4242u + (unsigned)s, "data behind the last signal");
  while (!atomic_load(&a.done)) {
    RR_OK(c->api.progress(g.rctx));
    sched_yield();
  }
  pthread_join(t, NULL);
  rr_barrier(c, "threads");
  teardown(c, &g);
}

/* Two groups in each process, driven by one thread with many signalled puts
 * outstanding on each (a conformance client's shape: 2 lanes x 256
 * requests). On shm the second group's send comm has an endpoint of its own:
 * a retry of a post the provider refused for now must also drive the
 * endpoint the peer's writes land on, or both processes retry for ever. */
enum { LANE_REQS = 256, LANE_ROUNDS = 8 };

static void two_groups(rr_ctx* c) {
  grp g[2];
  setup(c, &g[0], 1u << 20);
  setup(c, &g[1], 1u << 20);
  fill(g[0].src, 64 * 4096, 11u);
  fill(g[1].src, 64 * 4096, 12u);
  rr_set_idle(NULL, NULL);
  rr_barrier(c, "two groups start");
  int d = (c->rank + 1) % c->nranks, s = (c->rank + c->nranks - 1) % c->nranks;
  static void* reqs[2][LANE_REQS];
  for (int round = 0; round < LANE_ROUNDS; round++) {
    rr_phase(c, "two groups: round %d, %d puts with signals on each", round, LANE_REQS);
    for (int j = 0; j < LANE_REQS; j++)
      for (int k = 0; k < 2; k++) {
        uint64_t off = (uint64_t)(j % 64) * 4096;
        RR_OK(c->api.iput_signal(g[k].rctx, 0, off, g[k].src_mh, 4096, (uint64_t)c->rank * g[k].region + off,
                                 g[k].data_mh, (uint32_t)d, sig_off(c, c->rank, 0), g[k].sig_mh, 1, FAB_SIGNAL_ADD,
                                 true, 0, &reqs[k][j]));
      }
    for (int j = 0; j < LANE_REQS; j++)
      for (int k = 0; k < 2; k++) wait_req(c, &g[k], reqs[k][j], "two groups: put");
  }
  for (int k = 0; k < 2; k++) {
    rr_phase(c, "two groups: signals of group %d", k);
    wait_sig(c, &g[k], sig_word(c, &g[k], s, 0), (uint64_t)LANE_REQS * LANE_ROUNDS, "two groups: signals");
    check_bytes(c, g[k].data + (size_t)s * g[k].region, 64 * 4096, 11u + (unsigned)k, "two groups: data");
  }
  rr_barrier(c, "two groups done");
  teardown(c, &g[1]);
  teardown(c, &g[0]);
}

/* --- dereg_remote: operations into a window its target deregistered ----------------------- */

/* Issue 26 item 4: each fails with one WARN (when it is posted or when it is
 * tested), writes nothing, and a signal from the same source into a live
 * window afterwards is applied as usual. */
static void expect_failed_op(rr_ctx* c, grp* g, int w0, fab_result rc, void* req, const char* what) {
  if (rc == FAB_OK) {
    RR_CHECK(req != NULL, "%s: accepted with no request", what);
    int64_t deadline = rr_now_ms() + 20000;
    int done = 0;
    while ((rc = c->api.test(g->coll, req, &done)) == FAB_OK && !done && rr_now_ms() < deadline) sched_yield();
  }
  RR_CHECK(rc != FAB_OK, "%s: %s", what, "completed with success into a window its target deregistered");
  RR_CHECK(rr_warns() == w0 + 1, "%s: %d WARN lines, want 1 (last: %s)", what, rr_warns() - w0, rr_last_warn());
}

static void dereg_remote(rr_ctx* c) {
  grp g;
  setup(c, &g, 1u << 20);
  enum { EXTRA = 65536 };
  unsigned char* extra = aligned_alloc(4096, EXTRA);
  RR_CHECK(extra, "out of memory");
  memset(extra, 0x5c, EXTRA);
  void* extra_mh = NULL;
  RR_OK(c->api.reg_mr_sym(g.coll, extra, EXTRA, FAB_PTR_HOST, 0, &extra_mh, NULL));
  rr_barrier(c, "extra window registered");
  if (c->rank == 1) RR_OK(c->api.dereg_mr_sym(g.coll, extra_mh));
  rr_barrier(c, "extra window deregistered at rank 1");
  if (c->rank == 0) {
    fill(g.src, 8192, 77u);
    void* req = NULL;
    rr_expect_warns(1);
    rr_phase(c, "a put into the withdrawn window");
    int w0 = rr_warns();
    fab_result rc = c->api.iput(g.rctx, 0, 0, g.src_mh, 4096, 0, extra_mh, 1, 0, &req);
    expect_failed_op(c, &g, w0, rc, req, "a put into a window its target deregistered");
    rr_phase(c, "a put with a signal into the withdrawn window");
    req = NULL;
    w0 = rr_warns();
    rc = c->api.iput_signal(g.rctx, 0, 0, g.src_mh, 4096, 0, extra_mh, 1, sig_off(c, 0, 0), g.sig_mh, 1,
                            FAB_SIGNAL_ADD, true, 0, &req);
    expect_failed_op(c, &g, w0, rc, req, "a put with a signal into a window its target deregistered");
    if (c->api.iget) {
      rr_phase(c, "a get from the withdrawn window");
      req = NULL;
      w0 = rr_warns();
      rc = c->api.iget(g.rctx, 0, 0, extra_mh, 4096, 0, g.src_mh, 1, 0, &req);
      expect_failed_op(c, &g, w0, rc, req, "a get from a window its target deregistered");
    }
    rr_expect_warns(0);
    rr_phase(c, "a put with a signal into a live window after them");
    req = NULL;
    RR_OK(c->api.iput_signal(g.rctx, 0, 0, g.src_mh, 8192, g.region * 0, g.data_mh, 1, sig_off(c, 0, 0), g.sig_mh, 1,
                             FAB_SIGNAL_ADD, true, 0, &req));
    wait_req(c, &g, req, "the put after the refused ones");
  } else {
    wait_sig(c, &g, sig_word(c, &g, 0, 0), 1, "the signal after the refused operations");
    check_bytes(c, g.data, 8192, 77u, "the put after the refused operations");
  }
  rr_barrier(c, "dereg_remote checked");
  if (c->rank == 0) RR_OK(c->api.dereg_mr_sym(g.coll, extra_mh));
  for (size_t i = 0; i < EXTRA; i++) RR_CHECK(extra[i] == 0x5c, "byte %zu of the withdrawn window was written", i);
  free(extra);
  teardown(c, &g);
}

static void body(rr_ctx* c) {
  size_t region = max_size + 4096;
  grp g;
  setup(c, &g, region);
  transfer(c, &g);
  get(c, &g);
  strong(c, &g);
  burst(c, &g);
  stream(c, &g);
  flush(c, &g);
  errors(c, &g);
  teardown(c, &g);
  rr_barrier(c, "closed");
  /* init again in the same process: a fresh group works */
  setup(c, &g, 1u << 20);
  transfer(c, &g);
  teardown(c, &g);
  RR_CHECK(rr_warns() == 0 || c->rank == 0, "rank %d logged %d unexpected WARN lines (last: %s)", c->rank, rr_warns(),
           rr_last_warn());
}

/* A device on the sendrecv transport (auto's choice on shm): the RMA init
 * NCCL makes at every communicator's creation is refused, so NCCL keeps its
 * RMA API to itself, and says so at INFO, not as a WARN in every log. */
static void init_refused(rr_ctx* c) {
  fab_ctx* ctx = (fab_ctx*)(uintptr_t)0x1;
  fab_result rc = c->api.init(&ctx, 0x77, rr_logger);
  RR_CHECK(rc != FAB_OK && ctx == NULL, "RMA init on a sendrecv device: result %d, context %p", (int)rc, (void*)ctx);
  RR_CHECK(rr_warns() == 0, "RMA init on a sendrecv device logged a WARN: %s", rr_last_warn());
}

int main(int argc, char** argv) {
  int nranks = 2;
  void (*run)(rr_ctx*) = body;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--ranks") == 0) nranks = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--max-size") == 0) max_size = strtoull(argv[i + 1], NULL, 0);
    else if (strcmp(argv[i], "--case") == 0 && strcmp(argv[i + 1], "peer_killed") == 0) run = peer_killed;
    else if (strcmp(argv[i], "--case") == 0 && strcmp(argv[i + 1], "threads") == 0) run = threads;
    else if (strcmp(argv[i], "--case") == 0 && strcmp(argv[i + 1], "init_refused") == 0) run = init_refused;
    else if (strcmp(argv[i], "--case") == 0 && strcmp(argv[i + 1], "two_groups") == 0) run = two_groups;
    else if (strcmp(argv[i], "--case") == 0 && strcmp(argv[i + 1], "dereg_remote") == 0) run = dereg_remote;
    else if (strcmp(argv[i], "--case") == 0 && strcmp(argv[i + 1], "connect_abort") == 0) run = connect_abort;
    else if (strcmp(argv[i], "--mem") == 0 && strcmp(argv[i + 1], "host") == 0) mem_kind = MEM_HOST;
    else if (strcmp(argv[i], "--mem") == 0 && strcmp(argv[i + 1], "gpu") == 0) mem_kind = MEM_GPU;
    else if (strcmp(argv[i], "--mem") == 0 && strcmp(argv[i + 1], "mixed") == 0) mem_kind = MEM_MIXED;
    else {
      fprintf(stderr, "usage: %s [--ranks N] [--max-size BYTES] [--case peer_killed|threads|init_refused|two_groups|dereg_remote|connect_abort] "
              "[--mem host|gpu|mixed]\n", argv[0]);
      return 2;
    }
  }
  if (mem_kind != MEM_HOST) setenv("FABRIC_GPU_EMULATE", "1", 1); /* before any rank loads the plugin */
  int rc = rr_run(nranks, 280, run);
  printf("%s: %d ranks, through %s: %s\n", argv[0], nranks,
         getenv("FABRIC_TEST_RMA_API") ? getenv("FABRIC_TEST_RMA_API") : "16", rc ? "FAILED" : "passed");
  return rc;
}
