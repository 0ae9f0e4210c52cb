/*
 * nccl_check: correctness + timing sweep of NCCL collectives, one process per GPU.
 *
 * The parent never touches CUDA or NCCL: it maps a shared-memory block, forks
 * one child per rank and waits. Rank 0 calls ncclGetUniqueId and publishes the
 * id in the shared block; the other ranks wait for it. Each rank fills its send
 * buffer once with val(rank, i) (small integers, exact in float32), then for
 * every (size, op): clears the receive buffer to NaN, runs the op once and
 * checks every element, runs warm-ups and timed iterations (cudaEvents), and
 * checks every element again. Results of all ranks meet in the shared block;
 * rank 0 prints one CSV line per (op, size):
 *
 *   program,provider,net,version_lib,op,bytes,time_us,algbw_GBs,busbw_GBs,correct
 *
 * time_us is the largest per-rank mean over the timed iterations. bytes follows
 * nccl-tests: all_reduce/broadcast: the buffer; all_gather: the received total;
 * reduce_scatter: the sent total; all_to_all: the sent total per rank.
 * correct is PASS, FAIL (wrong data), ERROR (NCCL/CUDA error) or TIMEOUT.
 * Lines starting with '#' are information. Exit status 0 only if all PASS.
 *
 * Build: gcc -O2 -Wall -Wextra -I<nccl inc> -I<cuda inc> nccl_check.c <libnccl.so.2> -L<cuda lib> -lcudart
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 8
#define MAX_SIZES 64
#define NUM_OPS 5
#define MAX_TESTS (MAX_SIZES * NUM_OPS)

enum { ST_PASS = 0, ST_FAIL = 1, ST_ERROR = 2, ST_TIMEOUT = 3, ST_NOTRUN = 4 };
static const char* st_name[] = {"PASS", "FAIL", "ERROR", "TIMEOUT", "NOTRUN"};

enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_ALL_TO_ALL };
static const char* op_name[NUM_OPS] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"};

struct slot {
  volatile int done;      /* set last (release) */
  int status;             /* ST_* */
  double time_us;         /* mean per op on this rank */
  long long errors;       /* mismatching elements, both checks */
};

struct shared {
  volatile int id_ready;
  volatile int abort_flag; /* a rank failed hard: the others stop */
  volatile int printed;    /* CSV lines rank 0 has printed */
  ncclUniqueId id;
  struct slot res[MAX_TESTS][MAX_RANKS];
};

struct opts {
  int nranks;
  int nsizes;
  size_t sizes[MAX_SIZES];
  int warmup, iters;       /* <0: automatic by size */
  int ops_mask;
  double op_timeout_s;     /* per wait on the stream */
  const char* provider;
  const char* net;
  const char* lib;
  int verbose;
};

static struct shared* g_sh;
static struct opts g_o;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- data pattern: shared definition with torch_check.py ---- */
static uint32_t g_mask; /* value mask so that the sum over ranks stays < 2^24 */

static inline float val(int r, uint64_t i) {
  uint64_t key = (i + (uint64_t)r * 0x3C6EF35ull) & 0x3FFFFFFFull;
  uint64_t h = (key * 0x9E3779B1ull) & 0xFFFFFFFFull;
  h ^= h >> 15;
  h = (h * 0x2C1B3C6Dull) & 0xFFFFFFFFull;
  h ^= h >> 12;
  return (float)(h & g_mask);
}

static uint32_t value_mask(int nranks) {
  int bits = 0;
  while ((1 << bits) < nranks) bits++;
  return (1u << (24 - bits)) - 1u;
}

/* ---- size parsing ---- */
static int parse_size(const char* s, size_t* out) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v <= 0) return -1;
  size_t mul = 1;
  if (*end) {
    switch (*end) {
      case 'k': case 'K': mul = 1024ull; break;
      case 'm': case 'M': mul = 1024ull * 1024; break;
      case 'g': case 'G': mul = 1024ull * 1024 * 1024; break;
      case 'b': case 'B': mul = 1; break;
      default: return -1;
    }
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return -1;
  }
  *out = (size_t)(v * (double)mul);
  return 0;
}

