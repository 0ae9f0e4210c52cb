/* The connecting side of the handshake. See fab_conn.h for the protocol. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_pwin.h"
#include "fab_transport.h"

static void pending_free(fab_pending* pc) {
  if (pc->comm) fab_comm_free(pc->comm);
  fab_ep_ctrl_dereg(pc->mr);
  free(pc);
}

static void pending_destroy(fab_parked* p) { pending_free(FAB_CONTAINER_OF(p, fab_pending, park)); }

/* A completion of an abandoned connect frees it with the last one. */
static void pending_op_done(fab_pending* pc) {
  pc->inflight--;
  if (pc->inflight == 0 && pc->abandoned) {
    fab_list_del(&pc->park.node);
    pending_free(pc);
  }
}

static void req_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_pending* pc = op->owner;
  pc->req_state = FAB_SUB_DONE;
  if (err) pc->req_err = err->err ? err->err : FI_EIO;
  pending_op_done(pc);
}

static void ans_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_pending* pc = op->owner;
  pc->ans_state = FAB_SUB_DONE;
  if (err) pc->ans_err = err->err ? err->err : FI_EIO;
  else pc->ans_len = done->len;
  pending_op_done(pc);
}

static void retire_locked(fab_pending* pc) {
  if (pc->inflight == 0) {
    pending_free(pc);
    return;
  }
  if (pc->ans_state == FAB_SUB_POSTED) fi_cancel(&pc->ep->ep->fid, &pc->ans_op.ctx);
  if (pc->comm) {
    fab_comm_free(pc->comm);
    pc->comm = NULL;
  }
  /* The last completion frees it; until then it sits on the parked list,
   * which endpoint teardown sweeps. */
  pc->abandoned = 1;
  fab_ep_park(pc->ep, &pc->park);
}

void fab_pending_retire(fab_pending* pc, int ok) {
  fab_list_del(&pc->park.node);
  fab_endpoint* ep = pc->ep;
  if (ep == pc->home) {
    retire_locked(pc);
    return;
  }
  if (!ok) {
    /* The private endpoint served this connect only: closing it stops its
     * operations, and its teardown frees the parked connect. */
    fab_list_del(&ep->private_node);
    pc->home->nprivates--;
    pthread_mutex_lock(&ep->lock);
    fab_ep_park(ep, &pc->park);
    pthread_mutex_unlock(&ep->lock);
    fab_endpoint_destroy(ep);
    return;
  }
  pthread_mutex_lock(&ep->lock);
  retire_locked(pc);
  pthread_mutex_unlock(&ep->lock);
}

int fab_connect_drop_owned(fab_endpoint* home, fab_ctx* owner) {
  int n = 0;
  pthread_mutex_lock(&home->lock);
  FAB_LIST_FOREACH_SAFE(it, tmp, &home->connects) {
    fab_pending* pc = FAB_CONTAINER_OF(it, fab_pending, park.node);
    if (pc->owner != owner) continue;
    fab_pending_retire(pc, 0);
    n++;
  }
  pthread_mutex_unlock(&home->lock);
  return n;
}

static fab_pending* find_pending(fab_endpoint* ep, fab_ctx* owner, const void* handle) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->connects) {
    fab_pending* pc = FAB_CONTAINER_OF(it, fab_pending, park.node);
    if (pc->owner == owner && pc->handle_ptr == handle &&
        !memcmp(pc->handle_copy, handle, fab_wire_handle_used(handle)))
      return pc;
  }
  return NULL;
}

/* Connects NCCL gave up on (never called again) must not pile up. */
static void sweep_expired(fab_endpoint* ep, int64_t now) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->connects) {
    fab_pending* pc = FAB_CONTAINER_OF(it, fab_pending, park.node);
    if (now > pc->deadline_ms + 1000) fab_pending_retire(pc, 0);
  }
}

static uint32_t connector_id_next(fab_endpoint* ep) {
  for (;;) {
    uint32_t id = ep->next_connector_id++;
    if (!id) continue;
    int used = 0;
    FAB_LIST_FOREACH_SAFE(it, tmp, &ep->connects) {
      if (FAB_CONTAINER_OF(it, fab_pending, park.node)->connector_id == id) used = 1;
    }
    if (!used) return id;
  }
}

/* 1 when a send comm on the shared endpoint itself already sends to the
 * endpoint at addr: a live comm, a closed one still parked, or a connect under
 * way. home lock held. */
