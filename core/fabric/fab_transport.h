/*
 * The transport interface: how data moves once a connection exists. The core
 * owns devices, endpoints, the handshake, memory registration, the request
 * lifecycle and comm lifetime; a transport owns its data operations, its
 * share of the handshake, and private areas in its comms and requests.
 *
 * A transport declares what it needs from a provider (fab_transport_needs);
 * discovery asks libfabric for exactly that and gives each device the first
 * transport, in order of preference and as FABRIC_TRANSPORT allows, that its
 * provider entry can run. The choice is carried in the handshake: both ends
 * of a connection must run the same transport.
 *
 * The core validates every argument before calling a transport: comms are
 * live and of the right kind, n is in range, sizes fit max_bytes, memory
 * handles are resolved. Transports see only valid input.
 */
#ifndef FAB_TRANSPORT_H
#define FAB_TRANSPORT_H

#include "fab_engine.h"
#include "fab_mr.h"
#include "fab_req.h"

enum { FAB_TRANSPORT_SENDRECV = 1, FAB_TRANSPORT_RDMA = 2 }; /* ids on the wire */

typedef struct fab_transport_needs {
  uint64_t caps;         /* capability bits asked of fi_getinfo (primary caps) */
  uint64_t msg_order;    /* ordering bits asked of tx and rx */
  uint64_t mr_access;    /* access flags of every registration */
  size_t cq_data_size;   /* fewest bytes of remote CQ data it can work with (0: none) */
  uint32_t conn_max_narrow; /* with fewer than 8 bytes of CQ data: the largest connection id it can name, and
                             * it needs the provider to report a remote write's length (0: no such mode) */
  size_t mr_key_size;    /* largest remote key it can carry (0: no remote keys) */
  int tagged;            /* needs enough tag bits for fab_tag_layout */
  int reg_host;          /* host memory must be registered (remote access) */
  int confirms_tagged;   /* a closed send comm's tagged messages are proven to have reached the peer before
                          * its endpoint closes (the `unproven` hook): ofi_rxm's eager limit may then be
                          * raised (fab_rxm.c) */
} fab_transport_needs;

struct fab_transport_ops {
  const char* name;
  uint8_t id; /* FAB_TRANSPORT_* */
  fab_transport_needs needs;
  /* Providers on which FABRIC_TRANSPORT=auto prefers the next candidate
   * although this one can run (measured slower there: docs/performance.md),
   * comma-separated; NULL: none. */
  const char* auto_avoid;
  uint32_t send_reqs, recv_reqs;         /* pool size per comm */
  size_t send_req_size, recv_req_size;   /* transport area per request */
  size_t comm_size;                      /* transport area per comm */

  /* Comm lifetime: init once the comm has its endpoint (before the
   * handshake payloads), fini when it is freed (libfabric no longer
   * references anything of it). Both optional. */
  fab_result (*comm_init)(fab_comm* c);
  void (*comm_fini)(fab_comm* c);
  /* Once per pooled request, the first time it is used. */
  void (*init_req)(fab_comm* c, fab_req* r);

  /* Handshake (all optional; ep lock held). The connector's payload goes in
   * the connect request; the listener reads it (validating every byte) and
   * writes its answer's payload; the connector reads that. */
  size_t (*connect_payload)(fab_comm* send, void* buf, size_t cap);
  fab_result (*accept_payload)(fab_comm* recv, const void* in, size_t in_len, void* out, size_t cap,
                               size_t* out_len);
  fab_result (*connected)(fab_comm* send, const void* in, size_t in_len);

  /* Data. */
  fab_result (*isend)(fab_comm* c, void* data, size_t size, int tag, fab_mr* mr, void** request);
  fab_result (*irecv)(fab_comm* c, int n, void** data, const size_t* sizes, const int* tags, fab_mr** mrs,
                      void** request);
  /* mrs[i] may be NULL (host memory). */
  fab_result (*iflush)(fab_comm* c, int n, void** data, const int* sizes, fab_mr** mrs, void** request);
  /* Drives completions for r (pending). */
  void (*progress)(fab_comm* c, fab_req* r);
  /* On a rail's polling thread (fab_ep_want_pump), ep lock held: post what
   * isend left to that thread. Optional. */
  void (*pump)(fab_comm* c);
  /* r is complete and test is about to report it (no lock held): a
   * transport that noted something in its completions' lock-free path turns
   * it into r's result here. Optional. */
  void (*settle)(fab_req* r);
  /* Profiler events: where sub-operation `sub` of r is in the protocol
   * (FAB_PROF_PATH_*). Optional: a transport without it moves one tagged
   * message per operation. */
  uint8_t (*prof_path)(fab_req* r, int sub);
  /* Writes the sizes test reports for a completed r (r->n entries). */
  void (*sizes)(fab_req* r, int* sizes);
  /* The comm failed while r is pending: give up what is not posted yet.
   * Optional. */
  void (*give_up)(fab_req* r);
  /* Close: stop what can be stopped (cancel posted receives). ep lock held. */
  void (*cancel)(fab_comm* c);
  /* Close: how many of c's pending requests were not handed to the provider
   * yet (they read no caller buffer, and close does not wait for them).
   * ep lock held. Optional: none. */
  uint32_t (*unposted)(fab_comm* c);
  /* A closed send comm: 0 when every message it sent is known to have
   * reached the peer, else how many it sent so far (a count that only
   * grows). While not 0, the comm stays parked and asks its peer for proof
   * (fab_delivery.c). Where a send completes once its bytes are in our
   * socket (one_stream), closing the endpoint before the peer read them may
   * drop them. ep lock held. Optional: always 0. */
  uint64_t (*unproven)(fab_comm* c);
  /* A completion with remote CQ data and no operation of ours (a peer's
   * fi_writedata landed). Runs with the endpoint lock held. Optional. */
  void (*remote_data)(fab_endpoint* ep, const fab_cqe* e);
  /* One-sided writes over a connection (NCCL's RMA groups): the remote CQ
   * data under which a write from send comm c reaches the `onesided` hook of
   * c's peer recv comm with `low` (a kind and a value, fab_group_cq_low).
   * NULL: the transport carries no one-sided writes. */
  uint64_t (*onesided_data)(const fab_comm* c, uint32_t low);
};

/* Candidate transports in order of preference, as FABRIC_TRANSPORT allows.
 * Returns how many. */
int fab_transport_candidates(const fab_transport_ops** out, int cap);
/* The transport named on the wire, or NULL. */
const fab_transport_ops* fab_transport_by_id(unsigned id);

extern const fab_transport_ops fab_sendrecv_ops;
extern const fab_transport_ops fab_rdma_ops;

#endif /* FAB_TRANSPORT_H */