static int parse_sizes(const char* list, struct opts* o) {
  char* dup = strdup(list);
  char* save = NULL;
  o->nsizes = 0;
  for (char* t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (o->nsizes >= MAX_SIZES) { fprintf(stderr, "nccl_check: too many sizes (max %d)\n", MAX_SIZES); free(dup); return -1; }
    if (parse_size(t, &o->sizes[o->nsizes])) { fprintf(stderr, "nccl_check: bad size '%s'\n", t); free(dup); return -1; }
    o->nsizes++;
  }
  free(dup);
  return o->nsizes > 0 ? 0 : -1;
}

static int parse_ops(const char* list, int* mask) {
  char* dup = strdup(list);
  char* save = NULL;
  *mask = 0;
  for (char* t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int k = 0; k < NUM_OPS; k++)
      if (!strcmp(t, op_name[k])) { *mask |= 1 << k; found = 1; }
    if (!found) { fprintf(stderr, "nccl_check: unknown op '%s'\n", t); free(dup); return -1; }
  }
  free(dup);
  return *mask ? 0 : -1;
}

/* Element count of the op's "size" buffer, rounded so that it divides by nranks. */
static size_t size_count(size_t bytes, int n) {
  size_t c = bytes / sizeof(float);
  c -= c % (size_t)n;
  if (c == 0) c = (size_t)n;
  return c;
}

static void auto_iters(size_t bytes, int* warm, int* iters) {
  if (bytes <= (1u << 20)) { *warm = 5; *iters = 20; }
  else if (bytes <= (16u << 20)) { *warm = 2; *iters = 10; }
  else if (bytes <= (64u << 20)) { *warm = 1; *iters = 5; }
  else { *warm = 1; *iters = 3; }
}

static double bus_factor(int op, int n) {
  switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case OP_ALL_GATHER: case OP_REDUCE_SCATTER: case OP_ALL_TO_ALL: return (double)(n - 1) / n;
    default: return 1.0;
  }
}

/* ---- per-rank worker ---- */
struct rank_ctx {
  int rank, n;
  ncclComm_t comm;
  cudaStream_t stream;
  float *d_send, *d_recv;
  float *h_buf;
  int h_pinned;
};

/* One write per message so that the ranks' lines do not interleave. */
static void rlog(int rank, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void rlog(int rank, const char* fmt, ...) {
  char buf[1024];
  int len = snprintf(buf, sizeof(buf), "[nccl_check rank %d] ", rank);
  va_list ap;
  va_start(ap, fmt);
  len += vsnprintf(buf + len, sizeof(buf) - len - 1, fmt, ap);
  va_end(ap);
  if (len > (int)sizeof(buf) - 2) len = (int)sizeof(buf) - 2;
  buf[len++] = '\n';
  ssize_t w = write(2, buf, len);
  (void)w;
}
#define RLOG(c, ...) rlog((c)->rank, __VA_ARGS__)

static void hard_fail(struct rank_ctx* c, const char* why) {
  RLOG(c, "hard failure: %s; aborting communicator", why);
  __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE);
  if (c->comm) ncclCommAbort(c->comm);
  fflush(stdout);
  fflush(stderr);
  _exit(3);
}

/* Wait for the stream with a timeout, watching NCCL async errors and the abort flag.
 * Returns ST_PASS, ST_ERROR or ST_TIMEOUT. */
static int wait_stream(struct rank_ctx* c, double timeout_s) {
  double t0 = now_s();
  unsigned spins = 0;
  for (;;) {
    cudaError_t e = cudaStreamQuery(c->stream);
    if (e == cudaSuccess) return ST_PASS;
    if (e != cudaErrorNotReady) { RLOG(c, "cudaStreamQuery: %s", cudaGetErrorString(e)); return ST_ERROR; }
    ncclResult_t ae = ncclSuccess;
    if (ncclCommGetAsyncError(c->comm, &ae) != ncclSuccess || (ae != ncclSuccess && ae != ncclInProgress)) {
      RLOG(c, "NCCL async error: %s", ncclGetErrorString(ae));
      return ST_ERROR;
    }
    if (__atomic_load_n(&g_sh->abort_flag, __ATOMIC_ACQUIRE)) { RLOG(c, "another rank aborted"); return ST_ERROR; }
    if (timeout_s > 0 && now_s() - t0 > timeout_s) { RLOG(c, "timed out after %.0f s waiting for the stream", timeout_s); return ST_TIMEOUT; }
    if (++spins > 1000) usleep(100);
  }
}