static int home_sends_to(fab_endpoint* home, const void* addr, size_t len) {
  fi_addr_t fa;
  if (!fab_ep_av_find(home, addr, len, &fa)) return 0;
  fab_list* lists[2] = {&home->comms, &home->parked};
  for (int k = 0; k < 2; k++) {
    FAB_LIST_FOREACH_SAFE(it, tmp, lists[k]) {
      fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
      if (!fab_parked_is_comm(p)) continue;
      fab_comm* c = FAB_CONTAINER_OF(p, fab_comm, park);
      if (c->kind == FAB_OBJ_SEND && c->ep == home && c->peer == fa) return 1;
    }
  }
  FAB_LIST_FOREACH_SAFE(it, tmp, &home->connects) {
    fab_pending* pc = FAB_CONTAINER_OF(it, fab_pending, park.node);
    if (pc->ep == home && pc->comm && pc->comm->peer == fa) return 1;
  }
  return 0;
}

/* Where the connect's operations run: the shared endpoint, or for
 * local-only providers a new endpoint that becomes the send comm's own (see
 * fab_device.c). shm completes an endpoint's sends to one peer in order, so
 * the first send comm to a peer stays on the shared endpoint (no other comm
 * there sends to that peer) and later ones to the same peer get their own.
 * Doing the whole handshake from it lets the listener's provider learn its
 * address before any data flows. */
static fab_result pick_endpoint(fab_endpoint* home, const fab_wire_handle* h, fab_endpoint** out) {
  *out = home;
  if (!home->dev->local_only || home->nprivates >= fab_g.params.local_send_endpoints) return FAB_OK;
  if (!home_sends_to(home, h->addr, h->addr_len) && !home->hol_blocked) return FAB_OK;
  fab_result rc = fab_conn_endpoint_create(home->dev, out);
  if (rc != FAB_OK) return rc;
  fab_list_push(&home->privates, &(*out)->private_node);
  if (++home->nprivates == fab_g.params.local_send_endpoints)
    FAB_INFO(FAB_SUBSYS_NET, "%d send comms on %s have endpoints of their own; later ones share the device's "
             "(FABRIC_LOCAL_SEND_ENDPOINTS)", home->nprivates, home->dev->name);
  return FAB_OK;
}

/* FAB_OK when the listener's address is well-formed and, on this host, its
 * process and endpoint still exist; else the error, with one WARN. */
static fab_result peer_usable(fab_endpoint* ep, const fab_wire_handle* h) {
  char why[192];
  if (fab_ep_addr_check(ep, h->addr, h->addr_len, why, sizeof(why)) != 0) {
    FAB_WARN("connect: the listener's address in the handle is not a %s address (%s); pass the handle listen() "
             "wrote, unchanged", fab_device_provider(ep->dev), why);
    return FAB_ERR_INVALID_USAGE;
  }
  if (fab_peer_local_gone(ep, h->addr, h->addr_len, why, sizeof(why))) {
    FAB_WARN("connect: the listener is gone: %s; the peer process must stay alive until its connections are "
             "established", why);
    return FAB_ERR_REMOTE;
  }
  return FAB_OK;
}

