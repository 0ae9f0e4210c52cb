/*
 * The rdma transport: NCCL messages as RMA writes straight into the
 * receiver's buffer.
 *
 *  irecv: each buffer gets k, its number among the connection's buffers with
 *         its tag, and (unless an eager message for it is already held) a
 *         number among announced buffers (index), and is announced to the
 *         sender by an inline write of an rd_ctrl {address, key, size, tag,
 *         k, slot} into the sender's mailbox entry index % RD_SLOTS, with
 *         remote CQ data naming the entry.
 *  isend: the k-th send with a tag matches the k-th buffer with that tag
 *         (libfabric's tagged rule, whichever path each message takes). With
 *         its buffer announced, the data goes with fi_writedata (inline when
 *         small); its CQ data {slot, size} completes the receive. Else a small
 *         send goes eager (rd_eager.c) and a large one waits in the comm's
 *         queue, posted by whichever thread reads its announcement.
 *  A send larger than its (announced) buffer is never written: the send fails
 *  as truncated and a TRUNC notice fails the receive the same way.
 *
 * Asked announcements (FABRIC_TAGGED_MAX > 0, the connector's value; rd_tagged.c):
 *  irecv: each buffer is posted as a tagged receive (its connection's data
 *         tag, the domain's sink after it) and announced only when a sender
 *         asks for it.
 *  isend: a message of at most tagged_max bytes is one tagged message into
 *         that receive; a larger one sends a request-to-send (a tagged
 *         message of 0 bytes with remote CQ data), which the receive takes,
 *         and waits for the announcement that answers it, then is written as
 *         above. Tagged matching (FI_ORDER_SAS, first posted receive with the
 *         tag) pairs the k-th send with the k-th buffer, as the ordinal does.
 *
 * Mailbox flow control: the sender consumes announcements in index order,
 * so the receiver's data arrival for buffer j proves every announcement up
 * to j consumed (eager headers and acknowledgements say it otherwise);
 * buffer i is announced only while i < consumed + RD_SLOTS, else it waits in
 * the comm's backlog.
 *
 * Threads: the sender's matching state and the receiver's posting state are
 * kept under the endpoint lock, so whichever thread reads an announcement's
 * completion posts the send waiting for it (a send never depends on its own
 * comm being tested). docs/architecture.md §3 has the whole picture,
 * including why eager and announced messages cannot deadlock.
 */
#ifndef RD_H
#define RD_H

#include <stdio.h>

#include "fab_remote.h"
#include "fab_transport.h"
#include "rd_proto.h"
#include "fab_tagmap.h"

enum { RD_SEND_REQS = FAB_MAX_REQUESTS * FAB_MAX_RECVS, RD_RECV_REQS = 2 * FAB_MAX_REQUESTS };
/* Asked announcements: credits for tagged messages a sender may have sent
 * that its receiver has not taken yet (each may sit in the receiver's
 * provider until its receive is posted, large ones in memory the provider
 * allocates); the receiver gives them back in batches of half. A message
 * takes 1 + its size / RD_TAGGED_CREDIT_BYTES of them, which bounds the
 * bytes waiting too (about RD_TAGGED_CREDITS x RD_TAGGED_CREDIT_BYTES). */
enum { RD_TAGGED_CREDITS = 128, RD_TAGGED_CREDIT_BYTES = 65536 };
static inline uint32_t rd_tagged_weight(size_t len) {
  return 1 + (uint32_t)(len / RD_TAGGED_CREDIT_BYTES);
}
/* Where a send completes once its bytes are in our socket (tcp: the device's
 * writes ask FI_DELIVERY_COMPLETE, which rxm does not pass on for sends), a
 * tagged message of this weight or more (64 KiB) is confirmed: its receiver
 * gives its credits back once it took it (at the end of its burst, below),
 * so that a send comm closed after it has its proof of delivery without
 * asking (rd_tagged_unproven; smaller ones are proven by a delivery probe,
 * fab_delivery.c). */
enum { RD_CONFIRM_WEIGHT = 2 };
/* A confirmation waits for the end of a burst: while another tagged receive
 * is posted, the message that fills it is taken soon, and its credits cover
 * this one's (they come back in order), so one write confirms the whole
 * burst. A receive its sender never fills would hold it, so one owed this
 * long goes at the next test anyway. */