static ncclResult_t launch(struct rank_ctx* c, int op, size_t count) {
  const int n = c->n;
  switch (op) {
    case OP_ALL_REDUCE:
      return ncclAllReduce(c->d_send, c->d_recv, count, ncclFloat32, ncclSum, c->comm, c->stream);
    case OP_ALL_GATHER:
      return ncclAllGather(c->d_send, c->d_recv, count / n, ncclFloat32, c->comm, c->stream);
    case OP_REDUCE_SCATTER:
      return ncclReduceScatter(c->d_send, c->d_recv, count / n, ncclFloat32, ncclSum, c->comm, c->stream);
    case OP_BROADCAST:
      return ncclBroadcast(c->d_send, c->d_recv, count, ncclFloat32, 0, c->comm, c->stream);
    case OP_ALL_TO_ALL: {
      size_t chunk = count / n;
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (int p = 0; p < n; p++) {
        r = ncclSend(c->d_send + p * chunk, chunk, ncclFloat32, p, c->comm, c->stream);
        if (r != ncclSuccess) break;
        r = ncclRecv(c->d_recv + p * chunk, chunk, ncclFloat32, p, c->comm, c->stream);
        if (r != ncclSuccess) break;
      }
      ncclResult_t g = ncclGroupEnd();
      return r != ncclSuccess ? r : g;
    }
  }
  return ncclInvalidArgument;
}

/* Element count of the receive buffer for op with "size" count. */
static size_t recv_count(int op, size_t count, int n) {
  return op == OP_REDUCE_SCATTER ? count / n : count;
}

static inline float expected(int op, int r, int n, size_t count, size_t i) {
  switch (op) {
    case OP_ALL_REDUCE: {
      float s = 0.0f;
      for (int q = 0; q < n; q++) s += val(q, i);
      return s;
    }
    case OP_ALL_GATHER: {
      size_t sc = count / n;
      return val((int)(i / sc), i % sc);
    }
    case OP_REDUCE_SCATTER: {
      size_t rc = count / n;
      float s = 0.0f;
      for (int q = 0; q < n; q++) s += val(q, (size_t)r * rc + i);
      return s;
    }
    case OP_BROADCAST:
      return val(0, i);
    case OP_ALL_TO_ALL: {
      size_t chunk = count / n;
      size_t p = i / chunk, j = i % chunk;
      return val((int)p, (size_t)r * chunk + j);
    }
  }
  return -1.0f;
}

/* Copies the receive buffer back and counts mismatching elements (-1 on a CUDA error). */
static long long check(struct rank_ctx* c, int op, size_t count, size_t bytes, const char* when) {
  size_t rc = recv_count(op, count, c->n);
  cudaError_t e = cudaMemcpy(c->h_buf, c->d_recv, rc * sizeof(float), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) { RLOG(c, "cudaMemcpy D2H: %s", cudaGetErrorString(e)); return -1; }
  long long bad = 0;
  for (size_t i = 0; i < rc; i++) {
    float x = expected(op, c->rank, c->n, count, i);
    if (!(c->h_buf[i] == x)) {
      if (bad < 5)
        RLOG(c, "MISMATCH %s bytes=%zu (%s) element %zu: got %.1f expected %.1f", op_name[op], bytes, when, i,
             (double)c->h_buf[i], (double)x);
      bad++;
    }
  }
  if (bad) RLOG(c, "%s bytes=%zu (%s): %lld of %zu elements wrong", op_name[op], bytes, when, bad, rc);
  return bad;
}

static void publish(int t, int rank, int status, double time_us, long long errors) {
  struct slot* s = &g_sh->res[t][rank];
  s->status = status;
  s->time_us = time_us;
  s->errors = errors;
  __atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
}

static void print_row(int op, size_t bytes, double t_us, double algbw, double busbw, int status) {
  printf("nccl_check,%s,%s,%s,%s,%zu,%.2f,%.4f,%.4f,%s\n", g_o.provider, g_o.net, g_o.lib, op_name[op], bytes, t_us,
         algbw, busbw, st_name[status]);
  fflush(stdout);
}

/* The t-th test in the order every rank runs them: sizes outer, ops inner. */
static void test_at(int t, int* op, size_t* bytes) {
  int k = 0;
  for (int s = 0; s < g_o.nsizes; s++)
    for (int o = 0; o < NUM_OPS; o++) {
      if (!(g_o.ops_mask & (1 << o))) continue;
      if (k++ == t) { *op = o; *bytes = size_count(g_o.sizes[s], g_o.nranks) * sizeof(float); return; }
    }
  *op = 0;
  *bytes = 0;
}

