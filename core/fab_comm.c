/*
 * Send and recv comm lifetime. A closed comm with operations in flight is
 * parked on its endpoint (posted receives are cancelled first) and freed by
 * the first progress of the endpoint that finds all its operations complete
 * (fab_comm_sweep_closed), or by endpoint teardown after the libfabric
 * endpoint is closed: memory a pending operation points at is never freed
 * early.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_transport.h"

static void comm_destroy(fab_parked* p) { fab_comm_free(FAB_CONTAINER_OF(p, fab_comm, park)); }
static void probe_done(fab_op* op, const struct fi_cq_msg_entry* done, const struct fi_cq_err_entry* err);

fab_comm* fab_comm_alloc(fab_endpoint* ep, fab_device* dev, fab_obj_kind kind, fab_ctx* owner,
                         const fab_comm_config* config) {
  const fab_transport_ops* ops = ep->dev->ops;
  fab_comm* c = calloc(1, sizeof(*c));
  if (!c) {
    FAB_WARN("out of memory creating a comm on %s", dev->name);
    return NULL;
  }
  uint32_t nreq = kind == FAB_OBJ_SEND ? ops->send_reqs : ops->recv_reqs;
  uint32_t nsub = kind == FAB_OBJ_SEND ? ops->send_subs : ops->recv_subs;
  if (fab_pool_init(&c->reqs, nreq, sizeof(fab_req) + nsub * sizeof(fab_sub)) != 0) {
    FAB_WARN("out of memory creating a comm on %s (%u requests)", dev->name, nreq);
    free(c);
    return NULL;
  }
  c->magic = FAB_COMM_MAGIC;
  c->kind = kind;
  c->ep = ep;
  c->dev = dev;
  c->ops = ops;
  c->peer = FI_ADDR_NOTAVAIL;
  c->max_bytes = dev->props.max_p2p_bytes;
  c->mr_local = ep->dev->mr_local;
  c->owner = owner;
  c->config = config ? *config : owner->config;
  c->park.destroy = comm_destroy;
  fab_list_init(&c->park.node);
  atomic_init(&c->inflight, 0);
  fab_op_init(&c->probe_op, probe_done, c, 0);
  /* Requests are initialised on first use (fab_comm_req_first_use), so an
   * idle comm's pool stays non-resident. */
  return c;
}

void fab_comm_req_first_use(fab_comm* c, fab_req* r) {
  uint32_t nsub = c->kind == FAB_OBJ_SEND ? c->ops->send_subs : c->ops->recv_subs;
  uint32_t idx = (uint32_t)(((char*)r - c->reqs.base) / c->reqs.stride);
  r->pool_index = idx;
  r->magic = FAB_REQ_MAGIC;
  r->state = FAB_REQ_FREE;
  r->comm = c;
  c->ops->init_req(c, r, nsub);
  /* Published last (release): a close-time scan reads [0, used). The pool's
   * owner is the only writer. */
  if (idx >= atomic_load_explicit(&c->reqs.used, memory_order_relaxed))
    atomic_store_explicit(&c->reqs.used, idx + 1, memory_order_release);
}

int fab_comm_busy(fab_comm* c) {
  if (atomic_load(&c->inflight) > 0) return 1;
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  for (uint32_t i = 0; i < used; i++) {
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->magic != FAB_REQ_MAGIC || r->state == FAB_REQ_FREE) continue;
    /* acquire: a completion's last write to r is its pending count */
    if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) return 1;
  }
  return 0;
}

static void nclosing_add(fab_endpoint* ep, int d);

int fab_parked_is_comm(const fab_parked* p) { return p->destroy == comm_destroy; }

void fab_comm_park_closed(fab_endpoint* ep, fab_comm* c) {
  fab_ep_park(ep, &c->park);
  nclosing_add(ep, 1);
  atomic_store_explicit(&ep->sweep_every, FAB_SWEEP_EVERY_MIN, memory_order_relaxed);
}

