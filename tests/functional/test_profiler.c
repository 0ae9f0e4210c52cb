/*
 * Profiler events (net v10+, and the core): the callback given at init gets a
 * start event for every buffer posted with a parent handle and one last
 * update-and-stop when test reports it, each carrying fab_prof_event_v1
 * (core/fabric/fab_prof.h, docs/profiler.md) under pluginId FAB_PROF_PLUGIN_ID. The
 * callback here records what NCCL's would forward to a profiler plugin.
 * Before v10 the tables carry no callback: nothing is emitted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_prof.h"
#include "ft_criterion.h"

enum { T_MS = 30000, MAX_REC = 64 };

typedef struct {
  int type;
  void* phandle;
  int64_t id;
  void* eh_in;   /* *eHandle when called (stop/update: the handle a start returned) */
  fab_prof_event_v1 e;
  char peer[96];
} rec;

static rec g_rec[MAX_REC];
static int g_nrec;
static int g_decline_tag = -1; /* starts of this tag get no handle, as when a profiler does not want them */
static int g_decline_all;      /* no handle for any start: NCCL's callback with no profiler loaded */
static char g_handles[MAX_REC];

static fab_result record(void** eh, int type, void* phandle, int64_t id, void* ext) {
  if (g_nrec >= MAX_REC) return FAB_OK;
  rec* r = &g_rec[g_nrec];
  memset(r, 0, sizeof(*r));
  r->type = type, r->phandle = phandle, r->id = id, r->eh_in = eh ? *eh : NULL;
  if (ext) {
    r->e = *(const fab_prof_event_v1*)ext;
    snprintf(r->peer, sizeof r->peer, "%s", r->e.peer ? r->e.peer : "");
  }
  if (type == FAB_PROF_START && eh) *eh = g_decline_all || r->e.tag == g_decline_tag ? NULL : &g_handles[g_nrec];
  g_nrec++;
  return FAB_OK;
}

static int has_profiler(const ft_lib* l) { return ft_net_since(l, 10); }

/* rdma: a message up to the device's tagged size goes as one tagged message, a
 * larger one is written. That size (docs/params.md, FABRIC_TAGGED_MAX): the
 * variable where set; over tcp (ofi_rxm), outside a NIC profile, what rxm
 * sends at once, its eager limit (FI_OFI_RXM_EAGER_LIMIT: the user's, or the
 * plugin's, put there when it started) or its buffer size if larger, up to
 * 4 MiB; else 16 KiB. On libfabric 2.x's own tcp the engine's rule is
 * FABRIC_RXM_EAGER_LIMIT, which is also what the plugin put in
 * FI_OFI_RXM_EAGER_LIMIT, so the same reading holds there. */
static uint64_t env_u64(const char* name) {
  const char* v = getenv(name);
  return v && *v ? strtoull(v, NULL, 10) : 0;
}

static uint64_t rdma_tagged_max(void) {
  const char* tm = getenv("FABRIC_TAGGED_MAX");
  if (tm && *tm) return strtoull(tm, NULL, 0);
  const char* prov = getenv("FI_PROVIDER");
  const char* profile = getenv("FABRIC_NIC_PROFILE");
  if (!prov || strncmp(prov, "tcp", 3) != 0 || (profile && *profile)) return 16384;
  uint64_t buffer = env_u64("FI_OFI_RXM_BUFFER_SIZE") ? env_u64("FI_OFI_RXM_BUFFER_SIZE") : 16384;
  uint64_t at_once = env_u64("FI_OFI_RXM_EAGER_LIMIT") > buffer ? env_u64("FI_OFI_RXM_EAGER_LIMIT") : buffer;
  return at_once > (4u << 20) ? 4u << 20 : at_once;
}

