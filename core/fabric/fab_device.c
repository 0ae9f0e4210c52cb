/*
 * Device discovery (fi_getinfo), properties, virtual devices, domains.
 *
 * One device per distinct (provider, domain) of the first acceptable
 * provider. The provider is chosen without FI_HMEM (so the default never
 * falls onto an intra-node provider just because it is the only one with
 * HMEM). When the CUDA driver is usable, that same provider is asked again
 * with FI_HMEM, FI_MR_HMEM and FI_REMOTE_COMM; its HMEM entries are used when
 * it has them (FABRIC_GPU_MEMORY: 1 drops FI_REMOTE_COMM, for tests on one
 * host; 0 asks for no HMEM). FI_REMOTE_COMM keeps GPU memory off intra-host providers: NCCL
 * carries intra-host GPU traffic itself, so they gain nothing, and libfabric
 * 1.17's shm HMEM path lets one large send whose receive is not posted yet
 * stall every other send of the endpoint (two channels of a NCCL broadcast
 * then deadlock; seen on two H200s); 2.x's shm HMEM entry (no inject: small
 * writes are bounced, core/fabric/fab_remote_buf.c) slows host memory (docs/results/performance-history.md §4).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fab_cuda.h"
#include "fab_engine.h"
#include "fab_mr.h"
#include "fab_transport.h" /* the needs of candidate transports (data only) */

/* Reported when neither the provider nor the interface knows the link
 * speed (shm): 100 Gb/s, a common NIC class, keeps NCCL's topology search
 * from treating the network as the bottleneck. Socket providers report
 * their interface's speed instead (fab_iface_speed_mbps). */
#define FAB_DEFAULT_SPEED_MBPS 100000

static uint32_t api_version(void) {
  uint32_t built = FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION);
  uint32_t running = fi_version();
  return running < built ? running : built;
}

/* What the core itself needs on top of any transport's: the handshake sends
 * untagged connect requests and tagged answers. */
#define CORE_CAPS (FI_TAGGED | FI_MSG)

/* The hints for transport t; extra: FI_HMEM and/or FI_REMOTE_COMM; order:
 * message ordering asked on top of the transport's. */
static struct fi_info* make_hints(const char* prov, const fab_transport_ops* t, uint64_t extra, uint64_t order) {
  struct fi_info* h = fi_allocinfo();
  if (!h) return NULL;
  int hmem = !!(extra & FI_HMEM);
  h->caps = CORE_CAPS | t->needs.caps | extra;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->threading = FI_THREAD_SAFE;
  h->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | FI_MR_ENDPOINT | (hmem ? FI_MR_HMEM : 0);
  h->domain_attr->cq_data_size = t->needs.cq_data_size;
  h->tx_attr->msg_order = FI_ORDER_SAS | t->needs.msg_order | order;
  h->rx_attr->msg_order = FI_ORDER_SAS | t->needs.msg_order | order;
  if (prov && *prov) h->fabric_attr->prov_name = strdup(prov);
  return h;
}

static struct fi_info* query_ordered(const char* prov, const fab_transport_ops* t, uint64_t extra, uint64_t order,
                                    int* rc) {
  struct fi_info* hints = make_hints(prov, t, extra, order);
  struct fi_info* info = NULL;
  if (!hints) {
    *rc = -FI_ENOMEM;
    return NULL;
  }
  *rc = fi_getinfo(api_version(), NULL, NULL, 0, hints, &info);
  fi_freeinfo(hints);
  if (*rc) return NULL;
  info = fab_nic_profile_apply(info, order);
  if (!info) *rc = -FI_ENODATA;
  return info;
}

static struct fi_info* query(const char* prov, const fab_transport_ops* t, uint64_t extra, int* rc) {
  return query_ordered(prov, t, extra, 0, rc);
}

/* Why an entry is unusable for transport t, or NULL when it is fine. */
static const char* reject_reason(const struct fi_info* fi, const fab_transport_ops* t) {
  fab_tag_layout tags;
  if (fab_tag_layout_init(&tags, fi->ep_attr->mem_tag_format) != 0) return "too few tag bits";
  uint64_t caps = CORE_CAPS | t->needs.caps;
  if ((fi->caps & caps) != caps) return "lacks capabilities the transport needs";
  if (fi->domain_attr->cq_data_size < t->needs.cq_data_size) return "too little remote CQ data";
  if (fi->domain_attr->cq_data_size < 8 && t->needs.cq_data_size && !fab_reports_write_len(fi))
    return "4 bytes of remote CQ data, and the provider does not report a remote write's length";
  if (t->needs.mr_key_size && fi->domain_attr->mr_key_size > t->needs.mr_key_size) return "remote keys too long";
  if (fi->ep_attr->max_msg_size == 0) return "max_msg_size 0";
  return NULL;
}

