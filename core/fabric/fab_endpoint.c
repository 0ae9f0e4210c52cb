/*
 * Endpoints: one libfabric endpoint, CQ and AV per physical device (plus the
 * own send endpoints of local-only providers), created on first use.
 * Completion dispatch lives here: every operation's context is a fab_op whose
 * fn handles the completion.
 */
#define _GNU_SOURCE /* pthread_setname_np */
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fab_engine.h"
#include "fab_mr.h"
#include "fab_remote.h"

enum { FAB_CQ_BATCH_MAX = 256 };

fab_result fab_result_from_fi(int fi_err) {
  switch (fi_err < 0 ? -fi_err : fi_err) {
    case FI_ECONNRESET:
    case FI_ECONNREFUSED:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case FI_ENETUNREACH:
    case FI_EADDRNOTAVAIL:
    case FI_ETIMEDOUT:
      return FAB_ERR_REMOTE;
    default:
      return FAB_ERR_SYSTEM;
  }
}

static fab_result open_fail(fab_endpoint* ep, const char* what, int rc) {
  if (what)
    FAB_WARN("%s on %s/%s failed: %s; check the provider's resource limits (FI_LOG_LEVEL=warn tells more)", what,
           fab_device_provider(ep->dev), ep->dev->name, fi_strerror(rc < 0 ? -rc : rc));
  if (ep->ep) fi_close(&ep->ep->fid);
  if (ep->cq) fi_close(&ep->cq->fid);
  if (ep->av) fi_close(&ep->av->fid);
  pthread_mutex_destroy(&ep->lock);
  free(ep);
  return FAB_ERR_SYSTEM;
}

/* Local providers with string addresses (shm) name each endpoint's shared
 * memory region after the process id by default. A region left behind by a
 * killed process then makes fi_enable fail with EBUSY in any later process
 * that gets the same pid. Our own names carry a per-process random nonce,
 * so a stale region can never collide with a live endpoint. */
static _Atomic uint64_t name_nonce;

static uint64_t process_nonce(void) {
  uint64_t n = atomic_load(&name_nonce);
  if (n != 0) return n;
  if (getrandom(&n, sizeof(n), GRND_NONBLOCK) != (ssize_t)sizeof(n))
    n = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&n;
  n |= 1;
  uint64_t expected = 0;
  if (!atomic_compare_exchange_strong(&name_nonce, &expected, n)) n = expected;
  return n;
}

/* Where GPU memory is in use, the provider is told not to call CUDA itself:
 * a provider that copies GPU memory with the CUDA runtime (cudaMemcpy, on the
 * legacy stream) from inside our calls blocks NCCL's proxy thread behind GPU
 * work that waits for that thread. Seen inside NCCL 2.30.7 with libfabric
 * 2.x's shm, which refuses the option ("our CUDA support relies on the
 * ability to call CUDA API"): a put from a GPU window hung in cudaMemcpy
 * (docs/results/gpu-h100x2-2026-11-26-direct-shm.txt). The leading peer
 * plugin asks the same. A provider that does not take the option (refused,
 * unknown, or libfabric before 1.18, which lacks it) is marked calls_cuda: the
 * one-sided engine then stages GPU windows instead of handing them to it. */
static void forbid_cuda_calls(fab_endpoint* ep) {
  if (!ep->dev->hmem || !fab_g.cuda_ok) return;
#if FI_VERSION_GE(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), FI_VERSION(1, 18))
  bool permitted = false;
  int rc = fi_setopt(&ep->ep->fid, FI_OPT_ENDPOINT, FI_OPT_CUDA_API_PERMITTED, &permitted, sizeof(permitted));
  if (rc != 0 && !atomic_exchange(&ep->dev->calls_cuda, 1))
    FAB_INFO(FAB_SUBSYS_INIT, "%s: FI_OPT_CUDA_API_PERMITTED=false refused (%s): the provider may call CUDA itself, "
             "so one-sided GPU windows are staged through host memory", ep->dev->name, fi_strerror(-rc));
  else if (rc == 0)
    FAB_INFO(FAB_SUBSYS_INIT, "%s: FI_OPT_CUDA_API_PERMITTED=false set", ep->dev->name);
#else
  if (!atomic_exchange(&ep->dev->calls_cuda, 1)) /* the option does not exist before libfabric 1.18 */
    FAB_INFO(FAB_SUBSYS_INIT, "%s: built against libfabric before 1.18, which cannot forbid the provider CUDA calls: "
             "one-sided GPU windows are staged through host memory", ep->dev->name);
#endif
}

/* "fabric_<pid>_<nonce>_": the prefix of every endpoint name of this process */
static void name_prefix(char* buf, size_t len) {
  snprintf(buf, len, "fabric_%d_%016llx_", (int)getpid(), (unsigned long long)process_nonce());
}

