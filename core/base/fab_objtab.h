/*
 * Opaque handles for everything the runtime holds on to (contexts, comms,
 * memory handles). A handle is not a pointer: it encodes a slot index and a
 * generation, so a stale, doubled or made-up handle is recognised without
 * dereferencing anything (double close, deregMr of an unknown handle, a send
 * comm passed where a recv comm belongs). Lookups are lock-free and cost a
 * few loads; adding and removing take a mutex.
 *
 * Handle values are >= 2^32, so they are never NULL nor NCCL's 0x1 hint.
 */
#ifndef FAB_OBJTAB_H
#define FAB_OBJTAB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  FAB_OBJ_NONE = 0,
  FAB_OBJ_CTX = 1,
  FAB_OBJ_LISTEN = 2,
  FAB_OBJ_SEND = 3,
  FAB_OBJ_RECV = 4,
  FAB_OBJ_MR = 5,
  FAB_OBJ_COLL = 6,     /* a one-sided group (RMA connect) */
  FAB_OBJ_COLL_CTX = 7, /* its contexts (createContext) */
  FAB_OBJ_COLL_WIN = 8, /* a symmetric registration (regMrSym) */
  FAB_OBJ_RAILS_LISTEN = 9, /* on a virtual device of several members (core/rails/fab_rails.h) */
  FAB_OBJ_RAILS_SEND = 10,
  FAB_OBJ_RAILS_RECV = 11,
  FAB_OBJ_RAILS_MR = 12,
  FAB_OBJ_KINDS
} fab_obj_kind;

/* Returns the new handle, or NULL when the table is full or out of memory. */
void* fab_obj_add(fab_obj_kind kind, void* ptr);

/* The lookup is on every isend/irecv/test (comm and memory handle), so it is
 * inline: a few loads, no call. Internals of fab_objtab.c. */
enum { FAB_OBJ_CHUNK_BITS = 10, FAB_OBJ_CHUNK_SLOTS = 1 << FAB_OBJ_CHUNK_BITS, FAB_OBJ_MAX_CHUNKS = 1024 };
typedef struct fab_obj_slot {
  _Atomic uint64_t id; /* 0 = free; else generation << 8 | kind */
  void* ptr;
  uint32_t next_free; /* index + 1 of the next free slot, 0 = none */
} fab_obj_slot;
extern _Atomic(fab_obj_slot*) fab_obj_chunks[FAB_OBJ_MAX_CHUNKS];

static inline fab_obj_slot* fab_obj_lookup(const void* handle, uint64_t* id) {
  uint64_t h = (uint64_t)(uintptr_t)handle;
  uint64_t gen = h >> 40;
  uint64_t low = h & ((1ULL << 40) - 1);
  if (!gen || !low || low > (uint64_t)FAB_OBJ_MAX_CHUNKS * FAB_OBJ_CHUNK_SLOTS) return NULL;
  uint32_t idx = (uint32_t)(low - 1);
  fab_obj_slot* chunk = atomic_load_explicit(&fab_obj_chunks[idx >> FAB_OBJ_CHUNK_BITS], memory_order_acquire);
  if (!chunk) return NULL;
  fab_obj_slot* s = &chunk[idx & (FAB_OBJ_CHUNK_SLOTS - 1)];
  uint64_t v = atomic_load_explicit(&s->id, memory_order_acquire);
  if (!v || (v >> 8) != gen) return NULL;
  *id = v;
  return s;
}

/* The object behind handle if it is live and of this kind, else NULL. */
static inline void* fab_obj_get(const void* handle, fab_obj_kind kind) {
  uint64_t id;
  fab_obj_slot* s = fab_obj_lookup(handle, &id);
  return (s && (id & 0xff) == (uint64_t)kind) ? s->ptr : NULL;
}

/* The kind of a live handle, FAB_OBJ_NONE when it is not live. */
static inline fab_obj_kind fab_obj_kind_of(const void* handle) {
  uint64_t id;
  return fab_obj_lookup(handle, &id) ? (fab_obj_kind)(id & 0xff) : FAB_OBJ_NONE;
}
/* Frees the slot; returns the object, or NULL when the handle was not live. */
void* fab_obj_remove(const void* handle, fab_obj_kind kind);
/* How many handles of this kind are live (no lock: a snapshot). */
uint32_t fab_obj_live(fab_obj_kind kind);
/* Frees every slot (engine teardown). Live handles become unknown. */
void fab_obj_reset(void);
const char* fab_obj_kind_name(fab_obj_kind kind);

#endif /* FAB_OBJTAB_H */
