/*
 * The sendrecv transport: NCCL messages as libfabric tagged messages.
 *
 *  isend  = one fi_tsend to the peer, tag = connection id << 32 | NCCL tag
 *  irecv  = n fi_trecv with exact tags, one request with n sub-receives that
 *           complete independently; test reports each one's size
 *  iflush = nothing for host memory; cuFlushGPUDirectRDMAWrites for CUDA
 *
 * Ordering: FI_ORDER_SAS plus libfabric's rule that a message matches the
 * first posted receive with its tag gives NCCL's "in order per connection".
 * A grouped receive that could only be posted in part stays the comm's
 * backlog: its remaining receives are posted before any later receive of the
 * comm, so no later receive can overtake it.
 *
 * Hot path: no allocation, no lock, no atomic read-modify-write (but for a
 * grouped receive's completions), no syscall of our own. The comm's request
 * pool belongs to the thread driving the comm; a completion, dispatched by
 * whichever thread reads it from the CQ, touches only its request and makes
 * the request's pending count its last write. test reads the CQ only while
 * its request is not complete.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_cuda.h"
#include "fab_transport.h"

/* --- completion -------------------------------------------------------------- */

static void record_error(fab_req* r, fab_sub* s, const struct fi_cq_err_entry* err) {
  fab_comm* c = r->comm;
  if (c->closing || r->result != FAB_OK) {
    if (r->result == FAB_OK) r->result = FAB_ERR_SYSTEM;
    return;
  }
  char msg[512];
  int tag = (int)(uint32_t)s->tag;
  const char* dir = r->type == FAB_REQ_SEND ? "send" : "receive";
  if (err->err == FI_ECANCELED) {
    /* cancelled because the connection failed (fab_comm_fail) */
    r->result = c->error != FAB_OK ? c->error : FAB_ERR_SYSTEM;
    snprintf(msg, sizeof(msg), "%s of %zu bytes (tag %d) %s %s cancelled: %s", dir, s->size, tag,
             r->type == FAB_REQ_SEND ? "to" : "from", c->peer_name,
             c->error != FAB_OK ? c->error_why : "the operation was cancelled");
    r->errmsg = strdup(msg);
    return;
  }
  char prov[192];
  fi_cq_strerror(c->ep->cq, err->prov_errno, err->err_data, prov, sizeof(prov));
  if (err->err == FI_ETRUNC) {
    r->result = FAB_ERR_INVALID_USAGE;
    /* olen (the bytes that did not fit) is 0 when the provider does not know it */
    char excess[64] = "";
    if (err->olen) snprintf(excess, sizeof(excess), " (%zu bytes more than the buffer holds)", err->olen);
    snprintf(msg, sizeof(msg),
             "receive of %zu bytes (tag %d) from %s was truncated: the peer sent a larger message%s; a send must "
             "not be larger than its receive",
             s->size, tag, c->peer_name, excess);
    s->got = err->len;
  } else {
    r->result = fab_result_from_fi(err->err);
    snprintf(msg, sizeof(msg), "%s of %zu bytes (tag %d) %s %s failed: %s (provider: %s)%s", dir, s->size, tag,
             r->type == FAB_REQ_SEND ? "to" : "from", c->peer_name, fi_strerror(err->err), prov,
             r->result == FAB_ERR_REMOTE ? "; the peer process probably exited or lost its network" : "");
  }
  r->errmsg = strdup(msg);
}

/* A send comm with its own endpoint (local-only providers) also drives its
 * device's shared endpoint, as a shared one would: whoever waits for a send
 * still lets the receives it may depend on progress. Only while r is still
 * pending, so a send that completes costs one CQ read. */
static inline void progress(fab_comm* c, fab_req* r) {
  fab_ep_try_progress(c->ep);
  if (FAB_UNLIKELY(c->home != NULL) && (!r || atomic_load_explicit(&r->pending, memory_order_acquire) > 0))
    fab_ep_try_progress(c->home);
}

/* A sub-operation completed. Successes arrive without the endpoint lock,
 * errors with it (record_error). */
