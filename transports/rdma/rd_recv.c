/* The rdma transport's receiving side: number and announce buffers, and
 * complete them as the sender's writes land (data, eager messages, TRUNC
 * notices). See rd.h. Everything here runs with the endpoint lock held: the
 * remote-data handler, which completes buffers, runs under it too. */
#include <stdio.h>
#include <string.h>

#include "fab_cuda.h"
#include "rd.h"

static inline void sub_set(rd_rsub* b, int state) { atomic_store_explicit(&b->state, state, memory_order_relaxed); }

/* A buffer is done: it lets go of its registration. */
static inline void sub_finish(rd_rsub* b) {
  if (b->mr) fab_mr_unhold(b->mr);
  b->mr = NULL;
  sub_set(b, RD_SUB_DONE);
}
static inline int sub_get(rd_rsub* b) { return atomic_load_explicit(&b->state, memory_order_relaxed); }

/* What b waited for in `part` (RD_PART_*) is over; with nothing left, b is
 * done and so is its share of r. */
static void settle(fab_req* r, rd_rsub* b, uint8_t part) {
  b->parts &= (uint8_t)~part;
  if (b->parts) return;
  sub_finish(b);
  fab_req_op_done(r, 1);
}
static inline uint32_t backlog_len(rd_rcomm* rc) { return atomic_load_explicit(&rc->nbacklog, memory_order_acquire); }

static int may_announce(rd_rcomm* rc, uint32_t index) {
  return index - atomic_load_explicit(&rc->acked, memory_order_acquire) < RD_SLOTS;
}

/* Writes buffer b's announcement into the sender's mailbox, with the eager
 * slots to give back: 0, -FI_EAGAIN, or an error. */
static ssize_t announce(fab_comm* c, rd_rsub* b) {
  rd_rcomm* rc = rd_r(c);
  uint32_t entry = b->ctrl.index % RD_SLOTS;
  uint16_t credits = rc->credits; /* eager slots copied out: given back with this announcement */
  rc->credits = 0;
  b->ctrl.credits = credits;
  ssize_t n = fab_remote_ctl_write(c, &b->ctrl, sizeof(b->ctrl), &rc->box, (uint64_t)entry * sizeof(rd_ctrl),
                                rd_cq_data(c, RD_CTRL, 0, entry));
  if (n != 0) {
    rc->credits |= credits;
    b->ctrl.credits = 0;
    return n;
  }
  int waiting = RD_SUB_WAITING; /* an eager message may have completed it already: then it stays done */
  atomic_compare_exchange_strong(&b->state, &waiting, RD_SUB_ANNOUNCED);
  return 0;
}

/* Announces backlogged buffers in order while the mailbox has room, and
 * posts the tagged receives of those not posted yet (asked announcements):
 * 0 or an error (-FI_EAGAIN leaves them for later). */
static ssize_t flush_backlog(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  uint32_t done = 0, len = backlog_len(rc);
  ssize_t n = 0;
  while (done < len) {
    rd_backlog_entry* e = &rc->backlog[done];
    rd_rsub* b = &rd_rq(e->r)->sub[e->sub];
    if (sub_get(b) == RD_SUB_UNPOSTED && (e->r->result != FAB_OK || (b->mr && atomic_load_explicit(
                                                                          &b->mr->gone, memory_order_acquire)))) {
      settle(e->r, b, b->parts); /* failed while it waited (a deregistered buffer): never posted */
    } else if (sub_get(b) == RD_SUB_UNPOSTED) {
      n = rd_tagged_listen(c, b);
    } else {
      if (!may_announce(rc, b->ctrl.index)) break;
      n = announce(c, b);
    }
    if (n != 0) break;
    done++;
  }
  if (done) memmove(rc->backlog, rc->backlog + done, (len - done) * sizeof(*rc->backlog));
  atomic_store_explicit(&rc->nbacklog, len - done, memory_order_release);
  return n == -FI_EAGAIN ? 0 : n;
}

