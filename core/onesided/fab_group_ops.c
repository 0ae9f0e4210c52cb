/* One-sided operations of a group: requests, put / put-with-signal / get /
 * flush / test, and the target side that counts puts and applies signals.
 * See fab_group.h for the protocol. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_group.h"
#include "fab_devcopy.h"
#include "fab_req.h"
#include "fab_transport.h"

/* Requests in request memory (fab_reqhead.h), FAB_GROUP_REQ_CHUNK at a time. */
typedef struct req_chunk {
  fab_list node;
  fab_group_req reqs[FAB_GROUP_REQ_CHUNK];
} req_chunk;

static void op_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err);
static const fab_req_kind group_req_kind;

/* --- progress ----------------------------------------------------------------------- */

fab_result fab_group_poll(fab_group* g) {
  for (int i = 0; i < g->neps; i++) {
    fab_result rc = fab_ep_poll(g->eps[i]);
    if (rc != FAB_OK) return rc;
  }
  return FAB_OK;
}

static fab_result progress_locked(fab_group* g) {
  fab_result rc = fab_group_poll(g);
  if (rc != FAB_OK) return fab_group_fail(g, rc, "rmaProgress", "its endpoint's completion queue failed");
  return fab_group_post_waiting(g);
}

/* Every live group of the process: every 16th progress of a group, and
 * every retry, serve the others' due acknowledgements and staged copies too.
 * A runtime may drive one group only while the peer waits on another's: with
 * each group progressed only through its own calls, the two processes waited
 * on each other for ever (functional.rma.*.two_groups). Not on every progress,
 * and without polling again: with NCCL's two groups that cost shm a third of
 * its bandwidth (NCCL progresses every group itself). */
static pthread_mutex_t groups_lock = PTHREAD_MUTEX_INITIALIZER;
static fab_list groups = {&groups, &groups};

void fab_group_register(fab_group* g) {
  pthread_mutex_lock(&groups_lock);
  fab_list_push(&groups, &g->live);
  pthread_mutex_unlock(&groups_lock);
}

void fab_group_unregister(fab_group* g) {
  pthread_mutex_lock(&groups_lock);
  fab_list_del(&g->live);
  pthread_mutex_unlock(&groups_lock);
}

/* Posts the due work of the other groups whose lock is free (never waits
 * for one: the caller may hold its own). */
static void serve_others(fab_group* self) {
  if (pthread_mutex_trylock(&groups_lock) != 0) return;
  FAB_LIST_FOREACH_SAFE(it, tmp, &groups) {
    fab_group* h = FAB_CONTAINER_OF(it, fab_group, live);
    if (h == self || !atomic_load_explicit(&h->due, memory_order_acquire)) continue;
    if (pthread_mutex_trylock(&h->lock) != 0) continue;
    fab_group_post_waiting(h); /* no polling: whoever polls dispatches, and a second poll of shared endpoints
                               * cost shm a third of its bandwidth */
    pthread_mutex_unlock(&h->lock);
  }
  pthread_mutex_unlock(&groups_lock);
}

/* Polling needs no lock; posting waiting records and acknowledgements does,
 * and is only done when something flagged it due. */
fab_result fab_group_progress(fab_group* g) {
  fab_result rc = fab_group_poll(g);
  if (rc != FAB_OK) return fab_group_fail(g, rc, "rmaProgress", "its endpoint's completion queue failed");
  uint32_t n = atomic_load_explicit(&g->progress_calls, memory_order_relaxed) + 1;
  atomic_store_explicit(&g->progress_calls, n, memory_order_relaxed);
  if (n % FAB_GROUP_SERVE_OTHERS_EVERY == 0) serve_others(g);
  if (!atomic_load_explicit(&g->due, memory_order_acquire)) return FAB_OK;
  pthread_mutex_lock(&g->lock);
  rc = fab_group_post_waiting(g);
  pthread_mutex_unlock(&g->lock);
  return rc;
}

/* --- requests (g->lock) ------------------------------------------------------------- */

static fab_group_req* req_get(fab_group* g, fab_group_peer* p, int nops) {
  if (fab_list_empty(&g->free_reqs)) {
    req_chunk* ch = fab_reqmem_alloc(sizeof(*ch)); /* zeroed */
    if (!ch) return NULL;
    fab_list_push(&g->chunks, &ch->node);
    for (int i = 0; i < FAB_GROUP_REQ_CHUNK; i++) {
      ch->reqs[i].head.magic = FAB_REQ_MAGIC;
      ch->reqs[i].head.kind = &group_req_kind;
      ch->reqs[i].group = g;
      fab_op_init(&ch->reqs[i].ops[0], op_done, &ch->reqs[i], 0);
      fab_op_init(&ch->reqs[i].ops[1], op_done, &ch->reqs[i], 1);
      fab_list_push(&g->free_reqs, &ch->reqs[i].node);
    }
  }
  fab_list* n = fab_list_pop(&g->free_reqs);
  if (!n) return NULL;
  fab_group_req* r = FAB_CONTAINER_OF(n, fab_group_req, node);
  r->head.state = FAB_REQ_ACTIVE;
  r->flush = 0;
  r->st_get = 0;
  r->peer = p;
  r->result = FAB_OK;
  r->why[0] = 0;
  atomic_store_explicit(&r->failed, 0, memory_order_relaxed);
  atomic_store_explicit(&r->pending, nops, memory_order_relaxed);
  return r;
}

