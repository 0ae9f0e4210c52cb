/*
 * netbench raw transport: plain libfabric, the floor for any plugin.
 *
 * One RDM endpoint, one tagged CQ (busy-polled with fi_cq_read), one AV table,
 * the same fi_getinfo hints as the plugin asks for. A "comm" is only a tag
 * range: listen hands out the endpoint name and a comm id, connect inserts
 * the peer into the AV (once per peer) and sends a 0-byte handshake, accept
 * waits for it. Data ops are fi_tsend/fi_trecv; like the plugin, they pass a
 * memory descriptor only when the provider asks for FI_MR_LOCAL (regMr always
 * calls fi_mr_reg, so the MR test times raw registration). Requests are a
 * fixed pool of fi_context2-headed structs. This is the least a plugin must
 * do, so plugin/raw isolates what the plugin adds.
 */
#include "nb.h"
#include "nb_raw.h"

#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void raw_check(int rc, const char* what) {
  if (rc) nb_die("raw: %s failed: %d (%s)", what, rc, fi_strerror(-rc));
}

raw_req* raw_req_get(raw_state* r) {
  raw_req* q = r->free_list;
  if (!q) nb_die("raw: out of requests (%d in flight)", RAW_NREQ);
  r->free_list = q->next_free;
  q->done = 0;
  q->size = 0;
  q->in_use = 1;
  return q;
}

void raw_req_put(raw_state* r, raw_req* q) {
  q->in_use = 0;
  q->next_free = r->free_list;
  r->free_list = q;
}

void raw_progress(raw_state* r) {
  struct fi_cq_data_entry e[RAW_CQ_BATCH];
  ssize_t n = fi_cq_read(r->cq, e, RAW_CQ_BATCH);
  if (n > 0) {
    for (ssize_t i = 0; i < n; i++) {
      if (e[i].flags & FI_REMOTE_WRITE) {
        raw_rma_remote(r, &e[i]);
        continue;
      }
      raw_req* q = e[i].op_context;
      if (!q) continue;
      if (e[i].flags & FI_RECV) q->size = (int)e[i].len;
      q->done = 1;
    }
  } else if (n == -FI_EAVAIL) {
    struct fi_cq_err_entry err;
    memset(&err, 0, sizeof(err));
    fi_cq_readerr(r->cq, &err, 0);
    nb_die("raw: completion error %d (%s), prov_errno %d, len %zu", err.err, fi_strerror(err.err),
           err.prov_errno, err.len);
  } else if (n != -FI_EAGAIN) {
    nb_die("raw: fi_cq_read: %zd (%s)", n, fi_strerror((int)-n));
  }
}

/* The hints the plugin uses (core/fabric/fab_device.c make_hints/query): RDM,
 * FI_TAGGED|FI_MSG, FI_CONTEXT|FI_CONTEXT2, FI_THREAD_SAFE, SAS ordering,
 * mr_mode LOCAL|ALLOCATED|PROV_KEY|VIRT_ADDR; then, only when the CUDA driver
 * is usable, the same query with FI_HMEM|FI_REMOTE_COMM (+FI_MR_HMEM) for the
 * chosen provider, whose entry wins when granted. "nohmem" skips the second
 * query; "minimal" asks only for FI_TAGGED. */
static struct fi_info* raw_hints(const nb_xport_opts* o, const char* prov, int hmem) {
  struct fi_info* h = fi_allocinfo();
  if (!h) nb_die("fi_allocinfo");
  h->ep_attr->type = FI_EP_RDM;
  h->caps = FI_TAGGED;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  if (o->raw_hints != NB_RAW_HINTS_MINIMAL) {
    h->caps |= FI_MSG | (hmem ? FI_HMEM | FI_REMOTE_COMM : 0);
    h->domain_attr->threading = FI_THREAD_SAFE;
    h->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | (hmem ? FI_MR_HMEM : 0);
    h->tx_attr->msg_order = FI_ORDER_SAS;
    h->rx_attr->msg_order = FI_ORDER_SAS;
  }
  if (o->raw_rma) raw_rma_hints(h);
  if (prov && *prov) h->fabric_attr->prov_name = strdup(prov);
  return h;
}

