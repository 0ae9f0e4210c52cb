/*
 * Send and recv comm lifetime. A closed comm with operations in flight is
 * parked on its endpoint (posted receives are cancelled first) and freed by
 * the first progress of the endpoint that finds all its operations complete
 * (fab_comm_sweep_closed), or by endpoint teardown after the libfabric
 * endpoint is closed: memory a pending operation points at is never freed
 * early.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_pwin.h"
#include "fab_transport.h"

static void comm_destroy(fab_parked* p) { fab_comm_free(FAB_CONTAINER_OF(p, fab_comm, park)); }

fab_comm* fab_comm_alloc(fab_endpoint* ep, fab_device* dev, fab_obj_kind kind, fab_ctx* owner,
                         const fab_comm_config* config) {
  const fab_transport_ops* ops = ep->dev->ops;
  fab_comm* c = calloc(1, sizeof(*c) + ops->comm_size);
  if (!c) {
    FAB_WARN("out of memory creating a comm on %s", dev->name);
    return NULL;
  }
  uint32_t nreq = kind == FAB_OBJ_SEND ? ops->send_reqs : ops->recv_reqs;
  size_t tp = kind == FAB_OBJ_SEND ? ops->send_req_size : ops->recv_req_size;
  c->req_size = (uint32_t)(sizeof(fab_req) + tp);
  if (fab_pool_init(&c->reqs, nreq, c->req_size) != 0) {
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
  c->mr_local = ep->dev->reg_host; /* registration required */
  c->owner = owner;
  c->config = config ? *config : owner->config;
  c->park.destroy = comm_destroy;
  fab_list_init(&c->park.node);
  atomic_init(&c->inflight, 0);
  fab_op_init(&c->probe_op, fab_comm_probe_done, c, 0);
  fab_op_init(&c->ctl_op, fab_comm_ctl_done, c, 0);
  /* Requests are initialised on first use (fab_req_first_use), so an idle
   * comm's pool stays non-resident. The id makes the comm findable by
   * completions that name it (remote CQ data); ep lock held. */
  c->local_id = fab_conn_id_next(ep);
  if (fab_ep_id_set(ep, c->local_id, c) != 0 || (ops->comm_init && ops->comm_init(c) != FAB_OK)) {
    if (c->local_id) FAB_WARN("out of memory creating a comm on %s", dev->name);
    fab_comm_free(c);
    return NULL;
  }
  return c;
}

/* 1 while an operation of c is in the provider's hands. ep lock held. */
static int requests_posted(fab_comm* c) {
  uint32_t unposted = c->ops->unposted ? c->ops->unposted(c) : 0;
  return fab_req_pending(c, unposted + 1) > unposted;
}

/* What keeps a closed comm parked: operations in flight, or (a send comm)
 * messages whose delivery is not proven yet (fab_delivery.c). ep lock held. */
static int closed_holds(fab_comm* c) { return fab_comm_busy(c) || fab_delivery_pending(c); }

int fab_parked_is_comm(const fab_parked* p) { return p->destroy == comm_destroy; }

void fab_comm_park_closed(fab_endpoint* ep, fab_comm* c) {
  fab_ep_park(ep, &c->park);
  fab_ep_nclosing_add(ep, 1);
  atomic_store_explicit(&ep->sweep_every, FAB_SWEEP_EVERY_MIN, memory_order_relaxed);
}

static void release_closed(fab_comm* c) {
  fab_list_del(&c->park.node);
  fab_ep_nclosing_add(c->ep, -1);
  fab_comm_free(c);
}

fab_result fab_comm_not_now(fab_comm* c, const char* fn) {
  fab_comm_stalled(c);
  return c->error != FAB_OK ? fab_comm_failed(c, fn) : FAB_OK;
}

fab_result fab_comm_failed(fab_comm* c, const char* fn) {
  FAB_WARN("%s: the connection to %s has failed: %s; close it", fn, c->peer_name, c->error_why);
  return c->error;
}

void fab_comm_op_done(fab_comm* c) {
  fab_comm_count_completion(c);
  if (atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_acq_rel) == 1 && c->closing && !closed_holds(c))
    release_closed(c);
}

/* A retiring own endpoint whose sends the receiver has not taken for
 * FABRIC_PEER_TIMEOUT_MS after its comm closed: nobody waits for them (the
 * runtime closed the comm), and each such endpoint holds a shared-memory
 * region and its buffers for as long as the process lives. */
