/* Plugin loading and NCCL-like driving helpers. See ft_api.h. */
#include "ft_api.h"

#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_drivers.h"
#ifdef FT_WITH_CORE
extern const fab_api fab_api_core;
#endif
#ifndef FT_PLUGIN_PATH
#define FT_PLUGIN_PATH "libnccl-net-fabric.so"
#endif
#ifndef FT_NEURON_PLUGIN_PATH
#define FT_NEURON_PLUGIN_PATH "libnccom-net-fabric.so"
#endif

int ft_api_core_available(void) {
#ifdef FT_WITH_CORE
  return 1;
#else
  return 0;
#endif
}

int ft_api_selected(void) {
  const char* v = getenv("FABRIC_TEST_API");
  if (!v || !*v) return ft_api_core_available() ? FT_API_CORE : 12;
  if (strcmp(v, "core") == 0) return FT_API_CORE;
  int base = 0, lo = 6, hi = 12;
  if (strncmp(v, "neuron", 6) == 0) {
    v += 6;
    base = FT_API_NEURON, lo = 4, hi = 6;
  }
  if (*v == 'v' || *v == 'V') v++;
  char* end = NULL;
  long n = strtol(v, &end, 10);
  if (!end || *end || n < lo || n > hi)
    FT_FAIL("FABRIC_TEST_API=%s: expected core, 6..12 or neuron4..neuron6", getenv("FABRIC_TEST_API"));
  return base + (int)n;
}

const char* ft_plugin_path_for(int api) {
  const char* p = getenv(api > FT_API_NEURON ? "FABRIC_TEST_NEURON_PLUGIN" : "FABRIC_TEST_PLUGIN");
  return p && *p ? p : api > FT_API_NEURON ? FT_NEURON_PLUGIN_PATH : FT_PLUGIN_PATH;
}

const char* ft_plugin_path(void) { return ft_plugin_path_for(ft_api_selected()); }

static void bind_version(ft_lib* lib, int version, const char* path) {
  const char* family = lib->neuron ? "neuron" : "net";
  snprintf(lib->desc, sizeof lib->desc, "%sncclNetPlugin_v%d", lib->neuron ? "Neuron " : "", version);
  const char* sym = lib->desc + (lib->neuron ? 7 : 0);
  dlerror();
  void* table = dlsym(lib->dl, sym);
  if (!table) FT_FAIL("%s does not export %s: %s", path, sym, dlerror());
  memset(&lib->api, 0, sizeof lib->api);
  int rc = fab_driver_bind_in(family, sym, table, &lib->api);
  if (rc != 0) FT_FAIL("fab_driver_bind(%s %s) failed (%d)", family, sym, rc);
  lib->version = version;
  if (lib->api.version != version)
    FT_FAIL("driver for %s reports version %d", lib->desc, lib->api.version);
}

void ft_lib_open(ft_lib* lib, int version) {
  memset(lib, 0, sizeof *lib);
  if (version == FT_API_CORE) {
#ifdef FT_WITH_CORE
    lib->api = fab_api_core;
    lib->version = 0;
    snprintf(lib->desc, sizeof lib->desc, "core");
    return;
#else
    FT_FAIL("this binary does not link the engine; FABRIC_TEST_API=core needs fabric-functional-core");
#endif
  }
  const char* path = ft_plugin_path_for(version);
  ft_phase("dlopen %s", path);
  lib->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib->dl) FT_FAIL("dlopen(%s): %s", path, dlerror());
  if (version > FT_API_NEURON) {
    lib->neuron = 1;
    version -= FT_API_NEURON;
  }
  if (version == FT_API_NEWEST) {
    for (int v = 12; v >= 6; v--) {
      char sym[32];
      snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
      if (dlsym(lib->dl, sym)) {
        version = v;
        break;
      }
    }
    if (version == FT_API_NEWEST) FT_FAIL("%s exports no ncclNetPlugin_v6..v12", path);
  }
  bind_version(lib, version, path);
}

void ft_lib_close(ft_lib* lib) {
  if (lib->dl) {
    if (dlclose(lib->dl) != 0) FT_FAIL("dlclose(%s): %s", lib->desc, dlerror());
  }
  lib->dl = NULL;
}

/* ------------------------------------------------------------------------ */

void ft_side_init(ft_side* s) {
  const fab_api* a = s->api;
  FT_CHECK(a->init != NULL, "%s has no init", s->lib.desc);
  s->config.traffic_class = -1;
  s->ctx = NULL;
  ft_phase("init through %s", s->lib.desc);
  uint64_t comm_id = ((uint64_t)getppid() << 32) ^ (uint64_t)ft_now_ms();
  FT_OK(a->init(&s->ctx, comm_id, &s->config, ft_logger, NULL));
  s->inited = 1;
  FT_CHECK(!ft_has_ctx(&s->lib) || s->ctx != NULL, "init returned success with a NULL context");
  FT_OK(a->devices(&s->ndev));
  FT_CHECK(s->ndev >= 1, "devices() reported %d devices", s->ndev);
  s->dev = 0;
  memset(&s->props, 0, sizeof s->props);
  FT_OK(a->get_properties(s->dev, &s->props));
}