static void sub_done(fab_op* op, const struct fi_cq_msg_entry* done, const struct fi_cq_err_entry* err) {
  fab_req* r = op->owner;
  fab_sub* s = &r->sub[op->index];
  if (FAB_LIKELY(done != NULL)) s->got = done->len;
  else record_error(r, s, err);
  fab_sub_set_state(s, FAB_SUB_DONE);
  fab_comm_count_completion(r->comm);
  /* The last write: at 0 the owner may reuse r, and a closed comm may be
   * freed. A single operation is the only writer of its count once posted;
   * the subs of a grouped receive may complete in two threads at once. */
  if (FAB_LIKELY(r->n == 1))
    atomic_store_explicit(&r->pending, 0, memory_order_release);
  else
    atomic_fetch_sub_explicit(&r->pending, 1, memory_order_acq_rel);
}

static void sr_init_req(fab_comm* c, fab_req* r, uint32_t nsubs) {
  for (uint32_t i = 0; i < nsubs; i++) fab_op_init_unlocked(&r->sub[i].op, sub_done, r, i);
}

static inline fab_req* req_get(fab_comm* c, uint8_t type, int n) {
  fab_req* r = fab_pool_get(&c->reqs);
  if (FAB_UNLIKELY(!r)) return NULL;
  if (FAB_UNLIKELY(r->magic != FAB_REQ_MAGIC)) fab_comm_req_first_use(c, r);
  r->state = FAB_REQ_ACTIVE;
  r->type = type;
  r->n = (uint8_t)n;
  r->nposted = 0;
  r->result = FAB_OK;
  atomic_store_explicit(&r->pending, n, memory_order_relaxed);
  return r;
}

static void req_put(fab_req* r) {
  r->state = FAB_REQ_FREE;
  if (FAB_UNLIKELY(r->errmsg != NULL)) {
    free(r->errmsg);
    r->errmsg = NULL;
  }
  fab_pool_put_index(&r->comm->reqs, r->pool_index);
}

/* --- send ---------------------------------------------------------------------- */

static fab_result sr_isend(fab_comm* c, void* data, size_t size, int tag, void* desc, void** request) {
  fab_req* r = req_get(c, FAB_REQ_SEND, 1);
  if (FAB_UNLIKELY(!r)) {
    *request = NULL; /* all requests in flight: NCCL retries */
    return FAB_OK;
  }
  fab_sub* s = &r->sub[0];
  s->data = data;
  s->size = size;
  s->tag = c->tag_base | (uint32_t)tag;
  fab_sub_set_state(s, FAB_SUB_POSTED);
  ssize_t rc = fi_tsend(c->ep->ep, data, size, desc, c->peer, s->tag, &s->op.ctx);
  if (FAB_UNLIKELY(rc == -FI_EAGAIN)) {
    progress(c, NULL);
    rc = fi_tsend(c->ep->ep, data, size, desc, c->peer, s->tag, &s->op.ctx);
  }
  if (FAB_LIKELY(rc == 0)) {
    *request = r;
    return FAB_OK;
  }
  fab_sub_set_state(s, FAB_SUB_IDLE);
  req_put(r);
  *request = NULL;
  if (rc == -FI_EAGAIN) return FAB_OK;
  FAB_WARN("isend of %zu bytes (tag %d) to %s: fi_tsend failed: %s", size, tag, c->peer_name, fi_strerror((int)-rc));
  return fab_result_from_fi((int)-rc);
}

/* --- receive ------------------------------------------------------------------- */

/* Posts the sub-receives of r not posted yet: 0, -FI_EAGAIN, or an error. */
static int post_subs(fab_comm* c, fab_req* r) {
  struct fid_ep* ep = c->ep->ep;
  while (r->nposted < r->n) {
    fab_sub* s = &r->sub[r->nposted];
    fab_sub_set_state(s, FAB_SUB_POSTED);
    ssize_t rc = fi_trecv(ep, s->data, s->size, s->desc, FI_ADDR_UNSPEC, s->tag, 0, &s->op.ctx);
    if (FAB_UNLIKELY(rc != 0)) {
      fab_sub_set_state(s, FAB_SUB_IDLE);
      return (int)rc;
    }
    r->nposted++;
  }
  return 0;
}

/* Gives up on the receives of r that could not be posted (r->n > 1: its
 * posted subs may be completing in other threads). Endpoint lock held:
 * record_error writes result and errmsg under it. */
static void abandon_unposted_locked(fab_req* r, const char* why) {
  int missing = r->n - r->nposted;
  if (r->result == FAB_OK) r->result = FAB_ERR_SYSTEM;
  if (why && !r->errmsg) r->errmsg = strdup(why);
  r->nposted = r->n;
  atomic_fetch_sub_explicit(&r->pending, missing, memory_order_acq_rel);
}

