/*
 * fabric-gpu-mem: GPU memory through the plugin's NCCL net table, on one GPU.
 *
 * Two processes (forked; both use the same GPU) drive the plugin the way NCCL
 * does with GPUDirect: buffers from cuMemAlloc, registered with regMr
 * (NCCL_PTR_CUDA) or regMrDmaBuf (a dma-buf fd of cuMemGetHandleForAddressRange),
 * isend/irecv/test, iflush after every receive. Every byte of every message is
 * copied back to the host and checked, and so is the poison just past it.
 *
 *   fabric-gpu-mem [--mem host|cuda|dmabuf] [--max BYTES] [--plugin PATH | PATH]
 *
 * Steps, each both ways at once:
 *   sizes    0 B .. --max (default 256M), every size checked, into a receive
 *            larger than the message (the reported size must be the sent one)
 *   group    one grouped irecv of 4 buffers inside one registration
 *   subrange a registration inside a registered buffer (the plugin's cache hit)
 *   realloc  deregister, free, allocate again (the driver usually returns the
 *            same address), register, move new data: a registration cache, the
 *            plugin's or libfabric's, that kept the freed memory's mapping
 *            delivers stale or misplaced bytes here
 *   overtake a send of up to 64 MiB on a second connection waits for its
 *            receive while 1 MiB goes both ways on the first: a provider that
 *            orders them (libfabric 1.17's shm with GPU memory did) hangs here,
 *            as NCCL's channels would (FABRIC_LOCAL_SEND_ENDPOINTS=0 puts both
 *            connections on one endpoint: the provider's own behaviour)
 *
 * --mem host runs the same steps on host memory: the CPU-side self-test of the
 * program (CTest gpu.mem.*). The provider comes from FI_PROVIDER (default tcp
 * on lo), the table from FABRIC_TEST_API (default the newest). GPU memory needs
 * a libfabric with CUDA support and a provider granting FI_HMEM; on shm the
 * plugin also needs FABRIC_GPU_MEMORY=1. Exit status: 0 all checked, 3 the
 * device does not offer the memory kind (the reason is printed), 1 a failure.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ft_api.h"

enum { MEM_HOST, MEM_CUDA, MEM_DMABUF };
enum { GUARD = 4096, TIMEOUT_MS = 120000, EXIT_NOT_OFFERED = 3 };
static const char* const mem_name[] = {"host", "cuda", "dmabuf"};

typedef struct {
  int mem;
  size_t max;
} gm_opts;

/* --- the memory under test ---------------------------------------------- */

typedef int CUresult_t;
typedef unsigned long long CUdeviceptr_t;
static struct {
  void* lib;
  CUresult_t (*init)(unsigned);
  CUresult_t (*device_get)(int*, int);
  CUresult_t (*primary_retain)(void**, int);
  CUresult_t (*ctx_set)(void*);
  CUresult_t (*alloc)(CUdeviceptr_t*, size_t);
  CUresult_t (*free)(CUdeviceptr_t);
  CUresult_t (*htod)(CUdeviceptr_t, const void*, size_t);
  CUresult_t (*dtoh)(void*, CUdeviceptr_t, size_t);
  CUresult_t (*memset8)(CUdeviceptr_t, unsigned char, size_t);
  CUresult_t (*set_attr)(const void*, int, CUdeviceptr_t);
  CUresult_t (*dmabuf_fd)(void*, CUdeviceptr_t, size_t, int, unsigned long long);
} cu;

