/*
 * The public listen, connect, accept and close calls: a virtual device of
 * several members gets one single-rail comm per member (see fab_rails.h);
 * every other device goes straight to the single-rail handshake (fab_conn_*).
 */
#define _GNU_SOURCE /* sched_getaffinity */
#include "fab_rails.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_req.h"

/* Rails of device d: its members when it is a virtual device of several,
 * else 1. */
static int rails_of(const fab_device* d) { return !d->physical && d->nmembers > 1 ? d->nmembers : 1; }

/* Live listen comms and comms over several rails, so that finalize finds
 * those of its context. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static fab_list live_listens = {&live_listens, &live_listens}; /* fab_rails_listen.node */
static fab_list live_comms = {&live_comms, &live_comms};       /* fab_rails_comm.node */

static void live_add(fab_list* list, fab_list* node) {
  pthread_mutex_lock(&live_lock);
  fab_list_push(list, node);
  pthread_mutex_unlock(&live_lock);
}

static void live_del(fab_list* node) {
  pthread_mutex_lock(&live_lock);
  fab_list_del(node);
  pthread_mutex_unlock(&live_lock);
}

static void close_members(void** handles, int n, fab_obj_kind kind) {
  for (int k = 0; k < n; k++) {
    if (!handles[k]) continue;
    if (kind == FAB_OBJ_SEND) fab_conn_close_send(handles[k]);
    else if (kind == FAB_OBJ_RECV) fab_conn_close_recv(handles[k]);
    else fab_conn_close_listen(handles[k]);
    handles[k] = NULL;
  }
}

/* Whether n rails may each have a polling thread: they spin, so they need a
 * CPU each beside the caller's. Where this thread may run on fewer (mpirun
 * binds each of two ranks to one core by default), they would take the
 * runtime's own threads' time (inside NCCL: 330 us per operation against
 * 46): one WARN, and the rails run without threads. */
static int rail_threads_fit(int n) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1; /* unknown: as asked */
  int cpus = CPU_COUNT(&set);
  if (cpus > n) return 1;
  if (fab_g.params.rail_threads < 0) { /* not asked for: rails FABRIC_NIC_RAILS=0 chose, fused beyond the CPUs */
    FAB_INFO(FAB_SUBSYS_NET, "%d rails and %d CPUs: the rails run without polling threads", n, cpus);
    return 0;
  }
  static atomic_flag warned = ATOMIC_FLAG_INIT;
  if (!atomic_flag_test_and_set(&warned))
    FAB_WARN("FABRIC_RAIL_THREADS=1: this process may run on %d CPU%s (its affinity), too few for %d rail threads "
             "beside the runtime's own; its rails run without threads. Give each rank at least %d CPUs (mpirun "
             "--bind-to none or --map-by slot:PE=%d, srun --cpus-per-task=%d) to use them",
             cpus, cpus == 1 ? "" : "s", n, n + 1, n + 1, n + 1);
  return 0;
}

/* Lets go of the polling threads rc holds (only those: a rail whose thread
 * could not start holds none, and releasing it would stop another comm's). */
static void release_threads(fab_rails_comm* rc) {
  for (int k = 0; k < rc->n; k++) {
    if (!(rc->threads & (1u << k))) continue;
    rc->c[k]->helped = 0;
    fab_comm_recv_let_go(rc->c[k]); /* before the thread may stop: its hold is a count on the endpoint */
    fab_ep_helper_release(rc->c[k]->ep);
  }
  rc->threads = 0;
}

/* The comm over rails handles[0..n-1] (member comms of kind SEND or RECV).
 * Each member learns its rail, and its peer name says it. */