static void abandon_unposted(fab_req* r, const char* why) {
  fab_endpoint* ep = r->comm->ep;
  pthread_mutex_lock(&ep->lock);
  abandon_unposted_locked(r, why);
  pthread_mutex_unlock(&ep->lock);
}

/* Posts the rest of a partly posted grouped receive. 0 when none is left. */
static int flush_backlog(fab_comm* c) {
  fab_req* r = c->backlog;
  int rc = post_subs(c, r);
  if (rc == -FI_EAGAIN) {
    progress(c, NULL);
    rc = post_subs(c, r);
  }
  if (rc == -FI_EAGAIN) return rc;
  c->backlog = NULL;
  if (rc != 0) {
    abandon_unposted(r, "posting the rest of a grouped receive failed");
  }
  return 0;
}

static fab_result irecv_failed(fab_comm* c, fab_req* r, int n, int rc) {
  if (r->nposted == 0) {
    req_put(r);
    if (rc == -FI_EAGAIN) return FAB_OK;
    FAB_WARN("irecv of %d buffers from %s: fi_trecv failed: %s", n, c->peer_name, fi_strerror(-rc));
    return fab_result_from_fi(-rc);
  }
  if (rc == -FI_EAGAIN) {
    c->backlog = r; /* the rest is posted before anything else of this comm */
    return FAB_OK;
  }
  /* Some receives are posted and cannot be taken back: the request stays
   * with the comm (closing cancels them) and the caller gets the error. */
  int failed_at = r->nposted;
  abandon_unposted(r, NULL);
  FAB_WARN("irecv of %d buffers from %s: fi_trecv of buffer %d failed: %s", n, c->peer_name, failed_at,
           fi_strerror(-rc));
  return fab_result_from_fi(-rc);
}

/* The common receive: one buffer, posted straight from the arguments. */
static fab_result irecv_one(fab_comm* c, fab_req* r, void* data, size_t size, int tag, void* desc,
                            void** request) {
  fab_sub* s = &r->sub[0];
  s->data = data;
  s->size = size;
  s->got = 0;
  s->desc = desc;
  s->tag = c->tag_base | (uint32_t)tag;
  fab_sub_set_state(s, FAB_SUB_POSTED);
  ssize_t rc = fi_trecv(c->ep->ep, data, size, desc, FI_ADDR_UNSPEC, s->tag, 0, &s->op.ctx);
  if (FAB_UNLIKELY(rc == -FI_EAGAIN)) {
    progress(c, NULL);
    rc = fi_trecv(c->ep->ep, data, size, desc, FI_ADDR_UNSPEC, s->tag, 0, &s->op.ctx);
  }
  if (FAB_LIKELY(rc == 0)) {
    r->nposted = 1;
    *request = r;
    return FAB_OK;
  }
  fab_sub_set_state(s, FAB_SUB_IDLE);
  return irecv_failed(c, r, 1, (int)rc);
}

static fab_result sr_irecv(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, void** descs,
                           void** request) {
  *request = NULL;
  if (FAB_UNLIKELY(c->backlog != NULL) && flush_backlog(c) != 0) return FAB_OK;
  fab_req* r = req_get(c, FAB_REQ_RECV, n);
  if (FAB_UNLIKELY(!r)) return FAB_OK;
  if (FAB_LIKELY(n == 1)) return irecv_one(c, r, data[0], sizes[0], tags[0], descs ? descs[0] : NULL, request);
  for (int i = 0; i < n; i++) {
    fab_sub* s = &r->sub[i];
    s->data = data[i];
    s->size = sizes[i];
    s->got = 0;
    s->desc = descs ? descs[i] : NULL;
    s->tag = c->tag_base | (uint32_t)tags[i];
    s->state = FAB_SUB_IDLE;
  }
  int rc = post_subs(c, r);
  if (FAB_UNLIKELY(rc == -FI_EAGAIN) && r->nposted == 0) {
    progress(c, NULL);
    rc = post_subs(c, r);
  }
  if (FAB_LIKELY(rc == 0)) {
    *request = r;
    return FAB_OK;
  }
  fab_result frc = irecv_failed(c, r, n, rc);
  if (c->backlog == r) *request = r;
  return frc;
}

/* --- flush --------------------------------------------------------------------- */