static void req_put(fab_group_req* r) {
  r->head.state = FAB_REQ_FREE;
  fab_list_push(&r->group->free_reqs, &r->node);
}

int fab_group_busy(fab_group* g) {
  for (int i = 0; i < g->nranks; i++) /* an acknowledgement write's completion names its peer */
    if (atomic_load_explicit(&g->peers[i].ack_inflight, memory_order_acquire)) return 1;
  FAB_LIST_FOREACH_SAFE(it, tmp, &g->chunks) {
    req_chunk* ch = FAB_CONTAINER_OF(it, req_chunk, node);
    for (int i = 0; i < FAB_GROUP_REQ_CHUNK; i++)
      if (ch->reqs[i].head.state != FAB_REQ_FREE && atomic_load(&ch->reqs[i].pending) > 0) return 1;
  }
  return 0;
}

void fab_group_reqs_free(fab_group* g) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &g->chunks) {
    fab_list_del(it);
    fab_reqmem_free(FAB_CONTAINER_OF(it, req_chunk, node), sizeof(req_chunk));
  }
}

static void op_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  (void)done;
  fab_group_req* r = op->owner;
  fab_group_req_op_over(r, err ? err->err : 0, op->index ? "a signal" : "a one-sided operation");
}

/* An operation that could not be posted: it counts as done and failed, and
 * test reports it (one WARN there, naming fn's operation). */
static fab_result not_posted(fab_group_req* r, int i, ssize_t rc, const char* fn) {
  fab_result res = fab_result_from_fi((int)-rc);
  if (!atomic_exchange(&r->failed, 1)) {
    r->result = res;
    snprintf(r->why, sizeof(r->why), "%s to rank %d could not be posted: %s", fn, r->peer->rank,
             fi_strerror((int)-rc));
  }
  op_done(&r->ops[i], NULL, NULL); /* counts as done: nothing of it is in flight */
  return res;
}

/* -FI_EAGAIN: drive ep, every endpoint of the group (the peer's writes land
 * on its target endpoint, which may not be ep: shm gives a second send comm to
 * a peer an endpoint of its own) and the other groups' due work, then retry,
 * for at most FABRIC_PEER_TIMEOUT_MS. */
static int again(fab_group* g, fab_endpoint* ep, int64_t* deadline) {
  int64_t now = fab_now_ms();
  if (!*deadline) *deadline = now + (fab_g.params.peer_timeout_ms > 0 ? fab_g.params.peer_timeout_ms : 30000);
  fab_ep_poll(ep);
  fab_group_poll(g);
  serve_others(g);
  sched_yield(); /* the peer that must make room may share this core */
  return now < *deadline;
}

/* --- signals: the source side ------------------------------------------------------- */

static int ring_room(fab_group_peer* p, uint32_t seq) {
  return seq - atomic_load_explicit(&p->sig_acked, memory_order_acquire) < FAB_GROUP_RING;
}

static fab_result post_sig(fab_group_req* r) {
  fab_group_peer* p = r->peer;
  uint32_t slot = r->sig.seq % FAB_GROUP_RING;
  uint64_t data = p->sc->ops->onesided_data(p->sc, fab_group_cq_low(FAB_GROUP_SIGNAL, slot));
  int64_t deadline = 0;
  ssize_t rc;
  do rc = fab_remote_inject_writedata(p->sc->ep, p->sc->peer, &r->sig, sizeof(r->sig), &p->ring,
                                   (uint64_t)slot * sizeof(fab_group_sig), data, &r->ops[1]);
  while (rc == -FI_EAGAIN && again(p->group, p->sc->ep, &deadline));
  return rc == 0 ? FAB_OK : not_posted(r, 1, rc, "iputSignal");
}

void fab_group_ack_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_group_peer* p = op->owner;
  if (err) fab_group_fail(p->group, fab_result_from_fi(err->err), "rmaProgress", "an acknowledgement write failed");
  atomic_store_explicit(&p->ack_inflight, 0, memory_order_release);
  atomic_store_explicit(&p->group->due, 1, memory_order_release); /* a held-back acknowledgement may go now */
}

/* One acknowledgement write in flight per peer, carrying a count mod 2^24:
 * signal records applied (ring slots given back) or the landed prefix of
 * the peer's puts (its put window). */
static fab_result post_ack(fab_group* g, fab_group_peer* p, unsigned kind, uint64_t value) {
  atomic_store_explicit(&p->ack_inflight, 1, memory_order_relaxed);
  p->ack_word = value;
  uint64_t data = p->sc->ops->onesided_data(p->sc, fab_group_cq_low(kind, (uint32_t)value));
  ssize_t rc = fab_remote_inject_writedata(p->sc->ep, p->sc->peer, &p->ack_word, sizeof(p->ack_word), &p->ring,
                                        FAB_GROUP_RING * sizeof(fab_group_sig), data, &p->ack_op);
  if (rc == 0) return FAB_OK;
  atomic_store_explicit(&p->ack_inflight, 0, memory_order_relaxed);
  if (rc == -FI_EAGAIN) return FAB_ERR_INTERNAL; /* not now: the next progress tries again */
  return fab_group_fail(g, fab_result_from_fi((int)-rc), "rmaProgress", "posting an acknowledgement failed");
}

