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

#include "fab_transport.h"

/* One tagged operation of a request: the send, or one buffer of a grouped
 * receive. */
typedef struct sr_sub {
  fab_op op;
  void* data;
  size_t size; /* posted size */
  size_t got;  /* bytes received */
  void* desc;
  uint64_t tag;
  _Atomic int state; /* FAB_SUB_*; set DONE by its completion, in any thread */
} sr_sub;

typedef struct sr_req {
  uint8_t nposted;
  _Atomic uint8_t overflow; /* a sub-receive got more than its buffer (into the domain's sink) */
  sr_sub sub[];
} sr_req;

typedef struct sr_comm {
  fab_req* backlog; /* recv: grouped receive not fully posted yet */
  uint64_t sent;    /* send: messages handed to the provider (sr_unproven) */
} sr_comm;

static inline sr_req* SR(fab_req* r) { return fab_req_tp(r); }
static inline sr_comm* SRC(fab_comm* c) { return fab_comm_tp(c); }

static inline void sub_set_state(sr_sub* s, int state) { atomic_store_explicit(&s->state, state, memory_order_relaxed); }
static inline int sub_state(sr_sub* s) { return atomic_load_explicit(&s->state, memory_order_relaxed); }

/* --- completion -------------------------------------------------------------- */

/* A send comm with its own endpoint (local-only providers) also drives its
 * device's shared endpoint, as a shared one would: whoever waits for a send
 * still lets the receives it may depend on progress. Only while r is still
 * pending, so a send that completes costs one CQ read. */
static inline void progress(fab_comm* c, fab_req* r) {
  if (fab_comm_test_polls(c)) fab_ep_poll(c->ep);
  if (FAB_UNLIKELY(c->home != NULL) && (!r || atomic_load_explicit(&r->pending, memory_order_acquire) > 0))
    fab_ep_poll(c->home);
}

/* A sub-operation completed. Successes arrive without the endpoint lock,
 * errors with it (record_error). */
static void sub_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_req* r = op->owner;
  sr_sub* s = &SR(r)->sub[op->index];
  if (FAB_LIKELY(done != NULL)) {
    s->got = done->len;
    if (r->type == FAB_REQ_RECV) fab_comm_recv_seen(r->comm, done->len);
    if (FAB_UNLIKELY(s->got > s->size)) atomic_store_explicit(&SR(r)->overflow, 1, memory_order_relaxed);
  } else {
    s->got = fab_req_op_failed(r, s->size, (int)(uint32_t)s->tag, err);
  }
  sub_set_state(s, FAB_SUB_DONE);
  /* the subs of a grouped receive may complete in two threads at once */
  fab_req_op_done(r, r->n != 1);
}

static void sr_init_req(fab_comm* c, fab_req* r) {
  uint32_t nsubs = c->kind == FAB_OBJ_SEND ? 1 : FAB_MAX_RECVS;
  for (uint32_t i = 0; i < nsubs; i++) fab_op_init_unlocked(&SR(r)->sub[i].op, sub_done, r, i);
}

static inline fab_req* req_get(fab_comm* c, uint8_t type, int n) {
  fab_req* r = fab_req_get(c, type, n, n);
  if (FAB_LIKELY(r != NULL)) {
    SR(r)->nposted = 0;
    atomic_store_explicit(&SR(r)->overflow, 0, memory_order_relaxed);
  }
  return r;
}

/* A message larger than its receive, on a provider whose receives carry the
 * domain's sink after the buffer: the receive fails as a truncation would,
 * and the sink's pages go back. */
static void sr_settle(fab_req* r) {
  if (FAB_LIKELY(!atomic_load_explicit(&SR(r)->overflow, memory_order_relaxed))) return;
  fab_endpoint* ep = r->comm->ep;
  pthread_mutex_lock(&ep->lock); /* fab_req_op_failed writes the result and the comm's error under it */
  for (int i = 0; i < r->n; i++) {
    sr_sub* s = &SR(r)->sub[i];
    if (s->got <= s->size) continue;
    struct fi_cq_err_entry e = {.err = FI_ETRUNC, .len = s->size, .olen = s->got - s->size};
    s->got = fab_req_op_failed(r, s->size, (int)(uint32_t)s->tag, &e);
  }
  pthread_mutex_unlock(&ep->lock);
  fab_domain_sink_release(ep->dev->dom);
}

