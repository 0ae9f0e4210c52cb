/*
 * One-sided calls on a point-to-point connection, as the Neuron tables ask
 * for them: getMrKey, iwrite, iwriteInline and iread on the comms listen,
 * connect and accept made. The peer's memory is named by the key and the
 * virtual address the runtime got from the peer; it is written or read only
 * inside a window the peer offered on this very connection (fab_pwin.h).
 *
 *  regMr   registers as fab_reg_mr does, then offers [data, data + size) to
 *          the comm's peer (a fab_wire_window message to the peer's comm);
 *  deregMr withdraws the offer first.
 *  iwrite  on a send comm, iread on a recv comm: the window with that key
 *          holding [address, address + size) is looked up; a key never
 *          offered yet is retried (NULL request) for FAB_OFFER_WAIT_MS, since
 *          the runtime may have learnt it faster than our offer travelled,
 *          and is then an error; a range outside the window is an error at
 *          once. Nothing is posted in either case.
 *
 * Only the rdma transport opens endpoints with FI_RMA and registers host
 * memory for remote access; on a device running sendrecv (auto's choice on
 * shm) rma_supported is 0 and these calls say what to set.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "fab_conn.h"
#include "fab_mr.h"
#include "fab_pwin.h"
#include "fab_transport.h"

static fab_device* carrier_of(fab_device* d) { return d->physical ? d : fab_g.devs[d->carrier]; }

static int rma_capable(const fab_device* d) { return d->ops && d->ops->onesided_data; }

fab_result fab_p2p_get_properties(int dev, fab_properties* props) {
  fab_result rc = fab_get_properties(dev, props);
  if (rc != FAB_OK) return rc;
  fab_device* d = carrier_of(fab_device_get(dev, "getProperties"));
  props->ptr_support = FAB_PTR_HOST; /* NCCL_PTR_NEURON (0x4) needs a provider that registers device memory */
  props->reg_is_global = 0;          /* a window is offered to the peer of the comm it is registered on */
  props->rma_supported = rma_capable(d);
  size_t ksize = d->info->domain_attr->mr_key_size;
  props->max_mr_key_size = props->rma_supported ? (ksize && ksize < 8 ? ksize : 8) : 0;
  props->max_write_inline_size = props->rma_supported ? fab_remote_inline_max(d) : 0;
  return FAB_OK;
}

/* A live send or recv comm, or NULL with one WARN. */
static fab_comm* comm_of(void* handle, fab_obj_kind kind, const char* fn) {
  fab_obj_kind k = fab_obj_kind_of(handle);
  fab_comm* c = (kind ? k == kind : k == FAB_OBJ_SEND || k == FAB_OBJ_RECV) ? fab_obj_get(handle, k) : NULL;
  if (!c)
    FAB_WARN("%s: %p is not a live %s comm", fn, handle, kind ? fab_obj_kind_name(kind) : "send or recv");
  return c;
}

static fab_result not_capable(fab_comm* c, const char* fn) {
  FAB_WARN("%s: device %s runs the %s transport, which has no one-sided operations (rma_supported is 0); set "
           "FABRIC_TRANSPORT=rdma", fn, c->ep->dev->name, c->ep->dev->ops->name);
  return FAB_ERR_INVALID_USAGE;
}

/* --- offers ----------------------------------------------------------------- */

/* Sends an offer (op ADD) or a withdrawal to c's peer. ep lock held. */
static fab_result offer_send(fab_comm* c, uint16_t op, uint64_t id, const fab_mr* m, uint64_t seq, const char* fn) {
  int rc = m ? fab_pwin_send(c, op, id, m->addr, fab_mr_remote_addr(m, (void*)m->addr), m->len, m->key)
             : fab_pwin_send(c, op, id, seq, 0, 0, 0);
  if (rc == 0) return FAB_OK;
  FAB_WARN("%s: sending a window %s to %s failed: %s", fn, m ? "offer" : "withdrawal", c->peer_name, fi_strerror(-rc));
  return fab_result_from_fi(-rc);
}

