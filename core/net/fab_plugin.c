/*
 * Engine lifetime, contexts and the device queries.
 *
 *  - fab_init (net v11+) creates one context per communicator, config copied;
 *    each is paired with one fab_finalize.
 *  - fab_init_process (net v10 and older) creates the process context once;
 *    NCCL never finalizes it, so it lives until the library is unloaded.
 *  - The engine (params, devices, CUDA probe) comes up with the first init of
 *    either kind and goes down with the last fab_finalize when no process
 *    context exists, or in the library destructor (dlclose or exit). No
 *    atexit. All static state is reset on the way down, so the library works
 *    again after dlclose + dlopen and after finalize + init.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fab_prof.h"
#include "fab_conn.h"
#include "fab_cuda.h"
#include "fab_devcopy.h"
#include "fab_engine.h"
#include "fab_rails.h"
#include "fab_transport.h"
#include "fab_version.h" /* written by codegen/version.cmake into the build tree */

fab_engine fab_g = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* libfabric stays loaded once it was: NCCL may dlclose and dlopen this
 * library per communicator, and reloading libfabric each time would rerun its
 * provider discovery (psm2, verbs, ...) and leak what those libraries never
 * free on unload. Our own state is still torn down completely. */
static void pin_libfabric(void) {
  void* h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  if (h) dlclose(h);
}

static fab_result engine_up(void) {
  if (fab_g.up) return FAB_OK;
  pin_libfabric();
  fab_list_init(&fab_g.ctxs);
  uint32_t rt = fi_version();
  FAB_INFO(FAB_SUBSYS_INIT, "fabric %s (commit %s), built against libfabric %d.%d, running on %u.%u", FAB_VERSION,
           FAB_COMMIT, FI_MAJOR_VERSION, FI_MINOR_VERSION, FI_MAJOR(rt), FI_MINOR(rt));
  char bad[512];
  if (fab_params_load(&fab_g.params, bad, sizeof(bad)) != 0) FAB_WARN("ignored bad parameter values: %s", bad);
  fab_g.cuda_ok = fab_cuda_init();
  fab_devcopy_init(fab_g.cuda_ok, fab_g.params.gpu_emulate);
  const fab_transport_ops* cands[4];
  int ncands = fab_transport_candidates(cands, 4);
  fab_result rc = fab_devices_discover(cands, ncands);
  if (rc != FAB_OK) {
    fab_devices_release();
    fab_devcopy_fini();
    fab_cuda_fini();
    fab_g.cuda_ok = 0;
    return rc;
  }
  if (fab_signals_reset_psm() > 0)
    FAB_INFO(FAB_SUBSYS_INIT, "reset the crash and SIGTERM handlers a PSM library installed during discovery "
             "(they write *.btr files and call exit()); see core/fabric/fab_signals.c");
  fab_g.up = 1;
  const fab_device* d0 = fab_g.devs[0];
  int onesided = d0->ops->onesided_data != NULL;
  FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET,
           "engine up: %d devices on %s, CUDA %s; one-sided calls (RMA, GIN proxy, Neuron iwrite/iread): %s%s",
           atomic_load(&fab_g.nview), fab_device_provider(d0), fab_g.cuda_ok ? "usable" : "not usable",
           onesided ? "yes" : "no [needs_rdma_transport]: they need the rdma transport, and this device runs sendrecv",
           onesided && d0->cq_narrow ? ", in the 4-byte CQ data format" : "");
  return FAB_OK;
}

/* Closes what the runtime left open in ctx; the shared endpoints stay. */
static void ctx_destroy(fab_ctx* ctx) {
  fab_obj_remove(ctx->handle, FAB_OBJ_CTX); /* from here on its handle is refused */
  int left = fab_rails_close_owned(ctx); /* before their rails, which the loop below would close under them */
  for (int i = 0; i < FAB_MAX_DEVICES; i++) {
    fab_endpoint* ep = atomic_load(&fab_g.eps[i]);
    if (!ep) continue;
    left += fab_listen_close_owned(ep, ctx);
    left += fab_connect_drop_owned(ep, ctx);
    left += fab_comm_close_owned(ep, ctx);
  }
  if (left) FAB_INFO(FAB_SUBSYS_INIT, "finalize: closed %d comms, listeners or connects the runtime left open", left);
  fab_list_del(&ctx->node);
  free(ctx);
}

static void engine_down(void) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &fab_g.ctxs) ctx_destroy(FAB_CONTAINER_OF(it, fab_ctx, node));
  for (int i = 0; i < FAB_MAX_DEVICES; i++) fab_endpoint_destroy(atomic_exchange(&fab_g.eps[i], NULL));
  int buried = fab_endpoint_reap();
  if (buried)
    FAB_INFO(FAB_SUBSYS_INIT, "finalize: %d endpoints stay open: endpoints of this process not closed through the "
             "plugin still address them", buried);
  fab_devices_release();
  fab_devcopy_fini();
  fab_cuda_fini();
  fab_obj_reset();
  fab_g.up = 0;
  fab_g.ninit = 0;
  fab_g.process = NULL;
  fab_g.cuda_ok = 0;
  FAB_INFO(FAB_SUBSYS_INIT, "engine down");
  fab_log_set_logger(NULL);
}

