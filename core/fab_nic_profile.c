/*
 * FABRIC_NIC_PROFILE, a test-only setting: discovery takes the provider's
 * limits to be those of a NIC this machine does not have, so that the engine
 * runs here exactly as it would there while tcp or shm carry the bytes. The
 * provider is then opened with the narrowed attributes, which it accepts as
 * a request for less. Each limit is taken from that provider's libfabric
 * source (docs/providers.md cites the lines).
 */
#include <stdatomic.h>
#include <string.h>

#include "fab_engine.h"

typedef struct nic_profile {
  const char* name;
  size_t cq_data_size; /* bytes of remote CQ data */
} nic_profile;

static const nic_profile profiles[] = {
    {"efa", 4},   /* prov/efa/src/efa_cq.h: EFA_CQ_DATA_SIZE */
    {"verbs", 4}, /* prov/verbs/src/verbs_cq.c: the immediate data (imm_data) is 32 bits */
};

static const nic_profile* selected(void) {
  const char* want = fab_g.params.nic_profile;
  if (!want || !*want) return NULL;
  for (size_t i = 0; i < sizeof(profiles) / sizeof(profiles[0]); i++)
    if (!strcmp(want, profiles[i].name)) return &profiles[i];
  static atomic_int warned;
  if (!atomic_exchange(&warned, 1))
    FAB_WARN("FABRIC_NIC_PROFILE=%s is not a profile this build knows (efa, verbs); the provider's own limits apply",
             want);
  return NULL;
}

void fab_nic_profile_apply(struct fi_info* list) {
  const nic_profile* p = selected();
  if (!p) return;
  for (struct fi_info* fi = list; fi; fi = fi->next)
    if (fi->domain_attr->cq_data_size > p->cq_data_size) fi->domain_attr->cq_data_size = p->cq_data_size;
}

/* Whether a remote write's completion says how many bytes it placed (fi_cq
 * len). EFA and verbs report it (the work completion's byte_len), shm does,
 * and so does libfabric 2.x's tcp; 1.x's tcp (under ofi_rxm) reports 0. */
int fab_reports_write_len(const struct fi_info* fi) {
  const char* prov = fi->fabric_attr->prov_name;
  if (prov && !strncmp(prov, "tcp", 3) && FI_MAJOR(fi_version()) < 2) return 0;
  return 1;
}
