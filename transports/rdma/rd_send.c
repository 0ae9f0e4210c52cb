/* The rdma transport's sending side: consume announcements, match sends to
 * them, write the data. See rd.h.
 *
 * The sender's matching state (announcements, waiting sends) is kept under
 * the endpoint lock: an announcement is consumed by whichever thread reads
 * its completion, and a send waiting for it is posted right there, so a
 * send never depends on its own comm being tested to move. */
#include <stdio.h>
#include <string.h>

#include "rd.h"

/* A send no longer reads its buffer: its registration is let go (a
 * deregistration waits for that). */
static void let_go(rd_sreq* q) {
  if (q->held) fab_mr_unhold(q->held);
  q->held = NULL;
}

static void write_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_req* r = op->owner;
  rd_sreq* q = rd_sq(r);
  if (FAB_UNLIKELY(err != NULL)) fab_req_op_failed(r, r->size, r->tag, err);
  let_go(q);
  if (q->eager_slot >= 0) /* its staging slot is free again; before the last write below */
    atomic_fetch_and_explicit(&rd_s(r->comm)->stage_busy, (uint16_t)~(1u << q->eager_slot), memory_order_acq_rel);
  fab_req_op_done(r, 0);
}

void rd_send_init_req(fab_comm* c, fab_req* r) {
  fab_op_init_unlocked(&rd_sq(r)->op, write_done, r, 0);
  rd_sq(r)->held = NULL;
}

static void fail_send(fab_comm* c, fab_req* r, fab_result rc, const char* msg) {
  if (r->result == FAB_OK) {
    r->result = rc;
    r->errmsg = strdup(msg);
  }
  let_go(rd_sq(r));
  fab_req_op_done(r, 0);
}

/* The buffer is too small: nothing is written; the send fails, and the
 * receive learns it from a TRUNC notice. */
static ssize_t refuse_truncated(fab_comm* c, fab_req* r) {
  rd_ann* t = &rd_sq(r)->target;
  uint32_t size = r->size > UINT32_MAX ? UINT32_MAX : (uint32_t)r->size;
  ssize_t rc = fab_remote_ctl_write(c, &rd_scratch_word, 0, &t->win, 0, rd_cq_data(c, RD_TRUNC, t->slot, size));
  if (rc == -FI_EAGAIN) return rc;
  char msg[320];
  snprintf(msg, sizeof(msg),
           "send of %zu bytes (tag %d) to %s was refused: the receive posted for it has only %llu bytes; a send must "
           "not be larger than its receive",
           r->size, r->tag, c->peer_name, (unsigned long long)t->win.len);
  fail_send(c, r, FAB_ERR_INVALID_USAGE, msg);
  fab_comm_truncated(c);
  return 0;
}

/* A send that waited finds its registration gone: its descriptor names a
 * closed memory region, which the provider must never see. The receive
 * posted for it learns from an ABANDONED notice (TRUNC of 0 bytes) and
 * fails too, rather than waiting for data that never comes. */
static ssize_t refuse_deregistered(fab_comm* c, fab_req* r) {
  rd_ann* t = &rd_sq(r)->target;
  ssize_t rc = fab_remote_ctl_write(c, &rd_scratch_word, 0, &t->win, 0, rd_cq_data(c, RD_TRUNC, t->slot, 0));
  if (rc == -FI_EAGAIN) return rc;
  char msg[320];
  snprintf(msg, sizeof(msg),
           "send of %zu bytes (tag %d) to %s: its buffer was deregistered before the send could be written; "
           "deregister a buffer only after its sends complete",
           r->size, r->tag, c->peer_name);
  fail_send(c, r, FAB_ERR_INVALID_USAGE, msg);
  return 0;
}

/* Posts the write of a matched send: 0 (posted, done or failed) or
 * -FI_EAGAIN. ep lock held. */
static ssize_t post(fab_comm* c, fab_req* r) {
  rd_sreq* q = rd_sq(r);
  if (FAB_UNLIKELY(q->held != NULL) && atomic_load_explicit(&q->held->gone, memory_order_acquire))
    return refuse_deregistered(c, r);
  if (FAB_UNLIKELY(r->size > q->target.win.len)) return refuse_truncated(c, r);
  uint64_t data = rd_cq_data(c, RD_DATA, q->target.slot, (uint32_t)r->size);
  ssize_t rc;
  if (fab_dev_injects(c->ep->dev, r->size)) { /* the send is done when the provider says it went */
    rc = fab_remote_inject_writedata(c->ep, c->peer, q->data, r->size, &q->target.win, 0, data, &q->op);
  } else {
    rc = fab_remote_writedata(c->ep, c->peer, q->data, r->size, q->desc, &q->target.win, 0, data, &q->op);
  }
  if (FAB_LIKELY(rc == 0) || rc == -FI_EAGAIN) return rc;
  char msg[320];
  snprintf(msg, sizeof(msg), "send of %zu bytes (tag %d) to %s: posting the RDMA write failed: %s", r->size, r->tag,
           c->peer_name, fi_strerror((int)-rc));
  fail_send(c, r, fab_result_from_fi((int)-rc), msg);
  return 0;
}