void fab_endpoint_unlink_names(void) {
  if (atomic_load(&name_nonce) == 0) return; /* no endpoint was named */
  char prefix[64];
  name_prefix(prefix, sizeof(prefix));
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  char path[320];
  for (struct dirent* e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
    snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
    unlink(path);
  }
  closedir(d);
}

int fab_ep_addr_in_process(const fab_endpoint* ep, const void* addr, size_t len) {
  if (!ep->dev->local_only || ep->dev->info->addr_format != FI_ADDR_STR) return 0;
  char prefix[64];
  name_prefix(prefix, sizeof(prefix));
  size_t plen = strlen(prefix);
  const char* a = addr;
  for (size_t i = 0; i + plen <= len; i++)
    if (!memcmp(a + i, prefix, plen)) return 1;
  return 0;
}

static int name_endpoint(fab_endpoint* ep) {
  if (!ep->dev->local_only || ep->dev->info->addr_format != FI_ADDR_STR) return 0;
  static _Atomic uint32_t serial;
  char prefix[64], name[80];
  name_prefix(prefix, sizeof(prefix));
  snprintf(name, sizeof(name), "%s%u", prefix, (unsigned)atomic_fetch_add(&serial, 1));
  int rc = fi_setname(&ep->ep->fid, name, strlen(name) + 1);
  return rc == -FI_ENOSYS || rc == -FI_EOPNOTSUPP ? 0 : rc; /* keep the provider's own name */
}

fab_result fab_endpoint_create(fab_device* dev, const fab_ep_hooks* hooks, fab_endpoint** out) {
  fab_endpoint* ep = calloc(1, sizeof(*ep));
  if (ep) ep->silent_peer = FI_ADDR_NOTAVAIL;
  if (!ep) {
    FAB_WARN("out of memory creating an endpoint on %s", dev->name);
    return FAB_ERR_SYSTEM;
  }
  pthread_mutex_init(&ep->lock, NULL);
  pthread_mutex_init(&ep->helper_lock, NULL);
  atomic_flag_clear(&ep->cq_lock);
  ep->cq_serial = dev->local_only;
  ep->dev = dev;
  ep->hooks = hooks;
  fab_list_init(&ep->listens);
  fab_list_init(&ep->connects);
  fab_list_init(&ep->comms);
  fab_list_init(&ep->parked);
  fab_list_init(&ep->ctl_owed);
  fab_list_init(&ep->retired);
  fab_list_init(&ep->privates);
  fab_list_init(&ep->private_node);
  fab_list_init(&ep->local_node);
  ep->next_conn_id = 1;
  ep->next_connector_id = 1;
  atomic_init(&ep->sweep_every, FAB_SWEEP_EVERY_MIN);
  ep->cq_batch = fab_g.params.cq_read_count;
  if (ep->cq_batch < 1) ep->cq_batch = 1;
  if (ep->cq_batch > FAB_CQ_BATCH_MAX) ep->cq_batch = FAB_CQ_BATCH_MAX;

  struct fid_domain* domain = dev->dom->domain;
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = FI_WAIT_NONE};
  int rc = fi_cq_open(domain, &cq_attr, &ep->cq, NULL);
  if (rc) return open_fail(ep, "fi_cq_open", rc);
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  rc = fi_av_open(domain, &av_attr, &ep->av, NULL);
  if (rc) return open_fail(ep, "fi_av_open", rc);
  rc = fi_endpoint(domain, dev->info, &ep->ep, NULL);
  if (rc) return open_fail(ep, "fi_endpoint", rc);
  rc = fi_ep_bind(ep->ep, &ep->cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc) return open_fail(ep, "fi_ep_bind(cq)", rc);
  rc = fi_ep_bind(ep->ep, &ep->av->fid, 0);
  if (rc) return open_fail(ep, "fi_ep_bind(av)", rc);
  rc = name_endpoint(ep);
  if (rc) return open_fail(ep, "fi_setname", rc);
  forbid_cuda_calls(ep);
  rc = fi_enable(ep->ep);
  if (rc) return open_fail(ep, "fi_enable", rc);
  size_t len = sizeof(ep->addr);
  rc = fi_getname(&ep->ep->fid, ep->addr, &len);
  if (rc == -FI_ETOOSMALL) return open_fail(ep, "fi_getname (address longer than the handle can carry)", rc);
  if (rc) return open_fail(ep, "fi_getname", rc);
  ep->addr_len = len;
  fab_rxm_warm_pool(ep); /* before anything else is posted on it */
  if (dev->local_only && dev->info->addr_format == FI_ADDR_STR) fab_local_register(ep); /* named: peers in this
                                                                                          * process find it */
  char name[128];
  fab_ep_peer_name(ep, FI_ADDR_NOTAVAIL, name, sizeof(name));
  FAB_INFO(FAB_SUBSYS_INIT | FAB_SUBSYS_NET, "endpoint on %s/%s: %s", fab_device_provider(dev), dev->name, name);
  *out = ep;
  return FAB_OK;
}

