/*
 * Every struct and table layout the specs record, checked at run time so a
 * report names each mismatch (the generated headers also _Static_assert them),
 * and the driver registry checked against the tables it describes.
 */
#include <criterion/criterion.h>
#include <stddef.h>
#include <string.h>

#include "fab_abi_layouts.h"
#include "fab_drivers.h"

Test(abi_layout, struct_sizes) {
#define CHECK_SIZE(type, size, align)                                                      \
  cr_expect_eq(sizeof(type), (size_t)(size), #type ": sizeof %zu, spec %d", sizeof(type), size); \
  cr_expect_eq(_Alignof(type), (size_t)(align), #type ": alignof %zu, spec %d", _Alignof(type), align);
  FAB_ABI_STRUCT_SIZES(CHECK_SIZE)
#undef CHECK_SIZE
}

Test(abi_layout, struct_fields) {
#define CHECK_FIELD(type, field, offset) \
  cr_expect_eq(offsetof(type, field), (size_t)(offset), #type "." #field ": offset %zu, spec %d", offsetof(type, field), offset);
  FAB_ABI_STRUCT_FIELDS(CHECK_FIELD)
#undef CHECK_FIELD
}

Test(abi_layout, tables) {
#define CHECK_TABLE(type, size) cr_expect_eq(sizeof(type), (size_t)(size), #type ": sizeof %zu, spec %d", sizeof(type), size);
  FAB_ABI_TABLE_SIZES(CHECK_TABLE)
#undef CHECK_TABLE
#define CHECK_SLOT(type, slot, offset) \
  cr_expect_eq(offsetof(type, slot), (size_t)(offset), #type "." #slot ": offset %zu, spec %d", offsetof(type, slot), offset);
  FAB_ABI_TABLE_SLOTS(CHECK_SLOT)
#undef CHECK_SLOT
}

/* The facts that matter most, written out by hand (docs/abi-facts.md §3, §4). */
Test(abi_layout, well_known_facts) {
  cr_expect_eq(sizeof(ncclNetProperties_v11_t), 112);
  cr_expect_eq(sizeof(ncclNetProperties_v12_t), 128);
  cr_expect_eq(offsetof(ncclNetProperties_v11_t, maxP2pBytes), 88);
  cr_expect_eq(offsetof(ncclNetProperties_v12_t, maxP2pBytes), 104);
  cr_expect_eq(offsetof(ncclNetProperties_v8_t, regIsGlobal), 28);
  cr_expect_eq(sizeof(ncclNet_v6_t), 136);
  cr_expect_eq(offsetof(ncclNet_v6_t, regMrDmaBuf), 64);
  cr_expect_eq(offsetof(ncclNeuronNet_v6_t, fini), 16);
  cr_expect_eq(offsetof(ncclGin_v14_t, getGinProperties), 24);
  cr_expect_eq(sizeof(ncclGinProperties_v14_t), 2);
  cr_expect_eq(sizeof(ncclNeuronNetProperties_v6_t), 80);
  cr_expect_eq(sizeof(ncclNetDeviceHandle_v7_t), 32);
}

Test(abi_layout, driver_registry_matches_tables) {
  cr_assert_gt(fab_driver_count, 0);
  for (int i = 0; i < fab_driver_count; i++) {
    const struct fab_driver_info* d = &fab_drivers[i];
    cr_expect_eq(d->table_size, (size_t)d->nslots * sizeof(void*), "%s: %zu bytes, %d slots", d->symbol,
                 d->table_size, d->nslots);
    cr_expect_eq(d->slots[0].kind, FAB_SLOT_NAME, "%s: slot 0 is the name", d->symbol);
    for (int s = 0; s < d->nslots; s++)
      cr_expect_eq(d->slots[s].offset, (size_t)s * sizeof(void*), "%s.%s", d->symbol, d->slots[s].name);
    cr_expect_eq(fab_driver_find_in(d->family, d->symbol), d);
  }
  cr_expect_not_null(fab_driver_find("ncclGinPlugin_v11"), "GIN v11 is exported (proxy mode)");
  cr_expect_null(fab_driver_find("ncclGinPlugin_v13"), "GIN v13 (device backends) has no driver: not exported");
  cr_expect_null(fab_driver_find_in("net", "ncclNetPlugin_v5"), "net v5 is not described");
  cr_expect_not_null(fab_driver_find_in("neuron", "ncclNetPlugin_v5"), "Neuron v5 is exported");
  cr_expect_not_null(fab_driver_find_in("neuron", "ncclNetPlugin_v4"), "Neuron v4 is exported");
  cr_expect_str_eq(fab_driver_find("ncclNetPlugin_v6")->family, "net", "a bare symbol finds NCCL's table first");
  cr_expect_str_eq(fab_driver_find_in("neuron", "ncclNetPlugin_v6")->library, "nccom-net-fabric");
}