enum { RD_CONFIRM_HOLD_MS = 2 };
static inline int rd_tagged_confirms(const fab_comm* c, uint32_t weight) {
  return weight >= RD_CONFIRM_WEIGHT && (c->ep->dev->write_flags & FI_DELIVERY_COMPLETE);
}
/* A sender that waits for credits holds fewer than its message's weight, so
 * more than RD_TAGGED_CREDITS - weight are on their way: at least half, once
 * the receiver took them, which it then gives back. */
_Static_assert(1 + FAB_PARAM_TAGGED_MAX_MAX / RD_TAGGED_CREDIT_BYTES <= RD_TAGGED_CREDITS / 2 + 1,
               "the heaviest tagged message leaves half the credits to give back");
/* Over a rail with a polling thread, a send above this many bytes may be
 * posted by that thread (rd_send_pump, rd_send_defers); smaller ones go at
 * once. */
enum { RD_HELPED_INLINE_MAX = 16384 };
/* Whether a send of size bytes, its request just handed out and sized, is
 * left to the rail's polling thread: while the thread polls (a large request
 * is live on its endpoint, this send or a receive: NCCL's 512 KiB buffers
 * are), or behind other sends of the comm still in flight (a stream, whose
 * copies the thread then runs beside the caller's). A lone one while the
 * thread sleeps goes at once: leaving it costs the thread's wake-up, which in
 * netbench's 32 KiB ping-pong over four rails was 14.8 us against 11.1 for
 * the caller's post. Inside NCCL, leaving even a lone one to a polling thread
 * was faster at 128-512 KiB (all_reduce and all_gather 0.64-0.78x Socket's
 * time against 0.85-0.94x from the caller): the channels' comms then copy
 * on several threads. */
static inline int rd_send_defers(fab_comm* c, size_t size) {
  if (!c->helped || size <= RD_HELPED_INLINE_MAX) return 0;
  return !fab_ep_helper_small_only(c->ep) || fab_pool_in_use(&c->reqs) > 1;
}
_Static_assert(RD_RECV_REQS * FAB_MAX_RECVS <= RD_SLOTS, "a slot names a request and a buffer; at most RD_SLOTS");
_Static_assert(RD_SLOTS <= RD_ONESIDED_SLOT, "the one-sided slot names no receive");

/* An announcement as the sender keeps it. */
typedef struct rd_ann {
  fab_window win;
  uint32_t index;
  int32_t tag;
  uint32_t k;
  uint16_t slot;
} rd_ann;

/* A send under asked announcements (rd_tagged.c). */
enum {
  RD_TS_NONE = 0,   /* announced at post by its receiver (tagged_max 0) */
  RD_TS_DATA = 1,   /* goes as one tagged message, not posted yet */
  RD_TS_RTS = 2,    /* its request-to-send not posted yet */
  RD_TS_ASKED = 3,  /* request-to-send posted: waits for its announcement */
  RD_TS_MARK = 4,   /* its buffer was announced before it was sent: a mark (a tagged message of 0 bytes)
                     * takes the receive's tagged half, not posted yet; then it is written */
  RD_TS_MARKED = 5, /* mark posted: written as an announced send */
  RD_TS_ABANDON = 6, /* failed before its tagged message went (its buffer deregistered): an abandon message
                      * (0 bytes) still takes its receive, which fails, so the next message meets the next
                      * receive; not posted yet */
};

/* A send whose tagged message (data, request, mark or abandon) is not posted yet: it holds back the later ones. */
static inline int rd_ts_unsent(uint8_t ts) {
  return ts == RD_TS_DATA || ts == RD_TS_RTS || ts == RD_TS_MARK || ts == RD_TS_ABANDON;
}

/* The kind of a sender's tagged message, in its remote CQ data with the
 * announcements it has consumed (mod 2^14): bits 15..14 kind, 13..0 count. */
enum { RD_TAG_DATA = 0, RD_TAG_RTS = 1, RD_TAG_MARK = 2, RD_TAG_ABANDON = 3 };
static inline uint64_t rd_tag_word(unsigned kind, uint32_t consumed) {
  return (uint64_t)kind << 14 | (consumed & 0x3fff);
}

