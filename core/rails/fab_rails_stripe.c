/*
 * Large messages split over the rails of a comm (fab_rails.h, "stripes").
 *
 * Sender: the notice first, on the message's rail with the control tag;
 * then stripe 0 as the message itself (its rail, its tag); then stripe j on
 * rail (rail + j) mod N with the split's own tag. Receiver: a buffer of at
 * least the sender's threshold may receive a split message; the notices that
 * come in (receives kept posted on every rail) are held until their buffer
 * asks, which posts the buffer's other stripes at their offsets. A buffer
 * whose own receive got less than the threshold got a whole message; one
 * that got more waits for its notice and stripes. Every length and offset a
 * notice names is checked against the buffer before anything is posted.
 *
 * The comm's owner thread drives all of it from isend, irecv and test: no
 * lock of ours.
 */
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_mr.h"
#include "fab_prof.h"
#include "fab_rails.h"
#include "fab_req.h"
#include "fab_transport.h"

uint32_t fab_stripe_notice_check(const fab_stripe_notice* n) {
  uint32_t c = n->magic ^ (uint32_t)n->tag ^ n->k ^ n->seq ^ (uint32_t)n->m << 16 ^ (uint32_t)n->size ^
               (uint32_t)(n->size >> 32);
  for (int j = 0; j < FAB_MAX_RAILS; j++) c = (c << 5 | c >> 27) ^ n->len[j];
  return c;
}

/* The split of size bytes (>= threshold) over n rails: how many stripes and
 * their lengths. Stripe 0 is never smaller than the threshold (that is how
 * a receiver tells a split message from a whole one). */
static int layout(size_t size, size_t threshold, size_t stripe, int n, uint32_t* len) {
  size_t m = size / stripe;
  if (m < 2) m = 2;
  if (m > (size_t)n) m = (size_t)n;
  size_t share = (size + m - 1) / m;
  share = (share + FAB_STRIPE_ALIGN - 1) / FAB_STRIPE_ALIGN * FAB_STRIPE_ALIGN;
  size_t first = share > threshold ? share : threshold;
  if (first > size) first = size;
  len[0] = (uint32_t)first;
  size_t rest = size - first, parts = 1;
  size_t others = rest ? (rest + (m - 2)) / (m - 1) : 0;
  others = (others + FAB_STRIPE_ALIGN - 1) / FAB_STRIPE_ALIGN * FAB_STRIPE_ALIGN;
  while (rest && parts < m) {
    size_t l = rest < others ? rest : others;
    len[parts++] = (uint32_t)l;
    rest -= l;
  }
  return (int)parts;
}

/* A peer broke the stripe protocol on rail c: the comm fails, one WARN. */
static fab_result protocol_error(fab_comm* c, const char* what) {
  FAB_WARN("%s: %s; the peer runs another build or its messages are corrupt: the connection fails", c->peer_name,
           what);
  pthread_mutex_lock(&c->ep->lock);
  fab_comm_fail(c, FAB_ERR_REMOTE, what);
  pthread_mutex_unlock(&c->ep->lock);
  return FAB_ERR_REMOTE;
}

/* --- the comm's stripe state ------------------------------------------------------ */

static fab_result stripes_make(fab_rails_comm* rc) {
  fab_stripes* st = fab_reqmem_alloc(sizeof(*st)); /* zeroed; it holds the split sends */
  if (!st) {
    FAB_WARN("%s: out of memory for stripe state", rc->kind == FAB_OBJ_RAILS_SEND ? "isend" : "irecv");
    return FAB_ERR_SYSTEM;
  }
  st->threshold = rc->stripe_from;
  st->stripe = (uint32_t)fab_g.params.stripe_size;
  for (int i = FAB_STRIPE_SENDS - 1; i >= 0; i--) {
    st->send[i].next = st->send_free;
    st->send_free = &st->send[i];
    st->send[i].slot = i;
  }
  for (int i = FAB_STRIPE_RECVS - 1; i >= 0; i--) {
    st->recv[i].next = st->recv_free;
    st->recv_free = &st->recv[i];
  }
  for (int k = 0; k < rc->n; k++) {
    fab_result res = fab_mr_register(rc->c[k], st, sizeof(*st), FAB_PTR_HOST, 0, -1, &st->mh[k], "stripes");
    if (res != FAB_OK) {
      for (int j = 0; j < k; j++) fab_mr_deregister(st->mh[j]);
      fab_reqmem_free(st, sizeof(*st));
      return res;
    }
  }
  rc->stripes = st;
  return FAB_OK;
}