/* The start and the stop of (op, tag, sub); checks they pair up. */
static void check_event(int op, int tag, int sub, uint64_t size, int transport, const char* what) {
  const rec* start = NULL;
  const rec* stop = NULL;
  for (int i = 0; i < g_nrec; i++) {
    const rec* r = &g_rec[i];
    if (r->e.op != op || r->e.tag != tag || r->e.sub != sub) continue;
    if (r->type == FAB_PROF_START) start = r;
    else if (r->type == FAB_PROF_UPDATE_AND_STOP) stop = r;
  }
  FT_CHECK(start && stop, "%s: start %p, stop %p among %d events", what, (void*)start, (void*)stop, g_nrec);
  FT_CHECK(start->id == FAB_PROF_PLUGIN_ID && stop->id == FAB_PROF_PLUGIN_ID, "%s: pluginId %llx / %llx", what,
           (unsigned long long)start->id, (unsigned long long)stop->id);
  FT_CHECK(start->phandle != NULL && stop->eh_in == &g_handles[start - g_rec],
           "%s: the stop names handle %p, the start was given %p", what, stop->eh_in, (void*)&g_handles[start - g_rec]);
  FT_CHECK(stop->e.size == size && stop->e.result == 0, "%s: stop says %llu bytes, result %d (expected %llu, 0)", what,
           (unsigned long long)stop->e.size, stop->e.result, (unsigned long long)size);
  FT_CHECK(start->e.transport == transport && stop->e.transport == transport, "%s: transport %d/%d, expected %d", what,
           start->e.transport, stop->e.transport, transport);
  FT_CHECK(start->peer[0] != '\0' && start->e.conn_id != 0, "%s: no peer name or connection id", what);
  uint64_t tagged_max = rdma_tagged_max();
  int paths_ok = transport == FAB_PROF_TRANSPORT_SENDRECV
                     ? start->e.path == FAB_PROF_PATH_MESSAGE && stop->e.path == FAB_PROF_PATH_MESSAGE
                 : size <= tagged_max ? stop->e.path == FAB_PROF_PATH_MESSAGE
                                      : stop->e.path == FAB_PROF_PATH_WRITE || stop->e.path == FAB_PROF_PATH_EAGER;
  FT_CHECK(paths_ok, "%s: paths %d -> %d on transport %d", what, start->e.path, stop->e.path, transport);
}

/* One 8-byte message each way, posted with parent handles. */
static void small_exchange(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* rm, int tag) {
  static char ph[2];
  void* d = rm->buf;
  size_t len = 8;
  void* mh = rm->mh;
  void* php = &ph[0];
  void* reqs[2] = {NULL, NULL};
  while (!reqs[0]) FT_OK(s->api->irecv(c->recv_comm, 1, &d, &len, &tag, &mh, &php, &reqs[0]));
  while (!reqs[1]) FT_OK(s->api->isend(c->send_comm, sm->buf, 8, tag, sm->mh, &ph[1], &reqs[1]));
  int sizes[2][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, 2, &sizes[0][0], FAB_MAX_RECVS, T_MS, "8-byte exchange");
}

/* NCCL passes its callback and parent handles with no profiler loaded: after
 * FAB_PROF_DECLINED_MAX declined posts a comm stops asking for FAB_PROF_SKIP
 * posts, then asks once, and stops again if declined. */
static void check_pause(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* rm) {
  small_exchange(s, c, sm, rm, 39); /* taken: both comms start counting declined posts from zero */
  g_nrec = 0;
  g_decline_all = 1;
  for (int i = 0; i < FAB_PROF_DECLINED_MAX + 8; i++) small_exchange(s, c, sm, rm, 40);
  FT_CHECK(g_nrec == 2 * FAB_PROF_DECLINED_MAX, "%d starts while every one was declined: expected %d (%d per comm, "
           "then a pause)", g_nrec, 2 * FAB_PROF_DECLINED_MAX, FAB_PROF_DECLINED_MAX);
  g_decline_all = 0;
  g_nrec = 0;
  for (int i = 0; i < FAB_PROF_SKIP - 8; i++) small_exchange(s, c, sm, rm, 41);
  FT_CHECK(g_nrec == 0, "%d events during the pause", g_nrec);
  small_exchange(s, c, sm, rm, 42); /* the pause is over: asked again, and taken */
  FT_CHECK(g_nrec == 4, "%d events after the pause, expected a start and a stop per comm", g_nrec);
  small_exchange(s, c, sm, rm, 43);
  FT_CHECK(g_nrec == 8, "%d events after the pause and one more exchange, expected 8", g_nrec);
}

