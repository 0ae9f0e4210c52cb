/*
 * The rdma transport's wire format: the announcements a receiver writes into
 * its sender's mailbox and the 64 bits of remote CQ data that tell the target
 * what each write was. Everything read from a peer is validated before use.
 */
#ifndef RD_PROTO_H
#define RD_PROTO_H

#include <stdint.h>

#include "fab_core.h"

enum {
  RD_SLOTS = 512,       /* mailbox entries: recv requests x FAB_MAX_RECVS */
  RD_EAGER_SLOTS = 16,  /* eager ring slots per recv comm (a 16-bit credit map) */
  RD_NO_ENTRY = 0xffff, /* CTRL: credits only, no announcement */
  RD_ACK_SLOT = 0x3ff,  /* EAGER: an acknowledgement, no message */
  RD_ONESIDED_SLOT = 0x3fe, /* DATA: a one-sided write of a group (core/fab_coll.h); the low
                             * bits are that engine's */
  RD_SCRATCH = 64,      /* bytes past the mailbox and the ring that credit and acknowledgement
                         * writes land in (8 bytes each: 0-byte RMA writes crashed rxm's target
                         * side intermittently) */
};

/* One announced receive buffer (receiver -> sender mailbox, one inline
 * write into mailbox entry index % RD_SLOTS). */
typedef struct rd_ctrl {
  uint64_t addr;      /* where the data goes, as the receiver's provider addresses it */
  uint64_t key;
  uint64_t size;      /* posted size */
  uint32_t index;     /* the buffer's number among announced ones, in posting order */
  int32_t tag;
  uint32_t k;         /* the buffer's number among this connection's buffers with this tag */
  uint16_t slot;      /* (request << 3 | buffer): echoed in the data's CQ data */
  uint16_t reserved;
  uint32_t check;     /* index ^ k ^ RD_CTRL_MAGIC: the entry is the one the CQ data names */
  uint32_t reserved2;
} rd_ctrl;
_Static_assert(sizeof(rd_ctrl) == 48, "rd_ctrl layout");

/* The header of an eager slot; the payload follows it. */
typedef struct rd_eager_hdr {
  int32_t tag;
  uint32_t k;        /* the send's number among this connection's sends with this tag */
  uint32_t size;
  uint32_t consumed; /* announcements the sender has consumed (mailbox flow control) */
  uint32_t check;    /* tag ^ k ^ size ^ consumed ^ RD_EAGER_MAGIC */
  uint32_t reserved[3];
} rd_eager_hdr;
_Static_assert(sizeof(rd_eager_hdr) == 32, "rd_eager_hdr layout");

#define RD_EAGER_MAGIC 0x45445246u /* "FRDE" */

static inline uint32_t rd_eager_check(const rd_eager_hdr* h) {
  return (uint32_t)h->tag ^ h->k ^ h->size ^ h->consumed ^ RD_EAGER_MAGIC;
}

#define RD_CTRL_MAGIC 0x43445246u /* "FRDC" */

/* Remote CQ data, 64 bits:
 *   63..62 type   61..52 slot   51..32 target comm id   31..0 size / mailbox entry
 * CTRL:  an announcement landed in the mailbox entry named by low bits 0..15
 *        (RD_NO_ENTRY: none); bits 16..31 return eager ring slots (credits)
 * DATA:  size bytes landed in the receive buffer named by slot
 * EAGER: a message of size bytes landed in eager ring slot `slot`; slot
 *        RD_ACK_SLOT: no message, the low bits say how many announcements
 *        the sender has consumed
 *        (slot RD_ONESIDED_SLOT: a one-sided engine's write, handed to the
 *        comm's onesided handler with the low bits)
 * TRUNC: the sender refused to write size bytes into the buffer named by slot
 *        (larger than the buffer): that receive fails as truncated; size 0
 *        (which fits any buffer): ABANDONED, the sender gave that message up
 *        before writing it (its buffer was deregistered): the receive fails */
enum { RD_CTRL = 0, RD_DATA = 1, RD_EAGER = 2, RD_TRUNC = 3 };
enum { RD_ID_MAX = (1u << 20) - 1 };

static inline uint64_t rd_cq_data(unsigned type, uint32_t comm_id, uint32_t slot, uint32_t low) {
  return (uint64_t)type << 62 | (uint64_t)(slot & 0x3ff) << 52 | (uint64_t)(comm_id & RD_ID_MAX) << 32 | low;
}
static inline unsigned rd_cq_type(uint64_t d) { return (unsigned)(d >> 62); }
static inline uint32_t rd_cq_slot(uint64_t d) { return (uint32_t)(d >> 52) & 0x3ff; }
static inline uint32_t rd_cq_comm(uint64_t d) { return (uint32_t)(d >> 32) & RD_ID_MAX; }
static inline uint32_t rd_cq_low(uint64_t d) { return (uint32_t)d; }

/* The connector's handshake payload: where announcements go. */
typedef struct rd_hello {
  uint64_t box_addr, box_key;
  uint32_t box_slots;
  uint32_t reserved;
} rd_hello;

/* The listener's answer payload: where eager messages go. */
typedef struct rd_welcome {
  uint64_t ring_addr, ring_key;
  uint32_t ring_slots; /* RD_EAGER_SLOTS, or 0: no eager path */
  uint32_t slot_size;  /* bytes per slot, header included */
} rd_welcome;

#endif /* RD_PROTO_H */
