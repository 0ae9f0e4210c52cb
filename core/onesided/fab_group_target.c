/* What lands at a target of a one-sided group: puts counted, signal records
 * applied in order once the puts before them are in, acknowledgements, and
 * staged chunks copied into GPU windows (fab_group_target_drain). Also the
 * group's handle check and its failure. See fab_group.h for the protocol. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_group.h"
#include "fab_devcopy.h"

/* --- the group ------------------------------------------------------------------ */

fab_group* fab_group_get(void* handle, const char* fn) {
  fab_group* g = fab_obj_get(handle, FAB_OBJ_COLL);
  if (g) return g;
  fab_obj_kind k = fab_obj_kind_of(handle);
  FAB_WARN("%s: %p is %s%s, not a live RMA collective comm", fn, handle, k ? "a " : "",
           k ? fab_obj_kind_name(k) : "unknown or already closed");
  return NULL;
}

fab_result fab_group_fail(fab_group* g, fab_result rc, const char* fn, const char* why) {
  int was = atomic_exchange(&g->failed, (int)rc);
  if (!was) {
    snprintf(g->why, sizeof(g->why), "%s", why);
    FAB_WARN("%s: the RMA group of %d ranks (rank %d) failed: %s", fn, g->nranks, g->rank, why);
  }
  return rc;
}

/* --- signals: the target side (target endpoint lock) ----------------------------------- */

static void bad_peer(fab_group_peer* p, const char* what) {
  if (!p->bad[0]) snprintf(p->bad, sizeof(p->bad), "%s", what);
  char why[192];
  snprintf(why, sizeof(why), "rank %d sent %s; its writes are ignored from now on", p->rank, what);
  fab_group_fail(p->group, FAB_ERR_REMOTE, "rmaProgress", why);
}

/* Adds the record's value to its signal word: 1 applied, 0 not now (a GPU
 * window, and the caller may not touch GPU memory: progress will), -1 the
 * record is bad (the peer is failed). */
/* A get from the peer (FAB_GROUP_OP_GET): queued for progress, which answers
 * with chunks into the peer's staging ring. */
static int ask(fab_group_peer* p, const fab_group_sig* s, fab_group_win* w) {
  if (!s->value || s->offset > w->len || s->value > w->len - s->offset) {
    bad_peer(p, "a get outside its window");
    return -1;
  }
  uint32_t head = atomic_load_explicit(&p->ask_head, memory_order_relaxed);
  if (!p->asks) p->asks = calloc(FAB_GROUP_GETS, sizeof(*p->asks));
  if (!p->asks || head - atomic_load_explicit(&p->ask_tail, memory_order_acquire) >= FAB_GROUP_GETS) {
    bad_peer(p, p->asks ? "more gets in flight than it may have" : "a get, and we are out of memory");
    return -1;
  }
  p->asks[head % FAB_GROUP_GETS] = (fab_group_ask){.offset = s->offset, .size = s->value, .window = s->window,
                                                 .id = s->get};
  atomic_store_explicit(&p->ask_head, head + 1, memory_order_release);
  atomic_store_explicit(&p->group->due, 1, memory_order_release);
  return 1;
}

static int apply(fab_group_peer* p, const fab_group_sig* s, int can_gpu) {
  fab_group* g = p->group;
  fab_group_win* w = s->window < g->nwins ? g->wins[s->window] : NULL;
  if (s->op == FAB_GROUP_OP_WITHDRAW) { /* the peer's registration of it is gone (ours may be too) */
    if (w) atomic_store_explicit(&w->remote_gone[p->rank], 1, memory_order_release);
    return 1;
  }
  if (!w) {
    bad_peer(p, s->op == FAB_GROUP_OP_GET ? "a get from a window that is not registered here"
                                         : "a signal for a window that is not registered here");
    return -1;
  }
  if (s->op == FAB_GROUP_OP_GET) return ask(p, s, w);
  if (w->len < 8 || s->offset % 8 || s->offset > w->len - 8) {
    bad_peer(p, "a signal outside its window");
    return -1;
  }
  if (s->op != FAB_SIGNAL_INC && s->op != FAB_SIGNAL_ADD) {
    bad_peer(p, "a signal with an unknown operation");
    return -1;
  }
  uint64_t add = s->op == FAB_SIGNAL_INC ? 1 : s->value;
  if (!w->gpu) {
    __atomic_fetch_add((uint64_t*)(w->base + s->offset), add, __ATOMIC_RELEASE);
    return 1;
  }
  if (!can_gpu) {
    atomic_store_explicit(&p->gpu_sig_due, 1, memory_order_relaxed);
    atomic_store_explicit(&g->due, 1, memory_order_release);
    return 0;
  }
  return fab_group_gpu_signal(g, w, s->offset, add, "rmaProgress") == FAB_OK ? 1 : -1;
}