void fab_stripe_free(fab_rails_comm* rc) {
  fab_stripes* st = rc->stripes;
  if (!st) return;
  for (int k = 0; k < rc->n; k++)
    if (st->mh[k]) fab_mr_deregister(st->mh[k]);
  fab_reqmem_free(st, sizeof(*st));
  rc->stripes = NULL;
}

/* Posts a single buffer on rail `rail`: 1 posted, 0 not now, -1 failed. */
static int post_one(fab_rails_comm* rc, int rail, int send, void* data, size_t len, int tag, void* mhandle,
                    void** req, fab_result* res) {
  fab_comm* c = rc->c[rail];
  if (FAB_UNLIKELY(atomic_load_explicit(&c->error, memory_order_relaxed) != FAB_OK)) {
    *res = fab_comm_failed(c, send ? "isend" : "irecv"); /* a failed rail takes nothing more */
    return -1;
  }
  fab_mr* mr;
  *res = fab_mr_resolve(c, mhandle, data, len, send ? "isend" : "irecv", &mr);
  if (*res != FAB_OK) return -1;
  *req = NULL;
  if (send) *res = c->ops->isend(c, data, len, tag, mr, req);
  else *res = c->ops->irecv(c, 1, &data, &len, &tag, &mr, req);
  if (*res != FAB_OK) return -1;
  if (*req) return 1;
  *res = fab_comm_not_now(c, send ? "isend" : "irecv");
  return *res == FAB_OK ? 0 : -1;
}

/* Tests a posted part: 1 pending, 0 done, -1 failed. */
static int test_one(void** req, uint8_t* done, int* size, fab_result* res) {
  int d = 0, got = 0;
  *res = fab_req_test_helped(*req, &d, &got);
  if (*res != FAB_OK) return -1;
  if (!d) return 1;
  *done = 1;
  *req = NULL;
  if (size) *size = got;
  return 0;
}

static const fab_req_kind stripe_send_kind;

/* --- send --------------------------------------------------------------------------- */

/* Posts what of sp is not posted yet: stripe 0 (the message, with its tag),
 * then the others. The notice went first (fab_stripe_isend). Until stripe 0
 * is posted the comm's later sends wait (st->blocked): none may overtake it
 * on its tag. */
static fab_result send_post_rest(fab_stripe_send* sp) {
  fab_rails_comm* rc = sp->rc;
  fab_stripes* st = rc->stripes;
  fab_result res = FAB_OK;
  for (int j = 0; j < sp->m; j++) {
    fab_stripe_part* pt = &sp->part[j];
    if (pt->posted) continue;
    int tag = j ? FAB_STRIPE_TAG(st->tx[sp->slot].seq) : st->tx[sp->slot].tag;
    int r = post_one(rc, pt->rail, 1, sp->data + pt->off, pt->len, tag, fab_rails_member_mh(sp->mhandle, pt->rail),
                     &pt->req, &res);
    if (r <= 0) return res;
    pt->posted = 1;
    if (j == 0) st->blocked = NULL;
  }
  return FAB_OK;
}

fab_result fab_stripe_unblock(fab_rails_comm* rc) {
  fab_stripe_send* sp = rc->stripes ? rc->stripes->blocked : NULL;
  return sp ? send_post_rest(sp) : FAB_OK;
}

/* The notice goes first, on the message's rail: ahead of the stripe there,
 * so the receiver can post the other stripes while stripe 0 moves. */