static fab_result sr_iflush(fab_comm* c, int n, void** data, const int* sizes, fab_mr** mrs, void** request) {
  *request = NULL; /* flushes complete before returning */
  int need = 0;
  for (int i = 0; i < n; i++) need |= mrs[i] && mrs[i]->type == FAB_PTR_CUDA && sizes[i] > 0;
  if (FAB_LIKELY(!need)) return FAB_OK;
  const char* what;
  int rc = fab_cuda_flush(&what);
  if (rc != 0) {
    FAB_WARN("iflush after a receive from %s: %s failed (CUresult %d); the received GPU data may not be visible",
             c->peer_name, what, rc);
    return FAB_ERR_CUDA;
  }
  return FAB_OK;
}

/* --- test ---------------------------------------------------------------------- */

/* The comm failed with r still pending: report the failure now and leave r
 * to its outstanding completions: it stays out of the pool until the comm
 * is freed (the failure is final, the comm can only be closed). 1 when r
 * turned out to be complete after all. */
static int orphan(fab_req* r) {
  fab_comm* c = r->comm;
  if (c->backlog == r) {
    c->backlog = NULL;
    abandon_unposted(r, NULL);
  }
  if (atomic_load_explicit(&r->pending, memory_order_acquire) == 0) return 1;
  r->state = FAB_REQ_ORPHAN;
  return 0;
}

static fab_result still_pending(fab_req* r, int* done) {
  fab_comm* c = r->comm;
  fab_comm_stalled(c);
  fab_result rc = c->error != FAB_OK ? c->error : c->ep->failed;
  if (FAB_LIKELY(rc == FAB_OK) || orphan(r)) {
    *done = 0;
    return FAB_OK;
  }
  *done = 1;
  FAB_WARN("%s of %zu bytes (tag %d) %s %s failed: %s", r->type == FAB_REQ_SEND ? "send" : "receive", r->sub[0].size,
           (int)(uint32_t)r->sub[0].tag, r->type == FAB_REQ_SEND ? "to" : "from", c->peer_name,
           c->error != FAB_OK ? c->error_why : "the endpoint's completion queue failed");
  return rc;
}

static fab_result sr_test(fab_req* r, int* done, int* sizes) {
  if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) {
    fab_comm* c = r->comm;
    if (FAB_UNLIKELY(c->backlog == r)) flush_backlog(c);
    progress(c, r);
    if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) {
      fab_result rc = still_pending(r, done);
      if (*done || rc != FAB_OK) return rc;
      if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) return FAB_OK;
    }
  }
  *done = 1;
  if (sizes) {
    if (r->type == FAB_REQ_RECV) {
      for (int i = 0; i < r->n; i++) sizes[i] = (int)r->sub[i].got;
    } else {
      sizes[0] = (int)r->sub[0].size;
    }
  }
  fab_result rc = r->result;
  if (FAB_UNLIKELY(rc != FAB_OK)) FAB_WARN("%s", r->errmsg ? r->errmsg : "request failed");
  req_put(r);
  return rc;
}

/* --- close ----------------------------------------------------------------------- */

/* At close, endpoint lock held: the comm's owner no longer calls it. */
static void sr_cancel(fab_comm* c) {
  if (c->kind != FAB_OBJ_RECV) return; /* sends cannot be taken back: they complete or fail */
  if (c->backlog) { /* its rest will never be posted */
    abandon_unposted_locked(c->backlog, NULL);
    c->backlog = NULL;
  }
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  for (uint32_t i = 0; i < used; i++) {
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->magic != FAB_REQ_MAGIC || r->state == FAB_REQ_FREE) continue;
    for (int k = 0; k < r->n; k++) {
      if (fab_sub_state(&r->sub[k]) == FAB_SUB_POSTED) fi_cancel(&c->ep->ep->fid, &r->sub[k].op.ctx);
    }
  }
}

const fab_transport_ops fab_sendrecv_ops = {
    .name = "sendrecv",
    .extra_caps = 0,
    .send_reqs = FAB_MAX_REQUESTS * FAB_MAX_RECVS,
    .recv_reqs = 2 * FAB_MAX_REQUESTS,
    .send_subs = 1,
    .recv_subs = FAB_MAX_RECVS,
    .init_req = sr_init_req,
    .isend = sr_isend,
    .irecv = sr_irecv,
    .iflush = sr_iflush,
    .test = sr_test,
    .cancel = sr_cancel,
};
