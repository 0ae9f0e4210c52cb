/*
 * What the data calls on comms over several rails share (fab_rails.h): which
 * rail a message takes, a rail's own memory handle.
 */
#include "fab_rails.h"

int fab_rails_rail_for(const fab_rails_comm* rc, int tag, uint32_t k) {
  return (int)((k + (uint32_t)tag) % (uint32_t)rc->n);
}

void* fab_rails_member_mh(void* mhandle, int rail) {
  if (!mhandle) return NULL;
  fab_rails_mr* m = fab_obj_get(mhandle, FAB_OBJ_RAILS_MR);
  return m && rail < m->n ? m->mh[rail] : mhandle; /* another handle: resolving it WARNs */
}