static int retired_too_long(fab_endpoint* own, int64_t now) {
  int limit = fab_g.params.peer_timeout_ms;
  if (limit == 0 || now - own->retiring_since_ms <= limit) return 0; /* 0: no limit */
  FAB_INFO(FAB_SUBSYS_NET, "%s: a closed send comm's sends were not taken for %d ms (FABRIC_PEER_TIMEOUT_MS); its "
           "own endpoint closes with them", own->dev->name, fab_g.params.peer_timeout_ms);
  own->given_up = 1;
  return 1;
}

/* More than FAB_RETIRING_MAX own endpoints retiring on home: the oldest
 * goes now, sends and all. Each holds a shared-memory region and buffers,
 * so closing comms mid-transfer faster than their receivers take the sends
 * would otherwise grow the process by one region per close for
 * FABRIC_PEER_TIMEOUT_MS. home lock held. */
static void retire_beyond_cap(fab_endpoint* home) {
  for (;;) {
    int n = 0;
    fab_endpoint* oldest = NULL;
    FAB_LIST_FOREACH_SAFE(it, tmp, &home->privates) {
      fab_endpoint* own = FAB_CONTAINER_OF(it, fab_endpoint, private_node);
      if (!own->retiring) continue;
      n++;
      if (!oldest || own->retiring_since_ms < oldest->retiring_since_ms) oldest = own;
    }
    if (n <= FAB_RETIRING_MAX) return;
    FAB_INFO(FAB_SUBSYS_NET, "%s: %d endpoints of closed send comms wait for their sends; the oldest closes with "
             "them (at most %d wait)", home->dev->name, n, FAB_RETIRING_MAX);
    oldest->given_up = 1;
    fab_list_del(&oldest->private_node);
    fab_ep_nclosing_add(home, -1);
    fab_endpoint_destroy(oldest);
  }
}

/* An own endpoint is destroyed once its closed comm's sends have completed,
 * so a transfer the receiver is still taking in never loses its sending
 * side, or once the receiver left them untaken too long. home lock held (the
 * lock order is home, then own). */
static int progress_retiring(fab_endpoint* home) {
  int gone = 0;
  int64_t now = fab_now_ms();
  FAB_LIST_FOREACH_SAFE(it, tmp, &home->privates) {
    fab_endpoint* own = FAB_CONTAINER_OF(it, fab_endpoint, private_node);
    if (!own->retiring) continue;
    pthread_mutex_lock(&own->lock);
    fab_ep_progress_locked(own); /* frees the comm when its sends are done */
    int idle = atomic_load_explicit(&own->nclosing, memory_order_relaxed) == 0;
    pthread_mutex_unlock(&own->lock);
    if (!idle && !retired_too_long(own, now)) continue;
    fab_list_del(&own->private_node);
    fab_ep_nclosing_add(home, -1);
    fab_endpoint_destroy(own);
    gone++;
  }
  return gone;
}

int fab_comm_sweep_closed(fab_endpoint* ep) {
  int gone = 0;
  int64_t now = fab_now_ms();
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->parked) {
    fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
    if (!fab_parked_is_comm(p)) continue;
    fab_comm* c = FAB_CONTAINER_OF(p, fab_comm, park);
    if (!closed_holds(c) || (!fab_comm_busy(c) && fab_delivery_given_up(c, now))) {
      release_closed(c);
      gone++;
    }
  }
  if (!fab_list_empty(&ep->privates)) gone += progress_retiring(ep);
  return gone;
}

void fab_comm_drive_device(fab_comm* c) {
  fab_endpoint* home = c->home ? c->home : c->ep;
  pthread_mutex_lock(&home->lock);
  fab_ep_progress_locked(home);
  FAB_LIST_FOREACH_SAFE(it, tmp, &home->privates) { /* lock order: home, then own */
    fab_endpoint* own = FAB_CONTAINER_OF(it, fab_endpoint, private_node);
    pthread_mutex_lock(&own->lock);
    fab_ep_progress_locked(own);
    pthread_mutex_unlock(&own->lock);
  }
  pthread_mutex_unlock(&home->lock);
}

