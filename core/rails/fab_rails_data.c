/*
 * Data calls on comms over several rails (fab_rails.h). The k-th message of
 * a tag goes whole on rail (k + tag) mod N on both ends; a send is posted on
 * its rail and its request is the rail's own; a grouped receive is posted on
 * one rail when all its buffers fall there, else as a parent request over
 * one receive per rail, posted in order (a rail that cannot take its share
 * yet gets it before any later receive of the comm). The calls validate
 * what the runtime passed as fab_data.c does for one rail.
 */
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_mr.h"
#include "fab_prof.h"
#include "fab_rails.h"
#include "fab_req.h"
#include "fab_transport.h"

static fab_rails_comm* comm_or_warn(void* handle, fab_obj_kind kind, const char* fn) {
  fab_rails_comm* rc = fab_obj_get(handle, kind);
  if (!rc) {
    fab_obj_kind k = fab_obj_kind_of(handle);
    FAB_WARN("%s: %p is %s, not a live %s", fn, handle, k ? fab_obj_kind_name(k) : "unknown or already closed",
             fab_obj_kind_name(kind));
  }
  return rc;
}

/* A comm over several rails fails with its first failed rail: FAB_OK, or
 * that rail's error with one WARN naming it (its peer name does). */
static fab_result rails_ok(fab_rails_comm* rc, const char* fn) {
  for (int k = 0; k < rc->n; k++)
    if (FAB_UNLIKELY(atomic_load_explicit(&rc->c[k]->error, memory_order_relaxed) != FAB_OK))
      return fab_comm_failed(rc->c[k], fn);
  return FAB_OK;
}

static fab_result reserved_tag(const char* fn, int tag) {
  FAB_WARN("%s: tag %d is reserved on comms over several rails (tags below %d carry the plugin's stripes); use "
           "tags from %d up", fn, tag, FAB_RAILS_TAG_MIN, FAB_RAILS_TAG_MIN);
  return FAB_ERR_INVALID_ARG;
}

fab_result fab_rails_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                           void** request) {
  fab_rails_comm* rc = comm_or_warn(send_comm, FAB_OBJ_RAILS_SEND, "isend");
  if (!rc) return FAB_ERR_INTERNAL;
  fab_result res = fab_buffer_ok(rc->dev->name, rc->dev->props.max_p2p_bytes, -1, data, size, mhandle);
  if (res != FAB_OK) return res;
  if (tag < FAB_RAILS_TAG_MIN) return reserved_tag("isend", tag);
  res = rails_ok(rc, "isend");
  if (res != FAB_OK) return res;
  if (FAB_UNLIKELY(rc->stripes && rc->stripes->blocked)) { /* a split's stripe 0 goes before any later send */
    *request = NULL;
    res = fab_stripe_unblock(rc);
    if (res != FAB_OK || rc->stripes->blocked) return res; /* not now: NCCL retries */
  }
  int64_t k = fab_tagmap_take(&rc->tags, tag);
  if (k < 0) {
    FAB_WARN("isend: out of memory");
    return FAB_ERR_SYSTEM;
  }
  if (rc->stripe_from && size >= rc->stripe_from) { /* split over the rails (fab_rails_stripe.c) */
    res = fab_stripe_isend(rc, data, size, tag, (uint32_t)k, mhandle, phandle, request);
    if (res != FAB_OK || !*request) fab_tagmap_untake(&rc->tags, tag);
    return res;
  }
  fab_comm* c = rc->c[fab_rails_rail_for(rc, tag, (uint32_t)k)];
  fab_mr* mr;
  res = fab_mr_resolve(c, fab_rails_member_mh(mhandle, c->rail), data, size, "isend", &mr);
  if (res == FAB_OK) res = c->ops->isend(c, data, size, tag, mr, request);
  if (res != FAB_OK || !*request) {
    fab_tagmap_untake(&rc->tags, tag);
    return res != FAB_OK ? res : fab_comm_not_now(c, "isend");
  }
  if (phandle && fab_prof_wanted(fab_rails_prof(rc)))
    fab_prof_count(rc->c[0], fab_prof_posted_part(*request, &phandle, &size, &tag, NULL, 1));
  return FAB_OK;
}