/* Rank 0: wait for all ranks' result of test t, print the CSV line. */
static int report(struct rank_ctx* c, int t, int op, size_t bytes) {
  double deadline = now_s() + 3 * (g_o.op_timeout_s > 0 ? g_o.op_timeout_s : 600) + 60;
  double abort_deadline = 0;
  int status = ST_PASS;
  double tmax = 0;
  for (int r = 0; r < c->n; r++) {
    struct slot* s = &g_sh->res[t][r];
    while (!__atomic_load_n(&s->done, __ATOMIC_ACQUIRE)) {
      if (now_s() > deadline) { RLOG(c, "no result from rank %d for test %d", r, t); status = ST_TIMEOUT; goto out; }
      if (__atomic_load_n(&g_sh->abort_flag, __ATOMIC_ACQUIRE)) {
        if (!abort_deadline) abort_deadline = now_s() + 5;
        else if (now_s() > abort_deadline) { RLOG(c, "rank %d aborted without a result for test %d", r, t); status = ST_ERROR; goto out; }
      }
      usleep(200);
    }
    if (s->status > status) status = s->status;
    if (s->time_us > tmax) tmax = s->time_us;
  }
out:;
  double algbw = (status == ST_PASS || status == ST_FAIL) && tmax > 0 ? (double)bytes / (tmax * 1e-6) / 1e9 : 0.0;
  double busbw = algbw * bus_factor(op, c->n);
  print_row(op, bytes, tmax, algbw, busbw, status);
  __atomic_add_fetch(&g_sh->printed, 1, __ATOMIC_ACQ_REL);
  return status;
}

static void write_pid_file(const char* what) {
  const char* dir = getenv("CHECK_PID_DIR"); /* run.sh reaps leftovers by these */
  if (!dir) return;
  char path[4096];
  snprintf(path, sizeof(path), "%s/pid.%s", dir, what);
  FILE* f = fopen(path, "w");
  if (f) { fprintf(f, "%d\n", (int)getpid()); fclose(f); }
}

