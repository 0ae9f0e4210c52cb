/*
 * FABRIC_NIC_PROFILE, a test-only setting: discovery takes the provider's
 * limits to be those of a NIC this machine does not have, so that the engine
 * runs here exactly as it would there while tcp or shm carry the bytes. The
 * provider is then opened with the narrowed attributes, which it accepts as
 * a request for less. Each limit is taken from that provider's libfabric
 * source (each entry below cites where).
 */
#include <stdint.h>
#include <string.h>

#include "fab_engine.h"

typedef struct nic_profile {
  const char* name;
  size_t cq_data_size;    /* bytes of remote CQ data */
  int mr_local;           /* FI_MR_LOCAL: the engine registers every buffer and passes descriptors */
  int mr_endpoint;        /* FI_MR_ENDPOINT: the engine keeps registrations per endpoint, and checks their use */
  uint64_t msg_order;     /* the ordering bits it can grant (tx and rx) */
  size_t inject_max;      /* its inject size, where smaller than the carrier's (INJECT_CARRIER: the carrier's) */
  size_t mr_key_size;     /* bytes of a remote key */
} nic_profile;

#define INJECT_CARRIER SIZE_MAX

/* From libfabric's sources (ofiwg/libfabric, prov/efa/src/efa_prov_info.c and efa_cq.h, prov/verbs/src/
 * verbs_info.c). FI_MR_LOCAL is the engine's to honour (every buffer registered, descriptors passed); the carrier
 * is not told, since ofi_rxm over tcp's offset-addressed registrations does not handle it (received data came
 * back zero), and EFA and verbs address by virtual address. FI_MR_PROV_KEY, FI_MR_VIRT_ADDR and FI_MR_ALLOCATED,
 * which both ask too, cannot be imposed on a carrier that does not grant them (tcp would take two registrations
 * with the same key), so the profiles leave them to the carrier: shm grants FI_MR_VIRT_ADDR. */
static const nic_profile profiles[] = {
    /* EFA_CQ_DATA_SIZE (4); the RDM entry's mr_mode has FI_MR_LOCAL; its msg_order is FI_ORDER_SAS and atomic
     * orderings only (no write-after-write); inject: SHM_MAX_INJECT_SIZE (4096) where shm transfer is on;
     * mr_key_size: an ibv_sge lkey (4 bytes) */
    {.name = "efa", .cq_data_size = 4, .mr_local = 1, .msg_order = FI_ORDER_SAS, .inject_max = 4096, .mr_key_size = 4},
    /* cq_data_size: ibv_send_wr's imm_data (4 bytes); FI_MR_LOCAL; VERBS_MSG_ORDER keeps RMA write ordering
     * (RC queue pairs), so the carrier's stays; mr_key_size: an ibv_sge lkey */
    {.name = "verbs", .cq_data_size = 4, .mr_local = 1, .msg_order = ~(uint64_t)0, .inject_max = INJECT_CARRIER,
     .mr_key_size = 4},
    /* prov/cxi/src/cxip_info.c: every entry's mr_mode has FI_MR_ENDPOINT (with FI_MR_PROV_KEY and FI_MR_ALLOCATED,
     * left to the carrier); cq_data_size CXIP_REMOTE_CQ_DATA_SZ (8) */
    {.name = "cxi", .cq_data_size = 8, .mr_endpoint = 1, .msg_order = ~(uint64_t)0, .inject_max = INJECT_CARRIER},
    /* libfabric 2.x's shm entry for GPU memory (prov/shm/src/smr_attr.c, smr_hmem_tx_attr): inject_size 0, the
     * entry the direct GPU path runs on within one host; cq_data_size 8 (smr_cmd_hdr's cq_data) */
    {.name = "shm-gpu", .cq_data_size = 8, .msg_order = ~(uint64_t)0, .inject_max = 0},
};

/* The profile FABRIC_NIC_PROFILE names (params.toml lists the names: any
 * other value was refused with a WARN when the parameters were read). */
static const nic_profile* selected(void) {
  const char* want = fab_g.params.nic_profile;
  for (size_t i = 0; want && *want && i < sizeof(profiles) / sizeof(profiles[0]); i++)
    if (!strcmp(want, profiles[i].name)) return &profiles[i];
  return NULL;
}

static void narrow(struct fi_info* fi, const nic_profile* p) {
  if (fi->domain_attr->cq_data_size > p->cq_data_size) fi->domain_attr->cq_data_size = p->cq_data_size;
  if (p->mr_key_size && fi->domain_attr->mr_key_size > p->mr_key_size) fi->domain_attr->mr_key_size = p->mr_key_size;
  fi->tx_attr->msg_order &= p->msg_order;
  fi->rx_attr->msg_order &= p->msg_order;
  if (fi->tx_attr->inject_size > p->inject_max) fi->tx_attr->inject_size = p->inject_max;
}

struct fi_info* fab_nic_profile_apply(struct fi_info* list, uint64_t asked_order) {
  const nic_profile* p = selected();
  if (!p || !list) return list;
  if (asked_order & ~p->msg_order) { /* that NIC would grant no entry with this ordering */
    fi_freeinfo(list);
    return NULL;
  }
  for (struct fi_info* fi = list; fi; fi = fi->next) narrow(fi, p);
  return list;
}

int fab_nic_profile_mr_local(void) {
  const nic_profile* p = selected();
  return p && p->mr_local;
}

int fab_nic_profile_mr_endpoint(void) {
  const nic_profile* p = selected();
  return p && p->mr_endpoint;
}

/* Whether a remote write's completion says how many bytes it placed (fi_cq
 * len). EFA and verbs report it (the work completion's byte_len), shm does,
 * and so does libfabric 2.x's tcp; 1.x's tcp (under ofi_rxm) reports 0. */
int fab_reports_write_len(const struct fi_info* fi) {
  const char* prov = fi->fabric_attr->prov_name;
  if (prov && !strncmp(prov, "tcp", 3) && FI_MAJOR(fi_version()) < 2) return 0;
  return 1;
}
