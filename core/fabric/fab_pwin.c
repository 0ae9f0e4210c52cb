/* The windows a connection's peer offered us, and our offers to it. See
 * fab_pwin.h. */
#include "fab_pwin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_req.h"

/* The comm is being freed: nothing of it is posted. */
static void pwin_free(void* data) {
  fab_pwin* p = data;
  free(p->held);
  free(p->peer);
  fab_reqmem_free(p, sizeof(*p));
}

fab_pwin* fab_pwin_get(fab_comm* c) {
  fab_pwin* p = fab_pwin_of(c);
  if (!p && (p = fab_reqmem_alloc(sizeof(fab_pwin))) != NULL) { /* zeroed */
    p->next_id = 1;
    fab_comm_ext_set(c, FAB_EXT_PWIN, p, pwin_free);
  }
  return p;
}

static int grow(void** v, size_t* cap, size_t n, size_t elem) {
  if (n < *cap) return 0;
  size_t cap2 = *cap ? 2 * *cap : 16;
  void* v2 = realloc(*v, cap2 * elem);
  if (!v2) return -1;
  *v = v2;
  *cap = cap2;
  return 0;
}

/* What each window message is, and what its loss means (fab_ep_ctl.c). */
static fab_ctl_dest window_dest(const fab_comm* c, uint16_t op) {
  fab_ctl_dest to = {.peer = c->peer};
  switch (op) {
    case FAB_WINDOW_ADD:
      to.what = "a window offer";
      to.then = "the peer's one-sided operations into that window fail";
      break;
    case FAB_WINDOW_REMOVE:
      to.what = "a window withdrawal";
      to.then = "the window was deregistered without the peer's confirmation";
      break;
    default:
      to.what = "the answer to a window withdrawal";
      to.then = "the peer deregistered after its short wait";
  }
  return to;
}

int fab_pwin_send(fab_comm* c, uint16_t op, uint64_t id, uint64_t va, uint64_t addr, uint64_t len, uint64_t key) {
  fab_wire_window m;
  fab_wire_window_encode(&m, op, c->peer_id, c->local_id, c->conn_id, id, va, addr, len, key);
  fab_ctl_dest to = window_dest(c, op);
  return fab_ep_ctl_send(c->ep, &to, &m, sizeof(m));
}

/* Often answered from inside a completion (the withdrawal's, or the last
 * operation's): fab_ep_ctl_send never drives the endpoint. */
static void answer_withdrawals(fab_comm* c, fab_pwin* p) {
  if (!p->ack_owed || p->ops_inflight) return;
  int rc = fab_pwin_send(c, FAB_WINDOW_ACK, 0, p->ack_owed, 0, 0, 0);
  if (rc != 0)
    FAB_INFO(FAB_SUBSYS_NET, "answering a window withdrawal of %s failed: %s (it deregisters after a short wait)",
             c->peer_name, fi_strerror(-rc));
  p->ack_owed = 0;
}

void fab_pwin_op_done(fab_comm* c) {
  fab_pwin* p = fab_pwin_of(c);
  p->ops_inflight--;
  answer_withdrawals(c, p);
}

static void withdraw(fab_comm* c, fab_pwin* p, const fab_wire_window* m) {
  for (size_t i = 0; i < p->npeer; i++) {
    if (p->peer[i].id != m->id) continue;
    p->gone[p->ngone++ % FAB_PWIN_GONE] = p->peer[i].win.key;
    p->peer[i] = p->peer[--p->npeer];
    break;
  }
  if (m->va > p->ack_owed) p->ack_owed = m->va;
  answer_withdrawals(c, p);
}

/* The receiver of a message of ours found it larger than its receive: the
 * send completed (the provider took the bytes that did not fit into its
 * overflow), so the comm's next call reports it. */
static void sender_told_truncated(fab_comm* c, const fab_wire_window* m) {
  if (c->kind != FAB_OBJ_SEND) return; /* only a recv comm's peer is told */
  char why[224], over[48] = "";
  if (m->len) snprintf(over, sizeof(over), " by %llu bytes", (unsigned long long)m->len);
  snprintf(why, sizeof(why), "the receiver reported a message (tag %d) larger than its %llu-byte receive%s (the two "
           "ranks disagree on sizes), so the connection is not used further", (int)(uint32_t)m->id,
           (unsigned long long)m->va, over);
  fab_comm_fail(c, FAB_ERR_INVALID_USAGE, why);
}

void fab_pwin_apply(fab_comm* c, const fab_wire_window* m) {
  if (m->op == FAB_NOTE_TRUNCATED) {
    sender_told_truncated(c, m);
    return;
  }
  fab_pwin* p = fab_pwin_get(c);
  if (!p) {
    fab_comm_fail(c, FAB_ERR_SYSTEM, "out of memory keeping a window the peer offered");
    return;
  }
  if (m->op == FAB_WINDOW_REMOVE) {
    withdraw(c, p, m);
    return;
  }
  if (m->op == FAB_WINDOW_ACK) {
    if (m->va > p->withdrawals_acked) p->withdrawals_acked = m->va;
    if (c->ep->silent_peer == c->peer) c->ep->silent_peer = FI_ADDR_NOTAVAIL; /* it answers again */
    return;
  }
  if (grow((void**)&p->peer, &p->cap_peer, p->npeer, sizeof(*p->peer)) != 0) {
    fab_comm_fail(c, FAB_ERR_SYSTEM, "out of memory keeping a window the peer offered");
    return;
  }
  fab_pwin_entry* e = &p->peer[p->npeer++];
  e->id = m->id;
  e->va = m->va;
  e->win.addr = m->addr;
  e->win.len = m->len;
  e->win.key = m->key;
}

