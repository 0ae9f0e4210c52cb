/*
 * netbench plugin transport: dlopens any NCCL net plugin library, picks a
 * ncclNetPlugin_vN table and drives it through the generated driver for that
 * version, which fills a fab_api (core/api/fab_api.h) by calling through the
 * table exactly as NCCL would (int sizes for v6-v8, the v10 connect config,
 * the v11+ per-communicator init, ...). Nothing here knows a version.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_api.h"
#include "fab_drivers.h"
#include "nb.h"

typedef struct {
  void* lib;
  fab_api api;
  fab_ctx* ctx;
  int dev;
  int verbose;
  int version;
  const void* table;
  char sym[64];
  int nccl_profiler; /* pass a parent handle with every operation (--nccl-profiler) */
  int mem_type;      /* FAB_PTR_HOST or FAB_PTR_CUDA (--mem cuda / dmabuf) */
  int dmabuf;        /* register through regMrDmaBuf (--mem dmabuf) */
} plug_state;

/* NCCL's profiler callback when no profiler plugin is loaded: it returns at
 * once and leaves the event handle alone. */
static fab_result nccl_profiler_absent(void** eh, int type, void* phandle, int64_t id, void* data) {
  (void)eh, (void)type, (void)phandle, (void)id, (void)data;
  return FAB_OK;
}
static char parent_handle[1];

/* A generated driver holds one bound table per ABI version. With two plugin
 * builds open (--plugin-b) and driven through the same version, each call
 * first makes sure the driver points at its own library's table; with one
 * plugin this is a single predictable branch. */
static int nplugins, several; /* several: two were open at some time */
static const void* bound[32];

static inline void use(plug_state* p) {
  if (__builtin_expect(several, 0) && bound[p->version] != p->table) {
    fab_driver_bind(p->sym, p->table, &p->api);
    bound[p->version] = p->table;
  }
}

static int plugin_verbose;
/* The transport fabric reports in its device INFO line ("..., transport rdma,
 * ..."), for the plugin: line; another plugin leaves it unknown. */
static char plugin_transport[32] = "unknown";

static void note_transport(const char* msg) {
  const char* t = strstr(msg, ", transport ");
  if (!t || !strstr(msg, "device ")) return;
  t += strlen(", transport ");
  size_t n = strcspn(t, ", ");
  if (n >= sizeof(plugin_transport)) n = sizeof(plugin_transport) - 1;
  memcpy(plugin_transport, t, n);
  plugin_transport[n] = '\0';
}

static void plug_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (level == FAB_LOG_INFO) note_transport(msg);
  if (level > FAB_LOG_WARN && !(plugin_verbose && level == FAB_LOG_INFO)) return;
  fprintf(stderr, "netbench[rank %d] plugin %s: %s\n", nb_rank, level == FAB_LOG_WARN ? "WARN" : "INFO", msg);
}

unsigned nb_plugin_versions_in_lib(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
  unsigned mask = 0;
  for (int v = 1; v < 32; v++) {
    char sym[64];
    snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
    if (dlsym(lib, sym)) mask |= 1u << v;
  }
  dlclose(lib);
  return mask;
}

#define P(x) ((plug_state*)(x)->priv)

static int p_listen(nb_xport* x, void* handle, void** lcomm) {
  use(P(x));
  return P(x)->api.listen(P(x)->ctx, P(x)->dev, handle, lcomm);
}

static int p_connect(nb_xport* x, void* handle, void** scomm) {
  void* dh = NULL;
  use(P(x));
  return P(x)->api.connect(P(x)->ctx, P(x)->dev, NULL, handle, scomm, &dh);
}

static int p_accept(nb_xport* x, void* lcomm, void** rcomm) {
  void* dh = NULL;
  use(P(x));
  return P(x)->api.accept(lcomm, rcomm, &dh);
}

static int p_close_send(nb_xport* x, void* c) { return use(P(x)), P(x)->api.close_send(c); }
static int p_close_recv(nb_xport* x, void* c) { return use(P(x)), P(x)->api.close_recv(c); }
static int p_close_listen(nb_xport* x, void* c) { return use(P(x)), P(x)->api.close_listen(c); }

