/*
 * One-sided calls on a point-to-point connection (Neuron's getMrKey, iwrite,
 * iwriteInline, iread; core/onesided/fab_p2p_rma.c): the state a comm keeps for them.
 *
 * Each end offers the other the windows it registers on the connection
 * (fab_wire_window messages, sent by fab_p2p_rma.c, applied here by the
 * control receive path under the endpoint lock). A one-sided call names a
 * peer window only by the key and address the runtime got from the peer; it
 * is posted only when [address, address + size) lies inside a window the peer
 * offered on this very connection and has not withdrawn. Nothing else decides
 * where we write or read.
 */
#ifndef FAB_PWIN_H
#define FAB_PWIN_H

#include "fab_engine.h"
#include "fab_remote.h"
#include "fab_wire.h"

enum {
  FAB_OS_REQS = 256,        /* one-sided requests in flight per comm (beyond: NULL request, retry) */
  FAB_OFFER_WAIT_MS = 5000, /* an unknown key is retried this long: the peer's offer may still be on its way */
  FAB_PWIN_GONE = 64,       /* withdrawn keys remembered, to refuse them at once and say why */
  FAB_PWIN_HELD = 4096,     /* window messages held for a connect that has not read its answer yet */
};

/* What fab_pwin_find knows of a key it found no window for. */
enum { FAB_KEY_UNKNOWN = 0, FAB_KEY_OUT_OF_RANGE = 1, FAB_KEY_WITHDRAWN = 2 };

/* A window the peer offered us. */
typedef struct fab_pwin_entry {
  uint64_t id;
  uint64_t va;    /* the peer's virtual address: what the runtime names */
  fab_window win; /* as the peer's provider addresses it */
} fab_pwin_entry;

/* A Neuron iwrite or iread: a request of kind fab_osreq_kind (fab_reqhead.h). */
typedef struct fab_osreq {
  fab_req_head head;
  uint8_t is_read;
  fab_comm* comm;
  _Atomic int pending; /* the posted operation has not completed */
  fab_result result;
  size_t size;
  char why[320];
  fab_op op;
} fab_osreq;

typedef struct fab_pwin {
  fab_pwin_entry* peer; /* sorted by nothing; few per connection (ep lock) */
  size_t npeer, cap_peer;
  uint64_t gone[FAB_PWIN_GONE]; /* keys of windows the peer withdrew, the newest last (ep lock) */
  uint32_t ngone;
  uint64_t next_id;     /* our offers' ids */
  fab_wire_window* held; /* messages that came before the answer to our connect (fab_pwin_hold) */
  size_t nheld, cap_held;
  uint32_t held_dropped;  /* beyond FAB_PWIN_HELD: dropped, the first with a WARN */
  /* withdrawals (ep lock): ours, numbered, each answered once the peer has
   * nothing in flight into the window; the peer's, answered the same way */
  uint64_t withdrawals, withdrawals_acked;
  uint64_t ack_owed;    /* the peer's newest withdrawal not answered yet (0: none) */
  uint32_t ops_inflight; /* our one-sided operations posted and not completed */
  int64_t unknown_since_ms; /* the first retry of a key we do not know yet (owner thread) */
  fab_osreq reqs[FAB_OS_REQS];
} fab_pwin;

/* c's one-sided state, made on first use (in request memory: it holds the
 * requests); NULL when out of memory. ep lock held. */
fab_pwin* fab_pwin_get(fab_comm* c);
/* c's one-sided state if it has any (its FAB_EXT_PWIN slot, freed with c). */
static inline fab_pwin* fab_pwin_of(const fab_comm* c) { return fab_comm_ext_get(c, FAB_EXT_PWIN); }

/* A message m from c's peer, validated on the wire: a window added or
 * withdrawn (answered once our operations in flight are done), or the answer
 * to one of our withdrawals. ep lock held. */
void fab_pwin_apply(fab_comm* c, const fab_wire_window* m);
/* One of c's one-sided operations completed: a withdrawal waiting for our
 * operations to drain is answered. ep lock held. */
void fab_pwin_op_done(fab_comm* c);
/* A window message for send comm c that came before the answer to its
 * connect (both in one poll): kept until the answer names the peer's comm,
 * in order, at most FAB_PWIN_HELD of them. ep lock held. */
void fab_pwin_hold(fab_comm* c, const fab_wire_window* m);
/* c's connect read the answer: the held messages that name c's connection
 * are applied, in the order they came, the others dropped. ep lock held. */
void fab_pwin_release_held(fab_comm* c);
/* Sends a window message to c's peer. ep lock held. */
int fab_pwin_send(fab_comm* c, uint16_t op, uint64_t id, uint64_t va, uint64_t addr, uint64_t len, uint64_t key);
/* The peer window with key that holds [va, va + len), or NULL with *why
 * (FAB_KEY_*) saying what is known of the key. ep lock held. */
const fab_pwin_entry* fab_pwin_find(const fab_pwin* p, uint64_t key, uint64_t va, uint64_t len, int* why);

/* The kind of one-sided requests: the API's test reaches them through it. */
extern const fab_req_kind fab_osreq_kind;

#endif /* FAB_PWIN_H */
