/* A one-sided group: collective connect, the all-to-all exchange its
 * collective calls use, progress, close. See fab_group.h. */
#include "fab_group.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_devcopy.h"
#include "fab_transport.h"

enum { GROUP_MAGIC = 0x434f4c4c, HELLO_MAGIC = 0x48454c4f, HELLO_TAG = 0x7ffe0000 };

/* What each rank tells each peer at connect. */
typedef struct group_hello {
  uint32_t magic;
  int32_t rank, nranks;
  uint32_t token;
  uint64_t ring_addr, ring_key, ring_len;
  uint32_t check;
  uint32_t ordered; /* 1: this rank's puts are plain ordered writes (fab_group.h) */
  uint32_t reserved[4];
} group_hello;
_Static_assert(sizeof(group_hello) == FAB_GROUP_XCHG_BYTES, "group_hello is one exchange part");

static uint32_t hello_check(const group_hello* h) {
  return h->magic ^ (uint32_t)h->rank ^ (uint32_t)h->nranks ^ h->token ^ (uint32_t)h->ring_addr ^
         (uint32_t)h->ring_key ^ (uint32_t)h->ring_len ^ h->ordered ^ 0x4f4c4c48u;
}

static void add_ep(fab_group* g, fab_endpoint* ep) {
  for (int i = 0; i < g->neps; i++)
    if (g->eps[i] == ep) return;
  if (g->neps < (int)FAB_ARRAY_SIZE(g->eps)) g->eps[g->neps++] = ep;
}

/* --- connect ---------------------------------------------------------------------------- */

/* Every peer's send comm (connect) and as many recv comms (accept), in
 * arrival order: which rank each one is comes with its hello. */
static fab_result handshake(fab_group* g, fab_listener* l, void** handles, void** accepted, const char* fn) {
  int64_t deadline = fab_now_ms() + fab_g.params.connect_timeout_ms;
  int nacc = 0, nconn = 0, want = g->nranks - 1;
  while (nacc < want || nconn < want) {
    for (int r = 0; r < g->nranks; r++) {
      fab_group_peer* p = &g->peers[r];
      if (r == g->rank || p->send_h) continue;
      fab_result rc = fab_conn_connect(l->owner->is_process ? NULL : l->owner->handle, l->dev->index, NULL, handles[r], 1, 0, &p->send_h);
      if (rc != FAB_OK) {
        char why[128];
        snprintf(why, sizeof(why), "connecting to rank %d failed (see the WARN above)", r);
        return fab_group_fail(g, rc, fn, why);
      }
      if (p->send_h) nconn++;
    }
    while (nacc < want) {
      fab_result rc = fab_conn_accept(l->handle, &accepted[nacc]);
      if (rc != FAB_OK) return fab_group_fail(g, rc, fn, "accepting a peer failed (see the WARN above)");
      if (!accepted[nacc]) break;
      nacc++;
    }
    if ((nacc < want || nconn < want) && fab_group_aborted(g)) return fab_group_fail_aborted(g, fn);
    if (fab_now_ms() > deadline && (nacc < want || nconn < want)) {
      char why[192];
      snprintf(why, sizeof(why), "after FABRIC_CONNECT_TIMEOUT_MS (%d ms) %d of %d peers connected and %d of %d "
               "accepted; every rank must call connect with the same handles", fab_g.params.connect_timeout_ms,
               nconn, want, nacc, want);
      return fab_group_fail(g, FAB_ERR_REMOTE, fn, why);
    }
    if (nacc < want || nconn < want) sched_yield();
  }
  return FAB_OK;
}

static fab_result make_ring(fab_group* g, fab_group_peer* p, const char* fn) {
  size_t len = FAB_GROUP_RING * sizeof(fab_group_sig) + FAB_GROUP_SCRATCH;
  p->ring_mem = aligned_alloc(64, len);
  p->put_seen = calloc(FAB_GROUP_PUT_WINDOW / 64, sizeof(uint64_t));
  if (!p->ring_mem || !p->put_seen) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory");
  memset(p->ring_mem, 0, len);
  int rc = fab_remote_buf_reg(g->target_ep, p->ring_mem, len, FI_REMOTE_WRITE, &p->ring_reg);
  if (rc != 0) {
    char why[160];
    snprintf(why, sizeof(why), "registering a signal ring failed: %s", fi_strerror(-rc));
    return fab_group_fail(g, FAB_ERR_SYSTEM, fn, why);
  }
  return FAB_OK;
}