/* Whether a write completes before the peer holds its data. Providers over
 * kernel sockets (tcp, sockets) report a write complete once it is in the
 * local socket: an endpoint closed right after, with unread bytes from the
 * peer, resets the connection and the queued bytes are lost, so the peer's
 * receive never completes. There a write asks for delivery completion (the
 * peer's provider acknowledges it). Hardware providers complete a write on
 * the peer's acknowledgement already; intra-host ones place it directly. */
static int over_sockets(const char* prov) {
  size_t n = strcspn(prov, ";");
  return (n == 3 && !strncmp(prov, "tcp", 3)) || (n == 7 && !strncmp(prov, "sockets", 7));
}

static uint64_t write_flags(const char* prov) {
  int want = fab_g.params.delivery_complete;
  if (want < 0) want = over_sockets(prov);
  return want ? FI_DELIVERY_COMPLETE : 0;
}

static void fill_pci_path(fab_device* d, const struct fi_info* fi) {
  if (!fi->nic || !fi->nic->bus_attr || fi->nic->bus_attr->bus_type != FI_BUS_PCI) return;
  const struct fi_pci_attr* p = &fi->nic->bus_attr->attr.pci;
  char path[128];
  snprintf(path, sizeof(path), "/sys/bus/pci/devices/%04x:%02x:%02x.%x", p->domain_id, p->bus_id, p->device_id,
           p->function_id);
  d->pci_path = realpath(path, NULL);
}

#ifdef FI_MR_DMABUF
#define DMABUF_OR_NOT ", dma-buf"
#else
#define DMABUF_OR_NOT ", no dma-buf in this build's libfabric"
#endif

static void fill_properties(fab_device* d, const struct fi_info* fi) {
  fab_properties* p = &d->props;
  memset(p, 0, sizeof(*p));
  p->name = d->name;
  p->pci_path = d->pci_path;
  const char* prov = fi->fabric_attr->prov_name;
  p->guid = fab_fnv1a(fab_fnv1a(fab_fnv1a(FAB_FNV_SEED, prov, strlen(prov)), "/", 1), d->name, strlen(d->name));
  p->ptr_support = FAB_PTR_HOST;
  if (d->hmem && fab_g.cuda_ok) {
    p->ptr_support |= FAB_PTR_CUDA;
#ifdef FI_MR_DMABUF
    p->ptr_support |= FAB_PTR_DMABUF;
#endif
  }
  p->reg_is_global = !d->mr_endpoint; /* FI_MR_ENDPOINT: a registration serves its comm's endpoint only */
  p->force_flush = 0;
  size_t bps = (fi->nic && fi->nic->link_attr) ? fi->nic->link_attr->speed : 0;
  int iface_mbps = fab_iface_speed_mbps(fi);
  p->speed_mbps = bps >= 1000000 ? (int)(bps / 1000000 > INT_MAX ? INT_MAX : bps / 1000000)
                  : iface_mbps   ? iface_mbps
                                 : FAB_DEFAULT_SPEED_MBPS;
  if (fab_g.params.link_speed_mbps > 0) p->speed_mbps = fab_g.params.link_speed_mbps;
  p->port = 1;
  p->latency_us = 0.0f; /* unknown; NCCL uses its own per-transport constants */
  p->max_comms = d->tags.conn_max > INT_MAX ? INT_MAX : (int)d->tags.conn_max;
  p->max_recvs = FAB_MAX_RECVS;
  p->net_device_type = 0;
  p->net_device_version = 0;
  p->vprops.ndevs = 1;
  p->vprops.devs[0] = d->index;
  size_t max = fab_g.params.max_p2p_bytes;
  if (max > INT_MAX) max = INT_MAX;
  if (max > fi->ep_attr->max_msg_size) max = fi->ep_attr->max_msg_size;
  p->max_p2p_bytes = max;
  p->max_coll_bytes = max;
  p->max_multi_request_size = 1;
  p->rail_id = -1;
  p->plane_id = -1;
}