static fab_result offer(void* comm, void* mhandle, const char* fn) {
  fab_comm* c = comm_of(comm, 0, fn);
  fab_mr* m = c ? fab_obj_get(mhandle, FAB_OBJ_MR) : NULL;
  if (!m) return FAB_ERR_INTERNAL;
  if (!rma_capable(c->ep->dev) || m->key == FI_KEY_NOTAVAIL) return FAB_OK; /* nothing a peer could reach */
  fab_endpoint* ep = c->ep;
  pthread_mutex_lock(&ep->lock);
  fab_pwin* p = fab_pwin_get(c);
  fab_result rc = p ? offer_send(c, FAB_WINDOW_ADD, p->next_id, m, 0, fn) : FAB_ERR_SYSTEM;
  if (!p) FAB_WARN("%s: out of memory offering a window to %s", fn, c->peer_name);
  if (rc == FAB_OK) { /* the registration remembers where it was offered: deregMr may name any comm */
    m->offered_on = c->handle;
    m->offer_id = p->next_id++;
  }
  pthread_mutex_unlock(&ep->lock);
  return rc;
}

static fab_result host_only(int type, const char* fn) {
  if (type == FAB_PTR_HOST) return FAB_OK;
  FAB_WARN("%s: memory type %d; this plugin registers host memory (NCCL_PTR_HOST) only for this runtime, as "
           "ptrSupport says", fn, type);
  return FAB_ERR_INVALID_ARG;
}

static fab_result registered(fab_result rc, void* comm, void** mhandle, const char* fn) {
  if (rc != FAB_OK) return rc;
  rc = offer(comm, *mhandle, fn);
  if (rc != FAB_OK) {
    fab_mr_deregister(*mhandle);
    *mhandle = NULL;
  }
  return rc;
}

fab_result fab_reg_mr_offered(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (host_only(type, "regMr") != FAB_OK) return FAB_ERR_INVALID_ARG;
  return registered(fab_reg_mr(comm, data, size, type, mhandle), comm, mhandle, "regMr");
}

fab_result fab_reg_mr_dmabuf_offered(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                     void** mhandle) {
  if (host_only(type, "regMrDmaBuf") != FAB_OK) return FAB_ERR_INVALID_ARG;
  return registered(fab_reg_mr_dmabuf(comm, data, size, type, offset, fd, mhandle), comm, mhandle, "regMrDmaBuf");
}

/* The peer answers a withdrawal once none of its operations into the window
 * is in flight, so none lands after the registration closes (on tcp, a write
 * into a closed registration breaks the connection). A peer that does not
 * answer within FAB_CLOSE_DRAIN_MS (it is not progressing, or gone) is not
 * waited for longer: NCCL's deregistration of announced receives does the
 * same. Nor are its next withdrawals, on any comm of the endpoint, until it
 * answers one again: a runtime deregistering many windows while its peer
 * waits elsewhere (a barrier) would otherwise stall that long for each. ep
 * lock held, let go between polls. */
static void withdraw(fab_comm* c, fab_pwin* p, uint64_t id) {
  uint64_t seq = ++p->withdrawals;
  if (offer_send(c, FAB_WINDOW_REMOVE, id, NULL, seq, "deregMr") != FAB_OK) return;
  if (c->ep->silent_peer == c->peer) return;
  int64_t until = fab_now_ms() + FAB_CLOSE_DRAIN_MS;
  while (p->withdrawals_acked < seq && c->error == FAB_OK && fab_now_ms() < until) {
    if (fab_ep_progress_locked(c->ep) != FAB_OK) break;
    pthread_mutex_unlock(&c->ep->lock);
    fab_comm_drive_device(c); /* the peer may wait on another comm of ours for its own answer */
    sched_yield();
    pthread_mutex_lock(&c->ep->lock);
  }
  if (p->withdrawals_acked < seq && c->error == FAB_OK) {
    FAB_INFO(FAB_SUBSYS_NET, "deregMr: %s did not confirm the window's withdrawal within %d ms; deregistering anyway, "
             "and not waiting for its next ones until it answers", c->peer_name, FAB_CLOSE_DRAIN_MS);
    c->ep->silent_peer = c->peer;
  }
}

