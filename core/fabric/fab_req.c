/* The request lifecycle and peer liveness, shared by every transport. */
#include "fab_prof.h"
#include "fab_req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_transport.h"
#include "fab_wire.h"

void fab_req_first_use(fab_comm* c, fab_req* r) {
  uint32_t idx = (uint32_t)(((char*)r - c->reqs.base) / c->reqs.stride);
  r->pool_index = idx;
  r->head.magic = FAB_REQ_MAGIC;
  r->head.state = FAB_REQ_FREE;
  r->head.kind = &fab_req_kind_net;
  r->comm = c;
  if (c->ops->init_req) c->ops->init_req(c, r);
  /* Published last (release): a close-time scan reads [0, used). The pool's
   * owner is the only writer. */
  if (idx >= atomic_load_explicit(&c->reqs.used, memory_order_relaxed))
    atomic_store_explicit(&c->reqs.used, idx + 1, memory_order_release);
}

static const char* dir_word(const fab_req* r) { return r->type == FAB_REQ_SEND ? "send" : "receive"; }
static const char* peer_word(const fab_req* r) { return r->type == FAB_REQ_SEND ? "to" : "from"; }

void fab_comm_tell_truncated(fab_comm* c, int tag, size_t size, size_t over) {
  fab_wire_window m;
  fab_wire_window_encode(&m, FAB_NOTE_TRUNCATED, c->peer_id, c->local_id, c->conn_id, (uint32_t)tag, size, 0, over, 0);
  fab_ctl_dest to = {.peer = c->peer,
                     .what = "a truncation notice",
                     .then = "the sender is not told that its message was larger than the receive"};
  int rc = fab_ep_ctl_send(c->ep, &to, &m, sizeof(m)); /* inside a completion: it never drives the endpoint */
  if (rc != 0)
    FAB_INFO(FAB_SUBSYS_NET, "telling %s of a truncated message failed: %s", c->peer_name, fi_strerror(-rc));
}

size_t fab_req_op_failed(fab_req* r, size_t size, int tag, const struct fi_cq_err_entry* err) {
  fab_comm* c = r->comm;
  if (c->closing || r->result != FAB_OK) {
    if (r->result == FAB_OK) r->result = FAB_ERR_SYSTEM;
    return 0;
  }
  char msg[512];
  size_t got = 0;
  if (err->err == FI_ECANCELED && c->error == FAB_OK) {
    /* not our cancel (close and fab_comm_fail cancel on failed or closing
     * comms): the provider gave up on the connection under it (libfabric
     * 2.x's tcp provider, RDM without ofi_rxm, cancels a send whose peer
     * went away) */
    r->result = FAB_ERR_REMOTE;
    snprintf(msg, sizeof(msg), "%s of %zu bytes (tag %d) %s %s was cancelled by the provider: the connection to the "
             "peer was lost; the peer process probably exited", dir_word(r), size, tag, peer_word(r), c->peer_name);
    fab_comm_fail(c, FAB_ERR_REMOTE, "the provider cancelled an operation: the connection to the peer was lost");
  } else if (err->err == FI_ECANCELED) {
    /* cancelled because the connection failed (fab_comm_fail) */
    r->result = c->error;
    snprintf(msg, sizeof(msg), "%s of %zu bytes (tag %d) %s %s cancelled: %s", dir_word(r), size, tag,
             peer_word(r), c->peer_name, c->error_why);
  } else if (err->err == FI_ETRUNC) {
    r->result = FAB_ERR_INVALID_USAGE;
    /* olen (the bytes that did not fit) is 0 when the provider does not know it */
    char excess[64] = "";
    if (err->olen) snprintf(excess, sizeof(excess), " (%zu bytes more than the buffer holds)", err->olen);
    snprintf(msg, sizeof(msg),
             "receive of %zu bytes (tag %d) from %s was truncated: the peer sent a larger message%s; a send must "
             "not be larger than its receive",
             size, tag, c->peer_name, excess);
    got = err->len;
    fab_comm_truncated(c);
    if (c->kind == FAB_OBJ_RECV) fab_comm_tell_truncated(c, tag, size, err->olen);
  } else {
    char buf[192] = "";
    /* the returned text: a provider may answer with a string of its own and leave buf untouched */
    const char* prov = fi_cq_strerror(c->ep->cq, err->prov_errno, err->err_data, buf, sizeof(buf));
    r->result = fab_result_from_fi(err->err);
    snprintf(msg, sizeof(msg), "%s of %zu bytes (tag %d) %s %s failed: %s (provider: %s)%s", dir_word(r), size, tag,
             peer_word(r), c->peer_name, fi_strerror(err->err), prov && *prov ? prov : "no detail",
             r->result == FAB_ERR_REMOTE ? "; the peer process probably exited or lost its network" : "");
  }
  r->errmsg = strdup(msg);
  return got;
}

