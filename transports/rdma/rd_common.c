/* What both sides of the rdma transport use. */
#include <stdio.h>

#include "rd.h"

const uint64_t rd_scratch_word = 0;

void rd_poll(fab_comm* c) {
  fab_ep_poll(c->ep);
  if (FAB_UNLIKELY(c->home != NULL)) fab_ep_poll(c->home);
}

void rd_protocol_error(fab_comm* c, const char* what) {
  if (c->error != FAB_OK) return; /* one WARN per connection: a flood of garbage logs once */
  char why[160];
  snprintf(why, sizeof(why), "the peer broke the rdma protocol: %s", what);
  FAB_WARN("connection to %s failed: %s; nothing was written outside a registered buffer. Check that both ranks run "
           "the same plugin build", c->peer_name, why);
  fab_comm_fail(c, FAB_ERR_REMOTE, why);
}
