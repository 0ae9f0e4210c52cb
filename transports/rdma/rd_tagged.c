/*
 * The rdma transport's asked announcements (FABRIC_TAGGED_MAX > 0): a small
 * message is one tagged message into its posted receive, as raw libfabric
 * would send it, and a receive is announced only when its sender asks (a
 * request-to-send for a larger message), so that a small message costs one
 * provider message and no announcement, and a large one is still written
 * straight into its buffer. See rd.h.
 *
 * Matching: the receiver posts every buffer as a tagged receive with its
 * connection's data tag (as the sendrecv transport does), the sender sends
 * every message's tagged part (the data, or the request-to-send) in send
 * order, and the provider pairs them in order (FI_ORDER_SAS, first posted
 * receive with the tag): the k-th send with a tag meets the k-th buffer
 * with that tag, which is the pair the ordinals name. A request-to-send is
 * told from data by its remote CQ data; it carries no bytes, so it never
 * touches the buffer (GPU memory included).
 *
 * Truncation: a tagged receive carries the domain's sink after its buffer
 * where there is one (fab_domain.sink), so an oversized small message is
 * caught here and its sender told; a large one is refused by its sender, who
 * knows the announced size, as before.
 *
 * Everything here runs under the endpoint lock: receive completions are
 * locked operations, and sends are posted by isend or by whichever thread
 * posts waiting sends.
 */
#include <stdio.h>
#include <string.h>

#include "rd.h"

/* --- sender ---------------------------------------------------------------------- */

/* Its tagged message (rd_tag_word: the kind, and how far we consumed
 * announcements): the data, or 0 bytes for a request-to-send or a mark,
 * which nothing completes. Data of host memory that fits the provider's
 * inject size goes inline (fab_dev_tagged_inline): RD_WENT_INLINE. */
static ssize_t post_tsend(fab_comm* c, rd_sreq* q, size_t size, uint64_t tag) {
  unsigned kind = q->ts == RD_TS_DATA   ? RD_TAG_DATA
                  : q->ts == RD_TS_RTS  ? RD_TAG_RTS
                  : q->ts == RD_TS_MARK ? RD_TAG_MARK
                                        : RD_TAG_ABANDON;
  uint64_t data = rd_tag_word(kind, rd_s(c)->next_index);
  ssize_t rc;
  int inline_data = kind == RD_TAG_DATA && q->host && fab_dev_tagged_inline(c->ep->dev, size);
  int held = fab_ep_serial_enter(c->ep); /* local-only providers: not while another thread progresses (fab_engine.h) */
  if (kind == RD_TAG_DATA && !inline_data)
    rc = fi_tsenddata(c->ep->ep, q->data, size, q->desc, data, c->peer, tag, &q->op.ctx);
  else
    rc = fi_tinjectdata(c->ep->ep, inline_data ? q->data : NULL, inline_data ? size : 0, data, c->peer, tag);
  fab_ep_serial_leave(c->ep, held);
  return rc == 0 && inline_data ? RD_WENT_INLINE : rc;
}

ssize_t rd_tagged_send(fab_comm* c, fab_req* r) {
  rd_sreq* q = rd_sq(r);
  rd_scomm* s = rd_s(c);
  uint32_t weight = rd_tagged_weight(q->ts == RD_TS_DATA ? r->size : 0);
  if (s->tcredits < weight) return -FI_EAGAIN; /* the receiver holds as much untaken as it allows */
  ssize_t rc = post_tsend(c, q, r->size, c->tag_base | (uint32_t)r->tag);
  if (rc < 0) return rc;
  s->tcredits -= weight;
  s->tsent += weight;
  if (q->ts == RD_TS_DATA) return rc; /* its completion ends it (write_done), or it went inline */
  if (q->ts == RD_TS_RTS) q->ts = RD_TS_ASKED;
  else if (q->ts == RD_TS_MARK) q->ts = RD_TS_MARKED;
  return 1;
}

void rd_tagged_credits(fab_comm* c, uint32_t n) {
  rd_scomm* s = rd_s(c);
  if (n > RD_TAGGED_CREDITS - s->tcredits) {
    rd_protocol_error(c, "the receiver gave back more tagged credits than were used");
    return;
  }
  s->tcredits += n;
}

/* Credits come back in the order the receiver took messages: once all of
 * them are back, it took every message. Until then, over kernel sockets
 * (one_stream), one not taken may still sit in our socket or unread in the
 * receiver's, and a send completed when its bytes entered ours. Elsewhere a
 * send completes once the peer's side has it. */
uint64_t rd_tagged_unproven(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  if (!c->ep->dev->one_stream || s->tcredits == RD_TAGGED_CREDITS) return 0;
  return s->tsent;
}

/* --- receiver -------------------------------------------------------------------- */

