/*
 * Control messages that own themselves: window offers, withdrawals and their
 * answers, truncation notices, delivery probes and their answers, refusals
 * of connect requests. Each is posted at once, or, while the provider
 * cannot take it (-FI_EAGAIN: rxm still setting up its connection to the
 * peer, a full send queue), kept on ep->ctl_owed behind any earlier one to
 * the same peer and posted by the endpoint's sweep. Nothing here drives the
 * endpoint, so any of them may be sent from inside a completion, and no
 * runtime call waits on a peer that is gone. One still refused after
 * FAB_ANSWER_RETRY_MS is given up with one WARN that says what it was and
 * what follows from its loss.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_engine.h"

typedef struct ctl_msg {
  fab_parked park; /* ep->ctl_owed until posted, then ep->parked until its completion */
  fab_op op;
  fab_endpoint* ep;
  struct fid_mr* mr;
  void* desc;
  fab_ctl_dest to;
  int64_t since_ms;
  size_t len;
  _Alignas(8) unsigned char buf[];
} ctl_msg;

static void ctl_msg_destroy(fab_parked* p) {
  ctl_msg* m = FAB_CONTAINER_OF(p, ctl_msg, park);
  fab_ep_ctrl_dereg(m->mr);
  if (m->to.holds_av) fab_ep_av_release(m->ep, m->to.peer);
  free(m);
}

static void ctl_msg_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  (void)done;
  (void)err; /* the peer is gone or closed: its comms learn that on their own */
  ctl_msg* m = op->owner;
  fab_list_del(&m->park.node);
  ctl_msg_destroy(&m->park);
}

/* 0 once posted (then parked until its completion), or the provider's answer. */
static int ctl_msg_post(ctl_msg* m) {
  fab_endpoint* ep = m->ep;
  int rc = m->to.tagged ? (int)fi_tsend(ep->ep, m->buf, m->len, m->desc, m->to.peer, m->to.tag, &m->op.ctx)
                        : (int)fi_send(ep->ep, m->buf, m->len, m->desc, m->to.peer, &m->op.ctx);
  if (rc == 0) fab_ep_park(ep, &m->park);
  return rc;
}

static void ctl_msg_lost(ctl_msg* m, int rc) {
  char name[96], why[64];
  fab_ep_peer_name(m->ep, m->to.peer, name, sizeof(name));
  snprintf(why, sizeof(why), "the provider took no send for %d ms", FAB_ANSWER_RETRY_MS);
  FAB_WARN("%s: %s to %s could not be sent: %s; %s", m->ep->dev->name, m->to.what, name,
           rc == -FI_EAGAIN ? why : fi_strerror(-rc), m->to.then);
  ctl_msg_destroy(&m->park);
}

/* 1 when a message to peer waits on ep->ctl_owed before stop (NULL: anywhere). */
static int owed_before(fab_endpoint* ep, fi_addr_t peer, const fab_list* stop) {
  for (fab_list* it = ep->ctl_owed.next; it != &ep->ctl_owed && it != stop; it = it->next)
    if (FAB_CONTAINER_OF(it, ctl_msg, park.node)->to.peer == peer) return 1;
  return 0;
}

int fab_ep_ctl_retry(fab_endpoint* ep) {
  int gone = 0;
  int64_t now = fab_now_ms();
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->ctl_owed) {
    ctl_msg* m = FAB_CONTAINER_OF(it, ctl_msg, park.node);
    if (owed_before(ep, m->to.peer, it)) continue; /* in order, per peer */
    fab_list* prev = it->prev;
    fab_list_del(it);
    int rc = ctl_msg_post(m);
    if (rc == -FI_EAGAIN && now - m->since_ms < FAB_ANSWER_RETRY_MS) {
      fab_list_push(prev->next, it); /* back in its place */
      continue;
    }
    fab_ep_nclosing_add(ep, -1);
    gone++;
    if (rc != 0) ctl_msg_lost(m, rc);
  }
  return gone;
}

int fab_ep_ctl_send(fab_endpoint* ep, const fab_ctl_dest* to, const void* msg, size_t len) {
  ctl_msg* m = calloc(1, sizeof(*m) + len);
  if (!m) {
    if (to->holds_av) fab_ep_av_release(ep, to->peer);
    return -FI_ENOMEM;
  }
  memcpy(m->buf, msg, len);
  m->len = len;
  m->ep = ep;
  m->to = *to;
  m->since_ms = fab_now_ms();
  m->park.destroy = ctl_msg_destroy;
  fab_list_init(&m->park.node);
  fab_op_init(&m->op, ctl_msg_done, m, 0);
  int rc = fab_ep_ctrl_reg(ep, m->buf, len, &m->mr, &m->desc);
  if (rc == 0) rc = owed_before(ep, to->peer, NULL) ? -FI_EAGAIN : ctl_msg_post(m);
  if (rc == -FI_EAGAIN && !to->once) {
    fab_list_push(&ep->ctl_owed, &m->park.node);
    fab_ep_nclosing_add(ep, 1); /* the sweep runs while one is owed */
    atomic_store_explicit(&ep->sweep_every, FAB_SWEEP_EVERY_MIN, memory_order_relaxed);
    return 0;
  }
  if (rc != 0) ctl_msg_destroy(&m->park);
  return rc;
}

void fab_ep_ctl_drop(fab_endpoint* ep) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->ctl_owed) { /* never posted: nothing of them is in flight */
    fab_list_del(it);
    ctl_msg_destroy(&FAB_CONTAINER_OF(it, ctl_msg, park.node)->park);
  }
}