/* Our hello to each peer: who we are and where its signal records go. */
static fab_result write_hellos(fab_group* g, const char* fn) {
  for (int r = 0; r < g->nranks; r++) {
    if (r == g->rank) continue;
    fab_group_peer* p = &g->peers[r];
    fab_result rc = make_ring(g, p, fn);
    if (rc != FAB_OK) return rc;
    group_hello h = {.magic = HELLO_MAGIC, .rank = g->rank, .nranks = g->nranks, .token = g->token,
                    .ring_addr = p->ring_reg.win.addr, .ring_key = p->ring_reg.win.key,
                    .ring_len = p->ring_reg.win.len, .ordered = (uint32_t)g->ordered};
    h.check = hello_check(&h);
    memcpy(fab_group_part_out(g, r), &h, sizeof(h));
  }
  return FAB_OK;
}

/* The hello in part_in(r) came in on slot[r], a recv comm not yet matched
 * to a rank: the hello says which rank it is. */
static fab_result read_hellos(fab_group* g, void** slot, const char* fn) {
  for (int r = 0; r < g->nranks; r++) {
    if (r == g->rank) continue;
    group_hello h;
    memcpy(&h, fab_group_part_in(g, r), sizeof(h));
    if (h.magic != HELLO_MAGIC || h.check != hello_check(&h) || h.nranks != g->nranks || h.rank < 0 ||
        h.rank >= g->nranks || h.rank == g->rank || g->peers[h.rank].recv_h) {
      char why[192];
      snprintf(why, sizeof(why), "a peer's hello is malformed or names rank %d of %d (we are rank %d of %d); every "
               "rank must pass the same handles and its own rank", h.rank, h.nranks, g->rank, g->nranks);
      return fab_group_fail(g, FAB_ERR_REMOTE, fn, why);
    }
    if (h.ordered != (uint32_t)g->ordered) {
      char why[192];
      snprintf(why, sizeof(why), "rank %d %s its writes in order and this rank %s: the ranks run different "
               "providers or plugin builds; use the same everywhere", h.rank, h.ordered ? "has" : "has not",
               g->ordered ? "has" : "has not");
      return fab_group_fail(g, FAB_ERR_INVALID_USAGE, fn, why);
    }
    fab_group_peer* p = &g->peers[h.rank];
    p->recv_h = slot[r];
    p->token = h.token;
    p->ring = (fab_window){.addr = h.ring_addr, .len = h.ring_len, .key = h.ring_key};
  }
  return FAB_OK;
}

/* Resolves the comms, and hooks the recv comms up to the target side. */
static fab_result bind_peers(fab_group* g, const char* fn) {
  for (int r = 0; r < g->nranks; r++) {
    if (r == g->rank) continue;
    fab_group_peer* p = &g->peers[r];
    p->sc = fab_obj_get(p->send_h, FAB_OBJ_SEND);
    p->rc = fab_obj_get(p->recv_h, FAB_OBJ_RECV);
    if (!p->sc || !p->rc || p->rc->ep != g->target_ep)
      return fab_group_fail(g, FAB_ERR_INTERNAL, fn, "a peer's comm is not where the group expects it");
    add_ep(g, p->sc->ep);
    if (p->sc->home) add_ep(g, p->sc->home);
    pthread_mutex_lock(&g->target_ep->lock);
    p->hook = (fab_onesided_hook){.landed = fab_group_target_landed, .arg = p};
    fab_comm_ext_set(p->rc, FAB_EXT_ONESIDED, &p->hook, NULL); /* the group clears it at close */
    pthread_mutex_unlock(&g->target_ep->lock);
  }
  return FAB_OK;
}

static fab_result hello(fab_group* g, void** accepted, const char* fn) {
  fab_result rc = write_hellos(g, fn);
  if (rc != FAB_OK) return rc;
  /* the recv comms are not matched to ranks yet: slot r takes any one */
  void** slot = calloc((size_t)(unsigned)g->nranks, sizeof(void*));
  if (!slot) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory");
  for (int r = 0, i = 0; r < g->nranks; r++)
    if (r != g->rank) slot[r] = accepted[i++];
  rc = fab_group_exchange_on(g, slot, HELLO_TAG, fn);
  if (rc == FAB_OK) rc = read_hellos(g, slot, fn);
  free(slot);
  if (rc == FAB_OK) rc = bind_peers(g, fn);
  return rc;
}