#define CU_CALL(call)                                                            \
  do {                                                                           \
    CUresult_t cu_rc_ = (call);                                                  \
    if (cu_rc_ != 0) FT_FAIL("%s failed: CUresult %d", #call, (int)cu_rc_);      \
  } while (0)

static void* cu_sym(const char* name) {
  void* p = dlsym(cu.lib, name);
  if (!p) FT_FAIL("the CUDA driver lacks %s", name);
  return p;
}

static void cuda_open(void) {
  cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!cu.lib) FT_FAIL("cannot load the CUDA driver: %s", dlerror());
  *(void**)&cu.init = cu_sym("cuInit");
  *(void**)&cu.device_get = cu_sym("cuDeviceGet");
  *(void**)&cu.primary_retain = cu_sym("cuDevicePrimaryCtxRetain");
  *(void**)&cu.ctx_set = cu_sym("cuCtxSetCurrent");
  *(void**)&cu.alloc = cu_sym("cuMemAlloc_v2");
  *(void**)&cu.free = cu_sym("cuMemFree_v2");
  *(void**)&cu.htod = cu_sym("cuMemcpyHtoD_v2");
  *(void**)&cu.dtoh = cu_sym("cuMemcpyDtoH_v2");
  *(void**)&cu.memset8 = cu_sym("cuMemsetD8_v2");
  *(void**)&cu.set_attr = cu_sym("cuPointerSetAttribute");
  *(void**)&cu.dmabuf_fd = cu_sym("cuMemGetHandleForAddressRange");
  int dev;
  void* ctx;
  CU_CALL(cu.init(0));
  CU_CALL(cu.device_get(&dev, 0));
  CU_CALL(cu.primary_retain(&ctx, dev));
  CU_CALL(cu.ctx_set(ctx));
}

/* GPU allocations are rounded to 2 MiB: a dma-buf range must be page aligned. */
static size_t alloc_len(size_t len) { return (len + GUARD + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1); }

static void* mem_alloc(int mem, size_t len) {
  if (mem == MEM_HOST) return ft_alloc(alloc_len(len));
  CUdeviceptr_t p;
  CU_CALL(cu.alloc(&p, alloc_len(len)));
  int one = 1; /* what NCCL sets on GPUDirect buffers: memory operations on them synchronize */
  CU_CALL(cu.set_attr(&one, 6 /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS */, p));
  return (void*)(uintptr_t)p;
}

static void mem_free(int mem, void* p, size_t len) {
  if (mem == MEM_HOST) ft_free(p, alloc_len(len));
  else CU_CALL(cu.free((CUdeviceptr_t)(uintptr_t)p));
}

static void mem_put(int mem, void* dst, const void* src, size_t n) {
  if (!n) return;
  if (mem == MEM_HOST) memcpy(dst, src, n);
  else CU_CALL(cu.htod((CUdeviceptr_t)(uintptr_t)dst, src, n));
}

static void mem_get(int mem, void* dst, const void* src, size_t n) {
  if (!n) return;
  if (mem == MEM_HOST) memcpy(dst, src, n);
  else CU_CALL(cu.dtoh(dst, (CUdeviceptr_t)(uintptr_t)src, n));
}

static void mem_poison(int mem, void* dst, size_t n) {
  if (mem == MEM_HOST) memset(dst, FT_POISON, n);
  else CU_CALL(cu.memset8((CUdeviceptr_t)(uintptr_t)dst, FT_POISON, n));
}

/* Registers [p, p+len) of an allocation starting at base, as NCCL would for
 * the memory kind. */
static void* mem_reg(ft_side* s, int mem, void* comm, void* base, void* p, size_t len) {
  void* mh = NULL;
  if (mem == MEM_HOST) {
    FT_OK(s->api->reg_mr(comm, p, len, FAB_PTR_HOST, &mh));
  } else if (mem == MEM_CUDA) {
    FT_OK(s->api->reg_mr(comm, p, len, FAB_PTR_CUDA, &mh));
  } else {
    FT_CHECK(s->api->reg_mr_dmabuf != NULL, "this table has no regMrDmaBuf");
    size_t off = (size_t)((char*)p - (char*)base);
    size_t span = (off + len + 4095) & ~(size_t)4095;
    int fd = -1;
    CU_CALL(cu.dmabuf_fd(&fd, (CUdeviceptr_t)(uintptr_t)base, span, 1 /* DMA_BUF_FD */, 0));
    fab_result rc = s->api->reg_mr_dmabuf(comm, p, len, FAB_PTR_CUDA, off, fd, &mh);
    close(fd); /* NCCL closes it right after the call, too */
    FT_OK(rc);
  }
  FT_CHECK(mh != NULL, "registration returned success with a NULL handle");
  return mh;
}