/* Put number (mod 2^11) v landed: advance the prefix over every put in.
 * 0 when v lies beyond the window (the peer ignored our acknowledgements). */
static int put_landed(fab_group_peer* p, uint32_t v) {
  uint64_t n = p->puts_landed + ((v - (uint32_t)p->puts_landed) & FAB_GROUP_VALUE_MASK);
  uint64_t off = n - p->puts_landed;
  if (off >= FAB_GROUP_PUT_WINDOW) return 0;
  uint64_t* seen = p->put_seen;
  uint64_t bit = n % FAB_GROUP_PUT_WINDOW;
  if (seen[bit / 64] >> (bit % 64) & 1) return 0; /* twice */
  seen[bit / 64] |= 1ull << (bit % 64);
  for (;;) {
    uint64_t b = p->puts_landed % FAB_GROUP_PUT_WINDOW;
    if (!(seen[b / 64] >> (b % 64) & 1)) break;
    seen[b / 64] &= ~(1ull << (b % 64));
    p->puts_landed++;
  }
  atomic_store_explicit(&p->puts_landed_pub, p->puts_landed, memory_order_release);
  if (p->puts_landed - p->puts_acked_seen >= FAB_GROUP_PUT_WINDOW / 4) {
    p->puts_acked_seen = p->puts_landed;
    atomic_store_explicit(&p->group->due, 1, memory_order_release); /* time to acknowledge the prefix */
  }
  return 1;
}

/* Applies landed records in order, each once every put it follows is in;
 * can_gpu: this thread may copy into GPU memory (progress, not a completion
 * handler). Target lock held. */
static void apply_ready(fab_group_peer* p, int can_gpu) {
  for (;;) {
    uint32_t slot = p->sig_next % FAB_GROUP_RING;
    if (!p->landed[slot]) return;
    fab_group_sig s;
    memcpy(&s, &p->ring_mem[slot], sizeof(s));
    if (s.check != fab_group_sig_check(&s) || s.seq != p->sig_next || s.token != p->token) {
      bad_peer(p, "a signal record that fails its checks");
      return;
    }
    if (s.puts_before > p->puts_landed) return; /* some of its puts are on the way */
    if (apply(p, &s, can_gpu) <= 0) return;
    p->landed[slot] = 0;
    p->sig_next++;
    atomic_store_explicit(&p->sig_applied, p->sig_next, memory_order_release);
    atomic_store_explicit(&p->group->due, 1, memory_order_release); /* its slot goes back to the source */
  }
}

/* How far an acknowledged count v (mod 2^11) is ahead of what we hold
 * (negative: an older acknowledgement, dispatched after a newer one). */
static int32_t ack_delta(uint32_t v, uint32_t acked) {
  uint32_t d = (v - acked) & FAB_GROUP_VALUE_MASK;
  return d >> (FAB_GROUP_VALUE_BITS - 1) ? (int32_t)d - (int32_t)(1u << FAB_GROUP_VALUE_BITS) : (int32_t)d;
}