void fab_pwin_hold(fab_comm* c, const fab_wire_window* m) {
  fab_pwin* p = fab_pwin_get(c);
  if (p && p->nheld >= FAB_PWIN_HELD) {
    if (!p->held_dropped++) /* one WARN per connect, however many follow */
      FAB_WARN("%s: more than %d window messages came before the answer to the connect; the rest are dropped (a "
               "foreign or corrupted sender)", c->ep->dev->name, FAB_PWIN_HELD);
    return;
  }
  if (!p || grow((void**)&p->held, &p->cap_held, p->nheld, sizeof(*p->held)) != 0) {
    fab_comm_fail(c, FAB_ERR_SYSTEM, "out of memory keeping a window the peer offered");
    return;
  }
  p->held[p->nheld++] = *m;
}

void fab_pwin_release_held(fab_comm* c) {
  fab_pwin* p = fab_pwin_of(c);
  if (!p || !p->nheld) return;
  for (size_t i = 0; i < p->nheld; i++) {
    const fab_wire_window* m = &p->held[i];
    if (m->source_id == c->peer_id && m->conn_id == c->conn_id) fab_pwin_apply(c, m);
    else
      FAB_INFO(FAB_SUBSYS_NET, "%s: dropped a window message for connection %u that came before the answer to a "
               "connect, which named connection %u", c->ep->dev->name, m->conn_id, c->conn_id);
  }
  free(p->held);
  p->held = NULL;
  p->nheld = p->cap_held = 0;
}

const fab_pwin_entry* fab_pwin_find(const fab_pwin* p, uint64_t key, uint64_t va, uint64_t len, int* why) {
  *why = FAB_KEY_UNKNOWN;
  if (!p) return NULL;
  for (size_t i = 0; i < p->npeer; i++) {
    const fab_pwin_entry* e = &p->peer[i];
    if (e->win.key != key) continue;
    *why = FAB_KEY_OUT_OF_RANGE;
    if (va >= e->va && va - e->va <= e->win.len && len <= e->win.len - (va - e->va)) return e;
  }
  uint32_t n = p->ngone < FAB_PWIN_GONE ? p->ngone : FAB_PWIN_GONE;
  for (uint32_t i = 0; *why == FAB_KEY_UNKNOWN && i < n; i++)
    if (p->gone[i] == key) *why = FAB_KEY_WITHDRAWN;
  return NULL;
}

/* --- test: the steps of fab_req_run ------------------------------------------------- */

static inline fab_osreq* osreq_of(fab_req_head* h) { return (fab_osreq*)h; }
static const char* os_verb(const fab_osreq* r) { return r->is_read ? "iread" : "iwrite"; }

static int os_busy(fab_req_head* h, int poll) {
  fab_osreq* r = osreq_of(h);
  if (!atomic_load_explicit(&r->pending, memory_order_acquire)) return 0;
  if (poll) fab_ep_poll(r->comm->ep);
  return atomic_load_explicit(&r->pending, memory_order_acquire) != 0;
}

static fab_result os_stalled(fab_req_head* h) {
  fab_comm* c = osreq_of(h)->comm;
  fab_comm_stalled(c);
  return c->error;
}

/* Its connection failed: it stays in flight until the provider gives it back. */
static int os_give_up(fab_req_head* h, fab_result rc) {
  (void)rc;
  return atomic_load_explicit(&osreq_of(h)->pending, memory_order_acquire) != 0;
}

static fab_result os_finish(fab_req_head* h, int* sizes) {
  fab_osreq* r = osreq_of(h);
  if (sizes) sizes[0] = r->size > INT32_MAX ? INT32_MAX : (int)r->size;
  return r->result;
}

static int os_explain(fab_req_head* h, fab_result rc, char* buf, size_t len) {
  (void)rc;
  fab_osreq* r = osreq_of(h);
  fab_comm* c = r->comm;
  if (h->state == FAB_REQ_ORPHAN)
    snprintf(buf, len, "test: %s of %zu bytes cannot complete: the connection to %s has failed: %s; close it",
             os_verb(r), r->size, c->peer_name, c->error_why);
  else
    snprintf(buf, len, "test: %s", r->why);
  return 1;
}

static void os_release(fab_req_head* h) { h->state = FAB_REQ_FREE; }

static const fab_req_steps os_steps = {os_busy, os_stalled, os_give_up, os_finish, os_explain, os_release};

static fab_result os_test(fab_req_head* h, int* done, int* sizes) {
  if (osreq_of(h)->comm->closing) return fab_req_refuse_closed(h);
  return fab_req_run(h, done, sizes, &os_steps, 1);
}

const fab_req_kind fab_osreq_kind = {.name = "iwrite/iread", .api = FAB_REQ_API_NET, .test = os_test};