typedef struct rd_sreq {
  fab_op op;
  void* data;
  void* desc;
  rd_ann target;
  uint32_t k;     /* its number among the connection's sends with its tag */
  int matched;
  int eager_slot; /* the staging slot its eager write reads (-1: none) */
  uint8_t host;   /* its buffer is host memory (only such a buffer may be copied into a staging slot) */
  uint8_t ts;     /* RD_TS_*: where it is in the asked-announcement protocol */
  struct fab_mr* held; /* its registration, held while it waits (a deregistration meanwhile fails it) */
  _Atomic uint8_t eager; /* it went eager (profiler events; set by whichever thread posts it) */
} rd_sreq;

/* The sender's state lives under the endpoint lock (see rd_send.c), but for
 * the mailbox itself, which the receiver writes. */
typedef struct rd_scomm {
  rd_ctrl* box; /* RD_SLOTS entries, registered for remote write */
  fab_remote_buf box_mr;
  uint8_t landed[RD_SLOTS];    /* set by CTRL completions, cleared when consumed */
  uint32_t next_index;         /* next announcement to consume */
  uint32_t nann, nwait;
  _Atomic uint32_t nwait_hint; /* nwait, readable without the lock */
  rd_ann ann[RD_SLOTS];        /* announced, unmatched, in index order */
  fab_req* wait[RD_SEND_REQS]; /* sends not posted yet, in order */
  fab_tagmap sent;              /* tag -> sends so far */
  /* eager */
  fab_window ring;             /* the receiver's eager ring (len 0: no eager path) */
  uint32_t slot_size, eager_max;
  uint16_t ring_free;          /* ring slots we may write (credits) */
  _Atomic uint16_t stage_busy; /* staging slots whose write has not completed locally */
  char* stage;                 /* RD_EAGER_SLOTS x slot_size, registered */
  fab_remote_buf stage_mr;
  uint32_t dropped;            /* announcements of eager-served buffers, not acknowledged yet */
  uint32_t acked_sent;         /* consumption last told to the receiver */
  /* asked announcements */
  uint32_t tagged_max;         /* 0: every buffer announced at post */
  uint32_t unsent;             /* waiting sends whose tagged message is not posted yet */
  uint32_t tcredits;           /* tagged messages we may still send before the receiver takes some */
  uint64_t tsent;              /* tagged credits used so far */
} rd_scomm;

/* WAITING: numbered, its announcement not written yet; UNPOSTED, LISTENING:
 * asked announcements, its tagged receive not posted yet, posted. */
/* What a buffer still waits for (rd_rsub.parts): its tagged receive to
 * complete, and its write (or the sender's refusal) to land. It is done when
 * neither is left. */
enum { RD_PART_TAGGED = 1, RD_PART_WRITE = 2 };

enum {
  RD_SUB_IDLE = 0,
  RD_SUB_WAITING = 1,
  RD_SUB_ANNOUNCED = 2,
  RD_SUB_DONE = 3,
  RD_SUB_UNPOSTED = 4,
  RD_SUB_LISTENING = 5,
};

typedef struct rd_rsub rd_rsub;
struct rd_rsub {
  fab_op op;  /* its tagged receive (asked announcements) */
  rd_ctrl ctrl;
  fab_mr* mr; /* its registration, held (fab_mr_hold) until it completes */
  void* data;
  size_t size;
  size_t got;
  uint8_t eager;     /* completed from the eager ring (profiler events) */
  uint8_t via_tag;   /* completed by a tagged message (profiler events) */
  uint8_t parts;     /* RD_PART_* still outstanding (ep lock) */
  _Atomic int state; /* RD_SUB_*; DONE set by the remote-data handler */
};

typedef struct rd_rreq {
  struct rd_rsub sub[FAB_MAX_RECVS];
  _Atomic uint64_t gone_gen; /* fab_mr_generation when its buffers were last checked for deregistration */
} rd_rreq;

typedef struct rd_backlog_entry {
  fab_req* r;
  uint32_t sub;
} rd_backlog_entry;

