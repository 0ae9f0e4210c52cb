/*
 * The test profiler plugin (tests/profiler, libnccl-profiler-fabric-test.so)
 * fed the way NCCL feeds a profiler: it is dlopened and looked up as
 * "ncclProfiler_v6", told the communicator at init (it asks for net plugin
 * events), and the callback given to the net plugin's init forwards each event
 * as NCCL 2.30.7 does (src/plugin/profiler.cc): a start becomes startEvent
 * with an ncclProfileNetPlugin descriptor carrying pluginId and extData, an
 * update-and-stop becomes recordEventState(ncclProfilerNetPluginUpdate) and
 * stopEvent. Transfers run through the table under test; the profiler's own
 * log must then account for every operation, with no event it found wrong.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_abi_profiler_v6.h"
#include "fab_prof.h"
#include "ft_criterion.h"

enum { T_MS = 30000, LEN = 65536, SMALL = 100, BIG = 4 << 20, NEXPECT = 4 };

/* NCCL's per-step parent handle (struct ncclProxyEventHandle): the step's own
 * event and what NCCL reads from the proxy sub-operation. */
typedef struct {
  void* step_event;
  int rank;
} proxy_handle;

static ncclProfiler_v6_t* g_prof;
static void* g_pctx;
static int g_mask;

static fab_result forward(void** eh, int type, void* phandle, int64_t id, void* ext) {
  if (type == ncclProfilerNetEventStart) {
    const proxy_handle* p = phandle;
    if (!(g_mask & ncclProfileNetPlugin)) return FAB_OK;
    ncclProfilerEventDescr_v6_t d;
    memset(&d, 0, sizeof d);
    d.type = ncclProfileNetPlugin;
    d.parentObj = p->step_event;
    d.rank = p->rank;
    d.u.netPlugin.id = id;
    d.u.netPlugin.data = ext;
    g_prof->startEvent(g_pctx, eh, &d);
  } else if (type == ncclProfilerNetEventStop) {
    g_prof->stopEvent(*eh);
  } else {
    ncclProfilerEventStateArgs_v6_t a;
    memset(&a, 0, sizeof a);
    a.netPlugin.data = ext;
    g_prof->recordEventState(*eh, ncclProfilerNetPluginUpdate, &a);
    if (type == ncclProfilerNetEventUpdateAndStop) g_prof->stopEvent(*eh);
  }
  return FAB_OK;
}

static void load_profiler(int rank, const char* log) {
  unlink(log);
  setenv("FABRIC_TEST_PROFILER_LOG", log, 1);
  void* lib = dlopen(FT_PROFILER_PATH, RTLD_NOW | RTLD_LOCAL);
  FT_CHECK(lib != NULL, "dlopen %s: %s", FT_PROFILER_PATH, dlerror());
  g_prof = dlsym(lib, "ncclProfiler_v6");
  FT_CHECK(g_prof != NULL, "no ncclProfiler_v6 in %s", FT_PROFILER_PATH);
  FT_CHECK(g_prof->init(&g_pctx, 0x5eed, &g_mask, "functional", 1, 2, rank, NULL) == ncclSuccess, "profiler init");
  FT_CHECK(g_mask & ncclProfileNetPlugin, "the profiler's activation mask 0x%x lacks ncclProfileNetPlugin", g_mask);
}

/* Receives tags 51..53 in one grouped receive (or one at a time where the
 * version takes one buffer), 8 bytes on tag 54, while sending the peer the
 * same: LEN, SMALL and BIG bytes and 8. Every byte is checked. */
static void transfers(ft_side* s, ft_conn* c, int rank, int* nsubs) {
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, BIG);
  ft_mr_alloc(s, &rm, c->recv_comm, NEXPECT * BIG);
  ft_fill(sm.buf, BIG, 91);
  static const int lens[NEXPECT] = {LEN, SMALL, BIG, 8};
  int tags[NEXPECT] = {51, 52, 53, 54};
  static proxy_handle ph[2 * NEXPECT];
  for (int i = 0; i < 2 * NEXPECT; i++) ph[i] = (proxy_handle){&ph[i], rank};
  int group = s->props.max_recvs >= 3 ? 3 : 1;
  *nsubs = group;
  void* reqs[2 * NEXPECT] = {NULL};
  int nreq = 0;
  for (int first = 0; first < NEXPECT; first += first < 3 ? group : 1) {
    int n = first < 3 ? group : 1;
    void* d[3];
    size_t sz[3];
    void* mhs[3];
    void* phs[3];
    for (int k = 0; k < n; k++) {
      d[k] = (char*)rm.buf + (size_t)(first + k) * BIG;
      sz[k] = BIG;
      mhs[k] = rm.mh;
      phs[k] = &ph[first + k];
    }
    void* r = NULL;
    while (!r) FT_OK(s->api->irecv(c->recv_comm, n, d, sz, &tags[first], mhs, phs, &r));
    reqs[nreq++] = r;
  }
  for (int i = 0; i < NEXPECT; i++) {
    void* r = NULL;
    while (!r) FT_OK(s->api->isend(c->send_comm, sm.buf, (size_t)lens[i], tags[i], sm.mh, &ph[NEXPECT + i], &r));
    reqs[nreq++] = r;
  }
  int sizes[2 * NEXPECT][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, nreq, &sizes[0][0], FAB_MAX_RECVS, T_MS, "profiled transfers");
  for (int i = 0; i < NEXPECT; i++)
    ft_verify_or_fail((char*)rm.buf + (size_t)i * BIG, (size_t)lens[i], 91, "a profiled receive");
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}

