/* The listening side of the handshake: listen, accept, closeListen. Connect
 * requests reach a listener's queue through fab_ctrl.c. See fab_conn.h for
 * the protocol. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_transport.h"

/* --- listen ----------------------------------------------------------------- */

/* A listener whose handle must fit in cap bytes, for rail `rail` of `rails`. */
static fab_result listen_in(fab_ctx* ctx_handle, int dev, void* handle, size_t cap, int rails, int rail,
                           const void* rail_handles, void** listen_comm) {
  if (!listen_comm) return fab_bad_argument("listen", "listenComm", 0, "a non-NULL pointer");
  *listen_comm = NULL;
  if (!handle) return fab_bad_argument("listen", "handle", 0, "a non-NULL handle buffer");
  fab_ctx* ctx;
  fab_device* d;
  fab_endpoint* ep;
  fab_result rc = fab_ctx_endpoint(ctx_handle, dev, "listen", &ctx, &d, &ep);
  if (rc != FAB_OK) return rc;
  if (FAB_HANDLE_HEADER + ep->addr_len > cap) {
    FAB_WARN("listen: the endpoint address on %s (%zu bytes, provider %s) does not fit a %zu-byte handle; use a "
             "table version with 128-byte handles", d->name, ep->addr_len, fab_device_provider(ep->dev), cap);
    return FAB_ERR_INVALID_USAGE;
  }
  fab_listener* l = calloc(1, sizeof(*l));
  if (!l) {
    FAB_WARN("listen: out of memory");
    return FAB_ERR_SYSTEM;
  }
  l->magic = FAB_LISTEN_MAGIC;
  l->rails = rails;
  l->rail = rail;
  if (rail == 0 && rails > 1) {
    l->rail_handles = malloc((size_t)(rails - 1) * FAB_HANDLE_SIZE);
    if (!l->rail_handles) {
      free(l);
      FAB_WARN("listen: out of memory");
      return FAB_ERR_SYSTEM;
    }
    memcpy(l->rail_handles, rail_handles, (size_t)(rails - 1) * FAB_HANDLE_SIZE);
  }
  l->ep = ep;
  l->dev = d;
  l->owner = ctx;
  fab_list_init(&l->queue);
  fab_list_init(&l->ready);
  pthread_mutex_lock(&ep->lock);
  do l->listen_id = fab_random64();
  while (fab_listener_find(ep, l->listen_id));
  l->handle = fab_obj_add(FAB_OBJ_LISTEN, l);
  if (!l->handle) {
    FAB_WARN("listen: handle table full; close unused comms");
    rc = FAB_ERR_SYSTEM;
  }
  if (rc == FAB_OK) fab_list_push(&ep->listens, &l->node);
  pthread_mutex_unlock(&ep->lock);
  if (rc != FAB_OK) {
    free(l->rail_handles);
    free(l);
    return rc;
  }
  fab_wire_handle_encode(handle, cap, l->listen_id, ep->dev->prov_hash, ep->addr, ep->addr_len);
  *listen_comm = l->handle;
  return FAB_OK;
}

fab_result fab_conn_listen(fab_ctx* ctx_handle, int dev, void* handle, int rails, int rail, const void* rail_handles,
                           void** listen_comm) {
  return listen_in(ctx_handle, dev, handle, FAB_HANDLE_SIZE, rails, rail, rail_handles, listen_comm);
}

static fab_result listen_first_rail(fab_ctx* ctx_handle, int dev, void* handle, size_t size, void** listen_comm) {
  if (listen_comm) *listen_comm = NULL;
  int idx = fab_device_first_rail(dev, "listen");
  if (idx < 0) return FAB_ERR_INTERNAL;
  return listen_in(ctx_handle, idx, handle, size, 1, 0, NULL, listen_comm);
}

fab_result fab_listen_short(fab_ctx* ctx_handle, int dev, void* handle, void** listen_comm) {
  return listen_first_rail(ctx_handle, dev, handle, FAB_HANDLE_SIZE_V4, listen_comm);
}

fab_result fab_listen_one_rail(fab_ctx* ctx_handle, int dev, void* handle, void** listen_comm) {
  return listen_first_rail(ctx_handle, dev, handle, FAB_HANDLE_SIZE, listen_comm);
}

/* --- accept ----------------------------------------------------------------- */