static fab_result group_setup(fab_group* g, fab_listener* l, void** handles, const char* fn) {
  size_t xlen = (size_t)2 * g->nranks * FAB_GROUP_XCHG_BYTES;
  g->xchg_buf = calloc(1, xlen);
  if (!g->xchg_buf) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory");
  fab_result rc = fab_mr_register_on(l->dev, l->ep, g->xchg_buf, xlen, FAB_PTR_HOST, 0, -1, &g->xchg_mh, fn);
  if (rc != FAB_OK) return fab_group_fail(g, rc, fn, "registering the exchange buffer failed");
  if (g->nranks == 1) return FAB_OK;
  void** accepted = calloc((size_t)g->nranks, sizeof(void*));
  if (!accepted) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory");
  rc = handshake(g, l, handles, accepted, fn);
  if (rc == FAB_OK) rc = hello(g, accepted, fn);
  /* comms not adopted by a peer (a failed hello) are closed here */
  for (int i = 0; i < g->nranks - 1; i++) {
    int adopted = 0;
    for (int r = 0; r < g->nranks; r++) adopted |= accepted[i] && g->peers[r].recv_h == accepted[i];
    if (accepted[i] && !adopted) fab_conn_close_recv(accepted[i]);
  }
  free(accepted);
  return rc;
}

static void group_destroy(fab_group* g);

static fab_result connect_args(void** handles, int nranks, int rank, void* listen_comm, void** group,
                               fab_listener** l) {
  if (!group) return fab_bad_argument("connect", "collComm", 0, "a non-NULL pointer");
  *group = NULL;
  if (!handles) return fab_bad_argument("connect", "handles", 0, "an array of nranks handles");
  if (nranks < 1) return fab_bad_argument("connect", "nranks", nranks, "at least 1");
  if (rank < 0 || rank >= nranks) return fab_bad_argument("connect", "rank", rank, "0..nranks-1");
  for (int r = 0; r < nranks; r++)
    if (!handles[r] && r != rank) return fab_bad_argument("connect", "handles[]", r, "a handle from every rank");
  *l = fab_obj_get(listen_comm, FAB_OBJ_LISTEN);
  if (!*l) {
    FAB_WARN("connect: %p is not a live listen comm; pass the one listen() returned on this rank", listen_comm);
    return FAB_ERR_INTERNAL;
  }
  if (!(*l)->ep->dev->ops->onesided_data) {
    FAB_WARN("connect: device %s runs the %s transport; one-sided operations need the rdma transport "
             "(FABRIC_TRANSPORT=rdma, or auto on a provider where it is preferred)", (*l)->dev->name,
             (*l)->ep->dev->ops->name);
    return FAB_ERR_INVALID_USAGE;
  }
  return FAB_OK;
}

fab_result fab_group_connect(fab_ctx* ctx, void** handles, int nranks, int rank, int n_contexts, void* listen_comm,
                            void** group, const volatile uint32_t* abort_flag) {
  (void)ctx; /* NCCL passes its net context here, not the RMA one listen got: the listen comm's context owns it */
  fab_listener* l = NULL;
  fab_result rc = connect_args(handles, nranks, rank, listen_comm, group, &l);
  if (rc != FAB_OK) return rc;
  if (n_contexts < 1 || n_contexts > FAB_GROUP_MAX_CONTEXTS)
    return fab_bad_argument("connect", "nConnections", n_contexts, "1..256");
  fab_group* g = calloc(1, sizeof(*g));
  fab_group_peer* peers = calloc((size_t)nranks, sizeof(*peers));
  if (!g || !peers) {
    free(g);
    free(peers);
    FAB_WARN("connect: out of memory for a group of %d ranks", nranks);
    return FAB_ERR_SYSTEM;
  }
  g->magic = GROUP_MAGIC;
  g->peers = peers;
  g->nranks = nranks;
  g->rank = rank;
  g->dev = l->dev;
  g->target_ep = l->ep;
  g->token = (uint32_t)fab_random64();
  g->own_contexts = n_contexts;
  g->abort_flag = abort_flag;
  g->ordered = l->ep->dev->ordered_writes;
  pthread_mutex_init(&g->lock, NULL);
  pthread_mutex_init(&g->xchg_lock, NULL);
  fab_list_init(&g->ctxs);
  fab_list_init(&g->free_reqs);
  fab_list_init(&g->chunks);
  fab_list_init(&g->owned);
  add_ep(g, l->ep);
  for (int r = 0; r < nranks; r++) {
    peers[r].group = g;
    peers[r].rank = r;
    fab_list_init(&peers[r].waiting);
    fab_list_init(&peers[r].staging);
    fab_op_init(&peers[r].ack_op, fab_group_ack_done, &peers[r], 0);
  }
  fab_group_register(g);
  rc = group_setup(g, l, handles, "connect");
  g->abort_flag = NULL; /* NCCL's flag is for this call; later collective calls have no such promise */
  if (rc == FAB_OK) {
    g->handle = fab_obj_add(FAB_OBJ_COLL, g);
    if (!g->handle) rc = fab_group_fail(g, FAB_ERR_SYSTEM, "connect", "handle table full");
  }
  if (rc != FAB_OK) {
    group_destroy(g);
    return rc;
  }
  FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "RMA group of %d ranks connected on %s (rank %d)", nranks, g->dev->name,
           rank);
  *group = g->handle;
  return FAB_OK;
}