void ft_side_open(ft_side* s, ft_peer* peer, int version) {
  memset(s, 0, sizeof *s);
  s->peer = peer;
  ft_lib_open(&s->lib, version);
  s->api = &s->lib.api;
  ft_side_init(s);
}

void ft_side_close(ft_side* s) {
  ft_phase("finalize %s", s->lib.desc);
  if (s->inited && s->api->finalize) FT_OK(s->api->finalize(s->ctx));
  s->inited = 0;
  s->ctx = NULL;
  ft_phase("unload %s", s->lib.desc);
  ft_lib_close(&s->lib);
}

/* ------------------------------------------------------------------------ */

void ft_connect_all(ft_side* s, ft_conn* c, int n, int timeout_ms) {
  const fab_api* a = s->api;
  ft_phase("listen x%d", n);
  for (int i = 0; i < n; i++) {
    memset(&c[i], 0, sizeof c[i]);
    FT_OK(a->listen(s->ctx, s->dev, c[i].handle, &c[i].listen_comm));
    FT_CHECK(c[i].listen_comm != NULL, "listen returned success with a NULL listen comm (comm %d)", i);
  }
  /* Exchange all handles in one message, each only as long as the version's
   * handle (Neuron v4: 64 bytes); what follows it is garbage, as in a
   * runtime's buffer. */
  size_t hs = (size_t)a->max_handle_size;
  FT_CHECK(hs > 0 && hs <= FAB_HANDLE_SIZE, "handle size %zu", hs);
  unsigned char* mine = malloc((size_t)n * hs);
  unsigned char* theirs = malloc((size_t)n * hs);
  FT_CHECK(mine && theirs, "out of memory");
  for (int i = 0; i < n; i++) memcpy(mine + (size_t)i * hs, c[i].handle, hs);
  ft_xchg(s->peer, "handles", mine, theirs, (size_t)n * hs, timeout_ms);
  for (int i = 0; i < n; i++) {
    memset(c[i].peer_handle, 0xee, FAB_HANDLE_SIZE);
    memcpy(c[i].peer_handle, theirs + (size_t)i * hs, hs);
  }
  free(mine);
  free(theirs);

  ft_phase("connect/accept x%d", n);
  int64_t deadline = ft_now_ms() + timeout_ms;
  int left = 2 * n;
  while (left > 0) {
    for (int i = 0; i < n; i++) {
      if (!c[i].send_comm) {
        void* dev_handle = NULL;
        FT_OK(a->connect(s->ctx, s->dev, &s->config, c[i].peer_handle, &c[i].send_comm, &dev_handle));
        if (c[i].send_comm) left--;
      }
      if (!c[i].recv_comm) {
        void* dev_handle = NULL;
        FT_OK(a->accept(c[i].listen_comm, &c[i].recv_comm, &dev_handle));
        if (c[i].recv_comm) left--;
      }
    }
    if (left > 0 && ft_now_ms() > deadline) {
      int ns = 0, nr = 0;
      for (int i = 0; i < n; i++) ns += c[i].send_comm != NULL, nr += c[i].recv_comm != NULL;
      FT_FAIL("connect/accept did not finish within %d ms: %d/%d send comms, %d/%d recv comms", timeout_ms, ns, n,
              nr, n);
    }
    if (left > 0) sched_yield();
  }
  /* Both sides hold every comm before traffic starts. */
  ft_sync(s->peer, "connected", timeout_ms);
}

void ft_close_all(ft_side* s, ft_conn* c, int n) {
  const fab_api* a = s->api;
  ft_phase("close x%d", n);
  for (int i = 0; i < n; i++) {
    if (c[i].send_comm) FT_OK(a->close_send(c[i].send_comm));
    if (c[i].recv_comm) FT_OK(a->close_recv(c[i].recv_comm));
    if (c[i].listen_comm) FT_OK(a->close_listen(c[i].listen_comm));
    c[i].send_comm = c[i].recv_comm = c[i].listen_comm = NULL;
  }
}

/* ------------------------------------------------------------------------ */

void ft_mr_alloc(ft_side* s, ft_mr* m, void* comm, size_t len) {
  m->len = len;
  m->buf = ft_alloc(len);
  m->comm = comm;
  m->mh = NULL;
  FT_OK(s->api->reg_mr(comm, m->buf, len ? len : 1, FAB_PTR_HOST, &m->mh));
  FT_CHECK(m->mh != NULL, "regMr returned success with a NULL handle (%zu bytes)", len);
}

void ft_mr_free(ft_side* s, ft_mr* m) {
  if (m->mh) FT_OK(s->api->dereg_mr(m->comm, m->mh));
  ft_free(m->buf, m->len);
  memset(m, 0, sizeof *m);
}

void* ft_isend(ft_side* s, void* comm, void* data, size_t size, int tag, void* mh, int timeout_ms) {
  int64_t deadline = ft_now_ms() + timeout_ms;
  for (;;) {
    void* req = NULL;
    fab_result rc = s->api->isend(comm, data, size, tag, mh, NULL, &req);
    if (rc != FAB_OK) FT_FAIL("isend(%zu bytes, tag %d) returned %d (last WARN: %s)", size, tag, (int)rc, ft_log_last_warn());
    if (req) return req;
    if (ft_now_ms() > deadline) FT_FAIL("isend(%zu bytes, tag %d) returned no request for %d ms", size, tag, timeout_ms);
    sched_yield();
  }
}