fab_result fab_dereg_mr_offered(void* comm, void* mhandle) {
  fab_mr* m = fab_obj_get(mhandle, FAB_OBJ_MR);
  void* on = m ? m->offered_on : NULL;
  fab_obj_kind k = fab_obj_kind_of(on);
  fab_comm* c = on && (k == FAB_OBJ_SEND || k == FAB_OBJ_RECV) ? fab_obj_get(on, k) : NULL;
  if (c) { /* a closed comm's peer has nothing to withdraw */
    pthread_mutex_lock(&c->ep->lock);
    m->offered_on = NULL;
    if (c->error == FAB_OK) withdraw(c, fab_pwin_of(c), m->offer_id);
    pthread_mutex_unlock(&c->ep->lock);
  }
  return fab_dereg_mr(comm, mhandle); /* WARNs for a bad handle */
}

fab_result fab_get_mr_key(void* mhandle, uint64_t* mr_key) {
  if (!mr_key) return fab_bad_argument("getMrKey", "mr_key", 0, "a non-NULL pointer");
  fab_mr* m = fab_obj_get(mhandle, FAB_OBJ_MR);
  if (!m) {
    FAB_WARN("getMrKey: %p is not a live memory handle from regMr", mhandle);
    return FAB_ERR_INTERNAL;
  }
  if (m->key == FI_KEY_NOTAVAIL) {
    FAB_WARN("getMrKey: the registration at %p has no remote key: device %s runs the %s transport (rma_supported "
             "0); set FABRIC_TRANSPORT=rdma", (void*)m->addr, m->dev->name, m->dev->ops->name);
    return FAB_ERR_INVALID_USAGE;
  }
  *mr_key = m->key;
  return FAB_OK;
}

/* --- operations ------------------------------------------------------------- */

/* A one-sided operation that fails fails its connection, on every provider
 * alike: the two ends disagree about a window (tcp breaks the connection
 * under it anyway). */
static void os_done(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  fab_osreq* r = op->owner;
  fab_comm* c = r->comm;
  if (err) {
    /* a cancel we did not ask for: the provider gave up on the connection
     * (ofi_rxm when the peer's socket went away) */
    int lost = err->err == FI_ECANCELED && c->error == FAB_OK && !c->closing;
    r->result = lost ? FAB_ERR_REMOTE : fab_result_from_fi(err->err);
    snprintf(r->why, sizeof(r->why), "%s of %zu bytes %s %s failed: %s", r->is_read ? "iread" : "iwrite", r->size,
             r->is_read ? "from" : "to", c->peer_name,
             lost ? "the provider cancelled it: the connection to the peer was lost; the peer process probably "
                    "exited"
                  : fi_strerror(err->err));
    if (!c->closing) fab_comm_fail(c, r->result, r->why);
  }
  fab_pwin_op_done(c);
  atomic_store_explicit(&r->pending, 0, memory_order_release);
  fab_comm_op_done(c); /* may free a closed c, and r with it */
}

static fab_osreq* osreq_get(fab_pwin* p, fab_comm* c) {
  for (int i = 0; i < FAB_OS_REQS; i++) {
    fab_osreq* r = &p->reqs[i];
    if (r->head.state != FAB_REQ_FREE) continue;
    r->head.magic = FAB_REQ_MAGIC;
    r->head.kind = &fab_osreq_kind;
    r->head.state = FAB_REQ_ACTIVE;
    r->comm = c;
    r->result = FAB_OK;
    r->why[0] = 0;
    return r;
  }
  return NULL;
}

/* The peer window for [remote, remote + size) with key, or NULL: *rc says
 * retry (FAB_OK) or the error (WARNed). ep lock held. */