/* Before an endpoint closes, the operations of its closed comms may finish,
 * for at most FAB_CLOSE_DRAIN_MS: closing cuts a message still leaving in
 * half, and a peer on libfabric 1.17 tcp;ofi_rxm crashes on an RMA write
 * that ends mid-way (docs/known-bugs.md); sends that completed early (the
 * inline ones) would be lost. */
static void drain_closed(fab_endpoint* ep) {
  if (!ep->ep || ep->failed || !ep->hooks || ep->given_up) return;
  int64_t until = fab_now_ms() + FAB_CLOSE_DRAIN_MS;
  pthread_mutex_lock(&ep->lock);
  while (atomic_load_explicit(&ep->nclosing, memory_order_relaxed) > 0 && fab_now_ms() < until) {
    if (fab_ep_progress_locked(ep) != FAB_OK) break; /* sweeps the closed comms */
    pthread_mutex_unlock(&ep->lock);
    sched_yield();
    pthread_mutex_lock(&ep->lock);
  }
  pthread_mutex_unlock(&ep->lock);
}

/* Removes ep's AV entries for endpoints of this process while those are
 * still open (their references keep them so), and lets go of them. */
static void drop_local_entries(fab_endpoint* ep) {
  for (size_t i = 0; i < ep->av_count; i++) {
    fab_av_entry* a = &ep->av_cache[i];
    if (!a->owner) continue;
    if (ep->av) fi_av_remove(ep->av, &a->fi_addr, 1, 0);
    fab_local_unref(a->owner);
    a->owner = NULL;
  }
}

int fab_endpoint_reap(void) {
  for (fab_endpoint* e; (e = fab_local_next_reapable());) fab_endpoint_destroy(e);
  return fab_local_buried_count();
}

static void helper_stop(fab_endpoint* ep);

void fab_endpoint_destroy(fab_endpoint* ep) {
  if (!ep) return;
  helper_stop(ep);
  drain_closed(ep);
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->privates) {
    fab_list_del(it);
    fab_endpoint_destroy(FAB_CONTAINER_OF(it, fab_endpoint, private_node));
  }
  drop_local_entries(ep);
  if (fab_local_leave(ep)) {
    FAB_INFO(FAB_SUBSYS_NET, "endpoint on %s stays open, idle, while another endpoint of this process still "
             "addresses it (libfabric's shm must not drop such an address after its endpoint closed)", ep->dev->name);
    fab_endpoint_reap();
    return;
  }
  ep->destroying = 1;
  /* Closing the endpoint first guarantees libfabric no longer references any
   * context or buffer of ours; only then is everything freed. */
  if (ep->ep) fi_close(&ep->ep->fid);
  ep->ep = NULL;
  if (ep->hooks) ep->hooks->teardown(ep);
  fab_remote_retired_free(ep, 1); /* nothing can write into them any more */
  fab_bounce_free(ep);
  if (ep->cq) fi_close(&ep->cq->fid);
  if (ep->av) fi_close(&ep->av->fid);
  free(ep->av_cache);
  for (int i = 0; i < FAB_ID_PAGES; i++) free((void*)atomic_load(&ep->ids[i]));
  pthread_mutex_destroy(&ep->lock);
  pthread_mutex_destroy(&ep->helper_lock);
  free(ep);
  fab_endpoint_reap();
}

static fab_result cq_failed(fab_endpoint* ep, const char* what, ssize_t rc) {
  ep->failed = FAB_ERR_SYSTEM;
  FAB_WARN("%s on %s/%s failed: %s; the endpoint is unusable, its pending operations cannot complete", what,
           fab_device_provider(ep->dev), ep->dev->name, fi_strerror((int)-rc));
  return FAB_ERR_SYSTEM;
}

static fab_result read_error(fab_endpoint* ep) {
  struct fi_cq_err_entry err;
  memset(&err, 0, sizeof(err));
  int held = fab_ep_serial_enter(ep);
  ssize_t rc = fi_cq_readerr(ep->cq, &err, 0);
  fab_ep_serial_leave(ep, held);
  if (rc == -FI_EAGAIN) return FAB_OK;
  if (rc < 0) return cq_failed(ep, "fi_cq_readerr", rc);
  /* The API says err is a positive errno; libfabric 1.17's shm reports some
   * (FI_ETRUNC) negated. Normalise once here so every handler can compare. */
  if (err.err < 0) err.err = -err.err;
  fab_op* op = err.op_context;
  if (op) {
    op->fn(op, NULL, &err);
  } else {
    /* Not one of ours (shm reports a peer's failed write into our memory
     * this way when the peer dies): what it affects fails on its own, with
     * its WARN, so this is only information. */
    char buf[256] = "";
    FAB_INFO(FAB_SUBSYS_NET, "%s/%s reported an error without an operation: %s (%s); ignored",
             fab_device_provider(ep->dev), ep->dev->name, fi_strerror(err.err),
             fi_cq_strerror(ep->cq, err.prov_errno, err.err_data, buf, sizeof(buf)));
  }
  return FAB_OK;
}