static const fab_req_kind parent_kind;

/* --- grouped receives -------------------------------------------------------------- */

static fab_rails_parent* parent_get(fab_rails_comm* rc) {
  if (!rc->parents) {
    rc->parents = fab_reqmem_alloc(FAB_RAILS_PARENTS * sizeof(*rc->parents)); /* zeroed */
    if (!rc->parents) return NULL;
    for (int i = FAB_RAILS_PARENTS - 1; i >= 0; i--) {
      rc->parents[i].next = rc->free_list;
      rc->free_list = &rc->parents[i];
    }
  }
  fab_rails_parent* p = rc->free_list;
  if (!p) return NULL;
  rc->free_list = p->next;
  memset(p, 0, sizeof(*p));
  p->rc = rc;
  return p;
}

/* A receive that may get a split message keeps every rail's thread awake
 * while it lives: its notice and stripes come in on any rail, and the notice
 * receives posted there are not counted (fab_req_uncount). */
static void parent_hold_rails(fab_rails_parent* p) {
  for (int k = 0; k < p->rc->n; k++)
    if (fab_ep_helper_hold(p->rc->c[k]->ep)) {
      p->held_rails |= 1u << k;
      fab_ep_helper_large(p->rc->c[k]->ep, 1); /* a split message is large */
    }
}
static void parent_let_go(fab_rails_parent* p) {
  for (int k = 0; p->held_rails; k++)
    if (p->held_rails & (1u << k)) {
      p->held_rails &= ~(1u << k);
      fab_ep_helper_large(p->rc->c[k]->ep, -1);
      fab_ep_helper_idle(p->rc->c[k]->ep);
    }
}

static void parent_put(fab_rails_parent* p) {
  fab_rails_comm* rc = p->rc;
  parent_let_go(p);
  p->head.state = FAB_REQ_FREE;
  p->next = rc->free_list;
  rc->free_list = p;
}

/* Posts child k of p on its rail: 1 posted, 0 not now, -1 failed (*res). */
static int child_post(fab_rails_parent* p, int k, fab_result* res) {
  fab_rails_child* ch = &p->child[k];
  fab_comm* c = p->rc->c[ch->rail];
  void* data[FAB_MAX_RECVS];
  size_t len[FAB_MAX_RECVS];
  int tags[FAB_MAX_RECVS];
  fab_mr* mrs[FAB_MAX_RECVS];
  void* phandles[FAB_MAX_RECVS];
  int profiled = 0;
  for (int j = 0; j < ch->n; j++) {
    int i = ch->idx[j];
    data[j] = p->data[i], len[j] = p->len[i], tags[j] = p->tags[i], mrs[j] = p->mrs[i], phandles[j] = p->phandles[i];
    profiled |= phandles[j] != NULL;
  }
  *res = c->ops->irecv(c, ch->n, data, len, tags, mrs, &ch->req);
  if (*res != FAB_OK) return -1;
  if (!ch->req) {
    *res = fab_comm_not_now(c, "irecv");
    return *res == FAB_OK ? 0 : -1;
  }
  ch->posted = 1;
  if (p->prof && profiled) /* events name the runtime's buffers */
    p->prof_taken |= (uint8_t)fab_prof_posted_part(ch->req, phandles, len, tags, ch->idx, p->n);
  if (p->prof && k == p->nchild - 1) fab_prof_count(p->rc->c[0], p->prof_taken); /* one post of the comm */
  return 1;
}

/* Posts the children of the comm's parents that could not be posted yet,
 * oldest first. FAB_OK when nothing is left, or when a rail cannot take one
 * now (unposted_head stays). */
