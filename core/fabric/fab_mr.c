#include "fab_mr.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_cuda.h"

/* --- the cache ------------------------------------------------------------ */

static size_t page_size(void) {
  static size_t ps;
  if (!ps) {
    long v = sysconf(_SC_PAGESIZE);
    ps = v > 0 ? (size_t)v : 4096;
  }
  return ps;
}

_Atomic uint64_t fab_mr_generation = 1; /* a comm's cache starts at 0: never valid */

fab_mr_cache* fab_mr_cache_create(void) {
  fab_mr_cache* c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  fab_list_init(&c->handles);
  return c;
}

void fab_mr_cache_destroy(fab_mr_cache* c, fab_mr_close_fn close, void* arg) {
  if (!c) return;
  for (size_t i = 0; i < c->n; i++) {
    if (close) close(arg, c->v[i]);
    free(c->v[i]);
  }
  free(c->v);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Index of the first entry with base > key. */
static size_t upper_bound(const fab_mr_cache* c, uintptr_t key) {
  size_t lo = 0, hi = c->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (c->v[mid]->base <= key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static fab_mr_entry* find(const fab_mr_cache* c, uintptr_t start, uintptr_t end, int type, int cuda_dev,
                          const fab_endpoint* owner) {
  for (size_t i = upper_bound(c, start); i-- > 0;) {
    fab_mr_entry* e = c->v[i];
    if (e->base + c->max_len < end) break; /* nothing further left can reach end */
    if (e->base <= start && e->base + e->len >= end && e->type == type && e->cuda_dev == cuda_dev &&
        e->owner == owner)
      return e;
  }
  return NULL;
}

static int insert(fab_mr_cache* c, fab_mr_entry* e) {
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 16;
    fab_mr_entry** v = realloc(c->v, cap * sizeof(*v));
    if (!v) return -1;
    c->v = v;
    c->cap = cap;
  }
  size_t at = upper_bound(c, e->base);
  memmove(&c->v[at + 1], &c->v[at], (c->n - at) * sizeof(*c->v));
  c->v[at] = e;
  c->n++;
  if (e->len > c->max_len) c->max_len = e->len;
  return 0;
}

fab_mr_entry* fab_mr_cache_acquire(fab_mr_cache* c, uintptr_t addr, size_t len, int type, int cuda_dev,
                                   const fab_endpoint* owner, fab_mr_reg_fn reg, void* arg, int* err) {
  /* Host memory is registered by whole pages (a sub-range of a registered
   * buffer then hits); GPU memory exactly as given: host pages past the end
   * of a CUDA allocation may belong to no allocation, or to another one. */
  size_t ps = type == FAB_PTR_CUDA ? 1 : page_size();
  uintptr_t start = addr & ~(uintptr_t)(ps - 1);
  uintptr_t end = (addr + (len ? len : 1) + ps - 1) & ~(uintptr_t)(ps - 1);
  *err = 0;
  pthread_mutex_lock(&c->lock);
  fab_mr_entry* e = find(c, start, end, type, cuda_dev, owner);
  if (e) {
    e->refs++;
    c->hits++;
    pthread_mutex_unlock(&c->lock);
    return e;
  }
  c->misses++;
  e = calloc(1, sizeof(*e));
  if (!e) {
    *err = -FI_ENOMEM;
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  e->base = start;
  e->len = end - start;
  e->type = type;
  e->cuda_dev = cuda_dev;
  e->owner = owner;
  e->refs = 1;
  e->cached = 1;
  int rc = reg ? reg(arg, e) : 0;
  if (rc == 0 && insert(c, e) != 0) rc = -FI_ENOMEM;
  if (rc != 0) {
    *err = rc;
    free(e);
    e = NULL;
  }
  pthread_mutex_unlock(&c->lock);
  return e;
}

void fab_mr_cache_release(fab_mr_cache* c, fab_mr_entry* e, fab_mr_close_fn close, void* arg) {
  pthread_mutex_lock(&c->lock);
  if (--e->refs > 0) {
    pthread_mutex_unlock(&c->lock);
    return;
  }
  if (e->cached) {
    for (size_t i = 0; i < c->n; i++) {
      if (c->v[i] != e) continue;
      memmove(&c->v[i], &c->v[i + 1], (c->n - i - 1) * sizeof(*c->v));
      c->n--;
      break;
    }
  }
  pthread_mutex_unlock(&c->lock);
  if (close) close(arg, e);
  free(e);
}

/* --- libfabric backend ---------------------------------------------------- */

typedef struct {
  fab_device* dev;
  fab_endpoint* ep; /* binds the registration (FI_MR_ENDPOINT) */
  int dmabuf_fd;
  uint64_t dmabuf_offset;
} reg_args;

static int fi_backend_reg(void* arg, fab_mr_entry* e) {
  reg_args* a = arg;
  fab_domain* dom = a->dev->dom;
  struct iovec iov = {.iov_base = (void*)e->base, .iov_len = e->len};
  struct fi_mr_attr attr;
  memset(&attr, 0, sizeof(attr));
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = a->dev->mr_access;
  attr.requested_key = a->dev->prov_key ? 0 : atomic_fetch_add(&dom->next_key, 1);
  attr.iface = FI_HMEM_SYSTEM;
  uint64_t flags = 0;
  if (e->type == FAB_PTR_CUDA) {
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = e->cuda_dev;
  }
#ifdef FI_MR_DMABUF
  struct fi_mr_dmabuf dmabuf;
  if (a->dmabuf_fd >= 0) {
    dmabuf.fd = a->dmabuf_fd;
    dmabuf.offset = a->dmabuf_offset;
    dmabuf.len = e->len;
    dmabuf.base_addr = (void*)e->base;
    attr.dmabuf = &dmabuf;
    flags |= FI_MR_DMABUF;
  }
#endif
  int rc = fi_mr_regattr(dom->domain, &attr, flags, &e->mr);
  if (rc == 0 && e->owner) rc = fab_ep_bind_mr(a->ep, e->mr);
  if (rc != 0) {
    if (e->mr) fi_close(&e->mr->fid);
    e->mr = NULL;
    return rc;
  }
  e->desc = fi_mr_desc(e->mr);
  e->key = fi_mr_key(e->mr);
  e->access = attr.access;
  return 0;
}

static void fi_backend_close(void* arg, fab_mr_entry* e) {
  (void)arg;
  if (e->mr) fi_close(&e->mr->fid);
  e->mr = NULL;
}

/* --- handles ------------------------------------------------------------- */

static fab_result reg_entry(fab_endpoint* ep, fab_mr* m, int fd, uint64_t offset, const char* fn) {
  fab_device* dev = ep->dev;
  reg_args a = {.dev = dev, .ep = ep, .dmabuf_fd = fd, .dmabuf_offset = offset};
  int err = 0;
  if (fd >= 0) {
    /* A dma-buf registration is private: NCCL closes the fd after the call. */
    fab_mr_entry* e = calloc(1, sizeof(*e));
    if (!e) {
      FAB_WARN("%s: out of memory registering %zu bytes", fn, m->len);
      return FAB_ERR_SYSTEM;
    }
    e->base = m->addr;
    e->len = m->len;
    e->type = m->type;
    e->cuda_dev = m->cuda_dev;
    e->owner = m->owner;
    e->refs = 1;
    err = fi_backend_reg(&a, e);
    if (err) free(e);
    else m->entry = e;
  } else {
    m->entry = fab_mr_cache_acquire(dev->dom->mr_cache, m->addr, m->len, m->type, m->cuda_dev, m->owner,
                                    fi_backend_reg, &a, &err);
  }
  if (!m->entry) {
    FAB_WARN("%s: registering %zu bytes at %p (%s memory) on %s/%s failed: %s. Check the memory lock limit "
             "(ulimit -l) and that the provider supports this memory type",
             fn, m->len, (void*)m->addr, m->type == FAB_PTR_CUDA ? "CUDA" : "host", fab_device_provider(dev),
             dev->name, fi_strerror(-err));
    return FAB_ERR_SYSTEM;
  }
  m->desc = m->entry->desc;
  m->key = m->entry->key;
  return FAB_OK;
}

fab_result fab_mr_register(fab_comm* c, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle,
                           const char* fn) {
  return fab_mr_register_on(c->dev, c->ep, data, size, type, offset, fd, mhandle, fn);
}

fab_result fab_mr_register_on(fab_device* named, fab_endpoint* ep, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle, const char* fn) {
  fab_device* dev = ep->dev;
  if (type != FAB_PTR_HOST && type != FAB_PTR_CUDA) {
    FAB_WARN("%s: memory type %d is not NCCL_PTR_HOST (1) or NCCL_PTR_CUDA (2)", fn, type);
    return FAB_ERR_INTERNAL;
  }
  if (type == FAB_PTR_CUDA && !(named->props.ptr_support & FAB_PTR_CUDA)) {
    FAB_WARN("%s: CUDA memory at %p on device %s, which does not support it (provider %s %s FI_HMEM, CUDA driver %s); "
             "use host buffers or a provider with GPUDirect",
             fn, data, named->name, fab_device_provider(dev), dev->hmem ? "has" : "lacks",
             fab_g.cuda_ok ? "usable" : "unusable");
    return FAB_ERR_INTERNAL;
  }
  fab_mr* m = calloc(1, sizeof(*m));
  if (!m) {
    FAB_WARN("%s: out of memory", fn);
    return FAB_ERR_SYSTEM;
  }
  m->addr = (uintptr_t)data;
  m->len = size;
  m->type = type;
  m->cuda_dev = -1;
  m->dev = dev;
  m->owner = dev->mr_endpoint ? ep : NULL;
  m->key = FI_KEY_NOTAVAIL;
  atomic_init(&m->refs, 1); /* the handle */
  if (type == FAB_PTR_CUDA) {
    m->cuda_dev = fab_cuda_ptr_device(data);
    if (m->cuda_dev < 0) {
      FAB_WARN("%s: %p is not CUDA device memory (cuPointerGetAttribute failed); pass NCCL_PTR_HOST for host "
               "memory", fn, data);
      free(m);
      return FAB_ERR_CUDA;
    }
  }
  if (fd >= 0 || type == FAB_PTR_CUDA || dev->reg_host) {
    fab_result rc = reg_entry(ep, m, fd, offset, fn);
    if (rc != FAB_OK) {
      free(m);
      return rc;
    }
  }
  m->handle = fab_obj_add(FAB_OBJ_MR, m);
  if (!m->handle) {
    FAB_WARN("%s: too many memory handles (handle table full); deregister unused buffers", fn);
    if (m->entry) fab_mr_cache_release(dev->dom->mr_cache, m->entry, fi_backend_close, NULL);
    free(m);
    return FAB_ERR_SYSTEM;
  }
  fab_mr_cache* cache = dev->dom->mr_cache;
  pthread_mutex_lock(&cache->lock);
  fab_list_push(&cache->handles, &m->node);
  pthread_mutex_unlock(&cache->lock);
  *mhandle = m->handle;
  return FAB_OK;
}

/* Closes the libfabric registration behind m: from here on a peer's write
 * with its key is refused by the provider (nothing lands). */
static void release_entry(fab_mr* m) {
  fab_mr_cache* cache = m->dev->dom->mr_cache;
  if (m->entry) {
    if (m->entry->cached) {
      fab_mr_cache_release(cache, m->entry, fi_backend_close, NULL);
    } else {
      fi_backend_close(NULL, m->entry);
      free(m->entry);
    }
  }
  m->entry = NULL;
}

void fab_mr_unhold(fab_mr* m) {
  if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) free(m);
}

/* NCCL deregisters, then closes: a receive announced to a peer may be taking
 * its data right now (or a send still waiting for its receive may be about
 * to be written). It gets FAB_CLOSE_DRAIN_MS to finish (receives live on
 * the device's shared endpoint, driven here) before the registration closes
 * under it: a write refused mid-way on tcp;ofi_rxm takes the whole
 * connection between the two processes down with it. */
static void wait_announced(fab_mr* m) {
  fab_endpoint* ep = atomic_load_explicit(&fab_g.eps[m->dev->carrier], memory_order_acquire);
  if (!ep) return;
  int64_t until = fab_now_ms() + FAB_CLOSE_DRAIN_MS;
  while (atomic_load_explicit(&m->refs, memory_order_acquire) > 1 && fab_now_ms() < until) {
    pthread_mutex_lock(&ep->lock);
    fab_result rc = fab_ep_progress_locked(ep);
    pthread_mutex_unlock(&ep->lock);
    if (rc != FAB_OK) return;
    sched_yield();
  }
}

void fab_mr_warn_held(const void* mhandle, int held) {
  FAB_WARN("deregMr: %p still backs %d operation%s (receives announced to a peer, or sends waiting for their "
           "receive); the peer's writes into such receives are now refused, such sends are not written, and both "
           "fail with an error; deregister after they complete, or close their comm first",
           mhandle, held, held == 1 ? "" : "s");
}

fab_result fab_mr_deregister_held(void* mhandle, int* held_out) {
  *held_out = 0;
  fab_mr* m = fab_obj_remove(mhandle, FAB_OBJ_MR);
  /* after the removal: a comm that read the old generation cached m before
   * it, and drops it at its next call */
  atomic_fetch_add_explicit(&fab_mr_generation, 1, memory_order_acq_rel);
  if (!m) {
    fab_obj_kind k = fab_obj_kind_of(mhandle);
    FAB_WARN("deregMr: %p is %s%s; pass a handle from regMr that was not deregistered yet", mhandle,
             k ? "a " : "not a live memory handle", k ? fab_obj_kind_name(k) : " (unknown or already deregistered)");
    return FAB_ERR_INTERNAL;
  }
  if (atomic_load_explicit(&m->refs, memory_order_acquire) > 1) wait_announced(m);
  fab_mr_cache* cache = m->dev->dom->mr_cache;
  pthread_mutex_lock(&cache->lock);
  fab_list_del(&m->node);
  pthread_mutex_unlock(&cache->lock);
  release_entry(m);
  int held = atomic_load_explicit(&m->refs, memory_order_acquire) - 1;
  if (held > 0) {
    atomic_store_explicit(&m->gone, 1, memory_order_release);
    /* again, after gone: a receive that saw the generation move also sees gone (rd_recv_check_gone) */
    atomic_fetch_add_explicit(&fab_mr_generation, 1, memory_order_acq_rel);
    *held_out = held;
  }
  fab_mr_unhold(m);
  return FAB_OK;
}

fab_result fab_mr_deregister(void* mhandle) {
  int held;
  fab_result rc = fab_mr_deregister_held(mhandle, &held);
  if (held > 0) fab_mr_warn_held(mhandle, held);
  return rc;
}

fab_result fab_mr_resolve_fail(fab_comm* c, void* mhandle, const void* data, size_t size, const char* fn) {
  if (!mhandle) {
    FAB_WARN("%s: NULL memory handle, but provider %s needs registered buffers; register with regMr first", fn,
             fab_device_provider(c->ep->dev));
    return FAB_ERR_INTERNAL;
  }
  fab_mr* m = fab_obj_get(mhandle, FAB_OBJ_MR);
  if (!m) {
    FAB_WARN("%s: unknown memory handle %p (never registered, or already deregistered)", fn, mhandle);
    return FAB_ERR_INTERNAL;
  }
  uintptr_t a = (uintptr_t)data;
  if (a < m->addr || size > m->len || a - m->addr > m->len - size) {
    FAB_WARN("%s: buffer %p + %zu bytes lies outside its registration %p + %zu bytes", fn, data, size,
             (void*)m->addr, m->len);
    return FAB_ERR_INTERNAL;
  }
  if (m->dev != c->ep->dev) {
    FAB_WARN("%s: memory handle registered on device %s used on device %s; register on a comm of this device", fn,
             m->dev->name, c->ep->dev->name);
    return FAB_ERR_INTERNAL;
  }
  FAB_WARN("%s: memory handle registered with another comm's endpoint; provider %s binds registrations to an "
           "endpoint (FI_MR_ENDPOINT, so regIsGlobal is 0 here): register the buffer with this comm", fn,
           fab_device_provider(c->ep->dev));
  return FAB_ERR_INTERNAL;
}

void fab_mr_domain_close(fab_device* dev) {
  fab_mr_cache* cache = dev->dom ? dev->dom->mr_cache : NULL;
  if (!cache) return;
  FAB_LIST_FOREACH_SAFE(it, tmp, &cache->handles) {
    fab_mr* m = FAB_CONTAINER_OF(it, fab_mr, node);
    fab_list_del(&m->node);
    fab_obj_remove(m->handle, FAB_OBJ_MR);
    atomic_fetch_add_explicit(&fab_mr_generation, 1, memory_order_acq_rel);
    if (m->entry && !m->entry->cached) {
      fi_backend_close(NULL, m->entry);
      free(m->entry);
    } else if (m->entry) {
      m->entry->refs--; /* the cache destroy below closes what remains */
    }
    free(m);
  }
  fab_mr_cache_destroy(cache, fi_backend_close, NULL);
  dev->dom->mr_cache = NULL;
}

fab_result fab_mr_iflush(fab_comm* c, int n, void** data, const int* sizes, fab_mr** mrs, void** request) {
  (void)data;
  *request = NULL; /* flushes complete before returning */
  int need = 0;
  for (int i = 0; i < n; i++) need |= mrs[i] && mrs[i]->type == FAB_PTR_CUDA && sizes[i] > 0;
  if (FAB_LIKELY(!need)) return FAB_OK;
  const char* what;
  int rc = fab_cuda_flush(&what);
  if (rc != 0) {
    FAB_WARN("iflush after a receive from %s: %s failed (CUresult %d); the received GPU data may not be visible",
             c->peer_name, what, rc);
    return FAB_ERR_CUDA;
  }
  return FAB_OK;
}