static inline void req_put(fab_req* r) { fab_req_put(r); }

/* --- send ---------------------------------------------------------------------- */

/* 1 when the message goes inline: host memory within the inject size of an
 * intra-host provider, which places it in the peer's memory as it is posted
 * (fab_dev_tagged_inline; over a stream only the rdma transport sends
 * inline, which its measurements asked for). */
static inline int goes_inline(fab_comm* c, size_t size, fab_mr* mr) {
  return c->ep->dev->local_only && (!mr || mr->type != FAB_PTR_CUDA) && fab_dev_tagged_inline(c->ep->dev, size);
}

static inline ssize_t post_send(fab_comm* c, sr_sub* s, void* data, size_t size, void* desc, int inline_data) {
  int held = fab_ep_serial_enter(c->ep); /* local-only providers: not while another thread progresses (fab_engine.h) */
  ssize_t rc = inline_data ? fi_tinject(c->ep->ep, data, size, c->peer, s->tag)
                           : fi_tsend(c->ep->ep, data, size, desc, c->peer, s->tag, &s->op.ctx);
  fab_ep_serial_leave(c->ep, held);
  return rc;
}

static fab_result sr_isend(fab_comm* c, void* data, size_t size, int tag, fab_mr* mr, void** request) {
  void* desc = mr ? mr->desc : NULL;
  fab_req* r = req_get(c, FAB_REQ_SEND, 1);
  if (FAB_UNLIKELY(!r)) {
    *request = NULL; /* all requests in flight: NCCL retries */
    return FAB_OK;
  }
  sr_sub* s = &SR(r)->sub[0];
  s->data = data;
  s->size = size;
  s->tag = c->tag_base | (uint32_t)tag;
  r->size = size;
  r->tag = tag;
  fab_req_sized(r, size);
  sub_set_state(s, FAB_SUB_POSTED);
  int inline_data = goes_inline(c, size, mr);
  ssize_t rc = post_send(c, s, data, size, desc, inline_data);
  if (FAB_UNLIKELY(rc == -FI_EAGAIN)) {
    progress(c, NULL);
    rc = post_send(c, s, data, size, desc, inline_data);
  }
  if (FAB_LIKELY(rc == 0)) {
    SRC(c)->sent++;
    if (inline_data) { /* placed: nothing will complete it */
      sub_set_state(s, FAB_SUB_DONE);
      fab_req_op_done_inline(r);
    }
    *request = r;
    return FAB_OK;
  }
  sub_set_state(s, FAB_SUB_IDLE);
  req_put(r);
  *request = NULL;
  if (rc == -FI_EAGAIN) return FAB_OK;
  FAB_WARN("isend of %zu bytes (tag %d) to %s: %s failed: %s", size, tag, c->peer_name,
           inline_data ? "fi_tinject" : "fi_tsend", fi_strerror((int)-rc));
  return fab_result_from_fi((int)-rc);
}

/* --- receive ------------------------------------------------------------------- */

/* Posts one sub-receive; with the domain's sink after its buffer where there
 * is one (fab_domain.sink), so the provider never truncates. */
static inline ssize_t post_recv(fab_comm* c, sr_sub* s) {
  fab_domain* dom = c->ep->dev->dom;
  ssize_t rc;
  int held = fab_ep_serial_enter(c->ep); /* local-only providers: not while another thread progresses (fab_engine.h) */
  if (FAB_LIKELY(!dom->sink)) {
    rc = fi_trecv(c->ep->ep, s->data, s->size, s->desc, FI_ADDR_UNSPEC, s->tag, 0, &s->op.ctx);
  } else {
    struct iovec iov[2] = {{.iov_base = s->data, .iov_len = s->size}, {.iov_base = dom->sink, .iov_len = dom->sink_len}};
    void* desc[2] = {s->desc, NULL};
    struct fi_msg_tagged msg = {.msg_iov = iov, .desc = desc, .iov_count = 2, .addr = FI_ADDR_UNSPEC, .tag = s->tag,
                                .context = &s->op.ctx};
    rc = fi_trecvmsg(c->ep->ep, &msg, FI_COMPLETION);
  }
  fab_ep_serial_leave(c->ep, held);
  return rc;
}