/* rail > 0: the rail-th copy of a device for FABRIC_RAILS ("<name>#<rail>"). */
static int add_device(const struct fi_info* fi, const fab_transport_ops* t, int rail) {
  int idx = fab_g.nphys;
  if (idx >= FAB_MAX_DEVICES) return -1;
  fab_device* d = calloc(1, sizeof(*d));
  if (!d) return -1;
  d->info = fi_dupinfo(fi);
  if (!d->info) {
    free(d);
    return -1;
  }
  d->index = idx;
  d->physical = 1;
  d->carrier = idx;
  d->ops = t;
  d->remote_data = t->remote_data;
  fab_tag_layout_init(&d->tags, fi->ep_attr->mem_tag_format);
  d->mr_local = !!(fi->domain_attr->mr_mode & FI_MR_LOCAL) || fab_nic_profile_mr_local();
  d->mr_endpoint = !!(fi->domain_attr->mr_mode & FI_MR_ENDPOINT) || fab_nic_profile_mr_endpoint();
  d->mr_endpoint_emulated = d->mr_endpoint && !(fi->domain_attr->mr_mode & FI_MR_ENDPOINT);
  d->mr_local_emulated = d->mr_local && !(fi->domain_attr->mr_mode & FI_MR_LOCAL);
  d->mr_hmem = !!(fi->domain_attr->mr_mode & FI_MR_HMEM);
  d->prov_key = !!(fi->domain_attr->mr_mode & FI_MR_PROV_KEY);
  d->hmem = !!(fi->caps & FI_HMEM);
  d->virt_addr = !!(fi->domain_attr->mr_mode & FI_MR_VIRT_ADDR);
  d->mr_access = t->needs.mr_access;
  d->reg_host = d->mr_local || t->needs.reg_host;
  d->inject_size = fi->tx_attr->inject_size;
  d->tagged_max = fab_rxm_tagged_max(fi->fabric_attr->prov_name);
  d->cq_narrow = t->needs.cq_data_size && fi->domain_attr->cq_data_size < 8;
  if (d->cq_narrow && d->tags.conn_max > t->needs.conn_max_narrow) d->tags.conn_max = t->needs.conn_max_narrow;
  const char* prov = fi->fabric_attr->prov_name;
  d->write_flags = write_flags(prov);
  d->one_stream = over_sockets(prov);
  d->prov_hash = (uint32_t)fab_fnv1a(FAB_FNV_SEED, prov, strlen(prov));
  snprintf(d->name, sizeof(d->name), "%s", fi->domain_attr->name ? fi->domain_attr->name : prov);
  if (rail > 0) {
    size_t used = strlen(d->name);
    if (used + 4 > sizeof(d->name)) used = sizeof(d->name) - 4;
    snprintf(d->name + used, sizeof(d->name) - used, "#%d", rail);
  }
  fill_pci_path(d, fi);
  fill_properties(d, fi);
  fab_g.devs[idx] = d;
  fab_g.nphys = idx + 1;
  atomic_store(&fab_g.ndevs, idx + 1);
  FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET,
           "device %d: provider %s domain %s, transport %s, %d tag bits, mr_mode 0x%x%s%s%s%s%s, inject %zu%s, "
           "tagged up to %zu, maxP2pBytes %zu, pci %s",
           idx, prov, d->name, d->ops->name, d->tags.bits, fi->domain_attr->mr_mode,
           d->mr_local && !(fi->domain_attr->mr_mode & FI_MR_LOCAL) ? " (+FI_MR_LOCAL: FABRIC_NIC_PROFILE)" : "",
           d->mr_endpoint_emulated ? " (+FI_MR_ENDPOINT: FABRIC_NIC_PROFILE)" : "",
           d->hmem ? ", FI_HMEM" : "",
           d->cq_narrow ? ", 4 bytes of remote CQ data" : "",
           d->write_flags ? ", writes complete on delivery" : "", d->inject_size,
           d->inject_size ? "" : " (small control writes go from registered bounce slots)", d->tagged_max, d->props.max_p2p_bytes, d->pci_path ? d->pci_path : "(none)");
  return 0;
}

/* One INFO line per interface left out, though several entries name it. */
static int already_left_out(const char* name) {
  static char seen[8][FAB_NAME_MAX];
  for (int i = 0; i < 8; i++) {
    if (!strcmp(seen[i], name)) return 1;
    if (!seen[i][0]) {
      snprintf(seen[i], sizeof(seen[i]), "%s", name);
      return 0;
    }
  }
  return 0;
}

static int already_have(const struct fi_info* fi) {
  for (int i = 0; i < fab_g.nphys; i++) {
    const struct fi_info* o = fab_g.devs[i]->info;
    if (!strcmp(o->fabric_attr->prov_name, fi->fabric_attr->prov_name) && o->domain_attr->name &&
        fi->domain_attr->name && !strcmp(o->domain_attr->name, fi->domain_attr->name))
      return 1;
  }
  return 0;
}

