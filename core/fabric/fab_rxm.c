/*
 * What ofi_rxm sends as one message, and so what we send tagged; and rxm's
 * receive pool, grown as an endpoint opens (at the end of this file).
 *
 * ofi_rxm sends a tagged message of up to its eager limit as one message of
 * the provider beneath; a larger one pays a rendezvous (a request, an answer,
 * then the data), as does the rdma transport's own for a message above
 * FABRIC_TAGGED_MAX. Over tcp the eager message goes straight from the
 * sender's buffer into the posted receive (rxm's direct send and dynamic
 * receive buffers); one that arrives before its receive is posted lands in
 * memory rxm allocates for it. rxm's limit defaults to its buffer size
 * (16 KiB), which also sizes its two pools of 1024 buffers per endpoint, but
 * over tcp the limit can be raised alone (FI_OFI_RXM_EAGER_LIMIT), costing no
 * pool memory. So, for a transport that confirms large tagged messages
 * before close, the engine raises it to FABRIC_RXM_EAGER_LIMIT unless the
 * environment sets it, and each device sends tagged whatever its rxm sends at
 * once. rxm reads the variable when an endpoint opens (fi_param_get), so it
 * is set once the transport is chosen, before any endpoint opens.
 *
 * libfabric 2.x's own tcp endpoint (provider "tcp", listed before rxm over
 * it) has no eager limit: it sends a tagged message of any size as one
 * message, and keeps one that arrives before its receive in memory it
 * allocates (up to 64 per peer, then it stops reading that socket). There
 * the rdma transport sends tagged up to the same FABRIC_RXM_EAGER_LIMIT,
 * its credits bounding what waits, and writes what is larger.
 *
 * Over tcp, rxm posts 4096 receive buffers of 16 KiB per endpoint as it
 * opens (shared by all its connections): about 64 MiB of the 104 an endpoint
 * costs, times the rails. The engine asks for FABRIC_RXM_RX_SIZE instead
 * (FI_OFI_RXM_MSG_RX_SIZE), before libfabric's first call: rxm reads it once,
 * as libfabric loads it. Over verbs the same variable counts per connection
 * (128 by default), so it is left alone where rxm may run over verbs.
 * docs/performance.md has the figures.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fab_engine.h"
#include "fab_transport.h"

#define RXM_EAGER_ENV "FI_OFI_RXM_EAGER_LIMIT"
#define RXM_RX_SIZE_ENV "FI_OFI_RXM_MSG_RX_SIZE"
enum { RXM_BUFFER_DEFAULT = 16384 }; /* rxm's FI_OFI_RXM_BUFFER_SIZE default (libfabric 1.17 and 2.x) */
enum { RXM_SRX_POSTED = 4096 }; /* rxm over tcp: receive buffers it posts per endpoint as it opens */

static char ours[32]; /* the value we put in the environment, from an earlier start; "" when none */

/* A plain number of bytes from the environment; 0 when unset or anything
 * else (libfabric then ignores it too). */
static size_t env_bytes(const char* name) {
  const char* s = getenv(name);
  if (!s || !*s) return 0;
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  return *end == '\0' ? (size_t)v : 0;
}

/* libfabric's boolean: 0, no, false or off (any case). */
static int env_off(const char* name) {
  const char* s = getenv(name);
  return s && (!strcmp(s, "0") || !strcasecmp(s, "no") || !strcasecmp(s, "false") || !strcasecmp(s, "off"));
}

/* Only for a transport that confirms large tagged messages: an eager send
 * completes once its bytes are in our socket, and closing the endpoint right
 * after would drop those still queued (docs/architecture.md, "Completion
 * level"). The sendrecv transport does not, so it keeps rxm's limit, whose
 * rendezvous completes on delivery. */
