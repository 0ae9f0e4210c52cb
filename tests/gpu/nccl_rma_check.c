/*
 * nccl_rma_check: NCCL's host one-sided API (ncclPutSignal, ncclSignal,
 * ncclWaitSignal on ncclMemAlloc windows registered with
 * NCCL_WIN_COLL_SYMMETRIC) on 2 GPUs, one process each. Run with the network
 * path forced (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_LSA_TEAM_SIZE=1) and
 * NCCL_NET_PLUGIN naming the plugin: every put then goes through the
 * plugin's RMA table.
 *
 *   nccl_rma_check [--max BYTES] [--iters N] [--no-timing]
 *
 * Cases (every byte checked by a copy on the waiting stream, after the wait:
 * the way a GPU reader sees it; 64 guard bytes on each side of every written
 * range must keep their fill):
 *   transfer  put+signal of 8 B .. max at odd offsets, both ranks at once
 *   many      64 puts with signals and one ncclSignal in a group, one wait
 *   barrier   200 rounds of ncclSignal / ncclWaitSignal
 *   rereg     3 rounds of deregister, free, allocate, register, put, check
 *   timing    put+signal against ncclSend/ncclRecv on the same communicator:
 *             bandwidth both ways at 1-64 MiB, and an 8-byte ping-pong
 *
 * The parent never touches CUDA or NCCL: it maps a shared block, forks one
 * child per rank (rank 0 makes the NCCL id) and waits. Output: lines
 * "case,bytes,PASS|FAIL,detail" and "timing,..." lines; exit 0 only if all
 * passed.
 *
 * Build: gcc -O2 -Wall -I<nccl inc> -I<cuda inc> nccl_rma_check.c <libnccl.so.2> -L<cuda lib> -lcudart
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>

#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { NRANKS = 2, GUARD = 64, MANY = 64, BARRIER_ROUNDS = 200, REREG_ROUNDS = 3, FILL = 0xee };

struct shared {
  ncclUniqueId id;
  volatile int id_ready;
  volatile int arrived;
  volatile int generation;
  volatile int failed;
};

static struct shared* sh;
static int rank, peer;
static ncclComm_t comm;
static cudaStream_t stream;
static size_t max_bytes = 256u << 20;
static int iters = 20, timing = 1;
static int failures;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stdout, "rank %d: ERROR: ", rank);
  vfprintf(stdout, fmt, ap);
  fprintf(stdout, "\n");
  fflush(stdout);
  va_end(ap);
  sh->failed = 1;
  _exit(1);
}

#define CU(call)                                                                 \
  do {                                                                           \
    cudaError_t e_ = (call);                                                     \
    if (e_ != cudaSuccess) die("%s: %s", #call, cudaGetErrorString(e_));         \
  } while (0)
#define NC(call)                                                                 \
  do {                                                                           \
    ncclResult_t r_ = (call);                                                    \
    if (r_ != ncclSuccess) die("%s: %s", #call, ncclGetErrorString(r_));         \
  } while (0)

/* Host-side barrier of the two processes (generation counting). */
static void barrier(void) {
  int gen = sh->generation;
  if (__atomic_add_fetch(&sh->arrived, 1, __ATOMIC_ACQ_REL) == NRANKS) {
    sh->arrived = 0;
    __atomic_store_n(&sh->generation, gen + 1, __ATOMIC_RELEASE);
  } else {
    while (__atomic_load_n(&sh->generation, __ATOMIC_ACQUIRE) == gen)
      if (sh->failed) _exit(1);
  }
}

/* Waits for the stream, failing (not hanging) after limit seconds. */
static void sync_stream(const char* what, double limit) {
  double t0 = now_s();
  cudaError_t e;
  while ((e = cudaStreamQuery(stream)) == cudaErrorNotReady) {
    if (now_s() - t0 > limit) die("%s: the stream did not finish within %.0f s (a signal never came?)", what, limit);
    if (sh->failed) _exit(1);
  }
  if (e != cudaSuccess) die("%s: %s", what, cudaGetErrorString(e));
}

static unsigned char pat(size_t k, unsigned seed) { return (unsigned char)(k * 131u + seed * 7u + (k >> 11) + 1); }