/* The plugin's test (core/base/fab_cuda.c): libcuda loads, cuInit(0) and
 * cuDeviceGetCount succeed with at least one device. */
static int cuda_usable(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(lib, "cuInit");
  int (*count)(int*) = (int (*)(int*))dlsym(lib, "cuDeviceGetCount");
  int n = 0;
  int ok = init && count && init(0) == 0 && count(&n) == 0 && n > 0;
  return ok; /* stays loaded, as in the plugin */
}

/* GPU buffers: FI_HMEM is a must, asked for as the plugin does under
 * FABRIC_GPU_MEMORY=1 (no FI_REMOTE_COMM, so shm qualifies). */
static struct fi_info* raw_getinfo_hmem(const nb_xport_opts* o) {
  struct fi_info* h = raw_hints(o, o->provider, 1);
  h->caps &= ~FI_REMOTE_COMM;
  struct fi_info* info = NULL;
  int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, h, &info);
  fi_freeinfo(h);
  if (rc || !info)
    nb_die("raw: --mem cuda: provider %s offers no FI_HMEM endpoint (fi_getinfo %d: %s); it needs a libfabric "
           "built with CUDA", o->provider ? o->provider : "(any)", rc, fi_strerror(-rc));
  return info;
}

static struct fi_info* raw_getinfo(const nb_xport_opts* o) {
  if (o->mem != NB_MEM_HOST) return raw_getinfo_hmem(o);
  struct fi_info* hints = raw_hints(o, o->provider, 0);
  struct fi_info* info = NULL;
  int rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info);
  fi_freeinfo(hints);
  if (rc) nb_die("raw: fi_getinfo(provider %s): %d (%s)", o->provider ? o->provider : "(any)", rc, fi_strerror(-rc));
  if (o->raw_hints != NB_RAW_HINTS_PLUGIN || !cuda_usable()) return info;
  struct fi_info* hinfo = NULL;
  hints = raw_hints(o, info->fabric_attr->prov_name, 1);
  rc = fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &hinfo);
  fi_freeinfo(hints);
  if (rc || !hinfo) return info;
  fi_freeinfo(info);
  return hinfo;
}

static int r_listen(nb_xport* x, void* handle, void** lcomm) {
  raw_state* r = x->priv;
  raw_handle* h = handle;
  memset(h, 0, sizeof(*h));
  size_t len = sizeof(h->name);
  raw_check(fi_getname(&r->ep->fid, h->name, &len), "fi_getname");
  h->magic = RAW_MAGIC;
  h->comm_id = ++r->next_comm;
  h->namelen = (uint32_t)len;
  raw_lcomm* l = calloc(1, sizeof(*l));
  l->comm_id = h->comm_id;
  *lcomm = l;
  return 0;
}

static fi_addr_t raw_peer(raw_state* r, const raw_handle* h) {
  for (int i = 0; i < r->npeers; i++)
    if (r->peers[i].len == h->namelen && !memcmp(r->peers[i].name, h->name, h->namelen)) return r->peers[i].addr;
  fi_addr_t a;
  int n = fi_av_insert(r->av, h->name, 1, &a, 0, NULL);
  if (n != 1) nb_die("raw: fi_av_insert: %d", n);
  if (r->npeers < 8) {
    memcpy(r->peers[r->npeers].name, h->name, h->namelen);
    r->peers[r->npeers].len = h->namelen;
    r->peers[r->npeers].addr = a;
    r->npeers++;
  }
  return a;
}

