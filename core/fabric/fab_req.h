/*
 * The request lifecycle, written once for every transport: a comm's pooled
 * requests are handed out (fab_req_get), completed operation by operation
 * (fab_req_op_done / fab_req_op_failed), tested (fab_req_test, behind the
 * API's test) and returned (fab_req_put). A transport fills in only what is
 * its own: how to post, how to progress, which sizes to report.
 *
 * Peer liveness also lives here: a request that stays pending lets
 * fab_comm_stalled look for signs of life from the peer.
 */
#ifndef FAB_REQ_H
#define FAB_REQ_H

#include <stdlib.h>

#include "fab_engine.h"

/* Initialises a pooled request the first time it is handed out. */
void fab_req_first_use(fab_comm* c, fab_req* r);

/* A request of c for n buffers with npending operations, or NULL when all
 * are in flight (the caller returns a NULL request: NCCL retries). */
static inline fab_req* fab_req_get(fab_comm* c, uint8_t type, int n, int npending) {
  fab_req* r = fab_pool_get(&c->reqs);
  if (FAB_UNLIKELY(!r)) return NULL;
  if (FAB_UNLIKELY(r->head.magic != FAB_REQ_MAGIC)) fab_req_first_use(c, r);
  r->head.state = FAB_REQ_ACTIVE;
  r->type = type;
  r->n = (uint8_t)n;
  r->prof = 0;
  r->busy = (uint8_t)fab_ep_helper_hold(c->ep);
  r->result = FAB_OK;
  atomic_store_explicit(&r->pending, npending, memory_order_relaxed);
  return r;
}

/* A recv comm's receives are sized by the messages it gets, not only by the
 * size they are posted with (NCCL posts 128 KiB slots and more for a message
 * of any size): after FAB_TINY_RUN messages in a row of at most
 * FABRIC_RAIL_TINY_MAX bytes, a receive posted larger than
 * FABRIC_RAIL_SMALL_MAX counts as small (a guessed receive: fab_req_sized_recv)
 * and its rail's thread leaves the CQ to the runtime's tests. A larger
 * message ends the run, and if guessed receives are still live the comm
 * holds the thread polling for them (one count of helper_large) until the
 * last of them is done. Completions are dispatched by whichever thread reads
 * them and requests may be freed by a sweep, so the hold changes hands by
 * compare-and-swap: one count taken, one given back, none after the comm
 * lets go of its thread (OFF). */