/* A completion that is not an operation of ours: a peer's write with remote
 * CQ data (the transport knows what it means; its op_context is undefined:
 * shm leaves garbage there, so FI_REMOTE_WRITE decides), or nothing we asked
 * for. Runs with the endpoint lock held. */
static __attribute__((noinline)) void dispatch_remote(fab_endpoint* ep, const fab_cqe* e) {
  if ((e->flags & FI_REMOTE_CQ_DATA) && ep->dev->remote_data) ep->dev->remote_data(ep, e);
}

/* fi_cq_read; on local-only providers one thread at a time (ep->cq_serial). */
static inline ssize_t cq_read(fab_endpoint* ep, fab_cqe* e) {
  int held = fab_ep_serial_enter(ep);
  ssize_t n = fi_cq_read(ep->cq, e, (size_t)ep->cq_batch);
  fab_ep_serial_leave(ep, held);
  return n;
}

/* Handles what one fi_cq_read returned. Caller holds ep->lock. */
static fab_result dispatch_locked(fab_endpoint* ep, const fab_cqe* e, ssize_t n) {
  if (n > 0) {
    for (ssize_t i = 0; i < n; i++) {
      fab_op* op = e[i].op_context;
      if (FAB_LIKELY(op != NULL && !(e[i].flags & FI_REMOTE_WRITE))) op->fn(op, &e[i], NULL);
      else dispatch_remote(ep, &e[i]);
    }
    return FAB_OK;
  }
  if (n == -FI_EAGAIN) return FAB_OK;
  if (n == -FI_EAVAIL) return read_error(ep);
  return cq_failed(ep, "fi_cq_read", n);
}

fab_result fab_ep_progress_locked(fab_endpoint* ep) {
  if (FAB_UNLIKELY(ep->failed)) return ep->failed;
  fab_cqe e[FAB_CQ_BATCH_MAX];
  ssize_t n = cq_read(ep, e);
  fab_result rc = dispatch_locked(ep, e, n);
  if (FAB_UNLIKELY(atomic_load_explicit(&ep->nclosing, memory_order_relaxed) > 0) && ep->hooks)
    ep->hooks->sweep(ep);
  return rc;
}

/* Successful completions: data operations right away, control operations
 * under the lock (taken once per batch, and only when one is there). */
static void dispatch_unlocked(fab_endpoint* ep, const fab_cqe* e, ssize_t n) {
  int locked = 0;
  for (ssize_t i = 0; i < n; i++) {
    fab_op* op = e[i].op_context;
    if (FAB_UNLIKELY(op == NULL || (e[i].flags & FI_REMOTE_WRITE))) {
      /* under the lock: a comm named by the data is freed only under it */
      if (!locked) pthread_mutex_lock(&ep->lock);
      locked = 1;
      dispatch_remote(ep, &e[i]);
      continue;
    }
    if (FAB_UNLIKELY(!op->unlocked) && !locked) {
      pthread_mutex_lock(&ep->lock);
      locked = 1;
    }
    op->fn(op, &e[i], NULL);
  }
  if (locked) pthread_mutex_unlock(&ep->lock);
}

/* While closed comms wait on ep, one data poll in ep->sweep_every takes the
 * lock to free those now idle. The interval doubles (up to
 * FAB_SWEEP_EVERY_MAX) while sweeps free nothing, so a closed comm whose
 * last send never completes (its receiver closed first) does not put the
 * polls of its endpoint behind the lock; a new close resets it. */
static __attribute__((noinline)) void sweep_sometimes(fab_endpoint* ep) {
  uint32_t tick = atomic_load_explicit(&ep->sweep_tick, memory_order_relaxed) + 1;
  uint32_t every = atomic_load_explicit(&ep->sweep_every, memory_order_relaxed);
  if (tick < every) {
    atomic_store_explicit(&ep->sweep_tick, tick, memory_order_relaxed);
    return;
  }
  atomic_store_explicit(&ep->sweep_tick, 0, memory_order_relaxed);
  pthread_mutex_lock(&ep->lock);
  int gone = ep->hooks ? ep->hooks->sweep(ep) : 0;
  every = atomic_load_explicit(&ep->sweep_every, memory_order_relaxed); /* a close may have reset it */
  if (gone) every = FAB_SWEEP_EVERY_MIN;
  else if (every < FAB_SWEEP_EVERY_MAX) every *= 2;
  atomic_store_explicit(&ep->sweep_every, every, memory_order_relaxed);
  pthread_mutex_unlock(&ep->lock);
}

/* --- a rail's polling thread ---------------------------------------------------- */