/* The first entry of a query that transport t can run, or NULL. */
static const struct fi_info* first_usable(const struct fi_info* all, const fab_transport_ops* t, int log) {
  for (const struct fi_info* fi = all; fi; fi = fi->next) {
    const char* why = reject_reason(fi, t);
    if (!why) return fi;
    if (log) FAB_INFO(FAB_SUBSYS_INIT, "skipping %s/%s: %s", fi->fabric_attr->prov_name, fi->domain_attr->name, why);
  }
  return NULL;
}

/* The provider: the first one the least demanding candidate (the last in
 * the list) can run, so a preferred transport never drags the choice onto
 * a different provider (an intra-host one, say). */
static int choose_provider(const fab_transport_ops* const* cands, int n, char* prov, size_t len) {
  const char* want = fab_g.params.provider;
  int rc;
  struct fi_info* all = query(want, cands[n - 1], 0, &rc);
  const struct fi_info* first = first_usable(all, cands[n - 1], 1);
  if (first) snprintf(prov, len, "%s", first->fabric_attr->prov_name);
  else
    FAB_WARN("no usable libfabric provider%s%s: fi_getinfo(RDM, FI_TAGGED|FI_MSG%s, FI_ORDER_SAS, FI_THREAD_SAFE) "
             "%s. Check `fi_info -t FI_EP_RDM`, FABRIC_PROVIDER, FI_PROVIDER and FABRIC_TRANSPORT",
             want && *want ? " named " : "", want && *want ? want : "",
             cands[n - 1]->needs.caps & FI_RMA ? "|FI_RMA" : "",
             rc ? fi_strerror(-rc) : "found no entry this plugin can use");
  fi_freeinfo(all);
  return first ? 0 : -1;
}

/* 1 when FABRIC_TRANSPORT=auto should pass over t on provider prov. */
static int auto_avoids(const fab_transport_ops* t, const char* prov, int last) {
  if (last || !t->auto_avoid) return 0;
  size_t n = strlen(prov);
  for (const char* a = t->auto_avoid; *a;) {
    size_t len = strcspn(a, ",");
    if (len == n && !strncmp(a, prov, n)) return 1;
    a += len + (a[len] == ',');
  }
  return 0;
}

static const char* unfit_reason(const struct fi_info* list, const char* prov, const fab_transport_ops* t);

/* The most preferred candidate that can run on provider prov. */
static const fab_transport_ops* choose_transport(const fab_transport_ops* const* cands, int n, const char* prov) {
  for (int i = 0; i < n; i++) {
    if (auto_avoids(cands[i], prov, i + 1 == n)) {
      FAB_INFO(FAB_SUBSYS_INIT, "FABRIC_TRANSPORT=auto: %s measures slower than the next candidate on %s; skipped",
               cands[i]->name, prov);
      continue;
    }
    int rc;
    struct fi_info* all = query(prov, cands[i], 0, &rc);
    int ok = first_usable(all, cands[i], 0) != NULL;
    if (!ok) {
      const char* why = unfit_reason(all, prov, cands[i]);
      FAB_INFO(FAB_SUBSYS_INIT, "transport %s cannot run on %s: %s%s", cands[i]->name, prov,
               why ? why : "the provider offers no entry for it", i + 1 < n ? "; trying the next" : "");
    }
    fi_freeinfo(all);
    if (ok) return cands[i];
  }
  return NULL;
}

/* What to ask the provider for GPU memory: FI_HMEM, and FI_REMOTE_COMM
 * unless FABRIC_GPU_MEMORY=1 lets intra-host providers have it; 0: none. */
static uint64_t gpu_memory_caps(void) {
  if (!fab_g.cuda_ok || fab_g.params.gpu_memory == 0) return 0;
  return fab_g.params.gpu_memory == 1 ? FI_HMEM : FI_HMEM | FI_REMOTE_COMM;
}

/* One INFO line that says whether NCCL may hand us GPU memory, and why, with
 * a reason code in brackets (fabric-info reports both). */
