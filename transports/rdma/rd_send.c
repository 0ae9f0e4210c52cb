/* The rdma transport's sending side: consume announcements, match sends to
 * them, write the data. See rd.h. */
#include <stdio.h>
#include <string.h>

#include "rd.h"

static void write_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_req* r = op->owner;
  if (FAB_UNLIKELY(err != NULL)) fab_req_op_failed(r, r->size, r->tag, err);
  fab_req_op_done(r, 0);
}

void rd_send_init_req(fab_comm* c, fab_req* r) { fab_op_init_unlocked(&rd_sq(r)->op, write_done, r, 0); }

void rd_send_landed(fab_comm* c, uint32_t entry) {
  if (entry >= RD_SLOTS) {
    rd_protocol_error(c, "an announcement names a mailbox entry out of range");
    return;
  }
  atomic_store_explicit(&rd_s(c)->landed[entry], 1, memory_order_release);
}

/* Moves landed announcements, in index order, to the announced list. 0, or
 * -1 after a protocol error. */
static int consume(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  for (;;) {
    uint32_t i = s->next_index, entry = i % RD_SLOTS;
    if (!atomic_load_explicit(&s->landed[entry], memory_order_acquire)) return 0;
    rd_ctrl e = s->box[entry];
    atomic_store_explicit(&s->landed[entry], 0, memory_order_relaxed);
    if (e.index != i || e.check != (i ^ RD_CTRL_MAGIC) || (e.slot >> 3) >= RD_RECV_REQS ||
        (e.slot & 7) >= FAB_MAX_RECVS || e.size > c->max_bytes || s->nann >= RD_SLOTS) {
      pthread_mutex_lock(&c->ep->lock);
      rd_protocol_error(c, "a malformed buffer announcement (wrong number, checksum, slot or size)");
      pthread_mutex_unlock(&c->ep->lock);
      return -1;
    }
    s->ann[s->nann++] = (rd_ann){.win = {.addr = e.addr, .len = e.size, .key = e.key},
                                 .index = e.index, .tag = e.tag, .slot = e.slot};
    s->next_index = i + 1;
  }
}

/* Takes the first announced buffer with tag into *out; 0 when there is none. */
static int take(rd_scomm* s, int tag, rd_ann* out) {
  for (uint32_t k = 0; k < s->nann; k++) {
    if (s->ann[k].tag != tag) continue;
    *out = s->ann[k];
    memmove(&s->ann[k], &s->ann[k + 1], (s->nann - k - 1) * sizeof(rd_ann));
    s->nann--;
    return 1;
  }
  return 0;
}

/* The buffer is too small: nothing is written; the send fails, and the
 * receive learns it from a TRUNC notice. */
static ssize_t refuse_truncated(fab_comm* c, fab_req* r) {
  rd_ann* t = &rd_sq(r)->target;
  char msg[320];
  snprintf(msg, sizeof(msg),
           "send of %zu bytes (tag %d) to %s was refused: the receive posted for it has only %llu bytes; a send must "
           "not be larger than its receive",
           r->size, r->tag, c->peer_name, (unsigned long long)t->win.len);
  uint32_t size = r->size > UINT32_MAX ? UINT32_MAX : (uint32_t)r->size;
  ssize_t rc = fab_rma_inject_writedata(c->ep, c->peer, NULL, 0, &t->win, 0,
                                        rd_cq_data(RD_TRUNC, c->peer_id, t->slot, size));
  if (rc == -FI_EAGAIN) return rc;
  r->result = FAB_ERR_INVALID_USAGE;
  r->errmsg = strdup(msg);
  fab_req_op_done(r, 0);
  return 0;
}

/* Posts the write of a matched send: 0 (posted or done), -FI_EAGAIN, or an
 * error (the request failed). */
