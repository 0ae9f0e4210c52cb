/* Every endpoint's control receives (connect requests and liveness probes),
 * their delivery to listeners' queues, refusals, and the listeners' share of
 * endpoint teardown. Below fab_listen.c: it knows listeners only as data. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_pwin.h"
#include "fab_transport.h"

/* --- refusals ------------------------------------------------------------- */

/* A refusal the provider cannot take now (rxm while its connection to the
 * connector is still being set up, a full send queue) waits on the
 * endpoint and is posted by its sweep (fab_ep_ctl.c): a refusal dropped
 * instead would leave its connector waiting out FABRIC_CONNECT_TIMEOUT_MS. */
void fab_conn_refuse(fab_endpoint* ep, const fab_wire_connect* req, uint16_t status, int rails) {
  fab_ctl_dest to = {.tagged = 1,
                     .tag = fab_tag_accept(&ep->dev->tags, req->connector_id),
                     .holds_av = 1,
                     .what = "a refusal of a connect request",
                     .then = "that connect waits out its FABRIC_CONNECT_TIMEOUT_MS"};
  if (fab_ep_av_insert(ep, req->addr, req->addr_len, &to.peer) != 0) return; /* no address to answer: it times out */
  fab_wire_accept msg;
  fab_wire_tp tp = {.transport = ep->dev->ops->id}; /* tells a connector on another transport which */
  fab_wire_accept_encode(&msg, status, req->listen_id, req->connector_id, 0, &tp, rails ? rails : req->rails, 0);
  char name[96]; /* before the send: one that fails releases the address */
  fab_ep_peer_name(ep, to.peer, name, sizeof(name));
  int rc = fab_ep_ctl_send(ep, &to, &msg, sizeof(msg));
  if (rc != 0) {
    FAB_WARN("%s: could not refuse a connect request from %s: %s; that connect waits out its "
             "FABRIC_CONNECT_TIMEOUT_MS", ep->dev->name, name, fi_strerror(-rc));
  }
}

/* --- connect-request receives ----------------------------------------------- */

/* Malformed control messages: one WARN per FAB_BAD_CTRL_WARN_MS per
 * endpoint, the next one counting those ignored quietly meanwhile, so a
 * flood of garbage cannot flood the log. (Untagged control receives carry no
 * source address, so the limit is the endpoint's, not a peer's.) ep lock. */
enum { FAB_BAD_CTRL_WARN_MS = 1000 };

static void bad_ctrl(fab_endpoint* ep, const char* what, const char* why) {
  int64_t now = fab_now_ms();
  if (ep->bad_ctrl_warned_ms && now - ep->bad_ctrl_warned_ms < FAB_BAD_CTRL_WARN_MS) {
    ep->bad_ctrl_quiet++;
    return;
  }
  if (ep->bad_ctrl_quiet)
    FAB_WARN("ignored a malformed %s on %s: %s (a foreign or corrupted sender); %u more malformed control messages "
             "were ignored in the last %lld ms", what, ep->dev->name, why, ep->bad_ctrl_quiet,
             (long long)(now - ep->bad_ctrl_warned_ms));
  else
    FAB_WARN("ignored a malformed %s on %s: %s (a foreign or corrupted sender)", what, ep->dev->name, why);
  ep->bad_ctrl_warned_ms = now;
  ep->bad_ctrl_quiet = 0;
}

fab_listener* fab_listener_find(fab_endpoint* ep, uint64_t id) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->listens) {
    fab_listener* l = FAB_CONTAINER_OF(it, fab_listener, node);
    if (l->listen_id == id) return l;
  }
  return NULL;
}

static int ctrl_rx_post(fab_ctrl_rx* rx) {
  fab_endpoint* ep = rx->ep;
  return (int)fi_recv(ep->ep, &rx->msg, sizeof(rx->msg), rx->desc, FI_ADDR_UNSPEC, &rx->op.ctx);
}

/* A window offer (fab_pwin.h) for one of ep's comms. One that names no live
 * connection is dropped: the comm closed while the offer was on its way. */
static void window_deliver(fab_endpoint* ep, const void* raw, size_t len) {
  fab_wire_window m;
  char why[160];
  if (fab_wire_window_decode(raw, len, &m, why, sizeof(why)) != 0) {
    bad_ctrl(ep, "window offer", why);
    return;
  }
  fab_comm* c = fab_ep_id_get(ep, m.target_id);
  /* a closed comm still takes delivery probes and answers while it is parked */
  int delivery = m.op == FAB_NOTE_DELIVERY_PROBE || m.op == FAB_NOTE_DELIVERY_ANSWER;
  if (c && !c->closing && c->awaiting_answer && !delivery) {
    fab_pwin_hold(c, &m); /* its connect reads the answer after this poll */
    return;
  }
  if (!c || (c->closing && !delivery) || c->peer_id != m.source_id || c->conn_id != m.conn_id) {
    FAB_INFO(FAB_SUBSYS_NET, "%s: dropped a window offer or notice for connection %u (comm %u), which is not open "
             "here", ep->dev->name, m.conn_id, m.target_id);
    return;
  }
  if (delivery) fab_delivery_note(c, &m);
  else fab_pwin_apply(c, &m);
}