static void log_gpu_memory(const char* prov, const fab_transport_ops* t, uint64_t caps, int granted,
                           const char* unfit) {
  const char* code = granted                     ? "hmem"
                     : !fab_g.cuda_ok            ? "no_cuda_driver"
                     : !caps                     ? "disabled"
                     : unfit                     ? "hmem_unfit_for_transport"
                     : (caps & FI_REMOTE_COMM)   ? "no_hmem_remote"
                                                 : "no_hmem";
  const char* why = granted                     ? "provider grants FI_HMEM"
                    : !fab_g.cuda_ok            ? "the CUDA driver is not usable"
                    : !caps                     ? "FABRIC_GPU_MEMORY=0"
                    : unfit                     ? "provider's FI_HMEM endpoints cannot run the transport"
                    : (caps & FI_REMOTE_COMM)   ? "provider lacks FI_HMEM on endpoints that reach other hosts "
                                                  "(intra-host providers such as shm need FABRIC_GPU_MEMORY=1)"
                                                : "provider lacks FI_HMEM";
  FAB_INFO(FAB_SUBSYS_INIT, "GPU memory (CUDA%s): %s on %s with transport %s [%s]: %s%s%s", DMABUF_OR_NOT,
           granted ? "yes" : "no", prov, t->name, code, why, unfit ? ": " : "", unfit ? unfit : "");
}

/* NULL when some entry of list (of provider prov) can run transport t, else
 * why the first cannot. */
static const char* unfit_reason(const struct fi_info* list, const char* prov, const fab_transport_ops* t) {
  const char* why = "no entry of the provider";
  for (const struct fi_info* fi = list; fi; fi = fi->next) {
    if (strcmp(fi->fabric_attr->prov_name, prov)) continue;
    const char* r = reject_reason(fi, t);
    if (!r) return NULL;
    if (!strcmp(why, "no entry of the provider")) why = r;
  }
  return why;
}

/* FABRIC_RAILS (tests and benchmarks on one host) and FABRIC_NIC_RAILS:
 * every device found is listed copies - 1 more times; each copy opens its
 * own domain and endpoint, so copies fused are rails with their own
 * progress. */
static void add_rail_copies(const fab_transport_ops* t, int copies) {
  int n = fab_g.nphys;
  for (int rail = 1; rail < copies; rail++) {
    for (int i = 0; i < n; i++) {
      const fab_device* orig = fab_g.devs[i];
      if (add_device(orig->info, t, rail) != 0) return;
      fab_g.devs[fab_g.nphys - 1]->local_only = orig->local_only;
      fab_g.devs[fab_g.nphys - 1]->ordered_writes = orig->ordered_writes;
    }
  }
  if (fab_g.params.rails > 1)
    FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "FABRIC_RAILS=%d: %d devices, copies of %d (for tests: fuse copies "
             "with makeVDevice to get rails on one NIC)", fab_g.params.rails, fab_g.nphys, n);
}

static fab_device* fused_device(const int* members, int n, int one_nic);

/* What the runtime sees: with FABRIC_NIC_RAILS=N, one device per NIC made of
 * the NIC's N copies (the NIC's name, PCI path and speed); else every
 * device. */
static void make_view(int nics) {
  int rails = fab_g.nic_rails;
  atomic_store(&fab_g.nview, 0);
  for (int i = 0; i < nics; i++) {
    int idx = i;
    if (rails > 1) {
      int members[FAB_MAX_VDEV_DEVS];
      for (int k = 0; k < rails; k++) members[k] = i + k * nics;
      fab_device* d = fused_device(members, rails, 1);
      if (!d) break;
      idx = d->index;
    }
    fab_g.view[i] = idx;
    fab_g.devs[idx]->props.vprops.ndevs = 1; /* one NIC, as the runtime counts */
    fab_g.devs[idx]->props.vprops.devs[0] = i;
    atomic_store(&fab_g.nview, i + 1);
  }
  if (rails > 1)
    FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "FABRIC_NIC_RAILS=%d: the runtime sees %d device(s), each %d rails "
             "over one NIC", fab_g.params.nic_rails, atomic_load(&fab_g.nview), rails);
}