FT_PAIR_TEST(profiler_events, 60) {
  enum { LEN = 1 << 20, SMALL = 100 }; /* LEN: written on every provider's default */
  ft_side s;
  int version = ft_api_selected();
  ft_side_open(&s, peer, version);
  /* A second init hands over the callback (v6..v10 init once per process;
   * the callback of a later init replaces none given before). */
  fab_ctx* ctx2 = NULL;
  FT_OK(s.api->init(&ctx2, 0x9f0f, &s.config, ft_logger, record));
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, LEN);
  ft_mr_alloc(&s, &rm, c.recv_comm, 3 * LEN);
  ft_fill(sm.buf, LEN, 77);
  char ph[4];
  int transport = getenv("FABRIC_TRANSPORT") && !strcmp(getenv("FABRIC_TRANSPORT"), "rdma")
                      ? FAB_PROF_TRANSPORT_RDMA
                      : 0;
  g_nrec = 0;
  g_decline_tag = 33;
  /* A grouped receive of three buffers (the peer sends all three) and a
   * message the callback declines; then the sends. */
  void* d[3] = {rm.buf, (char*)rm.buf + LEN, (char*)rm.buf + 2 * LEN};
  size_t sz[3] = {LEN, LEN, LEN};
  int tags[3] = {31, 32, 33};
  void* mhs[3] = {rm.mh, rm.mh, rm.mh};
  void* phs[3] = {&ph[0], &ph[1], &ph[2]};
  void* rreq = NULL;
  while (!rreq) FT_OK(s.api->irecv(c.recv_comm, s.props.max_recvs >= 3 ? 3 : 1, d, sz, tags, mhs, phs, &rreq));
  int nrecv = s.props.max_recvs >= 3 ? 3 : 1;
  void* sreq[3] = {NULL, NULL, NULL};
  const int lens[3] = {LEN, SMALL, 1};
  for (int i = 0; i < nrecv; i++)
    while (!sreq[i]) FT_OK(s.api->isend(c.send_comm, sm.buf, (size_t)lens[i], tags[i], sm.mh, &ph[3], &sreq[i]));
  void* all[4] = {rreq, sreq[0], sreq[1], sreq[2]};
  int sizes[4][FAB_MAX_RECVS];
  ft_wait_all(&s, all, 1 + nrecv, &sizes[0][0], FAB_MAX_RECVS, T_MS, "profiled transfers");
  if (!has_profiler(&s.lib)) {
    FT_CHECK(g_nrec == 0, "%s has no profiler callback, yet %d events were emitted", s.lib.desc,
             g_nrec);
  } else {
    if (!transport) transport = g_nrec ? g_rec[0].e.transport : FAB_PROF_TRANSPORT_SENDRECV;
    check_event(FAB_PROF_OP_RECV, 31, 0, LEN, transport, "the first buffer of a grouped receive");
    check_event(FAB_PROF_OP_SEND, 31, 0, LEN, transport, "a 1 MiB send");
    if (nrecv == 3) {
      check_event(FAB_PROF_OP_RECV, 32, 1, SMALL, transport, "the second buffer of a grouped receive");
      check_event(FAB_PROF_OP_SEND, 32, 0, SMALL, transport, "a 100-byte send");
      int declined = 0;
      for (int i = 0; i < g_nrec; i++) declined += g_rec[i].e.tag == 33;
      FT_CHECK(declined == 2, "tag 33's starts got no handle, so no stop may follow: %d events for it (expected 2 "
               "starts)", declined);
      FT_CHECK(g_nrec == 10, "%d events, expected 10 (tags 31 and 32: a receive and a send each, started and stopped; "
               "tag 33: two starts the callback declined)", g_nrec);
    }
  }
  if (has_profiler(&s.lib)) check_pause(&s, &c, &sm, &rm);
  ft_sync(peer, "profiled", T_MS);
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_close_all(&s, &c, 1);
  if (ctx2 && s.api->finalize) FT_OK(s.api->finalize(ctx2));
  ft_side_close(&s);
}