void fab_comm_free(fab_comm* c) {
  if (c->ops->comm_fini) c->ops->comm_fini(c);
  if (c->local_id && fab_ep_id_get(c->ep, c->local_id) == c) fab_ep_id_set(c->ep, c->local_id, NULL);
  uint32_t used = atomic_load(&c->reqs.used);
  for (uint32_t i = 0; i < used; i++) { /* never-used ones: do not fault their pages in */
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->head.magic != FAB_REQ_MAGIC) continue;
    if (r->busy && r->head.state != FAB_REQ_FREE) fab_req_let_go(r); /* never tested to the end */
    free(r->errmsg);
    r->head.magic = 0;
  }
  fab_pool_fini(&c->reqs);
  for (int i = 0; i < FAB_EXT_COUNT; i++)
    if (c->ext[i].data && c->ext[i].fini) c->ext[i].fini(c->ext[i].data);
  fab_ep_ctrl_dereg(c->answer_mr);
  free(c->answer_rails);
  free(c->rail_handles);
  fab_ep_av_release(c->ep, c->peer);
  c->magic = 0;
  free(c);
}

/* Ids are handed out in sequence and not reused before the space wraps, so
 * late traffic of a closed connection cannot land in a new one. */
uint32_t fab_conn_id_next(fab_endpoint* ep) {
  uint32_t max = ep->dev->tags.conn_max;
  if (max >= FAB_ID_PAGE * FAB_ID_PAGES) max = FAB_ID_PAGE * FAB_ID_PAGES - 1;
  for (;;) {
    uint32_t id = ep->next_conn_id++;
    if (ep->next_conn_id > max) {
      ep->next_conn_id = 1;
      ep->conn_wrapped = 1;
    }
    if (!ep->conn_wrapped || !fab_ep_id_get(ep, id)) return id;
  }
}

/* A send comm with its own endpoint: the endpoint goes with it, at once when
 * no send is in flight, else once the home endpoint's progress finds them
 * complete (progress_retiring). */
/* --- close ---------------------------------------------------------------------- */

/* A receive the provider matched already cannot be cancelled: it writes into
 * the caller's buffer until its data is in; a send handed to the provider
 * reads the caller's buffer until it is delivered. close waits for such
 * operations while one of them completes every FAB_CLOSE_DRAIN_MS (at most
 * the peer timeout), so that the caller may free its buffers once close
 * returns: freed under a tcp send, the socket's read faults and takes the
 * connection, and with it every other comm between the two processes, down.
 * Operations the transport has not handed to the provider yet read nothing
 * and are not waited for (its unposted op). The comms of one connection over
 * several rails close together (fab_conn_close_group): one wait, one
 * deadline, one WARN. */

/* What close found still in the provider's hands, for its WARN. A send
 * comm whose messages are not proven delivered yet is not waited for here:
 * it stays parked until they are, and endpoint teardown waits for it
 * (fab_delivery.c). */
enum { CLOSE_QUIET = 0, CLOSE_RECEIVING, CLOSE_SENDING };

/* Closing starts: no new operation, posted receives cancelled, c pinned (a
 * completion that ends its last operation would free it). ep lock held. */
static void close_begin_locked(fab_comm* c) {
  c->closing = 1;
  fab_delivery_tell_closed(c); /* a closed sender waiting for proof stops waiting */
  c->ops->cancel(c); /* posted receives, and a grouped receive's unposted part */
  atomic_fetch_add_explicit(&c->inflight, 1, memory_order_acq_rel);
}

/* Unpins c; what it still has in flight. ep lock held. */
static int close_end_wait_locked(fab_comm* c) {
  atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_acq_rel);
  if (c->error != FAB_OK) return CLOSE_QUIET; /* its failure was said */
  if (requests_posted(c)) return c->kind == FAB_OBJ_RECV ? CLOSE_RECEIVING : CLOSE_SENDING;
  return CLOSE_QUIET;
}

static int close_waits_for(fab_comm* c) { return c->error == FAB_OK && requests_posted(c); }

/* Waits for the in-flight operations of the pinned comms cs[0..n-1] (no lock
 * held): FAB_CLOSE_DRAIN_MS without one completing, or the peer timeout in
 * all (on a loaded host 8 matched 16 MiB receives took more than 1 s to land
 * while every one of them was moving: functional.*.close_then_free). */