static void release_closed(fab_comm* c) {
  fab_list_del(&c->park.node);
  nclosing_add(c->ep, -1);
  fab_comm_free(c);
}

void fab_comm_op_done(fab_comm* c) {
  fab_comm_count_completion(c);
  if (atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_acq_rel) == 1 && c->closing && !fab_comm_busy(c))
    release_closed(c);
}

static void nclosing_add(fab_endpoint* ep, int d) {
  atomic_store_explicit(&ep->nclosing, atomic_load_explicit(&ep->nclosing, memory_order_relaxed) + d,
                        memory_order_relaxed);
}

/* An own endpoint is destroyed only once its closed comm's sends have
 * completed, so a transfer the receiver is still taking in never loses its
 * sending side. home lock held (the lock order is home, then own). */
static int progress_retiring(fab_endpoint* home) {
  int gone = 0;
  FAB_LIST_FOREACH_SAFE(it, tmp, &home->privates) {
    fab_endpoint* own = FAB_CONTAINER_OF(it, fab_endpoint, private_node);
    if (!own->retiring) continue;
    pthread_mutex_lock(&own->lock);
    fab_ep_progress_locked(own); /* frees the comm when its sends are done */
    int idle = atomic_load_explicit(&own->nclosing, memory_order_relaxed) == 0;
    pthread_mutex_unlock(&own->lock);
    if (!idle) continue;
    fab_list_del(&own->private_node);
    nclosing_add(home, -1);
    fab_endpoint_destroy(own);
    gone++;
  }
  return gone;
}

int fab_comm_sweep_closed(fab_endpoint* ep) {
  int gone = 0;
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->parked) {
    fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
    if (!fab_parked_is_comm(p)) continue;
    fab_comm* c = FAB_CONTAINER_OF(p, fab_comm, park);
    if (!fab_comm_busy(c)) {
      release_closed(c);
      gone++;
    }
  }
  if (!fab_list_empty(&ep->privates)) gone += progress_retiring(ep);
  return gone;
}

void fab_comm_free(fab_comm* c) {
  uint32_t used = atomic_load(&c->reqs.used);
  for (uint32_t i = 0; i < used; i++) { /* never-used ones: do not fault their pages in */
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->magic != FAB_REQ_MAGIC) continue;
    free(r->errmsg);
    r->magic = 0;
  }
  fab_pool_fini(&c->reqs);
  fab_ep_ctrl_dereg(c->answer_mr);
  fab_ep_av_release(c->ep, c->peer);
  c->magic = 0;
  free(c);
}

void fab_comm_fail(fab_comm* c, fab_result rc, const char* why) {
  if (c->error != FAB_OK) return;
  snprintf(c->error_why, sizeof(c->error_why), "%s", why);
  c->error = rc;
}

static void probe_done(fab_op* op, const struct fi_cq_msg_entry* done, const struct fi_cq_err_entry* err) {
  fab_comm* c = op->owner;
  c->probe_posted = 0;
  if (err && err->err != FI_ECANCELED && !c->closing) {
    char why[160];
    snprintf(why, sizeof(why), "a liveness probe to the peer failed (%s)", fi_strerror(err->err));
    fab_comm_fail(c, fab_result_from_fi(err->err), why);
  }
  fab_comm_op_done(c);
}

/* Liveness: any completion of the comm's operations counts as a sign of life.
 * When none came since the last check, a zero-byte message to the peer's
 * control receive is posted (at most one per FAB_PROBE_INTERVAL_MS): its send
 * completion proves the connection still delivers, whether or not the peer's
 * application is progressing. tcp;ofi_rxm never completes operations to a
 * peer whose process died (it retries the refused connection forever), so
 * this is how such a death becomes an error instead of a hang. */