/* The put prefix once a quarter of the window has landed (first: it is rare,
 * and a stream of signals must not starve it), else staging slots as soon as
 * chunks are copied out, else signal slots as soon as records are applied
 * (a source may be waiting for either). *pending: an
 * acknowledgement is still owed (one in flight, or the provider said "not
 * now"): the caller must come back, since nothing else will flag it due
 * again while the source waits for it. */
static fab_result acknowledge(fab_group* g, fab_group_peer* p, int* pending) {
  if (atomic_load_explicit(&p->ack_inflight, memory_order_acquire)) {
    *pending = 1;
    return FAB_OK;
  }
  uint64_t landed = atomic_load_explicit(&p->puts_landed_pub, memory_order_acquire);
  uint32_t applied = atomic_load_explicit(&p->sig_applied, memory_order_acquire);
  fab_result rc = FAB_OK;
  uint32_t copied = atomic_load_explicit(&p->rx_done, memory_order_acquire);
  if (landed - p->puts_acked_sent >= FAB_GROUP_PUT_WINDOW / 4) {
    rc = post_ack(g, p, FAB_GROUP_ACK_PUTS, landed);
    if (rc == FAB_OK) p->puts_acked_sent = landed;
  } else if (copied != p->rx_acked_sent) { /* staging slots back: a source may be waiting for them */
    rc = post_ack(g, p, FAB_GROUP_ACK_STAGED, copied);
    if (rc == FAB_OK) p->rx_acked_sent = copied;
  } else if (applied != p->consumed_acked) {
    rc = post_ack(g, p, FAB_GROUP_ACK, applied);
    if (rc == FAB_OK) p->consumed_acked = applied;
  } else {
    return FAB_OK;
  }
  *pending = 1; /* the one posted (or refused for now); another may follow it */
  return rc == FAB_ERR_INTERNAL ? FAB_OK : rc;
}

/* --- gets by request (staged windows), the target side ------------------------------ */

/* Answers p's gets in order: each is a staged put of ours into p's staging
 * ring, its chunks numbered puts of ours. 1 while some wait. g->lock held. */
static int serve_gets(fab_group* g, fab_group_peer* p) {
  uint32_t tail = atomic_load_explicit(&p->ask_tail, memory_order_relaxed);
  while (tail != atomic_load_explicit(&p->ask_head, memory_order_acquire)) {
    fab_group_ask a = p->asks[tail % FAB_GROUP_GETS];
    if (!p->stage_slots) {
      fab_group_fail(g, FAB_ERR_REMOTE, "rmaProgress", "a peer asked for a get but has no staging ring to take it");
      return 0;
    }
    uint64_t nchunks = fab_group_stage_chunks(p, a.size, 1);
    if (p->puts_posted + fab_group_window_need(nchunks) - atomic_load_explicit(&p->puts_acked, memory_order_acquire) >
        FAB_GROUP_PUT_WINDOW)
      return 1; /* once the peer acknowledges more of our puts */
    pthread_mutex_lock(&g->target_ep->lock);
    fab_group_win* w = a.window < g->nwins ? g->wins[a.window] : NULL;
    pthread_mutex_unlock(&g->target_ep->lock);
    fab_group_req* r = w ? req_get(g, p, (int)nchunks) : NULL;
    if (!r) {
      fab_group_fail(g, w ? FAB_ERR_SYSTEM : FAB_ERR_INVALID_USAGE, "rmaProgress",
                    w ? "out of memory for the answer to a get" : "a window was deregistered while a peer's get "
                        "from it was waiting to be answered");
      return 0;
    }
    r->st_src = w;
    r->st_dst = NULL;
    r->st_src_off = a.offset;
    r->st_dst_off = 0;
    r->st_left = a.size;
    r->st_ring = 1;
    r->st_get = 1;
    r->st_get_id = a.id;
    r->st_put = p->puts_posted;
    p->puts_posted += nchunks;
    p->ops_posted += nchunks;
    fab_list_push(&g->owned, &r->own_node);
    fab_group_stage_put(p, r);
    atomic_store_explicit(&p->ask_tail, ++tail, memory_order_release);
  }
  return 0;
}

/* Requests nobody tests (answers to gets, withdrawals): freed once complete. */
static void sweep_owned(fab_group* g) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &g->owned) {
    fab_group_req* r = FAB_CONTAINER_OF(it, fab_group_req, own_node);
    if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) continue;
    fab_list_del(&r->own_node);
    req_put(r);
  }
}