static fab_result start(fab_endpoint* home, fab_device* d, fab_ctx* owner, const fab_comm_config* config,
                        const void* handle, int rails, int rail, fab_pending** out) {
  fab_wire_handle h;
  char why[160];
  if (fab_wire_handle_decode(handle, &h, why, sizeof(why)) != 0) {
    FAB_WARN("connect: invalid handle: %s. Pass the bytes listen() wrote, unchanged", why);
    return FAB_ERR_INVALID_USAGE;
  }
  if (h.prov_hash != home->dev->prov_hash) {
    FAB_WARN("connect: the handle comes from a listener on another provider than %s; both ranks must use the "
             "same provider (FABRIC_PROVIDER / FI_PROVIDER)", fab_device_provider(home->dev));
    return FAB_ERR_INVALID_USAGE;
  }
  fab_pending* pc = calloc(1, sizeof(*pc));
  if (!pc) {
    FAB_WARN("connect: out of memory");
    return FAB_ERR_SYSTEM;
  }
  pc->home = home;
  pc->owner = owner;
  pc->rails = rails;
  pc->rail = rail;
  pc->park.destroy = pending_destroy;
  fab_list_init(&pc->park.node);
  fab_result rc = pick_endpoint(home, &h, &pc->ep);
  if (rc != FAB_OK) {
    free(pc);
    return rc;
  }
  fab_endpoint* ep = pc->ep;
  pc->handle_ptr = handle;
  memcpy(pc->handle_copy, handle, fab_wire_handle_used(handle));
  pc->listen_id = h.listen_id;
  memcpy(pc->peer_addr, h.addr, h.addr_len);
  pc->peer_addr_len = h.addr_len;
  fab_list_push(&home->connects, &pc->park.node); /* from here on, retire cleans up */
  pc->comm = fab_comm_alloc(ep, d, FAB_OBJ_SEND, owner, config);
  if (!pc->comm) {
    fab_pending_retire(pc, 0);
    return FAB_ERR_SYSTEM;
  }
  fab_comm* c = pc->comm;
  c->awaiting_answer = 1;
  rc = peer_usable(ep, &h);
  if (rc != FAB_OK) {
    fab_pending_retire(pc, 0);
    return rc;
  }
  c->peer_in_process = fab_ep_addr_in_process(ep, h.addr, h.addr_len);
  int frc = fab_ep_av_insert(ep, h.addr, h.addr_len, &c->peer);
  if (frc != 0) {
    FAB_WARN("connect: the listener's address in the handle is unusable on %s: %s", ep->dev->name,
             fi_strerror(-frc));
    fab_pending_retire(pc, 0);
    return FAB_ERR_INVALID_USAGE;
  }
  if (fab_ep_ctrl_reg(ep, &pc->msg, sizeof(pc->msg), &pc->mr, &pc->desc) != 0) {
    FAB_WARN("connect: registering the handshake buffers on %s failed", ep->dev->name);
    fab_pending_retire(pc, 0);
    return FAB_ERR_SYSTEM;
  }
  fab_ep_peer_name(ep, c->peer, c->peer_name, sizeof(c->peer_name));
  pc->connector_id = connector_id_next(home);
  fab_op_init(&pc->req_op, req_done, pc, 0);
  fab_op_init(&pc->ans_op, ans_done, pc, 1);
  fab_wire_tp tp = {.comm_id = c->local_id, .transport = c->ops->id};
  if (c->ops->connect_payload) tp.len = (uint8_t)c->ops->connect_payload(c, tp.data, sizeof(tp.data));
  size_t stripe_from = fab_g.params.stripe_threshold; /* values under FAB_STRIPE_MIN count as it (params.toml) */
  c->stripe_from = rails > 1 && stripe_from ? (uint32_t)(stripe_from < FAB_STRIPE_MIN ? FAB_STRIPE_MIN : stripe_from) : 0;
  fab_wire_connect_encode(&pc->msg.req, h.listen_id, pc->connector_id, ep->addr, ep->addr_len, &tp, rails, rail,
                          c->stripe_from);
  pc->deadline_ms = fab_now_ms() + fab_g.params.connect_timeout_ms;
  *out = pc;
  return FAB_OK;
}

/* Posts what is not posted yet. Returns FAB_OK or an error (WARNed). */
static fab_result post(fab_pending* pc) {
  fab_endpoint* ep = pc->ep;
  const fab_tag_layout* t = &ep->dev->tags;
  ssize_t rc = 0;
  if (pc->ans_state == FAB_SUB_IDLE) {
    rc = fi_trecv(ep->ep, &pc->msg.ans, sizeof(pc->msg.ans_rails), pc->desc, FI_ADDR_UNSPEC,
                  fab_tag_accept(t, pc->connector_id), 0, &pc->ans_op.ctx);
    if (rc == 0) {
      pc->ans_state = FAB_SUB_POSTED;
      pc->inflight++;
    }
  }
  if (rc == 0 && pc->req_state == FAB_SUB_IDLE) {
    rc = fi_send(ep->ep, &pc->msg.req, sizeof(pc->msg.req), pc->desc, pc->comm->peer, &pc->req_op.ctx);
    if (rc == 0) {
      pc->req_state = FAB_SUB_POSTED;
      pc->inflight++;
    }
  }
  if (rc == 0 || rc == -FI_EAGAIN) return FAB_OK;
  FAB_WARN("connect to %s: posting the handshake failed: %s", pc->comm->peer_name, fi_strerror((int)-rc));
  return FAB_ERR_SYSTEM;
}

/* Rail 0 of several: the listener's handles of the other rails, which came
 * after its answer, go with the send comm (fab_comm.rail_handles). */
