/*
 * Everything that crosses process boundaries: the 128-byte connection handle
 * NCCL carries from the listener to the connector, the two handshake
 * messages, and the 64-bit tag layout. Every field read from a peer is
 * validated here (magic, version, lengths, checksum) before anyone uses it.
 *
 * Byte order is the host's: both ends run the same build on little-endian
 * hosts (x86-64, aarch64).
 */
#ifndef FAB_WIRE_H
#define FAB_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "fab_core.h"

enum {
  FAB_WIRE_VERSION = 9, /* 2: connect requests and probes untagged; 3: transport id and payload; 4: window
                         * offers, and a handle checked over the bytes in use only; 5: rails; 6: stripes;
                         * 7: truncation notices (FAB_NOTE_TRUNCATED); 8: tagged credits weighed by size;
                         * 9: delivery probes and their answers (FAB_NOTE_DELIVERY_*) */
  FAB_ADDR_MAX = 104, /* endpoint address bytes that fit in the handle */
  FAB_HANDLE_HEADER = 24, /* the handle's bytes before its address */
  FAB_HANDLE_SIZE_V4 = 64, /* what a 64-byte ABI (Neuron v4) carries of the handle */
  FAB_MAX_RAILS = 8,       /* rails of one connection: the members of a virtual device */
  FAB_STRIPE_MIN = 4096,   /* the smallest stripe threshold (FABRIC_STRIPE_THRESHOLD) */
};

#define FAB_HANDLE_MAGIC 0x48424146u  /* "FABH" */
#define FAB_CONNECT_MAGIC 0x51424146u /* "FABQ" */
#define FAB_ACCEPT_MAGIC 0x52424146u  /* "FABR" */

/* The listen handle: at most FAB_HANDLE_SIZE bytes, of which the header and
 * the address are in use. Only those are read, checked (the checksum covers
 * them) and compared: an ABI whose handle is shorter (Neuron v4: 64 bytes)
 * carries them when the address fits. */
typedef struct fab_wire_handle {
  uint32_t magic;
  uint16_t version;
  uint16_t addr_len;  /* bytes of addr in use; the rest is zero */
  uint64_t listen_id; /* random; names the listen comm on its endpoint */
  uint32_t prov_hash; /* provider identity: catches a tcp handle given to shm */
  uint32_t checksum;  /* CRC-32C of the whole handle with this field zero */
  uint8_t addr[FAB_ADDR_MAX];
} fab_wire_handle;

/* The transport's share of a handshake message: which transport the sender
 * runs, the sender's comm id on its endpoint, and up to FAB_TP_MAX bytes the
 * transport defines (and validates). */
enum { FAB_TP_MAX = 48 };
typedef struct fab_wire_tp {
  uint32_t comm_id;
  uint8_t transport;
  uint8_t len;
  uint16_t reserved;
  uint8_t data[FAB_TP_MAX];
} fab_wire_tp;

/* Connect request, connector -> listener: an untagged message (see tags).
 * A connection over several rails (a virtual device, fab_rails.c) is one
 * connection per rail; each request says how many rails the connector's
 * device has and which one this is, and the listener refuses a count or a
 * rail that differs from its own. */
typedef struct fab_wire_connect {
  uint32_t magic;
  uint16_t version;
  uint16_t addr_len;
  uint64_t listen_id;    /* from the handle */
  uint32_t connector_id; /* where the answer goes: tag fab_tag_accept(connector_id) */
  uint32_t checksum;
  uint8_t rails;         /* 1..FAB_MAX_RAILS */
  uint8_t rail;          /* 0..rails-1 */
  uint8_t reserved[2];
  uint32_t stripe_from;  /* rails > 1: the connector splits messages of at least this many bytes over the
                          * rails (fab_rails_stripe.c); 0: never */
  uint8_t addr[FAB_ADDR_MAX]; /* the connector's endpoint address */
  fab_wire_tp tp;
} fab_wire_connect;

enum {
  FAB_ACCEPT_OK = 0,
  FAB_ACCEPT_NO_LISTENER = 1,
  FAB_ACCEPT_BAD_ADDRESS = 2,
  FAB_ACCEPT_TRANSPORT = 3,   /* the listener runs another transport */
  FAB_ACCEPT_BAD_PAYLOAD = 4, /* the listener's transport refused the connector's data */
  FAB_ACCEPT_RAILS = 5,       /* the listener takes no such rail (earlier builds: another number of rails) */
};