fab_result fab_group_post_waiting(fab_group* g) {
  atomic_store_explicit(&g->due, 0, memory_order_relaxed);
  int again = 0;
  fab_group_target_drain(g);
  sweep_owned(g);
  again |= !fab_list_empty(&g->owned);
  for (int i = 0; i < g->nranks; i++) {
    fab_group_peer* p = &g->peers[i];
    if (!p->sc) continue;
    if (p->asks) again |= serve_gets(g, p);
    again |= fab_group_stage_pump(p);
    while (!fab_list_empty(&p->waiting)) {
      fab_group_req* r = FAB_CONTAINER_OF(p->waiting.next, fab_group_req, node);
      if (!ring_room(p, r->sig.seq)) break;
      fab_list_del(&r->node);
      post_sig(r); /* a failure is the request's */
    }
    int owed = 0;
    fab_result rc = acknowledge(g, p, &owed);
    if (rc != FAB_OK) return rc;
    again |= owed || !fab_list_empty(&p->waiting);
  }
  if (again) atomic_store_explicit(&g->due, 1, memory_order_release); /* come back on the next progress */
  return FAB_OK;
}

/* --- argument checks ------------------------------------------------------------------ */

typedef struct op_target {
  fab_group* g;
  fab_group_peer* p; /* NULL: the rank is our own */
} op_target;

static fab_result resolve(void* rma_ctx, int context, uint32_t rank, void** request, const char* fn,
                          op_target* t) {
  if (!request) return fab_bad_argument(fn, "request", 0, "a non-NULL pointer");
  *request = NULL;
  fab_group_ctx* x = fab_obj_get(rma_ctx, FAB_OBJ_COLL_CTX);
  fab_group* g = x ? x->group : fab_obj_get(rma_ctx, FAB_OBJ_COLL); /* GIN v11/v12 pass the comm itself */
  if (!g) {
    FAB_WARN("%s: %p is not a live RMA context or collective comm; pass what createContext (or connect) returned",
             fn, rma_ctx);
    return FAB_ERR_INTERNAL;
  }
  int ncontexts = x ? x->ncontexts : g->own_contexts;
  if (context < 0 || context >= ncontexts) return fab_bad_argument(fn, "context", context, "0..nContexts-1");
  if (rank >= (uint32_t)g->nranks) return fab_bad_argument(fn, "rank", rank, "0..nranks-1");
  int failed = atomic_load(&g->failed);
  if (failed) {
    FAB_WARN("%s: the RMA group has failed: %s; close it", fn, g->why);
    return (fab_result)failed;
  }
  t->g = g;
  t->p = (int)rank == g->rank ? NULL : &g->peers[rank];
  if (t->p && t->p->sc->error != FAB_OK) {
    FAB_WARN("%s: the connection to rank %u has failed: %s; close the RMA comm", fn, rank, t->p->sc->error_why);
    return t->p->sc->error;
  }
  return FAB_OK;
}

/* The window behind mhandle, of this group, with [off, off+len) inside
 * rank's registration of it. */
static fab_group_win* window(fab_group* g, void* mhandle, const char* arg, int rank, uint64_t off, uint64_t len,
                            const char* fn) {
  fab_group_win* w = fab_obj_get(mhandle, FAB_OBJ_COLL_WIN);
  if (!w || w->group != g) {
    FAB_WARN("%s: %s %p is not a live symmetric registration of this RMA comm; pass what regMrSym returned", fn, arg,
             mhandle);
    return NULL;
  }
  if (rank != g->rank && atomic_load_explicit(&w->remote_gone[rank], memory_order_acquire)) {
    FAB_WARN("%s: %s %p: rank %d has deregistered its registration of this window (deregMrSym), so nothing may "
             "be written into or read from it there any more; deregister on every rank together, after the last "
             "operation on it", fn, arg, mhandle, rank);
    return NULL;
  }
  const fab_window* win = &w->remote[rank];
  if (!fab_window_covers(win, off, len)) {
    FAB_WARN("%s: %s: %llu bytes at offset %llu lie outside rank %d's registration of %llu bytes", fn, arg,
             (unsigned long long)len, (unsigned long long)off, rank, (unsigned long long)win->len);
    return NULL;
  }
  return w;
}

/* --- operations ----------------------------------------------------------------------- */

typedef struct sig_args {
  uint64_t off;
  void* mhandle;
  uint64_t value;
  uint32_t op;
} sig_args;

static fab_result done_at_once(fab_group* g, fab_group_peer* p, void** request) {
  pthread_mutex_lock(&g->lock);
  fab_group_req* r = req_get(g, p, 0);
  pthread_mutex_unlock(&g->lock);
  if (!r) {
    FAB_WARN("RMA: out of memory for a request");
    return FAB_ERR_SYSTEM;
  }
  *request = r;
  return FAB_OK;
}

/* Posts r's record (r->sig, numbered) into p's ring, or queues it in order
 * until the peer gives a slot back. g->lock held. */
static fab_result post_record(fab_group* g, fab_group_peer* p, fab_group_req* r) {
  r->sig.check = fab_group_sig_check(&r->sig);
  if (fab_list_empty(&p->waiting) && ring_room(p, r->sig.seq)) return post_sig(r);
  fab_list_push(&p->waiting, &r->node); /* posted in order as the peer gives slots back */
  atomic_store_explicit(&g->due, 1, memory_order_release);
  return FAB_OK;
}