void fab_rxm_raise_eager_limit(const fab_transport_ops* t) {
  size_t want = t->needs.confirms_tagged ? fab_g.params.rxm_eager_limit : 0;
  const char* set = getenv(RXM_EAGER_ENV);
  int mine = set && ours[0] && !strcmp(set, ours); /* an earlier start's: follows this start's parameter */
  if (set && *set && !mine) {
    if (want) FAB_INFO(FAB_SUBSYS_INIT, "%s=%s, set by the environment: kept (FABRIC_RXM_EAGER_LIMIT=%zu not applied)",
                       RXM_EAGER_ENV, set, want);
    return;
  }
  if (want == 0) {
    if (mine) unsetenv(RXM_EAGER_ENV);
    ours[0] = '\0';
    return;
  }
  char v[sizeof(ours)];
  snprintf(v, sizeof(v), "%zu", want);
  if (setenv(RXM_EAGER_ENV, v, 1) != 0) {
    FAB_INFO(FAB_SUBSYS_INIT, "could not set %s (out of memory): ofi_rxm keeps its own eager limit", RXM_EAGER_ENV);
    return;
  }
  memcpy(ours, v, sizeof(ours));
  FAB_INFO(FAB_SUBSYS_INIT, "%s=%s: ofi_rxm over tcp sends tagged messages of up to %zu bytes as one message, in "
           "this whole process (FABRIC_RXM_EAGER_LIMIT; 0 leaves rxm's own)", RXM_EAGER_ENV, v, want);
}

/* --- rxm's posted receive buffers --------------------------------------------- */

static char ours_rx[32]; /* FI_OFI_RXM_MSG_RX_SIZE as we set it; "" when we did not */

/* An RDMA device on this host (/sys/class/infiniband): libfabric may then
 * choose verbs, with rxm over it. */
static int rdma_device_present(void) {
  DIR* d = opendir("/sys/class/infiniband");
  if (!d) return 0;
  int found = 0;
  for (struct dirent* e; !found && (e = readdir(d)) != NULL;) found = e->d_name[0] != '.';
  closedir(d);
  return found;
}

/* Whether rxm may run over verbs in this process: a provider list that names
 * verbs (not as an exclusion), or none named on a host with an RDMA device. */
static int rxm_may_run_over_verbs(void) {
  const char* named = fab_g.params.provider[0] ? fab_g.params.provider : getenv("FI_PROVIDER");
  if (named && *named) return named[0] != '^' && strstr(named, "verbs") != NULL;
  return rdma_device_present();
}

/* What fab_rxm_size_receive_pool found, for fab_rxm_tell_receive_pool. */
static enum { RX_OWN, RX_OURS, RX_ENVIRONMENT, RX_VERBS } rx_size_why;

void fab_rxm_size_receive_pool(void) {
  size_t want = fab_g.params.rxm_rx_size;
  const char* set = getenv(RXM_RX_SIZE_ENV);
  int mine = set && ours_rx[0] && !strcmp(set, ours_rx); /* an earlier start's: follows this start's parameter */
  rx_size_why = RX_OWN;
  if (set && *set && !mine) {
    rx_size_why = RX_ENVIRONMENT;
    return;
  }
  int verbs = want != 0 && rxm_may_run_over_verbs();
  if (want == 0 || verbs) {
    if (mine) unsetenv(RXM_RX_SIZE_ENV);
    ours_rx[0] = '\0';
    if (verbs) rx_size_why = RX_VERBS;
    return;
  }
  char v[sizeof(ours_rx)];
  snprintf(v, sizeof(v), "%zu", want);
  if (setenv(RXM_RX_SIZE_ENV, v, 1) != 0) return; /* out of memory: rxm keeps its own count */
  memcpy(ours_rx, v, sizeof(ours_rx));
  rx_size_why = RX_OURS;
}