static int run_rank(int rank) {
  struct rank_ctx ctx = {0};
  struct rank_ctx* c = &ctx;
  c->rank = rank;
  c->n = g_o.nranks;
  char what[64];
  snprintf(what, sizeof(what), "nccl_check.rank%d", rank);
  write_pid_file(what);
  int ndev = 0;
  cudaError_t ce = cudaGetDeviceCount(&ndev);
  if (ce != cudaSuccess) { RLOG(c, "cudaGetDeviceCount: %s", cudaGetErrorString(ce)); __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE); return 2; }
  if (ndev < c->n) { RLOG(c, "need %d GPUs, found %d", c->n, ndev); __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE); return 2; }
  ce = cudaSetDevice(rank);
  if (ce != cudaSuccess) { RLOG(c, "cudaSetDevice(%d): %s", rank, cudaGetErrorString(ce)); __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE); return 2; }

  size_t maxbytes = 0;
  for (int s = 0; s < g_o.nsizes; s++) {
    size_t b = size_count(g_o.sizes[s], c->n) * sizeof(float);
    if (b > maxbytes) maxbytes = b;
  }
  size_t maxcount = maxbytes / sizeof(float);

  if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void**)&c->d_send, maxbytes) != cudaSuccess || cudaMalloc((void**)&c->d_recv, maxbytes) != cudaSuccess) {
    RLOG(c, "CUDA allocation of 2 x %zu bytes failed: %s", maxbytes, cudaGetErrorString(cudaGetLastError()));
    __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE);
    return 2;
  }
  if (cudaMallocHost((void**)&c->h_buf, maxbytes) == cudaSuccess) c->h_pinned = 1;
  else { cudaGetLastError(); c->h_buf = malloc(maxbytes); }
  if (!c->h_buf) { RLOG(c, "host allocation failed"); __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE); return 2; }

  /* Send buffer: val(rank, i), filled once; every op is out-of-place. */
  for (size_t i = 0; i < maxcount; i++) c->h_buf[i] = val(rank, i);
  if (cudaMemcpy(c->d_send, c->h_buf, maxbytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    RLOG(c, "cudaMemcpy H2D failed");
    __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE);
    return 2;
  }

  /* Unique id: rank 0 creates it, the others wait for it. */
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&g_sh->id);
    if (r != ncclSuccess) { RLOG(c, "ncclGetUniqueId: %s", ncclGetErrorString(r)); __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE); return 2; }
    __atomic_store_n(&g_sh->id_ready, 1, __ATOMIC_RELEASE);
  } else {
    double t0 = now_s();
    while (!__atomic_load_n(&g_sh->id_ready, __ATOMIC_ACQUIRE)) {
      if (__atomic_load_n(&g_sh->abort_flag, __ATOMIC_ACQUIRE)) { RLOG(c, "rank 0 failed before publishing the id"); return 2; }
      if (now_s() - t0 > 120) { RLOG(c, "no unique id from rank 0 after 120 s"); return 2; }
      usleep(1000);
    }
  }
  double ti = now_s();
  ncclResult_t r = ncclCommInitRank(&c->comm, c->n, g_sh->id, rank);
  if (r != ncclSuccess) {
    RLOG(c, "ncclCommInitRank: %s (%s)", ncclGetErrorString(r), ncclGetLastError(NULL));
    c->comm = NULL;
    __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE);
    if (rank == 0) { printf("# init FAILED: ncclCommInitRank: %s\n", ncclGetErrorString(r)); fflush(stdout); }
    return 2;
  }
  if (rank == 0) {
    printf("# init: ncclCommInitRank took %.2f s\n", now_s() - ti);
    fflush(stdout);
  }

  int worst = ST_PASS;
  int t = 0;
  for (int s = 0; s < g_o.nsizes; s++) {
    size_t count = size_count(g_o.sizes[s], c->n);
    size_t bytes = count * sizeof(float);
    int warm, iters;
    auto_iters(bytes, &warm, &iters);
    if (g_o.warmup >= 0) warm = g_o.warmup;
    if (g_o.iters > 0) iters = g_o.iters;
    for (int op = 0; op < NUM_OPS; op++) {
      if (!(g_o.ops_mask & (1 << op))) continue;
      if (g_o.verbose) RLOG(c, "start %s bytes=%zu warm=%d iters=%d", op_name[op], bytes, warm, iters);
      int status = ST_PASS;
      long long errors = 0;
      double time_us = 0;
      size_t rc = recv_count(op, count, c->n);

      /* 1. correctness run from a NaN-filled receive buffer */
      if (cudaMemsetAsync(c->d_recv, 0xFF, rc * sizeof(float), c->stream) != cudaSuccess) status = ST_ERROR;
      if (status == ST_PASS) {
        r = launch(c, op, count);
        if (r != ncclSuccess) { RLOG(c, "%s: %s (%s)", op_name[op], ncclGetErrorString(r), ncclGetLastError(c->comm)); status = ST_ERROR; }
      }
      if (status == ST_PASS) status = wait_stream(c, g_o.op_timeout_s);
      if (status == ST_PASS) {
        long long b = check(c, op, count, bytes, "first run");
        if (b < 0) status = ST_ERROR; else errors += b;
      }
      /* 2. warm-up and timed iterations */
      cudaEvent_t e0 = NULL, e1 = NULL;
      if (status == ST_PASS) {
        for (int i = 0; i < warm && r == ncclSuccess; i++) r = launch(c, op, count);
        if (r != ncclSuccess) { RLOG(c, "%s warm-up: %s", op_name[op], ncclGetErrorString(r)); status = ST_ERROR; }
      }
      if (status == ST_PASS) status = wait_stream(c, g_o.op_timeout_s);
      if (status == ST_PASS) {
        if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) status = ST_ERROR;
      }
      if (status == ST_PASS) {
        cudaEventRecord(e0, c->stream);
        for (int i = 0; i < iters && r == ncclSuccess; i++) r = launch(c, op, count);
        cudaEventRecord(e1, c->stream);
        if (r != ncclSuccess) { RLOG(c, "%s timed: %s", op_name[op], ncclGetErrorString(r)); status = ST_ERROR; }
      }
      if (status == ST_PASS) status = wait_stream(c, g_o.op_timeout_s);
      if (status == ST_PASS) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) status = ST_ERROR;
        else time_us = (double)ms * 1000.0 / iters;
      }
      if (e0) cudaEventDestroy(e0);
      if (e1) cudaEventDestroy(e1);
      /* 3. check again after the timed iterations */
      if (status == ST_PASS) {
        long long b = check(c, op, count, bytes, "after timed iterations");
        if (b < 0) status = ST_ERROR; else errors += b;
      }
      if (status == ST_PASS && errors) status = ST_FAIL;
      publish(t, rank, status, time_us, errors);
      if (rank == 0) {
        int st = report(c, t, op, bytes);
        if (st > worst) worst = st;
      } else if (status > worst) {
        worst = status;
      }
      if (status == ST_ERROR || status == ST_TIMEOUT) hard_fail(c, st_name[status]);
      if (__atomic_load_n(&g_sh->abort_flag, __ATOMIC_ACQUIRE)) hard_fail(c, "another rank aborted");
      t++;
    }
  }

  /* The send buffer must be untouched. */
  long long bad = 0;
  if (cudaMemcpy(c->h_buf, c->d_send, maxbytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
    for (size_t i = 0; i < maxcount; i++) bad += !(c->h_buf[i] == val(rank, i));
  } else {
    bad = -1;
  }
  if (bad) { RLOG(c, "send buffer modified or unreadable (%lld elements)", bad); if (worst < ST_FAIL) worst = ST_FAIL; }

  r = ncclCommFinalize(c->comm);
  if (r == ncclSuccess) r = ncclCommDestroy(c->comm);
  else ncclCommAbort(c->comm);
  if (r != ncclSuccess) { RLOG(c, "finalize/destroy: %s", ncclGetErrorString(r)); if (worst < ST_ERROR) worst = ST_ERROR; }
  cudaFree(c->d_send);
  cudaFree(c->d_recv);
  if (c->h_pinned) cudaFreeHost(c->h_buf); else free(c->h_buf);
  cudaStreamDestroy(c->stream);
  if (rank == 0) {
    printf("# rank 0 done: %s, send buffer %s\n", worst == ST_PASS ? "all PASS" : "FAILURES", bad ? "MODIFIED" : "intact");
    fflush(stdout);
  }
  return worst == ST_PASS ? 0 : 1;
}