/* Posts the sub-receives of r not posted yet: 0, -FI_EAGAIN, or an error. */
static int post_subs(fab_comm* c, fab_req* r) {
  while (SR(r)->nposted < r->n) {
    sr_sub* s = &SR(r)->sub[SR(r)->nposted];
    sub_set_state(s, FAB_SUB_POSTED);
    ssize_t rc = post_recv(c, s);
    if (FAB_UNLIKELY(rc != 0)) {
      sub_set_state(s, FAB_SUB_IDLE);
      return (int)rc;
    }
    SR(r)->nposted++;
  }
  return 0;
}

/* Gives up on the receives of r that could not be posted (r->n > 1: its
 * posted subs may be completing in other threads). Endpoint lock held:
 * record_error writes result and errmsg under it. */
static void abandon_unposted_locked(fab_req* r, const char* why) {
  int missing = r->n - SR(r)->nposted;
  if (r->result == FAB_OK) r->result = FAB_ERR_SYSTEM;
  if (why && !r->errmsg) r->errmsg = strdup(why);
  SR(r)->nposted = r->n;
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
  fab_req* r = SRC(c)->backlog;
  int rc = post_subs(c, r);
  if (rc == -FI_EAGAIN) {
    progress(c, NULL);
    rc = post_subs(c, r);
  }
  if (rc == -FI_EAGAIN) return rc;
  SRC(c)->backlog = NULL;
  if (rc != 0) {
    abandon_unposted(r, "posting the rest of a grouped receive failed");
  }
  return 0;
}

static fab_result irecv_failed(fab_comm* c, fab_req* r, int n, int rc) {
  if (SR(r)->nposted == 0) {
    req_put(r);
    if (rc == -FI_EAGAIN) return FAB_OK;
    FAB_WARN("irecv of %d buffers from %s: fi_trecv failed: %s", n, c->peer_name, fi_strerror(-rc));
    return fab_result_from_fi(-rc);
  }
  if (rc == -FI_EAGAIN) {
    SRC(c)->backlog = r; /* the rest is posted before anything else of this comm */
    return FAB_OK;
  }
  /* Some receives are posted and cannot be taken back: the request stays
   * with the comm (closing cancels them) and the caller gets the error. */
  int failed_at = SR(r)->nposted;
  abandon_unposted(r, NULL);
  FAB_WARN("irecv of %d buffers from %s: fi_trecv of buffer %d failed: %s", n, c->peer_name, failed_at,
           fi_strerror(-rc));
  return fab_result_from_fi(-rc);
}

/* The common receive: one buffer, posted straight from the arguments. */
static fab_result irecv_one(fab_comm* c, fab_req* r, void* data, size_t size, int tag, void* desc,
                            void** request) {
  sr_sub* s = &SR(r)->sub[0];
  s->data = data;
  s->size = size;
  s->got = 0;
  s->desc = desc;
  s->tag = c->tag_base | (uint32_t)tag;
  r->size = size;
  r->tag = tag;
  fab_req_sized_recv(r, size);
  sub_set_state(s, FAB_SUB_POSTED);
  ssize_t rc = post_recv(c, s);
  if (FAB_UNLIKELY(rc == -FI_EAGAIN)) {
    progress(c, NULL);
    rc = post_recv(c, s);
  }
  if (FAB_LIKELY(rc == 0)) {
    SR(r)->nposted = 1;
    *request = r;
    return FAB_OK;
  }
  sub_set_state(s, FAB_SUB_IDLE);
  return irecv_failed(c, r, 1, (int)rc);
}

