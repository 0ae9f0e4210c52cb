/* The rdma transport: comm lifetime, handshake payloads, the remote-data
 * dispatcher and the ops table. The protocol is described in rd.h. */
#include "fab_prof.h"
#include "rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- comm lifetime and handshake ------------------------------------------------ */

static fab_result rd_comm_init(fab_comm* c) {
  if (c->kind != FAB_OBJ_SEND) return rd_eager_recv_init(c);
  rd_scomm* s = rd_s(c);
  size_t len = 4096 * ((RD_SLOTS * sizeof(rd_ctrl) + RD_SCRATCH + 4095) / 4096);
  s->box = aligned_alloc(4096, len);
  if (!s->box) {
    FAB_WARN("connect: out of memory for the rdma mailbox");
    return FAB_ERR_SYSTEM;
  }
  memset(s->box, 0, len);
  int rc = fab_remote_buf_reg(c->ep, s->box, len, FI_REMOTE_WRITE | FI_WRITE, &s->box_mr);
  if (rc != 0) {
    FAB_WARN("connect: registering the rdma mailbox on %s failed: %s", c->ep->dev->name, fi_strerror(-rc));
    free(s->box);
    s->box = NULL;
    return FAB_ERR_SYSTEM;
  }
  return FAB_OK;
}

/* The peer may still be announcing into the mailbox (it does not know we
 * closed): retired, not freed (fab_remote_buf_retire). */
static void rd_comm_fini(fab_comm* c) {
  if (c->kind == FAB_OBJ_RECV) rd_recv_release(c);
  else if (c->kind == FAB_OBJ_SEND) rd_send_release(c);
  rd_eager_fini(c);
  if (c->kind != FAB_OBJ_SEND || !c->ep) return;
  rd_scomm* s = rd_s(c);
  if (s->box_mr.mr) fab_remote_buf_retire(c->ep, &s->box_mr, s->box);
  else free(s->box);
  s->box = NULL;
  s->box_mr.mr = NULL;
}

static size_t rd_connect_payload(fab_comm* c, void* buf, size_t cap) {
  rd_scomm* s = rd_s(c);
  size_t own = c->ep->dev->tagged_max;
  size_t tagged_max = own < c->max_bytes ? own : c->max_bytes;
  s->tagged_max = (uint32_t)tagged_max;
  s->tcredits = RD_TAGGED_CREDITS;
  rd_hello h = {.box_addr = s->box_mr.win.addr, .box_key = s->box_mr.win.key, .box_slots = RD_SLOTS,
               .cq_bytes = rd_cq_bytes(c), .tagged_max = s->tagged_max};
  _Static_assert(sizeof(h) <= FAB_TP_MAX, "rd_hello fits the handshake");
  memcpy(buf, &h, sizeof(h));
  return sizeof(h);
}

static fab_result rd_accept_payload(fab_comm* c, const void* in, size_t in_len, void* out, size_t cap,
                                    size_t* out_len) {
  rd_hello h;
  *out_len = 0;
  if (in_len != sizeof(h)) {
    FAB_WARN("accept: refused %s: its rdma handshake data has %zu bytes, expected %zu (mixed plugin builds?)",
             c->peer_name, in_len, sizeof(h));
    return FAB_ERR_REMOTE;
  }
  memcpy(&h, in, sizeof(h));
  if (h.box_slots != RD_SLOTS) {
    FAB_WARN("accept: refused %s: its rdma mailbox has %u entries, this build expects %d (mixed plugin builds?)",
             c->peer_name, h.box_slots, RD_SLOTS);
    return FAB_ERR_REMOTE;
  }
  if (h.cq_bytes != rd_cq_bytes(c)) {
    FAB_WARN("accept: refused %s: it writes %u bytes of remote CQ data, this rank %u; every rank must use the same "
             "provider with the same settings (FABRIC_NIC_PROFILE)", c->peer_name, h.cq_bytes, rd_cq_bytes(c));
    return FAB_ERR_REMOTE;
  }
  rd_rcomm* r = rd_r(c);
  r->asked = h.tagged_max > 0;
  r->tagged_max = h.tagged_max;
  r->box = (fab_window){.addr = h.box_addr, .len = RD_SLOTS * sizeof(rd_ctrl) + RD_SCRATCH, .key = h.box_key};
  *out_len = rd_eager_welcome(c, out, cap);
  return FAB_OK;
}