fab_result fab_stripe_isend(fab_rails_comm* rc, void* data, size_t size, int tag, uint32_t k, void* mhandle,
                            void* phandle, void** request) {
  *request = NULL;
  if (!rc->stripes) {
    fab_result res = stripes_make(rc);
    if (res != FAB_OK) return res;
  }
  fab_stripes* st = rc->stripes;
  fab_stripe_send* sp = st->send_free;
  if (!sp) return FAB_OK; /* all in flight: NCCL retries */
  uint32_t len[FAB_MAX_RAILS] = {0};
  int m = layout(size, st->threshold, st->stripe, rc->n, len);
  int rail = fab_rails_rail_for(rc, tag, k);
  fab_stripe_notice* n = &st->tx[sp->slot];
  *n = (fab_stripe_notice){.magic = FAB_STRIPE_MAGIC, .tag = tag, .k = k, .seq = st->next_seq, .m = (uint8_t)m,
                           .size = size};
  memcpy(n->len, len, sizeof(n->len));
  n->check = fab_stripe_notice_check(n);
  fab_result res = FAB_OK;
  int r = post_one(rc, rail, 1, n, sizeof(*n), FAB_STRIPE_TAG_CTRL, st->mh[rail], &sp->notice_req, &res);
  if (r <= 0) return res; /* not now: nothing went */
  st->send_free = sp->next;
  st->next_seq = (uint16_t)((st->next_seq + 1) % FAB_STRIPE_SEQS);
  sp->head = (fab_req_head){.magic = FAB_REQ_MAGIC, .state = FAB_REQ_ACTIVE, .kind = &stripe_send_kind};
  sp->rc = rc;
  sp->m = m;
  sp->size = size;
  sp->data = data;
  sp->mhandle = mhandle;
  sp->notice_posted = 1;
  sp->notice_done = 0;
  size_t off = 0;
  for (int j = 0; j < m; j++) {
    sp->part[j] = (fab_stripe_part){.rail = (rail + j) % rc->n, .off = off, .len = len[j]};
    off += len[j];
  }
  st->blocked = sp;
  *request = sp;
  res = send_post_rest(sp); /* what cannot go now goes from test */
  if (res != FAB_OK) {
    *request = NULL; /* its rail failed, and the comm with it; sp stays out of the pool (its notice may be in flight) */
    return res;
  }
  if (sp->part[0].posted && phandle && fab_prof_wanted(fab_rails_prof(rc))) {
    size_t first = len[0];
    fab_prof_count(rc->c[0], fab_prof_posted_part(sp->part[0].req, &phandle, &first, &tag, NULL, 1));
  }
  return res;
}

static void send_put(fab_stripe_send* sp) {
  fab_stripes* st = sp->rc->stripes;
  sp->head.state = FAB_REQ_FREE;
  sp->next = st->send_free;
  st->send_free = sp;
}

/* Tests sp's posted parts and its notice: 1 while some are left. A failed
 * one fails sp (sp->result; its own WARN names the rail). */
static int send_busy(fab_req_head* h, int poll) {
  (void)poll; /* the parts' tests drive their rails */
  fab_stripe_send* sp = (fab_stripe_send*)h;
  fab_result res = send_post_rest(sp);
  int left = 0;
  for (int j = 0; j < sp->m && res == FAB_OK; j++) {
    fab_stripe_part* pt = &sp->part[j];
    if (pt->done) continue;
    if (!pt->posted || test_one(&pt->req, &pt->done, NULL, &res) == 1) left++;
  }
  if (res == FAB_OK && !sp->notice_done && (!sp->notice_posted || test_one(&sp->notice_req, &sp->notice_done, NULL,
                                                                           &res) == 1))
    left++;
  sp->result = res;
  return res == FAB_OK && left;
}

static fab_result send_finish(fab_req_head* h, int* sizes) {
  fab_stripe_send* sp = (fab_stripe_send*)h;
  if (sp->result == FAB_OK && sizes) sizes[0] = (int)sp->size;
  return sp->result;
}

/* after a failure, parts still posted stay with their rails' comms, which fail too */
static void send_done(fab_req_head* h) { send_put((fab_stripe_send*)h); }

