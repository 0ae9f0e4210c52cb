/*
 * CPU-only stand-in for the parts of libcudart and libnccl that nccl_check.c
 * uses, so that its logic (fork, id hand-off, expected values, checks, CSV,
 * error and timeout paths) can be exercised on a machine without a GPU.
 * Device memory is host memory; every operation completes inside the call.
 * Ranks exchange data through a POSIX shared-memory segment named in the
 * ncclUniqueId. NOT a model of NCCL's behaviour beyond the results.
 *
 * Fault injection (environment):
 *   MOCK_NGPUS=N                 cudaGetDeviceCount result (default 2)
 *   MOCK_CORRUPT=op:bytes:rank   rank writes one wrong element after op at that size
 *   MOCK_HANG=op:bytes:rank      the rank's stream never completes from that op on
 *   MOCK_CRASH=op:bytes:rank     the rank calls abort() in that op
 *   MOCK_SLOT_BYTES=N            per-rank shared slot (default 16 MiB)
 *   NCCL_DEBUG_FILE              if set, write NCCL-like INFO lines there (%h, %p expanded)
 */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>

#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct CUstream_st { int hung; };
struct CUevent_st { double t; };

#define MOCK_MAX_RANKS 8
struct mock_hdr {
  int nranks;
  volatile int count;
  volatile int gen;
  size_t slot_bytes;
};

