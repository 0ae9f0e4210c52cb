/* The RMA family's own calls that are not data operations: init, device
 * properties, contexts, symmetric registration, progress, errors. See
 * fab_group.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_group.h"
#include "fab_devcopy.h"
#include "fab_transport.h"

enum { WIN_MAGIC = 0x57494e44 };

fab_result fab_rma_init(fab_ctx** ctx, uint64_t comm_id, fab_logger_fn logger) {
  fab_result rc = fab_init(ctx, comm_id, NULL, logger, NULL);
  if (rc != FAB_OK) return rc;
  fab_device* d = fab_g.devs[0];
  if (!d->ops->onesided_data) {
    /* NCCL 2.30+ calls this at every communicator's creation, whether the
     * application uses NCCL's RMA API or not: a refusal here is an answer,
     * not a fault (a WARN in every user's log on shm, where auto picks
     * sendrecv, was seen on two H200s). */
    FAB_INFO(FAB_SUBSYS_INIT, "RMA init: device %s runs the %s transport, and one-sided operations need the rdma "
             "transport: NCCL's RMA API will not use this plugin. Set FABRIC_TRANSPORT=rdma where the provider offers "
             "FI_RMA", d->name, d->ops->name);
    fab_finalize(*ctx);
    *ctx = NULL;
    return FAB_ERR_INVALID_USAGE;
  }
  return FAB_OK;
}

fab_result fab_rma_get_properties(int dev, fab_properties* props) {
  fab_result rc = fab_get_properties(dev, props);
  if (rc != FAB_OK) return rc;
  props->net_device_type = FAB_NET_DEVICE_GIN_PROXY; /* host operations, driven by NCCL's proxy */
  /* GPU windows work on every provider: direct where it has FI_HMEM and makes no CUDA calls of its own
   * (ptrSupport says so already, with DMABUF where it applies), else staged through host memory
   * (fab_group_stage.c), which takes a dma-buf registration too */
  if (fab_devcopy_ready()) props->ptr_support |= FAB_PTR_CUDA;
  props->net_device_version = 0;
  return FAB_OK;
}

/* --- contexts ------------------------------------------------------------------------- */

/* RMA v17's peer list: the ranks the context will talk to. Every context here can reach every rank, so
 * the list only has to be well formed. */
static fab_result check_peer_list(const fab_group* g, const fab_rma_config* config) {
  if (config->npeers < 0 || config->npeers > g->nranks)
    return fab_bad_argument("createContext", "peerArrayCount", config->npeers, "0..nranks");
  if (config->npeers > 0 && !config->peers)
    return fab_bad_argument("createContext", "peerArray", 0, "an array of peerArrayCount ranks");
  for (int i = 0; i < config->npeers; i++)
    if (config->peers[i] < 0 || config->peers[i] >= g->nranks)
      return fab_bad_argument("createContext", "peerArray[]", config->peers[i], "a rank in 0..nranks-1");
  return FAB_OK;
}

fab_result fab_rma_create_context(void* group, const fab_rma_config* config, void** rma_ctx, void** dev_handle) {
  if (!rma_ctx) return fab_bad_argument("createContext", "rmaCtx", 0, "a non-NULL pointer");
  *rma_ctx = NULL;
  if (dev_handle) *dev_handle = NULL; /* a proxy backend has no device-side handle */
  fab_group* g = fab_group_get(group, "createContext");
  if (!g) return FAB_ERR_INTERNAL;
  int n = config ? config->n_contexts : 1;
  if (n < 1 || n > FAB_GROUP_MAX_CONTEXTS) return fab_bad_argument("createContext", "nContexts", n, "1..256");
  if (config && config->rank_stride < 0)
    return fab_bad_argument("createContext", "rankStride", config->rank_stride, "0 or more (1: every peer)");
  fab_result rc = config ? check_peer_list(g, config) : FAB_OK;
  if (rc != FAB_OK) return rc;
  fab_group_ctx* x = calloc(1, sizeof(*x));
  if (!x) {
    FAB_WARN("createContext: out of memory");
    return FAB_ERR_SYSTEM;
  }
  x->group = g;
  x->ncontexts = n;
  x->handle = fab_obj_add(FAB_OBJ_COLL_CTX, x);
  if (!x->handle) {
    free(x);
    FAB_WARN("createContext: handle table full");
    return FAB_ERR_SYSTEM;
  }
  pthread_mutex_lock(&g->lock);
  fab_list_push(&g->ctxs, &x->node);
  pthread_mutex_unlock(&g->lock);
  *rma_ctx = x->handle;
  return FAB_OK;
}

