/*
 * Loads the built plugin the way NCCL does (dlopen RTLD_NOW | RTLD_LOCAL,
 * dlsym "ncclNetPlugin_vN", "ncclRmaPlugin_vN") and walks every table it
 * exports: which symbols exist, every slot against what the spec says it must
 * hold, the name string, and the generated driver bound on top. Needs no
 * network: nothing is initialized. The libraries come from FABRIC_TEST_PLUGIN
 * (NCCL's) and FABRIC_TEST_NEURON_PLUGIN (Neuron's, when built), the versions
 * they must export from FABRIC_EXPECTED_{NET,RMA,GIN,NEURON}_VERSIONS (set by
 * the build).
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_drivers.h"

static void* lib;        /* libnccl-net-fabric.so */
static void* neuron_lib; /* libnccom-net-fabric.so, or NULL when not built */

static void open_plugin(void) {
  const char* path = getenv("FABRIC_TEST_PLUGIN");
  cr_assert(path != NULL && *path, "FABRIC_TEST_PLUGIN must name the plugin library");
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  cr_assert(lib != NULL, "dlopen(%s): %s", path, dlerror());
  const char* npath = getenv("FABRIC_TEST_NEURON_PLUGIN");
  cr_assert(!*FABRIC_EXPECTED_NEURON_VERSIONS || (npath && *npath), "FABRIC_TEST_NEURON_PLUGIN must name the Neuron library");
  neuron_lib = npath && *npath ? dlopen(npath, RTLD_NOW | RTLD_LOCAL) : NULL;
  cr_assert(!npath || !*npath || neuron_lib != NULL, "dlopen(%s): %s", npath, dlerror());
}

static int is_neuron(const struct fab_driver_info* d) { return strcmp(d->family, "neuron") == 0; }
/* The library that exports d's table. */
static void* lib_of(const struct fab_driver_info* d) { return is_neuron(d) ? neuron_lib : lib; }

static int expected_in(const char* versions, int version) {
  char list[256];
  snprintf(list, sizeof list, ",%s,", versions);
  char item[16];
  snprintf(item, sizeof item, ",%d,", version);
  return strstr(list, item) != NULL;
}

static int expected_net(int version) { return expected_in(FABRIC_EXPECTED_NET_VERSIONS, version); }

static int expected(const struct fab_driver_info* d) {
  const char* versions = strcmp(d->family, "rma") == 0   ? FABRIC_EXPECTED_RMA_VERSIONS
                         : strcmp(d->family, "gin") == 0 ? FABRIC_EXPECTED_GIN_VERSIONS
                         : is_neuron(d)                  ? FABRIC_EXPECTED_NEURON_VERSIONS
                                                         : FABRIC_EXPECTED_NET_VERSIONS;
  return expected_in(versions, d->version);
}

static int has_slot(const struct fab_driver_info* d, const char* name) {
  for (int i = 0; i < d->nslots; i++)
    if (strcmp(d->slots[i].name, name) == 0) return 1;
  return 0;
}

/* No dlclose: each test is its own process, and unloading libfabric makes
 * LeakSanitizer report what its provider libraries (psm2, ibverbs) allocate
 * in their constructors. Unload/reload belongs to the core's tests. */
TestSuite(abi_loader, .init = open_plugin);