void fab_group_withdraw(fab_group* g, fab_group_win* w) {
  uint32_t* seq = calloc((size_t)g->nranks, sizeof(*seq));
  if (!seq) return; /* out of memory: the registration closes unannounced, as before there was a withdrawal */
  pthread_mutex_lock(&g->lock);
  for (int i = 0; i < g->nranks; i++) {
    fab_group_peer* p = &g->peers[i];
    fab_group_req* r = p->sc && !atomic_load(&g->failed) ? req_get(g, p, 1) : NULL;
    if (!r) continue;
    seq[i] = atomic_fetch_add_explicit(&p->sig_seq, 1, memory_order_relaxed) + 1;
    /* applied after every put of ours to p so far: p then knows none of ours into its window is on the way */
    r->sig = (fab_group_sig){.puts_before = p->puts_posted, .seq = seq[i] - 1, .window = w->id,
                            .op = FAB_GROUP_OP_WITHDRAW, .token = g->token};
    p->ops_posted++;
    fab_list_push(&g->owned, &r->own_node);
    post_record(g, p, r);
  }
  pthread_mutex_unlock(&g->lock);
  int64_t until = fab_now_ms() + FAB_GROUP_WITHDRAW_WAIT_MS;
  while (!atomic_load(&g->failed)) {
    /* a peer is through once it acknowledged our record, or withdrew the window itself (deregistered
     * together): its handle is gone, and its puts into ours landed before its record applied here */
    int waiting = -1; /* the first rank still to confirm */
    for (int i = 0; i < g->nranks && waiting < 0; i++)
      if (seq[i] && (int32_t)(atomic_load_explicit(&g->peers[i].sig_acked, memory_order_acquire) - seq[i]) < 0 &&
          !atomic_load_explicit(&w->remote_gone[i], memory_order_acquire))
        waiting = i;
    if (waiting < 0) break;
    if (fab_now_ms() > until) {
      FAB_WARN("deregMrSym: rank %d did not confirm within %d ms that it saw window #%u withdrawn (it is not "
               "progressing its RMA comm); a write of its into the window from now on fails at the provider",
               waiting, FAB_GROUP_WITHDRAW_WAIT_MS, w->id);
      break;
    }
    if (fab_group_progress(g) != FAB_OK) break; /* the group failed: nothing more moves */
    serve_others(g);
    sched_yield();
  }
  free(seq);
}

/* Our own rank: the data and the signal are placed here and now (GPU
 * windows through fab_devcopy, in order, so the signal follows the data). */
static fab_result self_put(fab_group* g, fab_group_win* src, uint64_t src_off, size_t size, fab_group_win* dst,
                           uint64_t dst_off, fab_group_win* sw, const sig_args* s, const char* fn) {
  const char* what = NULL;
  if (size && fab_devcopy((char*)dst->base + dst_off, dst->gpu, (char*)src->base + src_off, src->gpu, size, &what)) {
    FAB_WARN("%s: copying %zu bytes to our own rank failed: %s failed", fn, size, what);
    return FAB_ERR_CUDA;
  }
  if (!sw) return FAB_OK;
  uint64_t add = s->op == FAB_SIGNAL_INC ? 1 : s->value;
  if (sw->gpu) { /* the target side's lock: it may be storing into the same window's shadow */
    pthread_mutex_lock(&g->target_ep->lock);
    fab_result rc = fab_group_gpu_signal(g, sw, s->off, add, fn);
    pthread_mutex_unlock(&g->target_ep->lock);
    return rc;
  }
  __atomic_fetch_add((uint64_t*)(sw->base + s->off), add, __ATOMIC_RELEASE);
  return FAB_OK;
}

/* Waits (driving progress) until n more puts to p fit in the window of puts
 * the peer tracks; 0 when they do. g->lock held. */
static int put_window_room(op_target* t, uint64_t n) {
  fab_group_peer* p = t->p;
  int64_t deadline = 0;
  while (p->puts_posted + n - atomic_load_explicit(&p->puts_acked, memory_order_acquire) > FAB_GROUP_PUT_WINDOW)
    if (progress_locked(t->g) != FAB_OK || !again(p->group, p->sc->ep, &deadline)) return -1;
  return 0;
}

/* A put through staging (fab_group_stage.c): its chunks are numbered puts,
 * posted as slots allow. g->lock held. */
static fab_result post_staged(op_target* t, fab_group_req* r, fab_group_win* src, uint64_t src_off, size_t size,
                              fab_group_win* dst, uint64_t dst_off, uint64_t nchunks, int ring) {
  fab_group_peer* p = t->p;
  if (put_window_room(t, fab_group_window_need(nchunks)) != 0) {
    for (uint64_t i = 0; i < nchunks; i++) not_posted(r, 0, -FI_ETIMEDOUT, "iput");
    return r->result;
  }
  r->st_src = src;
  r->st_dst = dst;
  r->st_src_off = src_off;
  r->st_dst_off = dst_off;
  r->st_left = size;
  r->st_ring = ring;
  r->st_put = p->puts_posted;
  p->puts_posted += nchunks;
  fab_group_stage_put(p, r);
  return FAB_OK;
}

/* Posts the data write (or queues its staged chunks: nchunks) and queues or
 * posts the signal record. g->lock held. */