fab_result fab_rma_destroy_context(void* rma_ctx) {
  fab_group_ctx* x = fab_obj_get(rma_ctx, FAB_OBJ_COLL_CTX);
  if (!x) {
    FAB_WARN("destroyContext: %p is not a live RMA context (destroyed twice, or its comm closed first?)", rma_ctx);
    return FAB_ERR_INTERNAL;
  }
  fab_group* g = x->group;
  pthread_mutex_lock(&g->lock);
  fab_obj_remove(rma_ctx, FAB_OBJ_COLL_CTX);
  fab_list_del(&x->node);
  pthread_mutex_unlock(&g->lock);
  free(x);
  return FAB_OK;
}

static fab_group* group_of_ctx(void* rma_ctx, const char* fn) {
  fab_group_ctx* x = fab_obj_get(rma_ctx, FAB_OBJ_COLL_CTX);
  if (x) return x->group;
  fab_group* g = fab_obj_get(rma_ctx, FAB_OBJ_COLL); /* GIN v11/v12 pass the comm itself */
  if (g) return g;
  FAB_WARN("%s: %p is not a live RMA context or collective comm; pass what createContext (or connect) returned", fn,
           rma_ctx);
  return NULL;
}

fab_result fab_rma_progress(void* rma_ctx) {
  fab_group* g = group_of_ctx(rma_ctx, "rmaProgress");
  if (!g) return FAB_ERR_INTERNAL;
  fab_group_progress(g);
  return (fab_result)atomic_load(&g->failed); /* its one WARN was given when it failed */
}

fab_result fab_rma_query_last_error(void* rma_ctx, bool* has_error) {
  if (!has_error) return fab_bad_argument("queryLastError", "hasError", 0, "a non-NULL pointer");
  fab_group* g = group_of_ctx(rma_ctx, "queryLastError");
  if (!g) return FAB_ERR_INTERNAL;
  /* the group's failure, or any operation of it that test reported failed: sticky, as a failure is final */
  *has_error = atomic_load(&g->failed) != 0 || atomic_load(&g->op_failed) != 0;
  return FAB_OK;
}

/* --- symmetric registration ----------------------------------------------------------- */

/* One rank's part of a registration: its window, and where its staging
 * ring for GPU windows is (stage_slots 0: it has none yet). */
typedef struct win_part {
  uint32_t magic, id;
  uint64_t addr, len, key;
  uint32_t check;
  uint32_t flags; /* WIN_STAGED: the window is GPU memory the provider cannot reach */
  uint64_t stage_addr, stage_key;
  uint32_t stage_slots, stage_slot_bytes;
} win_part;
_Static_assert(sizeof(win_part) == FAB_GROUP_XCHG_BYTES, "win_part is one exchange part");
enum { WIN_STAGED = 1 };

static uint32_t win_check(const win_part* p) {
  return p->magic ^ p->id ^ (uint32_t)p->addr ^ (uint32_t)(p->addr >> 32) ^ (uint32_t)p->len ^ (uint32_t)p->key ^
         p->flags ^ (uint32_t)p->stage_addr ^ (uint32_t)(p->stage_addr >> 32) ^ (uint32_t)p->stage_key ^
         p->stage_slots ^ p->stage_slot_bytes ^ 0x4d595357u;
}

static win_part our_part(fab_group* g, fab_group_win* w) {
  win_part p = {.magic = WIN_MAGIC, .id = w->id, .len = w->len, .flags = w->staged ? WIN_STAGED : 0};
  if (w->mr) {
    p.addr = fab_mr_remote_addr(w->mr, (void*)w->base);
    p.key = w->mr->key;
  }
  if (g->rx_mem) {
    p.stage_addr = g->rx_reg.win.addr;
    p.stage_key = g->rx_reg.win.key;
    p.stage_slots = g->rx_slots;
    p.stage_slot_bytes = g->rx_slot_bytes;
  }
  p.check = win_check(&p);
  return p;
}

