/* Staging through host memory: one-sided windows in GPU memory on a provider
 * without FI_HMEM (tcp; shm on libfabric 1.17) are not registered with the
 * provider. A put out of such a window is copied into a slot of the source's
 * staging ring towards the target and written from there; a put into one is
 * written, with a fab_group_chunk header, into the target's staging ring for
 * that source, and the target copies it into the window before the chunk
 * counts as a landed put (fab_group_target_drain). Signals wait for landed
 * puts, so a signal is never visible before its data is in GPU memory.
 *
 * Memory is bounded: FABRIC_RMA_STAGE_SLOTS slots of FABRIC_RMA_STAGE_BYTES
 * per peer at each end, whatever the windows' sizes. A source writes into
 * the target's slot seq % slots only once the target has acknowledged
 * (FAB_GROUP_ACK_STAGED) copying out the chunk that used it before. */
#include <stdlib.h>
#include <string.h>

#include "fab_group.h"
#include "fab_devcopy.h"
#include "fab_transport.h"

static size_t slot_bytes(void) { return (size_t)fab_g.params.rma_stage_bytes; }
static uint32_t slots(void) { return (uint32_t)fab_g.params.rma_stage_slots; }

fab_result fab_group_stage_rx_make(fab_group* g, const void* gpu_window, const char* fn) {
  if (g->rx_mem) return FAB_OK;
  uint32_t n = slots();
  size_t sb = slot_bytes(), len = (size_t)g->nranks * n * sb;
  char* mem = aligned_alloc(4096, len);
  if (!mem) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory for the staging ring of GPU windows");
  for (int r = 0; r < g->nranks; r++) {
    if (r == g->rank) continue;
    g->peers[r].rx_landed = calloc(n, 1);
    if (!g->peers[r].rx_landed) {
      free(mem);
      return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory for the staging ring of GPU windows");
    }
  }
  int rc = fab_remote_buf_reg(g->target_ep, mem, len, FI_REMOTE_WRITE, &g->rx_reg);
  if (rc != 0) {
    free(mem);
    char why[160];
    snprintf(why, sizeof(why), "registering the staging ring for GPU windows failed: %s", fi_strerror(-rc));
    return fab_group_fail(g, FAB_ERR_SYSTEM, fn, why);
  }
  g->rx_pinned = fab_devcopy_pin(mem, len, gpu_window) == 0; /* faster copies; optional */
  g->rx_slots = n;
  g->rx_slot_bytes = (uint32_t)sb;
  g->rx_mem = mem; /* published by the exchange that announces it */
  return FAB_OK;
}

static void chunk_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  (void)done;
  fab_group_txslot* slot = op->owner;
  fab_group_req* r = slot->req;
  fab_group* g = r->group;
  fab_group_req_op_over(r, err ? err->err : 0, "a staged chunk");
  atomic_store_explicit(&slot->busy, 0, memory_order_release);
  atomic_store_explicit(&g->due, 1, memory_order_release); /* queued chunks may take the slot */
}

static int tx_make(fab_group_peer* p, const fab_group_req* r) {
  if (p->tx) return 0;
  uint32_t n = slots();
  size_t len = (size_t)n * slot_bytes();
  p->tx_mem = aligned_alloc(4096, len);
  p->tx = calloc(n, sizeof(*p->tx));
  int rc = p->tx_mem && p->tx ? fab_remote_buf_reg(p->sc->ep, p->tx_mem, len, FI_WRITE | FI_READ, &p->tx_reg)
                              : -FI_ENOMEM;
  if (rc != 0) {
    free(p->tx_mem);
    free(p->tx);
    p->tx_mem = NULL;
    p->tx = NULL;
    return rc;
  }
  for (uint32_t i = 0; i < n; i++) fab_op_init(&p->tx[i].op, chunk_done, &p->tx[i], (int)i);
  if (r->st_src->gpu) p->tx_pinned = fab_devcopy_pin(p->tx_mem, len, (void*)r->st_src->base) == 0;
  return 0;
}

static size_t payload_max(fab_group_peer* p, int ring) {
  size_t ours = slot_bytes();
  if (!ring) return ours;
  size_t theirs = p->stage_slot_bytes;
  return (ours < theirs ? ours : theirs) - sizeof(fab_group_chunk);
}