/* --- one side's buffers --------------------------------------------------- */

typedef struct {
  ft_side* s;
  ft_conn* c;
  int mem;
  size_t cap;          /* usable bytes of each buffer */
  char *sbuf, *rbuf;   /* GPU (or host) */
  void *smh, *rmh;
  char *host, *expect; /* host staging: what to send / what came back; expected */
  int tag;
  int wait_ms; /* how long an exchange may take */
} gm_side;

static void buffers_up(gm_side* g) {
  g->sbuf = mem_alloc(g->mem, g->cap);
  g->rbuf = mem_alloc(g->mem, g->cap);
  g->smh = mem_reg(g->s, g->mem, g->c->send_comm, g->sbuf, g->sbuf, g->cap + GUARD);
  g->rmh = mem_reg(g->s, g->mem, g->c->recv_comm, g->rbuf, g->rbuf, g->cap + GUARD);
}

static void buffers_down(gm_side* g) {
  FT_OK(g->s->api->dereg_mr(g->c->send_comm, g->smh));
  FT_OK(g->s->api->dereg_mr(g->c->recv_comm, g->rmh));
  mem_free(g->mem, g->sbuf, g->cap);
  mem_free(g->mem, g->rbuf, g->cap);
}

/* iflush of a completed receive, as NCCL calls it for GPU memory the NIC
 * wrote (a no-op request or none for host memory). */
static void flush(gm_side* g, int n, void** data, const int* sizes, void** mhs) {
  if (!g->s->api->iflush) return;
  void* req = NULL;
  FT_OK(g->s->api->iflush(g->c->recv_comm, n, data, sizes, mhs, &req));
  if (req) ft_wait(g->s, req, NULL, TIMEOUT_MS, "iflush");
}

/* Checks n received bytes at dev against the peer's pattern, and the poison
 * over the guard past them. */
static void verify(gm_side* g, const char* dev, size_t n, uint64_t peer_seed, const char* what) {
  mem_get(g->mem, g->expect, dev, n + GUARD);
  ft_verify_or_fail(g->expect, n, peer_seed, what);
  ft_check_poison(g->expect + n, GUARD, what);
}

/* Each side sends `size` bytes from send offset soff with its send handle and
 * receives the peer's into receive offset roff (a receive of rlen bytes). */
static void exchange(gm_side* g, size_t size, size_t rlen, size_t soff, size_t roff, void* smh, void* rmh,
                     uint64_t seed, const char* step) {
  uint64_t mine = ft_seed(seed, (uint64_t)ft_role(), size), theirs = ft_seed(seed, (uint64_t)(1 - ft_role()), size);
  ft_fill(g->host, size, mine);
  mem_put(g->mem, g->sbuf + soff, g->host, size);
  mem_poison(g->mem, g->rbuf + roff, rlen + GUARD);
  ft_sync(g->s->peer, "posted buffers ready", TIMEOUT_MS);
  int tag = ++g->tag;
  void* rdata = g->rbuf + roff;
  ft_phase("%s: %zu bytes", step, size);
  void* rreq = ft_irecv(g->s, g->c->recv_comm, 1, &rdata, &rlen, &tag, &rmh, TIMEOUT_MS);
  void* sreq = ft_isend(g->s, g->c->send_comm, g->sbuf + soff, size, tag, smh, TIMEOUT_MS);
  int sizes[2][FAB_MAX_RECVS];
  memset(sizes, 0xff, sizeof sizes);
  void* reqs[2] = {rreq, sreq};
  ft_wait_all(g->s, reqs, 2, &sizes[0][0], FAB_MAX_RECVS, g->wait_ms, step);
  FT_CHECK((size_t)sizes[0][0] == size, "%s: a receive of %zu bytes reported %d", step, size, sizes[0][0]);
  flush(g, 1, &rdata, sizes[0], &rmh);
  char what[96];
  snprintf(what, sizeof what, "%s: %zu bytes (%s memory)", step, size, mem_name[g->mem]);
  verify(g, g->rbuf + roff, size, theirs, what);
}