/* Answer, listener -> connector. The answer of rail 0 of a connection over
 * rails > 1 is followed by rails - 1 listen handles (fab_wire_handle, each
 * with its own checksum): where the connector connects rails 1.. next. */
typedef struct fab_wire_accept {
  uint32_t magic;
  uint16_t version;
  uint16_t status; /* FAB_ACCEPT_* */
  uint64_t listen_id;
  uint32_t connector_id;
  uint32_t conn_id; /* receiver-assigned connection id: the tag prefix of the data */
  uint32_t checksum;
  uint8_t rails;    /* the listener's rails */
  uint8_t rail;
  uint16_t reserved;
  fab_wire_tp tp;
} fab_wire_accept;

/* The largest answer: rail 0's with the handles of the other rails. */
#define FAB_ACCEPT_MAX (sizeof(fab_wire_accept) + (FAB_MAX_RAILS - 1) * FAB_HANDLE_SIZE)

/* A window offer, either end of a connection -> the other: an untagged
 * message like a connect request, into the same receives. It names the
 * receiving comm by (target_id, source_id, conn_id), all three known to both
 * ends from the handshake, and says that memory [va, va + len) of the sender,
 * reachable at provider address addr with key, may be written and read
 * through this connection (FAB_WINDOW_ADD) or no longer (FAB_WINDOW_REMOVE,
 * by id; va carries the withdrawal's number). FAB_WINDOW_ACK answers a
 * withdrawal (va: its number) once no operation of the answering end into the
 * window is in flight. Ordered with the sender's other messages
 * (FI_ORDER_SAS). The same message carries the connection's notices that
 * are not about windows: FAB_NOTE_TRUNCATED, from a recv comm to its peer's
 * send comm, says a message (tag in id) was larger than its receive (va: the
 * receive's bytes; len: the bytes over, 0 when unknown).
 * FAB_NOTE_DELIVERY_PROBE, from a closed send comm to its peer's recv comm,
 * asks for proof that its earlier messages left the connection (id: how
 * many the sender had sent); FAB_NOTE_DELIVERY_ANSWER returns that id once
 * the probe was read, so after every byte before it, or all ones when the
 * recv comm closed (fab_delivery.c). */
#define FAB_WINDOW_MAGIC 0x57424146u /* "FABW" */
enum {
  FAB_WINDOW_ADD = 1,
  FAB_WINDOW_REMOVE = 2,
  FAB_WINDOW_ACK = 3,
  FAB_NOTE_TRUNCATED = 4,
  FAB_NOTE_DELIVERY_PROBE = 5,
  FAB_NOTE_DELIVERY_ANSWER = 6,
};
typedef struct fab_wire_window {
  uint32_t magic;
  uint16_t version;
  uint16_t op;        /* FAB_WINDOW_* */
  uint32_t target_id; /* the receiving comm's id on its endpoint */
  uint32_t source_id; /* the sending comm's id on its endpoint */
  uint32_t conn_id;   /* the connection's id (assigned by its receiving end) */
  uint32_t checksum;
  uint64_t id;        /* the window's number among the sender's offers on this connection */
  uint64_t va;        /* the sender's virtual address of the window */
  uint64_t addr;      /* the same as the sender's provider addresses it (va, or 0: offsets) */
  uint64_t len;
  uint64_t key;
} fab_wire_window;

_Static_assert(sizeof(fab_wire_handle) == FAB_HANDLE_SIZE, "handle must be exactly 128 bytes");
_Static_assert(offsetof(fab_wire_handle, addr) == FAB_HANDLE_HEADER, "handle header layout");
_Static_assert(sizeof(fab_wire_window) == 64, "window offer layout");
_Static_assert(sizeof(fab_wire_window) <= sizeof(fab_wire_connect), "a window offer fits a connect-request receive");
_Static_assert(sizeof(fab_wire_tp) == 56, "transport payload layout");
_Static_assert(sizeof(fab_wire_connect) == 192, "connect message layout");
_Static_assert(offsetof(fab_wire_connect, stripe_from) == 28, "connect message layout");
_Static_assert(sizeof(fab_wire_accept) == 88, "accept message layout");

