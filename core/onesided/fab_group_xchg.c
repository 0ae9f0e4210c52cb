/* The all-to-all exchange behind a group's collective calls (connect's
 * hello, symmetric registration): one part per peer, as tagged messages on
 * the group's own point-to-point comms. See fab_group.h. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_group.h"

enum { XCHG_TAG = 0x7fff0000 };

/* --- waiting on point-to-point requests ---------------------------------------------- */

/* Tests reqs[0..n) until all are done; NULL entries are done already. */
static fab_result wait_all(fab_group* g, void** reqs, int n, const char* fn, const char* what) {
  int64_t deadline = fab_now_ms() + fab_g.params.connect_timeout_ms;
  for (;;) {
    int left = 0;
    for (int i = 0; i < n; i++) {
      if (!reqs[i]) continue;
      int done = 0;
      fab_result rc = fab_test(reqs[i], &done, NULL);
      if (rc != FAB_OK) {
        reqs[i] = NULL; /* test freed it */
        char why[160];
        snprintf(why, sizeof(why), "%s did not complete (see the WARN above)", what);
        return fab_group_fail(g, rc, fn, why);
      }
      if (done) reqs[i] = NULL;
      else left++;
    }
    if (!left) return FAB_OK;
    if (fab_group_aborted(g)) return fab_group_fail_aborted(g, fn);
    if (fab_now_ms() > deadline) {
      char why[160];
      snprintf(why, sizeof(why), "%s: %d peers did not answer within FABRIC_CONNECT_TIMEOUT_MS (%d ms); every rank "
               "must make the same collective calls", what, left, fab_g.params.connect_timeout_ms);
      return fab_group_fail(g, FAB_ERR_REMOTE, fn, why);
    }
    sched_yield();
  }
}

/* Posts a send (or, with recv set, a receive) of one part on h until the
 * transport takes it. */
static fab_result post_part(fab_group* g, void* h, int recv, void* buf, int tag, void** req, const char* fn) {
  int64_t deadline = fab_now_ms() + fab_g.params.connect_timeout_ms;
  size_t size = FAB_GROUP_XCHG_BYTES;
  for (;;) {
    fab_result rc = recv ? fab_irecv(h, 1, &buf, &size, &tag, &g->xchg_mh, NULL, req)
                         : fab_isend(h, buf, size, tag, g->xchg_mh, NULL, req);
    if (rc != FAB_OK) return fab_group_fail(g, rc, fn, "posting a collective exchange failed (see the WARN above)");
    if (*req) return FAB_OK;
    if (fab_group_aborted(g)) return fab_group_fail_aborted(g, fn);
    if (fab_now_ms() > deadline)
      return fab_group_fail(g, FAB_ERR_REMOTE, fn, "a peer takes no collective exchange messages");
    sched_yield();
  }
}


/* One round: every peer gets its part, every peer's part for us comes in on
 * the recv comm recv_h[r] (recv_h: the peers' handles, in rank order). */
fab_result fab_group_exchange_on(fab_group* g, void** recv_h, int tag, const char* fn) {
  int n = g->nranks;
  void** reqs = calloc((size_t)(2 * n), sizeof(void*));
  if (!reqs) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory");
  fab_result rc = FAB_OK;
  for (int r = 0; r < n && rc == FAB_OK; r++) {
    if (r == g->rank) continue;
    rc = post_part(g, recv_h[r], 1, fab_group_part_in(g, r), tag, &reqs[2 * r], fn);
    if (rc == FAB_OK) rc = post_part(g, g->peers[r].send_h, 0, fab_group_part_out(g, r), tag, &reqs[2 * r + 1], fn);
  }
  if (rc == FAB_OK) rc = wait_all(g, reqs, 2 * n, fn, "a collective exchange");
  free(reqs);
  return rc;
}

fab_result fab_group_exchange(fab_group* g, const void* parts, void* out, const char* fn) {
  int n = g->nranks;
  memcpy(fab_group_part_out(g, 0), parts, (size_t)n * FAB_GROUP_XCHG_BYTES);
  fab_result rc = FAB_OK;
  if (n > 1) {
    void** recv_h = malloc((size_t)n * sizeof(void*));
    if (!recv_h) return fab_group_fail(g, FAB_ERR_SYSTEM, fn, "out of memory");
    for (int r = 0; r < n; r++) recv_h[r] = g->peers[r].recv_h;
    rc = fab_group_exchange_on(g, recv_h, XCHG_TAG | (int)(g->xchg_seq++ & 0xffff), fn);
    free(recv_h);
  }
  if (rc != FAB_OK) return rc;
  for (int r = 0; r < n; r++)
    memcpy((char*)out + (size_t)r * FAB_GROUP_XCHG_BYTES, r == g->rank ? fab_group_part_out(g, r) : fab_group_part_in(g, r),
           FAB_GROUP_XCHG_BYTES);
  return FAB_OK;
}