static void usage(const char* p) {
  fprintf(stderr,
          "usage: %s [--nranks N] [--sizes 8,1K,64K,...] [--quick] [--ops all_reduce,...]\n"
          "          [--warmup N] [--iters N] [--op-timeout S] [--provider LABEL] [--net LABEL] [--lib LABEL] [-v]\n"
          "          [--dump-pattern N]  (print val(rank, i) for i < N and exit; no GPU needed)\n"
          "Runs N ranks (one process per GPU, default 2) and prints CSV lines:\n"
          "  program,provider,net,version_lib,op,bytes,time_us,algbw_GBs,busbw_GBs,correct\n",
          p);
}

static const char* DEFAULT_SIZES = "8,64,256,1K,4K,16K,64K,256K,1M,4M,16M,64M,128M,256M";
static const char* QUICK_SIZES = "8,64K,4M,64M";

int main(int argc, char** argv) {
  struct opts* o = &g_o;
  o->nranks = 2;
  o->warmup = -1;
  o->iters = -1;
  o->ops_mask = (1 << NUM_OPS) - 1;
  o->op_timeout_s = 90;
  o->provider = "none";
  o->net = "default";
  o->lib = "none";
  const char* sizes = DEFAULT_SIZES;
  unsigned long long dump_n = 0;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) { usage(argv[0]); return 2; } i++; } while (0)
    if (!strcmp(a, "--nranks")) { NEEDV(); o->nranks = atoi(v); }
    else if (!strcmp(a, "--sizes")) { NEEDV(); sizes = v; }
    else if (!strcmp(a, "--quick")) { sizes = QUICK_SIZES; }
    else if (!strcmp(a, "--ops")) { NEEDV(); if (parse_ops(v, &o->ops_mask)) return 2; }
    else if (!strcmp(a, "--warmup")) { NEEDV(); o->warmup = atoi(v); }
    else if (!strcmp(a, "--iters")) { NEEDV(); o->iters = atoi(v); }
    else if (!strcmp(a, "--op-timeout")) { NEEDV(); o->op_timeout_s = atof(v); }
    else if (!strcmp(a, "--provider")) { NEEDV(); o->provider = v; }
    else if (!strcmp(a, "--net")) { NEEDV(); o->net = v; }
    else if (!strcmp(a, "--lib")) { NEEDV(); o->lib = v; }
    else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { o->verbose = 1; }
    else if (!strcmp(a, "--dump-pattern")) { NEEDV(); dump_n = strtoull(v, NULL, 0); }
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(argv[0]); return 0; }
    else { fprintf(stderr, "nccl_check: unknown argument '%s'\n", a); usage(argv[0]); return 2; }