int rd_tagged_confirm_due(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  if (!atomic_load_explicit(&rc->confirm_owed, memory_order_relaxed)) return 0;
  return __atomic_load_n(&rc->listening, __ATOMIC_RELAXED) == 0 ||
         fab_now_ms() - __atomic_load_n(&rc->owed_since_ms, __ATOMIC_RELAXED) >= RD_CONFIRM_HOLD_MS;
}

/* The credits of the messages taken, in one CTRL write: 0, or the
 * provider's error (retried at the next message taken, or the next test:
 * rd_recv_progress). */
static ssize_t write_credits(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  uint64_t data = rd_cq_data(c, RD_CTRL, 0, RD_NO_ENTRY | (uint32_t)rc->credits << 16);
  ssize_t n = fab_remote_ctl_write(c, &rd_scratch_word, sizeof(rd_scratch_word), &rc->box,
                                   RD_SLOTS * sizeof(rd_ctrl), data);
  if (n != 0) return n;
  rc->credits = 0;
  atomic_store_explicit(&rc->confirm_owed, 0, memory_order_relaxed);
  return 0;
}

/* Once half the credits wait, or when a confirmation is due (its sender may
 * be waiting to close). */
void rd_tagged_give_back(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  if (rc->credits == 0 || c->closing || c->error != FAB_OK) /* gone with an announcement, or moot */
    atomic_store_explicit(&rc->confirm_owed, 0, memory_order_relaxed);
  if (rc->credits < RD_TAGGED_CREDITS / 2 && !rd_tagged_confirm_due(c)) return;
  if (c->closing || c->error != FAB_OK) return;
  write_credits(c);
}

/* A confirmation owed goes now, whatever receives are still posted: the
 * sender then needs no delivery probe for it (a receiver closing without one
 * owed tells its sender so with its closed note, fab_delivery.c). */
void rd_tagged_confirm_at_close(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  if (!atomic_load_explicit(&rc->confirm_owed, memory_order_relaxed) || rc->credits == 0 || c->error != FAB_OK)
    return;
  if (write_credits(c) != 0)
    atomic_store_explicit(&rc->confirm_owed, 0, memory_order_relaxed); /* its sender asks with its probe */
}

void rd_tagged_taken(fab_comm* c, size_t len) {
  rd_rcomm* rc = rd_r(c);
  uint32_t weight = rd_tagged_weight(len);
  rc->credits += (uint16_t)weight;
  if (rd_tagged_confirms(c, weight) && !atomic_load_explicit(&rc->confirm_owed, memory_order_relaxed)) {
    __atomic_store_n(&rc->owed_since_ms, fab_now_ms(), __ATOMIC_RELAXED);
    atomic_store_explicit(&rc->confirm_owed, 1, memory_order_relaxed);
  }
  rd_tagged_give_back(c);
}

ssize_t rd_tagged_listen(fab_comm* c, rd_rsub* b) {
  fab_domain* dom = c->ep->dev->dom;
  uint64_t tag = c->tag_base | (uint32_t)b->ctrl.tag;
  void* desc = b->mr ? b->mr->desc : NULL;
  ssize_t rc;
  atomic_store_explicit(&b->state, RD_SUB_LISTENING, memory_order_relaxed);
  __atomic_store_n(&rd_r(c)->listening, rd_r(c)->listening + 1, __ATOMIC_RELAXED);
  int held = fab_ep_serial_enter(c->ep);
  if (!dom->sink) {
    rc = fi_trecv(c->ep->ep, b->data, b->size, desc, FI_ADDR_UNSPEC, tag, 0, &b->op.ctx);
  } else {
    struct iovec iov[2] = {{.iov_base = b->data, .iov_len = b->size}, {.iov_base = dom->sink, .iov_len = dom->sink_len}};
    void* descs[2] = {desc, NULL};
    struct fi_msg_tagged msg = {.msg_iov = iov, .desc = descs, .iov_count = 2, .addr = FI_ADDR_UNSPEC, .tag = tag,
                                .context = &b->op.ctx};
    rc = fi_trecvmsg(c->ep->ep, &msg, FI_COMPLETION);
  }
  fab_ep_serial_leave(c->ep, held);
  if (rc != 0) {
    atomic_store_explicit(&b->state, RD_SUB_UNPOSTED, memory_order_relaxed);
    __atomic_store_n(&rd_r(c)->listening, rd_r(c)->listening - 1, __ATOMIC_RELAXED);
  }
  return rc;
}

void rd_tagged_unlisten(fab_comm* c, rd_rsub* b) {
  int held = fab_ep_serial_enter(c->ep);
  fi_cancel(&c->ep->ep->fid, &b->op.ctx); /* a receive already matched completes as usual */
  fab_ep_serial_leave(c->ep, held);
}