static fab_result post_put(op_target* t, fab_group_req* r, fab_group_win* src, uint64_t src_off, size_t size,
                           fab_group_win* dst, uint64_t dst_off, fab_group_win* sw, const sig_args* s,
                           uint64_t nchunks) {
  fab_group_peer* p = t->p;
  int rank = p->rank;
  if (nchunks) {
    fab_result rc = post_staged(t, r, src, src_off, size, dst, dst_off, nchunks, dst->remote_staged[rank]);
    if (rc != FAB_OK) {
      if (sw) op_done(&r->ops[1], NULL, NULL);
      return rc;
    }
  } else if (size && t->g->ordered) { /* placed before any later write of ours: nothing to count */
    int64_t deadline = 0;
    ssize_t rc;
    do rc = fab_remote_write(p->sc->ep, p->sc->peer, (char*)src->base + src_off, size, src->mr->desc,
                          &dst->remote[rank], dst_off, &r->ops[0]);
    while (rc == -FI_EAGAIN && again(p->group, p->sc->ep, &deadline));
    if (rc != 0) {
      if (sw) op_done(&r->ops[1], NULL, NULL);
      return not_posted(r, 0, rc, sw ? "iputSignal" : "iput");
    }
  } else if (size) {
    if (put_window_room(t, 1) != 0) { /* the peer has not acknowledged this many puts */
      if (sw) op_done(&r->ops[1], NULL, NULL);
      return not_posted(r, 0, -FI_ETIMEDOUT, sw ? "iputSignal" : "iput");
    }
    int64_t deadline = 0;
    uint64_t data = p->sc->ops->onesided_data(p->sc, fab_group_cq_low(FAB_GROUP_PUT, (uint32_t)p->puts_posted));
    deadline = 0;
    ssize_t rc;
    do rc = fab_remote_writedata(p->sc->ep, p->sc->peer, (char*)src->base + src_off, size, src->mr->desc,
                              &dst->remote[rank], dst_off, data, &r->ops[0]);
    while (rc == -FI_EAGAIN && again(p->group, p->sc->ep, &deadline));
    if (rc != 0) {
      if (sw) op_done(&r->ops[1], NULL, NULL); /* its signal will not follow */
      return not_posted(r, 0, rc, sw ? "iputSignal" : "iput");
    }
    p->puts_posted++;
  }
  if (!sw) return FAB_OK;
  r->sig = (fab_group_sig){.puts_before = p->puts_posted, .offset = s->off, .value = s->value,
                          .seq = atomic_fetch_add_explicit(&p->sig_seq, 1, memory_order_relaxed),
                          .window = sw->id, .op = s->op, .token = t->g->token};
  return post_record(t->g, p, r);
}

static fab_result put_common(void* rma_ctx, int context, uint64_t src_off, void* src_mh, size_t size,
                             uint64_t dst_off, void* dst_mh, uint32_t rank, const sig_args* s, void** request,
                             const char* fn) {
  op_target t;
  fab_result rc = resolve(rma_ctx, context, rank, request, fn, &t);
  if (rc != FAB_OK) return rc;
  fab_group_win *src = NULL, *dst = NULL, *sw = NULL;
  if (size) {
    src = window(t.g, src_mh, "srcMhandle", t.g->rank, src_off, size, fn);
    dst = src ? window(t.g, dst_mh, "dstMhandle", (int)rank, dst_off, size, fn) : NULL;
    if (!dst) return FAB_ERR_INVALID_USAGE;
  }
  if (s) {
    if (s->op != FAB_SIGNAL_INC && s->op != FAB_SIGNAL_ADD)
      return fab_bad_argument(fn, "signalOp", s->op, "NCCL_NET_SIGNAL_OP_INC (1) or _ADD (2)");
    if (s->off % 8) return fab_bad_argument(fn, "signalOff", (long long)s->off, "a multiple of 8");
    sw = window(t.g, s->mhandle, "signalMhandle", (int)rank, s->off, 8, fn);
    if (!sw) return FAB_ERR_INVALID_USAGE;
  }
  if (!t.p) {
    rc = self_put(t.g, src, src_off, size, dst, dst_off, sw, s, fn);
    return rc == FAB_OK ? done_at_once(t.g, NULL, request) : rc;
  }
  if (!size && !sw) return done_at_once(t.g, t.p, request);
  pthread_mutex_lock(&t.g->lock);
  uint64_t nchunks = size && (src->staged || dst->remote_staged[rank])
                         ? fab_group_stage_chunks(t.p, size, dst->remote_staged[rank]) : 0;
  int nops = (int)(nchunks ? nchunks : size > 0) + (sw != NULL);
  fab_group_req* r = req_get(t.g, t.p, nops);
  if (!r) {
    pthread_mutex_unlock(&t.g->lock);
    FAB_WARN("%s: out of memory for a request", fn);
    return FAB_ERR_SYSTEM;
  }
  t.p->ops_posted += (uint64_t)nops;
  rc = post_put(&t, r, src, src_off, size, dst, dst_off, sw, s, nchunks);
  pthread_mutex_unlock(&t.g->lock);
  *request = r; /* a failure to post is reported by test, with the request */
  return FAB_OK;
}