static fab_ctx* ctx_create(uint64_t comm_id, const fab_comm_config* config, int is_process) {
  fab_ctx* ctx = calloc(1, sizeof(*ctx));
  if (!ctx) return NULL;
  ctx->comm_id = comm_id;
  ctx->is_process = is_process;
  ctx->config.traffic_class = config ? config->traffic_class : -1;
  ctx->handle = fab_obj_add(FAB_OBJ_CTX, ctx);
  if (!ctx->handle) {
    free(ctx);
    return NULL;
  }
  fab_list_push(&fab_g.ctxs, &ctx->node);
  return ctx;
}

fab_result fab_init(fab_ctx** ctx, uint64_t comm_id, const fab_comm_config* config, fab_logger_fn logger,
                    fab_profiler_fn profiler) {
  fab_prof_set(profiler);
  if (logger) fab_log_set_logger(logger);
  if (!ctx) return fab_bad_argument("init", "ctx", 0, "a non-NULL pointer");
  *ctx = NULL;
  pthread_mutex_lock(&fab_g.lock);
  fab_result rc = engine_up();
  fab_ctx* c = rc == FAB_OK ? ctx_create(comm_id, config, 0) : NULL;
  if (rc == FAB_OK && !c) {
    FAB_WARN("init: out of memory creating a context");
    if (fab_g.ninit == 0 && !fab_g.process) engine_down();
    rc = FAB_ERR_SYSTEM;
  }
  if (c) {
    fab_g.ninit++;
    *ctx = c->handle;
  }
  pthread_mutex_unlock(&fab_g.lock);
  return rc;
}

fab_result fab_init_process(fab_logger_fn logger, fab_profiler_fn profiler) {
  fab_prof_set(profiler);
  if (logger) fab_log_set_logger(logger);
  pthread_mutex_lock(&fab_g.lock);
  fab_result rc = engine_up();
  if (rc == FAB_OK && !fab_g.process) {
    fab_g.process = ctx_create(0, NULL, 1);
    if (!fab_g.process) {
      FAB_WARN("init: out of memory creating the process context");
      if (fab_g.ninit == 0) engine_down();
      rc = FAB_ERR_SYSTEM;
    }
  }
  pthread_mutex_unlock(&fab_g.lock);
  return rc;
}

fab_result fab_fini_process(void) {
  pthread_mutex_lock(&fab_g.lock);
  fab_ctx* ctx = fab_g.process;
  if (!ctx) {
    pthread_mutex_unlock(&fab_g.lock);
    FAB_WARN("fini: the plugin is not initialised (fini called twice, or before init)");
    return FAB_ERR_INTERNAL;
  }
  fab_g.process = NULL;
  ctx_destroy(ctx);
  if (fab_g.ninit == 0) engine_down();
  pthread_mutex_unlock(&fab_g.lock);
  return FAB_OK;
}

fab_result fab_finalize(fab_ctx* handle) {
  pthread_mutex_lock(&fab_g.lock);
  fab_ctx* ctx = fab_obj_get(handle, FAB_OBJ_CTX);
  if (!ctx || ctx->is_process) {
    pthread_mutex_unlock(&fab_g.lock);
    FAB_WARN("finalize: %p is not a live context from init (already finalized?)", (void*)handle);
    return FAB_ERR_INTERNAL;
  }
  ctx_destroy(ctx);
  if (--fab_g.ninit == 0 && !fab_g.process) engine_down();
  pthread_mutex_unlock(&fab_g.lock);
  return FAB_OK;
}

/* Unloading must never block forever: the destructor also runs from exit()
 * called in a signal handler (libinfinipath's, see fab_signals.c) while the
 * crashed or signalled thread holds the engine lock or an endpoint lock, and
 * would wait for it for ever. Each lock gets until one shared deadline
 * (FAB_UNLOAD_WAIT_MS in all); a lock still held then means teardown is
 * skipped: the process is going away, and leaking beats hanging. */
enum { FAB_UNLOAD_WAIT_MS = 1500 };

static int lock_by(pthread_mutex_t* m, const struct timespec* deadline) {
  return pthread_mutex_timedlock(m, deadline) == 0;
}

/* 1 when no endpoint lock is held now (each taken and released at once).
 * Engine lock held, so no endpoint comes or goes. */
static int endpoint_locks_free(const struct timespec* deadline) {
  for (int i = 0; i < FAB_MAX_DEVICES; i++) {
    fab_endpoint* ep = atomic_load(&fab_g.eps[i]);
    if (!ep) continue;
    if (!lock_by(&ep->lock, deadline)) return 0;
    int ok = 1;
    FAB_LIST_FOREACH_SAFE(it, tmp, &ep->privates) {
      fab_endpoint* own = FAB_CONTAINER_OF(it, fab_endpoint, private_node);
      if (ok && lock_by(&own->lock, deadline)) pthread_mutex_unlock(&own->lock);
      else ok = 0;
    }
    pthread_mutex_unlock(&ep->lock);
    if (!ok) return 0;
  }
  return 1;
}