static fab_result comm_make(fab_device* d, fab_obj_kind member_kind, void** handles, int n, void** out) {
  fab_rails_comm* rc = calloc(1, sizeof(*rc));
  if (!rc) {
    FAB_WARN("%s: out of memory", member_kind == FAB_OBJ_SEND ? "connect" : "accept");
    return FAB_ERR_SYSTEM;
  }
  rc->magic = FAB_RAILS_MAGIC;
  rc->kind = member_kind == FAB_OBJ_SEND ? FAB_OBJ_RAILS_SEND : FAB_OBJ_RAILS_RECV;
  rc->dev = d;
  rc->n = n;
  for (int k = 0; k < n; k++) {
    rc->rail[k] = handles[k];
    rc->c[k] = fab_obj_get(handles[k], member_kind);
    rc->c[k]->rail = (uint8_t)k;
    size_t used = strlen(rc->c[k]->peer_name);
    snprintf(rc->c[k]->peer_name + used, sizeof(rc->c[k]->peer_name) - used, " (rail %d of %d, %s)", k, n,
             rc->c[k]->ep->dev->name);
  }
  rc->stripe_from = rc->c[0]->stripe_from; /* the sender's, from rail 0's handshake */
  int asked = fab_g.params.rail_threads; /* -1: where FABRIC_NIC_RAILS=0 chose the rails */
  int want = asked == 2 || ((asked == 1 || (asked < 0 && fab_g.nic_rails_auto)) && rail_threads_fit(n));
  for (int k = 0; k < n && want; k++) {
    fab_comm* c = rc->c[k];
    if (fab_ep_helper_acquire(c->ep) != 0) {
      FAB_INFO(FAB_SUBSYS_NET, "rail %d on %s: no polling thread could be started; the caller's thread drives it", k,
               c->ep->dev->name);
      continue;
    }
    rc->threads |= 1u << k;
    c->helped = !c->home; /* a comm with a home endpoint to drive as well keeps polling (sr.c) */
  }
  rc->owner = rc->c[0]->owner;
  rc->handle = fab_obj_add(rc->kind, rc);
  if (!rc->handle) {
    release_threads(rc);
    FAB_WARN("%s: handle table full; close unused comms", member_kind == FAB_OBJ_SEND ? "connect" : "accept");
    free(rc);
    return FAB_ERR_SYSTEM;
  }
  live_add(&live_comms, &rc->node);
  FAB_INFO(FAB_SUBSYS_NET, "%s %s on %s over %d rails, %d of them with a polling thread",
           member_kind == FAB_OBJ_SEND ? "connected to" : "accepted", rc->c[0]->peer_name, d->name, n,
           __builtin_popcount(rc->threads));
  *out = rc->handle;
  return FAB_OK;
}

/* --- listen and accept ------------------------------------------------------- */

static fab_result rails_listen(fab_ctx* ctx, fab_device* d, void* handle, void** listen_comm) {
  fab_rails_listen* l = calloc(1, sizeof(*l));
  if (!l) {
    FAB_WARN("listen: out of memory");
    return FAB_ERR_SYSTEM;
  }
  l->magic = FAB_RAILS_MAGIC;
  l->owner = ctx;
  l->dev = d;
  l->n = d->nmembers;
  uint8_t handles[FAB_MAX_RAILS][FAB_HANDLE_SIZE];
  memset(handles, 0, sizeof(handles));
  fab_result rc = FAB_OK;
  for (int k = l->n - 1; k >= 0 && rc == FAB_OK; k--) /* rail 0 last: its answers carry the others' handles */
    rc = fab_conn_listen(ctx, d->members[k], k ? handles[k] : handle, l->n, k, handles[1], &l->listen[k]);
  if (rc == FAB_OK && !(l->handle = fab_obj_add(FAB_OBJ_RAILS_LISTEN, l))) {
    FAB_WARN("listen: handle table full; close unused comms");
    rc = FAB_ERR_SYSTEM;
  }
  if (rc != FAB_OK) {
    close_members(l->listen, l->n, FAB_OBJ_LISTEN);
    free(l);
    return rc;
  }
  live_add(&live_listens, &l->node);
  *listen_comm = l->handle;
  return FAB_OK;
}

/* How many of this device's n rails the connection whose rail 0 is
 * `handle` runs over: the smaller of both ends' counts, agreed at rail 0's
 * handshake (fab_listen.c). One INFO line when the peer has fewer. */
static int agreed_rails(void* handle, fab_obj_kind kind, int n, const fab_device* d) {
  fab_comm* c = fab_obj_get(handle, kind);
  int m = c && c->rails >= 1 && c->rails <= n ? c->rails : n;
  if (m < n)
    FAB_INFO(FAB_SUBSYS_NET, "%s %s: the peer's device has fewer rails, so this connection runs over %d of %s's %d",
             kind == FAB_OBJ_SEND ? "connect to" : "accept from", c ? c->peer_name : "?", m, d->name, n);
  return m;
}

