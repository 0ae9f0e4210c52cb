#include "fab_tagmap.h"

#include <stdlib.h>

static uint32_t hash(int32_t tag, uint32_t cap) { return ((uint32_t)tag * 2654435761u) & (cap - 1); }

static fab_tagent* find(const fab_tagmap* m, int32_t tag) {
  if (!m->cap) return NULL;
  for (uint32_t i = hash(tag, m->cap);; i = (i + 1) & (m->cap - 1)) {
    fab_tagent* e = &m->e[i];
    if (!e->used || e->tag == tag) return e;
  }
}

static int grow(fab_tagmap* m) {
  uint32_t cap = m->cap ? m->cap * 2 : 16;
  fab_tagent* old = m->e;
  uint32_t old_cap = m->cap;
  m->e = calloc(cap, sizeof(*m->e));
  if (!m->e) {
    m->e = old;
    return -1;
  }
  m->cap = cap;
  for (uint32_t i = 0; i < old_cap; i++)
    if (old[i].used) *find(m, old[i].tag) = old[i];
  free(old);
  return 0;
}

int64_t fab_tagmap_take(fab_tagmap* m, int32_t tag) {
  if ((m->n + 1) * 2 > m->cap && grow(m) != 0) return -1;
  fab_tagent* e = find(m, tag);
  if (!e->used) {
    e->used = 1;
    e->tag = tag;
    e->next = 0;
    m->n++;
  }
  return e->next++;
}

void fab_tagmap_untake(fab_tagmap* m, int32_t tag) {
  fab_tagent* e = find(m, tag);
  if (e && e->used && e->next > 0) e->next--;
}

uint32_t fab_tagmap_peek(const fab_tagmap* m, int32_t tag) {
  const fab_tagent* e = find(m, tag);
  return e && e->used ? e->next : 0;
}

void fab_tagmap_free(fab_tagmap* m) {
  free(m->e);
  m->e = NULL;
  m->cap = m->n = 0;
}