uint64_t fab_group_stage_chunks(fab_group_peer* p, size_t size, int ring) {
  size_t m = payload_max(p, ring);
  return (size + m - 1) / m;
}

/* Ends r's chunks that will never be posted (each counts as done, failed). */
static void give_up(fab_group_peer* p, fab_group_req* r, const char* why) {
  size_t m = payload_max(p, r->st_ring);
  uint64_t left = (r->st_left + m - 1) / m;
  fab_list_del(&r->st_node);
  r->st_left = 0;
  if (!atomic_exchange(&r->failed, 1)) {
    r->result = FAB_ERR_SYSTEM;
    snprintf(r->why, sizeof(r->why), "a staged put to rank %d: %s", p->rank, why);
  }
  for (uint64_t i = 0; i < left; i++) fab_group_req_op_over(r, 0, NULL);
}

/* Copies r's next chunk into slot memory buf; 0 or the devcopy failure. */
static int copy_out(fab_group_req* r, char* buf, size_t n, const char** what) {
  const char* src = (const char*)r->st_src->base + r->st_src_off;
  return fab_devcopy(buf, 0, src, r->st_src->gpu, n, what);
}

/* Posts one chunk of r from slot s; 0, -FI_EAGAIN, or a failure. */
static ssize_t post_chunk(fab_group_peer* p, fab_group_req* r, fab_group_txslot* s, char* buf, size_t n) {
  fab_comm* sc = p->sc;
  if (!r->st_ring) {
    uint64_t data = sc->ops->onesided_data(sc, fab_group_cq_low(FAB_GROUP_PUT, (uint32_t)r->st_put));
    return fab_remote_writedata(sc->ep, sc->peer, buf, n, p->tx_reg.desc, &r->st_dst->remote[p->rank], r->st_dst_off,
                             data, &s->op);
  }
  uint32_t seq = atomic_load_explicit(&p->chunk_seq, memory_order_relaxed);
  uint32_t slot = seq % p->stage_slots;
  fab_group_chunk* c = (fab_group_chunk*)buf;
  *c = (fab_group_chunk){.put = r->st_put, .offset = r->st_dst_off, .len = (uint32_t)n,
                        .window = r->st_get ? FAB_GROUP_GET_REPLY : r->st_dst->id, .seq = seq, .token = p->group->token,
                        .get = r->st_get ? r->st_get_id : 0};
  c->check = fab_group_chunk_check(c);
  uint64_t data = sc->ops->onesided_data(sc, fab_group_cq_low(FAB_GROUP_STAGED, slot));
  /* counted first: the peer may copy it out and acknowledge it before the post returns */
  atomic_store_explicit(&p->chunk_seq, seq + 1, memory_order_release);
  ssize_t rc = fab_remote_writedata(sc->ep, sc->peer, buf, sizeof(*c) + n, p->tx_reg.desc, &p->stage,
                                 (uint64_t)slot * p->stage_slot_bytes, data, &s->op);
  if (rc != 0) atomic_store_explicit(&p->chunk_seq, seq, memory_order_relaxed); /* not posted */
  return rc;
}