static const fab_pwin_entry* window_for(fab_comm* c, fab_pwin* p, uint64_t remote, size_t size, uint64_t key,
                                        const char* fn, fab_result* rc) {
  int why;
  const fab_pwin_entry* e = fab_pwin_find(p, key, remote, size, &why);
  *rc = FAB_OK;
  if (e) {
    p->unknown_since_ms = 0;
    return e;
  }
  const char* done = strcmp(fn, "iread") == 0 ? "read" : "written";
  if (why == FAB_KEY_OUT_OF_RANGE) {
    FAB_WARN("%s: %zu bytes at 0x%llx do not lie inside the window %s offered with key 0x%llx; nothing was %s", fn,
             size, (unsigned long long)remote, c->peer_name, (unsigned long long)key, done);
    *rc = FAB_ERR_INVALID_ARG;
    return NULL;
  }
  if (why == FAB_KEY_WITHDRAWN) {
    FAB_WARN("%s: %s deregistered the window with key 0x%llx; nothing was %s", fn, c->peer_name,
             (unsigned long long)key, done);
    *rc = FAB_ERR_INVALID_ARG;
    return NULL;
  }
  int64_t now = fab_now_ms();
  if (!p->unknown_since_ms) p->unknown_since_ms = now;
  if (now - p->unknown_since_ms < FAB_OFFER_WAIT_MS) return NULL; /* its offer may be on its way */
  p->unknown_since_ms = 0;
  FAB_WARN("%s: %s offered no window with key 0x%llx on this connection (waited %d ms); pass a key from getMrKey of "
           "memory the peer registered on the comm connected to this one", fn, c->peer_name,
           (unsigned long long)key, FAB_OFFER_WAIT_MS);
  *rc = FAB_ERR_INVALID_ARG;
  return NULL;
}

enum { OS_WRITE, OS_WRITE_INLINE, OS_READ };

static ssize_t os_post(fab_comm* c, int kind, void* local, size_t size, void* desc, const fab_pwin_entry* e,
                       uint64_t remote, fab_op* op) {
  uint64_t off = remote - e->va;
  if (kind == OS_READ) return fab_remote_read(c->ep, c->peer, local, size, desc, &e->win, off, op);
  if (kind == OS_WRITE_INLINE) return fab_remote_inject_write(c->ep, c->peer, local, size, &e->win, off, op);
  return fab_remote_write(c->ep, c->peer, local, size, desc, &e->win, off, op);
}

static fab_result os_start(fab_comm* c, int kind, void* local, size_t size, void* desc, uint64_t remote, uint64_t key,
                           const char* fn, void** request) {
  fab_endpoint* ep = c->ep;
  pthread_mutex_lock(&ep->lock);
  /* A withdrawal the peer sent before its deregMr returned may be waiting
   * in our queue, unread if we did not progress since (its wait for our
   * answer ran out): read it before the key is trusted. On shm a write with
   * a closed key still lands. */
  fab_ep_progress_locked(ep);
  if (c->error != FAB_OK) { /* that progress failed the connection */
    pthread_mutex_unlock(&ep->lock);
    return fab_comm_failed(c, fn);
  }
  fab_pwin* p = fab_pwin_get(c);
  fab_result rc = FAB_ERR_SYSTEM;
  const fab_pwin_entry* e = p ? window_for(c, p, remote, size, key, fn, &rc) : NULL;
  fab_osreq* r = e ? osreq_get(p, c) : NULL;
  if (!r) {
    if (!p) FAB_WARN("%s: out of memory", fn);
    if (rc == FAB_OK) fab_ep_progress_locked(ep); /* retry: let the offer or a completion in */
    pthread_mutex_unlock(&ep->lock);
    return rc;
  }
  r->is_read = kind == OS_READ;
  r->size = size;
  ssize_t prc = 0;
  if (size > 0) { /* nothing to move: complete at once (a 0-byte RMA op is not posted) */
    atomic_store_explicit(&r->pending, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->inflight, 1, memory_order_acq_rel);
    p->ops_inflight++;
    fab_op_init(&r->op, os_done, r, 0);
    prc = os_post(c, kind, local, size, desc, e, remote, &r->op);
    if (prc != 0) {
      atomic_store_explicit(&r->pending, 0, memory_order_relaxed);
      atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_acq_rel);
      p->ops_inflight--;
      r->head.state = FAB_REQ_FREE;
      if (prc == -FI_EAGAIN) fab_ep_progress_locked(ep);
    }
  } else {
    atomic_store_explicit(&r->pending, 0, memory_order_relaxed);
  }
  pthread_mutex_unlock(&ep->lock);
  if (prc == -FI_EAGAIN) return fab_comm_not_now(c, fn); /* NULL request: call again (a dead peer fails the comm) */
  if (prc != 0) {
    FAB_WARN("%s: posting %zu bytes %s %s failed: %s", fn, size, kind == OS_READ ? "from" : "to", c->peer_name,
             fi_strerror((int)-prc));
    return fab_result_from_fi((int)-prc);
  }
  *request = r;
  return FAB_OK;
}