enum { FAB_TINY_RUN = 16 };
enum { FAB_RECV_HOLD_NONE = 0, FAB_RECV_HOLD_LARGE = 1, FAB_RECV_HOLD_OFF = 2 };
static inline int fab_comm_recv_hold_move(fab_comm* c, uint8_t from, uint8_t to, int delta) {
  uint8_t expect = from; /* a seq_cst CAS, not a relaxed look first: it must see the other side's count */
  if (!atomic_compare_exchange_strong(&c->recv_hold, &expect, to)) return 0;
  fab_ep_helper_large(c->ep, delta);
  return 1;
}
/* A message of `bytes` landed in one of c's receives. */
static inline void fab_comm_recv_seen(fab_comm* c, size_t bytes) {
  size_t tiny = fab_g.params.rail_tiny_max;
  if (FAB_LIKELY(!c->helped) || tiny == 0) return;
  if (bytes <= tiny) {
    uint8_t run = atomic_load_explicit(&c->recv_tiny_run, memory_order_relaxed);
    if (run < FAB_TINY_RUN) /* never over a concurrent reset: a step lost to another step only delays the run */
      atomic_compare_exchange_strong_explicit(&c->recv_tiny_run, &run, (uint8_t)(run + 1), memory_order_relaxed,
                                              memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&c->recv_tiny_run, 0, memory_order_relaxed);
  if (atomic_load(&c->recv_guessed) > 0 && fab_comm_recv_hold_move(c, FAB_RECV_HOLD_NONE, FAB_RECV_HOLD_LARGE, 1) &&
      atomic_load(&c->recv_guessed) == 0) /* the last one went meanwhile: its put found no hold to give back */
    fab_comm_recv_hold_move(c, FAB_RECV_HOLD_LARGE, FAB_RECV_HOLD_NONE, -1);
}
/* Whether c's receives count as small whatever their posted size. */
static inline int fab_comm_recv_tiny(fab_comm* c) {
  return c->helped && atomic_load_explicit(&c->recv_tiny_run, memory_order_relaxed) >= FAB_TINY_RUN;
}
/* A guessed receive of c is done: the last one gives the hold back. */
static inline void fab_comm_recv_guess_done(fab_comm* c) {
  if (atomic_fetch_sub(&c->recv_guessed, 1) == 1) fab_comm_recv_hold_move(c, FAB_RECV_HOLD_LARGE, FAB_RECV_HOLD_NONE, -1);
}
/* c lets go of its endpoint's thread: its hold goes back, for good. */
static inline void fab_comm_recv_let_go(fab_comm* c) {
  if (atomic_exchange(&c->recv_hold, FAB_RECV_HOLD_OFF) == FAB_RECV_HOLD_LARGE) fab_ep_helper_large(c->ep, -1);
}
/* r moves bytes (a send's size, a receive's largest buffer): above
 * FABRIC_RAIL_SMALL_MAX it counts as large while it lives, where its
 * endpoint's thread runs. */
static inline void fab_req_sized(fab_req* r, size_t bytes) {
  if (FAB_UNLIKELY(r->busy == 1) && bytes > fab_g.params.rail_small_max) {
    r->busy = 2;
    fab_ep_helper_large(r->comm->ep, 1);
  }
}

/* A receive r posted with a buffer of `bytes`: large as fab_req_sized says,
 * unless its comm's recent messages were all tiny: then a guessed receive
 * (busy 3), small until a larger message comes (fab_comm_recv_seen). */
static inline void fab_req_sized_recv(fab_req* r, size_t bytes) {
  if (FAB_LIKELY(r->busy != 1) || bytes <= fab_g.params.rail_small_max) return;
  if (!fab_comm_recv_tiny(r->comm)) {
    fab_req_sized(r, bytes);
    return;
  }
  r->busy = 3;
  atomic_fetch_add(&r->comm->recv_guessed, 1);
}

/* What r counted on its endpoint's thread goes back. */
static inline void fab_req_let_go(fab_req* r) {
  if (r->busy == 2) fab_ep_helper_large(r->comm->ep, -1);
  else if (r->busy == 3) fab_comm_recv_guess_done(r->comm);
  fab_ep_helper_idle(r->comm->ep);
  r->busy = 0;
}

static inline void fab_req_put(fab_req* r) {
  r->head.state = FAB_REQ_FREE;
  if (FAB_UNLIKELY(r->busy)) fab_req_let_go(r);
  if (FAB_UNLIKELY(r->errmsg != NULL)) {
    free(r->errmsg);
    r->errmsg = NULL;
  }
  fab_pool_put_index(&r->comm->reqs, r->pool_index);
}

/* r waits for the peer's traffic for as long as its comm lives (the rails
 * floor's stripe notices): it does not keep the endpoint's thread awake by
 * itself; what it waits for is held by the request that needs it. */
static inline void fab_req_uncount(fab_req* r) {
  if (r->busy) fab_req_let_go(r);
}

/* One operation of r completed (successfully, or after fab_req_op_failed).
 * The last write of a completion: at 0 the owner may reuse r, and a closed
 * comm may be freed. shared: other operations of r may complete in other
 * threads at the same time (an atomic decrement); otherwise a store. */
static inline void fab_req_op_done(fab_req* r, int shared) {
  fab_comm_count_completion(r->comm);
  if (FAB_LIKELY(!shared))
    atomic_store_explicit(&r->pending, 0, memory_order_release);
  else
    atomic_fetch_sub_explicit(&r->pending, 1, memory_order_acq_rel);
}

/* r's only operation completed as it was posted (a message that went
 * inline): no completion came from the peer's side, so it is no sign of
 * the peer's life (fab_comm_check_peer). */
static inline void fab_req_op_done_inline(fab_req* r) {
  atomic_store_explicit(&r->pending, 0, memory_order_release);
}

/* Records a failed operation of r on its buffer of size bytes with NCCL tag
 * tag: the result code and the message test will WARN. Returns the bytes
 * the provider reports as received (truncation). ep lock held. */
size_t fab_req_op_failed(fab_req* r, size_t size, int tag, const struct fi_cq_err_entry* err);

/* The kind of a comm's requests: the API's test reaches fab_req_test
 * through it. */
extern const fab_req_kind fab_req_kind_net;

/* The API's test, for every transport. */
fab_result fab_req_test(fab_req* r, int* done, int* sizes);
/* The same, leaving progress to the comm's polling thread where it has one
 * (fab_comm.helped); failures and the peer's liveness are checked either
 * way. For the requests a comm over rails makes of its own (split messages,
 * grouped receives over rails); the runtime's own tests keep polling, which
 * measured better for them (docs/results/performance-history.md §5.3). */
fab_result fab_req_test_helped(fab_req* r, int* done, int* sizes);

/* Liveness: a transport's progress calls this while a request of c stays
 * pending: after FAB_STALL_POLLS polls it looks for signs of life from the
 * peer, probes it, and fails the comm after FABRIC_PEER_TIMEOUT_MS without
 * any. */
enum { FAB_STALL_POLLS = 256, FAB_PROBE_INTERVAL_MS = 1000 };
void fab_comm_check_peer(fab_comm* c);
static inline void fab_comm_stalled(fab_comm* c) {
  /* A load and a store, not an atomic add: this runs on every poll that
   * finds its request pending, and a lost count between racing threads only
   * delays the check a little. */
  uint32_t polls = atomic_load_explicit(&c->stall_polls, memory_order_relaxed) + 1;
  atomic_store_explicit(&c->stall_polls, polls, memory_order_relaxed);
  if (FAB_UNLIKELY(polls >= FAB_STALL_POLLS)) {
    atomic_store_explicit(&c->stall_polls, 0, memory_order_relaxed);
    fab_comm_check_peer(c);
  }
}

/* Posts a zero-byte message to c's peer's control receive (c->probe_op,
 * probe_posted until it completes; the peer takes it as a liveness probe):
 * 0, or the provider's error. ep lock held. */
int fab_comm_post_probe(fab_comm* c);
/* The probe's completion handler (the comm's probe_op). */
void fab_comm_probe_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err);
/* fab_delivery.c: proof of delivery for a closed send comm (ep lock held).
 * A probe the provider refuses for now (its connection to the peer is being
 * set up again) is tried again after FAB_PROOF_RETRY_MS. */
enum { FAB_PROOF_RETRY_MS = 100 };
/* 1 while what c sent is unproven (fab_transport_ops.unproven): asks the
 * peer for proof the first time, and again for what was sent since. */
int fab_delivery_pending(fab_comm* c);
/* The same without asking: for a report once the endpoint is closed. */
int fab_delivery_awaited(fab_comm* c);
/* 1 once c waited FABRIC_PEER_TIMEOUT_MS for its proof (one INFO). */
int fab_delivery_given_up(fab_comm* c, int64_t now);
/* A closing recv comm tells its peer's send comm that nothing more will be
 * taken (over kernel sockets, for a transport that proves delivery). */
#define FAB_DELIVERY_CLOSED UINT64_MAX /* an answer's id: the receiver closed */
void fab_delivery_tell_closed(fab_comm* c);
/* A delivery probe or answer (FAB_NOTE_DELIVERY_*) for c, closing or not. */
void fab_delivery_note(fab_comm* c, const fab_wire_window* m);
/* The completion handler of a transport's control writes (the comm's ctl_op). */
void fab_comm_ctl_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err);

#endif /* FAB_REQ_H */