/* Where our chunks go in rank r's staging ring, from its part. */
static const char* learn_ring(fab_group* g, int r, const win_part* in) {
  fab_group_peer* p = &g->peers[r];
  if (!in->stage_slots) return in->flags & WIN_STAGED ? "a staged window without a staging ring" : NULL;
  if (in->stage_slots < 2 || in->stage_slots > 1024 || in->stage_slot_bytes < 65536 ||
      in->stage_slot_bytes > (64u << 20))
    return "a staging ring of impossible size";
  if (p->stage_slots && (p->stage_slots != in->stage_slots || p->stage_slot_bytes != in->stage_slot_bytes ||
                         p->stage.key != in->stage_key))
    return "a staging ring other than the one it announced before";
  uint64_t ring = (uint64_t)in->stage_slots * in->stage_slot_bytes;
  p->stage = (fab_window){.addr = in->stage_addr + (uint64_t)g->rank * ring, .len = ring, .key = in->stage_key};
  p->stage_slot_bytes = in->stage_slot_bytes;
  p->stage_slots = in->stage_slots; /* last: the pump reads it under group->lock, as we write it */
  return NULL;
}

/* Every rank's window for registration w, from the exchange. */
static fab_result gather_windows(fab_group* g, fab_group_win* w, const char* fn) {
  int n = g->nranks;
  win_part* parts = calloc((size_t)n, sizeof(*parts));
  win_part* out = calloc((size_t)n, sizeof(*out));
  w->remote = calloc((size_t)n, sizeof(*w->remote));
  w->remote_staged = calloc((size_t)n, 1);
  w->remote_gone = calloc((size_t)n, sizeof(*w->remote_gone));
  fab_result rc = parts && out && w->remote && w->remote_staged && w->remote_gone ? FAB_OK : FAB_ERR_SYSTEM;
  if (rc != FAB_OK) FAB_WARN("%s: out of memory", fn);
  for (int r = 0; rc == FAB_OK && r < n; r++) parts[r] = our_part(g, w);
  if (rc == FAB_OK) rc = fab_group_exchange(g, parts, out, fn);
  for (int r = 0; rc == FAB_OK && r < n; r++) {
    if (out[r].magic != WIN_MAGIC || out[r].check != win_check(&out[r]) || out[r].id != w->id) {
      char why[192];
      snprintf(why, sizeof(why), "rank %d registered window #%u while this rank registered #%u: every rank must call "
               "regMrSym, in the same order", r, out[r].id, w->id);
      rc = fab_group_fail(g, FAB_ERR_INVALID_USAGE, fn, why);
      break;
    }
    w->remote[r] = (fab_window){.addr = out[r].addr, .len = out[r].len, .key = out[r].key};
    w->remote_staged[r] = (out[r].flags & WIN_STAGED) != 0;
    const char* bad = r == g->rank ? NULL : learn_ring(g, r, &out[r]);
    if (bad) {
      char why[192];
      snprintf(why, sizeof(why), "rank %d announced %s (a different plugin build?)", r, bad);
      rc = fab_group_fail(g, FAB_ERR_REMOTE, fn, why);
      break;
    }
  }
  free(parts);
  free(out);
  return rc;
}

/* Makes w findable by id for the target side (peers' signals name it). */
static fab_result publish(fab_group* g, fab_group_win* w, const char* fn) {
  pthread_mutex_lock(&g->target_ep->lock);
  if (w->id >= g->nwins) {
    uint32_t cap = g->nwins ? g->nwins * 2 : 16;
    while (cap <= w->id) cap *= 2;
    fab_group_win** v = realloc(g->wins, cap * sizeof(*v));
    if (!v) {
      pthread_mutex_unlock(&g->target_ep->lock);
      FAB_WARN("%s: out of memory", fn);
      return FAB_ERR_SYSTEM;
    }
    memset(v + g->nwins, 0, (cap - g->nwins) * sizeof(*v));
    g->wins = v;
    g->nwins = cap;
  }
  g->wins[w->id] = w;
  pthread_mutex_unlock(&g->target_ep->lock);
  return FAB_OK;
}