static void step_sizes(gm_side* g, size_t max, int* count) {
  static const size_t fixed[] = {0, 1, 8, 4095, 4096, 65537, (1 << 20) + 3};
  for (size_t i = 0; i < sizeof fixed / sizeof *fixed && fixed[i] <= max; i++, (*count)++)
    exchange(g, fixed[i], fixed[i] + 64 <= g->cap ? fixed[i] + 64 : fixed[i], 0, 0, g->smh, g->rmh, 1, "sizes");
  for (size_t n = (size_t)4 << 20; n <= max; n *= 4, (*count)++) exchange(g, n, n, 0, 0, g->smh, g->rmh, 2, "sizes");
  if (max > ((size_t)4 << 20) && (max & (max - 1))) { /* a --max that is no power of 4 */
    exchange(g, max, max, 0, 0, g->smh, g->rmh, 3, "sizes");
    (*count)++;
  }
}

/* Four messages into four buffers of one grouped receive, all inside one
 * registration (NCCL's grouped receives of a proxy step). */
static void step_group(gm_side* g, int* count) {
  enum { N = 4 };
  if (g->s->props.max_recvs < N) return;
  size_t each = (g->cap / N - GUARD < ((size_t)1 << 20) ? g->cap / N - GUARD : ((size_t)1 << 20)) - 7;
  void* data[N];
  size_t lens[N];
  int tags[N];
  void* mhs[N];
  uint64_t seed = ft_seed(4, 0, 0);
  for (int k = 0; k < N; k++) {
    ft_fill(g->host, each, ft_seed(seed, (uint64_t)ft_role(), (uint64_t)k));
    mem_put(g->mem, g->sbuf + (size_t)k * (each + GUARD), g->host, each);
    mem_poison(g->mem, g->rbuf + (size_t)k * (each + GUARD), each + GUARD);
    data[k] = g->rbuf + (size_t)k * (each + GUARD);
    lens[k] = each;
    tags[k] = 1000 + k;
    mhs[k] = g->rmh;
  }
  ft_sync(g->s->peer, "group ready", TIMEOUT_MS);
  ft_phase("group: %d x %zu bytes", N, each);
  void* reqs[1 + N];
  reqs[0] = ft_irecv(g->s, g->c->recv_comm, N, data, lens, tags, mhs, TIMEOUT_MS);
  for (int k = N - 1; k >= 0; k--) /* in reverse: matching is by tag */
    reqs[1 + k] = ft_isend(g->s, g->c->send_comm, g->sbuf + (size_t)k * (each + GUARD), each, tags[k], g->smh,
                           TIMEOUT_MS);
  int sizes[1 + N][FAB_MAX_RECVS];
  memset(sizes, 0xff, sizeof sizes);
  ft_wait_all(g->s, reqs, 1 + N, &sizes[0][0], FAB_MAX_RECVS, TIMEOUT_MS, "group");
  flush(g, N, data, sizes[0], mhs);
  for (int k = 0; k < N; k++) {
    FT_CHECK((size_t)sizes[0][k] == each, "group: buffer %d reported %d bytes of %zu", k, sizes[0][k], each);
    char what[64];
    snprintf(what, sizeof what, "group: buffer %d of %d", k, N);
    verify(g, data[k], each, ft_seed(seed, (uint64_t)(1 - ft_role()), (uint64_t)k), what);
  }
  (*count)++;
}

/* A registration inside a registered buffer, used and dropped. */
static void step_subrange(gm_side* g, int* count) {
  size_t off = g->cap / 4 + 512, len = g->cap / 4;
  void* smh = mem_reg(g->s, g->mem, g->c->send_comm, g->sbuf, g->sbuf + off, len);
  void* rmh = mem_reg(g->s, g->mem, g->c->recv_comm, g->rbuf, g->rbuf + off, len);
  exchange(g, len - 100, len - 100, off, off, smh, rmh, 5, "subrange");
  FT_OK(g->s->api->dereg_mr(g->c->send_comm, smh));
  FT_OK(g->s->api->dereg_mr(g->c->recv_comm, rmh));
  (*count)++;
}