static int p_reg_mr(nb_xport* x, void* comm, void* buf, size_t size, void** mh) {
  use(P(x));
  if (!P(x)->dmabuf) return P(x)->api.reg_mr(comm, buf, size, P(x)->mem_type, mh);
  if (!P(x)->api.reg_mr_dmabuf) nb_die("--mem dmabuf: this table has no regMrDmaBuf");
  int fd = nb_mem_dmabuf_fd(buf, size);
  int rc = P(x)->api.reg_mr_dmabuf(comm, buf, size, FAB_PTR_CUDA, 0, fd, mh);
  close(fd); /* as NCCL does right after the call */
  return rc;
}

static int p_dereg_mr(nb_xport* x, void* comm, void* mh) { return use(P(x)), P(x)->api.dereg_mr(comm, mh); }

static int p_isend(nb_xport* x, void* scomm, void* buf, size_t size, int tag, void* mh, void** req) {
  *req = NULL;
  use(P(x));
  return P(x)->api.isend(scomm, buf, size, tag, mh, P(x)->nccl_profiler ? parent_handle : NULL, req);
}

static int p_irecv(nb_xport* x, void* rcomm, void* buf, size_t size, int tag, void* mh, void** req) {
  void* data[1] = {buf};
  size_t sizes[1] = {size};
  int tags[1] = {tag};
  void* mhs[1] = {mh};
  void* ph[1] = {P(x)->nccl_profiler ? parent_handle : NULL};
  *req = NULL;
  use(P(x));
  return P(x)->api.irecv(rcomm, 1, data, sizes, tags, mhs, ph, req);
}

static int p_test(nb_xport* x, void* req, int* done, int* size) {
  int sizes[FAB_MAX_RECVS];
  use(P(x));
  int rc = P(x)->api.test(req, done, sizes);
  if (!rc && *done && size) *size = sizes[0];
  return rc;
}

static void p_fini(nb_xport* x) {
  plug_state* p = P(x);
  if (!p) return;
  use(p);
  if (p->api.finalize) p->api.finalize(p->ctx);
  nplugins--;
  /* The library stays loaded: a v<=10 plugin is never finalized by NCCL and
   * may keep process-wide state; unloading is not what we measure. */
  free(p);
  x->priv = NULL;
}

static const nb_ops plugin_ops = {
    .name = "plugin",
    .listen = p_listen,
    .connect = p_connect,
    .accept = p_accept,
    .close_send = p_close_send,
    .close_recv = p_close_recv,
    .close_listen = p_close_listen,
    .reg_mr = p_reg_mr,
    .dereg_mr = p_dereg_mr,
    .isend = p_isend,
    .irecv = p_irecv,
    .test = p_test,
    .fini = p_fini,
};

/* The virtual device of o->rails copies of device 0 (FABRIC_RAILS lists
 * every device that many times: copy k of device 0 is k * ndev / copies). */
static int fuse_copies(plug_state* p, const nb_xport_opts* o, int ndev) {
  const char* env = getenv("FABRIC_RAILS");
  int copies = env ? atoi(env) : 1;
  if (!p->api.make_vdevice) nb_die("--rails: %s has no makeVDevice (net v9+)", p->sym[0] ? p->sym : "the table");
  if (copies < o->rails || ndev % copies) nb_die("--rails %d: FABRIC_RAILS=%d lists too few copies", o->rails, copies);
  fab_vdevice_props vp = {.ndevs = o->rails};
  for (int k = 0; k < o->rails; k++) vp.devs[k] = k * (ndev / copies);
  int d = -1;
  if (p->api.make_vdevice(&d, &vp)) nb_die("--rails %d: makeVDevice failed", o->rails);
  return d;
}

/* The virtual device fusing the devices --vdevice named. */
static int fuse_listed(plug_state* p, const nb_xport_opts* o, int ndev) {
  if (!p->api.make_vdevice) nb_die("--vdevice: %s has no makeVDevice (net v9+)", p->sym[0] ? p->sym : "the table");
  fab_vdevice_props vp = {.ndevs = o->nvdevs};
  for (int k = 0; k < o->nvdevs; k++) {
    if (o->vdevs[k] >= ndev) nb_die("--vdevice: device %d, the plugin has %d", o->vdevs[k], ndev);
    vp.devs[k] = o->vdevs[k];
  }
  int d = -1;
  if (p->api.make_vdevice(&d, &vp)) nb_die("--vdevice: makeVDevice failed (the plugin's WARN says why)");
  return d;
}