/* --- close ---------------------------------------------------------------------------- */

static void group_destroy(fab_group* g) {
  fab_group_unregister(g); /* no other group's progress reaches it from here on */
  int64_t deadline = fab_now_ms() + FAB_CLOSE_DRAIN_MS;
  while (fab_group_busy(g) && fab_now_ms() < deadline) {
    fab_group_poll(g);
    sched_yield();
  }
  int leak = fab_group_busy(g); /* the provider may still write into requests: keep them */
  pthread_mutex_lock(&g->target_ep->lock);
  for (int r = 0; r < g->nranks; r++) {
    fab_group_peer* p = &g->peers[r];
    if (p->rc) fab_comm_ext_set(p->rc, FAB_EXT_ONESIDED, NULL, NULL);
    if (p->ring_reg.mr) fab_remote_buf_retire(g->target_ep, &p->ring_reg, p->ring_mem); /* the peer may still write */
    else free(p->ring_mem);
  }
  fab_group_stage_free(g, leak);
  pthread_mutex_unlock(&g->target_ep->lock);
  for (int r = 0; r < g->nranks; r++) free(g->peers[r].put_seen); /* no handler reaches them any more */
  for (int r = 0; r < g->nranks; r++) {
    if (g->peers[r].send_h) fab_conn_close_send(g->peers[r].send_h);
    if (g->peers[r].recv_h) fab_conn_close_recv(g->peers[r].recv_h);
  }
  for (uint32_t i = 0; i < g->nwins; i++)
    if (g->wins[i]) {
      FAB_INFO(FAB_SUBSYS_NET, "closeColl: symmetric registration %u was not deregistered; releasing it", i);
      fab_obj_remove(g->wins[i]->handle, FAB_OBJ_COLL_WIN);
      fab_group_win_free(g->wins[i]);
    }
  free(g->wins);
  fab_group_ctxs_drop(g);
  if (g->xchg_mh) fab_mr_deregister(g->xchg_mh);
  free(g->xchg_buf);
  if (leak) {
    FAB_INFO(FAB_SUBSYS_NET, "closeColl: operations still in flight after %d ms; their requests stay allocated",
             FAB_CLOSE_DRAIN_MS);
    return;
  }
  fab_group_reqs_free(g);
  pthread_mutex_destroy(&g->lock);
  pthread_mutex_destroy(&g->xchg_lock);
  free(g->peers);
  g->magic = 0;
  free(g);
}

fab_result fab_close_group(void* group) {
  fab_group* g = fab_group_get(group, "closeColl");
  if (!g) return FAB_ERR_INTERNAL;
  fab_obj_remove(group, FAB_OBJ_COLL);
  group_destroy(g);
  return FAB_OK;
}

fab_result fab_group_rma_properties(void* group, fab_rma_properties* props) {
  if (!props) return fab_bad_argument("getRmaProperties", "rmaProps", 0, "a non-NULL pointer");
  fab_group* g = fab_group_get(group, "getRmaProperties");
  if (!g) return FAB_ERR_INTERNAL;
  /* a signal waits for its own source's puts only, not for every peer's */
  props->flushes_all_puts_on_any_signal = false;
  return FAB_OK;
}

void fab_group_win_free(fab_group_win* w) {
  if (w->mr_handle) fab_mr_deregister(w->mr_handle); /* a staged window has none */
  if (w->gpu) fab_devcopy_forget((void*)w->base, w->len);
  free(w->remote);
  free(w->remote_staged);
  free((void*)w->remote_gone);
  free(w->shadow);
  free(w->shadow_known);
  free(w);
}

void fab_group_ctxs_drop(fab_group* g) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &g->ctxs) {
    fab_group_ctx* x = FAB_CONTAINER_OF(it, fab_group_ctx, node);
    FAB_INFO(FAB_SUBSYS_NET, "closeColl: an RMA context was not destroyed; it is invalid from now on");
    fab_obj_remove(x->handle, FAB_OBJ_COLL_CTX);
    fab_list_del(&x->node);
    free(x);
  }
}
