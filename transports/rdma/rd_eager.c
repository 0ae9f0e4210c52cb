/*
 * The rdma transport's eager path: a send of at most FABRIC_EAGER_MAX bytes
 * whose buffer has not been announced yet is written at once into one of the
 * receiver's RD_EAGER_SLOTS (14) ring slots (header + payload, one write with CQ data) instead
 * of waiting; the receive copies it out. See rd.h for the matching rule that
 * makes the two paths agree.
 *
 * Credits: the sender writes only slots the receiver gave back (all at the
 * start); the receiver returns copied-out slots in its next announcement's
 * entry, or on their own (in CQ data) once a quarter of the ring waits. Without a
 * credit a send simply takes the announced path: eager never makes anyone wait.
 *
 * Mailbox flow control: the announcement of a buffer an eager message served
 * is dropped by the sender, so no data write proves it consumed; the eager
 * header carries the sender's consumption, and when drops pile up (or a send
 * waits) the sender acknowledges them on their own (RD_ACK_SLOT).
 *
 * This file is the sender's side and the setup of both; the receiver's side
 * (landing, holding, copying out, credits) is in rd_recv.c. All of it runs
 * with the endpoint lock held, but the stage_busy bits (cleared by write
 * completions without it).
 */
#include <stdlib.h>
#include <string.h>

#include "rd.h"

static uint32_t slot_size_for(size_t eager_max) {
  return (uint32_t)(sizeof(rd_eager_hdr) + ((eager_max + 63) & ~(size_t)63));
}

static size_t round_page(size_t len) { return (len + 4095) & ~(size_t)4095; }

/* --- setup and teardown ---------------------------------------------------------- */

fab_result rd_eager_recv_init(fab_comm* c) {
  rd_rcomm* rc = rd_r(c);
  size_t max = fab_g.params.eager_max;
  if (!max) return FAB_OK;
  uint32_t slot = slot_size_for(max);
  size_t len = round_page((size_t)RD_EAGER_SLOTS * slot + RD_SCRATCH);
  rc->ring = aligned_alloc(4096, len);
  if (!rc->ring) {
    FAB_WARN("accept: out of memory for the rdma eager ring (%zu bytes; FABRIC_EAGER_MAX=0 turns it off)", len);
    return FAB_ERR_SYSTEM;
  }
  int err = fab_remote_buf_reg(c->ep, rc->ring, len, FI_REMOTE_WRITE, &rc->ring_mr);
  if (err) {
    FAB_WARN("accept: registering the rdma eager ring on %s failed: %s", c->ep->dev->name, fi_strerror(-err));
    free(rc->ring);
    rc->ring = NULL;
    return FAB_ERR_SYSTEM;
  }
  rc->slot_size = slot;
  return FAB_OK;
}

void rd_eager_fini(fab_comm* c) {
  if (c->kind == FAB_OBJ_RECV) {
    rd_rcomm* rc = rd_r(c);
    fab_tagmap_free(&rc->posted);
    /* the sender may still be writing into the ring: retired, not freed */
    if (rc->ring_mr.mr && c->ep) fab_remote_buf_retire(c->ep, &rc->ring_mr, rc->ring);
    else free(rc->ring);
    rc->ring = NULL;
    rc->ring_mr.mr = NULL;
    return;
  }
  rd_scomm* s = rd_s(c);
  fab_tagmap_free(&s->sent);
  fab_remote_buf_dereg(&s->stage_mr); /* only our own writes read it, and they have completed */
  free(s->stage);
  s->stage = NULL;
}

size_t rd_eager_welcome(fab_comm* c, void* out, size_t cap) {
  rd_rcomm* rc = rd_r(c);
  rd_welcome w = {.ring_addr = rc->ring_mr.win.addr, .ring_key = rc->ring_mr.win.key,
                  .ring_slots = rc->slot_size ? RD_EAGER_SLOTS : 0, .slot_size = rc->slot_size};
  _Static_assert(sizeof(w) <= FAB_TP_MAX, "rd_welcome fits the handshake");
  memcpy(out, &w, sizeof(w));
  return sizeof(w);
}