/* --- remote data ------------------------------------------------------------------ */

/* A peer's write landed. ep lock held: a comm is freed only under it. */
static void rd_remote_data(fab_endpoint* ep, const fab_cqe* e) {
  uint64_t d = e->data;
  if (ep->dev->cq_narrow && rd_cq_widen(e->data, e->len, &d) != 0) {
    FAB_INFO(FAB_SUBSYS_NET, "ignored an RDMA write on %s whose CQ data 0x%llx no writer of ours sends",
             ep->dev->name, (unsigned long long)e->data);
    return;
  }
  fab_comm* c = fab_ep_id_get(ep, rd_cq_comm(d));
  if (!c || c->ops != &fab_rdma_ops) {
    /* a write for a connection closed meanwhile (its receives ended at
     * close), or a stray one: nothing of ours is touched */
    FAB_INFO(FAB_SUBSYS_NET, "ignored an RDMA write on %s naming connection %u, closed or unknown", ep->dev->name,
             rd_cq_comm(d));
    return;
  }
  fab_comm_count_completion(c);
  unsigned type = rd_cq_type(d);
  if (type == RD_DATA && rd_cq_slot(d) == RD_ONESIDED_SLOT) {
    fab_onesided_hook* hook = c->kind == FAB_OBJ_RECV ? fab_comm_ext_get(c, FAB_EXT_ONESIDED) : NULL;
    if (hook) hook->landed(c, hook->arg, rd_cq_low(d));
    else FAB_INFO(FAB_SUBSYS_NET, "ignored a one-sided write on %s for connection %u, not in a group (any more)",
                  ep->dev->name, rd_cq_comm(d));
    return;
  }
  if (type == RD_CTRL) {
    if (c->kind == FAB_OBJ_SEND) rd_send_landed(c, rd_cq_low(d));
    else rd_protocol_error(c, "a buffer announcement arrived on a receiving connection");
  } else if (type == RD_EAGER) {
    if (c->kind == FAB_OBJ_RECV) rd_recv_eager_landed(c, rd_cq_slot(d), rd_cq_low(d));
    else rd_protocol_error(c, "an eager message arrived on a sending connection");
  } else if (type == RD_DATA || type == RD_TRUNC) {
    if (c->kind == FAB_OBJ_RECV) rd_recv_landed(c, type, rd_cq_slot(d), rd_cq_low(d));
    else rd_protocol_error(c, "data arrived on a sending connection");
  }
}

/* --- data path --------------------------------------------------------------------- */

static void rd_init_req(fab_comm* c, fab_req* r) {
  if (c->kind == FAB_OBJ_SEND) rd_send_init_req(c, r);
  else rd_recv_init_req(c, r);
}

/* Over a rail with a polling thread, the thread reads the CQ and posts the
 * sends left to it; a test does so itself only now and then
 * (fab_comm_test_polls). */
static void rd_progress(fab_comm* c, fab_req* r) {
  int own = fab_comm_test_polls(c);
  if (own) rd_poll(c);
  if (c->kind == FAB_OBJ_SEND) {
    if (own) rd_send_progress(c);
  } else {
    rd_recv_progress(c);
    rd_recv_check_gone(c, r);
  }
}

static void rd_sizes(fab_req* r, int* sizes) {
  if (r->type == FAB_REQ_SEND) {
    sizes[0] = (int)r->size;
    return;
  }
  for (int i = 0; i < r->n; i++) sizes[i] = (int)rd_rq(r)->sub[i].got;
}

/* Profiler events (fab_prof.h): a send waits for its buffer's announcement
 * (control), or was written into the buffer or the eager ring; a receive is
 * announced (control) until the data lands, by a write or from the ring. */