void fab_rxm_tell_receive_pool(const char* prov) {
  if (strcmp(prov, "tcp;ofi_rxm") != 0) return;
  const char* set = getenv(RXM_RX_SIZE_ENV);
  switch (rx_size_why) {
    case RX_OURS:
      FAB_INFO(FAB_SUBSYS_INIT, "%s=%s: ofi_rxm posts %s receive buffers per endpoint rather than %d (at 512 about "
               "36 MiB an endpoint rather than 104), in this whole process, unless another part of it used "
               "libfabric before the plugin (FABRIC_RXM_RX_SIZE; 0 leaves rxm's own)", RXM_RX_SIZE_ENV, ours_rx,
               ours_rx, RXM_SRX_POSTED);
      break;
    case RX_ENVIRONMENT:
      FAB_INFO(FAB_SUBSYS_INIT, "%s=%s, set by the environment: kept (FABRIC_RXM_RX_SIZE not applied)",
               RXM_RX_SIZE_ENV, set ? set : "");
      break;
    case RX_VERBS:
      FAB_INFO(FAB_SUBSYS_INIT, "ofi_rxm posts its own %d receive buffers per endpoint (about 104 MiB an endpoint): "
               "FABRIC_RXM_RX_SIZE is not applied where rxm may run over verbs (%s), whose count is per "
               "connection; set FI_OFI_RXM_MSG_RX_SIZE=512 or FABRIC_PROVIDER=tcp to apply it",
               RXM_SRX_POSTED, fab_g.params.provider[0] || getenv("FI_PROVIDER") ? "the provider named" :
               "an RDMA device on this host");
      break;
    case RX_OWN:
      break;
  }
}

/* Over tcp only: elsewhere (verbs) rxm needs no-MR_LOCAL direct sends and
 * dynamic receive buffers for a limit above its buffer size, and ignores it. */
static size_t rxm_sends_at_once(const char* prov) {
  size_t buffer = env_bytes("FI_OFI_RXM_BUFFER_SIZE");
  if (buffer == 0) buffer = RXM_BUFFER_DEFAULT;
  int over_tcp = strncmp(prov, "tcp;", 4) == 0;
  if (!over_tcp || env_off("FI_OFI_RXM_ENABLE_DIRECT_SEND") || env_off("FI_OFI_RXM_ENABLE_DYN_RBUF")) return buffer;
  size_t eager = env_bytes(RXM_EAGER_ENV);
  return eager > buffer ? eager : buffer;
}

/* libfabric 2.x's tcp without rxm: the engine's limit, unless 0 or above
 * what tcp keeps for a receive not posted yet (FI_TCP_MAX_SAVED_SIZE; beyond
 * it tcp holds the message back for a rendezvous of its own). */
static size_t tcp_sends_at_once(void) {
  size_t want = fab_g.params.rxm_eager_limit;
  size_t saved = env_bytes("FI_TCP_MAX_SAVED_SIZE");
  if (want == 0) return fab_g.params.tagged_max;
  return saved && saved < want ? saved : want;
}

/* Under FABRIC_NIC_PROFILE the carrier stands for another NIC (EFA, verbs,
 * cxi), whose provider is not tcp: its size, not the carrier's. */
size_t fab_rxm_tagged_max(const char* prov) {
  const char* own = getenv("FABRIC_TAGGED_MAX");
  if ((own && *own) || fab_g.params.nic_profile[0]) return fab_g.params.tagged_max;
  size_t at_once;
  if (!strcmp(prov, "tcp")) at_once = tcp_sends_at_once();
  else if (strstr(prov, "ofi_rxm")) at_once = rxm_sends_at_once(prov);
  else return fab_g.params.tagged_max;
  return at_once > FAB_PARAM_TAGGED_MAX_MAX ? FAB_PARAM_TAGGED_MAX_MAX : at_once;
}

/* --- rxm's buffer pools, grown as the endpoint opens ------------------------ */

/* ofi_rxm keeps a message that arrives before its receive in the buffer it
 * landed in and posts another from its receive pool in its place. Its pools
 * grow by chunks of 1024 buffers, each chunk zeroed as it is allocated: 17
 * MiB, 10-13 ms inside one fi_cq_read, measured inside NCCL. With rxm's own
 * 4096 posted buffers the receive pool's four chunks are full, so the first
 * early message grows a fifth (FABRIC_RXM_RX_SIZE=512 leaves spares in the
 * first); and the send pool's first chunk is allocated at the first send
 * that is not inline. One empty message to ourselves, sent with a
 * completion and taken only after it has arrived, has rxm grow both now
 * instead (FABRIC_RXM_WARM_POOL in core/params.toml). It is untagged: should
 * it be left behind, a control receive takes it as a liveness probe and
 * drops it. */
enum { RXM_WARM_WAIT_MS = 2000, RXM_WARM_LAND_MS = 1 };

static void warm_op_late(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) {
  (void)op, (void)done, (void)err; /* completed after warm_pool gave up on it */
}