static const fab_req_steps send_steps = {send_busy,   fab_req_parts_stalled, fab_req_parts_give_up,
                                         send_finish, fab_req_parts_explain, send_done};

static fab_result send_test(fab_req_head* h, int* done, int* sizes) {
  return fab_req_run(h, done, sizes, &send_steps, 1);
}

static const fab_req_kind stripe_send_kind = {.name = "isend split over several rails", .api = FAB_REQ_API_NET,
                                              .test = send_test};

/* --- receive ---------------------------------------------------------------------- */

fab_stripe_recv* fab_stripe_recv_get(fab_rails_comm* rc, fab_result* res) {
  *res = FAB_OK;
  if (!rc->stripes && (*res = stripes_make(rc)) != FAB_OK) return NULL;
  fab_stripe_recv* sr = rc->stripes->recv_free;
  if (!sr) return NULL;
  rc->stripes->recv_free = sr->next;
  memset(sr, 0, sizeof(*sr));
  return sr;
}

void fab_stripe_recv_put(fab_rails_comm* rc, fab_stripe_recv* sr) {
  sr->next = rc->stripes->recv_free;
  rc->stripes->recv_free = sr;
}

/* A notice that came in on rail `rail`, checked before it is held. */
static fab_result notice_in(fab_rails_comm* rc, int rail, const fab_stripe_notice* n, int len) {
  fab_comm* c = rc->c[rail];
  if (len != (int)sizeof(*n) || n->magic != FAB_STRIPE_MAGIC || n->check != fab_stripe_notice_check(n))
    return protocol_error(c, "a malformed stripe notice came in");
  uint64_t sum = 0;
  int ok = n->m >= 1 && n->m <= rc->n && n->seq < FAB_STRIPE_SEQS && n->len[0] >= rc->stripe_from &&
           fab_rails_rail_for(rc, n->tag, n->k) == rail;
  for (int j = 0; j < FAB_MAX_RAILS && ok; j++) {
    ok = j < n->m ? n->len[j] > 0 : n->len[j] == 0;
    sum += n->len[j];
  }
  if (!ok || sum != n->size) return protocol_error(c, "a stripe notice names stripes that do not add up");
  fab_stripes* st = rc->stripes;
  for (int i = 0; i < FAB_STRIPE_NOTICES; i++) {
    if (st->held[i].magic) continue;
    st->held[i] = *n;
    return FAB_OK;
  }
  return protocol_error(c, "more stripe notices came in than sends can be in flight");
}

/* Reads the notices that came in on rail k and keeps FAB_STRIPE_CTRL_RX
 * receives posted there. One pending receive per call is tested in full: it
 * drives the rail's progress (unless its thread does) and checks the rail and
 * its peer are alive, so a buffer waiting for its notice learns of a failure;
 * the others only when they have completed. */
static fab_result pump_rail(fab_rails_comm* rc, int k) {
  fab_stripes* st = rc->stripes;
  fab_result res = FAB_OK;
  int tested_pending = 0;
  for (int q = 0; q < FAB_STRIPE_CTRL_RX; q++) {
    void** req = &st->rx_req[k][q];
    if (*req) {
      int pending = atomic_load_explicit(&((fab_req*)*req)->pending, memory_order_acquire) > 0;
      if (pending && tested_pending) continue;
      tested_pending |= pending;
      uint8_t d = 0;
      int got = 0;
      if (test_one(req, &d, &got, &res) < 0) return res;
      if (!d) continue;
      res = notice_in(rc, k, &st->rx[k][q], got);
      if (res != FAB_OK) return res;
    }
    int posted = post_one(rc, k, 0, &st->rx[k][q], sizeof(st->rx[k][q]), FAB_STRIPE_TAG_CTRL, st->mh[k], req, &res);
    if (posted < 0) return res;
    if (posted) fab_req_uncount(*req); /* posted for the comm's life: the receives waiting for it hold the threads */
  }
  return FAB_OK;
}

fab_result fab_stripe_pump(fab_rails_comm* rc) {
  for (int k = 0; k < rc->n; k++) {
    fab_result res = pump_rail(rc, k);
    if (res != FAB_OK) return res;
  }
  return FAB_OK;
}