int nb_plugin_open(nb_xport* x, const nb_xport_opts* o) {
  plug_state* p = calloc(1, sizeof(*p));
  plugin_verbose = o->verbose;
  p->dev = o->dev;
  p->lib = dlopen(o->plugin, RTLD_NOW | RTLD_LOCAL);
  if (!p->lib) nb_die("cannot load plugin library %s: %s", o->plugin, dlerror());
  /* dlopen of a name without a '/' returns any loaded library of that
   * soname: an A/B would then compare a build with itself. */
  static void* first_lib;
  if (first_lib && p->lib == first_lib && nb_rank == 0)
    nb_log("note: %s is the same loaded library as the first plugin (give both as paths with a '/' to compare two "
           "builds)", o->plugin);
  if (!first_lib) first_lib = p->lib;
  /* Newest version both the library exports and a driver exists for,
   * unless one is asked for. fab_driver_bind refuses versions it has no
   * driver for. */
  unsigned lib = nb_plugin_versions_in_lib(o->plugin), refused = 0;
  char sym[64] = "";
  int bound_v = 0;
  for (int v = 31; v > 0 && !bound_v; v--) {
    if (!(lib & (1u << v)) || (o->version && v != o->version)) continue;
    snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
    void* table = dlsym(p->lib, sym);
    memset(&p->api, 0, sizeof(p->api));
    if (table && fab_driver_bind(sym, table, &p->api) == 0)
      bound_v = v;
    else
      refused |= 1u << v;
  }
  if (!bound_v) {
    char have[128] = "", no[128] = "";
    for (int v = 1; v < 32; v++) {
      if (lib & (1u << v)) snprintf(have + strlen(have), sizeof(have) - strlen(have), " v%d", v);
      if (refused & (1u << v)) snprintf(no + strlen(no), sizeof(no) - strlen(no), " v%d", v);
    }
    if (o->version)
      nb_die("%s exports ncclNetPlugin_{%s }; --version %d is %s", o->plugin, have, o->version,
             (lib & (1u << o->version)) ? "not one netbench has a driver for" : "not among them");
    nb_die("%s exports ncclNetPlugin_{%s } and netbench has a driver for none of them (refused:%s)", o->plugin, have,
           no);
  }
  if (p->api.version != bound_v) nb_die("driver for %s reports version %d", sym, p->api.version);
  p->version = bound_v;
  p->table = dlsym(p->lib, sym);
  snprintf(p->sym, sizeof(p->sym), "%s", sym);
  bound[bound_v] = p->table;
  if (++nplugins > 1) several = 1;
  fab_comm_config conf = {.traffic_class = -1};
  snprintf(plugin_transport, sizeof(plugin_transport), "unknown");
  p->nccl_profiler = o->nccl_profiler;
  p->mem_type = o->mem == NB_MEM_HOST ? FAB_PTR_HOST : FAB_PTR_CUDA;
  p->dmabuf = o->mem == NB_MEM_DMABUF;
  char rails_env[8];
  snprintf(rails_env, sizeof(rails_env), "%d", o->rails);
  if (o->rails > 1) setenv("FABRIC_RAILS", rails_env, 0);
  int rc = p->api.init(&p->ctx, 0x6e6574626e63ull, &conf, plug_logger, o->nccl_profiler ? nccl_profiler_absent : NULL);
  if (rc) nb_die("plugin %s: init failed (%d)", o->plugin, rc);
  int ndev = 0;
  if (p->api.devices(&ndev) || ndev <= 0) nb_die("plugin %s: no devices", o->plugin);
  if (p->dev >= ndev) nb_die("plugin %s: --dev %d but only %d devices", o->plugin, p->dev, ndev);
  if (o->rails > 1) p->dev = fuse_copies(p, o, ndev);
  if (o->nvdevs > 1) p->dev = fuse_listed(p, o, ndev);
  fab_properties props;
  memset(&props, 0, sizeof(props));
  if (p->api.get_properties(p->dev, &props)) nb_die("plugin: getProperties(%d) failed", p->dev);
  x->ops = &plugin_ops;
  x->priv = p;
  snprintf(x->desc, sizeof(x->desc),
           "plugin %s, %s (name \"%s\"), transport %s, %d dev(s), dev %d \"%s\" speed %d Mbps, regIsGlobal %d, "
           "maxRecvs %d, maxComms %d",
           o->plugin, sym, p->api.name ? p->api.name : "?", plugin_transport, ndev, p->dev,
           props.name ? props.name : "?", props.speed_mbps, props.reg_is_global, props.max_recvs, props.max_comms);
  return 0;
}