void fab_comm_check_peer(fab_comm* c) {
  int timeout = fab_g.params.peer_timeout_ms;
  if (timeout <= 0 || c->error != FAB_OK || c->peer_in_process) return;
  fab_endpoint* ep = c->ep;
  pthread_mutex_lock(&ep->lock);
  int64_t now = fab_now_ms();
  uint64_t ncompl = atomic_load_explicit(&c->ncompl, memory_order_relaxed);
  if (ncompl != c->ncompl_seen) {
    c->ncompl_seen = ncompl;
    c->stall_since_ms = 0;
  } else if (c->stall_since_ms == 0) {
    c->stall_since_ms = now;
  } else if (now - c->stall_since_ms > timeout) {
    char why[160];
    snprintf(why, sizeof(why), "no sign of life from the peer for %lld ms (FABRIC_PEER_TIMEOUT_MS=%d)%s",
             (long long)(now - c->stall_since_ms), timeout,
             ep->hol_blocked ? "; this endpoint's sends are held up by a dead peer's" : "");
    fab_comm_fail(c, FAB_ERR_REMOTE, why);
  }
  if (c->error == FAB_OK && c->stall_since_ms && !c->probe_posted &&
      now - c->last_probe_ms >= FAB_PROBE_INTERVAL_MS) {
    c->last_probe_ms = now;
    if (fab_peer_check_local_locked(c)) {
      /* a peer on this host: asked of the kernel, never probed (fab_peer.c) */
    } else {
      atomic_fetch_add(&c->inflight, 1);
      if (fi_send(ep->ep, NULL, 0, NULL, c->peer, &c->probe_op.ctx) == 0)
        c->probe_posted = 1;
      else
        atomic_fetch_sub(&c->inflight, 1);
    }
  }
  pthread_mutex_unlock(&ep->lock);
}

static int conn_id_in_use(fab_endpoint* ep, uint32_t id) {
  fab_list* lists[2] = {&ep->comms, &ep->parked};
  for (int k = 0; k < 2; k++) {
    FAB_LIST_FOREACH_SAFE(it, tmp, lists[k]) {
      fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
      if (p->destroy != comm_destroy) continue;
      fab_comm* c = FAB_CONTAINER_OF(p, fab_comm, park);
      if (c->kind == FAB_OBJ_RECV && c->conn_id == id) return 1;
    }
  }
  return 0;
}

/* Ids are handed out in sequence and not reused before the space wraps, so
 * late traffic of a closed connection cannot land in a new one. */
uint32_t fab_conn_id_next(fab_endpoint* ep) {
  for (;;) {
    uint32_t id = ep->next_conn_id++;
    if (ep->next_conn_id > ep->dev->tags.conn_max) {
      ep->next_conn_id = 1;
      ep->conn_wrapped = 1;
    }
    if (!ep->conn_wrapped || !conn_id_in_use(ep, id)) return id;
  }
}

/* A send comm with its own endpoint: the endpoint goes with it, at once when
 * no send is in flight, else once the home endpoint's progress finds them
 * complete (progress_retiring). */
static fab_result close_own_endpoint_comm(fab_comm* c) {
  fab_endpoint* own = c->ep;
  fab_endpoint* home = c->home;
  pthread_mutex_lock(&home->lock);
  pthread_mutex_lock(&own->lock);
  fab_list_del(&c->park.node);
  c->closing = 1;
  fab_comm_park_closed(own, c);
  fab_ep_progress_locked(own); /* frees c when nothing is in flight */
  int idle = atomic_load_explicit(&own->nclosing, memory_order_relaxed) == 0;
  pthread_mutex_unlock(&own->lock);
  home->nprivates--; /* a retiring endpoint leaves its place to a new send comm */
  if (idle) {
    fab_list_del(&own->private_node);
  } else {
    own->retiring = 1;
    nclosing_add(home, 1);
    atomic_store_explicit(&home->sweep_every, FAB_SWEEP_EVERY_MIN, memory_order_relaxed);
  }
  pthread_mutex_unlock(&home->lock);
  if (idle) fab_endpoint_destroy(own);
  return FAB_OK;
}