enum { FAB_HELPER_SPINS = 64 }; /* polls between yields */
/* With no request live on its endpoint's comms for this long, the thread
 * sleeps until the next one is handed out (fab_ep_helper_busy): a rail
 * costs a core only while its comms move data, not through a runtime's
 * compute phases. Nothing waits on a sleeping thread: with no request live
 * nothing is owed, and the runtime's own tests still read the CQ one time in
 * FAB_HELPED_POLL_EVERY while the thread wakes. With only small requests
 * live for that long (the runtime's tests read the CQ then), it sleeps too,
 * until a large request, a post left to it or a closing comm wakes it. */
enum { FAB_HELPER_IDLE_MS = 10, FAB_HELPER_NAP_MS = 100 };

static fab_result poll_read(fab_endpoint* ep, const fab_cqe* e, ssize_t n);

/* One poll of the thread, under cq_lock and only while no runtime thread
 * waits for it (fab_ep_serial_enter): a runtime thread never sleeps in the
 * provider's lock while this thread takes it again and again, which cost
 * every operation inside NCCL about 60 us even with idle cores. */
static fab_result helper_poll(fab_endpoint* ep) {
  if (FAB_UNLIKELY(ep->failed)) return ep->failed;
  if (fab_ep_helper_small_only(ep) && atomic_load_explicit(&ep->nclosing, memory_order_relaxed) == 0)
    return FAB_OK; /* only small requests live: the runtime's tests poll (FABRIC_RAIL_SMALL_MAX) */
  if (atomic_load_explicit(&ep->cq_waiting, memory_order_relaxed) > 0 ||
      atomic_flag_test_and_set_explicit(&ep->cq_lock, memory_order_acquire))
    return FAB_OK;
  fab_cqe e[FAB_CQ_BATCH_MAX];
  ssize_t n = fi_cq_read(ep->cq, e, (size_t)ep->cq_batch);
  atomic_flag_clear_explicit(&ep->cq_lock, memory_order_release);
  return poll_read(ep, e, n);
}

/* Runs the endpoint's pump hook: what comms left to this thread is posted.
 * Returns whether it ran. */
static int helper_pump(fab_endpoint* ep) {
  if (!ep->hooks || !ep->hooks->pump || !atomic_exchange_explicit(&ep->pump_wanted, 0, memory_order_acq_rel)) return 0;
  pthread_mutex_lock(&ep->lock);
  ep->hooks->pump(ep);
  pthread_mutex_unlock(&ep->lock);
  return 1;
}

static int futex_word(_Atomic int* w, int op, int val, const struct timespec* timeout) {
  return (int)syscall(SYS_futex, (int*)w, op, val, timeout, NULL, 0);
}

void fab_ep_helper_wake(fab_endpoint* ep) {
  if (atomic_exchange(&ep->helper_asleep, FAB_HELPER_AWAKE))
    futex_word(&ep->helper_asleep, FUTEX_WAKE_PRIVATE, 1, NULL);
}

/* Whether the thread may sleep as `how` (FAB_HELPER_*), read after its
 * store of asleep: the wakers change what is read here before they load
 * asleep (fab_ep_helper_busy, fab_ep_helper_large, fab_ep_want_pump,
 * fab_ep_nclosing_add), so one of the two sees the other and nothing is
 * slept through. */
static int helper_may_sleep(fab_endpoint* ep, int how) {
  if (!atomic_load(&ep->helper_run) || atomic_load(&ep->pump_wanted) || atomic_load(&ep->nclosing) > 0) return 0;
  if (how == FAB_HELPER_ASLEEP_IDLE) return atomic_load(&ep->helper_busy) <= 0;
  return fab_ep_helper_small_only(ep);
}

/* Sleeps until what may wake it happens (no request live: one is handed
 * out; only small ones: a large one, a post or a close), the thread is
 * stopped, or a nap ends. */
static void helper_sleep(fab_endpoint* ep) {
  int how = atomic_load(&ep->helper_busy) > 0 ? FAB_HELPER_ASLEEP_SMALL : FAB_HELPER_ASLEEP_IDLE;
  atomic_store(&ep->helper_asleep, how);
  if (helper_may_sleep(ep, how)) {
    struct timespec nap = {.tv_sec = 0, .tv_nsec = FAB_HELPER_NAP_MS * 1000000L};
    futex_word(&ep->helper_asleep, FUTEX_WAIT_PRIVATE, how, &nap);
  }
  atomic_store(&ep->helper_asleep, FAB_HELPER_AWAKE);
}

/* Whether the thread has been idle long enough to sleep: no large request
 * live (small ones leave the CQ to the runtime's tests), no post left to
 * it, and nothing for the sweep to revisit (closed comms, control messages
 * the provider refused) since idle_since (0: busy until now). */