static fab_result reg_sym(fab_group* g, fab_group_win* w, void* data, size_t size, int type, uint64_t offset, int fd,
                          const char* fn) {
  fab_result rc = w->staged ? fab_group_stage_rx_make(g, data, fn)
                            : fab_mr_register_on(g->dev, g->target_ep, data, size, type, offset, fd,
                                                 &w->mr_handle, fn);
  if (rc != FAB_OK) return rc;
  w->mr = w->mr_handle ? fab_obj_get(w->mr_handle, FAB_OBJ_MR) : NULL;
  w->id = g->next_win++;
  rc = gather_windows(g, w, fn);
  if (rc == FAB_OK) rc = publish(g, w, fn);
  if (rc == FAB_OK) {
    w->handle = fab_obj_add(FAB_OBJ_COLL_WIN, w);
    if (!w->handle) {
      FAB_WARN("%s: handle table full", fn);
      rc = FAB_ERR_SYSTEM;
      pthread_mutex_lock(&g->target_ep->lock);
      g->wins[w->id] = NULL;
      pthread_mutex_unlock(&g->target_ep->lock);
    }
  }
  return rc;
}

/* A window in GPU memory: direct where the device registers GPU memory with
 * the provider (FI_HMEM) and the provider makes no CUDA calls of its own
 * (calls_cuda), else staged through host memory (any provider). */
static fab_result gpu_window_ok(fab_group* g, void* data, int* staged, const char* fn) {
  if (!fab_devcopy_ready()) {
    FAB_WARN("%s: %p is NCCL_PTR_CUDA memory, but the CUDA driver is not usable in this process (libcuda.so.1 not "
             "loaded, or no device): GPU windows need it for their copies and signals; check the driver, or "
             "register host memory", fn, data);
    return FAB_ERR_INVALID_USAGE;
  }
  if (!fab_devcopy_is_device(data)) {
    FAB_WARN("%s: %p was passed as NCCL_PTR_CUDA but is not CUDA device memory (cuPointerGetAttribute); pass "
             "NCCL_PTR_HOST for host memory", fn, data);
    return FAB_ERR_INVALID_USAGE;
  }
  fab_device* dev = g->target_ep->dev;
  int calls_cuda = atomic_load(&dev->calls_cuda);
  int direct = !fab_g.params.gpu_emulate && (dev->props.ptr_support & FAB_PTR_CUDA) && !calls_cuda;
  *staged = !direct; /* a staged window is reached by its CUDA address alone: a dma-buf fd goes unused */
  if (direct) g->gpu_direct = 1;
  if (!g->gpu_path_said) {
    g->gpu_path_said = 1;
    FAB_INFO(FAB_SUBSYS_NET, "RMA group on %s: GPU windows %s", g->dev->name,
             direct       ? "direct (the provider registers GPU memory: FI_HMEM, and makes no CUDA calls)"
             : calls_cuda ? "staged through host memory (the provider may call CUDA itself: FABRIC_RMA_STAGE_*)"
                          : "staged through host memory (the provider has no FI_HMEM here: FABRIC_RMA_STAGE_*)");
  }
  return FAB_OK;
}

/* A GPU window whose signal words only the network writes keeps a shadow of
 * them (small windows: NCCL's signal arrays), so a signal is one store. */
static int shadow_make(fab_group_win* w, uint64_t mr_flags) {
  if (!w->gpu || !(mr_flags & FAB_MR_FLAG_SIGNAL_NEVER_RESET) || w->len > FAB_GROUP_SHADOW_MAX) return 0;
  w->shadow = calloc(w->len / 8 + 1, sizeof(*w->shadow));
  w->shadow_known = calloc(w->len / 8 + 1, 1);
  return w->shadow && w->shadow_known ? 0 : -1;
}