static fab_result keep_rail_handles(fab_pending* pc, const fab_wire_accept* a) {
  if (a->rail != 0 || a->rails < 2) return FAB_OK;
  size_t len = (size_t)(a->rails - 1) * FAB_HANDLE_SIZE;
  pc->comm->rail_handles = malloc(len);
  if (!pc->comm->rail_handles) {
    FAB_WARN("connect to %s: out of memory", pc->comm->peer_name);
    return FAB_ERR_SYSTEM;
  }
  memcpy(pc->comm->rail_handles, pc->msg.ans_rails + sizeof(fab_wire_accept), len);
  return FAB_OK;
}

/* Looks at the answer. FAB_OK with *done set when the comm is ready. */
static fab_result check_answer(fab_pending* pc, int* done) {
  fab_comm* c = pc->comm;
  fab_wire_accept a;
  char why[160];
  *done = 0;
  if (pc->req_err) {
    FAB_WARN("connect to %s: sending the request failed: %s; is the listening process alive?", c->peer_name,
             fi_strerror(pc->req_err));
    return fab_result_from_fi(pc->req_err);
  }
  if (pc->ans_state != FAB_SUB_DONE) return FAB_OK;
  if (pc->ans_err) {
    FAB_WARN("connect to %s: receiving the answer failed: %s", c->peer_name, fi_strerror(pc->ans_err));
    return fab_result_from_fi(pc->ans_err);
  }
  if (fab_wire_accept_decode(&pc->msg.ans, pc->ans_len, &a, why, sizeof(why)) != 0 ||
      a.listen_id != pc->listen_id || a.connector_id != pc->connector_id) {
    FAB_WARN("connect to %s: invalid answer: %s", c->peer_name, a.listen_id != pc->listen_id ? "wrong listen id" : why);
    return FAB_ERR_REMOTE;
  }
  if (a.status == FAB_ACCEPT_RAILS) {
    FAB_WARN("connect to %s refused: the listener, whose device has %u rails, did not take rail %d of %d (rail 0 on "
             "%s); builds before rail counts were agreed at connect need the same count on both ends: run one build "
             "on every rank", c->peer_name, a.rails, pc->rail, pc->rails, c->dev->name);
    return FAB_ERR_INVALID_USAGE;
  }
  if (a.status == FAB_ACCEPT_TRANSPORT) {
    const fab_transport_ops* theirs = fab_transport_by_id(a.tp.transport);
    FAB_WARN("connect to %s refused: this rank runs transport %s, the listener %s; set the same FABRIC_TRANSPORT on "
             "every rank", c->peer_name, c->ops->name, theirs ? theirs->name : "unknown to this build");
    return FAB_ERR_INVALID_USAGE;
  }
  if (a.status != FAB_ACCEPT_OK) {
    FAB_WARN("connect to %s refused: %s", c->peer_name, fab_wire_status_str(a.status));
    return FAB_ERR_REMOTE;
  }
  if (a.tp.transport != c->ops->id) {
    FAB_WARN("connect to %s: the answer names transport %u, this rank runs %s", c->peer_name, a.tp.transport,
             c->ops->name);
    return FAB_ERR_REMOTE;
  }
  /* rail 0 offered pc->rails and the listener may agree on fewer (its own count); the other rails were told */
  if (a.rail != pc->rail || a.rails > pc->rails || (pc->rail > 0 && a.rails != pc->rails)) {
    FAB_WARN("connect to %s: the answer is for rail %u of %u, this was rail %d of %d", c->peer_name, a.rail, a.rails,
             pc->rail, pc->rails);
    return FAB_ERR_REMOTE;
  }
  c->rails = a.rails;
  if (a.rails < 2) c->stripe_from = 0;
  if (keep_rail_handles(pc, &a) != FAB_OK) return FAB_ERR_SYSTEM;
  c->peer_id = a.tp.comm_id;
  if (c->ops->connected) {
    fab_result trc = c->ops->connected(c, a.tp.data, a.tp.len); /* WARNs */
    if (trc != FAB_OK) return trc;
  }
  if (a.conn_id > pc->ep->dev->tags.conn_max) {
    FAB_WARN("connect to %s: connection id %u exceeds this provider's tag space", c->peer_name, a.conn_id);
    return FAB_ERR_REMOTE;
  }
  c->conn_id = a.conn_id;
  c->tag_base = fab_tag_data(a.conn_id, 0);
  c->awaiting_answer = 0;
  fab_pwin_release_held(c); /* window messages that came with the answer */
  *done = 1;
  return FAB_OK;
}

