/* The rdma transport's receiving side: number and announce buffers, and
 * complete them as the sender's writes land. See rd.h. */
#include <stdio.h>
#include <string.h>

#include "rd.h"

static inline void sub_set(rd_rsub* b, int state) { atomic_store_explicit(&b->state, state, memory_order_relaxed); }
static inline int sub_get(rd_rsub* b) { return atomic_load_explicit(&b->state, memory_order_relaxed); }

static int may_announce(rd_rcomm* rc, uint32_t index) {
  return index - atomic_load_explicit(&rc->acked, memory_order_acquire) < RD_SLOTS;
}

/* Writes buffer b's announcement into the sender's mailbox: 0, -FI_EAGAIN,
 * or an error. */
static ssize_t announce(fab_comm* c, rd_rsub* b) {
  rd_rcomm* rc = rd_r(c);
  uint32_t entry = b->ctrl.index % RD_SLOTS;
  sub_set(b, RD_SUB_ANNOUNCED); /* before the write: the data may land at once */
  ssize_t n = fab_rma_inject_writedata(c->ep, c->peer, &b->ctrl, sizeof(b->ctrl), &rc->box,
                                       (uint64_t)entry * sizeof(rd_ctrl), rd_cq_data(RD_CTRL, c->peer_id, 0, entry));
  if (n != 0) sub_set(b, RD_SUB_WAITING);
  return n;
}

static inline uint32_t backlog_len(rd_rcomm* rc) { return atomic_load_explicit(&rc->nbacklog, memory_order_acquire); }

/* Announces backlogged buffers in order while the mailbox has room: 0 or an
 * error (-FI_EAGAIN leaves them for later). ep lock held. */
static ssize_t flush_backlog(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  uint32_t done = 0, len = backlog_len(rc);
  ssize_t n = 0;
  while (done < len) {
    rd_backlog_entry* e = &rc->backlog[done];
    rd_rsub* b = &rd_rq(e->r)->sub[e->sub];
    if (!may_announce(rc, b->ctrl.index)) break;
    n = announce(c, b);
    if (n != 0) break;
    done++;
  }
  if (done) memmove(rc->backlog, rc->backlog + done, (len - done) * sizeof(*rc->backlog));
  atomic_store_explicit(&rc->nbacklog, len - done, memory_order_release);
  return n == -FI_EAGAIN ? 0 : n;
}

/* ep lock held. */
static void announce_failed_locked(fab_comm* c, ssize_t n) {
  char why[160];
  snprintf(why, sizeof(why), "announcing a receive buffer to the peer failed: %s", fi_strerror((int)-n));
  fab_comm_fail(c, fab_result_from_fi((int)-n), why);
}

static fab_result announce_failed(fab_comm* c, ssize_t n) {
  pthread_mutex_lock(&c->ep->lock);
  announce_failed_locked(c, n);
  pthread_mutex_unlock(&c->ep->lock);
  FAB_WARN("irecv from %s: %s", c->peer_name, c->error_why);
  return c->error;
}

/* Appends buffer k of r to the backlog and announces what can be. */
static ssize_t backlog_add(fab_comm* c, fab_req* r, uint32_t k) {
  rd_rcomm* rc = rd_r(c);
  pthread_mutex_lock(&c->ep->lock);
  uint32_t len = backlog_len(rc);
  rc->backlog[len] = (rd_backlog_entry){r, k};
  atomic_store_explicit(&rc->nbacklog, len + 1, memory_order_release);
  ssize_t n = flush_backlog(c);
  pthread_mutex_unlock(&c->ep->lock);
  return n;
}

static fab_result check_registered(fab_comm* c, int n, fab_mr** mrs) {
  for (int i = 0; i < n; i++) {
    if (FAB_LIKELY(mrs[i] && mrs[i]->entry)) continue;
    FAB_WARN("irecv from %s: buffer %d has no registration the peer can write into; the rdma transport needs every "
             "receive buffer registered with regMr", c->peer_name, i);
    return FAB_ERR_INTERNAL;
  }
  return FAB_OK;
}

fab_result rd_irecv(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, fab_mr** mrs,
                    void** request) {
  rd_rcomm* rc = rd_r(c);
  *request = NULL;
  fab_result frc = check_registered(c, n, mrs);
  if (FAB_UNLIKELY(frc != FAB_OK)) return frc;
  ssize_t err = 0;
  fab_req* r = fab_req_get(c, FAB_REQ_RECV, n, n);
  if (FAB_UNLIKELY(!r)) return FAB_OK;
  r->size = sizes[0];
  r->tag = tags[0];
  for (int i = 0; i < n; i++) {
    rd_rsub* b = &rd_rq(r)->sub[i];
    uint32_t index = rc->next_index++;
    b->data = data[i];
    b->size = sizes[i];
    b->got = 0;
    b->ctrl = (rd_ctrl){.addr = fab_mr_remote_addr(mrs[i], data[i]), .key = mrs[i]->key, .size = sizes[i],
                        .index = index, .tag = tags[i], .slot = (uint16_t)(r->pool_index << 3 | (uint32_t)i),
                        .check = index ^ RD_CTRL_MAGIC};
    sub_set(b, RD_SUB_WAITING);
    ssize_t a = -FI_EAGAIN;
    if (backlog_len(rc) == 0 && may_announce(rc, index)) a = announce(c, b);
    if (a == -FI_EAGAIN) a = backlog_add(c, r, (uint32_t)i);
    if (a != 0) err = a;
  }
  *request = r; /* even after a failure: its announced buffers belong to it */
  return err ? announce_failed(c, err) : FAB_OK;
}