static uint8_t rd_prof_path(fab_req* r, int sub) {
  if (r->type == FAB_REQ_SEND) {
    rd_sreq* q = rd_sq(r);
    if (q->ts == RD_TS_DATA) return FAB_PROF_PATH_MESSAGE;
    /* read while another thread may post it (under the ep lock): a report, not a decision */
    if (atomic_load_explicit(&q->eager, memory_order_relaxed)) return FAB_PROF_PATH_EAGER;
    return __atomic_load_n(&q->matched, __ATOMIC_RELAXED) ? FAB_PROF_PATH_WRITE : FAB_PROF_PATH_CONTROL;
  }
  rd_rsub* b = &rd_rq(r)->sub[sub];
  int st = atomic_load_explicit(&b->state, memory_order_acquire);
  if (st == RD_SUB_UNPOSTED || st == RD_SUB_LISTENING) return FAB_PROF_PATH_MESSAGE;
  if (st != RD_SUB_DONE) return FAB_PROF_PATH_CONTROL;
  if (b->via_tag) return FAB_PROF_PATH_MESSAGE;
  return b->eager ? FAB_PROF_PATH_EAGER : FAB_PROF_PATH_WRITE;
}

static void rd_give_up(fab_req* r) {
  if (r->type == FAB_REQ_SEND) rd_send_give_up(r);
  else rd_recv_give_up(r);
}

static void rd_cancel(fab_comm* c) {
  if (c->kind == FAB_OBJ_SEND) rd_send_cancel(c);
  else rd_recv_cancel(c);
}

/* Writes into a one-sided group's windows name the peer's recv comm and the one-sided slot. */
static uint64_t rd_onesided_data(const fab_comm* c, uint32_t low) {
  return rd_cq_data(c, RD_DATA, RD_ONESIDED_SLOT, low);
}

/* Sends waiting for their buffer's announcement have read nothing yet. */
static uint32_t rd_unposted(fab_comm* c) { return c->kind == FAB_OBJ_SEND ? rd_s(c)->nwait : 0; }

static uint64_t rd_unproven(fab_comm* c) { return c->kind == FAB_OBJ_SEND ? rd_tagged_unproven(c) : 0; }

const fab_transport_ops fab_rdma_ops = {
    .name = "rdma",
    .id = FAB_TRANSPORT_RDMA,
    .needs =
        {
            .caps = FI_MSG | FI_TAGGED | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ,
            .mr_access = FI_SEND | FI_RECV | FI_WRITE | FI_REMOTE_WRITE | FI_READ | FI_REMOTE_READ,
            .cq_data_size = 4,
            .conn_max_narrow = RD_NARROW_ID_MAX,
            .mr_key_size = 8,
            .tagged = 1,
            .confirms_tagged = 1,
            .reg_host = 1,
        },
    /* shm: 8-byte latency 1.7x sendrecv's, message rate 0.76x, bidirectional bandwidth 0.85x
     * (docs/results/performance-history.md §2.5): two shm messages per NCCL message */
    .auto_avoid = "shm",
    .send_reqs = RD_SEND_REQS,
    .recv_reqs = RD_RECV_REQS,
    .send_req_size = sizeof(rd_sreq),
    .recv_req_size = sizeof(rd_rreq),
    .comm_size = sizeof(rd_scomm) > sizeof(rd_rcomm) ? sizeof(rd_scomm) : sizeof(rd_rcomm),
    .comm_init = rd_comm_init,
    .comm_fini = rd_comm_fini,
    .init_req = rd_init_req,
    .connect_payload = rd_connect_payload,
    .accept_payload = rd_accept_payload,
    .connected = rd_eager_connected,
    .isend = rd_isend,
    .irecv = rd_irecv,
    .iflush = fab_mr_iflush,
    .progress = rd_progress,
    .pump = rd_send_pump,
    .sizes = rd_sizes,
    .prof_path = rd_prof_path,
    .give_up = rd_give_up,
    .cancel = rd_cancel,
    .unposted = rd_unposted,
    .unproven = rd_unproven,
    .remote_data = rd_remote_data,
    .onesided_data = rd_onesided_data,
};
