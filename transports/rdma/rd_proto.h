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
  RD_EAGER_SLOTS = 14,  /* eager ring slots per recv comm (a credit map that fits the narrow format) */
  RD_NO_ENTRY = 0xffff, /* CTRL: credits only, no announcement */
  RD_ACK_SLOT = 0x3ff,  /* EAGER: an acknowledgement, no message */
  RD_ONESIDED_SLOT = 0x3fe, /* DATA: a one-sided write of a group (core/onesided/fab_group.h); the low
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
  uint16_t credits;   /* eager ring slots given back with this announcement (a bit each) */
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

/* What a write's remote CQ data means, as the code handles it (the logical
 * word, 64 bits):
 *   63..62 type   61..52 slot   51..32 target comm id   31..0 low
 * CTRL:  an announcement landed in the mailbox entry named by low bits 0..15
 *        (its credits ride in the entry); RD_NO_ENTRY: none, bits 16..31
 *        return eager ring slots (credits)
 * DATA:  size bytes landed in the receive buffer named by slot
 * EAGER: a message of size bytes landed in eager ring slot `slot`; slot
 *        RD_ACK_SLOT: no message, the low 14 bits are how many announcements
 *        the sender has consumed (mod 2^14: the receiver widens them against
 *        its own count, at most RD_SLOTS apart)
 *        (slot RD_ONESIDED_SLOT: a one-sided engine's write, handed to the
 *        comm's onesided handler with the low bits: kind << 28 | an 11-bit value)
 * TRUNC: the sender refused to write size bytes into the buffer named by slot
 *        (larger than the buffer; RD_SIZE_UNKNOWN where the format does not
 *        carry it): that receive fails as truncated; size 0 (which fits any
 *        buffer): ABANDONED, the sender gave that message up before writing
 *        it (its buffer was deregistered): the receive fails
 *
 * On the wire it is that word itself where the provider carries 8 bytes of
 * CQ data (tcp, shm), and the narrow format where it carries 4 (EFA; verbs,
 * whose immediate data is 32 bits):
 *   31..30 type   29..15 target comm id (15 bits)   14..0 field; bit 14 "flag"
 * CTRL:  flag: mailbox entry in bits 13..0 (under RD_SLOTS); else credits in bits 13..0
 * DATA:  flag: one-sided, kind in bits 13..11, value in bits 10..0;
 *        else slot in bits 9..0, and the size is the completion's length
 * EAGER: flag: RD_ACK_SLOT, consumed announcements mod 2^14;
 *        else ring slot in bits 3..0, the size is the length less the header
 * TRUNC: flag: ABANDONED; slot in bits 9..0 (the refused size is not carried)
 * The narrow format needs providers that report a remote write's length (EFA,
 * verbs and shm do; libfabric 1.x's tcp does not) and connection ids under
 * 2^15 (fab_transport_needs.conn_max_narrow). */
enum { RD_CTRL = 0, RD_DATA = 1, RD_EAGER = 2, RD_TRUNC = 3 };
enum { RD_ID_MAX = (1u << 20) - 1 };
enum { RD_NARROW_ID_MAX = (1u << 15) - 1, RD_NARROW_FLAG = 1u << 14, RD_ACK_MASK = 0x3fff };
#define RD_SIZE_UNKNOWN 0xffffffffu

static inline uint64_t rd_cq_word(unsigned type, uint32_t comm_id, uint32_t slot, uint32_t low) {
  return (uint64_t)type << 62 | (uint64_t)(slot & 0x3ff) << 52 | (uint64_t)(comm_id & RD_ID_MAX) << 32 | low;
}
static inline unsigned rd_cq_type(uint64_t d) { return (unsigned)(d >> 62); }
static inline uint32_t rd_cq_slot(uint64_t d) { return (uint32_t)(d >> 52) & 0x3ff; }
static inline uint32_t rd_cq_comm(uint64_t d) { return (uint32_t)(d >> 32) & RD_ID_MAX; }
static inline uint32_t rd_cq_low(uint64_t d) { return (uint32_t)d; }