Test(abi_loader, exports_exactly_the_configured_tables) {
  int found = 0;
  for (int i = 0; i < fab_driver_count; i++) {
    const struct fab_driver_info* d = &fab_drivers[i];
    if (!lib_of(d)) continue;
    void* table = dlsym(lib_of(d), d->symbol);
    if (expected(d)) {
      cr_expect(table != NULL, "%s is configured but not exported", d->symbol);
      found++;
    } else {
      cr_expect_null(table, "%s is exported but not configured (net " FABRIC_EXPECTED_NET_VERSIONS "; rma "
                     FABRIC_EXPECTED_RMA_VERSIONS "; gin " FABRIC_EXPECTED_GIN_VERSIONS ")", d->symbol);
    }
  }
  int wanted = 0;
  const char* lists[] = {FABRIC_EXPECTED_NET_VERSIONS, FABRIC_EXPECTED_RMA_VERSIONS, FABRIC_EXPECTED_GIN_VERSIONS,
                         FABRIC_EXPECTED_NEURON_VERSIONS};
  for (int l = 0; l < 4; l++)
    for (const char* p = lists[l]; *p; p++) wanted += (p == lists[l] || p[-1] == ',') && *p != ',';
  cr_expect_eq(found, wanted, "every configured version needs a generated driver");

  for (int v = 1; v <= 20; v++) {
    char sym[64];
    snprintf(sym, sizeof sym, "ncclCollNetPlugin_v%d", v);
    cr_expect_null(dlsym(lib, sym), "%s must not be exported: no collNet table is", sym);
    snprintf(sym, sizeof sym, "ncclGinPlugin_v%d", v);
    if (v >= 13) cr_expect_null(dlsym(lib, sym), "%s must not be exported: device GIN backends are not", sym);
  }
  cr_expect_null(dlsym(lib, "fab_init"), "core symbols stay local");
  cr_expect_null(dlsym(lib, "fab_params_load"), "core symbols stay local");
  /* Neuron's tables stay out of NCCL's library, and the other way round:
   * the same symbol names mean different layouts. */
  cr_expect_null(dlsym(lib, "ncclNetPlugin_v5"), "Neuron v5 is not in the NCCL library");
  if (neuron_lib) {
    cr_expect_null(dlsym(neuron_lib, "ncclNetPlugin_v12"), "NCCL's net tables are not in the Neuron library");
    cr_expect_null(dlsym(neuron_lib, "ncclRmaPlugin_v16"), "NCCL's RMA tables are not in the Neuron library");
    cr_expect_null(dlsym(neuron_lib, "fab_init"), "core symbols stay local");
    if (expected_in(FABRIC_EXPECTED_NEURON_VERSIONS, 6) && expected_net(6))
      cr_expect_neq(dlsym(neuron_lib, "ncclNetPlugin_v6"), dlsym(lib, "ncclNetPlugin_v6"), "two v6 tables");
  }
}

Test(abi_loader, every_slot_holds_what_the_spec_says) {
  for (int i = 0; i < fab_driver_count; i++) {
    const struct fab_driver_info* d = &fab_drivers[i];
    if (!expected(d)) continue;
    void* const* slot = dlsym(lib_of(d), d->symbol);
    cr_assert(slot != NULL, "%s", d->symbol);
    for (int s = 0; s < d->nslots; s++) {
      const struct fab_abi_slot* info = &d->slots[s];
      void* value = slot[info->offset / sizeof(void*)];
      switch (info->kind) {
        case FAB_SLOT_NAME:
          cr_expect(value != NULL && strcmp((const char*)value, d->plugin_name) == 0, "%s.name is \"%s\", want \"%s\"",
                    d->symbol, value ? (const char*)value : "(null)", d->plugin_name);
          cr_expect_str_eq(d->plugin_name, "Fabric");
          break;
        case FAB_SLOT_REQUIRED:
        case FAB_SLOT_OPTIONAL:
          cr_expect(value != NULL, "%s.%s must not be NULL", d->symbol, info->name);
          break;
        case FAB_SLOT_NULL:
          cr_expect_null(value, "%s.%s must be NULL (a host plugin does not offload)", d->symbol, info->name);
          break;
      }
    }
  }
}

static void check_net_driver(const struct fab_driver_info* d, void* table) {
  fab_api api;
  cr_assert_eq(fab_driver_bind_in(d->family, d->symbol, table, &api), 0, "%s", d->symbol);
  cr_expect_eq(api.version, d->version);
  cr_expect_str_eq(api.name, "Fabric");
  cr_expect_eq(api.max_handle_size, is_neuron(d) && d->version == 4 ? 64 : 128, "%s: handle size %d", d->symbol,
               api.max_handle_size);
  cr_expect(api.init && api.finalize && api.devices && api.get_properties && api.listen && api.connect &&
                api.accept && api.close_send && api.close_recv && api.close_listen && api.reg_mr && api.dereg_mr &&
                api.isend && api.irecv && api.iflush && api.test,
            "%s: a required fab_api member is NULL", d->symbol);
  cr_expect_eq(api.reg_mr_dmabuf != NULL, has_slot(d, "regMrDmaBuf"), "%s: reg_mr_dmabuf", d->symbol);
  cr_expect_eq(api.make_vdevice != NULL, has_slot(d, "makeVDevice"), "%s: make_vdevice", d->symbol);
  cr_expect_eq(api.set_net_attr != NULL, has_slot(d, "setNetAttr"), "%s: set_net_attr", d->symbol);
  int onesided = has_slot(d, "iwrite");
  cr_expect_eq(onesided, is_neuron(d) && d->version >= 5, "%s: one-sided calls on a connection are Neuron v5+'s",
               d->symbol);
  cr_expect(api.get_mr_key && api.iwrite && api.iwrite_inline && api.iread ? onesided
                : !api.get_mr_key && !api.iwrite && !api.iwrite_inline && !api.iread && !onesided,
            "%s: get_mr_key/iwrite/iwrite_inline/iread bound where the table has them, and only there", d->symbol);
}