fab_result fab_devices_discover(const fab_transport_ops* const* cands, int ncands) {
  char prov[128];
  if (ncands < 1) return FAB_ERR_INVALID_USAGE; /* fab_transport_candidates WARNed */
  fab_rxm_size_receive_pool(); /* before libfabric's first call: rxm reads it as libfabric loads it */
  if (choose_provider(cands, ncands, prov, sizeof(prov)) != 0) return FAB_ERR_SYSTEM;
  const fab_transport_ops* t = choose_transport(cands, ncands, prov);
  if (!t) {
    FAB_WARN("provider %s cannot run transport %s; choose another FABRIC_TRANSPORT or provider", prov,
             cands[0]->name);
    return FAB_ERR_SYSTEM;
  }
  fab_rxm_raise_eager_limit(t); /* before any endpoint opens: rxm reads it there */
  fab_rxm_tell_receive_pool(prov);
  int rc;
  struct fi_info* all = query(prov, t, 0, &rc);
  uint64_t hmem_caps = gpu_memory_caps();
  struct fi_info* hmem = hmem_caps ? query(prov, t, hmem_caps, &rc) : NULL;
  const char* hmem_unfit = hmem ? unfit_reason(hmem, prov, t) : NULL;
  if (hmem_unfit) { /* host memory then, rather than no device */
    fi_freeinfo(hmem);
    hmem = NULL;
  }
  log_gpu_memory(prov, t, hmem_caps, hmem != NULL, hmem_unfit);
  /* A provider that cannot reach other hosts (shm) completes sends to one
   * peer in order, so one comm's unmatched large send would hold up every
   * other comm's sends to that peer on a shared endpoint: a further send
   * comm to a peer gets an endpoint of its own (fab_connect.c). */
  struct fi_info* remote = query(prov, t, FI_REMOTE_COMM, &rc);
  /* Where writes can be placed in order at no cost (a provider that reaches
   * other hosts and grants write-after-write ordering: tcp streams do), one-
   * sided groups ask for it and need no per-put completion at the target
   * (core/onesided/fab_group.h). Not on intra-host providers: shm gives up its direct
   * copy for RMA when ordering is asked. */
  struct fi_info* ordered = (t->needs.caps & FI_RMA) && remote
                                ? query_ordered(prov, t, hmem ? hmem_caps : 0, FI_ORDER_WAW, &rc)
                                : NULL;
  struct fi_info* list = ordered ? ordered : hmem ? hmem : all;
  int others = 0; /* usable entries no exclusion names: only then are the named ones left out */
  for (const struct fi_info* fi = list; fi; fi = fi->next)
    others |= !strcmp(fi->fabric_attr->prov_name, prov) && !reject_reason(fi, t) && !fab_iface_listed(fi);
  for (const struct fi_info* fi = list; fi; fi = fi->next) {
    if (strcmp(fi->fabric_attr->prov_name, prov) || reject_reason(fi, t) || already_have(fi)) continue;
    if (others && fab_iface_listed(fi)) {
      if (!already_left_out(fi->domain_attr->name))
        FAB_INFO(FAB_SUBSYS_INIT, "left out interface %s (FABRIC_EXCLUDE_IF=%s): NCCL could put traffic to other "
                 "hosts on it; FI_TCP_IFACE chooses interfaces explicitly", fi->domain_attr->name,
                 fab_g.params.exclude_if);
      continue;
    }
    if (add_device(fi, t, 0) != 0) break;
    fab_g.devs[fab_g.nphys - 1]->local_only = remote == NULL;
    fab_g.devs[fab_g.nphys - 1]->ordered_writes = ordered != NULL;
  }
  int nics = fab_g.nphys;
  if (fab_g.params.nic_rails > 1 && fab_g.params.rails > 1)
    FAB_WARN("FABRIC_NIC_RAILS=%d and FABRIC_RAILS=%d: they do not combine; using FABRIC_NIC_RAILS",
             fab_g.params.nic_rails, fab_g.params.rails);
  fab_g.nic_rails = fab_g.params.nic_rails ? fab_g.params.nic_rails : fab_nic_rails_choose(nics);
  fab_g.nic_rails_auto = !fab_g.params.nic_rails && fab_g.nic_rails > 1;
  add_rail_copies(t, fab_g.nic_rails > 1 ? fab_g.nic_rails : fab_g.params.rails);
  make_view(fab_g.nic_rails > 1 ? nics : fab_g.nphys);
  const char* unfit = fab_g.nphys == 0 ? unfit_reason(list, prov, t) : NULL;
  if (fab_g.nphys == 0)
    FAB_WARN("provider %s offers no domain that can run transport %s (%s); choose another FABRIC_TRANSPORT or "
             "provider", prov, t->name, unfit ? unfit : "out of memory adding one");
  fi_freeinfo(ordered);
  fi_freeinfo(remote);
  fi_freeinfo(hmem);
  fi_freeinfo(all);
  return fab_g.nphys == 0 ? FAB_ERR_SYSTEM : FAB_OK;
}

/* The overflow region of receives on intra-host providers (fab_domain.sink):
 * as large as the largest message we let a peer send, reserved but not
 * backed, so it costs address space only until a peer oversteps. */