/* Takes the announced buffer (tag, k) into *out; 0 when it is not there. */
static int take(rd_scomm* s, int tag, uint32_t k, rd_ann* out) {
  for (uint32_t i = 0; i < s->nann; i++) {
    if (s->ann[i].tag != tag || s->ann[i].k != k) continue;
    *out = s->ann[i];
    memmove(&s->ann[i], &s->ann[i + 1], (s->nann - i - 1) * sizeof(rd_ann));
    s->nann--;
    return 1;
  }
  return 0;
}

/* The waiting send (tag, k), or NULL. */
static fab_req* waiting_send(rd_scomm* s, int tag, uint32_t k) {
  for (uint32_t i = 0; i < s->nwait; i++) {
    fab_req* r = s->wait[i];
    if (r->tag == tag && rd_sq(r)->k == k) return r;
  }
  return NULL;
}

/* Posts r's tagged message (asked announcements): 0 when r is done with
 * here (its data posted, or r failed), 1 (its request-to-send posted: it
 * waits for its announcement), -FI_EAGAIN. ep lock held. */
static ssize_t send_tagged(fab_comm* c, fab_req* r) {
  rd_sreq* q = rd_sq(r);
  char msg[256];
  if (FAB_UNLIKELY(q->held != NULL) && atomic_load_explicit(&q->held->gone, memory_order_acquire))
    q->ts = RD_TS_ABANDON; /* never read from a closed region; its receive is told instead */
  const char* what = q->ts == RD_TS_RTS ? "request-to-send" : q->ts == RD_TS_MARK ? "mark" : "message";
  ssize_t rc = rd_tagged_send(c, r);
  if (rc == RD_WENT_INLINE) { /* the provider holds its bytes: nothing will complete it */
    let_go(q);
    fab_req_op_done_inline(r);
    return 0;
  }
  if (FAB_LIKELY(rc >= 0) && q->ts == RD_TS_ABANDON) {
    snprintf(msg, sizeof(msg), "send of %zu bytes (tag %d) to %s: its buffer was deregistered before the send "
             "could be posted; deregister a buffer only after its sends complete", r->size, r->tag, c->peer_name);
    fail_send(c, r, FAB_ERR_INVALID_USAGE, msg);
    return 0;
  }
  if (FAB_LIKELY(rc >= 0) || rc == -FI_EAGAIN) return rc;
  /* its receive will never be taken: the connection's later messages would meet the wrong receives */
  snprintf(msg, sizeof(msg), "send of %zu bytes (tag %d) to %s: posting its tagged %s failed: %s", r->size, r->tag,
           c->peer_name, what, fi_strerror((int)-rc));
  fail_send(c, r, fab_result_from_fi((int)-rc), msg);
  fab_comm_fail(c, fab_result_from_fi((int)-rc), "a tagged message could not be posted, so the connection's "
                "messages and receives are no longer paired");
  return 0;
}

/* Posts a waiting send's tagged message (asked announcements), unless an
 * earlier one of the comm is still unposted (they go in send order): 1 when
 * the send is done with (DATA posted, or failed), else 0; *blocked is set
 * at the first that cannot go. */
static int post_unsent(fab_comm* c, fab_req* r, int* blocked) {
  ssize_t t = *blocked ? -FI_EAGAIN : send_tagged(c, r);
  if (t == -FI_EAGAIN) {
    *blocked = 1;
    return 0;
  }
  rd_s(c)->unsent--;
  return t == 0;
}

/* Posts waiting sends whose buffer was announced, or that fit an eager slot
 * that came back, or whose tagged message could not be posted before.
 * Returns whether the provider refused one for now (-FI_EAGAIN): a retry is
 * due. ep lock held. */
static int post_waiting(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  uint32_t kept = 0;
  int blocked = 0, again = 0;
  for (uint32_t i = 0; i < s->nwait; i++) {
    fab_req* r = s->wait[i];
    rd_sreq* q = rd_sq(r);
    if (rd_ts_unsent(q->ts)) {
      if (post_unsent(c, r, &blocked)) continue;
      if (q->ts != RD_TS_ASKED && q->ts != RD_TS_MARKED) {
        s->wait[kept++] = r;
        continue;
      }
    }
    if (!q->matched) q->matched = take(s, r->tag, q->k, &q->target);
    if (!q->matched && q->ts == RD_TS_ASKED) {
      s->wait[kept++] = r;
      continue;
    }
    if (q->matched) {
      if (post(c, r) != -FI_EAGAIN) continue;
      again = 1;
    } else if (rd_eager_post(c, r) == 0) {
      continue;
    }
    s->wait[kept++] = r;
  }
  s->nwait = kept;
  atomic_store_explicit(&s->nwait_hint, kept, memory_order_relaxed);
  return again || blocked;
}

