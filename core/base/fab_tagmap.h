/* Per-tag counters of a connection (tag -> how many messages or buffers of
 * that tag so far): the k-th send with a tag matches the k-th buffer posted
 * with it, on both sides, whichever path each message takes. Open
 * addressing; grows. Owned by one thread at a time: the rdma transport's under the endpoint lock, a
 * rails comm's by its owner thread (core/rails/fab_rails.c). */
#ifndef FAB_TAGMAP_H
#define FAB_TAGMAP_H

#include <stdint.h>

typedef struct fab_tagent {
  int32_t tag;
  uint32_t next;
  uint32_t used;
} fab_tagent;

typedef struct fab_tagmap {
  fab_tagent* e;
  uint32_t cap, n;
} fab_tagmap;

/* The count for tag, then incremented. -1 when out of memory. */
int64_t fab_tagmap_take(fab_tagmap* m, int32_t tag);
/* Gives back the count take returned last for tag (the post it was for did
 * not happen). */
void fab_tagmap_untake(fab_tagmap* m, int32_t tag);
/* The count for tag (0 when never seen). */
uint32_t fab_tagmap_peek(const fab_tagmap* m, int32_t tag);
void fab_tagmap_free(fab_tagmap* m);

#endif /* FAB_TAGMAP_H */