void rd_recv_progress(fab_comm* c) {
  if (FAB_LIKELY(backlog_len(rd_r(c)) == 0)) return;
  pthread_mutex_lock(&c->ep->lock);
  ssize_t err = flush_backlog(c);
  if (err) announce_failed_locked(c, err);
  pthread_mutex_unlock(&c->ep->lock);
}

/* The sender wrote (DATA) or refused to write (TRUNC) the buffer named by
 * slot. Every field of the peer's CQ data is checked against what we
 * announced. ep lock held. */
void rd_recv_landed(fab_comm* c, unsigned type, uint32_t slot, uint32_t size) {
  uint32_t idx = slot >> 3, k = slot & 7;
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  fab_req* r = idx < used ? fab_pool_at(&c->reqs, idx) : NULL;
  if (!r || r->magic != FAB_REQ_MAGIC || r->state == FAB_REQ_FREE || k >= r->n) {
    rd_protocol_error(c, "a write names a receive that is not posted");
    return;
  }
  rd_rsub* b = &rd_rq(r)->sub[k];
  if (sub_get(b) != RD_SUB_ANNOUNCED) {
    rd_protocol_error(c, "a write names a buffer that was not announced or is already complete");
    return;
  }
  if (type == RD_DATA && size > b->size) {
    rd_protocol_error(c, "a write larger than the buffer announced for it");
    return;
  }
  uint32_t next = b->ctrl.index + 1; /* the sender consumed every announcement up to this one */
  if ((int32_t)(next - atomic_load_explicit(&rd_r(c)->acked, memory_order_relaxed)) > 0)
    atomic_store_explicit(&rd_r(c)->acked, next, memory_order_release);
  if (backlog_len(rd_r(c)) && !c->closing) {
    ssize_t err = flush_backlog(c); /* the mailbox has room again */
    if (err) announce_failed_locked(c, err);
  }
  if (type == RD_DATA) {
    b->got = size;
  } else if (r->result == FAB_OK && !c->closing) {
    char msg[320];
    snprintf(msg, sizeof(msg),
             "receive of %zu bytes (tag %d) from %s was truncated: the peer sent a larger message (%u bytes); a send "
             "must not be larger than its receive",
             b->size, b->ctrl.tag, c->peer_name, size);
    r->result = FAB_ERR_INVALID_USAGE;
    r->errmsg = strdup(msg);
  }
  sub_set(b, RD_SUB_DONE);
  fab_req_op_done(r, 1);
}

/* Buffers not announced yet will never receive anything: they end now. */
static void drop_backlog(fab_comm* c, fab_req* only) {
  rd_rcomm* rc = rd_r(c);
  uint32_t kept = 0, len = backlog_len(rc);
  for (uint32_t k = 0; k < len; k++) {
    rd_backlog_entry e = rc->backlog[k];
    if (only && e.r != only) {
      rc->backlog[kept++] = e;
      continue;
    }
    if (e.r->result == FAB_OK) e.r->result = c->error != FAB_OK ? c->error : FAB_ERR_SYSTEM;
    sub_set(&rd_rq(e.r)->sub[e.sub], RD_SUB_DONE);
    fab_req_op_done(e.r, 1);
  }
  atomic_store_explicit(&rc->nbacklog, kept, memory_order_release);
}

/* Close (ep lock held): every receive ends now, announced ones too, so the
 * comm is freed at once. A write the peer still makes for an announced
 * buffer lands in that buffer (it stays writable for the peer until it is
 * deregistered, as with any RDMA transport) and its completion names a
 * connection that no longer exists: it is ignored. */
void rd_recv_cancel(fab_comm* c) {
  drop_backlog(c, NULL);
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  for (uint32_t i = 0; i < used; i++) {
    fab_req* r = fab_pool_at(&c->reqs, i);
    if (r->magic != FAB_REQ_MAGIC || r->state == FAB_REQ_FREE) continue;
    for (int k = 0; k < r->n; k++) {
      rd_rsub* b = &rd_rq(r)->sub[k];
      if (sub_get(b) == RD_SUB_DONE || sub_get(b) == RD_SUB_IDLE) continue;
      sub_set(b, RD_SUB_DONE);
      fab_req_op_done(r, 1);
    }
  }
}
void rd_recv_give_up(fab_req* r) {
  pthread_mutex_lock(&r->comm->ep->lock);
  drop_backlog(r->comm, r);
  pthread_mutex_unlock(&r->comm->ep->lock);
}