/* Free and allocate again, three rounds; new data each round. */
static void step_realloc(gm_side* g, int* count) {
  int same = 0;
  for (int round = 0; round < 3; round++) {
    char *s0 = g->sbuf, *r0 = g->rbuf;
    exchange(g, g->cap, g->cap, 0, 0, g->smh, g->rmh, 100 + (uint64_t)round, "realloc (before)");
    buffers_down(g);
    buffers_up(g);
    same += g->sbuf == s0 && g->rbuf == r0;
    exchange(g, g->cap, g->cap, 0, 0, g->smh, g->rmh, 200 + (uint64_t)round, "realloc (after)");
    (*count) += 2;
  }
  if (ft_role() == FT_PARENT)
    printf("realloc: %d of 3 rounds got the same addresses back%s\n", same,
           same ? "" : " (the stale-mapping case was not reached: the allocator moved the buffers)");
}

/* One comm's large send whose receive is not posted yet must not hold up
 * another comm's traffic (NCCL's channels would deadlock): the parent sends
 * `big` bytes on a second connection; before the child posts that receive,
 * both exchange 1 MiB on the first. */
static void step_overtake(gm_side* g, ft_conn* c2, size_t big, int* count) {
  size_t half = g->cap / 2;
  if (big > half) big = half;
  void *smh = NULL, *rmh = NULL, *req = NULL;
  int tag = 77;
  uint64_t seed = ft_seed(6, 0, big);
  if (ft_role() == FT_PARENT) {
    smh = mem_reg(g->s, g->mem, c2->send_comm, g->sbuf, g->sbuf + half, big);
    ft_fill(g->host, big, seed);
    mem_put(g->mem, g->sbuf + half, g->host, big);
    ft_phase("overtake: %zu bytes on the second comm, receive not posted", big);
    req = ft_isend(g->s, c2->send_comm, g->sbuf + half, big, tag, smh, TIMEOUT_MS);
  } else {
    rmh = mem_reg(g->s, g->mem, c2->recv_comm, g->rbuf, g->rbuf + half, big);
    mem_poison(g->mem, g->rbuf + half, big + GUARD);
  }
  int64_t t0 = ft_now_ms();
  g->wait_ms = 20000; /* held up this long is a stall */
  exchange(g, (size_t)1 << 20, (size_t)1 << 20, 0, 0, g->smh, g->rmh, 7, "overtake (the other comm)");
  g->wait_ms = TIMEOUT_MS;
  int64_t waited = ft_now_ms() - t0;
  ft_sync(g->s->peer, "overtaken", TIMEOUT_MS);
  if (ft_role() == FT_CHILD) {
    void* data = g->rbuf + half;
    req = ft_irecv(g->s, c2->recv_comm, 1, &data, &big, &tag, &rmh, TIMEOUT_MS);
  }
  int sizes[FAB_MAX_RECVS];
  ft_wait(g->s, req, sizes, TIMEOUT_MS, "overtake (the held message)");
  if (ft_role() == FT_CHILD) {
    flush(g, 1, (void*[]){g->rbuf + half}, sizes, &rmh);
    verify(g, g->rbuf + half, big, seed, "overtake: the held message");
    FT_OK(g->s->api->dereg_mr(c2->recv_comm, rmh));
  } else {
    FT_OK(g->s->api->dereg_mr(c2->send_comm, smh));
    printf("overtake: a 1 MiB exchange on one comm took %lld ms while a %zu-byte send of another waited for its "
           "receive\n", (long long)waited, big);
  }
  (*count) += 2;
}