static fab_result post_unposted(fab_rails_comm* rc) {
  while (rc->unposted_head) {
    fab_rails_parent* p = rc->unposted_head;
    while (p->nposted < p->nchild) {
      fab_result res = FAB_OK;
      int r = child_post(p, p->nposted, &res);
      if (r < 0) return res;
      if (r == 0) return FAB_OK;
      p->nposted++;
    }
    rc->unposted_head = p->next;
    if (!rc->unposted_head) rc->unposted_tail = NULL;
    p->next = NULL;
  }
  return FAB_OK;
}

/* Splits buffers by rail into children of p (rails in order). */
static void split(fab_rails_parent* p, const int* rail) {
  for (int r = 0; r < p->rc->n; r++) {
    fab_rails_child* ch = &p->child[p->nchild];
    ch->rail = r;
    for (int i = 0; i < p->n; i++)
      if (rail[i] == r) ch->idx[ch->n++] = i;
    if (ch->n) p->nchild++;
  }
}

static fab_result recv_args_ok(fab_rails_comm* rc, int n, void** data, const size_t* sizes, const int* tags,
                               void** mhandles) {
  if (n < 1 || n > FAB_MAX_RECVS) return fab_bad_argument("irecv", "n", n, "1..8 (maxRecvs)");
  if (!data || !sizes || !tags) return fab_bad_argument("irecv", "data/sizes/tags", 0, "arrays of n");
  for (int i = 0; i < n; i++) {
    fab_result res = fab_buffer_ok(rc->dev->name, rc->dev->props.max_p2p_bytes, i, data[i], sizes[i],
                                   mhandles ? mhandles[i] : NULL);
    if (res != FAB_OK) return res;
    if (tags[i] < FAB_RAILS_TAG_MIN) return reserved_tag("irecv", tags[i]);
  }
  return FAB_OK;
}

/* The rail of each buffer: the k-th buffer of a tag, counting the earlier
 * buffers of this receive with the same tag. */
static void rails_of_buffers(fab_rails_comm* rc, int n, const int* tags, int* rail, uint32_t* ks) {
  for (int i = 0; i < n; i++) {
    uint32_t k = fab_tagmap_peek(&rc->tags, tags[i]);
    for (int j = 0; j < i; j++) k += tags[j] == tags[i];
    rail[i] = fab_rails_rail_for(rc, tags[i], k);
    ks[i] = k;
  }
}

static fab_result take_tags(fab_rails_comm* rc, int n, const int* tags) {
  for (int i = 0; i < n; i++) {
    if (fab_tagmap_take(&rc->tags, tags[i]) < 0) {
      for (int j = 0; j < i; j++) fab_tagmap_untake(&rc->tags, tags[j]);
      FAB_WARN("irecv: out of memory");
      return FAB_ERR_SYSTEM;
    }
  }
  return FAB_OK;
}

static void untake_tags(fab_rails_comm* rc, int n, const int* tags) {
  for (int i = n - 1; i >= 0; i--) fab_tagmap_untake(&rc->tags, tags[i]);
}

/* Every buffer on one rail: that rail's own receive and request. */
static fab_result recv_on_one_rail(fab_rails_comm* rc, int rail, int n, void** data, const size_t* sizes,
                                   const int* tags, void** mhandles, void** phandles, void** request) {
  fab_comm* c = rc->c[rail];
  fab_mr* mrs[FAB_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    void* mh = fab_rails_member_mh(mhandles ? mhandles[i] : NULL, rail);
    fab_result res = fab_mr_resolve(c, mh, data[i], sizes[i], "irecv", &mrs[i]);
    if (res != FAB_OK) return res;
  }
  fab_result res = take_tags(rc, n, tags);
  if (res != FAB_OK) return res;
  res = c->ops->irecv(c, n, data, sizes, tags, mrs, request);
  if (res != FAB_OK || !*request) {
    untake_tags(rc, n, tags);
    return res != FAB_OK ? res : fab_comm_not_now(c, "irecv");
  }
  if (phandles && fab_prof_wanted(fab_rails_prof(rc)))
    fab_prof_count(rc->c[0], fab_prof_posted_part(*request, phandles, sizes, tags, NULL, n));
  return FAB_OK;
}