/* Comms and one-sided groups the runtime has not closed. At exit() another
 * thread may still be inside test() or isend() on one of them (the data path
 * takes no lock), so tearing them down would free memory under it (seen as a
 * crash in fab_req_put). Where any is open the process keeps them: at exit
 * the kernel closes what libfabric holds, and the names of our shared-memory
 * regions are removed here; a dlclose with comms open (no NCCL does that)
 * leaks them rather than risk a crash. */
static uint32_t open_comms(void) {
  static const fab_obj_kind kinds[] = {FAB_OBJ_LISTEN,      FAB_OBJ_SEND,       FAB_OBJ_RECV,
                                       FAB_OBJ_COLL,        FAB_OBJ_COLL_CTX,   FAB_OBJ_RAILS_LISTEN,
                                       FAB_OBJ_RAILS_SEND,  FAB_OBJ_RAILS_RECV};
  uint32_t n = 0;
  for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) n += fab_obj_live(kinds[i]);
  return n;
}

__attribute__((destructor)) static void fab_unload(void) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += FAB_UNLOAD_WAIT_MS / 1000;
  deadline.tv_nsec += (long)(FAB_UNLOAD_WAIT_MS % 1000) * 1000000L;
  if (deadline.tv_nsec >= 1000000000L) deadline.tv_sec++, deadline.tv_nsec -= 1000000000L;
  if (!lock_by(&fab_g.lock, &deadline)) {
    FAB_WARN("unload: the plugin's engine lock is still held after %d ms (a thread crashed or was signalled inside "
             "the plugin?); its state is left to the exiting process", FAB_UNLOAD_WAIT_MS);
    fab_endpoint_unlink_names(); /* what the kernel would not clean up: shared-memory regions */
    return;
  }
  uint32_t open = fab_g.up ? open_comms() : 0;
  if (open) {
    FAB_INFO(FAB_SUBSYS_INIT, "unload: %u comms are still open (the process ends without closing them); they are "
             "left to the exiting process, since another thread may still be using them", open);
    fab_endpoint_unlink_names();
    pthread_mutex_unlock(&fab_g.lock);
    return;
  }
  if (fab_g.up && !endpoint_locks_free(&deadline)) {
    FAB_WARN("unload: an endpoint lock is still held after %d ms (a thread crashed or was signalled inside the "
             "plugin?); skipping teardown, its state is left to the exiting process", FAB_UNLOAD_WAIT_MS);
    fab_endpoint_unlink_names();
    pthread_mutex_unlock(&fab_g.lock);
    return;
  }
  if (fab_g.up) engine_down();
  pthread_mutex_unlock(&fab_g.lock);
  fab_pool_release_spares();
  fab_reqmem_release();
}

/* --- devices -------------------------------------------------------------------- */

fab_result fab_devices(int* ndev) {
  if (!ndev) return fab_bad_argument("devices", "ndev", 0, "a non-NULL pointer");
  *ndev = 0;
  if (!fab_g.up) {
    FAB_WARN("devices: the plugin is not initialized (call init first)");
    return FAB_ERR_INTERNAL;
  }
  *ndev = atomic_load(&fab_g.nview);
  return FAB_OK;
}

fab_result fab_get_properties(int dev, fab_properties* props) {
  if (!props) return fab_bad_argument("getProperties", "props", 0, "a non-NULL pointer");
  fab_device* d = fab_device_get(dev, "getProperties");
  if (!d) return FAB_ERR_INTERNAL;
  *props = d->props;
  return FAB_OK;
}

fab_result fab_make_vdevice(int* dev, const fab_vdevice_props* props) {
  if (!dev || !props) return fab_bad_argument("makeVDevice", dev ? "props" : "d", 0, "a non-NULL pointer");
  pthread_mutex_lock(&fab_g.lock);
  fab_result rc;
  if (!fab_g.up) {
    FAB_WARN("makeVDevice: the plugin is not initialized (call init first)");
    rc = FAB_ERR_INTERNAL;
  } else {
    rc = fab_vdevice_create(props, dev);
  }
  pthread_mutex_unlock(&fab_g.lock);
  return rc;
}

fab_result fab_set_net_attr(fab_ctx* handle, const fab_net_attr* attr) {
  if (!attr) return fab_bad_argument("setNetAttr", "netAttr", 0, "a non-NULL pointer");
  fab_ctx* ctx = fab_ctx_resolve(handle, "setNetAttr");
  if (!ctx) return FAB_ERR_INTERNAL;
  ctx->net_attr = *attr; /* a hint; the sendrecv transport has no use for it yet */
  return FAB_OK;
}