static void open_sink(const fab_device* d, fab_domain* dom) {
  /* Not where every buffer must be registered: a region of maxP2pBytes would be pinned. Under a NIC profile's
   * FI_MR_LOCAL on a carrier that needs none, it stays: the carriers here fault on a truncated receive (tcp 1.17
   * drops the connection, shm 1.17 hangs the sender), where EFA and verbs report it and go on. */
  if ((d->mr_local && !d->mr_local_emulated) || d->info->rx_attr->iov_limit < 2) return;
  size_t len = fab_g.params.max_p2p_bytes;
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    FAB_INFO(FAB_SUBSYS_INIT, "no overflow region for receives on %s (%s): a truncated receive there is left to the "
             "provider", d->name, strerror(errno));
    return;
  }
  dom->sink = p;
  dom->sink_len = len;
}

void fab_domain_sink_release(fab_domain* dom) {
  if (dom->sink) madvise(dom->sink, dom->sink_len, MADV_DONTNEED);
}

fab_result fab_domain_open(fab_device* d) {
  if (d->dom) return FAB_OK;
  fab_domain* dom = calloc(1, sizeof(*dom));
  if (!dom) {
    FAB_WARN("out of memory opening device %s", d->name);
    return FAB_ERR_SYSTEM;
  }
  /* Requested keys start at a random point: a stale peer (a process that
   * talked to the previous owner of our port, say) must not find its old keys
   * valid here. Sequential keys from 1 collided across processes. */
  size_t ksize = d->info->domain_attr->mr_key_size;
  uint64_t span = ksize && ksize < 8 ? (1ull << (8 * ksize - 1)) - 1 : (1ull << 62) - 1; /* room to count up */
  atomic_init(&dom->next_key, (fab_random64() & span) | 1);
  int rc = fi_fabric(d->info->fabric_attr, &dom->fabric, NULL);
  const char* what = "fi_fabric";
  if (rc == 0) {
    what = "fi_domain";
    rc = fi_domain(dom->fabric, d->info, &dom->domain, NULL);
  }
  if (rc == 0 && !(dom->mr_cache = fab_mr_cache_create())) rc = -FI_ENOMEM;
  if (rc != 0) {
    FAB_WARN("%s for %s/%s failed: %s", what, fab_device_provider(d), d->name, fi_strerror(-rc));
    if (dom->domain) fi_close(&dom->domain->fid);
    if (dom->fabric) fi_close(&dom->fabric->fid);
    free(dom);
    return FAB_ERR_SYSTEM;
  }
  open_sink(d, dom);
  d->dom = dom;
  return FAB_OK;
}

static void domain_close(fab_device* d) {
  if (!d->dom) return;
  fab_mr_domain_close(d);
  if (d->dom->domain) fi_close(&d->dom->domain->fid);
  if (d->dom->fabric) fi_close(&d->dom->fabric->fid);
  if (d->dom->sink) munmap(d->dom->sink, d->dom->sink_len); /* the endpoints that could write into it are closed */
  free(d->dom);
  d->dom = NULL;
}

void fab_devices_release(void) {
  int n = atomic_load(&fab_g.ndevs);
  for (int i = n - 1; i >= 0; i--) {
    fab_device* d = fab_g.devs[i];
    if (!d) continue;
    domain_close(d);
    if (d->info) fi_freeinfo(d->info);
    free(d->pci_path);
    free(d);
    fab_g.devs[i] = NULL;
  }
  atomic_store(&fab_g.ndevs, 0);
  atomic_store(&fab_g.nview, 0);
  fab_g.nphys = 0;
}


/* --- virtual devices ------------------------------------------------------ */

/* Our physical members of the runtime's devices vp->devs (a device of the
 * runtime's that is itself several rails brings all of them), or -1 with
 * one WARN. */