fab_result fab_rma_iput(void* rma_ctx, int context, uint64_t src_off, void* src_mhandle, size_t size,
                        uint64_t dst_off, void* dst_mhandle, uint32_t rank, uint32_t opt_flags, void** request) {
  (void)opt_flags; /* hints (aggregate requests, skip credit checks): every put is posted at once */
  return put_common(rma_ctx, context, src_off, src_mhandle, size, dst_off, dst_mhandle, rank, NULL, request, "iput");
}

fab_result fab_rma_iput_signal(void* rma_ctx, int context, uint64_t src_off, void* src_mhandle, size_t size,
                               uint64_t dst_off, void* dst_mhandle, uint32_t rank, uint64_t signal_off,
                               void* signal_mhandle, uint64_t signal_value, uint32_t signal_op, bool strong,
                               uint32_t opt_flags, void** request) {
  (void)strong;    /* every signal is strong here (fab_group.h) */
  (void)opt_flags;
  sig_args s = {.off = signal_off, .mhandle = signal_mhandle, .value = signal_value, .op = signal_op};
  return put_common(rma_ctx, context, src_off, src_mhandle, size, dst_off, dst_mhandle, rank, &s, request,
                    "iputSignal");
}

/* A get from or into a staged window: a record asks the target for the
 * bytes, which it writes as chunks into our staging ring; the request
 * completes once every byte is copied into the local window. */
static fab_result get_by_request(op_target* t, fab_group_win* local, uint64_t local_off, fab_group_win* remote,
                                 uint64_t remote_off, size_t size, void** request) {
  fab_group* g = t->g;
  fab_group_peer* p = t->p;
  if (!g->rx_mem) {
    FAB_WARN("iget: rank %d's window is staged through host memory (GPU memory its provider cannot reach), and "
             "its answer needs a staging ring here, which only a staged window of this rank makes: register a GPU "
             "window on this rank first", p->rank);
    return FAB_ERR_INVALID_USAGE;
  }
  pthread_mutex_lock(&g->lock);
  fab_group_req* r = NULL;
  int64_t deadline = 0;
  int room = fab_group_gets_make(p) == 0;
  while (room && p->gets[p->get_seq % FAB_GROUP_GETS].req) /* FAB_GROUP_GETS gets to p still in flight */
    if (progress_locked(g) != FAB_OK || !again(p->group, p->sc->ep, &deadline)) room = 0;
  if (room) r = req_get(g, p, 2); /* the record, and the data */
  if (r) {
    uint32_t id = p->get_seq++;
    p->gets[id % FAB_GROUP_GETS] = (fab_group_inflight_get){.req = r, .local = local, .local_off = local_off, .size = size,
                                                 .id = id};
    p->ops_posted += 2;
    r->sig = (fab_group_sig){.puts_before = p->puts_posted, .offset = remote_off, .value = size,
                            .seq = atomic_fetch_add_explicit(&p->sig_seq, 1, memory_order_relaxed),
                            .window = remote->id, .op = FAB_GROUP_OP_GET, .token = g->token, .get = id};
    post_record(g, p, r);
  }
  pthread_mutex_unlock(&g->lock);
  if (!r) {
    FAB_WARN("iget: %s", room ? "out of memory for a request" : "no room for another get to that rank in time");
    return room ? FAB_ERR_SYSTEM : FAB_ERR_INTERNAL;
  }
  *request = r;
  return FAB_OK;
}

fab_result fab_rma_iget(void* rma_ctx, int context, uint64_t remote_off, void* remote_mhandle, size_t size,
                        uint64_t local_off, void* local_mhandle, uint32_t rank, uint32_t opt_flags, void** request) {
  (void)opt_flags;
  op_target t;
  fab_result rc = resolve(rma_ctx, context, rank, request, "iget", &t);
  if (rc != FAB_OK) return rc;
  if (!size) return done_at_once(t.g, t.p, request);
  fab_group_win* local = window(t.g, local_mhandle, "localMhandle", t.g->rank, local_off, size, "iget");
  fab_group_win* remote = local ? window(t.g, remote_mhandle, "remoteMhandle", (int)rank, remote_off, size, "iget")
                               : NULL;
  if (!remote) return FAB_ERR_INVALID_USAGE;
  if (!t.p) {
    const char* what = NULL;
    if (fab_devcopy((char*)local->base + local_off, local->gpu, (char*)remote->base + remote_off, remote->gpu, size,
                    &what)) {
      FAB_WARN("iget: copying %zu bytes from our own rank failed: %s failed", size, what);
      return FAB_ERR_CUDA;
    }
    return done_at_once(t.g, NULL, request);
  }
  if (local->staged || remote->remote_staged[rank])
    return get_by_request(&t, local, local_off, remote, remote_off, size, request);
  pthread_mutex_lock(&t.g->lock);
  fab_group_req* r = req_get(t.g, t.p, 1);
  if (r) {
    t.p->ops_posted++;
    int64_t deadline = 0;
    ssize_t prc;
    do prc = fab_remote_read(t.p->sc->ep, t.p->sc->peer, (char*)local->base + local_off, size, local->mr->desc,
                          &remote->remote[rank], remote_off, &r->ops[0]);
    while (prc == -FI_EAGAIN && again(t.g, t.p->sc->ep, &deadline));
    if (prc != 0) not_posted(r, 0, prc, "iget");
  }
  pthread_mutex_unlock(&t.g->lock);
  if (!r) {
    FAB_WARN("iget: out of memory for a request");
    return FAB_ERR_SYSTEM;
  }
  *request = r;
  return FAB_OK;
}