void fab_group_target_landed(fab_comm* rc, void* arg, uint32_t low) {
  (void)rc;
  fab_group_peer* p = arg;
  if (!p || p->bad[0] || atomic_load(&p->group->failed)) return;
  uint32_t v = low & FAB_GROUP_VALUE_MASK;
  switch (low >> 28) {
    case FAB_GROUP_PUT:
      if (!put_landed(p, v)) return bad_peer(p, "a put numbered beyond its window");
      apply_ready(p, 0);
      return;
    case FAB_GROUP_SIGNAL:
      if (v >= FAB_GROUP_RING || p->landed[v]) return bad_peer(p, "a signal into a ring slot it does not own");
      p->landed[v] = 1;
      apply_ready(p, 0);
      return;
    case FAB_GROUP_STAGED: /* copied into its window by progress (fab_group_target_drain) */
      if (!p->rx_landed || v >= p->group->rx_slots || p->rx_landed[v])
        return bad_peer(p, "a chunk into a staging slot it does not own");
      p->rx_landed[v] = 1;
      atomic_store_explicit(&p->group->due, 1, memory_order_release);
      return;
    case FAB_GROUP_ACK_STAGED: {
      uint32_t acked = atomic_load_explicit(&p->chunk_acked, memory_order_relaxed);
      int32_t delta = ack_delta(v, acked);
      uint32_t sent = atomic_load_explicit(&p->chunk_seq, memory_order_acquire);
      if (delta > (int32_t)p->stage_slots || (delta > 0 && (int32_t)(sent - (acked + (uint32_t)delta)) < 0))
        return bad_peer(p, "an acknowledgement of chunks never sent");
      if (delta > 0) {
        atomic_store_explicit(&p->chunk_acked, acked + (uint32_t)delta, memory_order_release);
        atomic_store_explicit(&p->group->due, 1, memory_order_release); /* queued chunks may go */
      }
      return;
    }
    case FAB_GROUP_ACK: {
      /* threads that read one CQ may dispatch its entries in any order: an
       * acknowledgement older than one already seen changes nothing */
      uint32_t acked = atomic_load_explicit(&p->sig_acked, memory_order_relaxed);
      int32_t delta = ack_delta(v, (uint32_t)acked);
      uint32_t sent = atomic_load_explicit(&p->sig_seq, memory_order_relaxed);
      if (delta > FAB_GROUP_RING || (delta > 0 && (int32_t)(sent - (acked + (uint32_t)delta)) < 0))
        return bad_peer(p, "an acknowledgement of signals never sent");
      if (delta > 0) atomic_store_explicit(&p->sig_acked, acked + (uint32_t)delta, memory_order_release);
      return;
    }
    case FAB_GROUP_ACK_PUTS: {
      uint64_t acked = atomic_load_explicit(&p->puts_acked, memory_order_relaxed);
      int32_t delta = ack_delta(v, (uint32_t)acked);
      if (delta > FAB_GROUP_PUT_WINDOW) return bad_peer(p, "an acknowledgement of puts never sent");
      if (delta > 0) atomic_store_explicit(&p->puts_acked, acked + (uint64_t)delta, memory_order_release);
      return;
    }
    default:
      bad_peer(p, "a one-sided write of an unknown kind");
  }
}


/* --- GPU windows ------------------------------------------------------------------------ */

fab_result fab_group_gpu_signal(fab_group* g, fab_group_win* w, uint64_t off, uint64_t add, const char* fn) {
  const char* what = NULL;
  void* word = (void*)(w->base + off);
  size_t i = off / 8;
  uint64_t v = 0;
  int rc = 0;
  if (g->gpu_direct) rc = fab_devcopy_flush(&what); /* the NIC's writes first */
  if (rc == 0 && w->shadow && w->shadow_known[i]) v = w->shadow[i];
  else if (rc == 0) rc = fab_devcopy_load64(word, &v, &what);
  if (rc == 0) rc = fab_devcopy_store64(word, v + add, &what);
  if (rc == 0) {
    if (w->shadow) {
      w->shadow[i] = v + add;
      w->shadow_known[i] = 1;
    }
    return FAB_OK;
  }
  char why[160];
  snprintf(why, sizeof(why), "updating a signal in GPU memory failed: %s returned %d", what, rc);
  return fab_group_fail(g, FAB_ERR_CUDA, fn, why);
}

/* Where the chunk in p's staging slot goes, checked against our windows or
 * our gets in flight (target lock held; gets: group->lock, held too). 0: it is
 * bad, and the peer is failed. */
static int chunk_dest(fab_group_peer* p, const fab_group_chunk* c, uint32_t seq, char** dst, int* dst_gpu) {
  fab_group* g = p->group;
  if (c->check != fab_group_chunk_check(c) || c->token != p->token || c->seq != seq ||
      c->len > g->rx_slot_bytes - sizeof(*c)) {
    bad_peer(p, "a staged chunk that fails its checks");
    return 0;
  }
  if (c->window == FAB_GROUP_GET_REPLY) {
    fab_group_inflight_get* e = p->gets ? &p->gets[c->get % FAB_GROUP_GETS] : NULL;
    if (!e || !e->req || e->id != c->get || c->offset > e->size || c->len > e->size - c->offset) {
      bad_peer(p, "an answer to a get we did not make, or outside it");
      return 0;
    }
    *dst = (char*)e->local->base + e->local_off + c->offset;
    *dst_gpu = e->local->gpu;
    return 1;
  }
  fab_group_win* w = c->window < g->nwins ? g->wins[c->window] : NULL;
  if (!w || !w->staged) {
    bad_peer(p, "a staged chunk for a window that is not a staged window here");
    return 0;
  }
  if (c->offset > w->len || c->len > w->len - c->offset) {
    bad_peer(p, "a staged chunk outside its window");
    return 0;
  }
  *dst = (char*)w->base + c->offset;
  *dst_gpu = 1;
  return 1;
}

