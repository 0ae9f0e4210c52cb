/*
 * Proof of delivery for closed send comms over kernel sockets.
 *
 * Over tcp (fab_device.one_stream) a send completes once its bytes are in our
 * socket. A process that then closes its endpoint with bytes from the peer
 * still unread resets the connection, and the peer loses whatever it had not
 * read yet. So a closed send comm whose transport cannot tell that its last
 * messages were taken (fab_transport_ops.unproven) stays parked on its
 * endpoint and asks its peer's recv comm for proof: a delivery probe, an
 * untagged control message that follows every earlier message on the
 * connection. The peer's engine answers it as soon as it reads it, so the
 * answer proves that everything sent before the probe is in the peer's
 * process. A recv comm that closes says so the same way (an answer for
 * everything, FAB_DELIVERY_CLOSED): what it did not take is not wanted. The
 * comm is freed when the answer (or the transport's own proof, credits
 * given back) comes, when its connection fails, or after
 * FABRIC_PEER_TIMEOUT_MS; endpoint teardown waits for it with the other
 * closed comms (FAB_CLOSE_DRAIN_MS in all) and says in one WARN what was
 * still unproven when it closed the endpoint.
 */
#include <stdio.h>

#include "fab_engine.h"
#include "fab_req.h"
#include "fab_transport.h"

/* What c sent so far while some of it is unproven; 0 when all is proven. */
static uint64_t unproven_sent(fab_comm* c) {
  if (c->kind != FAB_OBJ_SEND || !c->ops->unproven || c->error != FAB_OK) return 0;
  uint64_t sent = c->ops->unproven(c);
  return sent > c->proof_got ? sent : 0;
}

/* Sends c's peer a delivery note (op, count) that owns itself: 0, or a
 * negative fi errno when nothing went (-FI_EAGAIN: the provider would not
 * take it now). Posted now or not at all: over tcp a busy send to a peer
 * means its connection is being set up again, so the peer is likely gone,
 * and keeping the note would keep the provider reconnecting to it. Never
 * drives the endpoint. */
static int send_note(fab_comm* c, uint16_t op, uint64_t count) {
  fab_wire_window m;
  fab_wire_window_encode(&m, op, c->peer_id, c->local_id, c->conn_id, count, 0, 0, 0, 0);
  fab_ctl_dest to = {.peer = c->peer, .once = 1}; /* never kept, so never given up with a WARN naming it */
  return fab_ep_ctl_send(c->ep, &to, &m, sizeof(m));
}

int fab_delivery_pending(fab_comm* c) {
  uint64_t sent = unproven_sent(c);
  if (!sent) return 0;
  int64_t now = fab_now_ms();
  if (!c->proof_since_ms) c->proof_since_ms = now;
  if (c->proof_asked >= sent || now < c->proof_retry_ms) return 1;
  int rc = send_note(c, FAB_NOTE_DELIVERY_PROBE, sent);
  if (rc == -FI_EAGAIN) { /* asked again a little later, not at every sweep */
    c->proof_retry_ms = now + FAB_PROOF_RETRY_MS;
    return 1;
  }
  if (rc != 0) { /* nothing went: nothing can prove them */
    FAB_WARN("%s: could not ask %s to confirm this connection's last messages: %s; closing the endpoint before the "
             "peer reads them may lose them", c->ep->dev->name, c->peer_name, fi_strerror(-rc));
    c->proof_got = sent;
    return 0;
  }
  c->proof_asked = sent;
  return 1;
}

int fab_delivery_awaited(fab_comm* c) { return unproven_sent(c) != 0; }

int fab_delivery_given_up(fab_comm* c, int64_t now) {
  int limit = fab_g.params.peer_timeout_ms;
  if (!c->proof_since_ms || limit == 0 || now - c->proof_since_ms <= limit) return 0;
  FAB_INFO(FAB_SUBSYS_NET, "%s: %s did not confirm a closed connection's last messages within %d ms "
           "(FABRIC_PEER_TIMEOUT_MS); no longer waiting for it", c->ep->dev->name, c->peer_name, limit);
  return 1;
}

static void answer(fab_comm* c, uint64_t sent) {
  int rc = send_note(c, FAB_NOTE_DELIVERY_ANSWER, sent);
  if (rc != 0)
    FAB_INFO(FAB_SUBSYS_NET, "answering %s's delivery probe failed: %s", c->peer_name, fi_strerror(-rc));
}

/* Also after the comm failed because the ranks disagree on sizes: that peer
 * is still there, waiting. Not after another failure: the peer is gone, or
 * broke the protocol. */
void fab_delivery_tell_closed(fab_comm* c) {
  if (c->kind != FAB_OBJ_RECV || !c->ops->unproven || !c->ep->dev->one_stream) return;
  if (c->error != FAB_OK && c->error != FAB_ERR_INVALID_USAGE) return;
  answer(c, FAB_DELIVERY_CLOSED);
}

void fab_delivery_note(fab_comm* c, const fab_wire_window* m) {
  if (m->op == FAB_NOTE_DELIVERY_PROBE) {
    if (c->kind == FAB_OBJ_RECV) answer(c, m->id); /* read after every earlier byte of the connection */
    return;
  }
  if (c->kind == FAB_OBJ_SEND && m->id == FAB_DELIVERY_CLOSED) { /* nothing more will be taken: nothing to prove */
    c->proof_got = FAB_DELIVERY_CLOSED;
    return;
  }
  if (c->kind != FAB_OBJ_SEND || m->id > c->proof_asked) { /* no probe of ours asked that much */
    FAB_INFO(FAB_SUBSYS_NET, "%s: ignored an answer to a delivery probe from %s that no probe asked",
             c->ep->dev->name, c->peer_name);
    return;
  }
  if (m->id > c->proof_got) c->proof_got = m->id;
}