void rd_recv_announce_failed(fab_comm* c, ssize_t n) {
  char why[160];
  snprintf(why, sizeof(why), "announcing a receive buffer to the peer failed: %s", fi_strerror((int)-n));
  fab_comm_fail(c, fab_result_from_fi((int)-n), why);
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

/* --- the eager ring ------------------------------------------------------------------ */

/* A slot was copied out. Its credit goes back with the next announcement, or
 * now once a quarter of the ring waits for one. */
static void free_slot(fab_comm* c, uint32_t slot) {
  rd_rcomm* rc = rd_r(c);
  rc->credits |= (uint16_t)(1u << slot);
  if (__builtin_popcount(rc->credits) < RD_EAGER_SLOTS / 4) return;
  uint64_t data = rd_cq_data(c, RD_CTRL, 0, RD_NO_ENTRY | (uint32_t)rc->credits << 16);
  if (fab_remote_ctl_write(c, &rd_scratch_word, sizeof(rd_scratch_word), &rc->box, RD_SLOTS * sizeof(rd_ctrl),
                        data) == 0)
    rc->credits = 0;
}

static const char* slot_payload(rd_rcomm* rc, uint32_t slot) {
  return rc->ring + (size_t)slot * rc->slot_size + sizeof(rd_eager_hdr);
}

void rd_recv_eager_landed(fab_comm* c, uint32_t slot, uint32_t size) {
  rd_rcomm* rc = rd_r(c);
  if (slot == RD_ACK_SLOT) { /* the count mod 2^14 (rd_proto.h) */
    rd_recv_acked(c, rd_widen_count(size, atomic_load_explicit(&rc->acked, memory_order_relaxed)));
    return;
  }
  if (!rc->slot_size || slot >= RD_EAGER_SLOTS || (rc->ring_held >> slot & 1) ||
      size > rc->slot_size - sizeof(rd_eager_hdr)) {
    rd_protocol_error(c, "an eager message names a ring slot it has no credit for, or is too large");
    return;
  }
  rd_eager_hdr h;
  memcpy(&h, rc->ring + (size_t)slot * rc->slot_size, sizeof(h));
  if (h.check != rd_eager_check(&h) || h.size != size) {
    rd_protocol_error(c, "a malformed eager message");
    return;
  }
  rd_recv_acked(c, h.consumed);
  if (c->error != FAB_OK) return;
  fab_req* r;
  rd_rsub* b = rd_recv_find_open(c, h.tag, h.k, &r);
  if (!b) {
    rc->ring_held |= (uint16_t)(1u << slot); /* its receive is not posted yet */
    return;
  }
  rd_recv_complete(c, r, b, slot_payload(rc, slot), size);
  free_slot(c, slot);
}

/* A held message for b's (tag, k) goes into b; 1 when one did. */
static int take_held(fab_comm* c, fab_req* r, rd_rsub* b) {
  rd_rcomm* rc = rd_r(c);
  for (uint32_t slot = 0; rc->ring_held >> slot; slot++) {
    if (!(rc->ring_held >> slot & 1)) continue;
    rd_eager_hdr h;
    memcpy(&h, rc->ring + (size_t)slot * rc->slot_size, sizeof(h));
    if (h.tag != b->ctrl.tag || h.k != b->ctrl.k) continue;
    rc->ring_held &= (uint16_t)~(1u << slot);
    rd_recv_complete(c, r, b, slot_payload(rc, slot), h.size);
    free_slot(c, slot);
    return 1;
  }
  return 0;
}

/* Backlogs buffer i of r (its announcement or, asked announcements, its
 * tagged receive) behind those already waiting, and flushes what can go. */
static ssize_t backlog(fab_comm* c, fab_req* r, uint32_t i) {
  rd_rcomm* rc = rd_r(c);
  uint32_t len = backlog_len(rc);
  rc->backlog[len] = (rd_backlog_entry){r, i};
  atomic_store_explicit(&rc->nbacklog, len + 1, memory_order_release);
  return flush_backlog(c);
}

ssize_t rd_recv_announce(fab_comm* c, fab_req* r, uint32_t i) {
  rd_rcomm* rc = rd_r(c);
  rd_rsub* b = &rd_rq(r)->sub[i];
  sub_set(b, RD_SUB_WAITING);
  b->ctrl.index = rc->next_index++;
  b->ctrl.check = b->ctrl.index ^ b->ctrl.k ^ RD_CTRL_MAGIC;
  ssize_t n = -FI_EAGAIN;
  if (backlog_len(rc) == 0 && may_announce(rc, b->ctrl.index)) n = announce(c, b);
  return n == -FI_EAGAIN ? backlog(c, r, i) : n;
}

/* Asked announcements, while the last message was written: buffer b (its
 * tagged receive posted) is announced at once as well, so that a large
 * message is written without asking. Only with room in the mailbox: else it
 * stays a tagged receive alone. */
static void announce_ahead(fab_comm* c, rd_rsub* b) {
  rd_rcomm* rc = rd_r(c);
  if (!may_announce(rc, rc->next_index)) return;
  b->ctrl.index = rc->next_index;
  b->ctrl.check = b->ctrl.index ^ b->ctrl.k ^ RD_CTRL_MAGIC;
  sub_set(b, RD_SUB_WAITING);
  if (announce(c, b) != 0) {
    sub_set(b, RD_SUB_LISTENING);
    return;
  }
  rc->next_index++;
  b->parts |= RD_PART_WRITE;
}

/* Asked announcements: buffer i of r waits for its message or its sender's
 * request, as a tagged receive posted in order. */
static ssize_t listen_buffer(fab_comm* c, fab_req* r, uint32_t i) {
  rd_rsub* b = &rd_rq(r)->sub[i];
  b->via_tag = 0;
  b->parts = RD_PART_TAGGED;
  sub_set(b, RD_SUB_UNPOSTED);
  ssize_t n = backlog_len(rd_r(c)) == 0 ? rd_tagged_listen(c, b) : -FI_EAGAIN;
  if (n == -FI_EAGAIN) return backlog(c, r, i);
  if (n == 0 && rd_r(c)->ahead) announce_ahead(c, b);
  return n;
}

/* Numbers buffer i of r (per tag, and among announced ones) and takes a held
 * eager message for it, or announces it (or backlogs it); under asked
 * announcements, posts its tagged receive instead. */
static ssize_t post_buffer(fab_comm* c, fab_req* r, int i, void* data, size_t size, int tag, fab_mr* mr) {
  rd_rcomm* rc = rd_r(c);
  rd_rsub* b = &rd_rq(r)->sub[i];
  int64_t k = fab_tagmap_take(&rc->posted, tag);
  if (k < 0) return -FI_ENOMEM;
  b->data = data;
  b->size = size;
  b->got = 0;
  b->eager = 0;
  b->mr = mr;
  fab_mr_hold(mr);
  b->ctrl = (rd_ctrl){.addr = fab_mr_remote_addr(mr, data), .key = mr->key, .size = size, .tag = tag,
                      .k = (uint32_t)k, .slot = (uint16_t)(r->pool_index << 3 | (uint32_t)i)};
  if (rc->asked) return listen_buffer(c, r, (uint32_t)i);
  b->parts = RD_PART_WRITE;
  sub_set(b, RD_SUB_WAITING);
  if (rc->ring_held && take_held(c, r, b)) return 0; /* its message came first: no announcement */
  return rd_recv_announce(c, r, (uint32_t)i);
}

fab_result rd_irecv(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, fab_mr** mrs,
                    void** request) {
  *request = NULL;
  fab_result frc = check_registered(c, n, mrs);
  if (FAB_UNLIKELY(frc != FAB_OK)) return frc;
  fab_req* r = fab_req_get(c, FAB_REQ_RECV, n, n);
  if (FAB_UNLIKELY(!r)) return FAB_OK;
  atomic_store_explicit(&rd_rq(r)->gone_gen, atomic_load_explicit(&fab_mr_generation, memory_order_acquire),
                        memory_order_relaxed);
  r->size = sizes[0];
  r->tag = tags[0];
  ssize_t err = 0;
  pthread_mutex_lock(&c->ep->lock);
  for (int i = 0; i < n; i++) {
    fab_req_sized_recv(r, sizes[i]); /* before its post: a rail's thread polls for a large one */
    ssize_t e = post_buffer(c, r, i, data[i], sizes[i], tags[i], mrs[i]);
    if (e && !err) err = e;
  }
  if (err) rd_recv_announce_failed(c, err);
  pthread_mutex_unlock(&c->ep->lock);
  *request = r; /* even after a failure: its announced buffers belong to it */
  if (!err) return FAB_OK;
  FAB_WARN("irecv from %s: %s", c->peer_name, c->error_why);
  return c->error;
}

void rd_recv_progress(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  /* credits: read without the lock as a hint (a give-back that could not be written is retried here) */
  int give_back =
      rc->asked && (__atomic_load_n(&rc->credits, __ATOMIC_RELAXED) >= RD_TAGGED_CREDITS / 2 || rd_tagged_confirm_due(c));
  if (FAB_LIKELY(backlog_len(rc) == 0 && !give_back)) return;
  pthread_mutex_lock(&c->ep->lock);
  ssize_t err = backlog_len(rc) ? flush_backlog(c) : 0;
  if (err) rd_recv_announce_failed(c, err);
  if (give_back) rd_tagged_give_back(c);
  pthread_mutex_unlock(&c->ep->lock);
}

void rd_recv_acked(fab_comm* c, uint32_t consumed) {
  rd_rcomm* rc = rd_r(c);
  if ((int32_t)(consumed - rc->next_index) > 0) {
    rd_protocol_error(c, "the peer acknowledges announcements never made");
    return;
  }
  if ((int32_t)(consumed - atomic_load_explicit(&rc->acked, memory_order_relaxed)) > 0)
    atomic_store_explicit(&rc->acked, consumed, memory_order_release);
  if (backlog_len(rc) && !c->closing) {
    ssize_t err = flush_backlog(c); /* the mailbox has room again */
    if (err) rd_recv_announce_failed(c, err);
  }
}

/* An eager message's bytes into its buffer: a CPU copy, or the driver's for
 * GPU memory. 0, or -1 after setting r's error. */
static int copy_out(fab_comm* c, fab_req* r, rd_rsub* b, const void* src, uint32_t size) {
  if (!b->mr || b->mr->type != FAB_PTR_CUDA) {
    memcpy(b->data, src, size);
    return 0;
  }
  const char* what;
  int rc = fab_cuda_copy_to_device(b->data, src, size, &what);
  if (rc == 0) return 0;
  if (r->result == FAB_OK) {
    char msg[256];
    snprintf(msg, sizeof(msg), "receive of %u bytes (tag %d) from %s into GPU memory: %s failed (CUresult %d)", size,
             b->ctrl.tag, c->peer_name, what, rc);
    r->result = FAB_ERR_CUDA;
    r->errmsg = strdup(msg);
  }
  return -1;
}

void rd_recv_complete(fab_comm* c, fab_req* r, rd_rsub* b, const void* src, uint32_t size) {
  b->eager = src != NULL;
  fab_comm_recv_seen(c, size);
  if (size <= b->size) {
    if (src && size) copy_out(c, r, b, src, size);
    b->got = size;
  } else if (r->result == FAB_OK && !c->closing) {
    char msg[320], size_note[32] = ""; /* the narrow CQ data format does not carry a refused size */
    if (size != RD_SIZE_UNKNOWN) snprintf(size_note, sizeof(size_note), " (%u bytes)", size);
    snprintf(msg, sizeof(msg),
             "receive of %zu bytes (tag %d) from %s was truncated: the peer sent a larger message%s; a send must not "
             "be larger than its receive",
             b->size, b->ctrl.tag, c->peer_name, size_note);
    r->result = FAB_ERR_INVALID_USAGE;
    r->errmsg = strdup(msg);
    fab_comm_truncated(c);
    if (src) /* an eager write: its sender never saw this buffer's size */
      fab_comm_tell_truncated(c, b->ctrl.tag, b->size, size == RD_SIZE_UNKNOWN ? 0 : size - b->size);
  }
  settle(r, b, RD_PART_WRITE);
}

/* The sender gave the message for b up before writing it (its buffer was
 * deregistered while the send waited): the receive fails with its account. */
static void abandoned(fab_comm* c, fab_req* r, rd_rsub* b, uint8_t parts) {
  if (r->result == FAB_OK && !c->closing) {
    char msg[320];
    snprintf(msg, sizeof(msg),
             "receive of %zu bytes (tag %d) from %s failed: the sender gave its message up before writing it (its "
             "buffer was deregistered while the send waited); the peer's log says more",
             b->size, b->ctrl.tag, c->peer_name);
    r->result = FAB_ERR_REMOTE;
    r->errmsg = strdup(msg);
  }
  settle(r, b, parts);
}

/* --- tagged receives (asked announcements) ------------------------------------------ */

/* A small message larger than its buffer spilled into the sink: the receive
 * fails as a truncation would, its sender is told, the sink's pages go back. */
static void overflowed(fab_comm* c, fab_req* r, rd_rsub* b, size_t got) {
  struct fi_cq_err_entry e = {.err = FI_ETRUNC, .len = b->size, .olen = got - b->size};
  b->got = fab_req_op_failed(r, b->size, b->ctrl.tag, &e);
  fab_domain_sink_release(c->ep->dev->dom);
}

/* A request-to-send took b: it is announced now (asked), or already was
 * (ahead: the write comes). */
static void asked_for(fab_comm* c, fab_req* r, uint32_t i, rd_rsub* b) {
  rd_r(c)->ahead = 1;
  if (sub_get(b) == RD_SUB_ANNOUNCED) {
    settle(r, b, RD_PART_TAGGED);
    return;
  }
  if (c->closing || c->error != FAB_OK || r->result != FAB_OK) {
    if (r->result == FAB_OK) r->result = c->error != FAB_OK ? c->error : FAB_ERR_SYSTEM;
    settle(r, b, b->parts);
    return;
  }
  b->parts = RD_PART_WRITE;
  ssize_t n = rd_recv_announce(c, r, i);
  if (n) rd_recv_announce_failed(c, n);
}

/* A small message landed in b by its tagged receive: the write an
 * announcement ahead waited for never comes (its sender drops it). */
static void tagged_data(fab_comm* c, fab_req* r, rd_rsub* b, size_t len) {
  rd_r(c)->ahead = 0;
  b->via_tag = 1;
  fab_comm_recv_seen(c, len);
  if (FAB_UNLIKELY(len > b->size)) overflowed(c, r, b, len);
  else b->got = len;
  settle(r, b, b->parts);
}

/* A tagged receive completed: a small message, a request-to-send, a mark
 * (the sender writes into the buffer announced ahead), or a cancellation
 * (close, a deregistered buffer). Every message of ours says its kind and
 * how far its sender consumed announcements in its CQ data. ep lock held. */
static void listened(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_req* r = op->owner;
  fab_comm* c = r->comm;
  rd_rsub* b = &rd_rq(r)->sub[op->index];
  __atomic_store_n(&rd_r(c)->listening, rd_r(c)->listening - 1, __ATOMIC_RELAXED);
  if (FAB_UNLIKELY(err != NULL)) {
    size_t got = fab_req_op_failed(r, b->size, b->ctrl.tag, err);
    if (!(b->parts & RD_PART_WRITE)) b->got = got;
    settle(r, b, b->parts);
    return;
  }
  uint32_t w = (uint32_t)done->data;
  unsigned kind = w >> 14 & 3;
  if (!(done->flags & FI_REMOTE_CQ_DATA) || (kind == RD_TAG_MARK && sub_get(b) != RD_SUB_ANNOUNCED) ||
      (kind != RD_TAG_DATA && done->len != 0) || done->len > rd_r(c)->tagged_max) {
    rd_protocol_error(c, "a tagged message of an unknown kind or above its sender's FABRIC_TAGGED_MAX, or a mark "
                         "for a buffer not announced");
    settle(r, b, b->parts);
    return;
  }
  rd_tagged_taken(c, done->len);
  rd_recv_acked(c, rd_widen_count(w & 0x3fff, atomic_load_explicit(&rd_r(c)->acked, memory_order_relaxed)));
  if (kind == RD_TAG_DATA) tagged_data(c, r, b, done->len);
  else if (kind == RD_TAG_RTS) asked_for(c, r, op->index, b);
  else if (kind == RD_TAG_MARK) settle(r, b, RD_PART_TAGGED);
  else abandoned(c, r, b, b->parts); /* its send failed before it went: nothing will be written either */
}

void rd_recv_init_req(fab_comm* c, fab_req* r) {
  for (uint32_t i = 0; i < FAB_MAX_RECVS; i++) fab_op_init(&rd_rq(r)->sub[i].op, listened, r, i);
}

/* The requests of c in use (posted or orphaned), one per call from *i on:
 * for (uint32_t i = 0; (r = next_in_use(c, &i));) */
static fab_req* next_in_use(fab_comm* c, uint32_t* i) {
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  while (*i < used) {
    fab_req* r = fab_pool_at(&c->reqs, (*i)++);
    if (r->head.magic == FAB_REQ_MAGIC && r->head.state != FAB_REQ_FREE) return r;
  }
  return NULL;
}

rd_rsub* rd_recv_find_open(fab_comm* c, int32_t tag, uint32_t k, fab_req** out) {
  fab_req* r;
  for (uint32_t i = 0; (r = next_in_use(c, &i));) {
    for (int j = 0; j < r->n; j++) {
      rd_rsub* b = &rd_rq(r)->sub[j];
      int st = sub_get(b);
      if ((st == RD_SUB_WAITING || st == RD_SUB_ANNOUNCED) && b->ctrl.tag == tag && b->ctrl.k == k) {
        *out = r;
        return b;
      }
    }
  }
  return NULL;
}

/* The sender wrote (DATA) or refused to write (TRUNC) the buffer named by
 * slot. Every field of the peer's CQ data is checked against what we
 * announced. */
void rd_recv_landed(fab_comm* c, unsigned type, uint32_t slot, uint32_t size) {
  uint32_t idx = slot >> 3, k = slot & 7;
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  fab_req* r = idx < used ? fab_pool_at(&c->reqs, idx) : NULL;
  if (!r || r->head.magic != FAB_REQ_MAGIC || r->head.state == FAB_REQ_FREE || k >= r->n) {
    rd_protocol_error(c, "a write names a receive that is not posted");
    return;
  }
  rd_rsub* b = &rd_rq(r)->sub[k];
  if (sub_get(b) != RD_SUB_ANNOUNCED || !(b->parts & RD_PART_WRITE)) {
    rd_protocol_error(c, "a write names a buffer that was not announced or is already complete");
    return;
  }
  if (type == RD_DATA && size > b->size) {
    rd_protocol_error(c, "a write larger than the buffer announced for it");
    return;
  }
  if (type == RD_TRUNC && size != 0 && size <= b->size) {
    rd_protocol_error(c, "a truncation notice for a message that fits its buffer");
    return;
  }
  uint32_t next = b->ctrl.index + 1; /* the sender consumed every announcement up to this one */
  if ((int32_t)(next - atomic_load_explicit(&rd_r(c)->acked, memory_order_relaxed)) > 0)
    atomic_store_explicit(&rd_r(c)->acked, next, memory_order_release);
  if (rd_r(c)->asked && type == RD_DATA) rd_r(c)->ahead = size > rd_r(c)->tagged_max;
  if (type == RD_TRUNC && size == 0) { /* ABANDONED: its send failed at the sender */
    abandoned(c, r, b, RD_PART_WRITE);
    return;
  }
  rd_recv_complete(c, r, b, NULL, size);
  if (backlog_len(rd_r(c)) && !c->closing) {
    ssize_t err = flush_backlog(c); /* the mailbox has room again */
    if (err) rd_recv_announce_failed(c, err);
  }
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
    rd_rsub* b = &rd_rq(e.r)->sub[e.sub];
    if (sub_get(b) == RD_SUB_DONE) continue; /* an eager message completed it */
    if (e.r->result == FAB_OK) e.r->result = c->error != FAB_OK ? c->error : FAB_ERR_SYSTEM;
    settle(e.r, b, b->parts); /* its tagged receive is not posted, or took its request-to-send */
  }
  atomic_store_explicit(&rc->nbacklog, kept, memory_order_release);
}