static void check_rma_driver(const struct fab_driver_info* d, void* table) {
  fab_rma_api api;
  cr_assert_eq(fab_driver_bind(d->symbol, table, &api), 0, "%s", d->symbol);
  cr_expect_eq(api.version, d->version);
  cr_expect_str_eq(api.name, "Fabric");
  cr_expect_eq(api.max_handle_size, 128);
  cr_expect(api.init && api.finalize && api.devices && api.get_properties && api.listen && api.connect &&
                api.reg_mr_sym && api.reg_mr_sym_dmabuf && api.dereg_mr_sym && api.close_group && api.close_listen &&
                api.iput && api.iput_signal && api.test && api.progress && api.query_last_error,
            "%s: a required fab_rma_api member is NULL", d->symbol);
  int rma = strcmp(d->family, "rma") == 0; /* GIN v11/v12 proxies have no contexts, gets or flushes */
  cr_expect_eq(api.create_context != NULL, rma, "%s: create_context", d->symbol);
  cr_expect_eq(api.destroy_context != NULL, rma, "%s: destroy_context", d->symbol);
  cr_expect_eq(api.iget != NULL, rma, "%s: iget", d->symbol);
  cr_expect_eq(api.iflush != NULL, rma, "%s: iflush", d->symbol);
  cr_expect_eq(api.get_rma_properties != NULL, has_slot(d, "getRmaProperties"), "%s: get_rma_properties",
               d->symbol);
}

Test(abi_loader, drivers_bind_every_exported_table) {
  for (int i = 0; i < fab_driver_count; i++) {
    const struct fab_driver_info* d = &fab_drivers[i];
    if (!expected(d)) continue;
    void* table = dlsym(lib_of(d), d->symbol);
    if (strcmp(d->api, "fab_rma_api") == 0) check_rma_driver(d, table);
    else check_net_driver(d, table);
  }
  fab_api api;
  cr_expect_eq(fab_driver_bind("ncclNetPlugin_v1", lib, &api), -1, "unknown symbols are refused");
}

/*
 * Range checks happen in the shim, before the core sees anything: a value
 * that the version's type can carry but the core cannot take is refused with
 * ncclInternalError, never truncated. Comms are NULL because the shim must
 * not get as far as using them.
 */
#include "fab_abi_all.h"

Test(abi_loader, shims_reject_what_does_not_fit) {
  void* mh = NULL;
  void* req = NULL;
  char buf[16];
  void* data[FAB_MAX_RECVS + 1] = {buf};
  int tags[FAB_MAX_RECVS + 1] = {0};
  if (expected_net(6)) {
    ncclNet_v6_t* v6 = dlsym(lib, "ncclNetPlugin_v6");
    int sizes[FAB_MAX_RECVS + 1] = {-1};
    cr_expect_eq(v6->regMr(NULL, buf, -1, NCCL_PTR_HOST, &mh), ncclInternalError, "v6 regMr: negative size");
    cr_expect_eq(v6->isend(NULL, buf, -1, 0, NULL, &req), ncclInternalError, "v6 isend: negative size");
    cr_expect_eq(v6->irecv(NULL, 1, data, sizes, tags, NULL, &req), ncclInternalError, "v6 irecv: negative size");
    sizes[0] = 16;
    cr_expect_eq(v6->irecv(NULL, FAB_MAX_RECVS + 1, data, sizes, tags, NULL, &req), ncclInternalError,
                 "v6 irecv: n above FAB_MAX_RECVS");
    cr_expect_eq(v6->irecv(NULL, -1, data, sizes, tags, NULL, &req), ncclInternalError, "v6 irecv: negative n");
  }
  if (expected_net(9)) {
    ncclNet_v9_t* v9 = dlsym(lib, "ncclNetPlugin_v9");
    ncclNetVDeviceProps_v9_t props = {.ndevs = 5};
    int dev = -1;
    cr_expect_eq(v9->makeVDevice(&dev, &props), ncclInternalError, "v9 makeVDevice: 5 devices in devs[4]");
    props.ndevs = -1;
    cr_expect_eq(v9->makeVDevice(&dev, &props), ncclInternalError, "v9 makeVDevice: negative ndevs");
  }
  if (expected_net(12)) {
    ncclNet_v12_t* v12 = dlsym(lib, "ncclNetPlugin_v12");
    ncclNetVDeviceProps_v12_t props = {.ndevs = 9};
    int dev = -1;
    cr_expect_eq(v12->makeVDevice(&dev, &props), ncclInternalError, "v12 makeVDevice: 9 devices in devs[8]");
    cr_expect_eq(v12->getProperties(0, NULL), ncclInternalError, "v12 getProperties: NULL props");
  }
}
