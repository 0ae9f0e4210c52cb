/* Per-tag counters of a connection (tag -> how many messages or buffers of
 * that tag so far): the k-th send with a tag matches the k-th buffer posted
 * with it, on both sides, whichever path each message takes. Open
 * addressing; grows. Owned by whoever holds the endpoint lock. */
#ifndef RD_TAGMAP_H
#define RD_TAGMAP_H

#include <stdint.h>

typedef struct rd_tagent {
  int32_t tag;
  uint32_t next;
  uint32_t used;
} rd_tagent;

typedef struct rd_tagmap {
  rd_tagent* e;
  uint32_t cap, n;
} rd_tagmap;

/* The count for tag, then incremented. -1 when out of memory. */
int64_t rd_tagmap_take(rd_tagmap* m, int32_t tag);
/* The count for tag (0 when never seen). */
uint32_t rd_tagmap_peek(const rd_tagmap* m, int32_t tag);
void rd_tagmap_free(rd_tagmap* m);

#endif /* RD_TAGMAP_H */