/* What every one-sided call checks before it looks for a window. */
static fab_result os_prologue(fab_comm* c, size_t size, const char* fn) {
  if (c->error != FAB_OK) return fab_comm_failed(c, fn);
  if (!rma_capable(c->ep->dev)) return not_capable(c, fn);
  size_t max = c->ep->dev->info->ep_attr->max_msg_size;
  if (size > max) {
    FAB_WARN("%s: %zu bytes is more than one operation of provider %s can carry (%zu); split it", fn, size,
             fab_device_provider(c->ep->dev), max);
    return FAB_ERR_INVALID_ARG;
  }
  return FAB_OK;
}

static fab_result os_call(void* comm, fab_obj_kind kind, int op, void* local, size_t size, void* mhandle,
                          uint64_t remote, uint64_t key, const char* fn, void** request) {
  if (!request) return fab_bad_argument(fn, "request", 0, "a non-NULL pointer");
  *request = NULL;
  fab_comm* c = comm_of(comm, kind, fn);
  if (!c) return FAB_ERR_INTERNAL;
  fab_result rc = os_prologue(c, size, fn);
  if (rc != FAB_OK) return rc;
  if (size > 0 && !local) return fab_bad_argument(fn, "local buffer", 0, "a non-NULL address");
  fab_mr* m = NULL;
  if (op != OS_WRITE_INLINE && size > 0) {
    if (!mhandle) {
      FAB_WARN("%s: the memory handle is NULL for %zu bytes; pass the handle regMr returned for the buffer", fn, size);
      return FAB_ERR_INTERNAL;
    }
    rc = fab_mr_resolve(c, mhandle, local, size, fn, &m);
    if (rc != FAB_OK) return rc;
  }
  return os_start(c, op, local, size, m ? m->desc : NULL, remote, key, fn, request);
}

fab_result fab_iwrite(void* send_comm, void* src, size_t size, void* src_mhandle, uint64_t dest, uint64_t mr_key,
                      void** request) {
  return os_call(send_comm, FAB_OBJ_SEND, OS_WRITE, src, size, src_mhandle, dest, mr_key, "iwrite", request);
}

fab_result fab_iwrite_inline(void* send_comm, void* src, size_t size, uint64_t dest, uint64_t mr_key,
                             void** request) {
  fab_comm* c = fab_obj_get(send_comm, FAB_OBJ_SEND);
  if (c && rma_capable(c->ep->dev) && size > fab_remote_inline_max(c->ep->dev)) {
    FAB_WARN("iwriteInline: %zu bytes is more than max_write_inline_size (%zu); use iwrite", size,
             fab_remote_inline_max(c->ep->dev));
    if (request) *request = NULL;
    return FAB_ERR_INVALID_ARG;
  }
  return os_call(send_comm, FAB_OBJ_SEND, OS_WRITE_INLINE, src, size, NULL, dest, mr_key, "iwriteInline", request);
}

fab_result fab_iread(void* recv_comm, void* dest, size_t size, void* dest_mhandle, uint64_t src, uint64_t mr_key,
                     void** request) {
  return os_call(recv_comm, FAB_OBJ_RECV, OS_READ, dest, size, dest_mhandle, src, mr_key, "iread", request);
}
