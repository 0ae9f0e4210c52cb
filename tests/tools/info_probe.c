/* fabric-info: libfabric, the environment, and what the plugin reports. See info.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <rdma/fabric.h>

#include "fab_drivers.h"
#include "fab_params.h"
#include "info.h"

extern char** environ;

static info_report* g_report;

void info_log_attach(info_report* r) { g_report = r; }

void info_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  info_report* r = g_report;
  if (!r || level == FAB_LOG_TRACE) return;
  if (r->nlog >= INFO_MAX_LOG) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->log[r->nlog], INFO_LINE, fmt ? fmt : "", ap);
  va_end(ap);
  /* each net table inits the engine: a fact it logs again is printed once */
  for (int i = 0; i < r->nlog; i++)
    if (r->log_level[i] == level && !strcmp(r->log[i], r->log[r->nlog])) return;
  if (level == FAB_LOG_WARN) r->warns++;
  r->log_level[r->nlog++] = level;
}

static void probe_libfabric(info_report* r) {
  uint32_t v = fi_version();
  snprintf(r->fi_version, sizeof r->fi_version, "%u.%u", FI_MAJOR(v), FI_MINOR(v));
  struct fi_info* hints = fi_allocinfo();
  struct fi_info* all = NULL;
  if (!hints) return;
  hints->ep_attr->type = FI_EP_RDM;
  if (fi_getinfo(v, NULL, NULL, 0, hints, &all) == 0) {
    for (struct fi_info* fi = all; fi && r->nproviders < INFO_MAX_PROVIDERS; fi = fi->next) {
      const char* p = fi->fabric_attr->prov_name;
      int seen = 0;
      for (int i = 0; i < r->nproviders && !seen; i++) seen = strcmp(r->providers[i], p) == 0;
      if (!seen) snprintf(r->providers[r->nproviders++], sizeof r->providers[0], "%s", p);
    }
    fi_freeinfo(all);
  }
  fi_freeinfo(hints);
}

/* Whether NAME=value names one of the plugin's parameters. */
static int known_param(const char* assignment) {
  size_t n = strcspn(assignment, "=");
  for (const char* const* p = fab_param_names; *p; p++)
    if (strlen(*p) == n && !strncmp(*p, assignment, n)) return 1;
  return 0;
}

/* The next message of the parameter loader's account after from: where
 * "; FABRIC_NAME=" starts one (a message may hold "; " itself), or NULL. */
static const char* next_message(const char* from) {
  for (const char* at = from; (at = strstr(at, "; FABRIC_")) != NULL; at++)
    if (strcspn(at + 2, "= ;") == strcspn(at + 2, "=")) return at;
  return NULL;
}

/* What the parameter loader said of NAME=value (its account of every value it
 * ignored: "NAME=value is ...; using D; NAME2=..."), or "" when it took it. */
static void ignored_why(const char* assignment, const char* said, char* why, size_t len) {
  why[0] = '\0';
  size_t n = strlen(assignment);
  for (const char* at = said; at && *at; at = next_message(at)) {
    if (*at == ';') at += 2;
    if (strncmp(at, assignment, n) != 0 || at[n] != ' ') continue;
    const char* end = next_message(at);
    snprintf(why, len, "%.*s", (int)(end ? (size_t)(end - at) : strlen(at)), at);
    return;
  }
}

/* The settings that steer the plugin's choices. */
static void probe_env(info_report* r) {
  struct fab_params params;
  char said[2048] = "";
  fab_params_load(&params, said, sizeof said); /* the plugin reads them the same way at init */
  static const char* prefixes[] = {"FABRIC_", "FI_PROVIDER", "FI_TCP_IFACE", "FI_HMEM", "NCCL_NET", "NCCL_DEBUG"};
  for (char** e = environ; e && *e && r->nenv < INFO_MAX_ENV; e++) {
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
      if (strncmp(*e, prefixes[i], strlen(prefixes[i])) == 0) {
        snprintf(r->env[r->nenv], INFO_LINE, "%s", *e);
        r->env_unknown[r->nenv] = i == 0 && !known_param(*e);
        if (i == 0) ignored_why(*e, said, r->env_ignored[r->nenv], INFO_LINE);
        r->nunknown += r->env_unknown[r->nenv++];
        break;
      }
    }
  }
}

int info_is_neuron(void* dl) {
  struct link_map* map = NULL;
  if (dlinfo(dl, RTLD_DI_LINKMAP, &map) != 0 || !map || !map->l_name) return 0;
  const char* base = strrchr(map->l_name, '/');
  return strncmp(base ? base + 1 : map->l_name, "libnccom", 8) == 0;
}

/* The family of ncclNetPlugin_vN tables the library dl holds: NCCL's, or
 * Neuron's (the same names, other layouts). */