static int r_connect(nb_xport* x, void* handle, void** scomm) {
  raw_state* r = x->priv;
  raw_handle* h = handle;
  /* NCCL-style: the same handle buffer comes back until the comm is ready;
   * the in-progress comm pointer is parked in the handle's pad area. */
  raw_comm* c;
  if (h->magic != RAW_MAGIC) nb_die("raw: bad handle");
  memcpy(&c, h->name + sizeof(h->name) - sizeof(c), sizeof(c));
  *scomm = NULL;
  if (!c) {
    c = calloc(1, sizeof(*c));
    c->tag_base = (uint64_t)h->comm_id << 32;
    c->peer = raw_peer(r, h);
    c->peer_id = h->comm_id;
    c->hs = raw_req_get(r);
    if (r->rma_mode) raw_rma_connect_start(r, c);
    void* hello = r->rma_mode ? &c->hello : NULL;
    size_t hlen = r->rma_mode ? sizeof(c->hello) : 0;
    ssize_t rc;
    while ((rc = fi_tsend(r->ep, hello, hlen, NULL, c->peer, TAG_HANDSHAKE | c->tag_base, c->hs)) == -FI_EAGAIN)
      raw_progress(r);
    raw_check((int)rc, "fi_tsend(handshake)");
    memcpy(h->name + sizeof(h->name) - sizeof(c), &c, sizeof(c));
  }
  raw_progress(r);
  if (c->hs->done) {
    raw_req_put(r, c->hs);
    c->hs = NULL;
    c->ready = 1;
    memset(h->name + sizeof(h->name) - sizeof(c), 0, sizeof(c));
    *scomm = c;
  }
  return 0;
}

static int r_accept(nb_xport* x, void* lcomm, void** rcomm) {
  raw_state* r = x->priv;
  raw_lcomm* l = lcomm;
  raw_comm* c = l->pending; /* one accept per listen, as in NCCL */
  *rcomm = NULL;
  if (!c) {
    c = l->pending = calloc(1, sizeof(*c));
    c->tag_base = (uint64_t)l->comm_id << 32;
    c->peer = FI_ADDR_UNSPEC;
    c->id = l->comm_id;
    c->hs = raw_req_get(r);
    void* hello = r->rma_mode ? &c->hello : NULL;
    size_t hlen = r->rma_mode ? sizeof(c->hello) : 0;
    ssize_t rc;
    while ((rc = fi_trecv(r->ep, hello, hlen, NULL, FI_ADDR_UNSPEC, TAG_HANDSHAKE | c->tag_base, 0, c->hs)) ==
           -FI_EAGAIN)
      raw_progress(r);
    raw_check((int)rc, "fi_trecv(handshake)");
  }
  raw_progress(r);
  if (c->hs->done) {
    raw_req_put(r, c->hs);
    c->hs = NULL;
    c->ready = 1;
    l->pending = NULL;
    if (r->rma_mode) raw_rma_accepted(r, c);
    *rcomm = c;
  }
  return 0;
}

static int r_close_comm(nb_xport* x, void* comm) {
  raw_state* r = x->priv;
  if (r->rma_mode) raw_rma_close(r, comm);
  free(comm);
  return 0;
}

static int r_close_listen(nb_xport* x, void* lcomm) {
  free(lcomm);
  return 0;
}

static int r_reg_mr(nb_xport* x, void* comm, void* buf, size_t size, void** mh) {
  raw_state* r = x->priv;
  struct fid_mr* mr;
  uint64_t access = FI_SEND | FI_RECV;
  if (r->rma) access |= FI_REMOTE_WRITE | FI_REMOTE_READ | FI_WRITE | FI_READ;
  struct iovec iov = {.iov_base = buf, .iov_len = size};
  struct fi_mr_attr attr = {.mr_iov = &iov, .iov_count = 1, .access = access,
                            .requested_key = r->prov_key ? 0 : ++r->next_key,
                            .iface = r->cuda ? FI_HMEM_CUDA : FI_HMEM_SYSTEM};
  attr.device.cuda = 0; /* the rank's GPU (nb_mem.c: device 0) */
  uint64_t flags = 0;
  int fd = -1;
#ifdef FI_MR_DMABUF
  struct fi_mr_dmabuf dmabuf;
  if (r->dmabuf) {
    fd = nb_mem_dmabuf_fd(buf, size);
    dmabuf = (struct fi_mr_dmabuf){.fd = fd, .offset = 0, .len = size, .base_addr = buf};
    attr.dmabuf = &dmabuf;
    flags |= FI_MR_DMABUF;
  }
#endif
  int rc = fi_mr_regattr(r->domain, &attr, flags, &mr);
  if (fd >= 0) close(fd);
  raw_check(rc, "fi_mr_regattr");
  if (r->mr_endpoint) {
    raw_check(fi_mr_bind(mr, &r->ep->fid, 0), "fi_mr_bind");
    raw_check(fi_mr_enable(mr), "fi_mr_enable");
  }
  raw_mr* m = malloc(sizeof(*m));
  m->mr = mr;
  m->base = (uintptr_t)buf;
  *mh = m;
  return 0;
}