static void body(ft_peer* peer, void* arg) {
  const gm_opts* o = arg;
  if (o->mem != MEM_HOST) cuda_open();
  ft_side s;
  ft_side_open(&s, peer, FT_API_NEWEST);
  int need = o->mem == MEM_HOST ? FAB_PTR_HOST : o->mem == MEM_CUDA ? FAB_PTR_CUDA : FAB_PTR_DMABUF;
  if (!(s.props.ptr_support & need)) {
    if (ft_role() == FT_PARENT)
      printf("fabric-gpu-mem: device 0 (%s) does not offer %s memory: ptrSupport 0x%x. The plugin's INFO line "
             "\"GPU memory\" says why (FABRIC_TEST_VERBOSE=1); on shm set FABRIC_GPU_MEMORY=1\n",
             s.props.name, mem_name[o->mem], s.props.ptr_support);
    fflush(stdout);
    ft_side_close(&s);
    _exit(EXIT_NOT_OFFERED);
  }
  ft_conn conns[2];
  ft_connect_all(&s, conns, 2, TIMEOUT_MS);
  ft_conn c = conns[0];
  gm_side g = {.s = &s, .c = &c, .mem = o->mem, .cap = o->max < ((size_t)4 << 20) ? (size_t)4 << 20 : o->max,
              .wait_ms = TIMEOUT_MS};
  g.host = ft_alloc(g.cap + GUARD);
  g.expect = ft_alloc(g.cap + GUARD);
  buffers_up(&g);
  int count = 0;
  step_sizes(&g, o->max, &count);
  step_group(&g, &count);
  step_subrange(&g, &count);
  step_realloc(&g, &count);
  step_overtake(&g, &conns[1], (size_t)64 << 20, &count);
  buffers_down(&g);
  ft_sync(peer, "done", TIMEOUT_MS);
  ft_close_all(&s, conns, 2);
  if (ft_role() == FT_PARENT) {
    printf("fabric-gpu-mem: PASS: %d exchanges of %s memory, both ways, every byte checked (%s, ptrSupport 0x%x, "
           "up to %zu bytes)\n", count, mem_name[o->mem], s.lib.desc, s.props.ptr_support, o->max);
    fflush(stdout);
  }
  ft_free(g.host, g.cap + GUARD);
  ft_free(g.expect, g.cap + GUARD);
  ft_side_close(&s);
}

static size_t parse_size(const char* v) {
  char* end;
  double x = strtod(v, &end);
  if (end == v || x < 0) return 0;
  if (*end == 'K' || *end == 'k') x *= 1024;
  else if (*end == 'M' || *end == 'm') x *= 1024 * 1024;
  else if (*end == 'G' || *end == 'g') x *= 1024.0 * 1024 * 1024;
  return (size_t)x;
}

static void gm_fail(const char* msg) {
  fprintf(stderr, "fabric-gpu-mem: FAILED: %s\n", msg);
  exit(1);
}

int main(int argc, char** argv) {
  gm_opts o = {.mem = MEM_CUDA, .max = (size_t)256 << 20};
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (a[0] != '-') {
      setenv("FABRIC_TEST_PLUGIN", a, 1);
      continue;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      printf("usage: %s [--mem host|cuda|dmabuf] [--max BYTES] [--plugin PATH | PATH]\n", argv[0]);
      return 0;
    }
    if (!v) {
      fprintf(stderr, "fabric-gpu-mem: %s needs a value\n", a);
      return 2;
    }
    i++;
    if (!strcmp(a, "--mem")) {
      o.mem = !strcmp(v, "host") ? MEM_HOST : !strcmp(v, "cuda") ? MEM_CUDA : !strcmp(v, "dmabuf") ? MEM_DMABUF : -1;
      if (o.mem < 0) {
        fprintf(stderr, "fabric-gpu-mem: --mem takes host, cuda or dmabuf\n");
        return 2;
      }
    } else if (!strcmp(a, "--max")) {
      o.max = parse_size(v);
    } else if (!strcmp(a, "--plugin")) {
      setenv("FABRIC_TEST_PLUGIN", v, 1);
    } else {
      fprintf(stderr, "fabric-gpu-mem: unknown option %s\n", a);
      return 2;
    }
  }
  if (o.max < 1 || o.max > ((size_t)1 << 30)) {
    fprintf(stderr, "fabric-gpu-mem: --max must be 1 .. 1G\n");
    return 2;
  }
  if (!getenv("FI_PROVIDER") || !*getenv("FI_PROVIDER")) setenv("FI_PROVIDER", "tcp", 1);
  if (!getenv("FI_TCP_IFACE")) setenv("FI_TCP_IFACE", "lo", 1);
  ft_set_fail_hook(gm_fail);
  ft_run_pair("gpu-mem", body, &o, 600);
  return 0;
}