typedef struct rd_rcomm {
  fab_window box;          /* the sender's mailbox */
  fab_tagmap posted;        /* tag -> buffers so far (ep lock) */
  char* ring;              /* eager ring: RD_EAGER_SLOTS x slot_size, registered for remote write */
  fab_remote_buf ring_mr;
  uint32_t slot_size;      /* 0: no eager path */
  uint8_t asked;           /* buffers are announced when the sender asks (its hello said so) */
  uint8_t ahead;           /* asked: the last message was written (large): announce new buffers at post too */
  uint32_t tagged_max;     /* asked: the sender's FABRIC_TAGGED_MAX */
  uint16_t ring_held;      /* slots holding a message no posted buffer took yet (ep lock) */
  uint16_t credits;        /* slots copied out (asked announcements: tagged messages taken), not returned to
                            * the sender yet (ep lock) */
  _Atomic uint8_t confirm_owed; /* a confirmed tagged message was taken and its credits not given back yet */
  uint32_t listening;      /* asked: tagged receives posted and not completed (ep lock; read unlocked as a hint) */
  int64_t owed_since_ms;   /* when confirm_owed was last set (ep lock; read unlocked as a hint) */
  uint32_t next_index;     /* number of the next announced buffer */
  _Atomic uint32_t acked;  /* announcements proven consumed (handler writes, owner reads) */
  _Atomic uint32_t nbacklog;           /* only the owner adds; owner or handler (lock) removes */
  rd_backlog_entry backlog[RD_SLOTS]; /* buffers not announced yet, in order (ep lock) */
} rd_rcomm;

static inline rd_scomm* rd_s(fab_comm* c) { return fab_comm_tp(c); }
static inline rd_rcomm* rd_r(fab_comm* c) { return fab_comm_tp(c); }
static inline rd_sreq* rd_sq(fab_req* r) { return fab_req_tp(r); }
static inline rd_rreq* rd_rq(fab_req* r) { return fab_req_tp(r); }

/* The source of credit and acknowledgement writes (8 bytes into RD_SCRATCH):
 * they are inline or bounced, so any copy of the word serves. */
static const uint64_t rd_scratch_word = 0;

/* Drives the comm's endpoint (and its home endpoint, for an own one). */
static inline void rd_poll(fab_comm* c) {
  fab_ep_poll(c->ep);
  if (FAB_UNLIKELY(c->home != NULL)) fab_ep_poll(c->home);
}

/* Fails the connection after a peer broke the protocol: one WARN per
 * connection (a flood of garbage logs once). ep lock held. */
static inline void rd_protocol_error(fab_comm* c, const char* what) {
  if (c->error != FAB_OK) return;
  char why[160];
  snprintf(why, sizeof(why), "the peer broke the rdma protocol: %s", what);
  FAB_WARN("connection to %s failed: %s; nothing was written outside a registered buffer. Check that both ranks run "
           "the same plugin build", c->peer_name, why);
  fab_comm_fail(c, FAB_ERR_REMOTE, why);
}

/* rd_send.c */
fab_result rd_isend(fab_comm* c, void* data, size_t size, int tag, fab_mr* mr, void** request);
void rd_send_progress(fab_comm* c);
void rd_send_pump(fab_comm* c); /* on a rail's polling thread; ep lock held */
void rd_send_landed(fab_comm* c, uint32_t low); /* a CTRL completion (entry, credits); ep lock held */
void rd_send_cancel(fab_comm* c);
void rd_send_give_up(fab_req* r);
void rd_send_init_req(fab_comm* c, fab_req* r);

/* rd_eager.c */
fab_result rd_eager_recv_init(fab_comm* c);
void rd_eager_fini(fab_comm* c);
size_t rd_eager_welcome(fab_comm* c, void* out, size_t cap);
fab_result rd_eager_connected(fab_comm* c, const void* in, size_t len);
/* Sender, ep lock held: writes r into a free ring slot; 0 when it went,
 * -FI_EAGAIN when no slot or the provider is busy. */