void* ft_irecv(ft_side* s, void* comm, int n, void** data, const size_t* sizes, const int* tags, void** mhs,
               int timeout_ms) {
  int64_t deadline = ft_now_ms() + timeout_ms;
  for (;;) {
    void* req = NULL;
    fab_result rc = s->api->irecv(comm, n, data, sizes, tags, mhs, NULL, &req);
    if (rc != FAB_OK) FT_FAIL("irecv(n=%d, sizes[0]=%zu) returned %d (last WARN: %s)", n, sizes[0], (int)rc, ft_log_last_warn());
    if (req) return req;
    if (ft_now_ms() > deadline) FT_FAIL("irecv(n=%d) returned no request for %d ms", n, timeout_ms);
    sched_yield();
  }
}

fab_result ft_test_until(ft_side* s, void* req, int* sizes, int timeout_ms, int* done) {
  int64_t deadline = ft_now_ms() + timeout_ms;
  *done = 0;
  for (;;) {
    fab_result rc = s->api->test(req, done, sizes);
    if (rc != FAB_OK || *done) return rc;
    if (ft_now_ms() > deadline) return FAB_OK;
    sched_yield();
  }
}

void ft_wait(ft_side* s, void* req, int* sizes, int timeout_ms, const char* what) {
  ft_wait_all(s, &req, 1, sizes, 0, timeout_ms, what);
}

void ft_wait_all(ft_side* s, void** reqs, int n, int* sizes, int sizes_stride, int timeout_ms, const char* what) {
  int64_t deadline = ft_now_ms() + timeout_ms;
  char* done = calloc((size_t)n, 1);
  FT_CHECK(done != NULL, "out of memory");
  int left = n;
  while (left > 0) {
    for (int i = 0; i < n; i++) {
      if (done[i]) continue;
      int d = 0;
      fab_result rc = s->api->test(reqs[i], &d, sizes ? sizes + (size_t)i * sizes_stride : NULL);
      if (rc != FAB_OK)
        FT_FAIL("%s: test() of request %d/%d returned %d (last WARN: %s)", what, i, n, (int)rc, ft_log_last_warn());
      if (d) {
        done[i] = 1;
        left--;
      }
    }
    if (left > 0 && ft_now_ms() > deadline)
      FT_FAIL("%s: %d of %d requests still not done after %d ms", what, left, n, timeout_ms);
    if (left > 0) sched_yield();
  }
  free(done);
}

void ft_exchange(ft_side* s, ft_conn* c, size_t size, uint64_t seed, int timeout_ms) {
  ft_exchange_into(s, c, size, size, seed, timeout_ms);
}

void ft_exchange_into(ft_side* s, ft_conn* c, size_t size, size_t recv_len, uint64_t seed, int timeout_ms) {
  enum { GUARD = 64 };
  FT_CHECK(recv_len >= size, "a receive of %zu bytes for %zu", recv_len, size);
  ft_mr sm, rm;
  ft_phase("exchange %zu bytes: register", size);
  ft_mr_alloc(s, &sm, c->send_comm, size + GUARD);
  ft_mr_alloc(s, &rm, c->recv_comm, recv_len + GUARD);
  uint64_t my_seed = ft_seed(seed, (uint64_t)ft_role(), size);
  uint64_t peer_seed = ft_seed(seed, (uint64_t)(1 - ft_role()), size);
  ft_fill(sm.buf, size, my_seed);
  memset(rm.buf, FT_POISON, recv_len + GUARD);
  int tag = (int)(seed & 0x3fff) + 1;
  size_t rsize = recv_len;
  void* rbuf = rm.buf;
  ft_phase("exchange %zu bytes: post", size);
  void* rreq = ft_irecv(s, c->recv_comm, 1, &rbuf, &rsize, &tag, &rm.mh, timeout_ms);
  void* sreq = ft_isend(s, c->send_comm, sm.buf, size, tag, sm.mh, timeout_ms);
  int sizes[2][FAB_MAX_RECVS];
  memset(sizes, 0xff, sizeof sizes);
  void* reqs[2] = {rreq, sreq};
  ft_phase("exchange %zu bytes: wait", size);
  ft_wait_all(s, reqs, 2, &sizes[0][0], FAB_MAX_RECVS, timeout_ms, "exchange");
  FT_CHECK((size_t)sizes[0][0] == size, "receive of %zu bytes (posted %zu) reported size %d", size, recv_len,
           sizes[0][0]);
  ft_phase("exchange %zu bytes: verify", size);
  char what[80];
  snprintf(what, sizeof what, "receive of %zu bytes (posted %zu)", size, recv_len);
  ft_verify_or_fail(rm.buf, size, peer_seed, what);
  ft_check_poison((char*)rm.buf + size, recv_len - size + GUARD, what);
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}
