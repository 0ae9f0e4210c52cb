/*
 * The values the specs share with NCCL's installed headers (nccl.h and
 * nccl_device/net_device.h) must be equal. The compiler proves it: this file
 * only has to compile. check_installed.py compiles it (test abi_installed),
 * then once per entry of the generated lists with that entry's value
 * changed, and requires each of those compiles to fail naming the entry.
 *
 * This file includes only NCCL's headers and the generated value lists,
 * never the generated ABI headers, whose type names would clash.
 */
#include <nccl.h>
#include <nccl_device/net_device.h>
#include <stddef.h>

#include "fab_abi_installed.h"

#define SAME_VALUE(name, value) _Static_assert((long long)(name) == (long long)(value), #name " differs from the spec");
FAB_ABI_VALUES_NCCL_H(SAME_VALUE)
FAB_ABI_VALUES_NCCL_DEVICE_NET_DEVICE_H(SAME_VALUE)

#define SAME_SIZE(type, size) _Static_assert(sizeof(type) == (size), #type " size differs from the spec");
#define SAME_OFFSET(type, field, offset) \
  _Static_assert(offsetof(type, field) == (offset), #type "." #field " differs from the spec");
FAB_ABI_LAYOUT_NCCL_DEVICE_NET_DEVICE_H(SAME_SIZE, SAME_OFFSET)