/* The buffers of p that may receive a split message (at least the sender's
 * threshold) get a stripe state. 0, or not now (-1 with *res FAB_OK). */
static int stripes_get(fab_rails_comm* rc, fab_rails_parent* p, void** mhandles, fab_result* res) {
  for (int i = 0; i < p->n; i++) {
    if (!rc->stripe_from || p->len[i] < rc->stripe_from) continue;
    fab_stripe_recv* sr = fab_stripe_recv_get(rc, res);
    if (!sr) return -1;
    sr->tag = p->tags[i];
    sr->k = p->k[i];
    sr->rail = fab_rails_rail_for(rc, p->tags[i], p->k[i]);
    sr->data = p->data[i];
    sr->cap = p->len[i];
    sr->mhandle = mhandles ? mhandles[i] : NULL;
    p->st[i] = sr;
    p->nstriped++;
  }
  return 0;
}

static void parent_release(fab_rails_parent* p) {
  for (int i = 0; i < p->n; i++)
    if (p->st[i]) fab_stripe_recv_put(p->rc, p->st[i]);
  parent_put(p);
}

/* Buffers on several rails, or buffers that may receive split messages: a
 * parent request over one receive per rail (and the stripes). */
static fab_result recv_on_rails(fab_rails_comm* rc, const int* rail, const uint32_t* ks, int n, void** data,
                                const size_t* sizes, const int* tags, void** mhandles, void** phandles,
                                void** request) {
  fab_rails_parent* p = parent_get(rc);
  if (!p) return FAB_OK; /* all in flight: NCCL retries */
  p->n = n;
  for (int i = 0; i < n; i++) {
    p->data[i] = data[i], p->len[i] = sizes[i], p->tags[i] = tags[i], p->k[i] = ks[i];
    p->phandles[i] = phandles ? phandles[i] : NULL;
    fab_result res = fab_mr_resolve(rc->c[rail[i]], fab_rails_member_mh(mhandles ? mhandles[i] : NULL, rail[i]),
                                    data[i], sizes[i], "irecv", &p->mrs[i]);
    if (res != FAB_OK) {
      parent_put(p);
      return res;
    }
  }
  fab_result res = FAB_OK;
  if (stripes_get(rc, p, mhandles, &res) != 0 || (res = take_tags(rc, n, tags)) != FAB_OK) {
    parent_release(p);
    return res; /* FAB_OK: no stripe state free, NCCL retries */
  }
  split(p, rail);
  p->prof = phandles && fab_prof_wanted(fab_rails_prof(rc)); /* one post of the comm, whatever its rails */
  if (p->nstriped) parent_hold_rails(p);
  p->head = (fab_req_head){.magic = FAB_REQ_MAGIC, .state = FAB_REQ_ACTIVE, .kind = &parent_kind};
  if (rc->unposted_tail) rc->unposted_tail->next = p;
  else rc->unposted_head = p;
  rc->unposted_tail = p;
  res = post_unposted(rc); /* a failure leaves p out of the pool until the comm closes */
  if (res == FAB_OK) *request = p;
  return res;
}

fab_result fab_rails_irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags,
                           void** mhandles, void** phandles, void** request) {
  fab_rails_comm* rc = comm_or_warn(recv_comm, FAB_OBJ_RAILS_RECV, "irecv");
  if (!rc) return FAB_ERR_INTERNAL;
  fab_result res = recv_args_ok(rc, n, data, sizes, tags, mhandles);
  if (res == FAB_OK) res = rails_ok(rc, "irecv");
  if (res == FAB_OK) res = post_unposted(rc);
  if (res != FAB_OK || rc->unposted_head) return res; /* earlier receives first: NCCL retries */
  int rail[FAB_MAX_RECVS] = {0};
  uint32_t ks[FAB_MAX_RECVS] = {0};
  rails_of_buffers(rc, n, tags, rail, ks);
  int one = 1;
  for (int i = 0; i < n; i++) one &= rail[i] == rail[0] && (!rc->stripe_from || sizes[i] < rc->stripe_from);
  if (one) return recv_on_one_rail(rc, rail[0], n, data, sizes, tags, mhandles, phandles, request);
  return recv_on_rails(rc, rail, ks, n, data, sizes, tags, mhandles, phandles, request);
}

