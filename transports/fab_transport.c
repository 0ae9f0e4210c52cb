#include <string.h>

#include "fab_transport.h"

/* Transports in order of preference for FABRIC_TRANSPORT=auto. */
static const fab_transport_ops* const transports[] = {&fab_rdma_ops, &fab_sendrecv_ops};

int fab_transport_candidates(const fab_transport_ops** out, int cap) {
  const char* want = fab_g.params.transport;
  int auto_pick = !want || !*want || !strcmp(want, "auto");
  int n = 0;
  for (size_t i = 0; i < FAB_ARRAY_SIZE(transports) && n < cap; i++) {
    if (auto_pick || !strcmp(want, transports[i]->name)) out[n++] = transports[i];
  }
  if (n == 0)
    FAB_WARN("FABRIC_TRANSPORT=%s names no transport; use auto, rdma or sendrecv", want);
  return n;
}

const fab_transport_ops* fab_transport_by_id(unsigned id) {
  for (size_t i = 0; i < FAB_ARRAY_SIZE(transports); i++)
    if (transports[i]->id == id) return transports[i];
  return NULL;
}