struct ncclComm {
  int rank, nranks;
  struct mock_hdr* hdr;
  size_t map_bytes;
  char name[132];
  ncclResult_t async_err;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int g_dev = -1;
static cudaError_t g_last = cudaSuccess;
static int g_in_group;
static const char* g_op;      /* name of the op in progress, for fault injection */
static size_t g_op_bytes;
static struct CUstream_st* g_stream;

/* ---------------- fake NCCL debug log ---------------- */
static FILE* dbg(void) {
  static FILE* f;
  static int tried;
  if (tried) return f;
  tried = 1;
  const char* p = getenv("NCCL_DEBUG_FILE");
  if (!p) return NULL;
  char path[512];
  size_t k = 0;
  for (const char* s = p; *s && k < sizeof(path) - 32; s++) {
    if (s[0] == '%' && s[1] == 'p') { k += snprintf(path + k, sizeof(path) - k, "%d", (int)getpid()); s++; }
    else if (s[0] == '%' && s[1] == 'h') { k += snprintf(path + k, sizeof(path) - k, "mockhost"); s++; }
    else path[k++] = *s;
  }
  path[k] = 0;
  f = fopen(path, "a");
  return f;
}

static void info(const char* fmt, ...) {
  FILE* f = dbg();
  if (!f) return;
  fprintf(f, "mockhost:%d:%d [%d] NCCL INFO ", (int)getpid(), (int)getpid(), g_dev < 0 ? 0 : g_dev);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fflush(f);
}

/* ---------------- fault injection ---------------- */
static int fault(const char* var, int rank) {
  const char* v = getenv(var);
  if (!v || !g_op) return 0;
  char op[64];
  unsigned long long bytes;
  int r;
  if (sscanf(v, "%63[^:]:%llu:%d", op, &bytes, &r) != 3) return 0;
  return !strcmp(op, g_op) && bytes == g_op_bytes && r == rank;
}

/* ---------------- CUDA runtime ---------------- */
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error (mock)" : "mock CUDA error"; }
cudaError_t cudaGetLastError(void) { cudaError_t e = g_last; g_last = cudaSuccess; return e; }
cudaError_t cudaGetDeviceCount(int* n) {
  const char* v = getenv("MOCK_NGPUS");
  *n = v ? atoi(v) : 2;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { g_dev = d; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  (void)flags;
  *s = calloc(1, sizeof(struct CUstream_st));
  g_stream = *s;
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t s) { return s->hung ? cudaErrorNotReady : cudaSuccess; }
cudaError_t cudaMalloc(void** p, size_t n) { *p = malloc(n); return *p ? cudaSuccess : (g_last = cudaErrorMemoryAllocation); }
cudaError_t cudaMallocHost(void** p, size_t n) { return cudaMalloc(p, n); }
cudaError_t cudaFree(void* p) { free(p); return cudaSuccess; }
cudaError_t cudaFreeHost(void* p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void* d, const void* s, size_t n, enum cudaMemcpyKind k) { (void)k; memcpy(d, s, n); return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t s) { (void)s; memset(d, v, n); return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = calloc(1, sizeof(struct CUevent_st)); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { (void)s; e->t = now_s(); return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { *ms = (float)((b->t - a->t) * 1e3); return cudaSuccess; }

/* ---------------- NCCL ---------------- */
ncclResult_t ncclGetVersion(int* v) { *v = NCCL_VERSION_CODE; return ncclSuccess; }
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error (mock)" : "mock NCCL error"; }
const char* ncclGetLastError(ncclComm_t c) { (void)c; return "mock last error"; }

static size_t slot_bytes(void) {
  const char* v = getenv("MOCK_SLOT_BYTES");
  return v ? strtoull(v, NULL, 0) : (16u << 20);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static int counter;
  memset(id, 0, sizeof(*id));
  snprintf(id->internal, sizeof(id->internal), "/mocknccl.%d.%d", (int)getpid(), counter++);
  info("Bootstrap: mock unique id %s", id->internal);
  return ncclSuccess;
}

static char* slot(ncclComm_t c, int r) { return (char*)c->hdr + 4096 + (size_t)r * c->hdr->slot_bytes; }

static int barrier(ncclComm_t c) {
  if (c->async_err != ncclSuccess) return -1;
  int g = __atomic_load_n(&c->hdr->gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&c->hdr->count, 1, __ATOMIC_ACQ_REL) == c->nranks) {
    __atomic_store_n(&c->hdr->count, 0, __ATOMIC_RELEASE);
    __atomic_add_fetch(&c->hdr->gen, 1, __ATOMIC_ACQ_REL);
    return 0;
  }
  double t0 = now_s();
  while (__atomic_load_n(&c->hdr->gen, __ATOMIC_ACQUIRE) == g) {
    if (now_s() - t0 > 8) {
      c->async_err = ncclRemoteError;
      fprintf(stderr, "[mock rank %d] barrier timed out: peer gone\n", c->rank);
      return -1;
    }
    usleep(50);
  }
  return 0;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (nranks > MOCK_MAX_RANKS) return ncclInvalidArgument;
  struct ncclComm* c = calloc(1, sizeof(*c));
  c->rank = rank;
  c->nranks = nranks;
  snprintf(c->name, sizeof(c->name), "%s", id.internal);
  size_t sb = slot_bytes();
  c->map_bytes = 4096 + (size_t)nranks * sb;
  int fd = shm_open(c->name, O_RDWR | O_CREAT, 0600);
  if (fd < 0) { perror("mock shm_open"); return ncclSystemError; }
  if (ftruncate(fd, (off_t)c->map_bytes)) { perror("mock ftruncate"); close(fd); return ncclSystemError; }
  c->hdr = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (c->hdr == MAP_FAILED) { perror("mock mmap"); return ncclSystemError; }
  c->hdr->slot_bytes = sb; /* every rank writes the same value */
  c->hdr->nranks = nranks;
  /* Log lines shaped like NCCL 2.28's: the net is NCCL_NET (MOCK_NET overrides), the table
   * version is MOCK_TABLE, else the -vN in the plugin's file name, else 11. */
  const char* net = getenv("MOCK_NET") ? getenv("MOCK_NET") : getenv("NCCL_NET") ? getenv("NCCL_NET") : "Mock";
  const char* plugin = getenv("NCCL_NET_PLUGIN");
  if (plugin && *plugin && strcasecmp(plugin, "none")) {
    int ver = 11;
    const char* dashv = strstr(plugin, "-v");
    if (dashv) sscanf(dashv, "-v%d.so", &ver);
    if (getenv("MOCK_TABLE")) ver = atoi(getenv("MOCK_TABLE"));
    info("NCCL_NET_PLUGIN set by environment to %s", plugin);
    info("NET/Plugin: Loaded net plugin %s (v%d)", net, ver);
    info("Successfully loaded external network plugin %s", plugin);
    info("Initialized NET plugin %s", net);
    info("Assigned NET plugin %s to comm", net);
  }
  info("Using network %s", net);
  info("Channel 00/0 : %d[%d] -> %d[%d] [send] via NET/%s/0", rank, rank, (rank + 1) % nranks, (rank + 1) % nranks, net);
  info("Channel 00/0 : %d[%d] -> %d[%d] [receive] via NET/%s/0", (rank + 1) % nranks, (rank + 1) % nranks, rank, rank, net);
  if (getenv("MOCK_WARN")) {
    FILE* f = dbg();
    if (f) { fprintf(f, "mockhost:%d:%d [%d] mock.cc:1 NCCL WARN %s\n", (int)getpid(), (int)getpid(), rank, getenv("MOCK_WARN")); fflush(f); }
  }
  *out = c;
  if (barrier(c)) return ncclSystemError;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) { *e = c->async_err; return ncclSuccess; }

static ncclResult_t done(ncclComm_t c) {
  if (fault("MOCK_CRASH", c->rank)) { fprintf(stderr, "[mock rank %d] injected crash\n", c->rank); abort(); }
  if (fault("MOCK_HANG", c->rank)) { fprintf(stderr, "[mock rank %d] injected hang\n", c->rank); g_stream->hung = 1; }
  return ncclSuccess;
}

static void corrupt(ncclComm_t c, void* recv) {
  if (fault("MOCK_CORRUPT", c->rank)) { ((float*)recv)[0] += 1.0f; fprintf(stderr, "[mock rank %d] injected corruption\n", c->rank); }
}

#define SYNC_OR_FAIL(c) do { if (barrier(c)) return ncclSuccess; /* reported via async error */ } while (0)

ncclResult_t ncclAllReduce(const void* s, void* r, size_t count, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  (void)dt; (void)op; (void)st;
  g_op = "all_reduce"; g_op_bytes = count * 4;
  if (g_stream->hung) return ncclSuccess;
  if (count * 4 > c->hdr->slot_bytes) return ncclInvalidArgument;
  memcpy(slot(c, c->rank), s, count * 4);
  SYNC_OR_FAIL(c);
  float* out = r;
  for (size_t i = 0; i < count; i++) {
    float a = 0;
    for (int q = 0; q < c->nranks; q++) a += ((float*)slot(c, q))[i];
    out[i] = a;
  }
  SYNC_OR_FAIL(c);
  corrupt(c, r);
  return done(c);
}

ncclResult_t ncclAllGather(const void* s, void* r, size_t sc, ncclDataType_t dt, ncclComm_t c, cudaStream_t st) {
  (void)dt; (void)st;
  g_op = "all_gather"; g_op_bytes = sc * 4 * c->nranks;
  if (g_stream->hung) return ncclSuccess;
  if (sc * 4 > c->hdr->slot_bytes) return ncclInvalidArgument;
  memcpy(slot(c, c->rank), s, sc * 4);
  SYNC_OR_FAIL(c);
  for (int q = 0; q < c->nranks; q++) memcpy((char*)r + (size_t)q * sc * 4, slot(c, q), sc * 4);
  SYNC_OR_FAIL(c);
  corrupt(c, r);
  return done(c);
}

ncclResult_t ncclReduceScatter(const void* s, void* r, size_t rc, ncclDataType_t dt, ncclRedOp_t op, ncclComm_t c, cudaStream_t st) {
  (void)dt; (void)op; (void)st;
  g_op = "reduce_scatter"; g_op_bytes = rc * 4 * c->nranks;
  if (g_stream->hung) return ncclSuccess;
  if (rc * 4 * c->nranks > c->hdr->slot_bytes) return ncclInvalidArgument;
  memcpy(slot(c, c->rank), s, rc * 4 * c->nranks);
  SYNC_OR_FAIL(c);
  float* out = r;
  for (size_t i = 0; i < rc; i++) {
    float a = 0;
    for (int q = 0; q < c->nranks; q++) a += ((float*)slot(c, q))[(size_t)c->rank * rc + i];
    out[i] = a;
  }
  SYNC_OR_FAIL(c);
  corrupt(c, r);
  return done(c);
}

ncclResult_t ncclBroadcast(const void* s, void* r, size_t count, ncclDataType_t dt, int root, ncclComm_t c, cudaStream_t st) {
  (void)dt; (void)st;
  g_op = "broadcast"; g_op_bytes = count * 4;
  if (g_stream->hung) return ncclSuccess;
  if (count * 4 > c->hdr->slot_bytes) return ncclInvalidArgument;
  if (c->rank == root) memcpy(slot(c, root), s, count * 4);
  SYNC_OR_FAIL(c);
  memcpy(r, slot(c, root), count * 4);
  SYNC_OR_FAIL(c);
  corrupt(c, r);
  return done(c);
}

/* Group: only the all-to-all pattern (one send and one recv per peer). */
struct p2p { const void* s; void* r; size_t n; int peer; };
static struct p2p g_sends[MOCK_MAX_RANKS], g_recvs[MOCK_MAX_RANKS];
static int g_nsend, g_nrecv;
static ncclComm_t g_gcomm;

ncclResult_t ncclGroupStart(void) { g_in_group++; return ncclSuccess; }
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t st) {
  (void)dt; (void)st;
  if (!g_in_group || g_nsend >= MOCK_MAX_RANKS) return ncclInvalidUsage;
  g_sends[g_nsend++] = (struct p2p){s, NULL, n, peer};
  g_gcomm = c;
  return ncclSuccess;
}
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t st) {
  (void)dt; (void)st;
  if (!g_in_group || g_nrecv >= MOCK_MAX_RANKS) return ncclInvalidUsage;
  g_recvs[g_nrecv++] = (struct p2p){NULL, r, n, peer};
  g_gcomm = c;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd(void) {
  if (--g_in_group > 0) return ncclSuccess;
  ncclComm_t c = g_gcomm;
  int ns = g_nsend, nr = g_nrecv;
  g_nsend = g_nrecv = 0;
  if (!c) return ncclSuccess;
  size_t total = 0;
  for (int k = 0; k < ns; k++) total += g_sends[k].n;
  g_op = "all_to_all"; g_op_bytes = total * 4;
  if (g_stream->hung) return ncclSuccess;
  size_t sub = c->hdr->slot_bytes / c->nranks;
  for (int k = 0; k < ns; k++) {
    if (g_sends[k].n * 4 > sub) return ncclInvalidArgument;
    memcpy(slot(c, c->rank) + (size_t)g_sends[k].peer * sub, g_sends[k].s, g_sends[k].n * 4);
  }
  SYNC_OR_FAIL(c);
  for (int k = 0; k < nr; k++) memcpy(g_recvs[k].r, slot(c, g_recvs[k].peer) + (size_t)c->rank * sub, g_recvs[k].n * 4);
  SYNC_OR_FAIL(c);
  if (nr) corrupt(c, g_recvs[0].r);
  return done(c);
}

static void release(ncclComm_t c, int unlink_it) {
  munmap(c->hdr, c->map_bytes);
  if (unlink_it) shm_unlink(c->name);
  free(c);
}
ncclResult_t ncclCommFinalize(ncclComm_t c) { return barrier(c) ? ncclRemoteError : ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t c) { release(c, c->rank == 0); return ncclSuccess; }
ncclResult_t ncclCommAbort(ncclComm_t c) { release(c, 1); return ncclSuccess; }