static void fill_host(unsigned char* h, size_t n, unsigned seed) {
  for (size_t k = 0; k < n; k++) h[k] = pat(k, seed);
}

static void report(const char* name, size_t bytes, int ok, const char* detail) {
  printf("%s,%zu,%s,rank %d%s%s\n", name, bytes, ok ? "PASS" : "FAIL", rank, detail[0] ? ": " : "", detail);
  fflush(stdout);
  if (!ok) failures++;
}

/* Checks [off - GUARD, off + n + GUARD) of the window as copied after the
 * wait: n bytes of the peer's pattern between guards of FILL. */
static int check_range(const unsigned char* got, size_t n, unsigned seed, char* detail, size_t dlen) {
  for (size_t k = 0; k < GUARD; k++)
    if (got[k] != FILL) return snprintf(detail, dlen, "guard byte %zu before the range is %u", GUARD - k, got[k]), 0;
  for (size_t k = 0; k < n; k++)
    if (got[GUARD + k] != pat(k, seed))
      return snprintf(detail, dlen, "byte %zu of %zu is %u, want %u", k, n, got[GUARD + k], pat(k, seed)), 0;
  for (size_t k = 0; k < GUARD; k++)
    if (got[GUARD + n + k] != FILL) return snprintf(detail, dlen, "guard byte %zu after the range is %u", k, got[GUARD + n + k]), 0;
  detail[0] = 0;
  return 1;
}

typedef struct win {
  unsigned char* base;
  size_t size, region; /* [0, region): what we send; [region, 2 region): where the peer writes */
  ncclWindow_t w;
} win;

static void win_open(win* v, size_t region) {
  v->region = (region + 4095) & ~(size_t)4095;
  v->size = 2 * v->region;
  NC(ncclMemAlloc((void**)&v->base, v->size));
  NC(ncclCommWindowRegister(comm, v->base, v->size, &v->w, NCCL_WIN_COLL_SYMMETRIC));
  if (!v->w) die("ncclCommWindowRegister returned no window: symmetric memory or the RMA plugin is unavailable");
}

static void win_close(win* v) {
  NC(ncclCommWindowDeregister(comm, v->w));
  NC(ncclMemFree(v->base));
}

/* One put+signal of n bytes from src_off to the peer's dst_off (in its
 * receiving half), both ranks at once; then the wait, the copy-back and the
 * check. */
static void put_check(win* v, unsigned char* host, unsigned char* got, size_t n, size_t src_off, size_t dst_off,
                      unsigned seed_base, const char* name) {
  unsigned seed_out = seed_base + (unsigned)rank, seed_in = seed_base + (unsigned)peer;
  fill_host(host, n, seed_out);
  CU(cudaMemcpy(v->base + src_off, host, n, cudaMemcpyHostToDevice));
  CU(cudaMemset(v->base + v->region + dst_off - GUARD, FILL, n + 2 * GUARD));
  CU(cudaDeviceSynchronize());
  barrier(); /* the peer's range is filled before anything lands in it */
  NC(ncclPutSignal(v->base + src_off, n, ncclUint8, peer, v->w, v->region + dst_off, 0, 0, 0, comm, stream));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0};
  NC(ncclWaitSignal(1, &d, comm, stream));
  CU(cudaMemcpyAsync(got, v->base + v->region + dst_off - GUARD, n + 2 * GUARD, cudaMemcpyDeviceToHost, stream));
  sync_stream(name, 120);
  char detail[160];
  report(name, n, check_range(got, n, seed_in, detail, sizeof detail), detail);
  barrier();
}

static void case_transfer(win* v, unsigned char* host, unsigned char* got) {
  static const size_t sizes[] = {8, 13, 4103, 65539, (1u << 20) + 5, (16u << 20) + 1, (64u << 20) + 3, 256u << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    if (n + 4 * GUARD + 64 > v->region) continue;
    put_check(v, host, got, n, 1 + 2 * i, GUARD + 3 + 4 * i, 10u * (unsigned)i, "transfer");
  }
}