/* Moves landed announcements, in index order, to the announced list.
 * ep lock held. */
static void consume(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  for (;;) {
    uint32_t i = s->next_index, entry = i % RD_SLOTS;
    if (!s->landed[entry]) return;
    rd_ctrl e = s->box[entry];
    s->landed[entry] = 0;
    if (e.index != i || e.check != (i ^ e.k ^ RD_CTRL_MAGIC) || (e.slot >> 3) >= RD_RECV_REQS ||
        (e.slot & 7) >= FAB_MAX_RECVS || e.size > c->max_bytes || s->nann >= RD_SLOTS) {
      rd_protocol_error(c, "a malformed buffer announcement (wrong number, checksum, slot or size)");
      return;
    }
    s->next_index = i + 1;
    rd_eager_credits(c, e.credits);
    rd_ann a = {.win = {.addr = e.addr, .len = e.size, .key = e.key}, .index = e.index, .tag = e.tag, .k = e.k,
                .slot = e.slot};
    if (e.k >= fab_tagmap_peek(&s->sent, e.tag)) { /* for a send still to come */
      s->ann[s->nann++] = a;
      continue;
    }
    fab_req* r = waiting_send(s, e.tag, e.k);
    if (r && !rd_sq(r)->matched) { /* its send waits for it */
      rd_sq(r)->target = a;
      rd_sq(r)->matched = 1;
    } else {
      s->dropped++; /* its send went eager: nothing will be written for it */
    }
  }
}

void rd_send_landed(fab_comm* c, uint32_t low) {
  uint32_t entry = low & 0xffff;
  rd_scomm* s = rd_s(c);
  if (entry == RD_NO_ENTRY) rd_eager_credits(c, (uint16_t)(low >> 16)); /* else they ride in the entry */
  if (entry != RD_NO_ENTRY) {
    if (entry >= RD_SLOTS) {
      rd_protocol_error(c, "an announcement names a mailbox entry out of range");
      return;
    }
    s->landed[entry] = 1;
  }
  if (c->error != FAB_OK) return;
  consume(c);
  if (s->nwait && post_waiting(c) && c->helped) fab_ep_want_pump_retry(c->ep); /* tests rarely retry there */
  rd_eager_ack_if_due(c);
}

/* On the rail's polling thread: the sends isend left to it go, and it comes
 * back while the provider refuses some for now. ep lock held. */
void rd_send_pump(fab_comm* c) {
  if (c->kind != FAB_OBJ_SEND) return;
  rd_scomm* s = rd_s(c);
  if (c->error != FAB_OK || !s->nwait) return;
  if (post_waiting(c)) fab_ep_want_pump_retry(c->ep);
  rd_eager_ack_if_due(c);
}

/* Waiting sends whose write could not be posted (EAGAIN) are retried. */
void rd_send_progress(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  if (atomic_load_explicit(&s->nwait_hint, memory_order_relaxed) == 0) return;
  pthread_mutex_lock(&c->ep->lock);
  if (c->error == FAB_OK) {
    post_waiting(c);
    rd_eager_ack_if_due(c);
  }
  pthread_mutex_unlock(&c->ep->lock);
}

