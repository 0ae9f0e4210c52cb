/*
 * Connection management: contexts and their endpoints (fab_ctx.c,
 * fab_conn_ep.c), the handshake (fab_listen.c, fab_connect.c) and comm
 * lifetime (fab_comm.c). Calls go down only: connect -> conn_ep -> listen,
 * comm; listen -> comm; everything here -> transports and the provider
 * layer.
 *
 * Handshake, all non-blocking:
 *  1. listen: the endpoint posts FAB_CTRL_RX receives for connect requests
 *     (once per endpoint), the listen comm gets a random 64-bit id, and the
 *     handle carries {magic, version, address, listen id, provider hash,
 *     checksum}.
 *  2. connect: validate the handle, insert the listener's address, post a
 *     receive for the answer (tag: answer bit + our connector id), send the
 *     request {listen id, connector id, our address, our transport, its
 *     payload}. Return NULL until the
 *     answer arrives or FABRIC_CONNECT_TIMEOUT_MS passes.
 *  3. listener's CQ: a request is validated and queued on the listen comm it
 *     names (several senders may queue on one listen comm); a request for an
 *     unknown listen id is answered "no listener" so the connector fails fast.
 *  4. accept: pop a request, refuse it when it names another transport,
 *     create the recv comm with a connection id unique on this endpoint, let
 *     the transport read the request's payload and write the answer's, send
 *     the answer, return the comm.
 *  5. connect sees the answer: the send comm tags its data with that id and
 *     the transport reads the answer's payload.
 *
 * On local-only providers (no FI_REMOTE_COMM, i.e. shm) each connect runs on
 * a new endpoint that then belongs to the send comm: such providers complete
 * sends to one peer in order, so comms sharing an endpoint would wait on each
 * other's unmatched sends. The pending connect is still listed on the shared
 * endpoint (home), where NCCL's retries look it up.
 */
#ifndef FAB_CONN_H
#define FAB_CONN_H

#include "fab_engine.h"

#define FAB_LISTEN_MAGIC 0x4e54534cu /* "LSTN" */

typedef struct fab_ctrl_rx {
  fab_op op;
  fab_endpoint* ep;
  fab_wire_connect msg;
  struct fid_mr* mr;
  void* desc;
} fab_ctrl_rx;

typedef struct fab_conn_request {
  fab_list node;
  fab_wire_connect msg;
} fab_conn_request;

typedef struct fab_listener {
  uint32_t magic;
  void* handle;
  fab_endpoint* ep;
  fab_device* dev;
  fab_ctx* owner; /* finalize closes it */
  uint64_t listen_id;
  int rails, rail;     /* what connect requests must say (fab_wire_connect) */
  uint8_t* rail_handles; /* rail 0 of several: the handles of rails 1.., sent after each answer */
  fab_list node;        /* ep->listens */
  fab_list queue;       /* fab_conn_request waiting for accept */
  fab_comm* accepting;  /* recv comm whose answer could not be posted yet */
  uint32_t accepting_connector;
  int64_t accepting_since_ms; /* its first try: after FAB_ANSWER_RETRY_MS it is given up */
  fab_list ready;       /* fab_ready_comm: answered before accept was called (fab_listen_answer_early) */
} fab_listener;

/* A recv comm answered ahead of accept, waiting for it. */
typedef struct fab_ready_comm {
  fab_list node;
  fab_comm* comm;
} fab_ready_comm;

/* A connect in progress, found again by the handle buffer NCCL passes on
 * every retry. */
typedef struct fab_pending {
  fab_parked park; /* home->connects while pending, ep->parked once abandoned */
  fab_endpoint* home; /* the shared endpoint: where NCCL's retries find it */
  fab_ctx* owner;
  fab_endpoint* ep;   /* where its operations run: home, or the comm's own */
  const void* handle_ptr;
  uint8_t handle_copy[FAB_HANDLE_SIZE];
  fab_comm* comm;
  uint32_t connector_id;
  uint64_t listen_id;
  int inflight;
  int abandoned; /* retired with operations in flight */
  int req_state, ans_state; /* FAB_SUB_IDLE / POSTED / DONE */
  int req_err, ans_err;     /* fi errno of a failed completion */
  size_t ans_len;
  int64_t deadline_ms;
  uint8_t peer_addr[FAB_ADDR_MAX]; /* the listener's address, from the handle */
  size_t peer_addr_len;
  fab_op req_op, ans_op;
  struct fid_mr* mr;
  void* desc;
  int rails, rail;
  struct {
    fab_wire_connect req;
    union {
      fab_wire_accept ans;
      uint8_t ans_rails[FAB_ACCEPT_MAX]; /* rail 0 of several: the answer and the other rails' handles */
    };
  } msg;
} fab_pending;

/* fab_ctx.c: listen/connect prologue: the context (NULL handle: the process
 * context), device dev and its shared endpoint; WARNs and returns the
 * error. */
fab_ctx* fab_ctx_resolve(fab_ctx* handle, const char* fn); /* NULL -> process context; WARNs */
fab_device* fab_device_get(int dev, const char* fn);        /* the runtime's index; WARNs */
int fab_device_first_rail(int dev, const char* fn);          /* ours, of its first rail; -1 (WARNed) */
fab_result fab_ctx_endpoint(fab_ctx* handle, int dev, const char* fn, fab_ctx** ctx, fab_device** d,
                            fab_endpoint** ep);