/* Close: every receive ends now, announced ones too, so the comm is freed at
 * once. A write the peer still makes for an announced buffer lands in that
 * buffer (it stays writable for the peer until it is deregistered, as with
 * any RDMA transport) and its completion names a connection that no longer
 * exists: it is ignored. */
void rd_recv_cancel(fab_comm* c) {
  rd_tagged_confirm_at_close(c);
  drop_backlog(c, NULL);
  fab_req* r;
  for (uint32_t i = 0; (r = next_in_use(c, &i));) {
    for (int k = 0; k < r->n; k++) {
      rd_rsub* b = &rd_rq(r)->sub[k];
      int st = sub_get(b);
      if (st == RD_SUB_DONE || st == RD_SUB_IDLE || st == RD_SUB_UNPOSTED) continue; /* UNPOSTED: the backlog */
      if (b->parts & RD_PART_TAGGED) rd_tagged_unlisten(c, b); /* the provider holds it: its cancellation ends it */
      if (b->parts & RD_PART_WRITE) settle(r, b, RD_PART_WRITE);
    }
  }
}

void rd_recv_give_up(fab_req* r) {
  pthread_mutex_lock(&r->comm->ep->lock);
  drop_backlog(r->comm, r);
  pthread_mutex_unlock(&r->comm->ep->lock);
}

