/*
 * The values the specs share with NCCL's installed headers (nccl.h and
 * nccl_device/net_device.h) must be equal. This file includes only NCCL's
 * headers and the generated value lists, never the generated ABI headers,
 * whose type names would clash.
 */
#include <criterion/criterion.h>
#include <nccl.h>
#include <nccl_device/net_device.h>
#include <stddef.h>

#include "fab_abi_installed.h"

#define SAME_VALUE(name, value) _Static_assert((long long)(name) == (long long)(value), #name " differs from the spec");
FAB_ABI_VALUES_NCCL_H(SAME_VALUE)
FAB_ABI_VALUES_NCCL_DEVICE_NET_DEVICE_H(SAME_VALUE)
#undef SAME_VALUE

#define SAME_SIZE(type, size) _Static_assert(sizeof(type) == (size), #type " size differs from the spec");
#define SAME_OFFSET(type, field, offset) \
  _Static_assert(offsetof(type, field) == (offset), #type "." #field " differs from the spec");
FAB_ABI_LAYOUT_NCCL_DEVICE_NET_DEVICE_H(SAME_SIZE, SAME_OFFSET)
#undef SAME_SIZE
#undef SAME_OFFSET

#define EXPECT(name, value) \
  cr_expect_eq((long long)(name), (long long)(value), #name ": installed %lld, spec %lld", (long long)(name), \
               (long long)(value));
#define COUNT(name, value) +1

Test(abi_installed, nccl_h_values) {
  FAB_ABI_VALUES_NCCL_H(EXPECT)
  cr_expect_geq(0 FAB_ABI_VALUES_NCCL_H(COUNT), 7, "ncclResult_t at least is checked");
}

Test(abi_installed, net_device_h_values) {
  FAB_ABI_VALUES_NCCL_DEVICE_NET_DEVICE_H(EXPECT)
}

Test(abi_installed, net_device_handle_layout) {
#define EXPECT_SIZE(type, size) cr_expect_eq(sizeof(type), (size_t)(size), #type);
#define EXPECT_OFFSET(type, field, offset) cr_expect_eq(offsetof(type, field), (size_t)(offset), #type "." #field);
  FAB_ABI_LAYOUT_NCCL_DEVICE_NET_DEVICE_H(EXPECT_SIZE, EXPECT_OFFSET)
}