static void answer_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_comm* c = op->owner;
  if (err && err->err != FI_ECANCELED && !c->closing) {
    char why[160];
    snprintf(why, sizeof(why), "the answer to its connect request was not delivered (%s)", fi_strerror(err->err));
    fab_comm_fail(c, fab_result_from_fi(err->err), why);
  }
  fab_comm_op_done(c);
}

/* The rails a connection runs over: rail 0's request offers the connector's
 * count, and the smaller of the two ends' counts holds (the answer says it,
 * so ranks whose devices differ, FABRIC_NIC_RAILS or NCCL's fused NICs, run
 * over the rails both have); the other rails' requests name that count. 0:
 * a request this listen comm cannot take. */
static int rails_agreed(const fab_listener* l, const fab_wire_connect* req) {
  if (req->rail != l->rail) return 0;
  if (l->rail == 0) return req->rails < l->rails ? req->rails : l->rails;
  return req->rails <= l->rails && req->rail < req->rails ? req->rails : 0;
}

/* Creates the recv comm for a queued request; NULL after refusing it. */
static fab_comm* accept_start(fab_listener* l, const fab_wire_connect* req) {
  fab_endpoint* ep = l->ep;
  if (req->tp.transport != ep->dev->ops->id) {
    const fab_transport_ops* theirs = fab_transport_by_id(req->tp.transport);
    FAB_WARN("accept: refused a connection running transport %s: this rank runs %s; set the same FABRIC_TRANSPORT "
             "on every rank", theirs ? theirs->name : "unknown to this build", ep->dev->ops->name);
    fab_conn_refuse(ep, req, FAB_ACCEPT_TRANSPORT, 0);
    return NULL;
  }
  int rails = rails_agreed(l, req);
  if (!rails) {
    FAB_WARN("accept on %s: refused a connection for rail %u of %u: this listen comm is rail %d of %d; a comm over "
             "several rails connects rail 0 first and the others with the count rail 0 agreed",
             l->dev->name, req->rail, req->rails, l->rail, l->rails);
    fab_conn_refuse(ep, req, FAB_ACCEPT_RAILS, l->rails);
    return NULL;
  }
  fab_comm* c = fab_comm_alloc(ep, l->dev, FAB_OBJ_RECV, l->owner, NULL);
  if (!c) {
    fab_conn_refuse(ep, req, FAB_ACCEPT_BAD_ADDRESS, 0);
    return NULL;
  }
  c->rails = (uint8_t)rails;
  c->stripe_from = rails > 1 ? req->stripe_from : 0;
  c->peer_in_process = fab_ep_addr_in_process(ep, req->addr, req->addr_len);
  int rc = fab_ep_av_insert(ep, req->addr, req->addr_len, &c->peer);
  if (rc == -FI_ECONNREFUSED || rc == -FI_EINVAL) {
    FAB_INFO(FAB_SUBSYS_NET, "accept on %s: dropped a connect request whose sender is gone or malformed",
             ep->dev->name);
    fab_comm_free(c);
    return NULL;
  }
  if (rc != 0) {
    FAB_WARN("accept: cannot add the connector's address on %s (%s), so it cannot be answered and fails after "
             "FABRIC_CONNECT_TIMEOUT_MS; on shm an endpoint maps at most 256 peers (lower "
             "FABRIC_LOCAL_SEND_ENDPOINTS)", ep->dev->name, fi_strerror(-rc));
    fab_comm_free(c);
    return NULL;
  }
  fab_ep_peer_name(ep, c->peer, c->peer_name, sizeof(c->peer_name));
  c->conn_id = c->local_id;
  c->peer_id = req->tp.comm_id;
  c->tag_base = fab_tag_data(c->conn_id, 0);
  fab_wire_tp tp = {.comm_id = c->local_id, .transport = c->ops->id};
  if (c->ops->accept_payload) {
    size_t len = 0;
    if (c->ops->accept_payload(c, req->tp.data, req->tp.len, tp.data, sizeof(tp.data), &len) != FAB_OK) {
      fab_conn_refuse(ep, req, FAB_ACCEPT_BAD_PAYLOAD, 0); /* accept_payload WARNed */
      fab_comm_free(c);
      return NULL;
    }
    tp.len = (uint8_t)len;
  }
  fab_op_init(&c->answer_op, answer_done, c, 0);
  fab_wire_accept_encode(&c->answer, FAB_ACCEPT_OK, req->listen_id, req->connector_id, c->conn_id, &tp, rails,
                         l->rail);
  if (l->rail_handles && rails > 1) {
    c->answer_rails = malloc(fab_wire_accept_len(&c->answer));
    if (!c->answer_rails) {
      FAB_WARN("accept on %s: out of memory", l->dev->name);
      fab_conn_refuse(ep, req, FAB_ACCEPT_BAD_ADDRESS, 0);
      fab_comm_free(c);
      return NULL;
    }
    memcpy(c->answer_rails, &c->answer, sizeof(c->answer));
    memcpy(c->answer_rails + sizeof(c->answer), l->rail_handles, (size_t)(rails - 1) * FAB_HANDLE_SIZE);
  }
  l->accepting_connector = req->connector_id;
  return c;
}