/* --- test: the steps of fab_req_run -------------------------------------------------- */

static inline fab_req* req_of(fab_req_head* h) { return (fab_req*)h; }

static inline int req_busy(fab_req_head* h, int poll) {
  fab_req* r = req_of(h);
  if (atomic_load_explicit(&r->pending, memory_order_acquire) == 0) return 0;
  if (poll) r->comm->ops->progress(r->comm, r);
  return atomic_load_explicit(&r->pending, memory_order_acquire) > 0;
}

static fab_result req_stalled(fab_req_head* h) {
  fab_comm* c = req_of(h)->comm;
  fab_comm_stalled(c);
  return c->error != FAB_OK ? c->error : c->ep->failed;
}

/* The comm failed with r still pending: r is reported failed now and left to
 * its outstanding completions (the failure is final, the comm can only be
 * closed). */
static int req_give_up(fab_req_head* h, fab_result rc) {
  fab_req* r = req_of(h);
  if (r->comm->ops->give_up) r->comm->ops->give_up(r);
  if (atomic_load_explicit(&r->pending, memory_order_acquire) == 0) return 0; /* complete after all */
  if (FAB_UNLIKELY(r->prof)) {
    if (r->result == FAB_OK) r->result = rc;
    fab_prof_done(r);
  }
  return 1;
}

static fab_result req_finish(fab_req_head* h, int* sizes) {
  fab_req* r = req_of(h);
  fab_comm* c = r->comm;
  if (c->ops->settle) c->ops->settle(r);
  if (sizes) c->ops->sizes(r, sizes);
  return r->result;
}

static int req_explain(fab_req_head* h, fab_result rc, char* buf, size_t len) {
  (void)rc;
  fab_req* r = req_of(h);
  fab_comm* c = r->comm;
  if (h->state != FAB_REQ_ORPHAN && r->errmsg) /* its operation's own account */
    snprintf(buf, len, "%s", r->errmsg);
  else /* given up: the connection's failure is why */
    snprintf(buf, len, "%s of %zu bytes (tag %d) %s %s failed: %s", dir_word(r), r->size, r->tag, peer_word(r),
             c->peer_name, c->error != FAB_OK ? c->error_why
                           : h->state == FAB_REQ_ORPHAN ? "the endpoint's completion queue failed"
                                                        : "the transport gave it up");
  return 1;
}

static inline void req_release(fab_req_head* h) {
  fab_req* r = req_of(h);
  if (FAB_UNLIKELY(r->prof)) fab_prof_done(r);
  fab_req_put(r);
}

static const fab_req_steps req_steps = {req_busy, req_stalled, req_give_up, req_finish, req_explain, req_release};

fab_result fab_req_test(fab_req* r, int* done, int* sizes) { return fab_req_run(&r->head, done, sizes, &req_steps, 1); }

fab_result fab_req_test_helped(fab_req* r, int* done, int* sizes) {
  /* where only small requests are live the thread leaves the CQ to tests */
  return fab_req_run(&r->head, done, sizes, &req_steps, !r->comm->helped || fab_ep_helper_small_only(r->comm->ep));
}

static fab_result req_api_test(fab_req_head* h, int* done, int* sizes) {
  fab_req* r = req_of(h);
  if (FAB_UNLIKELY(r->comm->closing)) return fab_req_refuse_closed(h);
  return fab_req_run(h, done, sizes, &req_steps, 1);
}

const fab_req_kind fab_req_kind_net = {.name = "isend/irecv/iflush", .api = FAB_REQ_API_NET, .test = req_api_test};

/* --- liveness ----------------------------------------------------------------- */