/* The held notice for sr, taken: its stripes laid out in sr. */
static void notice_take(fab_rails_comm* rc, fab_stripe_recv* sr) {
  fab_stripes* st = rc->stripes;
  for (int i = 0; i < FAB_STRIPE_NOTICES; i++) {
    fab_stripe_notice* n = &st->held[i];
    if (!n->magic || n->tag != sr->tag || n->k != sr->k) continue;
    n->magic = 0;
    sr->noticed = 1;
    sr->size = n->size;
    sr->seq = n->seq;
    sr->m = n->m;
    size_t off = 0;
    for (int j = 0; j < n->m; j++) {
      sr->part[j] = (fab_stripe_part){.rail = (sr->rail + j) % rc->n, .off = off, .len = n->len[j]};
      off += n->len[j];
    }
    return;
  }
}

/* A split message larger than its buffer, once stripe 0 has landed (so
 * nothing is still being written into the buffer when the runtime frees
 * it): the receive fails as truncated, and the connection with it. Its other
 * stripes are taken by empty receives, which keep nothing of them (a
 * provider's truncation, or the domain's sink): none is left unmatched for
 * the endpoint's close (libfabric 2.x's shm crashes discarding one whose
 * sender is gone, docs/known-bugs.md). */
static fab_result truncated(fab_rails_comm* rc, fab_stripe_recv* sr) {
  for (int j = 1; j < sr->m; j++) {
    fab_result ignored;
    void* req = NULL; /* left to its comm, which this failure closes */
    post_one(rc, sr->part[j].rail, 0, sr->data, 0, FAB_STRIPE_TAG(sr->seq), fab_rails_member_mh(sr->mhandle,
             sr->part[j].rail), &req, &ignored);
  }
  fab_comm* c = rc->c[sr->rail];
  FAB_WARN("irecv on %s: a message of %llu bytes (tag %d) for a buffer of %zu bytes; the receive fails as "
           "truncated, and the connection with it", c->peer_name, (unsigned long long)sr->size, sr->tag, sr->cap);
  pthread_mutex_lock(&c->ep->lock);
  fab_comm_truncated(c);
  pthread_mutex_unlock(&c->ep->lock);
  return FAB_ERR_INVALID_USAGE;
}

int fab_stripe_recv_test(fab_rails_comm* rc, fab_stripe_recv* sr, int got, int* size, fab_result* res) {
  *res = FAB_OK;
  if (sr->done) return 0;
  if (!sr->noticed) notice_take(rc, sr);
  if (!sr->noticed) {
    if (got && (uint32_t)*size < rc->stripe_from) return sr->done = 1, 0; /* a whole message */
    return 1;
  }
  if (sr->size > sr->cap) {
    if (!got) return 1;
    *res = truncated(rc, sr);
    return -1;
  }
  if (got && (uint64_t)*size != sr->part[0].len) {
    *res = protocol_error(rc->c[sr->rail], "the first stripe of a split message has another length than its notice");
    return -1;
  }
  int left = !got;
  for (int j = 1; j < sr->m; j++) {
    fab_stripe_part* pt = &sr->part[j];
    if (pt->done) continue;
    if (!pt->posted) {
      int r = post_one(rc, pt->rail, 0, sr->data + pt->off, pt->len, FAB_STRIPE_TAG(sr->seq),
                       fab_rails_member_mh(sr->mhandle, pt->rail), &pt->req, res);
      if (r < 0) return -1;
      pt->posted = (uint8_t)r;
    }
    int part_size = 0;
    if (!pt->posted || test_one(&pt->req, &pt->done, &part_size, res) == 1) {
      left++;
      continue;
    }
    if (*res != FAB_OK) return -1;
    if ((size_t)part_size != pt->len) {
      *res = protocol_error(rc->c[pt->rail], "a stripe of a split message has another length than its notice");
      return -1;
    }
  }
  if (left) return 1;
  *size = (int)sr->size;
  sr->done = 1;
  return 0;
}
