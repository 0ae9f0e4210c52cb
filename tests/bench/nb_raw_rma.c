/*
 * netbench raw transport, RMA flavour (--raw-rma): the least a receiver-driven
 * RMA protocol can do, as the floor for the plugin's rdma transport. The
 * receiver announces each posted buffer {address, key, size} with one
 * fi_inject_writedata into the sender's mailbox (CQ data: which entry); the
 * sender takes announcements strictly in order (FIFO: netbench posts and
 * sends one stream in the same order) and writes the data with one
 * fi_writedata whose CQ data completes the oldest posted receive. No tags, no
 * validation, no locks, no flow control beyond the 512-entry mailbox: what the
 * plugin adds over this is what plugin/raw measures.
 */
#include <rdma/fi_rma.h>
#include <stdlib.h>
#include <string.h>

#include "nb_raw.h"

#define CTRL_BIT (1ull << 63)

static uint64_t cq_data(int ctrl, uint32_t target, uint32_t low) {
  return (ctrl ? CTRL_BIT : 0) | (uint64_t)(target & 0x7fffffff) << 32 | low;
}

void raw_rma_hints(struct fi_info* h) {
  h->caps |= FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
  h->domain_attr->cq_data_size = 8;
}

static uint64_t remote_addr(raw_state* r, uintptr_t base, const void* p) {
  return (r->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)p : (uint64_t)((uintptr_t)p - base);
}

static uint32_t add_comm(raw_state* r, raw_comm* c) {
  uint32_t id = ++r->next_comm;
  if (id >= RAW_MAX_COMMS) nb_die("raw rma: more than %d comms", RAW_MAX_COMMS);
  r->comms[id] = c;
  return id;
}

void raw_rma_connect_start(raw_state* r, raw_comm* c) {
  c->id = add_comm(r, c);
  size_t len = RAW_RMA_SLOTS * sizeof(raw_ann);
  c->box = aligned_alloc(4096, len);
  memset(c->box, 0, len);
  raw_check(fi_mr_reg(r->domain, c->box, len, FI_REMOTE_WRITE, 0, r->prov_key ? 0 : ++r->next_key, 0, &c->box_mr,
                      NULL), "fi_mr_reg(mailbox)");
  c->hello.box_addr = remote_addr(r, (uintptr_t)c->box, c->box);
  c->hello.box_key = fi_mr_key(c->box_mr);
  c->hello.sender_id = c->id;
  size_t n = sizeof(c->hello.name);
  raw_check(fi_getname(&r->ep->fid, c->hello.name, &n), "fi_getname");
  c->hello.namelen = (uint32_t)n;
}

void raw_rma_accepted(raw_state* r, raw_comm* c) {
  r->comms[c->id] = c; /* the listener's id, which the sender's data names */
  c->peer_id = c->hello.sender_id;
  raw_check(fi_av_insert(r->av, c->hello.name, 1, &c->peer, 0, NULL) == 1 ? 0 : -FI_EINVAL, "fi_av_insert(sender)");
}

void raw_rma_remote(raw_state* r, const struct fi_cq_data_entry* e) {
  uint32_t id = (uint32_t)(e->data >> 32) & 0x7fffffff;
  raw_comm* c = id < RAW_MAX_COMMS ? r->comms[id] : NULL;
  if (!c) nb_die("raw rma: a write for unknown comm %u", id);
  if (e->data & CTRL_BIT) {
    c->landed[(uint32_t)e->data % RAW_RMA_SLOTS] = 1;
    return;
  }
  if (c->fifo_head == c->fifo_tail) nb_die("raw rma: data with no receive posted");
  raw_req* q = c->fifo[c->fifo_head++ % RAW_RMA_FIFO];
  q->size = (int)(uint32_t)e->data;
  q->done = 1;
}

int raw_rma_isend(raw_state* r, raw_comm* c, void* buf, size_t size, raw_mr* mh, void** req) {
  uint32_t slot = c->next_index % RAW_RMA_SLOTS;
  if (!c->landed[slot]) raw_progress(r);
  if (!c->landed[slot]) { /* no announcement yet: call again */
    *req = NULL;
    return 0;
  }
  raw_ann a = c->box[slot];
  raw_req* q = raw_req_get(r);
  q->size = (int)size;
  uint64_t data = cq_data(0, c->peer_id, (uint32_t)size);
  ssize_t rc = fi_writedata(r->ep, buf, size, r->mr_local && mh ? fi_mr_desc(mh->mr) : NULL, data, c->peer, a.addr,
                            a.key, q);
  if (rc == -FI_EAGAIN) {
    raw_req_put(r, q);
    raw_progress(r);
    *req = NULL;
    return 0;
  }
  raw_check((int)rc, "fi_writedata");
  c->landed[slot] = 0;
  c->next_index++;
  *req = q;
  return 0;
}

int raw_rma_irecv(raw_state* r, raw_comm* c, void* buf, size_t size, raw_mr* mh, void** req) {
  if (c->fifo_tail - c->fifo_head >= RAW_RMA_FIFO) nb_die("raw rma: too many receives posted");
  uint32_t slot = c->next_index % RAW_RMA_SLOTS;
  raw_ann a = {.addr = remote_addr(r, mh->base, buf), .key = fi_mr_key(mh->mr), .size = size};
  raw_req* q = raw_req_get(r);
  c->fifo[c->fifo_tail++ % RAW_RMA_FIFO] = q; /* before the announcement: the data may come at once */
  ssize_t rc;
  while ((rc = fi_inject_writedata(r->ep, &a, sizeof(a), cq_data(1, c->peer_id, slot), c->peer,
                                   c->hello.box_addr + (uint64_t)slot * sizeof(raw_ann), c->hello.box_key)) ==
         -FI_EAGAIN)
    raw_progress(r);
  raw_check((int)rc, "fi_inject_writedata(announcement)");
  c->next_index++;
  *req = q;
  return 0;
}

void raw_rma_close(raw_state* r, raw_comm* c) {
  if (c->id < RAW_MAX_COMMS && r->comms[c->id] == c) r->comms[c->id] = NULL;
  if (c->box_mr) fi_close(&c->box_mr->fid);
  free(c->box);
}