static int vdevice_members(const fab_vdevice_props* vp, int* members) {
  if (vp->ndevs < 2 || vp->ndevs > FAB_MAX_VDEV_DEVS) {
    FAB_WARN("makeVDevice: ndevs %d out of range 2..%d", vp->ndevs, FAB_MAX_VDEV_DEVS);
    return -1;
  }
  int n = 0;
  for (int i = 0; i < vp->ndevs; i++) {
    int idx = fab_device_index(vp->devs[i]);
    if (idx < 0) {
      FAB_WARN("makeVDevice: devs[%d] = %d is not a device (0..%d)", i, vp->devs[i], atomic_load(&fab_g.nview) - 1);
      return -1;
    }
    for (int j = 0; j < i; j++) {
      if (vp->devs[j] == vp->devs[i]) {
        FAB_WARN("makeVDevice: device %d listed twice", vp->devs[i]);
        return -1;
      }
    }
    const fab_device* d = fab_g.devs[idx];
    if (!d->physical && d->props.vprops.ndevs > 1) {
      FAB_WARN("makeVDevice: devs[%d] = %d is itself a virtual device; fuse physical devices", i, vp->devs[i]);
      return -1;
    }
    int nm = d->physical ? 1 : d->nmembers;
    if (n + nm > FAB_MAX_VDEV_DEVS) {
      FAB_WARN("makeVDevice: %d devices of %d rails each make more than %d rails; lower FABRIC_NIC_RAILS or fuse "
               "fewer devices", vp->ndevs, nm, FAB_MAX_VDEV_DEVS);
      return -1;
    }
    for (int k = 0; k < nm; k++) members[n++] = d->physical ? idx : d->members[k];
  }
  return n;
}

/* Caller holds the engine lock. A comm on a virtual device runs one rail
 * per member (fab_rails.c). Fused NICs (makeVDevice): the members' summed
 * speed, the first member's PCI path and guid, and a name joining the
 * members' with '+', as NCCL's own fused IB devices do. Rails of one NIC
 * (one_nic, FABRIC_NIC_RAILS): that NIC's speed and name. The rest of the
 * properties are the members' common ground. */
static fab_device* fused_device(const int* members, int n, int one_nic) {
  int idx = atomic_load(&fab_g.ndevs);
  if (idx >= FAB_MAX_DEVICES) {
    FAB_WARN("makeVDevice: device table full (%d devices)", FAB_MAX_DEVICES);
    return NULL;
  }
  fab_device* d = calloc(1, sizeof(*d));
  if (!d) {
    FAB_WARN("makeVDevice: out of memory");
    return NULL;
  }
  const fab_device* first = fab_g.devs[members[0]];
  *d = *first;
  d->index = idx;
  d->physical = 0;
  d->carrier = first->index;
  d->info = NULL;
  d->dom = NULL;
  d->pci_path = first->pci_path ? strdup(first->pci_path) : NULL;
  d->nmembers = n;
  size_t used = 0;
  long long speed = 0;
  for (int i = 0; i < n; i++) {
    const fab_device* m = fab_g.devs[members[i]];
    d->members[i] = members[i];
    if (!one_nic) {
      used += (size_t)snprintf(d->name + used, sizeof(d->name) - used, "%s%s", i ? "+" : "", m->name);
      if (used >= sizeof(d->name)) used = sizeof(d->name) - 1;
    }
    speed += m->props.speed_mbps;
    d->props.ptr_support &= m->props.ptr_support;
    if (m->props.max_comms < d->props.max_comms) d->props.max_comms = m->props.max_comms;
    if (m->props.max_p2p_bytes < d->props.max_p2p_bytes) d->props.max_p2p_bytes = m->props.max_p2p_bytes;
    if (m->props.max_coll_bytes < d->props.max_coll_bytes) d->props.max_coll_bytes = m->props.max_coll_bytes;
  }
  if (one_nic) speed = first->props.speed_mbps;
  d->props.name = d->name;
  d->props.pci_path = d->pci_path;
  d->props.guid = first->props.guid;
  d->props.speed_mbps = speed > INT_MAX ? INT_MAX : (int)speed;
  fab_g.devs[idx] = d;
  atomic_store(&fab_g.ndevs, idx + 1);
  FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "virtual device %d = %s: %d rails%s, %d Mb/s", idx, d->name, n,
           one_nic ? " over one NIC" : "", d->props.speed_mbps);
  return d;
}

fab_result fab_vdevice_create(const fab_vdevice_props* vp, int* out) {
  int members[FAB_MAX_VDEV_DEVS];
  int n = vdevice_members(vp, members);
  if (n < 0) return FAB_ERR_INVALID_USAGE;
  int view = atomic_load(&fab_g.nview); /* below ndevs, so below FAB_MAX_DEVICES while fused_device finds room */
  fab_device* d = fused_device(members, n, 0);
  if (!d) return FAB_ERR_SYSTEM;
  d->props.vprops = *vp;
  for (int i = vp->ndevs; i < FAB_MAX_VDEV_DEVS; i++) d->props.vprops.devs[i] = 0;
  fab_g.view[view] = d->index;
  atomic_store(&fab_g.nview, view + 1);
  *out = view;
  return FAB_OK;
}