static fab_result close_comm(void* handle, fab_obj_kind kind, const char* fn) {
  fab_comm* c = fab_obj_remove(handle, kind);
  if (!c) {
    fab_obj_kind k = fab_obj_kind_of(handle);
    FAB_WARN("%s: %p is %s%s, not a live %s", fn, handle, k ? "a " : "", k ? fab_obj_kind_name(k) : "unknown or "
             "already closed", fab_obj_kind_name(kind));
    return FAB_ERR_INTERNAL;
  }
  fab_endpoint* ep = c->ep;
  if (c->home) return close_own_endpoint_comm(c);
  pthread_mutex_lock(&ep->lock);
  fab_list_del(&c->park.node);
  c->closing = 1;
  c->ops->cancel(c); /* posted receives, and a grouped receive's unposted part */
  if (!fab_comm_busy(c)) {
    fab_comm_free(c);
  } else {
    fab_comm_park_closed(ep, c);
    fab_ep_progress_locked(ep); /* reads the cancellations; may free c */
  }
  pthread_mutex_unlock(&ep->lock);
  return FAB_OK;
}

fab_result fab_close_send(void* send_comm) { return close_comm(send_comm, FAB_OBJ_SEND, "closeSend"); }
fab_result fab_close_recv(void* recv_comm) { return close_comm(recv_comm, FAB_OBJ_RECV, "closeRecv"); }

typedef struct owned_comm {
  void* handle;
  fab_obj_kind kind;
} owned_comm;

static int collect_owned(fab_list* comms, fab_ctx* owner, owned_comm** out, int* n, int* cap) {
  FAB_LIST_FOREACH_SAFE(it, tmp, comms) {
    fab_comm* c = FAB_CONTAINER_OF(it, fab_comm, park.node);
    if (c->owner != owner) continue;
    if (*n == *cap) {
      int grown = *cap ? 2 * *cap : 16;
      owned_comm* more = realloc(*out, (size_t)grown * sizeof(**out));
      if (!more) return -1;
      *out = more;
      *cap = grown;
    }
    (*out)[(*n)++] = (owned_comm){c->handle, c->kind};
  }
  return 0;
}

int fab_comm_close_owned(fab_endpoint* home, fab_ctx* owner) {
  owned_comm* list = NULL;
  int n = 0, cap = 0;
  /* Under the shared endpoint's lock no connect can finish and no own
   * endpoint can come or go, so the lists are stable. */
  pthread_mutex_lock(&home->lock);
  int rc = collect_owned(&home->comms, owner, &list, &n, &cap);
  FAB_LIST_FOREACH_SAFE(it, tmp, &home->privates) {
    if (rc != 0) break;
    fab_endpoint* own = FAB_CONTAINER_OF(it, fab_endpoint, private_node);
    pthread_mutex_lock(&own->lock);
    rc = collect_owned(&own->comms, owner, &list, &n, &cap);
    pthread_mutex_unlock(&own->lock);
  }
  pthread_mutex_unlock(&home->lock);
  if (rc != 0) FAB_WARN("finalize: out of memory listing open comms; some stay open until the plugin unloads");
  for (int i = 0; i < n; i++) close_comm(list[i].handle, list[i].kind, "finalize");
  free(list);
  return n;
}

/* After fi_close(ep): nothing can complete any more; free everything. */
void fab_conn_endpoint_teardown(fab_endpoint* ep) {
  fab_listen_teardown(ep);
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->connects) {
    fab_pending* pc = FAB_CONTAINER_OF(it, fab_pending, park.node);
    fab_list_del(&pc->park.node);
    pc->park.destroy(&pc->park);
  }
  int live = 0;
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->comms) {
    fab_comm* c = FAB_CONTAINER_OF(it, fab_comm, park.node);
    fab_obj_remove(c->handle, c->kind);
    fab_list_del(&c->park.node);
    fab_comm_free(c);
    live++;
  }
  if (live) FAB_INFO(FAB_SUBSYS_INIT, "closed %d comms the runtime left open on %s", live, ep->dev->name);
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->parked) {
    fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
    fab_list_del(&p->node);
    p->destroy(p);
  }
}