static int r_dereg_mr(nb_xport* x, void* comm, void* mh) {
  raw_mr* m = mh;
  int rc = fi_close(&m->mr->fid);
  free(m);
  return rc;
}

int nb_raw_mr_cost(nb_xport* x, void* buf, size_t size, uint64_t* reg_ns, uint64_t* dereg_ns) {
  void* mh;
  uint64_t t0 = nb_now_ns();
  r_reg_mr(x, NULL, buf, size, &mh);
  uint64_t t1 = nb_now_ns();
  r_dereg_mr(x, NULL, mh);
  uint64_t t2 = nb_now_ns();
  *reg_ns = t1 - t0;
  *dereg_ns = t2 - t1;
  return 0;
}

static int r_isend(nb_xport* x, void* scomm, void* buf, size_t size, int tag, void* mh, void** req) {
  raw_state* r = x->priv;
  raw_comm* c = scomm;
  if (r->rma_mode) return raw_rma_isend(r, c, buf, size, mh, req);
  raw_req* q = raw_req_get(r);
  q->size = (int)size;
  ssize_t rc = fi_tsend(r->ep, buf, size, r->mr_local && mh ? fi_mr_desc(((raw_mr*)mh)->mr) : NULL, c->peer, c->tag_base | (uint32_t)tag, q);
  if (rc == -FI_EAGAIN) {
    raw_req_put(r, q);
    raw_progress(r);
    *req = NULL;
    return 0;
  }
  raw_check((int)rc, "fi_tsend");
  *req = q;
  return 0;
}

/* Fault injection for netbench's own test: NETBENCH_RAW_FAULT=k lands the
 * k-th non-empty receive in a scratch buffer, so the caller's buffer keeps
 * stale bytes; the run must then fail its data check. */
static long fault_at = -1, nrecv;

static int r_irecv(nb_xport* x, void* rcomm, void* buf, size_t size, int tag, void* mh, void** req) {
  raw_state* r = x->priv;
  raw_comm* c = rcomm;
  if (fault_at > 0 && size && ++nrecv == fault_at) {
    buf = malloc(size);
    mh = NULL;
  }
  if (r->rma_mode) return raw_rma_irecv(r, c, buf, size, mh, req);
  raw_req* q = raw_req_get(r);
  ssize_t rc =
      fi_trecv(r->ep, buf, size, r->mr_local && mh ? fi_mr_desc(((raw_mr*)mh)->mr) : NULL, FI_ADDR_UNSPEC, c->tag_base | (uint32_t)tag, 0, q);
  if (rc == -FI_EAGAIN) {
    raw_req_put(r, q);
    raw_progress(r);
    *req = NULL;
    return 0;
  }
  raw_check((int)rc, "fi_trecv");
  *req = q;
  return 0;
}

static int r_test(nb_xport* x, void* req, int* done, int* size) {
  raw_state* r = x->priv;
  raw_req* q = req;
  if (!q->done) raw_progress(r);
  *done = q->done;
  if (q->done) {
    if (size) *size = q->size;
    raw_req_put(r, q);
  }
  return 0;
}

static void r_fini(nb_xport* x) {
  raw_state* r = x->priv;
  if (!r) return;
  fi_close(&r->ep->fid);
  fi_close(&r->av->fid);
  fi_close(&r->cq->fid);
  fi_close(&r->domain->fid);
  fi_close(&r->fabric->fid);
  fi_freeinfo(r->info);
  free(r->reqs);
  free(r);
  x->priv = NULL;
}