/* Rail by rail; rail 0's listen comm closes once rail 0 is accepted, so that
 * nobody else can get the other rails' handles. */
static fab_result rails_accept(fab_rails_listen* l, void** recv_comm) {
  if (l->done) { /* its one connection was accepted: nothing more comes, as on a listen comm nobody else connects to */
    for (int k = 0; k < l->n; k++) {
      fab_endpoint* ep = atomic_load_explicit(&fab_g.eps[l->dev->members[k]], memory_order_acquire);
      if (ep) fab_ep_poll(ep);
    }
    return FAB_OK;
  }
  if (l->naccepted == 0) l->use = l->n;
  while (l->naccepted < l->use) {
    int k = l->naccepted;
    void* r = NULL;
    fab_result rc = fab_conn_accept(l->listen[k], &r);
    if (rc != FAB_OK) {
      close_members(l->accepted, l->naccepted, FAB_OBJ_RECV);
      l->naccepted = 0;
      return rc;
    }
    if (!r) return FAB_OK;
    l->accepted[l->naccepted++] = r;
    if (k == 0) {
      close_members(&l->listen[0], 1, FAB_OBJ_LISTEN);
      l->use = agreed_rails(r, FAB_OBJ_RECV, l->n, l->dev);
    }
  }
  fab_result rc = FAB_OK;
  if (l->use == 1) *recv_comm = l->accepted[0]; /* the peer has one rail: a comm of one */
  else rc = comm_make(l->dev, FAB_OBJ_RECV, l->accepted, l->use, recv_comm);
  if (rc != FAB_OK) close_members(l->accepted, l->use, FAB_OBJ_RECV);
  l->naccepted = 0;
  l->done = 1;
  return rc;
}

/* --- connect ------------------------------------------------------------------- */

/* A connect over several rails in progress, found again by the handle buffer
 * NCCL passes on every retry. */
typedef struct rails_pending {
  struct rails_pending* next;
  fab_ctx* ctx;
  const void* handle_ptr;
  uint8_t handle_copy[FAB_HANDLE_SIZE];
  int64_t deadline_ms;
  int n, nconnected;
  void* sends[FAB_MAX_RAILS];
  uint8_t handles[FAB_MAX_RAILS - 1][FAB_HANDLE_SIZE]; /* rails 1..: from rail 0's answer */
} rails_pending;

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static rails_pending* pending_list;

/* Unlinks p (pending_lock held). */
static void pending_unlink(rails_pending* p) {
  for (rails_pending** it = &pending_list; *it; it = &(*it)->next) {
    if (*it == p) {
      *it = p->next;
      return;
    }
  }
}

/* Drops p with whatever rails it connected. */
static void pending_drop(rails_pending* p) {
  for (int k = 0; k < p->nconnected; k++)
    if (fab_obj_kind_of(p->sends[k]) == FAB_OBJ_SEND) fab_conn_close_send(p->sends[k]);
  free(p);
}

/* The pending connect of (ctx, handle), or a new one; connects NCCL gave up
 * on (not retried for twice the connect timeout) are dropped on the way. */
static rails_pending* pending_get(fab_ctx* ctx, const void* handle, int n) {
  int64_t now = fab_now_ms();
  rails_pending* found = NULL;
  rails_pending* expired = NULL;
  pthread_mutex_lock(&pending_lock);
  for (rails_pending *p = pending_list, *next; p; p = next) {
    next = p->next;
    if (p->ctx == ctx && p->handle_ptr == handle && !memcmp(p->handle_copy, handle, fab_wire_handle_used(handle))) {
      found = p;
    } else if (now > p->deadline_ms) {
      pending_unlink(p);
      p->next = expired;
      expired = p;
    }
  }
  if (!found && (found = calloc(1, sizeof(*found))) != NULL) {
    found->ctx = ctx;
    found->handle_ptr = handle;
    memcpy(found->handle_copy, handle, fab_wire_handle_used(handle));
    found->n = n;
    found->deadline_ms = now + 2 * (int64_t)fab_g.params.connect_timeout_ms;
    found->next = pending_list;
    pending_list = found;
  }
  pthread_mutex_unlock(&pending_lock);
  while (expired) {
    rails_pending* p = expired;
    expired = p->next;
    pending_drop(p);
  }
  return found;
}