static int helper_idle_long(fab_endpoint* ep, int64_t* idle_since) {
  if ((atomic_load_explicit(&ep->helper_busy, memory_order_acquire) > 0 && !fab_ep_helper_small_only(ep)) ||
      atomic_load_explicit(&ep->pump_wanted, memory_order_acquire) ||
      atomic_load_explicit(&ep->nclosing, memory_order_relaxed) > 0) {
    *idle_since = 0;
    return 0;
  }
  int64_t now = fab_now_ms();
  if (!*idle_since) *idle_since = now;
  return now - *idle_since >= FAB_HELPER_IDLE_MS;
}

static void* helper_main(void* arg) {
  fab_endpoint* ep = arg;
  int64_t idle_since = 0;
  while (atomic_load_explicit(&ep->helper_run, memory_order_acquire)) {
    int pumped = 0; /* posts left to it come in streams: it stays awake its idle time after one */
    for (int i = 0; i < FAB_HELPER_SPINS; i++) {
      if (helper_poll(ep) != FAB_OK) return NULL; /* the CQ failed: the comms' own calls report it */
      if (atomic_load_explicit(&ep->pump_wanted, memory_order_acquire) == FAB_PUMP_NOW) pumped |= helper_pump(ep);
    }
    if (atomic_load_explicit(&ep->pump_wanted, memory_order_acquire)) pumped |= helper_pump(ep); /* retries too */
    if (pumped) idle_since = 0;
    if (helper_idle_long(ep, &idle_since)) {
      helper_sleep(ep); /* a nap that ends with nothing live sleeps again after one round of polls */
      continue;
    }
    sched_yield();
  }
  return NULL;
}

/* Stops the thread (helper_lock held: the thread never takes it, so the
 * join cannot wait on us). */
static void helper_stop_locked(fab_endpoint* ep) {
  if (atomic_exchange(&ep->helper_run, 0)) {
    fab_ep_helper_wake(ep);
    pthread_join(ep->helper, NULL);
  }
  atomic_store(&ep->cq_gated, 0);
  ep->helper_users = 0;
}

static void helper_stop(fab_endpoint* ep) {
  pthread_mutex_lock(&ep->helper_lock);
  helper_stop_locked(ep);
  pthread_mutex_unlock(&ep->helper_lock);
}

int fab_ep_helper_acquire(fab_endpoint* ep) {
  int rc = 0;
  pthread_mutex_lock(&ep->helper_lock);
  if (ep->helper_users++ == 0) {
    atomic_store(&ep->helper_asleep, 0);
    atomic_store(&ep->helper_run, 1);
    atomic_store(&ep->cq_gated, 1);
    if (pthread_create(&ep->helper, NULL, helper_main, ep) != 0) {
      atomic_store(&ep->helper_run, 0);
      atomic_store(&ep->cq_gated, 0);
      ep->helper_users = 0;
      rc = -1;
    } else {
      /* named before the comm is handed back (top -H, /proc): set inside the
       * thread, a look right after connect could miss it */
      pthread_setname_np(ep->helper, FAB_RAIL_THREAD_NAME);
    }
  }
  pthread_mutex_unlock(&ep->helper_lock);
  return rc;
}

void fab_ep_helper_release(fab_endpoint* ep) {
  pthread_mutex_lock(&ep->helper_lock);
  if (ep->helper_users > 0 && --ep->helper_users == 0) helper_stop_locked(ep);
  pthread_mutex_unlock(&ep->helper_lock);
}

/* What one CQ read brought: successes dispatched without the lock. */
static fab_result poll_read(fab_endpoint* ep, const fab_cqe* e, ssize_t n) {
  fab_result rc = FAB_OK;
  if (n > 0) {
    dispatch_unlocked(ep, e, n);
  } else if (FAB_UNLIKELY(n != -FI_EAGAIN)) {
    pthread_mutex_lock(&ep->lock); /* an error entry, or the CQ failed */
    rc = dispatch_locked(ep, e, n);
    pthread_mutex_unlock(&ep->lock);
  }
  if (FAB_UNLIKELY(atomic_load_explicit(&ep->nclosing, memory_order_relaxed) > 0)) sweep_sometimes(ep);
  return rc;
}

/* A data-path poll does not wait for cq_lock: whoever holds it is reading
 * the CQ (a rail's polling thread, maybe copying a 512 KiB message out of
 * its socket) or posting, so progress is being made. Waiting for it had
 * NCCL's proxy thread spin for a third of its time in a 64 MiB all_reduce
 * over four rails, while its other channels' steps waited. */
fab_result fab_ep_poll(fab_endpoint* ep) {
  if (FAB_UNLIKELY(ep->failed)) return ep->failed;
  int held = fab_ep_serial_try(ep);
  if (held < 0) return FAB_OK;
  fab_cqe e[FAB_CQ_BATCH_MAX];
  ssize_t n = fi_cq_read(ep->cq, e, (size_t)ep->cq_batch);
  fab_ep_serial_leave(ep, held);
  return poll_read(ep, e, n);
}