/* MANY puts with signals and a signal-only op in one group; one wait for all. */
static void case_many(win* v, unsigned char* host, unsigned char* got) {
  size_t n = 65536 + 7, stride = n + 2 * GUARD + 9;
  if (MANY * stride + GUARD > v->region) return;
  for (int j = 0; j < MANY; j++) {
    fill_host(host, n, 500u + 2u * (unsigned)j + (unsigned)rank);
    CU(cudaMemcpy(v->base + (size_t)j * stride + 1, host, n, cudaMemcpyHostToDevice));
  }
  CU(cudaMemset(v->base + v->region, FILL, MANY * stride + GUARD));
  CU(cudaDeviceSynchronize());
  barrier();
  NC(ncclGroupStart());
  for (int j = 0; j < MANY; j++)
    NC(ncclPutSignal(v->base + (size_t)j * stride + 1, n, ncclUint8, peer, v->w, v->region + (size_t)j * stride + GUARD,
                     0, 0, 0, comm, stream));
  NC(ncclSignal(peer, 0, 0, 0, comm, stream));
  NC(ncclGroupEnd());
  ncclWaitSignalDesc_t d = {.opCnt = MANY + 1, .peer = peer, .sigIdx = 0, .ctx = 0};
  NC(ncclWaitSignal(1, &d, comm, stream));
  CU(cudaMemcpyAsync(got, v->base + v->region, MANY * stride + GUARD, cudaMemcpyDeviceToHost, stream));
  sync_stream("many", 120);
  int ok = 1;
  char detail[160] = "";
  for (int j = 0; j < MANY && ok; j++)
    ok = check_range(got + (size_t)j * stride, n, 500u + 2u * (unsigned)j + (unsigned)peer, detail, sizeof detail);
  report("many", MANY * n, ok, detail);
  barrier();
}

static void case_barrier(void) {
  double t0 = now_s();
  for (int i = 0; i < BARRIER_ROUNDS; i++) {
    NC(ncclSignal(peer, 0, 0, 0, comm, stream));
    ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0};
    NC(ncclWaitSignal(1, &d, comm, stream));
  }
  sync_stream("barrier", 120);
  char detail[96];
  snprintf(detail, sizeof detail, "%d rounds, %.1f us each", BARRIER_ROUNDS, (now_s() - t0) * 1e6 / BARRIER_ROUNDS);
  report("barrier", 0, 1, detail);
  barrier();
}

static void case_rereg(unsigned char* host, unsigned char* got) {
  for (int i = 0; i < REREG_ROUNDS; i++) {
    win v;
    win_open(&v, (8u << 20) + 4096u * (unsigned)i);
    put_check(&v, host, got, (4u << 20) + 3, 5, GUARD + 11, 900u + 10u * (unsigned)i, "rereg");
    win_close(&v);
  }
}

/* --- timing --------------------------------------------------------------------------- */

static double put_round(win* v, size_t n) {
  NC(ncclPutSignal(v->base, n, ncclUint8, peer, v->w, v->region, 0, 0, 0, comm, stream));
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0};
  NC(ncclWaitSignal(1, &d, comm, stream));
  return 0;
}

static void sendrecv_round(void* sbuf, void* rbuf, size_t n) {
  NC(ncclGroupStart());
  NC(ncclSend(sbuf, n, ncclUint8, peer, comm, stream));
  NC(ncclRecv(rbuf, n, ncclUint8, peer, comm, stream));
  NC(ncclGroupEnd());
}

/* Seconds per op of fn over iters rounds after 3 warm-ups (both ranks). */
#define TIME_ROUNDS(result, n_iters, stmt)             \
  do {                                                  \
    for (int w_ = 0; w_ < 3; w_++) { stmt; }            \
    sync_stream("timing warm-up", 120);                 \
    barrier();                                          \
    double t0_ = now_s();                               \
    for (int i_ = 0; i_ < (n_iters); i_++) { stmt; }    \
    sync_stream("timing", 300);                         \
    (result) = (now_s() - t0_) / (n_iters);             \
    barrier();                                          \
  } while (0)