static fab_result sr_irecv(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, fab_mr** mrs,
                           void** request) {
  *request = NULL;
  if (FAB_UNLIKELY(SRC(c)->backlog != NULL) && flush_backlog(c) != 0) return FAB_OK;
  fab_req* r = req_get(c, FAB_REQ_RECV, n);
  if (FAB_UNLIKELY(!r)) return FAB_OK;
  if (FAB_LIKELY(n == 1)) return irecv_one(c, r, data[0], sizes[0], tags[0], mrs[0] ? mrs[0]->desc : NULL, request);
  r->size = sizes[0];
  r->tag = tags[0];
  for (int i = 0; i < n; i++) {
    fab_req_sized_recv(r, sizes[i]);
    sr_sub* s = &SR(r)->sub[i];
    s->data = data[i];
    s->size = sizes[i];
    s->got = 0;
    s->desc = mrs[i] ? mrs[i]->desc : NULL;
    s->tag = c->tag_base | (uint32_t)tags[i];
    s->state = FAB_SUB_IDLE;
  }
  int rc = post_subs(c, r);
  if (FAB_UNLIKELY(rc == -FI_EAGAIN) && SR(r)->nposted == 0) {
    progress(c, NULL);
    rc = post_subs(c, r);
  }
  if (FAB_LIKELY(rc == 0)) {
    *request = r;
    return FAB_OK;
  }
  fab_result frc = irecv_failed(c, r, n, rc);
  if (SRC(c)->backlog == r) *request = r;
  return frc;
}

/* --- progress and test ---------------------------------------------------------- */

static void sr_progress(fab_comm* c, fab_req* r) {
  if (FAB_UNLIKELY(SRC(c)->backlog == r)) flush_backlog(c);
  progress(c, r);
}

static void sr_give_up(fab_req* r) {
  fab_comm* c = r->comm;
  if (SRC(c)->backlog == r) {
    SRC(c)->backlog = NULL;
    abandon_unposted(r, NULL);
  }
}

static void sr_sizes(fab_req* r, int* sizes) {
  if (r->type == FAB_REQ_RECV) {
    for (int i = 0; i < r->n; i++) sizes[i] = (int)SR(r)->sub[i].got;
  } else {
    sizes[0] = (int)r->size;
  }
}

/* --- close ----------------------------------------------------------------------- */

/* At close, endpoint lock held: the comm's owner no longer calls it. */
static void sr_cancel(fab_comm* c) {
  if (c->kind != FAB_OBJ_RECV) return; /* sends cannot be taken back: they complete or fail */
  if (SRC(c)->backlog) { /* its rest will never be posted */
    abandon_unposted_locked(SRC(c)->backlog, NULL);
    SRC(c)->backlog = NULL;
  }
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  for (uint32_t i = 0; i < used; i++) {
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->head.magic != FAB_REQ_MAGIC || r->head.state == FAB_REQ_FREE) continue;
    for (int k = 0; k < r->n; k++) {
      if (sub_state(&SR(r)->sub[k]) == FAB_SUB_POSTED) fi_cancel(&c->ep->ep->fid, &SR(r)->sub[k].op.ctx);
    }
  }
}

/* Over kernel sockets a send completes once its bytes are in our socket,
 * and nothing here says whether the receiver read them: a closed send comm
 * that sent anything asks (fab_delivery.c). Elsewhere a send completes once
 * the peer's side has it. */
static uint64_t sr_unproven(fab_comm* c) {
  return c->kind == FAB_OBJ_SEND && c->ep->dev->one_stream ? SRC(c)->sent : 0;
}

const fab_transport_ops fab_sendrecv_ops = {
    .name = "sendrecv",
    .id = FAB_TRANSPORT_SENDRECV,
    .needs = {.caps = FI_TAGGED | FI_MSG, .msg_order = FI_ORDER_SAS, .mr_access = FI_SEND | FI_RECV, .tagged = 1},
    .send_reqs = FAB_MAX_REQUESTS * FAB_MAX_RECVS,
    .recv_reqs = 2 * FAB_MAX_REQUESTS,
    .send_req_size = sizeof(sr_req) + sizeof(sr_sub),
    .recv_req_size = sizeof(sr_req) + FAB_MAX_RECVS * sizeof(sr_sub),
    .comm_size = sizeof(sr_comm),
    .init_req = sr_init_req,
    .isend = sr_isend,
    .irecv = sr_irecv,
    .iflush = fab_mr_iflush,
    .progress = sr_progress,
    .settle = sr_settle,
    .sizes = sr_sizes,
    .give_up = sr_give_up,
    .cancel = sr_cancel,
    .unproven = sr_unproven,
};