/* fab_conn_ep.c: an endpoint with the connection layer's hooks and its
 * control receives (connect requests, probes) posted. */
fab_result fab_conn_endpoint_create(fab_device* dev, fab_endpoint** out);

/* fab_comm.c */
void fab_comm_free(fab_comm* c);
/* Drives c's device endpoint and its send comms' own endpoints (local-only
 * providers), each once: a call that waits on its peer (a window's
 * withdrawal) still lets that peer's requests to any comm of ours in, as the
 * runtime's tests of those comms would while it waits. No endpoint lock
 * held. */
void fab_comm_drive_device(fab_comm* c);
/* The transport could not take an operation of c now (NULL request: the
 * runtime retries). A retry is a poll without progress for the liveness
 * check, so a runtime retrying against a dead peer gets the comm's failure
 * (one WARN), not NULL for ever. */
__attribute__((noinline)) fab_result fab_comm_not_now(fab_comm* c, const char* fn);
/* A call fn on a failed connection: one WARN saying why, and its result. */
fab_result fab_comm_failed(fab_comm* c, const char* fn);
/* Accounting of one completed control operation (the accept answer) of
 * comm c; frees a closed comm with its last completion. ep lock held. */
void fab_comm_op_done(fab_comm* c);
/* Frees the closed comms parked on ep whose operations have all completed,
 * and progresses ep's retiring own endpoints, destroying those left idle;
 * returns how many went. ep lock held. The sweep hook of every endpoint. */
int fab_comm_sweep_closed(fab_endpoint* ep);
/* Parks a closed comm that libfabric still references (ep lock held). */
void fab_comm_park_closed(fab_endpoint* ep, fab_comm* c);
/* 1 when a parked object (or an entry of ep->comms) is a comm. */
int fab_parked_is_comm(const fab_parked* p);
/* After fi_close(ep): frees the comms left on ep (live or parked). */
void fab_comm_endpoint_teardown(fab_endpoint* ep);
/* config NULL: the owner context's. */
fab_comm* fab_comm_alloc(fab_endpoint* ep, fab_device* dev, fab_obj_kind kind, fab_ctx* owner,
                         const fab_comm_config* config);
uint32_t fab_conn_id_next(fab_endpoint* ep);
/* fab_ctrl.c: sends an answer refusing a connect request; best effort. ep
 * lock held. rails: the listener's rail count to report (0: the request's). */
void fab_conn_refuse(fab_endpoint* ep, const fab_wire_connect* req, uint16_t status, int rails);
/* Takes a pending connect off home->connects (home lock held, not ep's):
 * frees it now or parks it until its operations complete; after a failure
 * (ok == 0) a private endpoint goes with it. */
void fab_pending_retire(fab_pending* pc, int ok);

/* Finalize of a context: close what it still owns on a shared endpoint
 * (the runtime should have closed it); each returns how many. */
int fab_comm_close_owned(fab_endpoint* home, fab_ctx* owner);
int fab_listen_close_owned(fab_endpoint* ep, fab_ctx* owner);
int fab_connect_drop_owned(fab_endpoint* home, fab_ctx* owner);

/* The single-rail handshake and close (a comm over several rails is a set
 * of these, core/rails/fab_rails.c). rails > 1: this comm is rail `rail` of that
 * many; rail 0's listener sends rail_handles (rails - 1 listen handles of
 * FAB_HANDLE_SIZE, copied) after each answer, and rail 0's connector keeps
 * them on its send comm (fab_comm.rail_handles). */
fab_result fab_conn_listen(fab_ctx* ctx, int dev, void* handle, int rails, int rail, const void* rail_handles,
                           void** listen_comm);
fab_result fab_conn_accept(void* listen_comm, void** recv_comm);
fab_result fab_conn_connect(fab_ctx* ctx, int dev, const fab_comm_config* config, void* handle, int rails, int rail,
                            void** send_comm);
fab_result fab_conn_close_send(void* send_comm);
fab_result fab_conn_close_recv(void* recv_comm);
/* Closes the n comms (FAB_OBJ_SEND or FAB_OBJ_RECV) of one connection over
 * several rails together: their in-flight operations are waited for under
 * one deadline, with one WARN for them all. */
fab_result fab_conn_close_group(void* const* handles, int n, fab_obj_kind kind);
fab_result fab_conn_close_listen(void* listen_comm);

/* fab_listen.c: answers every connect request queued on ep's listeners now,
 * keeping the comms for their accept: a blocking connect (Neuron v4) must
 * complete while its peer is itself blocked in connect. ep lock held. */
void fab_listen_answer_early(fab_endpoint* ep);

/* fab_ctrl.c */
void fab_listen_teardown(fab_endpoint* ep);
/* Posts the endpoint's control receives (connect requests and liveness
 * probes); once, when the endpoint is created. */
fab_result fab_ctrl_rx_setup(fab_endpoint* ep);
/* The listener with this id on ep, or NULL. ep lock held. */
fab_listener* fab_listener_find(fab_endpoint* ep, uint64_t id);
/* Unlinks and frees a listener; refuse: answer its queued requests "no
 * listener". ep lock held. */
void fab_listener_free_locked(fab_listener* l, int refuse);

#endif /* FAB_CONN_H */