/* A get's answer is in: its request completes once every byte is (group->lock). */
static void get_part_in(fab_group_peer* p, const fab_group_chunk* c) {
  fab_group_inflight_get* e = &p->gets[c->get % FAB_GROUP_GETS];
  e->done += c->len;
  if (e->done < e->size) return;
  fab_group_req* r = e->req;
  e->req = NULL;
  fab_group_req_op_over(r, 0, NULL);
}

/* Copies p's landed chunks into their windows, in order (enqueued, then
 * waited for once); each then counts as a landed put, so signals after it
 * may apply. */
static void drain_chunks(fab_group_peer* p) {
  fab_group* g = p->group;
  fab_endpoint* ep = g->target_ep;
  uint32_t n = 0;
  const void* gpu_ptr = NULL; /* a GPU destination, to wait for the copies in its context */
  const char* what = NULL;
  int rc = 0;
  for (; n < g->rx_slots; n++) {
    uint32_t slot = (p->rx_next + n) % g->rx_slots;
    const char* mem = g->rx_mem + ((size_t)p->rank * g->rx_slots + slot) * g->rx_slot_bytes;
    fab_group_chunk c;
    char* dst = NULL;
    int dst_gpu = 0, ok = 0;
    pthread_mutex_lock(&ep->lock);
    if (p->rx_landed[slot] && !p->bad[0]) {
      memcpy(&c, mem, sizeof(c));
      ok = chunk_dest(p, &c, p->rx_next + n, &dst, &dst_gpu);
    }
    pthread_mutex_unlock(&ep->lock);
    if (!ok) break;
    /* the window stays: deregistration takes group->lock, which we hold */
    if ((rc = fab_devcopy_async(dst, dst_gpu, mem + sizeof(c), 0, c.len, &what)) != 0) break;
    if (dst_gpu) gpu_ptr = dst;
  }
  if (rc == 0 && gpu_ptr) rc = fab_devcopy_wait(gpu_ptr, &what);
  if (rc != 0) {
    char why[160];
    snprintf(why, sizeof(why), "copying a staged chunk into its window failed: %s returned %d", what, rc);
    fab_group_fail(g, FAB_ERR_CUDA, "rmaProgress", why);
    return;
  }
  if (!n) return;
  pthread_mutex_lock(&ep->lock);
  for (uint32_t k = 0; k < n && !p->bad[0]; k++) {
    uint32_t slot = p->rx_next % g->rx_slots;
    fab_group_chunk c; /* read before the slot is given back */
    memcpy(&c, g->rx_mem + ((size_t)p->rank * g->rx_slots + slot) * g->rx_slot_bytes, sizeof(c));
    p->rx_landed[slot] = 0;
    p->rx_next++;
    if (c.window == FAB_GROUP_GET_REPLY) get_part_in(p, &c);
    if (!put_landed(p, (uint32_t)c.put)) bad_peer(p, "a staged chunk numbered beyond its window");
  }
  atomic_store_explicit(&p->rx_done, p->rx_next, memory_order_release);
  apply_ready(p, 1);
  pthread_mutex_unlock(&ep->lock);
  atomic_store_explicit(&g->due, 1, memory_order_release); /* the slots go back to the source */
}

void fab_group_target_drain(fab_group* g) {
  for (int r = 0; r < g->nranks; r++) {
    fab_group_peer* p = &g->peers[r];
    if (!p->rc || p->bad[0]) continue;
    if (p->rx_landed) drain_chunks(p);
    if (atomic_exchange_explicit(&p->gpu_sig_due, 0, memory_order_acq_rel)) {
      pthread_mutex_lock(&g->target_ep->lock);
      apply_ready(p, 1);
      pthread_mutex_unlock(&g->target_ep->lock);
    }
  }
}