/* Hands the finished comm to the runtime. */
static fab_result finish(fab_pending* pc, void** send_comm) {
  fab_comm* c = pc->comm;
  c->handle = fab_obj_add(FAB_OBJ_SEND, c);
  if (!c->handle) {
    FAB_WARN("connect: handle table full; close unused comms");
    return FAB_ERR_SYSTEM;
  }
  if (pc->ep != pc->home) c->home = pc->home; /* the comm owns its endpoint now */
  pc->comm = NULL;
  fab_list_push(&c->ep->comms, &c->park.node);
  FAB_INFO(FAB_SUBSYS_NET, "connected to %s on %s as connection %u", c->peer_name, c->dev->name, c->conn_id);
  *send_comm = c->handle;
  return FAB_OK;
}

fab_result fab_conn_connect(fab_ctx* ctx_handle, int dev, const fab_comm_config* config, void* handle, int rails,
                            int rail, void** send_comm) {
  if (!send_comm) return fab_bad_argument("connect", "sendComm", 0, "a non-NULL pointer");
  *send_comm = NULL;
  if (!handle) return fab_bad_argument("connect", "handle", 0, "a non-NULL 128-byte handle");
  fab_ctx* ctx;
  fab_device* d;
  fab_endpoint* home;
  fab_result rc = fab_ctx_endpoint(ctx_handle, dev, "connect", &ctx, &d, &home);
  if (rc != FAB_OK) return rc;
  pthread_mutex_lock(&home->lock);
  int64_t now = fab_now_ms();
  sweep_expired(home, now);
  fab_pending* pc = find_pending(home, ctx, handle);
  if (!pc) rc = start(home, d, ctx, config, handle, rails, rail, &pc);
  int done = 0;
  if (rc == FAB_OK) {
    fab_endpoint* ep = pc->ep; /* lock order: home, then the private endpoint */
    if (ep != home) pthread_mutex_lock(&ep->lock);
    rc = post(pc);
    if (rc == FAB_OK) rc = fab_ep_progress_locked(ep);
    if (rc == FAB_OK) rc = check_answer(pc, &done);
    if (rc == FAB_OK && done) rc = finish(pc, send_comm);
    if (rc == FAB_OK && !done && now > pc->deadline_ms) {
      FAB_WARN("connect to %s timed out after %d ms without an answer; check that the peer is alive and calls "
               "accept, or raise FABRIC_CONNECT_TIMEOUT_MS", pc->comm->peer_name, fab_g.params.connect_timeout_ms);
      rc = FAB_ERR_SYSTEM;
    }
    if (ep != home) pthread_mutex_unlock(&ep->lock);
    if (done || rc != FAB_OK) fab_pending_retire(pc, rc == FAB_OK);
  }
  pthread_mutex_unlock(&home->lock);
  return rc;
}

fab_result fab_connect_one_rail(fab_ctx* ctx_handle, int dev, const fab_comm_config* config, void* handle,
                                void** send_comm, void** dev_handle) {
  (void)dev_handle;
  if (send_comm) *send_comm = NULL;
  int idx = fab_device_first_rail(dev, "connect");
  if (idx < 0) return FAB_ERR_INTERNAL;
  return fab_conn_connect(ctx_handle, idx, config, handle, 1, 0, send_comm);
}

fab_result fab_connect_wait(fab_ctx* ctx_handle, int dev, const fab_comm_config* config, void* handle,
                            void** send_comm, void** dev_handle) {
  for (;;) {
    fab_result rc = fab_connect_one_rail(ctx_handle, dev, config, handle, send_comm, dev_handle);
    if (rc != FAB_OK || *send_comm) return rc; /* fab_connect gives up after FABRIC_CONNECT_TIMEOUT_MS */
    for (int i = 0; i < FAB_MAX_DEVICES; i++) { /* the peer may be blocked in its own connect to us */
      fab_endpoint* ep = atomic_load(&fab_g.eps[i]);
      if (!ep) continue;
      pthread_mutex_lock(&ep->lock);
      fab_ep_progress_locked(ep);
      fab_listen_answer_early(ep);
      pthread_mutex_unlock(&ep->lock);
    }
    sched_yield();
  }
}
