/*
 * One-sided operations, for every transport and ABI family: a remote window
 * (what a peer registered and announced: address, length, key), and write,
 * write with 8 bytes of remote CQ data, inline write and read into it.
 *
 * Every operation checks [offset, offset + len) against the window before
 * anything is posted: a peer's bytes decide where we write only inside a
 * window the peer registered (its provider enforces the key and range on its
 * side; we refuse the rest before it leaves).
 *
 * Ordering: a write with remote CQ data completes at the target only once its
 * data is placed, so "data before the notification that announces it" holds
 * for one fi_writedata by itself; nothing here relies on ordering between
 * separate operations.
 */
#ifndef FAB_REMOTE_H
#define FAB_REMOTE_H

#include "fab_engine.h"

typedef struct fab_window {
  uint64_t addr; /* as the peer's provider addresses it (virtual address or offset) */
  uint64_t len;
  uint64_t key;
} fab_window;

/* 1 when [off, off + len) lies inside w. */
static inline int fab_window_covers(const fab_window* w, uint64_t off, uint64_t len) {
  return off <= w->len && len <= w->len - off;
}

/* The bounce pool (fab_remote_buf.c): registered slots for small writes the
 * provider cannot inject. A taken slot holds a copy of buf; post the write
 * from bytes with desc and &op as its context: when it completes, the slot
 * goes back to the pool and the caller's op completes. If the post fails,
 * give the slot back. take: NULL with *rc -FI_EAGAIN (every slot in flight),
 * -FI_EMSGSIZE (len > FAB_BOUNCE_BYTES) or a registration failure. Any thread,
 * with or without ep's lock. */
enum { FAB_BOUNCE_BYTES = 64 };
typedef struct fab_bounce_slot {
  fab_op op;    /* first */
  fab_op* user; /* the caller's operation */
  struct fab_bounce_slot* next_free;
  void* desc;
  _Alignas(8) uint8_t bytes[FAB_BOUNCE_BYTES];
} fab_bounce_slot;
fab_bounce_slot* fab_bounce_take(fab_endpoint* ep, const void* buf, size_t len, fab_op* op, ssize_t* rc);
void fab_bounce_give_back(fab_endpoint* ep, fab_bounce_slot* s);
/* Frees ep's bounce pool; the libfabric endpoint is closed already. */
void fab_bounce_free(fab_endpoint* ep);

/* The most an inline write takes: the provider's inject size, or a bounce
 * slot where that is smaller. */
static inline size_t fab_remote_inline_max(const fab_device* d) {
  return d->inject_size > FAB_BOUNCE_BYTES ? d->inject_size : FAB_BOUNCE_BYTES;
}

/* Each returns 0, -FI_EAGAIN (retry after progress), -FI_EINVAL (outside
 * the window: nothing was posted) or another negative fi errno. */
ssize_t fab_remote_writedata(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, void* desc,
                          const fab_window* w, uint64_t off, uint64_t data, fab_op* op);
ssize_t fab_remote_write(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, void* desc,
                      const fab_window* w, uint64_t off, fab_op* op);
/* Inline: buf may be reused at once, yet op still completes or fails later,
 * so it must outlive the operation. Where the provider cannot inject len bytes
 * (fab_dev_injects), buf is copied into a slot of the endpoint's bounce pool
 * and written from there; len is at most FAB_BOUNCE_BYTES then, else
 * -FI_EMSGSIZE, and -FI_EAGAIN while every slot is in flight. Every
 * write we post carries a completion on purpose: libfabric 1.17's tcp reports
 * a failed inline write without a completion (one to a peer that closed its
 * connection) with no operation context, and ofi_rxm dereferences that
 * (docs/known-bugs.md). On intra-host providers the write is placed before
 * the post returns, and op's handler runs before this returns 0. */
ssize_t fab_remote_inject_writedata(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len,
                                 const fab_window* w, uint64_t off, uint64_t data, fab_op* op);
/* The same without CQ data (a runtime's inline write into a peer's window,
 * core/onesided/fab_p2p_rma.c): buf needs no registration. */
ssize_t fab_remote_inject_write(fab_endpoint* ep, fi_addr_t peer, const void* buf, size_t len, const fab_window* w,
                             uint64_t off, fab_op* op);
/* A transport's control write on comm c (an announcement, credits): inline,
 * counted in c->inflight until c->ctl_op completes it; a failure fails the
 * comm (fab_comm_ctl_done). ep lock held. */
ssize_t fab_remote_ctl_write(fab_comm* c, const void* buf, size_t len, const fab_window* w, uint64_t off,
                          uint64_t data);
ssize_t fab_remote_read(fab_endpoint* ep, fi_addr_t peer, void* buf, size_t len, void* desc, const fab_window* w,
                     uint64_t off, fab_op* op);

/* A buffer of our own that peers write into (a transport's mailbox): registered
 * for remote access on dev's domain, described as the window peers use. */
typedef struct fab_remote_buf {
  struct fid_mr* mr;
  void* desc;
  fab_window win;
} fab_remote_buf;
/* Registers buf for the given access on ep's device, bound to ep where the
 * provider asks (FI_MR_ENDPOINT). 0 or a negative fi errno. */
int fab_remote_buf_reg(fab_endpoint* ep, void* buf, size_t len, uint64_t access, fab_remote_buf* out);
void fab_remote_buf_dereg(fab_remote_buf* b);

/* A buffer of our own whose peer may still be writing into it when its owner
 * goes (a closed comm's mailbox: the peer does not know yet). Freeing it at
 * once races with another thread's progress placing such a write (seen as a
 * crash inside the provider). It stays registered and allocated on ep for
 * FAB_RETIRE_GRACE_MS, then goes; all go when ep is destroyed, after the
 * libfabric endpoint is closed. mem is free()d. ep lock held, or ep being
 * destroyed. */
enum { FAB_RETIRE_GRACE_MS = 10000 };
void fab_remote_buf_retire(fab_endpoint* ep, fab_remote_buf* b, void* mem);
/* Frees retired buffers older than the grace period (all: every one). */
void fab_remote_retired_free(fab_endpoint* ep, int all);

#endif /* FAB_REMOTE_H */