/* Flushing makes the GPU see what the NICs wrote: the CUDA flush covers
 * every NIC's writes, so it goes through rail 0. */
fab_result fab_rails_iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request) {
  fab_rails_comm* rc = comm_or_warn(recv_comm, FAB_OBJ_RAILS_RECV, "iflush");
  if (!rc) return FAB_ERR_INTERNAL;
  if (n < 1 || n > FAB_MAX_RECVS) return fab_bad_argument("iflush", "n", n, "1..8 (maxRecvs)");
  if (!data || !sizes) return fab_bad_argument("iflush", "data/sizes", 0, "arrays of n");
  fab_comm* c = rc->c[0];
  fab_mr* mrs[FAB_MAX_RECVS];
  for (int i = 0; i < n; i++) {
    if (sizes[i] < 0) return fab_bad_argument("iflush", "sizes[i]", sizes[i], ">= 0");
    fab_result res = fab_mr_resolve(c, fab_rails_member_mh(mhandles ? mhandles[i] : NULL, 0), data[i], (size_t)sizes[i],
                                    "iflush", &mrs[i]);
    if (res != FAB_OK) return res;
  }
  return c->ops->iflush(c, n, data, sizes, mrs, request);
}

/* --- test ------------------------------------------------------------------------- */

/* Tests p's posted children; a failed one fails p (its WARN names the rail),
 * and p goes back: the other rails' receives stay with their comms, which
 * the runtime closes after a failure. */
/* Buffer i of p that may have received a split message: 1 pending, 0 done,
 * -1 failed (*res). */
static int striped_test(fab_rails_parent* p, int i, fab_result* res) {
  return fab_stripe_recv_test(p->rc, p->st[i], p->got[i], &p->sizes[i], res);
}

/* Some buffer of p may have received a split message whose notice is not
 * in yet. */
static int waits_for_notice(const fab_rails_parent* p) {
  for (int i = 0; i < p->n && p->nstriped; i++)
    if (p->st[i] && !p->st[i]->noticed && !p->st[i]->done) return 1;
  return 0;
}

/* Tests p's posted children: 1 while some are left. A failed one fails p
 * (p->result; its own WARN names the rail). */
static int parent_busy(fab_req_head* h, int poll) {
  (void)poll; /* the children's tests drive their rails */
  fab_rails_parent* p = (fab_rails_parent*)h;
  fab_rails_comm* rc = p->rc;
  fab_result res = post_unposted(rc);
  if (res == FAB_OK && waits_for_notice(p)) res = fab_stripe_pump(rc);
  int left = 0;
  for (int k = 0; k < p->nchild && res == FAB_OK; k++) {
    fab_rails_child* ch = &p->child[k];
    if (ch->done) continue;
    if (!ch->posted) {
      left++;
      continue;
    }
    int d = 0;
    int got[FAB_MAX_RECVS];
    res = fab_req_test_helped(ch->req, &d, got);
    if (res == FAB_OK && !d) left++;
    if (res != FAB_OK || !d) continue;
    ch->done = 1;
    for (int j = 0; j < ch->n; j++) p->sizes[ch->idx[j]] = got[j], p->got[ch->idx[j]] = 1;
  }
  for (int i = 0; i < p->n && res == FAB_OK && p->nstriped; i++)
    if (p->st[i] && striped_test(p, i, &res) == 1) left++;
  p->result = res;
  return res == FAB_OK && left;
}