static void close_wait(fab_comm* const* cs, int n) {
  int64_t now = fab_now_ms(), until = now + FAB_CLOSE_DRAIN_MS;
  int64_t cap = now + (fab_g.params.peer_timeout_ms > FAB_CLOSE_DRAIN_MS ? fab_g.params.peer_timeout_ms : FAB_CLOSE_DRAIN_MS);
  uint64_t seen = 0;
  for (int i = 0; i < n; i++) seen += atomic_load_explicit(&cs[i]->ncompl, memory_order_relaxed);
  for (;;) {
    int waiting = 0;
    uint64_t landed = 0;
    for (int i = 0; i < n; i++) {
      fab_comm* c = cs[i];
      pthread_mutex_lock(&c->ep->lock);
      if (close_waits_for(c) && fab_ep_progress_locked(c->ep) == FAB_OK) waiting |= close_waits_for(c);
      pthread_mutex_unlock(&c->ep->lock);
      landed += atomic_load_explicit(&c->ncompl, memory_order_relaxed);
    }
    if (!waiting || (now = fab_now_ms()) >= until) return;
    if (landed != seen) { /* one landed: the rest are moving */
      seen = landed;
      until = now + FAB_CLOSE_DRAIN_MS < cap ? now + FAB_CLOSE_DRAIN_MS : cap;
    }
    for (int i = 0; i < n; i++)
      if (cs[i]->home) fab_comm_drive_device(cs[i]); /* an own endpoint's announcements and credits arrive on its home */
    sched_yield();
  }
}

/* One WARN for what close left in flight: the first comm's account, and how
 * many more rails of the connection were in the same state. */
static void close_warn(const char* fn, int what, const char* peer, int more) {
  char others[64] = "";
  if (more) snprintf(others, sizeof(others), " (and on %d more rail%s of this connection)", more, more == 1 ? "" : "s");
  if (what == CLOSE_RECEIVING)
    FAB_WARN("%s: receives from %s the provider had matched were still taking data after close%s, none of them "
             "completing for %d ms; it may still write into their buffers, so keep them until finalize", fn, peer,
             others, FAB_CLOSE_DRAIN_MS);
  else if (what == CLOSE_SENDING)
    FAB_WARN("%s: sends to %s the provider had taken were still pending after close%s, none of them completing for "
             "%d ms (their receives were not posted, or the peer stopped progressing); it may still read their "
             "buffers, so keep them until finalize", fn, peer, others, FAB_CLOSE_DRAIN_MS);
}

/* The rest of a close on an endpoint of the comm's own (local-only
 * providers), once its operations were waited for. */
static void close_own_endpoint_rest(fab_comm* c) {
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
    own->retiring_since_ms = fab_now_ms();
    fab_ep_nclosing_add(home, 1);
    atomic_store_explicit(&home->sweep_every, FAB_SWEEP_EVERY_MIN, memory_order_relaxed);
    retire_beyond_cap(home);
  }
  pthread_mutex_unlock(&home->lock);
  if (idle) fab_endpoint_destroy(own);
}

/* The comm of handle, out of the table; NULL with one WARN when it is none. */
static fab_comm* close_take(void* handle, fab_obj_kind kind, const char* fn) {
  fab_comm* c = fab_obj_remove(handle, kind);
  if (!c) {
    fab_obj_kind k = fab_obj_kind_of(handle);
    FAB_WARN("%s: %p is %s%s, not a live %s", fn, handle, k ? "a " : "", k ? fab_obj_kind_name(k) : "unknown or "
             "already closed", fab_obj_kind_name(kind));
  }
  return c;
}

/* A connection over several rails whose rail failed has failed: its other
 * rails' operations are not waited for either (a dead peer would otherwise
 * cost each of them the drain time). */
static void close_fail_together(fab_comm* const* cs, int n) {
  const fab_comm* failed = NULL;
  for (int i = 0; i < n && !failed; i++)
    if (cs[i]->error != FAB_OK) failed = cs[i];
  if (!failed) return;
  char why[sizeof(failed->error_why) + 48]; /* fab_comm_fail keeps what fits */
  snprintf(why, sizeof(why), "rail %d of this connection failed: %s", failed->rail, failed->error_why);
  for (int i = 0; i < n; i++) {
    if (cs[i] == failed) continue;
    pthread_mutex_lock(&cs[i]->ep->lock);
    fab_comm_fail(cs[i], failed->error, why);
    pthread_mutex_unlock(&cs[i]->ep->lock);
  }
}