fab_result fab_rma_iflush(void* rma_ctx, int context, void* mhandle, uint32_t rank, void** request) {
  op_target t;
  fab_result rc = resolve(rma_ctx, context, rank, request, "iflush", &t);
  if (rc != FAB_OK) return rc;
  if (mhandle && !window(t.g, mhandle, "mhandle", t.g->rank, 0, 0, "iflush")) return FAB_ERR_INVALID_USAGE;
  if (!t.p) return FAB_OK; /* our own rank: everything is in place */
  pthread_mutex_lock(&t.g->lock);
  uint64_t target = t.p->ops_posted;
  fab_group_req* r = NULL;
  if (atomic_load_explicit(&t.p->ops_done, memory_order_acquire) < target) {
    r = req_get(t.g, t.p, 0);
    if (r) {
      r->flush = 1;
      r->flush_target = target;
    }
  }
  pthread_mutex_unlock(&t.g->lock);
  if (!r && atomic_load(&t.p->ops_done) < target) {
    FAB_WARN("iflush: out of memory for a request");
    return FAB_ERR_SYSTEM;
  }
  *request = r; /* NULL: every earlier operation to rank is complete */
  return FAB_OK;
}

/* --- test: the steps of fab_req_run --------------------------------------------------- */

static inline fab_group_req* greq_of(fab_req_head* h) { return (fab_group_req*)h; }

static int complete(fab_group_req* r) {
  if (atomic_load_explicit(&r->pending, memory_order_acquire) > 0) return 0;
  return !r->flush || atomic_load_explicit(&r->peer->ops_done, memory_order_acquire) >= r->flush_target;
}

static int greq_busy(fab_req_head* h, int poll) {
  fab_group_req* r = greq_of(h);
  if (complete(r)) return 0;
  if (poll) fab_group_progress(r->group);
  return !complete(r);
}

/* liveness: a dead peer fails the connection, and the request with it */
static fab_result greq_stalled(fab_req_head* h) {
  fab_group_req* r = greq_of(h);
  fab_comm* sc = r->peer ? r->peer->sc : NULL;
  if (sc) {
    fab_comm_stalled(sc);
    if (sc->error != FAB_OK) return sc->error;
  }
  return (fab_result)atomic_load(&r->group->failed);
}

/* It can no longer complete: it stays out of the pool (the provider may
 * still complete its operations) until the group closes. */
static int greq_give_up(fab_req_head* h, fab_result rc) {
  (void)rc;
  atomic_store(&greq_of(h)->group->op_failed, 1); /* queryLastError says so from now on */
  return 1;
}

static fab_result greq_finish(fab_req_head* h, int* sizes) {
  (void)sizes;
  fab_group_req* r = greq_of(h);
  if (!atomic_load(&r->failed)) return FAB_OK;
  atomic_store(&r->group->op_failed, 1);
  return r->result;
}

static int greq_explain(fab_req_head* h, fab_result rc, char* buf, size_t len) {
  (void)rc;
  fab_group_req* r = greq_of(h);
  fab_comm* sc = r->peer ? r->peer->sc : NULL;
  if (h->state != FAB_REQ_ORPHAN)
    snprintf(buf, len, "test: %s", r->why);
  else
    snprintf(buf, len, "test: an RMA request to rank %d failed: %s", r->peer ? r->peer->rank : -1,
             sc && sc->error != FAB_OK ? sc->error_why : r->group->why);
  return 1;
}

static void greq_release(fab_req_head* h) {
  fab_group_req* r = greq_of(h);
  pthread_mutex_lock(&r->group->lock);
  req_put(r);
  pthread_mutex_unlock(&r->group->lock);
}

static const fab_req_steps greq_steps = {greq_busy, greq_stalled, greq_give_up, greq_finish, greq_explain,
                                         greq_release};

static fab_result greq_test(fab_req_head* h, int* done, int* sizes) {
  return fab_req_run(h, done, sizes, &greq_steps, 1);
}

static const fab_req_kind group_req_kind = {.name = "iput/iget/iflush (RMA)", .api = FAB_REQ_API_RMA,
                                            .test = greq_test};

fab_result fab_rma_test(void* group, void* request, int* done) {
  if (!done) return fab_bad_argument("test", "done", 0, "a non-NULL pointer");
  *done = 0;
  fab_group* g = fab_group_get(group, "test");
  if (!g) return FAB_ERR_INTERNAL;
  fab_req_head* h = fab_req_head_check(request, FAB_REQ_API_RMA, "test");
  if (!h) return FAB_ERR_INTERNAL;
  if (greq_of(h)->group != g) {
    FAB_WARN("test: %p is a request of another RMA comm; test it with the comm that returned it", request);
    return FAB_ERR_INTERNAL;
  }
  return h->kind->test(h, done, NULL);
}
