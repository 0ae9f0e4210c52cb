#include "fab_transport.h"

/* Transports in order of preference. The rdma transport will go first once
 * it exists (it needs FI_RMA and remote CQ data); sendrecv runs on any RDM
 * provider with tagged messages. */
static const fab_transport_ops* const transports[] = {&fab_sendrecv_ops};

const fab_transport_ops* fab_transport_select(const struct fi_info* info) {
  for (size_t i = 0; i < FAB_ARRAY_SIZE(transports); i++) {
    const fab_transport_ops* t = transports[i];
    if ((info->caps & (FI_TAGGED | t->extra_caps)) == (FI_TAGGED | t->extra_caps)) return t;
  }
  return NULL;
}