/* Reads ep's CQ until op completes: 0, its error, or -FI_ETIMEDOUT. Only
 * the warm-up's operations are posted on the endpoint yet. */
static int warm_wait(fab_endpoint* ep, fab_op* op, int64_t until) {
  for (;;) {
    fab_cqe e[4];
    ssize_t n = fi_cq_read(ep->cq, e, 4);
    for (ssize_t i = 0; i < n; i++)
      if (e[i].op_context == &op->ctx) return 0;
    if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err = {0};
      if (fi_cq_readerr(ep->cq, &err, 0) > 0 && err.op_context == &op->ctx) return -(int)err.err;
    } else if (n < 0 && n != -FI_EAGAIN) {
      return (int)n;
    }
    if (fab_now_ms() > until) return -FI_ETIMEDOUT;
  }
}

/* Progress only: called while none of the warm-up's operations is posted
 * or none is left to wait for, so no completion read here is wanted. */
static void warm_progress(fab_endpoint* ep) {
  fab_cqe e[4];
  (void)fi_cq_read(ep->cq, e, 4);
}

/* Posts the empty message to self, retrying while rxm connects to itself. */
static int warm_send(fab_endpoint* ep, fi_addr_t self, int64_t until) {
  for (;;) {
    ssize_t rc = fi_send(ep->ep, NULL, 0, NULL, self, &ep->rxm_warm[0].ctx);
    if (rc != -FI_EAGAIN) return (int)rc;
    warm_progress(ep);
    if (fab_now_ms() > until) return -FI_ETIMEDOUT;
  }
}

static int warm_exchange(fab_endpoint* ep, fi_addr_t self, int64_t until) {
  int rc = warm_send(ep, self, until);
  if (rc == 0) rc = warm_wait(ep, &ep->rxm_warm[0], until);
  if (rc != 0) return rc;
  /* The send completed once its bytes were in the socket; progress a little
   * longer so that rxm has taken it in at our end, with no receive posted. */
  for (int64_t land = fab_now_ms() + RXM_WARM_LAND_MS; fab_now_ms() <= land;) warm_progress(ep);
  rc = (int)fi_recv(ep->ep, ep->rxm_warm_buf, sizeof(ep->rxm_warm_buf), NULL, FI_ADDR_UNSPEC, &ep->rxm_warm[1].ctx);
  if (rc == 0) rc = warm_wait(ep, &ep->rxm_warm[1], until);
  return rc;
}

void fab_rxm_warm_pool(fab_endpoint* ep) {
  /* Over tcp only: there rxm's receive context is shared by the endpoint's
   * connections (verbs posts 128 buffers per connection instead), and a
   * connection to itself is known to work. */
  if (!fab_g.params.rxm_warm_pool || strcmp(ep->dev->info->fabric_attr->prov_name, "tcp;ofi_rxm") != 0) return;
  fab_op_init(&ep->rxm_warm[0], warm_op_late, ep, 0);
  fab_op_init(&ep->rxm_warm[1], warm_op_late, ep, 1);
  int64_t t0 = fab_now_ms();
  fi_addr_t self = FI_ADDR_NOTAVAIL;
  int rc = fi_av_insert(ep->av, ep->addr, 1, &self, 0, NULL) == 1 ? 0 : -FI_EINVAL;
  if (rc == 0) rc = warm_exchange(ep, self, t0 + RXM_WARM_WAIT_MS);
  if (self != FI_ADDR_NOTAVAIL && rc == 0) fi_av_remove(ep->av, &self, 1, 0); /* closes rxm's loopback connection */
  if (rc != 0)
    FAB_INFO(FAB_SUBSYS_INIT, "endpoint on %s: could not grow ofi_rxm's buffer pools ahead (%s); the first "
             "message that arrives before its receive may take about 10 ms (FABRIC_RXM_WARM_POOL)",
             ep->dev->name, fi_strerror(-rc));
  else
    FAB_INFO(FAB_SUBSYS_INIT, "endpoint on %s: grew ofi_rxm's buffer pools ahead in %lld ms (FABRIC_RXM_WARM_POOL)",
             ep->dev->name, (long long)(fab_now_ms() - t0));
}