int fab_group_stage_pump(fab_group_peer* p) {
  fab_group* g = p->group;
  while (!fab_list_empty(&p->staging)) {
    fab_group_req* r = FAB_CONTAINER_OF(p->staging.next, fab_group_req, st_node);
    if (!p->tx && tx_make(p, r) != 0) {
      give_up(p, r, "out of memory for its staging slots");
      continue;
    }
    fab_group_txslot* s = &p->tx[p->tx_next % slots()];
    if (atomic_load_explicit(&s->busy, memory_order_acquire)) return 1;
    if (r->st_put - atomic_load_explicit(&p->puts_acked, memory_order_acquire) >= FAB_GROUP_PUT_WINDOW)
      return 1; /* its number lies beyond the puts the target tracks: once it acknowledges more */
    if (r->st_ring && atomic_load_explicit(&p->chunk_seq, memory_order_relaxed) -
                              atomic_load_explicit(&p->chunk_acked, memory_order_acquire) >= p->stage_slots)
      return 1;
    char* buf = p->tx_mem + (size_t)(p->tx_next % slots()) * slot_bytes();
    size_t n = payload_max(p, r->st_ring);
    if (n > r->st_left) n = r->st_left;
    const char* what = NULL;
    int crc = copy_out(r, buf + (r->st_ring ? sizeof(fab_group_chunk) : 0), n, &what);
    if (crc != 0) {
      char why[160];
      snprintf(why, sizeof(why), "copying out of a GPU window failed: %s returned %d", what, crc);
      give_up(p, r, why);
      fab_group_fail(g, FAB_ERR_CUDA, "iput", why); /* its signal could never apply */
      continue;
    }
    s->req = r;
    atomic_store_explicit(&s->busy, 1, memory_order_relaxed);
    ssize_t rc = post_chunk(p, r, s, buf, n);
    if (rc == -FI_EAGAIN) {
      atomic_store_explicit(&s->busy, 0, memory_order_relaxed);
      return 1; /* the next progress tries again */
    }
    if (rc != 0) {
      atomic_store_explicit(&s->busy, 0, memory_order_relaxed);
      give_up(p, r, fi_strerror((int)-rc));
      fab_group_fail(g, fab_result_from_fi((int)-rc), "iput", "posting a staged chunk failed");
      continue;
    }
    p->tx_next++;
    r->st_put++;
    r->st_src_off += n;
    r->st_dst_off += n;
    r->st_left -= n;
    if (!r->st_left) fab_list_del(&r->st_node);
  }
  return 0;
}

void fab_group_stage_put(fab_group_peer* p, fab_group_req* r) {
  fab_list_push(&p->staging, &r->st_node);
  if (fab_group_stage_pump(p)) atomic_store_explicit(&p->group->due, 1, memory_order_release);
}

int fab_group_gets_make(fab_group_peer* p) {
  if (!p->gets) p->gets = calloc(FAB_GROUP_GETS, sizeof(*p->gets));
  return p->gets ? 0 : -1;
}

void fab_group_stage_drop_window(fab_group* g, fab_group_win* w) {
  int dropped = 0;
  for (int i = 0; i < g->nranks; i++) {
    fab_group_peer* p = &g->peers[i];
    if (!p->sc) continue;
    for (int k = 0; p->gets && k < FAB_GROUP_GETS; k++) {
      fab_group_inflight_get* e = &p->gets[k];
      if (!e->req || e->local != w) continue;
      if (!atomic_exchange(&e->req->failed, 1)) {
        e->req->result = FAB_ERR_INVALID_USAGE;
        snprintf(e->req->why, sizeof(e->req->why), "a get from rank %d: its window was deregistered before the data "
                 "came", p->rank);
      }
      fab_group_req_op_over(e->req, 0, NULL); /* its data will not be copied in */
      e->req = NULL;
      dropped++;
    }
    FAB_LIST_FOREACH_SAFE(it, tmp, &p->staging) {
      fab_group_req* r = FAB_CONTAINER_OF(it, fab_group_req, st_node);
      if (r->st_src != w && r->st_dst != w) continue;
      give_up(p, r, "its window was deregistered while the put was still being staged");
      dropped++;
    }
  }
  if (dropped)
    fab_group_fail(g, FAB_ERR_INVALID_USAGE, "deregMrSym", "a window was deregistered while puts into or out of it "
                  "were still being staged: wait for their requests before deregistering");
}

void fab_group_stage_free(fab_group* g, int leak) {
  for (int r = 0; r < g->nranks; r++) {
    fab_group_peer* p = &g->peers[r];
    if (leak && p->tx) continue; /* chunks in flight still complete into their slots */
    fab_remote_buf_dereg(&p->tx_reg);
    if (p->tx_pinned) fab_devcopy_unpin(p->tx_mem);
    p->tx_pinned = 0;
    free(p->tx_mem);
    free(p->tx);
    free(p->rx_landed);
    free(p->gets);
    free(p->asks);
    p->gets = NULL;
    p->asks = NULL;
    p->tx_mem = NULL;
    p->tx = NULL;
    p->rx_landed = NULL;
  }
  if (g->rx_pinned) fab_devcopy_unpin(g->rx_mem); /* still writable for late writes, as retired */
  g->rx_pinned = 0;
  if (g->rx_reg.mr) fab_remote_buf_retire(g->target_ep, &g->rx_reg, g->rx_mem); /* peers may still write */
  else free(g->rx_mem);
  g->rx_mem = NULL;
}