static int sockaddr_check(const void* addr, size_t len, int want_family, char* why, size_t why_len) {
  sa_family_t family;
  if (len < sizeof(family)) return snprintf(why, why_len, "%zu bytes is too short for a socket address", len), -1;
  memcpy(&family, addr, sizeof(family));
  if (want_family == 0) want_family = family == AF_INET6 ? AF_INET6 : AF_INET;
  size_t want = want_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
  if (family != want_family)
    return snprintf(why, why_len, "address family %u, expected %s", (unsigned)family,
                    want_family == AF_INET6 ? "AF_INET6" : "AF_INET"), -1;
  if (len != want) return snprintf(why, why_len, "%zu address bytes, expected %zu", len, want), -1;
  uint16_t port; /* sin_port and sin6_port sit at the same offset */
  memcpy(&port, (const char*)addr + offsetof(struct sockaddr_in, sin_port), sizeof(port));
  if (port == 0) return snprintf(why, why_len, "port 0"), -1;
  return 0;
}

/* FI_ADDR_STR: one printable NUL-terminated string with the scheme of our
 * own address ("fi_shm://", "fi_sockaddr_in://", ...) or, where our own
 * address has none, our endpoint name form (fabric_<pid>_<nonce>_<n>). */
static int straddr_check(const fab_endpoint* ep, const char* a, size_t len, char* why, size_t why_len) {
  if (len < 2 || a[len - 1] != '\0' || strlen(a) != len - 1)
    return snprintf(why, why_len, "not one NUL-terminated string of %zu bytes", len), -1;
  for (size_t i = 0; i + 1 < len; i++)
    if (a[i] <= ' ' || a[i] > '~') return snprintf(why, why_len, "byte %zu (0x%02x) is not printable", i, (unsigned char)a[i]), -1;
  const char* own = (const char*)ep->addr;
  const char* sep = strstr(own, "://");
  if (sep) {
    size_t n = (size_t)(sep - own) + 3;
    if (strncmp(a, own, n) != 0) return snprintf(why, why_len, "it does not start with %.*s", (int)n, own), -1;
    return 0;
  }
  if (ep->dev->local_only && strncmp(own, "fabric_", 7) == 0) {
    unsigned pid = 0, n = 0;
    unsigned long long nonce = 0;
    int used = 0;
    if (sscanf(a, "fabric_%u_%16llx_%u%n", &pid, &nonce, &n, &used) != 3 || (size_t)used != len - 1 || !pid)
      return snprintf(why, why_len, "\"%.40s\" is not an endpoint name of this plugin", a), -1;
  }
  return 0;
}

int fab_ep_addr_check(const fab_endpoint* ep, const void* addr, size_t len, char* why, size_t why_len) {
  if (len == 0 || len > FAB_ADDR_MAX) return snprintf(why, why_len, "address length %zu", len), -1;
  switch (ep->dev->info->addr_format) {
    case FI_SOCKADDR_IN:
      return sockaddr_check(addr, len, AF_INET, why, why_len);
    case FI_SOCKADDR_IN6:
      return sockaddr_check(addr, len, AF_INET6, why, why_len);
    case FI_SOCKADDR:
      return sockaddr_check(addr, len, 0, why, why_len);
    case FI_ADDR_STR:
      return straddr_check(ep, addr, len, why, why_len);
    default: /* a provider-specific binary format: at least its length */
      if (len != ep->addr_len) return snprintf(why, why_len, "%zu address bytes, expected %zu", len, ep->addr_len), -1;
      return 0;
  }
}

int fab_ep_av_insert(fab_endpoint* ep, const void* addr, size_t len, fi_addr_t* out) {
  uint64_t h = fab_fnv1a(FAB_FNV_SEED, addr, len);
  for (size_t i = 0; i < ep->av_count; i++) {
    fab_av_entry* a = &ep->av_cache[i];
    if (a->hash == h && a->len == len && !memcmp(a->addr, addr, len)) {
      a->refs++;
      *out = a->fi_addr;
      return 0;
    }
  }
  if (ep->av_count == ep->av_cap) {
    size_t cap = ep->av_cap ? ep->av_cap * 2 : 16;
    fab_av_entry* v = realloc(ep->av_cache, cap * sizeof(*v));
    if (!v) return -FI_ENOMEM;
    ep->av_cache = v;
    ep->av_cap = cap;
  }
  /* One bad insert poisons some providers' address vectors (tcp: every
   * later insert fails; shm: a name without a live region faults later). */
  char why[160];
  if (fab_ep_addr_check(ep, addr, len, why, sizeof(why)) != 0) return -FI_EINVAL;
  if (fab_peer_local_gone(ep, addr, len, why, sizeof(why))) return -FI_ECONNREFUSED;
  fi_addr_t fa = FI_ADDR_NOTAVAIL;
  int rc = fi_av_insert(ep->av, addr, 1, &fa, 0, NULL);
  if (rc != 1 || fa == FI_ADDR_NOTAVAIL) return rc < 0 ? rc : -FI_EINVAL;
  fab_av_entry* a = &ep->av_cache[ep->av_count++];
  a->hash = h;
  a->len = len;
  memcpy(a->addr, addr, len);
  a->fi_addr = fa;
  a->refs = 1;
  a->owner = fab_ep_addr_in_process(ep, addr, len) ? fab_local_ref(addr, len) : NULL;
  *out = fa;
  return 0;
}