static void case_timing(win* v) {
  void *sbuf, *rbuf;
  size_t big = 64u << 20;
  if (big > v->region) big = v->region;
  CU(cudaMalloc(&sbuf, big));
  CU(cudaMalloc(&rbuf, big));
  for (size_t n = 1u << 20; n <= big; n *= 4) {
    int it = n >= (16u << 20) ? iters / 2 + 1 : iters;
    double tp, ts;
    TIME_ROUNDS(ts, it, sendrecv_round(sbuf, rbuf, n));
    TIME_ROUNDS(tp, it, put_round(v, n));
    if (rank == 0)
      printf("timing,bandwidth,%zu,put_signal_GBs=%.3f,sendrecv_GBs=%.3f,ratio=%.2f\n", n, n / tp / 1e9, n / ts / 1e9,
             ts / tp);
  }
  /* 8-byte ping-pong: rank 0 starts, rank 1 answers */
  int pp = iters * 25;
  double tp, ts;
  ncclWaitSignalDesc_t d = {.opCnt = 1, .peer = peer, .sigIdx = 0, .ctx = 0};
  TIME_ROUNDS(ts, pp, {
    if (rank == 0) {
      NC(ncclSend(sbuf, 8, ncclUint8, peer, comm, stream));
      NC(ncclRecv(rbuf, 8, ncclUint8, peer, comm, stream));
    } else {
      NC(ncclRecv(rbuf, 8, ncclUint8, peer, comm, stream));
      NC(ncclSend(sbuf, 8, ncclUint8, peer, comm, stream));
    }
  });
  TIME_ROUNDS(tp, pp, {
    if (rank == 0) {
      NC(ncclPutSignal(v->base, 8, ncclUint8, peer, v->w, v->region, 0, 0, 0, comm, stream));
      NC(ncclWaitSignal(1, &d, comm, stream));
    } else {
      NC(ncclWaitSignal(1, &d, comm, stream));
      NC(ncclPutSignal(v->base, 8, ncclUint8, peer, v->w, v->region, 0, 0, 0, comm, stream));
    }
  });
  if (rank == 0)
    printf("timing,latency,8,put_signal_us=%.2f,sendrecv_us=%.2f,ratio=%.2f\n", tp * 1e6 / 2, ts * 1e6 / 2, tp / ts);
  fflush(stdout);
  CU(cudaFree(sbuf));
  CU(cudaFree(rbuf));
}

static void run_rank(void) {
  alarm(540); /* never outlive a device call: a hang ends in SIGALRM, reported by the parent */
  CU(cudaSetDevice(rank));
  if (rank == 0) {
    NC(ncclGetUniqueId(&sh->id));
    __atomic_store_n(&sh->id_ready, 1, __ATOMIC_RELEASE);
  } else {
    while (!__atomic_load_n(&sh->id_ready, __ATOMIC_ACQUIRE)) usleep(1000);
  }
  NC(ncclCommInitRank(&comm, NRANKS, sh->id, rank));
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  win v;
  win_open(&v, max_bytes + 4 * GUARD + 4096);
  unsigned char *host, *got;
  CU(cudaMallocHost((void**)&host, v.region));
  CU(cudaMallocHost((void**)&got, v.region + 2 * GUARD));
  case_transfer(&v, host, got);
  case_many(&v, host, got);
  case_barrier();
  case_rereg(host, got);
  if (timing) case_timing(&v);
  win_close(&v);
  CU(cudaFreeHost(host));
  CU(cudaFreeHost(got));
  NC(ncclCommDestroy(comm));
  printf("rank %d: %s\n", rank, failures ? "FAILED" : "passed");
  fflush(stdout);
  _exit(failures ? 1 : 0);
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--max") && i + 1 < argc) max_bytes = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-timing")) timing = 0;
    else {
      fprintf(stderr, "usage: %s [--max BYTES] [--iters N] [--no-timing]\n", argv[0]);
      return 2;
    }
  }
  sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  memset(sh, 0, sizeof *sh);
  pid_t pids[NRANKS];
  for (int r = 0; r < NRANKS; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      rank = r;
      peer = 1 - r;
      run_rank();
    }
  }
  int bad = 0;
  for (int r = 0; r < NRANKS; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("rank %d: %s %d\n", r, WIFSIGNALED(st) ? "killed by signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      bad = 1;
      sh->failed = 1;
      for (int k = 0; k < NRANKS; k++) kill(pids[k], SIGKILL);
    }
  }
  printf("nccl_rma_check: %s\n", bad ? "FAILED" : "passed");
  return bad;
}