static fab_result reg_mr_sym(void* group, void* data, size_t size, int type, uint64_t offset, int fd,
                             uint64_t mr_flags, void** mhandle, void** gin_handle, const char* fn) {
  if (!mhandle) return fab_bad_argument(fn, "mhandle", 0, "a non-NULL pointer");
  *mhandle = NULL;
  if (gin_handle) *gin_handle = NULL;
  fab_group* g = fab_group_get(group, fn);
  if (!g) return FAB_ERR_INTERNAL;
  if (!data || !size) return fab_bad_argument(fn, "data/size", (long long)size, "a non-empty buffer");
  if (type != FAB_PTR_HOST && type != FAB_PTR_CUDA)
    return fab_bad_argument(fn, "type", type, "NCCL_PTR_HOST (1) or NCCL_PTR_CUDA (2)");
  if (size > (size_t)PTRDIFF_MAX || (uintptr_t)data > UINTPTR_MAX - size)
    return fab_bad_argument(fn, "size", (long long)size, "a range inside the address space");
  int staged = 0;
  if (type == FAB_PTR_CUDA) {
    fab_result rc = gpu_window_ok(g, data, &staged, fn);
    if (rc != FAB_OK) return rc;
  }
  fab_group_win* w = calloc(1, sizeof(*w));
  if (!w) {
    FAB_WARN("%s: out of memory", fn);
    return FAB_ERR_SYSTEM;
  }
  w->magic = WIN_MAGIC;
  w->group = g;
  w->base = (uintptr_t)data;
  w->len = size;
  w->gpu = type == FAB_PTR_CUDA;
  w->staged = staged;
  if (shadow_make(w, mr_flags) != 0) {
    fab_group_win_free(w);
    FAB_WARN("%s: out of memory", fn);
    return FAB_ERR_SYSTEM;
  }
  pthread_mutex_lock(&g->xchg_lock);
  fab_result rc = reg_sym(g, w, data, size, type, offset, fd, fn);
  pthread_mutex_unlock(&g->xchg_lock);
  if (rc != FAB_OK) {
    if (w->mr_handle) fab_group_win_free(w);
    else free(w);
    return rc;
  }
  *mhandle = w->handle;
  if (gin_handle) *gin_handle = w->handle; /* the proxy passes it back as the window */
  return FAB_OK;
}

fab_result fab_reg_mr_sym(void* group, void* data, size_t size, int type, uint64_t mr_flags, void** mhandle,
                          void** gin_handle) {
  /* FORCE_SO: signals are applied in order by the target here anyway; NEVER_RESET: shadow_make */
  return reg_mr_sym(group, data, size, type, 0, -1, mr_flags, mhandle, gin_handle, "regMrSym");
}

fab_result fab_reg_mr_sym_dmabuf(void* group, void* data, size_t size, int type, uint64_t offset, int fd,
                                 uint64_t mr_flags, void** mhandle, void** gin_handle) {
  fab_group* g = fab_group_get(group, "regMrSymDmaBuf");
  if (!g) return FAB_ERR_INTERNAL;
  if (fd >= 0 && !(g->dev->props.ptr_support & FAB_PTR_DMABUF)) {
    if (mhandle) *mhandle = NULL;
    FAB_WARN("regMrSymDmaBuf: device %s does not support dma-buf registration (not advertised in ptrSupport); use "
             "regMrSym", g->dev->name);
    return FAB_ERR_INTERNAL;
  }
  return reg_mr_sym(group, data, size, type, offset, fd, mr_flags, mhandle, gin_handle, "regMrSymDmaBuf");
}

fab_result fab_dereg_mr_sym(void* group, void* mhandle) {
  fab_group* g = fab_group_get(group, "deregMrSym");
  if (!g) return FAB_ERR_INTERNAL;
  fab_group_win* w = fab_obj_get(mhandle, FAB_OBJ_COLL_WIN);
  if (!w || w->group != g) {
    FAB_WARN("deregMrSym: %p is not a live symmetric registration of this RMA comm", mhandle);
    return FAB_ERR_INTERNAL;
  }
  fab_obj_remove(mhandle, FAB_OBJ_COLL_WIN);
  fab_group_withdraw(g, w); /* no peer writes into it once its registration closes */
  pthread_mutex_lock(&g->lock); /* no staged chunk is being copied into it, none queued from or into it */
  fab_group_stage_drop_window(g, w);
  pthread_mutex_lock(&g->target_ep->lock);
  g->wins[w->id] = NULL; /* a later signal naming it is refused */
  pthread_mutex_unlock(&g->target_ep->lock);
  pthread_mutex_unlock(&g->lock);
  fab_group_win_free(w);
  return FAB_OK;
}