ssize_t rd_eager_post(fab_comm* c, fab_req* r);
/* Sender, ep lock held: credits returned. */
void rd_eager_credits(fab_comm* c, uint16_t slots);
/* Sender, ep lock held: tells the receiver how far its announcements were
 * consumed when eager-served ones were dropped (mailbox flow control). */
void rd_eager_ack_if_due(fab_comm* c);

/* rd_tagged.c: asked announcements */
/* Sender, ep lock held: posts r's tagged message, using a credit: 0 (its
 * data: its completion ends r), 1 (its request-to-send: r now waits for its
 * announcement; its mark: r is written next; its abandon message: r fails),
 * RD_WENT_INLINE (its data went inline: r is done with, nothing completes
 * it), -FI_EAGAIN (no credit, or the provider is busy), or another provider
 * error. */
enum { RD_WENT_INLINE = 2 };
ssize_t rd_tagged_send(fab_comm* c, fab_req* r);
/* Receiver, ep lock held: posts buffer b's tagged receive: 0, -FI_EAGAIN or an error. */
ssize_t rd_tagged_listen(fab_comm* c, rd_rsub* b);
/* Receiver, ep lock held: takes back a posted tagged receive (its
 * cancellation completes it). */
void rd_tagged_unlisten(fab_comm* c, rd_rsub* b);
/* Receiver, ep lock held: a tagged message of len bytes took a receive; its
 * credits go back with the next announcement, or on their own with half the
 * others. */
void rd_tagged_taken(fab_comm* c, size_t len);
/* Sender, ep lock held: the receiver gave back n credits of messages taken. */
void rd_tagged_credits(fab_comm* c, uint32_t n);
/* Sender, ep lock held (a closed comm): tagged messages sent so far while
 * over kernel sockets the receiver has not given back every credit, else 0
 * (fab_transport_ops.unproven). */
uint64_t rd_tagged_unproven(fab_comm* c);
/* Receiver, ep lock held: gives taken messages back once half the credits
 * wait, or once a confirmation is due (rd_tagged_confirm_due). */
void rd_tagged_give_back(fab_comm* c);
/* Receiver, any thread (a hint without the lock): a confirmed message was
 * taken, and no other tagged receive is posted or it was taken
 * RD_CONFIRM_HOLD_MS ago. */
int rd_tagged_confirm_due(fab_comm* c);
/* Receiver closing, ep lock held: confirms the messages it took whatever
 * receives were still posted (their sender may be closed, waiting for proof
 * of delivery). */
void rd_tagged_confirm_at_close(fab_comm* c);

/* rd_recv.c */
/* ep lock held: numbers buffer b of r and announces it, or backlogs it. */
ssize_t rd_recv_announce(fab_comm* c, fab_req* r, uint32_t sub);
void rd_recv_announce_failed(fab_comm* c, ssize_t n);
void rd_recv_init_req(fab_comm* c, fab_req* r);
/* ep lock held: completes buffer b of r with size bytes (copied from src
 * when src is not NULL) or as truncated. */
void rd_recv_complete(fab_comm* c, fab_req* r, struct rd_rsub* b, const void* src, uint32_t size);
/* ep lock held: the open (posted, not complete) buffer with (tag, k). */
struct rd_rsub* rd_recv_find_open(fab_comm* c, int32_t tag, uint32_t k, fab_req** r);
void rd_recv_acked(fab_comm* c, uint32_t consumed);
/* ep lock held: an EAGER completion (a message in ring slot `slot`, or an
 * acknowledgement). */
void rd_recv_eager_landed(fab_comm* c, uint32_t slot, uint32_t size);
/* test of r: fails its buffers whose registration was deregistered meanwhile. */
void rd_recv_check_gone(fab_comm* c, fab_req* r);
/* comm free: the buffers let go of their registrations. */
void rd_recv_release(fab_comm* c);
/* comm free: its waiting sends let go of their registrations. */
void rd_send_release(fab_comm* c);
fab_result rd_irecv(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, fab_mr** mrs,
                    void** request);
void rd_recv_progress(fab_comm* c);
void rd_recv_landed(fab_comm* c, unsigned type, uint32_t slot, uint32_t size); /* ep lock held */
void rd_recv_cancel(fab_comm* c);
void rd_recv_give_up(fab_req* r);

#endif /* RD_H */