fab_result rd_eager_connected(fab_comm* c, const void* in, size_t len) {
  rd_scomm* s = rd_s(c);
  rd_welcome w;
  if (len != sizeof(w)) {
    FAB_WARN("connect to %s: the rdma answer has %zu bytes, expected %zu (mixed plugin builds?)", c->peer_name, len,
             sizeof(w));
    return FAB_ERR_REMOTE;
  }
  memcpy(&w, in, sizeof(w));
  if (w.ring_slots == 0 || !fab_g.params.eager_max) return FAB_OK; /* no eager path on this connection */
  if (w.ring_slots != RD_EAGER_SLOTS || w.slot_size <= sizeof(rd_eager_hdr) ||
      w.slot_size > sizeof(rd_eager_hdr) + 65536) {
    FAB_WARN("connect to %s: the peer's eager ring (%u slots of %u bytes) is not one this build writes into "
             "(mixed plugin builds?)", c->peer_name, w.ring_slots, w.slot_size);
    return FAB_ERR_REMOTE;
  }
  size_t len_stage = round_page((size_t)RD_EAGER_SLOTS * w.slot_size);
  s->stage = aligned_alloc(4096, len_stage);
  if (!s->stage || fab_remote_buf_reg(c->ep, s->stage, len_stage, FI_WRITE | FI_SEND, &s->stage_mr) != 0) {
    FAB_WARN("connect to %s: no memory for the eager staging buffer (%zu bytes); FABRIC_EAGER_MAX=0 turns the "
             "eager path off", c->peer_name, len_stage);
    free(s->stage);
    s->stage = NULL;
    return FAB_ERR_SYSTEM;
  }
  s->ring = (fab_window){.addr = w.ring_addr, .len = (uint64_t)w.ring_slots * w.slot_size + RD_SCRATCH,
                         .key = w.ring_key};
  s->slot_size = w.slot_size;
  size_t max = w.slot_size - sizeof(rd_eager_hdr);
  s->eager_max = (uint32_t)(fab_g.params.eager_max < max ? fab_g.params.eager_max : max);
  s->ring_free = (uint16_t)((1u << RD_EAGER_SLOTS) - 1);
  return FAB_OK;
}

/* --- sender -------------------------------------------------------------------------- */

ssize_t rd_eager_post(fab_comm* c, fab_req* r) {
  rd_scomm* s = rd_s(c);
  rd_sreq* q = rd_sq(r);
  if (!s->ring.len || r->size > s->eager_max || !q->host) return -FI_EAGAIN; /* GPU data: no CPU copy */
  uint16_t avail = s->ring_free & (uint16_t)~atomic_load_explicit(&s->stage_busy, memory_order_acquire);
  if (!avail) return -FI_EAGAIN;
  int slot = __builtin_ctz(avail);
  char* st = s->stage + (size_t)slot * s->slot_size;
  rd_eager_hdr h = {.tag = r->tag, .k = q->k, .size = (uint32_t)r->size, .consumed = s->next_index};
  h.check = rd_eager_check(&h);
  memcpy(st, &h, sizeof(h));
  memcpy(st + sizeof(h), q->data, r->size);
  size_t total = sizeof(h) + r->size;
  uint64_t off = (uint64_t)slot * s->slot_size;
  uint64_t data = rd_cq_data(c, RD_EAGER, (uint32_t)slot, (uint32_t)r->size);
  ssize_t rc;
  if (fab_dev_injects(c->ep->dev, total)) { /* the provider copies it: the slot is free on return */
    rc = fab_remote_inject_writedata(c->ep, c->peer, st, total, &s->ring, off, data, &q->op);
  } else {
    q->eager_slot = slot;
    atomic_fetch_or_explicit(&s->stage_busy, (uint16_t)(1u << slot), memory_order_acq_rel);
    rc = fab_remote_writedata(c->ep, c->peer, st, total, s->stage_mr.desc, &s->ring, off, data, &q->op);
    if (rc != 0) {
      atomic_fetch_and_explicit(&s->stage_busy, (uint16_t)~(1u << slot), memory_order_acq_rel);
      q->eager_slot = -1;
    }
  }
  if (rc != 0) return rc == -FI_EAGAIN ? rc : (ssize_t)-FI_EAGAIN; /* the announced path takes it */
  s->ring_free &= (uint16_t)~(1u << slot);
  atomic_store_explicit(&q->eager, 1, memory_order_relaxed);
  s->acked_sent = s->next_index; /* the header told the receiver */
  s->dropped = 0;
  return 0;
}

void rd_eager_credits(fab_comm* c, uint16_t slots) {
  if (rd_s(c)->tagged_max) { /* asked announcements: a count of tagged messages taken */
    if (slots) rd_tagged_credits(c, slots);
    return;
  }
  rd_s(c)->ring_free |= (uint16_t)(slots & ((1u << RD_EAGER_SLOTS) - 1));
}

void rd_eager_ack_if_due(fab_comm* c) {
  rd_scomm* s = rd_s(c);
  if (!s->ring.len || !s->dropped) return;
  if (s->nwait == 0 && s->dropped < RD_SLOTS / 4) return;
  uint64_t data = rd_cq_data(c, RD_EAGER, RD_ACK_SLOT, s->next_index);
  if (fab_remote_ctl_write(c, &rd_scratch_word, sizeof(rd_scratch_word), &s->ring,
                        (uint64_t)RD_EAGER_SLOTS * s->slot_size, data) != 0)
    return; /* next time */
  s->acked_sent = s->next_index;
  s->dropped = 0;
}