static char* read_log(const char* path) {
  FILE* f = fopen(path, "r");
  FT_CHECK(f != NULL, "the profiler wrote no log at %s", path);
  static char text[1 << 16];
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  fclose(f);
  return text;
}

static unsigned long long field(const char* line, const char* key) {
  char k[32];
  snprintf(k, sizeof k, " %s=", key);
  const char* p = strstr(line, k);
  FT_CHECK(p != NULL, "no %s in: %.200s", key, line);
  return strtoull(p + strlen(k), NULL, 0);
}

static void check_log(const char* text, int rank, int emitted, int nsubs) {
  static const int lens[NEXPECT] = {LEN, SMALL, BIG, 8};
  const char* bad = strstr(text, "bad ");
  FT_CHECK(bad == NULL, "the profiler found a wrong event: %.300s", bad);
  char key[48];
  snprintf(key, sizeof key, "summary rank=%d ", rank);
  const char* sum = strstr(text, key);
  FT_CHECK(sum != NULL, "no summary for rank %d in the profiler's log:\n%s", rank, text);
  unsigned long long sent = 0;
  for (int i = 0; i < NEXPECT; i++) sent += (unsigned long long)lens[i];
  unsigned long long want = emitted ? 2 * NEXPECT : 0;
  FT_CHECK(field(sum, "started") == want && field(sum, "stopped") == want && field(sum, "open") == 0,
           "summary: %.240s (expected %llu events started and stopped)", sum, want);
  FT_CHECK(field(sum, "foreign") == 0 && field(sum, "unknown") == 0 && field(sum, "bad") == 0, "summary: %.240s", sum);
  if (!emitted) return;
  FT_CHECK(field(sum, "sends") == NEXPECT && field(sum, "recvs") == NEXPECT && field(sum, "bytes_sent") == sent &&
               field(sum, "bytes_recv") == sent,
           "summary: %.240s (expected %d sends and receives of %llu bytes each way)", sum, NEXPECT, sent);
  for (int i = 0; i < NEXPECT; i++) {
    int sub = i < 3 ? i % nsubs : 0;
    int n = i < 3 ? nsubs : 1;
    char want_recv[128], want_send[128];
    snprintf(want_recv, sizeof want_recv, "op=recv tag=%d sub=%d/%d posted=%d moved=%d result=0", 51 + i, sub, n,
             BIG, lens[i]);
    snprintf(want_send, sizeof want_send, "op=send tag=%d sub=0/1 posted=%d moved=%d result=0", 51 + i, lens[i],
             lens[i]);
    FT_CHECK(strstr(text, want_recv) != NULL, "no event \"%s\" in the profiler's log:\n%s", want_recv, text);
    FT_CHECK(strstr(text, want_send) != NULL, "no event \"%s\" in the profiler's log:\n%s", want_send, text);
  }
}

FT_PAIR_TEST(profiler_plugin, 60) {
  int rank = peer->role == FT_PARENT ? 0 : 1;
  char log[64];
  snprintf(log, sizeof log, "/tmp/fabric-ft-profiler-%d.log", (int)getpid());
  load_profiler(rank, log);
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  fab_ctx* ctx2 = NULL; /* the second init hands the plugin the forwarding callback */
  FT_OK(s.api->init(&ctx2, 0x5eed, &s.config, ft_logger, forward));
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  int nsubs = 1;
  transfers(&s, &c, rank, &nsubs);
  ft_sync(peer, "profiled", T_MS);
  ft_close_all(&s, &c, 1);
  if (ctx2 && s.api->finalize) FT_OK(s.api->finalize(ctx2));
  int emitted = ft_net_since(&s.lib, 10);
  ft_side_close(&s);
  FT_CHECK(g_prof->finalize(g_pctx) == ncclSuccess, "profiler finalize");
  check_log(read_log(log), rank, emitted, nsubs);
  unlink(log);
}
