/* Profiler events: the callback NCCL gave at init, an event per posted
 * buffer, stopped when test reports it. See fab_prof.h. */
#include "fab_prof.h"

#include <stdlib.h>
#include <string.h>

#include "fab_engine.h"
#include "fab_transport.h"

_Atomic(fab_profiler_fn) fab_prof_fn;

void fab_prof_set(fab_profiler_fn fn) {
  if (fn) atomic_store_explicit(&fab_prof_fn, fn, memory_order_relaxed);
}

static void prof_comm_free(void* data) {
  fab_prof_comm* p = data;
  free(p->slots);
  free(p);
}

/* c's profiler state, made by its first post; NULL when out of memory. */
static fab_prof_comm* prof_comm(fab_comm* c) {
  fab_prof_comm* p = fab_comm_ext_get(c, FAB_EXT_PROF);
  if (!p && (p = calloc(1, sizeof(*p))) != NULL) fab_comm_ext_set(c, FAB_EXT_PROF, p, prof_comm_free);
  return p;
}

/* r's event slots (FAB_MAX_RECVS per request), allocated with the comm's
 * first profiled operation by its owner thread; NULL when out of memory. */
static fab_prof_slot* slots_of(fab_prof_comm* p, fab_comm* c, fab_req* r) {
  if (!p) return NULL;
  if (!p->slots) {
    p->slots = calloc((size_t)c->reqs.count * FAB_MAX_RECVS, sizeof(fab_prof_slot));
    if (!p->slots) return NULL;
  }
  return &p->slots[(size_t)r->pool_index * FAB_MAX_RECVS];
}

static void describe(fab_comm* c, fab_req* r, int i, int sub, int nsubs, uint64_t size, int tag,
                     fab_prof_event_v1* e) {
  memset(e, 0, sizeof(*e));
  e->op = r->type == FAB_REQ_SEND ? FAB_PROF_OP_SEND : FAB_PROF_OP_RECV;
  e->transport = c->ops->id == FAB_TRANSPORT_RDMA ? FAB_PROF_TRANSPORT_RDMA : FAB_PROF_TRANSPORT_SENDRECV;
  e->path = c->ops->prof_path ? c->ops->prof_path(r, i) : FAB_PROF_PATH_MESSAGE;
  e->rail = c->rail;
  e->tag = tag;
  e->size = size;
  e->conn_id = c->conn_id;
  e->sub = (uint16_t)sub;
  e->nsubs = (uint16_t)nsubs;
  e->peer = c->peer_name;
}

void fab_prof_posted(fab_req* r, void* const* phandles, const size_t* sizes, const int* tags) {
  fab_prof_count(r->comm, fab_prof_posted_part(r, phandles, sizes, tags, NULL, r->n));
}

int fab_prof_posted_part(fab_req* r, void* const* phandles, const size_t* sizes, const int* tags, const int* subs,
                         int nsubs) {
  fab_profiler_fn fn = fab_prof_active();
  fab_comm* c = r->comm;
  fab_prof_comm* p = prof_comm(c);
  fab_prof_slot* s = NULL; /* allocated only once a profiler takes an event: NCCL always passes its callback */
  for (int i = 0; i < r->n; i++) {
    if (!phandles[i]) continue;
    fab_prof_event_v1 e;
    int sub = subs ? subs[i] : i;
    describe(r->comm, r, i, sub, nsubs, sizes[i], tags[i], &e);
    void* eh = NULL;
    fn(&eh, FAB_PROF_START, phandles[i], FAB_PROF_PLUGIN_ID, &e);
    if (!eh) continue; /* no profiler, or it does not want net events */
    if (!s && (s = slots_of(p, c, r)) != NULL)
      for (int k = 0; k < r->n; k++) s[k].eh = NULL;
    if (!s) { /* out of memory: close the event at once rather than leak it */
      fn(&eh, FAB_PROF_STOP, NULL, FAB_PROF_PLUGIN_ID, NULL);
      continue;
    }
    s[i].eh = eh;
    s[i].tag = tags[i];
    s[i].sub = (uint16_t)sub;
    s[i].nsubs = (uint16_t)nsubs;
    r->prof = 1;
  }
  return r->prof;
}

void fab_prof_count(fab_comm* c, int taken) {
  fab_prof_comm* p = prof_comm(c);
  if (!p) return;
  if (taken) {
    p->declined = 0;
  } else if (++p->declined >= FAB_PROF_DECLINED_MAX) {
    p->declined = FAB_PROF_DECLINED_MAX - 1; /* one more declined post after the pause resumes it */
    p->skip = FAB_PROF_SKIP;
  }
}

void fab_prof_done(fab_req* r) {
  fab_comm* c = r->comm;
  fab_profiler_fn fn = fab_prof_active();
  fab_prof_comm* p = fab_comm_ext_get(c, FAB_EXT_PROF); /* made before r->prof was set */
  fab_prof_slot* s = &p->slots[(size_t)r->pool_index * FAB_MAX_RECVS];
  int sizes[FAB_MAX_RECVS] = {0};
  if (r->result == FAB_OK) c->ops->sizes(r, sizes);
  for (int i = 0; i < r->n; i++) {
    if (!s[i].eh) continue;
    fab_prof_event_v1 e;
    describe(c, r, i, s[i].sub, s[i].nsubs, sizes[i] > 0 ? (uint64_t)sizes[i] : 0, s[i].tag, &e);
    e.result = (int32_t)r->result;
    fn(&s[i].eh, FAB_PROF_UPDATE_AND_STOP, NULL, FAB_PROF_PLUGIN_ID, &e);
    s[i].eh = NULL;
  }
  r->prof = 0;
}
