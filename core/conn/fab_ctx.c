/* Contexts and devices as listen and connect resolve them, and each
 * physical device's shared endpoint, created on first use. */
#include "fab_conn.h"

fab_ctx* fab_ctx_resolve(fab_ctx* handle, const char* fn) {
  pthread_mutex_lock(&fab_g.lock);
  fab_ctx* ctx = handle ? fab_obj_get(handle, FAB_OBJ_CTX) : fab_g.process;
  pthread_mutex_unlock(&fab_g.lock);
  if (!ctx) {
    FAB_WARN("%s: %s", fn, handle ? "unknown or finalized context" : "no process context: call init first");
  }
  return ctx;
}

fab_device* fab_device_get(int dev, const char* fn) {
  int n = atomic_load(&fab_g.nview);
  if (!fab_g.up || n == 0) {
    FAB_WARN("%s: the plugin is not initialized (call init first)", fn);
    return NULL;
  }
  int idx = fab_device_index(dev);
  if (idx < 0) {
    fab_bad_argument(fn, "dev", dev, n == 1 ? "0 (one device)" : "a device index below devices()");
    return NULL;
  }
  return fab_g.devs[idx];
}

int fab_device_first_rail(int dev, const char* fn) {
  fab_device* d = fab_device_get(dev, fn);
  return !d ? -1 : d->physical ? d->index : d->members[0];
}

static fab_result endpoint_get(fab_device* dev, fab_endpoint** out) {
  int idx = dev->carrier;
  fab_endpoint* ep = atomic_load_explicit(&fab_g.eps[idx], memory_order_acquire);
  if (FAB_LIKELY(ep != NULL)) {
    *out = ep;
    return FAB_OK;
  }
  pthread_mutex_lock(&fab_g.lock);
  fab_result rc = FAB_OK;
  ep = atomic_load(&fab_g.eps[idx]);
  if (!ep) {
    fab_device* phys = fab_g.devs[idx];
    rc = fab_domain_open(phys);
    if (rc == FAB_OK) rc = fab_conn_endpoint_create(phys, &ep);
    if (rc == FAB_OK) atomic_store_explicit(&fab_g.eps[idx], ep, memory_order_release);
  }
  pthread_mutex_unlock(&fab_g.lock);
  *out = ep;
  return rc;
}

fab_result fab_ctx_endpoint(fab_ctx* handle, int dev, const char* fn, fab_ctx** ctx, fab_device** d,
                            fab_endpoint** ep) {
  *ctx = fab_ctx_resolve(handle, fn);
  *d = *ctx && dev >= 0 && dev < atomic_load(&fab_g.ndevs) ? fab_g.devs[dev] : NULL;
  if (*ctx && !*d) FAB_WARN("%s: device %d is not one of ours (0..%d)", fn, dev, atomic_load(&fab_g.ndevs) - 1);
  if (!*d) return FAB_ERR_INTERNAL;
  return endpoint_get(*d, ep);
}

