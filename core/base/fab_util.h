/*
 * Small helpers shared by the core and the transports: an intrusive list,
 * time, hashing and random ids.
 */
#ifndef FAB_UTIL_H
#define FAB_UTIL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define FAB_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define FAB_CONTAINER_OF(p, type, member) ((type*)(void*)((char*)(p)-offsetof(type, member)))
#define FAB_LIKELY(x) __builtin_expect(!!(x), 1)
#define FAB_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* --- intrusive doubly linked list (a ring with a sentinel head) ---------- */

typedef struct fab_list {
  struct fab_list* prev;
  struct fab_list* next;
} fab_list;

static inline void fab_list_init(fab_list* l) { l->prev = l->next = l; }
static inline int fab_list_empty(const fab_list* l) { return l->next == l; }
static inline void fab_list_push(fab_list* head, fab_list* n) {
  n->prev = head->prev;
  n->next = head;
  head->prev->next = n;
  head->prev = n;
}
static inline void fab_list_del(fab_list* n) {
  n->prev->next = n->next;
  n->next->prev = n->prev;
  n->prev = n->next = n;
}
static inline fab_list* fab_list_pop(fab_list* head) {
  if (fab_list_empty(head)) return NULL;
  fab_list* n = head->next;
  fab_list_del(n);
  return n;
}
#define FAB_LIST_FOREACH_SAFE(it, tmp, head) \
  for (fab_list *it = (head)->next, *tmp = it->next; it != (head); it = tmp, tmp = it->next)

/* --- misc --------------------------------------------------------------- */

/* Monotonic clock in milliseconds. */
int64_t fab_now_ms(void);
/* CRC-32C (Castagnoli) of len bytes. */
uint32_t fab_crc32c(const void* data, size_t len);
/* 64-bit FNV-1a, chainable through seed (start with FAB_FNV_SEED). */
#define FAB_FNV_SEED 0xcbf29ce484222325ULL
uint64_t fab_fnv1a(uint64_t seed, const void* data, size_t len);
/* A random 64-bit value that is never 0 (getrandom, else time/pid mixing). */
uint64_t fab_random64(void);

#endif /* FAB_UTIL_H */