int fab_ep_av_find(const fab_endpoint* ep, const void* addr, size_t len, fi_addr_t* out) {
  uint64_t h = fab_fnv1a(FAB_FNV_SEED, addr, len);
  for (size_t i = 0; i < ep->av_count; i++) {
    const fab_av_entry* a = &ep->av_cache[i];
    if (a->hash == h && a->len == len && !memcmp(a->addr, addr, len)) {
      *out = a->fi_addr;
      return 1;
    }
  }
  return 0;
}

void fab_ep_av_release(fab_endpoint* ep, fi_addr_t fa) {
  if (fa == FI_ADDR_NOTAVAIL) return;
  for (size_t i = 0; i < ep->av_count; i++) {
    fab_av_entry* a = &ep->av_cache[i];
    if (a->fi_addr != fa) continue;
    if (a->refs > 0) a->refs--;
    if (a->refs > 0 || !ep->dev->local_only || ep->destroying) return;
    int rc = fi_av_remove(ep->av, &fa, 1, 0);
    if (rc != 0) {
      FAB_INFO(FAB_SUBSYS_NET, "fi_av_remove on %s: %s; the address stays mapped", ep->dev->name, fi_strerror(-rc));
      return;
    }
    fab_endpoint* owner = a->owner;
    ep->av_cache[i] = ep->av_cache[--ep->av_count];
    if (owner) fab_local_unref(owner); /* after the removal: it was open until now */
    return;
  }
}

/* A printable address: the peer's when a is an AV entry, else our own. */
void fab_ep_peer_name(fab_endpoint* ep, fi_addr_t a, char* buf, size_t len) {
  const void* raw = ep->addr;
  for (size_t i = 0; a != FI_ADDR_NOTAVAIL && i < ep->av_count; i++) {
    if (ep->av_cache[i].fi_addr == a) raw = ep->av_cache[i].addr;
  }
  size_t n = len;
  buf[0] = '\0';
  if (!fi_av_straddr(ep->av, raw, buf, &n)) snprintf(buf, len, "(unprintable address)");
  buf[len - 1] = '\0';
}

void fab_ep_park(fab_endpoint* ep, fab_parked* p) { fab_list_push(&ep->parked, &p->node); }

void fab_ep_nclosing_add(fab_endpoint* ep, int d) {
  atomic_store(&ep->nclosing, atomic_load_explicit(&ep->nclosing, memory_order_relaxed) + d);
  if (d > 0 && FAB_UNLIKELY(atomic_load(&ep->helper_asleep))) fab_ep_helper_wake(ep); /* it revisits them */
}

/* Control buffers need a descriptor on FI_MR_LOCAL providers. */
int fab_ep_ctrl_reg(fab_endpoint* ep, void* buf, size_t len, struct fid_mr** mr, void** desc) {
  *mr = NULL;
  *desc = NULL;
  if (!ep->dev->mr_local) return 0;
  fab_domain* dom = ep->dev->dom;
  uint64_t key = ep->dev->prov_key ? 0 : atomic_fetch_add(&dom->next_key, 1);
  int rc = fi_mr_reg(dom->domain, buf, len, FI_SEND | FI_RECV, 0, key, 0, mr, NULL);
  if (rc == 0) rc = fab_ep_bind_mr(ep, *mr);
  if (rc != 0) {
    if (*mr) fi_close(&(*mr)->fid);
    *mr = NULL;
    return rc;
  }
  *desc = fi_mr_desc(*mr);
  return 0;
}


void fab_ep_ctrl_dereg(struct fid_mr* mr) {
  if (mr) fi_close(&mr->fid);
}

int fab_ep_id_set(fab_endpoint* ep, uint32_t id, fab_comm* c) {
  if (id >= FAB_ID_PAGE * FAB_ID_PAGES) return -1;
  _Atomic(fab_comm*)* page = atomic_load_explicit(&ep->ids[id / FAB_ID_PAGE], memory_order_relaxed);
  if (!page) {
    if (!c) return 0;
    page = calloc(FAB_ID_PAGE, sizeof(*page));
    if (!page) return -1;
    atomic_store_explicit(&ep->ids[id / FAB_ID_PAGE], page, memory_order_release);
  }
  atomic_store_explicit(&page[id % FAB_ID_PAGE], c, memory_order_release);
  return 0;
}