/* Writes a handle into cap bytes (FAB_HANDLE_SIZE at most; the bytes after
 * the address are zeroed). Returns -1 when addr_len does not fit. */
int fab_wire_handle_encode(void* buf, size_t cap, uint64_t listen_id, uint32_t prov_hash, const void* addr,
                           size_t addr_len);
/* Validates a handle handed over, reading only the bytes in use; on failure
 * writes the reason (for the WARN) and returns -1. */
int fab_wire_handle_decode(const void* buf, fab_wire_handle* out, char* why, size_t why_len);
/* The bytes of a handle in use (what its header says, FAB_HANDLE_SIZE at
 * most): what a connector copies and compares. */
size_t fab_wire_handle_used(const void* buf);

void fab_wire_connect_encode(fab_wire_connect* m, uint64_t listen_id, uint32_t connector_id, const void* addr,
                             size_t addr_len, const fab_wire_tp* tp, int rails, int rail, uint32_t stripe_from);
int fab_wire_connect_decode(const void* buf, size_t len, fab_wire_connect* out, char* why, size_t why_len);

/* tp may be NULL (a refusal). */
void fab_wire_accept_encode(fab_wire_accept* m, uint16_t status, uint64_t listen_id, uint32_t connector_id,
                            uint32_t conn_id, const fab_wire_tp* tp, int rails, int rail);
/* The answer's length: with the other rails' handles after it on rail 0. */
size_t fab_wire_accept_len(const fab_wire_accept* m);
/* Checks len against what the answer says follows it (the handles are
 * checked when decoded, fab_wire_handle_decode). */
int fab_wire_accept_decode(const void* buf, size_t len, fab_wire_accept* out, char* why, size_t why_len);

const char* fab_wire_status_str(unsigned status);

void fab_wire_window_encode(fab_wire_window* m, uint16_t op, uint32_t target_id, uint32_t source_id, uint32_t conn_id,
                            uint64_t id, uint64_t va, uint64_t addr, uint64_t len, uint64_t key);
int fab_wire_window_decode(const void* buf, size_t len, fab_wire_window* out, char* why, size_t why_len);
/* The magic of len received bytes (0 when fewer than 4). */
uint32_t fab_wire_magic(const void* buf, size_t len);

/* --- tags ------------------------------------------------------------------
 * Connect requests and liveness probes are untagged messages (fi_send into
 * the endpoint's posted fi_recv buffers): they never sit in the tagged
 * receive queue, which providers search linearly for every arriving data
 * message. Tagged are the data and the connect answers.
 *
 * 64-bit tag, high to low, for a provider with B usable tag bits:
 *   bit B-1        control (handshake) message
 *   bit B-2        (control only) the message is an answer
 *   bits 32..B-3   (data) connection id assigned by the receiver, >= 1
 *   bits 0..31     (data) NCCL's tag; (answer) the connector id
 * A data tag never has the control bit, and its connection id is never 0, so
 * data and handshake traffic cannot match each other. */
typedef struct fab_tag_layout {
  int bits;          /* usable tag bits B */
  uint64_t ctrl;     /* 1 << (B-1) */
  uint64_t answer;   /* 1 << (B-2) */
  uint32_t conn_max; /* largest connection id: 2^(B-34) - 1 */
} fab_tag_layout;

enum { FAB_TAG_MIN_CONN_BITS = 8 };

/* Fills the layout from the provider's mem_tag_format; -1 when it has fewer
 * than 34 + FAB_TAG_MIN_CONN_BITS usable bits. */
int fab_tag_layout_init(fab_tag_layout* t, uint64_t mem_tag_format);

static inline uint64_t fab_tag_data(uint32_t conn_id, int tag) {
  return ((uint64_t)conn_id << 32) | (uint32_t)tag;
}
static inline uint64_t fab_tag_accept(const fab_tag_layout* t, uint32_t connector_id) {
  return t->ctrl | t->answer | connector_id;
}

#endif /* FAB_WIRE_H */