/* The narrow format's field for a logical word. */
static inline uint32_t rd_narrow_field(uint64_t d) {
  uint32_t slot = rd_cq_slot(d), low = rd_cq_low(d);
  switch (rd_cq_type(d)) {
    case RD_CTRL:
      if ((low & 0xffff) != RD_NO_ENTRY) return RD_NARROW_FLAG | (low & 0x3fff); /* the receiver checks the range */
      return (low >> 16) & 0x3fff;
    case RD_DATA:
      if (slot == RD_ONESIDED_SLOT) return RD_NARROW_FLAG | (low >> 28 & 7) << 11 | (low & 0x7ff);
      return slot;
    case RD_EAGER:
      return slot == RD_ACK_SLOT ? RD_NARROW_FLAG | (low & RD_ACK_MASK) : slot;
    default:
      return (low == 0 ? RD_NARROW_FLAG : 0) | slot;
  }
}

/* What goes on the wire for logical word d: narrow where the provider
 * carries 4 bytes. */
static inline uint64_t rd_cq_wire(int narrow, uint64_t d) {
  if (!narrow) return d;
  return (uint64_t)rd_cq_type(d) << 30 | (uint64_t)(rd_cq_comm(d) & RD_NARROW_ID_MAX) << 15 | rd_narrow_field(d);
}

/* Bytes of CQ data comm c's device carries. */
#define rd_cq_bytes(c) ((c)->ep->dev->cq_narrow ? 4u : 8u)

/* The wire word for comm c's peer (c's device decides the format). */
#define rd_cq_data(c, type, slot, low) \
  rd_cq_wire((c)->ep->dev->cq_narrow, rd_cq_word((type), (c)->peer_id, (slot), (low)))

/* The logical word of a narrow completion (its CQ data w, its length len):
 * 0, or -1 when no writer of ours could have sent it. */
static inline int rd_cq_widen(uint64_t w, uint64_t len, uint64_t* out) {
  if (w >> 32 || len > 0xffffffffu) return -1;
  unsigned type = (unsigned)(w >> 30);
  uint32_t id = (uint32_t)(w >> 15) & RD_NARROW_ID_MAX, f = (uint32_t)w & 0x7fff, flag = f & RD_NARROW_FLAG;
  uint32_t slot = 0, low;
  switch (type) {
    case RD_CTRL:
      low = flag ? (f & 0x3fff) : RD_NO_ENTRY | (f & 0x3fff) << 16;
      break;
    case RD_DATA:
      if (flag) slot = RD_ONESIDED_SLOT, low = (f >> 11 & 7) << 28 | (f & 0x7ff);
      else if (f > 0x3ff) return -1;
      else slot = f, low = (uint32_t)len;
      break;
    case RD_EAGER:
      if (flag) slot = RD_ACK_SLOT, low = f & RD_ACK_MASK;
      else if (f > 0x3ff || len < sizeof(rd_eager_hdr)) return -1;
      else slot = f, low = (uint32_t)(len - sizeof(rd_eager_hdr));
      break;
    default:
      if ((f & 0x3fff) > 0x3ff) return -1;
      slot = f & 0x3ff, low = flag ? 0 : RD_SIZE_UNKNOWN;
  }
  *out = rd_cq_word(type, id, slot, low);
  return 0;
}

/* A count the peer sent mod 2^14, widened against ours: base + a signed
 * 14-bit step (the two are never 2^13 apart). */
static inline uint32_t rd_widen_count(uint32_t v, uint32_t base) {
  uint32_t d = (v - base) & RD_ACK_MASK;
  return base + (d & 0x2000 ? d - 0x4000 : d);
}

/* The connector's handshake payload: where announcements go. */
typedef struct rd_hello {
  uint64_t box_addr, box_key;
  uint32_t box_slots;
  uint32_t cq_bytes; /* the connector's CQ data format: 8, or 4 (narrow); both ends must agree */
  uint32_t tagged_max; /* the connector's FABRIC_TAGGED_MAX: > 0, its receiver announces buffers when asked */
  uint32_t reserved;
} rd_hello;

/* The listener's answer payload: where eager messages go. */
typedef struct rd_welcome {
  uint64_t ring_addr, ring_key;
  uint32_t ring_slots; /* RD_EAGER_SLOTS, or 0: no eager path */
  uint32_t slot_size;  /* bytes per slot, header included */
} rd_welcome;

#endif /* RD_PROTO_H */