static void ctrl_rx_deliver(fab_endpoint* ep, const fab_wire_connect* raw, size_t len) {
  if (len == 0) return; /* a liveness probe: its delivery is all the sender wanted */
  if (fab_wire_magic(raw, len) == FAB_WINDOW_MAGIC) {
    window_deliver(ep, raw, len);
    return;
  }
  fab_wire_connect m;
  char why[160];
  if (fab_wire_connect_decode(raw, len, &m, why, sizeof(why)) != 0) {
    bad_ctrl(ep, "connect request", why);
    return;
  }
  fab_listener* l = fab_listener_find(ep, m.listen_id);
  fab_conn_request* q = l ? malloc(sizeof(*q)) : NULL;
  if (!q) {
    fab_conn_refuse(ep, &m, FAB_ACCEPT_NO_LISTENER, 0);
    return;
  }
  q->msg = m;
  fab_list_push(&l->queue, &q->node);
}

static void ctrl_rx_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_ctrl_rx* rx = op->owner;
  fab_endpoint* ep = rx->ep;
  if (err && err->err == FI_ECANCELED) return;
  if (done) {
    ctrl_rx_deliver(ep, &rx->msg, done->len);
  } else if (err->err == FI_ETRUNC) {
    char why[64];
    snprintf(why, sizeof(why), "%zu bytes too many", err->olen);
    bad_ctrl(ep, "connect request (oversized)", why);
  }
  int rc = ctrl_rx_post(rx);
  if (rc != 0) {
    FAB_WARN("re-posting a connect-request receive on %s failed: %s; this endpoint accepts fewer connections at "
             "once", ep->dev->name, fi_strerror(-rc));
  }
}

fab_result fab_ctrl_rx_setup(fab_endpoint* ep) {
  if (ep->ctrl_rx) return FAB_OK;
  fab_ctrl_rx* rx = calloc(FAB_CTRL_RX, sizeof(*rx));
  if (!rx) {
    FAB_WARN("out of memory creating an endpoint on %s", ep->dev->name);
    return FAB_ERR_SYSTEM;
  }
  int posted = 0, rc = 0;
  for (int i = 0; i < FAB_CTRL_RX && rc == 0; i++) {
    rx[i].ep = ep;
    fab_op_init(&rx[i].op, ctrl_rx_done, &rx[i], (uint32_t)i);
    rc = fab_ep_ctrl_reg(ep, &rx[i].msg, sizeof(rx[i].msg), &rx[i].mr, &rx[i].desc);
    if (rc == 0) rc = ctrl_rx_post(&rx[i]);
    if (rc == 0) posted++;
  }
  ep->ctrl_rx = rx; /* freed at endpoint teardown, after the endpoint is closed */
  if (posted == 0) {
    FAB_WARN("posting connect-request receives on %s failed: %s", ep->dev->name, fi_strerror(-rc));
    return FAB_ERR_SYSTEM;
  }
  return FAB_OK;
}

void fab_listener_free_locked(fab_listener* l, int refuse) {
  fab_list_del(&l->node);
  for (fab_list* n; (n = fab_list_pop(&l->queue));) {
    fab_conn_request* q = FAB_CONTAINER_OF(n, fab_conn_request, node);
    if (refuse) fab_conn_refuse(l->ep, &q->msg, FAB_ACCEPT_NO_LISTENER, 0);
    free(q);
  }
  if (l->accepting) fab_comm_free(l->accepting); /* nothing of it was posted */
  for (fab_list* n; (n = fab_list_pop(&l->ready));) free(FAB_CONTAINER_OF(n, fab_ready_comm, node)); /* its comm
                                                        * stays listed on the endpoint: finalize closes it */
  l->magic = 0;
  free(l->rail_handles);
  free(l);
}

void fab_listen_teardown(fab_endpoint* ep) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->listens) {
    fab_listener* l = FAB_CONTAINER_OF(it, fab_listener, node);
    fab_obj_remove(l->handle, FAB_OBJ_LISTEN);
    fab_listener_free_locked(l, 0);
  }
  if (ep->ctrl_rx) {
    for (int i = 0; i < FAB_CTRL_RX; i++) fab_ep_ctrl_dereg(ep->ctrl_rx[i].mr);
    free(ep->ctrl_rx);
    ep->ctrl_rx = NULL;
  }
}