/* Posts the answer; 1 when posted, 0 to retry later, -1 on failure. */
static int accept_answer(fab_listener* l) {
  fab_comm* c = l->accepting;
  fab_endpoint* ep = l->ep;
  void* desc = NULL;
  void* buf = c->answer_rails ? (void*)c->answer_rails : (void*)&c->answer;
  size_t len = fab_wire_accept_len(&c->answer);
  if (!c->answer_mr && fab_ep_ctrl_reg(ep, buf, len, &c->answer_mr, &desc) != 0) {
    FAB_WARN("accept: registering the answer buffer on %s failed", ep->dev->name);
    return -1;
  }
  if (c->answer_mr) desc = fi_mr_desc(c->answer_mr);
  atomic_fetch_add(&c->inflight, 1);
  ssize_t rc = fi_tsend(ep->ep, buf, len, desc, c->peer,
                        fab_tag_accept(&ep->dev->tags, l->accepting_connector), &c->answer_op.ctx);
  if (rc == 0) return 1;
  atomic_fetch_sub(&c->inflight, 1);
  if (rc == -FI_EAGAIN) return 0;
  FAB_WARN("accept: sending the answer to %s failed: %s", c->peer_name, fi_strerror((int)-rc));
  return -1;
}

/* A request whose answer could not even be posted for FAB_ANSWER_RETRY_MS
 * (the provider keeps failing to reach the connector's address: the
 * connector is gone, or the request was forged) is given up, so that the
 * requests behind it are answered before their connectors time out. 1 when
 * it was. ep lock held. */
static int give_up_answer(fab_listener* l) {
  int64_t waited = fab_now_ms() - l->accepting_since_ms;
  if (waited < FAB_ANSWER_RETRY_MS) return 0;
  fab_comm* c = l->accepting;
  FAB_WARN("accept on %s: gave up the connect request from %s: its answer could not be sent for %lld ms (the "
           "address is unreachable, the connector is gone, or the request was forged); answering the next request",
           l->dev->name, c->peer_name, (long long)waited);
  l->accepting = NULL;
  c->closing = 1;
  if (!fab_comm_busy(c)) fab_comm_free(c);
  else fab_comm_park_closed(l->ep, c);
  return 1;
}

/* Answers l's oldest queued request: the new recv comm, live and listed on
 * ep; NULL when none is queued, its answer must wait, or it failed (*rc).
 * ep lock held. */
static fab_comm* answer_next(fab_listener* l, fab_result* rc) {
  fab_endpoint* ep = l->ep;
  int posted = 0;
  while (!posted) {
    if (!l->accepting) {
      fab_list* n = fab_list_pop(&l->queue);
      if (!n) return NULL;
      fab_conn_request* q = FAB_CONTAINER_OF(n, fab_conn_request, node);
      l->accepting = accept_start(l, &q->msg);
      l->accepting_since_ms = fab_now_ms();
      free(q);
      if (!l->accepting) continue; /* refused or dropped: the next one */
    }
    posted = accept_answer(l);
    if (posted == 0 && !give_up_answer(l)) return NULL; /* retried at the next accept or progress */
  }
  fab_comm* c = l->accepting;
  l->accepting = NULL;
  if (posted > 0) c->handle = fab_obj_add(FAB_OBJ_RECV, c);
  if (posted > 0 && c->handle) {
    fab_list_push(&ep->comms, &c->park.node);
    FAB_INFO(FAB_SUBSYS_NET, "accepted %s on %s as connection %u", c->peer_name, l->dev->name, c->conn_id);
    return c;
  }
  if (posted > 0) FAB_WARN("accept: handle table full; close unused comms");
  c->closing = 1;
  if (!fab_comm_busy(c)) fab_comm_free(c);
  else fab_comm_park_closed(ep, c);
  *rc = FAB_ERR_SYSTEM;
  return NULL;
}

