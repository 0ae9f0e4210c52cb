/*
 * netbench raw transport internals, shared by its tagged data path
 * (nb_raw.c) and its RMA flavour (nb_raw_rma.c, --raw-rma).
 */
#ifndef NB_RAW_H
#define NB_RAW_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>
#include <stdint.h>

#include "nb.h"

#define RAW_MAGIC 0x4e425257u /* "NBRW" */
#define RAW_NREQ 8192
#define RAW_CQ_BATCH 16
#define TAG_HANDSHAKE (1ull << 62)

typedef struct raw_req {
  struct fi_context2 ctx; /* must be first: the provider owns it while posted */
  int done;
  int size;
  int in_use;
  struct raw_req* next_free;
} raw_req;



typedef struct {
  uint32_t magic, comm_id, namelen, pad;
  char name[NB_HANDLE_SIZE - 16];
} raw_handle;

enum { RAW_RMA_SLOTS = 512, RAW_RMA_FIFO = 8192, RAW_MAX_COMMS = 4096 };

/* RMA flavour: one announced receive buffer (receiver -> sender mailbox). */
typedef struct raw_ann {
  uint64_t addr, key, size;
} raw_ann;

/* RMA flavour: where the peer's announcements go, in the handshake. */
typedef struct raw_hello {
  uint64_t box_addr, box_key;
  uint32_t sender_id, namelen;
  char name[96]; /* the sender's endpoint: the receiver writes announcements to it */
} raw_hello;

typedef struct {
  uint64_t tag_base;
  fi_addr_t peer;
  raw_req* hs; /* pending handshake during connect/accept */
  int ready;
  /* RMA flavour */
  uint32_t id, peer_id;        /* comm ids in each process's table: CQ data names the target's */
  raw_ann* box;                /* send: RAW_RMA_SLOTS announcements, written by the peer */
  struct fid_mr* box_mr;
  volatile uint8_t landed[RAW_RMA_SLOTS];
  uint32_t next_index;         /* send: next announcement to take; recv: next to write */
  raw_hello hello;             /* the handshake payload (sent, or received) */
  raw_req* fifo[RAW_RMA_FIFO]; /* recv: posted receives in order */
  uint32_t fifo_head, fifo_tail;
} raw_comm;

typedef struct {
  uint32_t comm_id;
  raw_comm* pending;
} raw_lcomm;


typedef struct {
  int rma_mode; /* --raw-rma: data by fi_writedata into announced buffers */
  raw_comm* comms[RAW_MAX_COMMS];
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_ep* ep;
  struct fid_cq* cq;
  struct fid_av* av;
  int mr_local, mr_endpoint, prov_key, rma;
  int cuda;   /* buffers are GPU memory (--mem cuda/dmabuf): registered with FI_HMEM_CUDA */
  int dmabuf; /* ... through a dma-buf fd (--mem dmabuf) */
  uint64_t next_key;
  uint32_t next_comm;
  /* AV cache: the last few peer names inserted. */
  struct { char name[96]; size_t len; fi_addr_t addr; } peers[8];
  int npeers;
  raw_req* reqs;
  raw_req* free_list;
} raw_state;

/* A registration as the raw transport hands it out (RMA needs the base). */
typedef struct raw_mr {
  struct fid_mr* mr;
  uintptr_t base;
} raw_mr;

void raw_check(int rc, const char* what);
raw_req* raw_req_get(raw_state* r);
void raw_req_put(raw_state* r, raw_req* q);
void raw_progress(raw_state* r);

/* nb_raw_rma.c */
void raw_rma_hints(struct fi_info* h);
void raw_rma_connect_start(raw_state* r, raw_comm* c);   /* mailbox + hello; before the handshake send */
void raw_rma_accepted(raw_state* r, raw_comm* c);        /* after the hello arrived */
void raw_rma_remote(raw_state* r, const struct fi_cq_data_entry* e);
int raw_rma_isend(raw_state* r, raw_comm* c, void* buf, size_t size, raw_mr* mh, void** req);
int raw_rma_irecv(raw_state* r, raw_comm* c, void* buf, size_t size, raw_mr* mh, void** req);
void raw_rma_close(raw_state* r, raw_comm* c);

#endif /* NB_RAW_H */
