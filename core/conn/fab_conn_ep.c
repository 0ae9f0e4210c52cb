/*
 * Endpoints as the connection layer uses them: created with its hooks (sweep
 * closed comms, free its objects at teardown) and with the control receives
 * posted. The provider layer calls back only through the hooks.
 */
#include "fab_conn.h"
#include "fab_transport.h"

/* After fi_close(ep): nothing can complete any more; free everything. */
static void endpoint_teardown(fab_endpoint* ep) {
  fab_ep_ctl_drop(ep); /* never posted: nothing of them is in flight */
  fab_listen_teardown(ep);
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->connects) {
    fab_pending* pc = FAB_CONTAINER_OF(it, fab_pending, park.node);
    fab_list_del(&pc->park.node);
    pc->park.destroy(&pc->park);
  }
  fab_comm_endpoint_teardown(ep);
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->parked) {
    fab_parked* p = FAB_CONTAINER_OF(it, fab_parked, node);
    fab_list_del(&p->node);
    p->destroy(p);
  }
}

/* Unsent control messages first: one posted now can complete by the next poll. */
static int endpoint_sweep(fab_endpoint* ep) {
  int gone = fab_list_empty(&ep->ctl_owed) ? 0 : fab_ep_ctl_retry(ep);
  return gone + fab_comm_sweep_closed(ep);
}

/* The live comms' transports post what their isend left to the rail's thread. */
static void endpoint_pump(fab_endpoint* ep) {
  FAB_LIST_FOREACH_SAFE(it, tmp, &ep->comms) {
    fab_comm* c = FAB_CONTAINER_OF(it, fab_comm, park.node);
    if (c->helped && c->ops && c->ops->pump) c->ops->pump(c);
  }
}

static const fab_ep_hooks conn_hooks = {.sweep = endpoint_sweep, .teardown = endpoint_teardown,
                                        .pump = endpoint_pump};

fab_result fab_conn_endpoint_create(fab_device* dev, fab_endpoint** out) {
  fab_endpoint* ep;
  fab_result rc = fab_endpoint_create(dev, &conn_hooks, &ep);
  if (rc != FAB_OK) return rc;
  rc = fab_ctrl_rx_setup(ep); /* WARNs */
  if (rc != FAB_OK) {
    fab_endpoint_destroy(ep); /* the teardown hook frees the control receives */
    return rc;
  }
  *out = ep;
  return FAB_OK;
}
