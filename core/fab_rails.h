/*
 * Comms over several rails: a comm on a virtual device (makeVDevice) with
 * members d0..dN-1 is N single-rail comms, one on each member's endpoint,
 * set up by the ordinary handshake rail by rail:
 *
 *   listen:  a listen comm on every member; rail 0's handle goes to NCCL, and
 *            rail 0's answer carries the handles of rails 1..N-1.
 *   connect: rail 0 with NCCL's handle, then rail k with the k-th handle from
 *            the answer. Every connect request names the rail count and its
 *            rail; a listener with another count refuses it (both ends WARN).
 *   accept:  rail 0 (after which rail 0's listen comm closes: one connection
 *            per listen comm, so rails 1.. can only be this connector's), then
 *            rails 1..N-1.
 *
 * Data: the k-th message of a tag (counted per tag on both ends, as NCCL
 * matches per tag in order) goes whole on rail (k + tag) mod N, so both ends
 * agree on the rail without knowing the size, and a stream of messages of a
 * tag, and the tags of a grouped receive, spread over all rails. A send is
 * the rail's own request; a grouped receive whose buffers land on several
 * rails is a parent request over one receive per rail. Registration
 * registers on every member. Rail k's comms name the rail in their peer name,
 * so every WARN about them says which rail failed.
 *
 * Floor: above connection management, below the API (fab_data.c dispatches
 * here on the kinds FAB_OBJ_RAILS_*). The public listen/connect/accept/close
 * calls live here and hand single-rail devices to fab_conn_*.
 */
#ifndef FAB_RAILS_H
#define FAB_RAILS_H

#include "fab_core.h"

#define FAB_RREQ_MAGIC 0x51455252u /* "RREQ": a parent request over several rails */

/* fab_data.c's data calls on a comm or memory handle of several rails. */
fab_result fab_rails_isend(void* send_comm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                           void** request);
fab_result fab_rails_irecv(void* recv_comm, int n, void** data, const size_t* sizes, const int* tags,
                           void** mhandles, void** phandles, void** request);
fab_result fab_rails_iflush(void* recv_comm, int n, void** data, const int* sizes, void** mhandles, void** request);
fab_result fab_rails_test(void* request, int* done, int* sizes);
fab_result fab_rails_reg_mr(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle,
                            const char* fn);
fab_result fab_rails_dereg_mr(void* mhandle);

#endif /* FAB_RAILS_H */

/* --- internals of fab_rails.c and fab_rails_data.c ------------------------ */
#include "fab_engine.h"
#include "fab_tagmap.h"

enum { FAB_RAILS_PARENTS = 256 }; /* parent requests per comm */

typedef struct fab_rails_listen {
  uint32_t magic;
  void* handle;
  fab_device* dev;
  int n;
  void* listen[FAB_MAX_RAILS];   /* the members' listen comms (rail 0's closes once accepted) */
  void* accepted[FAB_MAX_RAILS]; /* the rails accepted so far */
  int naccepted;
  int done; /* its connection is accepted */
} fab_rails_listen;

typedef struct fab_rails_comm fab_rails_comm;

/* One rail's share of a parent request: a receive of some of its buffers. */
typedef struct fab_rails_child {
  int rail;
  int n;
  int idx[FAB_MAX_RECVS]; /* the parent's buffers it receives */
  void* req;              /* the rail's request; NULL until posted or once done */
  int posted, done;
} fab_rails_child;

typedef struct fab_rails_parent {
  uint32_t magic; /* FAB_RREQ_MAGIC while handed out */
  int n, nchild;
  fab_rails_comm* rc;
  fab_rails_child child[FAB_MAX_RAILS];
  int sizes[FAB_MAX_RECVS];
  /* what its children post (kept for children posted later, in order) */
  void* data[FAB_MAX_RECVS];
  size_t len[FAB_MAX_RECVS];
  int tags[FAB_MAX_RECVS];
  struct fab_mr* mrs[FAB_MAX_RECVS]; /* buffer i's registration on its rail */
  void* phandles[FAB_MAX_RECVS];
  int nposted; /* children posted so far (in order) */
  struct fab_rails_parent* next; /* free list, or the comm's list of parents not fully posted */
} fab_rails_parent;

struct fab_rails_comm {
  uint32_t magic;
  void* handle;
  fab_obj_kind kind; /* FAB_OBJ_RAILS_SEND / RECV */
  fab_device* dev;
  int n;
  void* rail[FAB_MAX_RAILS];     /* the members' comm handles */
  fab_comm* c[FAB_MAX_RAILS];    /* the members' comms */
  fab_tagmap tags;               /* messages (send) or buffers (recv) per tag so far: the owner thread's */
  fab_rails_parent* parents;     /* FAB_RAILS_PARENTS, from the first grouped receive over several rails */
  fab_rails_parent* free_list;
  int threads;                   /* its rails' endpoints have polling threads (FABRIC_RAIL_THREADS) */
  fab_rails_parent* unposted_head; /* parents with children still to post, oldest first */
  fab_rails_parent* unposted_tail;
};

typedef struct fab_rails_mr {
  uint32_t magic;
  void* handle;
  int n;
  fab_device* dev;
  void* mh[FAB_MAX_RAILS]; /* the members' memory handles */
} fab_rails_mr;

#define FAB_RAILS_MAGIC 0x4c494152u /* "RAIL" */

/* fab_rails_data.c: a comm's parents, when it closes. */
void fab_rails_data_free(fab_rails_comm* rc);