static const char* net_family(void* dl) { return info_is_neuron(dl) ? "neuron" : "net"; }

int info_bind_newest(void* dl, fab_api* api, char* symbol, size_t len) {
  const struct fab_driver_info* best = NULL;
  void* table = NULL;
  const char* family = net_family(dl);
  for (int i = 0; i < fab_driver_count; i++) { /* the newest net table both the library and the drivers know */
    const struct fab_driver_info* d = &fab_drivers[i];
    void* t = strcmp(d->family, family) == 0 && (!best || d->version > best->version) ? dlsym(dl, d->symbol) : NULL;
    if (t) best = d, table = t;
  }
  if (!best) return -1;
  memset(api, 0, sizeof *api);
  if (best->bind(table, api) != 0) return -1;
  snprintf(symbol, len, "%s", best->symbol);
  return 0;
}

/* What one net version reports for every device. */
static void probe_version(info_version* iv, const struct fab_driver_info* d, void* table) {
  fab_api api;
  memset(&api, 0, sizeof api);
  iv->version = d->version;
  iv->neuron = strcmp(d->family, "neuron") == 0;
  if (fab_driver_bind_in(d->family, d->symbol, table, &api) != 0) {
    snprintf(iv->error, INFO_LINE, "no driver for %s", d->symbol);
    return;
  }
  fab_ctx* ctx = NULL;
  fab_result rc = api.init(&ctx, 0x1f0, NULL, info_logger, NULL);
  if (rc == FAB_OK) rc = api.devices(&iv->ndev);
  if (rc != FAB_OK) {
    static const char* const names[] = {"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError",
                                        "ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage",
                                        "ncclRemoteError"};
    const char* name = rc >= 0 && rc < (int)(sizeof names / sizeof names[0]) ? names[rc] : "an unknown result";
    snprintf(iv->error, INFO_LINE, "%s failed with %s (%d): the plugin's log above says why",
             ctx || iv->ndev ? "devices" : "init", name, (int)rc);
    if (ctx && api.finalize) api.finalize(ctx);
    return;
  }
  if (iv->ndev > INFO_MAX_DEVS) iv->ndev = INFO_MAX_DEVS;
  for (int dev = 0; dev < iv->ndev; dev++) {
    fab_properties* p = &iv->props[dev];
    if (api.get_properties(dev, p) != FAB_OK) {
      snprintf(iv->error, INFO_LINE, "getProperties(%d) failed", dev);
      break;
    }
    snprintf(iv->names[dev], sizeof iv->names[dev], "%s", p->name ? p->name : "");
    snprintf(iv->pci[dev], sizeof iv->pci[dev], "%s", p->pci_path ? p->pci_path : "");
  }
  if (ctx && api.finalize) api.finalize(ctx);
}

static void probe_plugin(info_report* r, void* dl) {
  struct link_map* map = NULL;
  if (dlinfo(dl, RTLD_DI_LINKMAP, &map) == 0 && map) snprintf(r->plugin_file, INFO_LINE, "%s", map->l_name);
  /* Neuron's library reuses NCCL's names for tables of its own: the file
   * says which library this is, and only its families are looked up. */
  const char* library = info_is_neuron(dl) ? "nccom-net-fabric" : "nccl-net-fabric";
  for (int i = 0; i < fab_driver_count && r->ntables < INFO_MAX_TABLES; i++) {
    const struct fab_driver_info* d = &fab_drivers[i];
    void* table = strcmp(d->library, library) == 0 ? dlsym(dl, d->symbol) : NULL;
    if (!table) continue;
    snprintf(r->tables[r->ntables++], sizeof r->tables[0], "%s", d->symbol);
    if (strcmp(d->api, "fab_api") == 0 && r->nversions < INFO_MAX_VERSIONS)
      probe_version(&r->versions[r->nversions++], d, table);
  }
}

/* The plugin is probed before this process's own first libfabric call: its
 * init sets provider variables (FI_OFI_RXM_MSG_RX_SIZE, ...) that a provider
 * reads once, when libfabric first loads it, and the self-test's processes
 * inherit what was loaded. */
int info_probe(info_report* r, const char* plugin_path) {
  info_log_attach(r);
  probe_env(r);
  snprintf(r->plugin, INFO_LINE, "%s", plugin_path);
  void* dl = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
  if (dl) {
    probe_plugin(r, dl);
    dlclose(dl);
  } else {
    snprintf(r->load_error, INFO_LINE, "%s", dlerror());
  }
  probe_libfabric(r);
  if (!dl) return -1;
  int ok = r->nversions > 0;
  for (int i = 0; i < r->nversions; i++) ok = ok && !r->versions[i].error[0] && r->versions[i].ndev > 0;
  return ok ? 0 : -1;
}
