/*
 * The endpoints of this process on intra-host providers (shm), and which of
 * them other endpoints of this process still address.
 *
 * libfabric 2.x's shm maps an AV entry for an endpoint of the same process
 * onto that endpoint's own region; removing the entry after that endpoint
 * closed writes into the freed region and unmaps it (docs/known-bugs.md). So:
 *   - an entry for an in-process endpoint holds a reference on it (taken at
 *     insert, dropped once the entry is removed);
 *   - a destroyed endpoint first removes its own entries for in-process
 *     peers, which are all still open (their references say so);
 *   - an endpoint still referenced is not closed but buried: kept open and
 *     idle, its objects alive, until the last reference goes; it is then
 *     reapable, and the next endpoint destruction closes it.
 * Lock: one process-wide mutex, taken under endpoint locks and never the
 * other way round.
 */
#include <pthread.h>
#include <string.h>

#include "fab_engine.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static fab_list g_live = {&g_live, &g_live};         /* registered, open or buried */
static fab_list g_reapable = {&g_reapable, &g_reapable}; /* buried, no longer referenced */

void fab_local_register(fab_endpoint* ep) {
  pthread_mutex_lock(&g_lock);
  fab_list_push(&g_live, &ep->local_node);
  ep->local_registered = 1;
  pthread_mutex_unlock(&g_lock);
}

fab_endpoint* fab_local_ref(const void* addr, size_t len) {
  fab_endpoint* found = NULL;
  pthread_mutex_lock(&g_lock);
  FAB_LIST_FOREACH_SAFE(it, tmp, &g_live) {
    fab_endpoint* e = FAB_CONTAINER_OF(it, fab_endpoint, local_node);
    if (e->addr_len == len && !memcmp(e->addr, addr, len)) {
      e->local_refs++;
      found = e;
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  return found;
}

void fab_local_unref(fab_endpoint* owner) {
  pthread_mutex_lock(&g_lock);
  if (owner->local_refs > 0 && --owner->local_refs == 0 && owner->buried) {
    fab_list_del(&owner->local_node);
    fab_list_push(&g_reapable, &owner->local_node);
  }
  pthread_mutex_unlock(&g_lock);
}

int fab_local_leave(fab_endpoint* ep) {
  if (!ep->local_registered) return 0;
  pthread_mutex_lock(&g_lock);
  int bury = ep->local_refs > 0;
  if (bury) {
    ep->buried = 1;
  } else {
    fab_list_del(&ep->local_node);
    ep->local_registered = 0;
  }
  pthread_mutex_unlock(&g_lock);
  return bury;
}

fab_endpoint* fab_local_next_reapable(void) {
  pthread_mutex_lock(&g_lock);
  fab_list* n = fab_list_pop(&g_reapable);
  fab_endpoint* ep = n ? FAB_CONTAINER_OF(n, fab_endpoint, local_node) : NULL;
  if (ep) {
    ep->local_registered = 0;
    ep->buried = 0;
  }
  pthread_mutex_unlock(&g_lock);
  return ep;
}

int fab_local_buried_count(void) {
  int n = 0;
  pthread_mutex_lock(&g_lock);
  FAB_LIST_FOREACH_SAFE(it, tmp, &g_live) n += FAB_CONTAINER_OF(it, fab_endpoint, local_node)->buried;
  pthread_mutex_unlock(&g_lock);
  return n;
}