static void pending_done(rails_pending* p, int ok) {
  pthread_mutex_lock(&pending_lock);
  pending_unlink(p);
  pthread_mutex_unlock(&pending_lock);
  if (ok) free(p);
  else pending_drop(p);
}

/* Rail 0's answer brought the handles of the other rails. */
static fab_result take_rail_handles(rails_pending* p) {
  fab_comm* c0 = fab_obj_get(p->sends[0], FAB_OBJ_SEND);
  if (!c0 || !c0->rail_handles) {
    FAB_WARN("connect over %d rails: the listener's answer on rail 0 carried no handles for the other rails", p->n);
    return FAB_ERR_REMOTE;
  }
  memcpy(p->handles, c0->rail_handles, (size_t)(p->n - 1) * FAB_HANDLE_SIZE);
  return FAB_OK;
}

static fab_result rails_connect(fab_ctx* ctx, fab_device* d, const fab_comm_config* config, void* handle,
                                void** send_comm) {
  int n = d->nmembers;
  rails_pending* p = pending_get(ctx, handle, n);
  if (!p) {
    FAB_WARN("connect: out of memory");
    return FAB_ERR_SYSTEM;
  }
  fab_result rc = FAB_OK;
  while (rc == FAB_OK && p->nconnected < p->n) {
    int k = p->nconnected;
    void* s = NULL;
    rc = fab_conn_connect(ctx, d->members[k], config, k ? p->handles[k - 1] : handle, p->n, k, &s);
    if (rc != FAB_OK || !s) break;
    p->sends[p->nconnected++] = s;
    if (k == 0) p->n = agreed_rails(s, FAB_OBJ_SEND, n, d);
    if (k == 0 && p->n > 1) rc = take_rail_handles(p);
  }
  if (rc == FAB_OK && p->nconnected == p->n) {
    if (p->n == 1) *send_comm = p->sends[0]; /* the peer has one rail: a comm of one */
    else rc = comm_make(d, FAB_OBJ_SEND, p->sends, p->n, send_comm);
  }
  if (rc != FAB_OK || *send_comm) pending_done(p, rc == FAB_OK);
  return rc;
}

/* --- the public calls ------------------------------------------------------------- */

/* The runtime's device index dev is ours through the view (fab_device_index). */
fab_result fab_listen(fab_ctx* ctx, int dev, void* handle, void** listen_comm) {
  if (listen_comm) *listen_comm = NULL;
  fab_device* d = fab_device_get(dev, "listen");
  if (!d) return FAB_ERR_INTERNAL;
  if (rails_of(d) == 1 || !listen_comm || !handle)
    return fab_conn_listen(ctx, d->index, handle, 1, 0, NULL, listen_comm);
  if (!fab_ctx_resolve(ctx, "listen")) return FAB_ERR_INVALID_USAGE;
  return rails_listen(ctx, d, handle, listen_comm);
}

fab_result fab_connect(fab_ctx* ctx, int dev, const fab_comm_config* config, void* handle, void** send_comm,
                       void** dev_handle) {
  (void)dev_handle;
  if (send_comm) *send_comm = NULL;
  fab_device* d = fab_device_get(dev, "connect");
  if (!d) return FAB_ERR_INTERNAL;
  if (rails_of(d) == 1 || !send_comm || !handle)
    return fab_conn_connect(ctx, d->index, config, handle, 1, 0, send_comm);
  if (!fab_ctx_resolve(ctx, "connect")) return FAB_ERR_INVALID_USAGE;
  return rails_connect(ctx, d, config, handle, send_comm);
}

fab_result fab_accept(void* listen_comm, void** recv_comm, void** dev_handle) {
  (void)dev_handle;
  fab_rails_listen* l = fab_obj_get(listen_comm, FAB_OBJ_RAILS_LISTEN);
  if (!l || !recv_comm) return fab_conn_accept(listen_comm, recv_comm);
  *recv_comm = NULL;
  return rails_accept(l, recv_comm);
}