fab_result rd_isend(fab_comm* c, void* data, size_t size, int tag, fab_mr* mr, void** request) {
  rd_scomm* s = rd_s(c);
  *request = NULL;
  fab_req* r = fab_req_get(c, FAB_REQ_SEND, 1, 1);
  if (FAB_UNLIKELY(!r)) return FAB_OK; /* all requests in flight: NCCL retries */
  rd_sreq* q = rd_sq(r);
  r->size = size;
  fab_req_sized(r, size);
  r->tag = tag;
  q->data = data;
  q->desc = mr ? mr->desc : NULL;
  q->matched = 0;
  q->eager_slot = -1;
  q->held = mr; /* until its write completes: deregMr waits for that */
  if (mr) fab_mr_hold(mr);
  q->host = !mr || mr->type != FAB_PTR_CUDA;
  q->ts = !s->tagged_max ? RD_TS_NONE : size <= s->tagged_max ? RD_TS_DATA : RD_TS_RTS;
  atomic_store_explicit(&q->eager, 0, memory_order_relaxed);
  fab_endpoint* ep = c->ep;
  pthread_mutex_lock(&ep->lock);
  int64_t k = c->error == FAB_OK ? fab_tagmap_take(&s->sent, tag) : -1;
  if (FAB_UNLIKELY(k < 0)) {
    pthread_mutex_unlock(&ep->lock);
    let_go(q);
    fab_req_put(r);
    FAB_WARN("isend of %zu bytes (tag %d) to %s: %s", size, tag, c->peer_name,
             c->error != FAB_OK ? c->error_why : "out of memory counting the connection's tags");
    return c->error != FAB_OK ? c->error : FAB_ERR_SYSTEM;
  }
  q->k = (uint32_t)k;
  /* asked announcements: its tagged message now, in order; else its buffer
   * announced: straight into it; else eager when it fits a slot; else it
   * waits for the announcement. Over a rail with a polling thread, a large
   * send, or one of a stream, is left to that thread, which then does the
   * provider's copy: the caller's thread would else copy every rail's data
   * alone. */
  int went = 0;
  int defer = rd_send_defers(c, size);
  if (q->ts != RD_TS_NONE) {
    if (take(s, tag, q->k, &q->target)) { /* announced ahead: a mark takes the tagged receive, then the write */
      q->matched = 1;
      q->ts = RD_TS_MARK;
    }
    ssize_t t = s->unsent || defer ? -FI_EAGAIN : send_tagged(c, r);
    went = t == 0 || (q->ts == RD_TS_MARKED && post(c, r) != -FI_EAGAIN);
    if (t == -FI_EAGAIN) s->unsent++;
  } else if (defer) {
    /* left to the thread */
  } else if (take(s, tag, q->k, &q->target)) {
    q->matched = 1;
    went = post(c, r) != -FI_EAGAIN;
  } else {
    went = rd_eager_post(c, r) == 0;
  }
  if (!went) {
    s->wait[s->nwait++] = r;
    atomic_store_explicit(&s->nwait_hint, s->nwait, memory_order_relaxed);
    /* the thread posts it: one left to it, or any while the thread reads
     * the CQ (tests then rarely do); else the caller's tests do */
    if (defer || (c->helped && !fab_ep_helper_small_only(ep))) fab_ep_want_pump(ep);
  }
  rd_eager_ack_if_due(c);
  pthread_mutex_unlock(&ep->lock);
  *request = r; /* done, posted, waiting or failed: test reports which */
  return FAB_OK;
}

/* Sends not posted yet end with the connection's failure. ep lock held, or
 * taken here (give_up). */
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
    if (rd_ts_unsent(rd_sq(r)->ts)) s->unsent--;
    let_go(rd_sq(r));
    fab_req_op_done(r, 0);
  }
  s->nwait = kept;
  atomic_store_explicit(&s->nwait_hint, kept, memory_order_relaxed);
}

/* Close: sends whose tagged message the provider would still not take
 * fail (they read nothing). */
static void drop_unsent(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  uint32_t kept = 0;
  for (uint32_t k = 0; k < s->nwait; k++) {
    fab_req* r = s->wait[k];
    rd_sreq* q = rd_sq(r);
    if (!rd_ts_unsent(q->ts)) {
      s->wait[kept++] = r;
      continue;
    }
    FAB_WARN("closeSend: a send of %zu bytes (tag %d) to %s could not be handed to the provider before close; it "
             "was not sent", r->size, r->tag, c->peer_name);
    fail_send(c, r, FAB_ERR_SYSTEM, "the send comm was closed before the provider took the send");
  }
  s->nwait = kept;
  s->unsent = 0;
  atomic_store_explicit(&s->nwait_hint, kept, memory_order_relaxed);
}

/* Close: like a send already handed to the provider, a waiting send is still
 * delivered once its buffer is announced (the closed comm stays parked until
 * then), unless its buffer was deregistered meanwhile (it then fails, never
 * read); only a failed connection drops them. close waits for the writes
 * already posted (core/conn/fab_comm.c). */
void rd_send_cancel(fab_comm* c) {
  /* nobody progresses this comm for them later; a send left to a rail's thread (not matched yet) goes here too */
  if (c->error == FAB_OK && rd_s(c)->nwait) post_waiting(c);
  if (c->error != FAB_OK) drop_waiting(c, NULL);
  else if (rd_s(c)->unsent) drop_unsent(c);
}

/* The comm is freed: its sends let go of their registrations, the waiting
 * ones and any whose write never completed (its endpoint was closed under
 * it: no completion will come). */
void rd_send_release(fab_comm* c) {
  uint32_t used = atomic_load_explicit(&c->reqs.used, memory_order_acquire);
  for (uint32_t i = 0; i < used; i++) let_go(rd_sq((fab_req*)fab_pool_at(&c->reqs, i)));
}

void rd_send_give_up(fab_req* r) {
  fab_comm* c = r->comm;
  pthread_mutex_lock(&c->ep->lock);
  drop_waiting(c, r);
  pthread_mutex_unlock(&c->ep->lock);
}