#undef NEEDV
  }
  if (o->nranks < 1 || o->nranks > MAX_RANKS) { fprintf(stderr, "nccl_check: --nranks must be 1..%d\n", MAX_RANKS); return 2; }
  if (parse_sizes(sizes, o)) { usage(argv[0]); return 2; }
  g_mask = value_mask(o->nranks);
  if (dump_n) { /* self-test aid: the data pattern, to compare with torch_check.py */
    for (int r = 0; r < o->nranks; r++)
      for (unsigned long long i = 0; i < dump_n; i++) printf("%d %llu %.0f\n", r, i, (double)val(r, i));
    return 0;
  }

  int ntests = 0;
  for (int k = 0; k < NUM_OPS; k++) ntests += (o->ops_mask >> k) & 1;
  ntests *= o->nsizes;

  /* Information only: ncclGetVersion is a constant getter (no CUDA), dladdr names the library. */
  int ver = 0;
  ncclGetVersion(&ver);
  Dl_info info;
  const char* libpath = dladdr((void*)ncclGetVersion, &info) && info.dli_fname ? info.dli_fname : "?";
  printf("# nccl_check: built against NCCL %d.%d.%d (code %d), running NCCL code %d from %s\n", NCCL_MAJOR, NCCL_MINOR,
         NCCL_PATCH, NCCL_VERSION_CODE, ver, libpath);
  printf("# plan: tests=%d nranks=%d sizes=%s provider=%s net=%s lib=%s\n", ntests, o->nranks, sizes, o->provider, o->net,
         o->lib);
  fflush(stdout);

  g_sh = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_sh == MAP_FAILED) { perror("mmap"); return 2; }
  memset(g_sh, 0, sizeof(*g_sh));

  pid_t pids[MAX_RANKS];
  for (int r = 0; r < o->nranks; r++) {
    pid_t p = fork();
    if (p < 0) { perror("fork"); __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE); for (int q = 0; q < r; q++) kill(pids[q], SIGKILL); return 2; }
    if (p == 0) {
      int rc = run_rank(r);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = p;
  }

  /* Wait for all ranks; once one fails, give the others 20 s, then kill them. */
  int worst = 0, alive = o->nranks;
  double kill_at = 0;
  int exited[MAX_RANKS] = {0};
  while (alive > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p < 0) { if (errno == EINTR) continue; break; }
    if (p == 0) {
      if (kill_at > 0 && now_s() > kill_at) {
        for (int r = 0; r < o->nranks; r++)
          if (!exited[r]) { fprintf(stderr, "[nccl_check] killing rank %d (pid %d)\n", r, (int)pids[r]); kill(pids[r], SIGKILL); }
        kill_at = now_s() + 1e9;
      }
      usleep(20000);
      continue;
    }
    int r = 0;
    while (r < o->nranks && pids[r] != p) r++;
    if (r < o->nranks) exited[r] = 1;
    alive--;
    int code;
    if (WIFEXITED(st)) code = WEXITSTATUS(st);
    else { code = 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0); fprintf(stderr, "[nccl_check] rank %d died with signal %d\n", r, code - 128); }
    if (code) {
      fprintf(stderr, "[nccl_check] rank %d exited with status %d\n", r, code);
      if (!kill_at) kill_at = now_s() + 20;
      __atomic_store_n(&g_sh->abort_flag, 1, __ATOMIC_RELEASE);
    }
    if (code > worst) worst = code;
  }
  /* Lines for the tests that rank 0 did not report (it died or stopped): the first
   * one gets ERROR, the rest NOTRUN, so that every planned test has a line. */
  for (int t = g_sh->printed; t < ntests; t++) {
    int op;
    size_t bytes;
    test_at(t, &op, &bytes);
    print_row(op, bytes, 0.0, 0.0, 0.0, t == g_sh->printed ? ST_ERROR : ST_NOTRUN);
    if (!worst) worst = 1;
  }
  printf("# nccl_check: exit status %d\n", worst);
  fflush(stdout);
  return worst;
}