void fab_listen_answer_early(fab_endpoint* ep) {
  fab_result rc = FAB_OK;
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->listens) {
    fab_listener* l = FAB_CONTAINER_OF(it, fab_listener, node);
    fab_comm* c;
    while ((c = answer_next(l, &rc))) {
      fab_ready_comm* r = malloc(sizeof(*r));
      if (!r) { /* keep it listed: finalize closes it */
        FAB_WARN("accept: out of memory keeping a connection answered ahead of accept");
        break;
      }
      r->comm = c;
      fab_list_push(&l->ready, &r->node);
    }
  }
}

fab_result fab_conn_accept(void* listen_comm, void** recv_comm) {
  if (!recv_comm) return fab_bad_argument("accept", "recvComm", 0, "a non-NULL pointer");
  *recv_comm = NULL;
  fab_listener* l = fab_obj_get(listen_comm, FAB_OBJ_LISTEN);
  if (!l) {
    fab_obj_kind k = fab_obj_kind_of(listen_comm);
    FAB_WARN("accept: %p is %s, not a live listen comm", listen_comm, k ? fab_obj_kind_name(k) : "unknown or closed");
    return FAB_ERR_INTERNAL;
  }
  fab_endpoint* ep = l->ep;
  fab_result rc = FAB_OK;
  pthread_mutex_lock(&ep->lock);
  fab_ep_progress_locked(ep);
  fab_list* n = fab_list_pop(&l->ready); /* answered early, oldest first */
  fab_comm* c = NULL;
  if (n) {
    fab_ready_comm* r = FAB_CONTAINER_OF(n, fab_ready_comm, node);
    c = r->comm;
    free(r);
  } else {
    c = answer_next(l, &rc);
  }
  if (c) *recv_comm = c->handle;
  pthread_mutex_unlock(&ep->lock);
  return rc;
}

/* --- close ------------------------------------------------------------------ */

fab_result fab_conn_close_listen(void* listen_comm) {
  fab_listener* l = fab_obj_remove(listen_comm, FAB_OBJ_LISTEN);
  if (!l) {
    fab_obj_kind k = fab_obj_kind_of(listen_comm);
    FAB_WARN("closeListen: %p is %s, not a live listen comm", listen_comm,
             k ? fab_obj_kind_name(k) : "unknown or already closed");
    return FAB_ERR_INTERNAL;
  }
  fab_endpoint* ep = l->ep;
  pthread_mutex_lock(&ep->lock);
  fab_list early; /* answered early, never accepted: closed once the lock is let go */
  fab_list_init(&early);
  for (fab_list* n; (n = fab_list_pop(&l->ready));) fab_list_push(&early, n);
  fab_listener_free_locked(l, 1);
  pthread_mutex_unlock(&ep->lock);
  for (fab_list* n; (n = fab_list_pop(&early));) {
    fab_ready_comm* r = FAB_CONTAINER_OF(n, fab_ready_comm, node);
    fab_conn_close_recv(r->comm->handle);
    free(r);
  }
  return FAB_OK;
}

int fab_listen_close_owned(fab_endpoint* ep, fab_ctx* owner) {
  int n = 0;
  pthread_mutex_lock(&ep->lock);
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->listens) {
    fab_listener* l = FAB_CONTAINER_OF(it, fab_listener, node);
    if (l->owner != owner) continue;
    if (fab_obj_remove(l->handle, FAB_OBJ_LISTEN) != l) continue; /* the runtime is closing it right now */
    fab_listener_free_locked(l, 1);
    n++;
  }
  pthread_mutex_unlock(&ep->lock);
  return n;
}


fab_result fab_accept_wait(void* listen_comm, void** recv_comm, void** dev_handle) {
  int64_t until = fab_now_ms() + fab_g.params.connect_timeout_ms;
  for (;;) {
    fab_result rc = fab_conn_accept(listen_comm, recv_comm);
    if (rc != FAB_OK || *recv_comm) return rc;
    if (fab_now_ms() > until) {
      FAB_WARN("accept: no peer connected within %d ms; check that the peer is alive and connects with this "
               "listener's handle, or raise FABRIC_CONNECT_TIMEOUT_MS", fab_g.params.connect_timeout_ms);
      return FAB_ERR_SYSTEM;
    }
    sched_yield();
  }
}
