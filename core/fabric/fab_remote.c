/* One-sided operations with the window check in front of every post. */
#include "fab_remote.h"

/* Every write posted as a message goes through here. Above the inject size
 * it takes the device's completion level (dev->write_flags:
 * delivery, where the provider would complete it from a socket buffer, so
 * that a sender closing right after its sends completed loses nothing).
 * Writes up to the inject size go inline with local completion instead: the
 * provider sends them at once, and for two-sided messages what can be
 * outstanding is bounded by the receiver's announcements (512 per comm of at
 * most 64 bytes on tcp), within a socket's window, so they are not left
 * queued behind a window the peer stopped reading. (One-sided puts of that
 * size are not bounded so: docs/known-bugs.md.) */
static ssize_t write_msg(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, void* desc,
                         const fab_window* w, uint64_t off, uint64_t data, uint64_t flags, fab_op* op) {
  struct iovec iov = {.iov_base = (void*)buf, .iov_len = len};
  struct fi_rma_iov rma = {.addr = w->addr + off, .len = len, .key = w->key};
  struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = peer, .rma_iov = &rma,
                           .rma_iov_count = 1, .context = &op->ctx, .data = data};
  uint64_t level = fab_dev_injects(ep->dev, len) ? FI_INJECT : ep->dev->write_flags;
  int held = fab_ep_gate_enter(ep);
  ssize_t rc = fi_writemsg(ep->ep, &msg, flags | FI_COMPLETION | level);
  fab_ep_serial_leave(ep, held);
  return rc;
}

ssize_t fab_remote_writedata(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, void* desc,
                          const fab_window* w, uint64_t off, uint64_t data, fab_op* op) {
  if (FAB_UNLIKELY(!fab_window_covers(w, off, len))) return -FI_EINVAL;
  if (ep->dev->write_flags) return write_msg(ep, peer, buf, len, desc, w, off, data, FI_REMOTE_CQ_DATA, op);
  int held = fab_ep_gate_enter(ep);
  ssize_t rc = fi_writedata(ep->ep, buf, len, desc, data, peer, w->addr + off, w->key, &op->ctx);
  fab_ep_serial_leave(ep, held);
  return rc;
}

ssize_t fab_remote_write(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, void* desc,
                      const fab_window* w, uint64_t off, fab_op* op) {
  if (FAB_UNLIKELY(!fab_window_covers(w, off, len))) return -FI_EINVAL;
  if (ep->dev->write_flags) return write_msg(ep, peer, buf, len, desc, w, off, 0, 0, op);
  int held = fab_ep_gate_enter(ep);
  ssize_t rc = fi_write(ep->ep, buf, len, desc, peer, w->addr + off, w->key, &op->ctx);
  fab_ep_serial_leave(ep, held);
  return rc;
}

/* An intra-host provider places an inline write in the peer's memory before
 * the post returns: nothing is left to send, so the completion would say
 * nothing (and costs a CQ entry per message). It is given at once. */
static ssize_t inject_placed(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, const fab_window* w,
                             uint64_t off, const uint64_t* data, fab_op* op) {
  ssize_t rc = data ? fi_inject_writedata(ep->ep, buf, len, *data, peer, w->addr + off, w->key)
                    : fi_inject_write(ep->ep, buf, len, peer, w->addr + off, w->key);
  if (rc != 0) return rc;
  fab_cqe done = {.op_context = &op->ctx, .flags = FI_RMA | FI_WRITE, .len = len};
  op->fn(op, &done, NULL);
  return 0;
}

/* Where the provider cannot inject len bytes: the bytes go from a registered
 * slot of ep's bounce pool, which goes back when the write completes. */
static ssize_t bounce_write(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, const fab_window* w,
                            uint64_t off, const uint64_t* data, fab_op* op) {
  ssize_t rc = 0;
  fab_bounce_slot* s = fab_bounce_take(ep, buf, len, op, &rc);
  if (!s) return rc;
  rc = data ? fab_remote_writedata(ep, peer, s->bytes, len, s->desc, w, off, *data, &s->op)
            : fab_remote_write(ep, peer, s->bytes, len, s->desc, w, off, &s->op);
  if (rc != 0) fab_bounce_give_back(ep, s);
  return rc;
}

ssize_t fab_remote_inject_writedata(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len,
                                 const fab_window* w, uint64_t off, uint64_t data, fab_op* op) {
  if (FAB_UNLIKELY(!fab_window_covers(w, off, len))) return -FI_EINVAL;
  if (FAB_UNLIKELY(!fab_dev_injects(ep->dev, len))) return bounce_write(ep, peer, buf, len, w, off, &data, op);
  if (ep->dev->local_only) return inject_placed(ep, peer, buf, len, w, off, &data, op);
  return write_msg(ep, peer, buf, len, NULL, w, off, data, FI_REMOTE_CQ_DATA, op); /* inline: len fits */
}

ssize_t fab_remote_inject_write(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, const fab_window* w,
                             uint64_t off, fab_op* op) {
  if (FAB_UNLIKELY(!fab_window_covers(w, off, len))) return -FI_EINVAL;
  if (FAB_UNLIKELY(!fab_dev_injects(ep->dev, len))) return bounce_write(ep, peer, buf, len, w, off, NULL, op);
  if (ep->dev->local_only) return inject_placed(ep, peer, buf, len, w, off, NULL, op);
  return write_msg(ep, peer, buf, len, NULL, w, off, 0, 0, op); /* inline: len fits */
}

ssize_t fab_remote_ctl_write(fab_comm* c, const void* buf, size_t len, const fab_window* w, uint64_t off,
                          uint64_t data) {
  atomic_fetch_add_explicit(&c->inflight, 1, memory_order_relaxed);
  ssize_t rc = fab_remote_inject_writedata(c->ep, c->peer, buf, len, w, off, data, &c->ctl_op);
  if (rc != 0) atomic_fetch_sub_explicit(&c->inflight, 1, memory_order_relaxed);
  return rc;
}

ssize_t fab_remote_read(fab_endpoint* ep, fi_addr_t peer, void* buf, size_t len, void* desc, const fab_window* w,
                     uint64_t off, fab_op* op) {
  if (FAB_UNLIKELY(!fab_window_covers(w, off, len))) return -FI_EINVAL;
  int held = fab_ep_gate_enter(ep);
  ssize_t rc = fi_read(ep->ep, buf, len, desc, peer, w->addr + off, w->key, &op->ctx);
  fab_ep_serial_leave(ep, held);
  return rc;
}