fab_result fab_close_listen(void* listen_comm) {
  fab_rails_listen* l = fab_obj_remove(listen_comm, FAB_OBJ_RAILS_LISTEN);
  if (!l) return fab_conn_close_listen(listen_comm);
  live_del(&l->node);
  close_members(l->listen, l->n, FAB_OBJ_LISTEN);
  close_members(l->accepted, l->naccepted, FAB_OBJ_RECV);
  l->magic = 0;
  free(l);
  return FAB_OK;
}

static fab_result close_rails(void* handle, fab_obj_kind kind) {
  fab_rails_comm* rc = fab_obj_remove(handle, kind);
  if (!rc) return FAB_ERR_INTERNAL;
  live_del(&rc->node);
  fab_result result;
  fab_rails_data_let_go(rc); /* while its rails' comms, which name the endpoints, still live */
  release_threads(rc);
  /* together: one wait for what is in flight on any rail, one WARN */
  result = fab_conn_close_group(rc->rail, rc->n, kind == FAB_OBJ_RAILS_SEND ? FAB_OBJ_SEND : FAB_OBJ_RECV);
  fab_rails_data_free(rc); /* after its rails closed: their receives may use its stripe buffers */
  rc->magic = 0;
  free(rc);
  return result;
}

fab_result fab_close_send(void* send_comm) {
  if (fab_obj_kind_of(send_comm) != FAB_OBJ_RAILS_SEND) return fab_conn_close_send(send_comm);
  return close_rails(send_comm, FAB_OBJ_RAILS_SEND);
}

fab_result fab_close_recv(void* recv_comm) {
  if (fab_obj_kind_of(recv_comm) != FAB_OBJ_RAILS_RECV) return fab_conn_close_recv(recv_comm);
  return close_rails(recv_comm, FAB_OBJ_RAILS_RECV);
}

/* --- finalize ------------------------------------------------------------------------ */

typedef struct owned_rails {
  void* handle;
  fab_obj_kind kind;
} owned_rails;

static int owned_push(owned_rails** out, int* n, int* cap, void* handle, fab_obj_kind kind) {
  if (*n == *cap) {
    int grown = *cap ? 2 * *cap : 16;
    owned_rails* more = realloc(*out, (size_t)grown * sizeof(**out));
    if (!more) return -1;
    *out = more;
    *cap = grown;
  }
  (*out)[(*n)++] = (owned_rails){handle, kind};
  return 0;
}

/* The handles of ctx's live listen comms and comms over rails (live_lock
 * held); -1: out of memory. */
static int collect_owned(fab_ctx* ctx, owned_rails** out, int* n) {
  int cap = 0;
  FAB_LIST_FOREACH_SAFE(it, tmp, &live_listens) {
    fab_rails_listen* l = FAB_CONTAINER_OF(it, fab_rails_listen, node);
    if (l->owner == ctx && owned_push(out, n, &cap, l->handle, FAB_OBJ_RAILS_LISTEN) != 0) return -1;
  }
  FAB_LIST_FOREACH_SAFE(it, tmp, &live_comms) {
    fab_rails_comm* rc = FAB_CONTAINER_OF(it, fab_rails_comm, node);
    if (rc->owner == ctx && owned_push(out, n, &cap, rc->handle, rc->kind) != 0) return -1;
  }
  return 0;
}

int fab_rails_close_owned(fab_ctx* ctx) {
  owned_rails* list = NULL;
  int n = 0;
  pthread_mutex_lock(&live_lock);
  int rc = collect_owned(ctx, &list, &n);
  pthread_mutex_unlock(&live_lock);
  if (rc != 0) FAB_WARN("finalize: out of memory listing open comms over rails; their rails close alone");
  for (int i = 0; i < n; i++) {
    if (list[i].kind == FAB_OBJ_RAILS_LISTEN) fab_close_listen(list[i].handle);
    else close_rails(list[i].handle, list[i].kind);
  }
  free(list);
  /* connects in progress: their rails already connected close with the context's comms */
  pthread_mutex_lock(&pending_lock);
  for (rails_pending *p = pending_list, *next; p; p = next) {
    next = p->next;
    if (p->ctx != ctx) continue;
    pending_unlink(p);
    free(p);
  }
  pthread_mutex_unlock(&pending_lock);
  return n;
}