static fab_result parent_finish(fab_req_head* h, int* sizes) {
  fab_rails_parent* p = (fab_rails_parent*)h;
  if (p->result == FAB_OK && sizes) memcpy(sizes, p->sizes, (size_t)p->n * sizeof(int));
  return p->result;
}

/* p goes back; after a failure, one with children not posted yet stays
 * queued (its rails still get their receives) until the comm closes. */
static void parent_done(fab_req_head* h) {
  fab_rails_parent* p = (fab_rails_parent*)h;
  if (p->nposted == p->nchild)
    parent_release(p);
  else
    h->state = FAB_REQ_ORPHAN;
}

static const fab_req_steps parent_steps = {parent_busy,   fab_req_parts_stalled, fab_req_parts_give_up,
                                           parent_finish, fab_req_parts_explain, parent_done};

static fab_result parent_test(fab_req_head* h, int* done, int* sizes) {
  return fab_req_run(h, done, sizes, &parent_steps, 1);
}

static const fab_req_kind parent_kind = {.name = "irecv over several rails", .api = FAB_REQ_API_NET,
                                         .test = parent_test};

/* --- registration ------------------------------------------------------------------- */

fab_result fab_rails_reg_mr(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle,
                            const char* fn) {
  fab_obj_kind kind = fab_obj_kind_of(comm);
  fab_rails_comm* rc = fab_obj_get(comm, kind == FAB_OBJ_RAILS_SEND ? FAB_OBJ_RAILS_SEND : FAB_OBJ_RAILS_RECV);
  if (!rc) {
    FAB_WARN("%s: %p is not a live send or recv comm", fn, comm);
    return FAB_ERR_INTERNAL;
  }
  fab_rails_mr* m = calloc(1, sizeof(*m));
  if (!m) {
    FAB_WARN("%s: out of memory", fn);
    return FAB_ERR_SYSTEM;
  }
  m->magic = FAB_RAILS_MAGIC;
  m->dev = rc->dev;
  fab_result res = FAB_OK;
  for (; m->n < rc->n && res == FAB_OK; m->n++)
    res = fab_mr_register(rc->c[m->n], data, size, type, offset, fd, &m->mh[m->n], fn);
  if (res == FAB_OK && !(m->handle = fab_obj_add(FAB_OBJ_RAILS_MR, m))) {
    FAB_WARN("%s: handle table full; deregister unused buffers", fn);
    res = FAB_ERR_SYSTEM;
  }
  if (res != FAB_OK) {
    for (int k = 0; k < m->n; k++)
      if (m->mh[k]) fab_mr_deregister(m->mh[k]);
    free(m);
    return res;
  }
  *mhandle = m->handle;
  return FAB_OK;
}

fab_result fab_rails_dereg_mr(void* mhandle) {
  fab_rails_mr* m = fab_obj_remove(mhandle, FAB_OBJ_RAILS_MR);
  if (!m) return fab_mr_deregister(mhandle);
  fab_result res = FAB_OK;
  int held = 0; /* operations its rails' registrations still back: one WARN for them all */
  for (int k = 0; k < m->n; k++) {
    int h;
    fab_result r = fab_mr_deregister_held(m->mh[k], &h);
    held += h;
    if (res == FAB_OK) res = r;
  }
  if (held > 0) fab_mr_warn_held(mhandle, held);
  m->magic = 0;
  free(m);
  return res;
}

void fab_rails_data_let_go(fab_rails_comm* rc) {
  for (int i = 0; rc->parents && i < FAB_RAILS_PARENTS; i++)
    if (rc->parents[i].head.state != FAB_REQ_FREE) parent_let_go(&rc->parents[i]); /* never tested to the end */
}

void fab_rails_data_free(fab_rails_comm* rc) {
  fab_stripe_free(rc);
  fab_reqmem_free(rc->parents, FAB_RAILS_PARENTS * sizeof(*rc->parents));
  rc->parents = NULL;
  fab_tagmap_free(&rc->tags);
}