/* The liveness check of a stalled c whose peer shares this host (fab_peer.c):
 * fails c when the peer is gone, else counts its process as a sign of life.
 * 0 when c's peer is not such a peer (probe it instead). ep lock held. */
static int check_local_peer_locked(fab_comm* c) {
  fab_endpoint* ep = c->ep;
  char gone[136], why[160]; /* why fits the comm's error text */
  int state = fab_peer_local_state(ep, c->peer, gone, sizeof(gone));
  if (state < 0) return 0;
  if (state > 0) {
    /* A send it never took holds up this endpoint's later sends (shm
     * completes them in order): new send comms get endpoints of their own. */
    if (c->kind == FAB_OBJ_SEND && fab_comm_busy(c) && !ep->hol_blocked) {
      ep->hol_blocked = 1;
      FAB_INFO(FAB_SUBSYS_NET, "%s: sends to %s in flight on a dead peer; later send comms use endpoints of their "
               "own", ep->dev->name, c->peer_name);
    }
    snprintf(why, sizeof(why), "the peer is gone: %s", gone);
    fab_comm_fail(c, FAB_ERR_REMOTE, why);
    return 1;
  }
  if (ep->hol_blocked) return 1; /* alive, but this endpoint's sends may never complete: let the timeout run */
  c->stall_since_ms = 0;         /* a live local process is the sign of life a probe would give */
  return 1;
}

uint32_t fab_req_pending(fab_comm* c, uint32_t enough) {
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire), n = 0;
  for (uint32_t i = 0; i < used && n < enough; i++) {
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->head.magic != FAB_REQ_MAGIC || r->head.state == FAB_REQ_FREE) continue;
    /* acquire: a completion's last write to r is its pending count */
    if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) n++;
  }
  return n;
}

int fab_comm_busy(fab_comm* c) { return atomic_load(&c->inflight) > 0 || fab_req_pending(c, 1) > 0; }

void fab_comm_fail(fab_comm* c, fab_result rc, const char* why) {
  if (c->error != FAB_OK) return;
  snprintf(c->error_why, sizeof(c->error_why), "%s", why);
  c->error = rc;
}

void fab_comm_truncated(fab_comm* c) {
  fab_comm_fail(c, FAB_ERR_INVALID_USAGE, "an earlier message on this connection was larger than its receive "
                "(the two ranks disagree on sizes), so the connection is not used further");
}

/* A closed comm waiting only for its probe is freed by the next sweep of
 * its endpoint. */
void fab_comm_probe_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  (void)done;
  fab_comm* c = op->owner;
  c->probe_posted = 0;
  if (err && err->err != FI_ECANCELED && !c->closing) {
    char why[160];
    snprintf(why, sizeof(why), "a liveness probe to the peer failed (%s)", fi_strerror(err->err));
    fab_comm_fail(c, fab_result_from_fi(err->err), why);
  }
  fab_comm_count_completion(c);
  atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_acq_rel);
}

/* A control write went (its local completion says nothing about the peer's
 * life, so it is not counted as a sign of it), or failed: the connection
 * cannot go on without it. A closed comm waiting for it is freed by the next
 * sweep. */
void fab_comm_ctl_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  (void)done;
  fab_comm* c = op->owner;
  if (err && err->err != FI_ECANCELED && !c->closing) {
    char why[160];
    snprintf(why, sizeof(why), "a control write to the peer failed (%s): the peer closed or is gone",
             fi_strerror(err->err));
    fab_comm_fail(c, fab_result_from_fi(err->err), why);
  }
  atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_acq_rel);
}

int fab_comm_post_probe(fab_comm* c) {
  atomic_fetch_add(&c->inflight, 1);
  ssize_t rc = fi_send(c->ep->ep, NULL, 0, NULL, c->peer, &c->probe_op.ctx);
  if (rc == 0) {
    c->probe_posted = 1;
    return 0;
  }
  atomic_fetch_sub(&c->inflight, 1);
  return (int)rc;
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
    if (check_local_peer_locked(c)) {
      /* a peer on this host: asked of the kernel, never probed (fab_peer.c) */
    } else {
      (void)fab_comm_post_probe(c);
    }
  }
  pthread_mutex_unlock(&ep->lock);
}