static ssize_t post(fab_comm* c, fab_req* r) {
  rd_sreq* q = rd_sq(r);
  if (FAB_UNLIKELY(r->size > q->target.win.len)) return refuse_truncated(c, r);
  uint64_t data = rd_cq_data(RD_DATA, c->peer_id, q->target.slot, (uint32_t)r->size);
  ssize_t rc;
  if (r->size <= c->ep->dev->inject_size) {
    rc = fab_rma_inject_writedata(c->ep, c->peer, q->data, r->size, &q->target.win, 0, data);
    if (rc == 0) fab_req_op_done(r, 0); /* the buffer is reusable at once */
  } else {
    rc = fab_rma_writedata(c->ep, c->peer, q->data, r->size, q->desc, &q->target.win, 0, data, &q->op);
  }
  if (FAB_LIKELY(rc == 0) || rc == -FI_EAGAIN) return rc;
  char msg[320];
  snprintf(msg, sizeof(msg), "send of %zu bytes (tag %d) to %s: posting the RDMA write failed: %s", r->size, r->tag,
           c->peer_name, fi_strerror((int)-rc));
  r->result = fab_result_from_fi((int)-rc);
  r->errmsg = strdup(msg);
  fab_req_op_done(r, 0);
  return rc;
}

/* Matches and posts waiting sends in order. A send of a tag never overtakes
 * an earlier one of the same tag: the earlier takes the earlier buffer. */
void rd_send_progress(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  if (consume(c) != 0 || s->nwait == 0) return;
  uint32_t kept = 0;
  for (uint32_t k = 0; k < s->nwait; k++) {
    fab_req* r = s->wait[k];
    rd_sreq* q = rd_sq(r);
    if (!q->matched) q->matched = take(s, r->tag, &q->target);
    if (q->matched && post(c, r) != -FI_EAGAIN) continue;
    s->wait[kept++] = r;
  }
  s->nwait = kept;
}

fab_result rd_isend(fab_comm* c, void* data, size_t size, int tag, fab_mr* mr, void** request) {
  rd_scomm* s = rd_s(c);
  *request = NULL;
  if (FAB_UNLIKELY(s->nwait >= RD_SEND_REQS)) return FAB_OK;
  fab_req* r = fab_req_get(c, FAB_REQ_SEND, 1, 1);
  if (FAB_UNLIKELY(!r)) return FAB_OK; /* all requests in flight: NCCL retries */
  rd_sreq* q = rd_sq(r);
  r->size = size;
  r->tag = tag;
  q->data = data;
  q->desc = mr ? mr->desc : NULL;
  q->matched = 0;
  if (consume(c) != 0) {
    fab_req_put(r);
    FAB_WARN("isend of %zu bytes (tag %d) to %s: %s", size, tag, c->peer_name, c->error_why);
    return c->error;
  }
  if (s->nwait == 0 && take(s, tag, &q->target)) {
    q->matched = 1;
    ssize_t rc = post(c, r);
    if (FAB_LIKELY(rc != -FI_EAGAIN)) {
      *request = r; /* done, posted, or failed: test reports which */
      return FAB_OK;
    }
  }
  s->wait[s->nwait++] = r;
  *request = r;
  return FAB_OK;
}

/* Sends not posted yet end with the comm (close) or its failure. */
static void drop_waiting(fab_comm* c, fab_req* only) {
  rd_scomm* s = rd_s(c);
  uint32_t kept = 0;
  for (uint32_t k = 0; k < s->nwait; k++) {
    fab_req* r = s->wait[k];
    if (only && r != only) {
      s->wait[kept++] = r;
      continue;
    }
    if (r->result == FAB_OK) r->result = c->error != FAB_OK ? c->error : FAB_ERR_SYSTEM;
    fab_req_op_done(r, 0);
  }
  s->nwait = kept;
}

void rd_send_cancel(fab_comm* c) { drop_waiting(c, NULL); }
void rd_send_give_up(fab_req* r) { drop_waiting(r->comm, r); }