/* test of r: a buffer whose registration was deregistered while it was
 * announced can never be written (the provider refuses the key): it fails.
 * Looked at only when a deregistration happened since the last look (the
 * generation moves after gone is set), and under the endpoint lock: another
 * thread's progress may complete the buffer and drop its registration (the
 * last hold frees it) at any time. */
void rd_recv_check_gone(fab_comm* c, fab_req* r) {
  rd_rreq* q = rd_rq(r);
  uint64_t gen = atomic_load_explicit(&fab_mr_generation, memory_order_acquire);
  if (FAB_LIKELY(gen == atomic_load_explicit(&q->gone_gen, memory_order_relaxed))) return;
  pthread_mutex_lock(&c->ep->lock);
  atomic_store_explicit(&q->gone_gen, gen, memory_order_relaxed);
  for (int k = 0; k < r->n; k++) {
    rd_rsub* b = &q->sub[k];
    int st = sub_get(b);
    if (st == RD_SUB_DONE || !b->mr || !atomic_load_explicit(&b->mr->gone, memory_order_acquire)) continue;
    if (r->result == FAB_OK) {
      char msg[256];
      snprintf(msg, sizeof(msg), "receive of %zu bytes (tag %d) from %s failed: its buffer was deregistered while "
               "the receive was posted", b->size, b->ctrl.tag, c->peer_name);
      r->result = FAB_ERR_INVALID_USAGE;
      r->errmsg = strdup(msg);
    }
    if (st == RD_SUB_UNPOSTED) continue; /* in the backlog: posted later, and failed by its result then */
    if (b->parts & RD_PART_TAGGED) rd_tagged_unlisten(c, b); /* the provider holds it: its cancellation ends it */
    if (b->parts & RD_PART_WRITE) settle(r, b, RD_PART_WRITE);
  }
  pthread_mutex_unlock(&c->ep->lock);
}

/* The comm is freed (libfabric no longer references it): its buffers let go
 * of their registrations. */
void rd_recv_release(fab_comm* c) {
  fab_req* r; /* a free request's buffers all let go when they finished */
  for (uint32_t i = 0; (r = next_in_use(c, &i));) {
    for (int k = 0; k < r->n; k++) {
      rd_rsub* b = &rd_rq(r)->sub[k];
      if (b->mr) fab_mr_unhold(b->mr);
      b->mr = NULL;
    }
  }
}