/* Closes the comms handles[0..n-1] of kind together (a connection's rails;
 * n is 1 for a plain close): FAB_ERR_INTERNAL when one was not a live comm
 * (the others still close). */
static fab_result close_comms(void* const* handles, int n, fab_obj_kind kind, const char* fn) {
  fab_comm* cs[FAB_MAX_RAILS];
  int m = 0;
  fab_result rc = FAB_OK;
  for (int i = 0; i < n && i < FAB_MAX_RAILS; i++) {
    fab_comm* c = close_take(handles[i], kind, fn);
    if (!c) {
      rc = FAB_ERR_INTERNAL;
      continue;
    }
    pthread_mutex_lock(&c->ep->lock);
    if (!c->home) fab_list_del(&c->park.node); /* an own endpoint's comm stays listed until the rest */
    close_begin_locked(c);
    pthread_mutex_unlock(&c->ep->lock);
    cs[m++] = c;
  }
  close_fail_together(cs, m);
  close_wait(cs, m);
  int first = CLOSE_QUIET, more = 0;
  char peer[sizeof(cs[0]->peer_name)] = "";
  for (int i = 0; i < m; i++) {
    fab_comm* c = cs[i];
    fab_endpoint* ep = c->ep;
    pthread_mutex_lock(&ep->lock);
    int what = close_end_wait_locked(c);
    if (what != CLOSE_QUIET && first == CLOSE_QUIET) {
      first = what;
      snprintf(peer, sizeof(peer), "%s", c->peer_name);
    } else if (what != CLOSE_QUIET) {
      more++;
    }
    if (c->home) {
      pthread_mutex_unlock(&ep->lock);
      close_own_endpoint_rest(c);
      continue;
    }
    if (!closed_holds(c)) {
      fab_comm_free(c);
    } else {
      fab_comm_park_closed(ep, c);
      fab_ep_progress_locked(ep); /* reads the cancellations; may free c */
    }
    pthread_mutex_unlock(&ep->lock);
  }
  close_warn(fn, first, peer, more);
  return rc;
}

static fab_result close_comm(void* handle, fab_obj_kind kind, const char* fn) {
  return close_comms(&handle, 1, kind, fn);
}

fab_result fab_conn_close_group(void* const* handles, int n, fab_obj_kind kind) {
  return close_comms(handles, n, kind, kind == FAB_OBJ_SEND ? "closeSend" : "closeRecv");
}

fab_result fab_conn_close_send(void* send_comm) { return close_comm(send_comm, FAB_OBJ_SEND, "closeSend"); }
fab_result fab_conn_close_recv(void* recv_comm) { return close_comm(recv_comm, FAB_OBJ_RECV, "closeRecv"); }

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


/* Endpoint teardown, its endpoint closed: one WARN for the closed send comms
 * still without proof that their last messages reached the peer. */
static void warn_unproven(fab_endpoint* ep) {
  if (ep->failed) return; /* its failure was said */
  int n = 0;
  const char* peer = "";
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->parked) {
    fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
    if (!fab_parked_is_comm(p) || !fab_delivery_awaited(FAB_CONTAINER_OF(p, fab_comm, park))) continue;
    if (!n++) peer = FAB_CONTAINER_OF(p, fab_comm, park)->peer_name;
  }
  if (n)
    FAB_WARN("%s: closed the endpoint while %d closed send comm%s (to %s%s) had no proof that their last messages "
             "reached the peer (it did not answer within %d ms: it stopped calling the plugin without closing its "
             "side, or it is gone); those messages may be lost", ep->dev->name, n, n == 1 ? "" : "s", peer,
             n == 1 ? "" : " and others", FAB_CLOSE_DRAIN_MS);
}

/* After fi_close(ep): nothing can complete any more; free every comm. */
void fab_comm_endpoint_teardown(fab_endpoint* ep) {
  warn_unproven(ep);
  int live = 0;
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->comms) {
    fab_comm* c = FAB_CONTAINER_OF(it, fab_comm, park.node);
    fab_obj_remove(c->handle, c->kind);
    fab_list_del(&c->park.node);
    fab_comm_free(c);
    live++;
  }
  if (live) FAB_INFO(FAB_SUBSYS_INIT, "closed %d comms the runtime left open on %s", live, ep->dev->name);
}