static const nb_ops raw_ops = {
    .name = "raw",
    .listen = r_listen,
    .connect = r_connect,
    .accept = r_accept,
    .close_send = r_close_comm,
    .close_recv = r_close_comm,
    .close_listen = r_close_listen,
    .reg_mr = r_reg_mr,
    .dereg_mr = r_dereg_mr,
    .isend = r_isend,
    .irecv = r_irecv,
    .test = r_test,
    .fini = r_fini,
};

int nb_raw_open(nb_xport* x, const nb_xport_opts* o) {
  raw_state* r = calloc(1, sizeof(*r));
  const char* fault = getenv("NETBENCH_RAW_FAULT");
  if (fault) fault_at = atol(fault);
  r->info = raw_getinfo(o);
  struct fi_info* fi = r->info;
  /* descriptors with every buffer: where the provider needs them for all
   * memory, and for GPU memory where it needs them for that (FI_MR_HMEM) */
  r->mr_local = !!(fi->domain_attr->mr_mode & FI_MR_LOCAL) ||
                (o->mem != NB_MEM_HOST && (fi->domain_attr->mr_mode & FI_MR_HMEM));
  r->mr_endpoint = !!(fi->domain_attr->mr_mode & FI_MR_ENDPOINT);
  r->prov_key = !!(fi->domain_attr->mr_mode & FI_MR_PROV_KEY);
  r->rma = !!(fi->caps & FI_RMA);
  r->cuda = o->mem != NB_MEM_HOST;
  r->dmabuf = o->mem == NB_MEM_DMABUF;
#ifndef FI_MR_DMABUF
  if (r->dmabuf) nb_die("raw: --mem dmabuf: this netbench was built against a libfabric without FI_MR_DMABUF");
#endif
  raw_check(fi_fabric(fi->fabric_attr, &r->fabric, NULL), "fi_fabric");
  raw_check(fi_domain(r->fabric, fi, &r->domain, NULL), "fi_domain");
  r->rma_mode = o->raw_rma;
  struct fi_cq_attr cqa = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE, .size = 0};
  raw_check(fi_cq_open(r->domain, &cqa, &r->cq, NULL), "fi_cq_open");
  struct fi_av_attr ava = {.type = FI_AV_TABLE};
  raw_check(fi_av_open(r->domain, &ava, &r->av, NULL), "fi_av_open");
  raw_check(fi_endpoint(r->domain, fi, &r->ep, NULL), "fi_endpoint");
  raw_check(fi_ep_bind(r->ep, &r->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  raw_check(fi_ep_bind(r->ep, &r->av->fid, 0), "fi_ep_bind(av)");
  raw_check(fi_enable(r->ep), "fi_enable");
  r->reqs = calloc(RAW_NREQ, sizeof(raw_req));
  for (int i = RAW_NREQ - 1; i >= 0; i--) raw_req_put(r, &r->reqs[i]);
  x->ops = &raw_ops;
  x->priv = r;
  snprintf(x->desc, sizeof(x->desc),
           "raw libfabric %d.%d%s, provider %s, fabric %s, domain %s, mr_mode 0x%x, caps%s%s, inject %zu, hints %s",
           FI_MAJOR(fi_version()), FI_MINOR(fi_version()),
           r->rma_mode ? " RMA flavour (announce + fi_writedata, FIFO)" : "", fi->fabric_attr->prov_name, fi->fabric_attr->name,
           fi->domain_attr->name, (unsigned)fi->domain_attr->mr_mode, (fi->caps & FI_MSG) ? " MSG" : "",
           (fi->caps & FI_HMEM) ? " HMEM" : "", fi->tx_attr->inject_size,
           o->raw_hints == NB_RAW_HINTS_PLUGIN ? "plugin" : o->raw_hints == NB_RAW_HINTS_NOHMEM ? "nohmem" : "minimal");
  return 0;
}
