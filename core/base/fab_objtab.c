#include "fab_objtab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Slots live in chunks that never move while the engine is up, so a lookup
 * (inline, fab_objtab.h) can read them without a lock. A slot's id is
 * (generation << 8 | kind); the generation comes from one counter that is
 * never reset, so handles from a previous incarnation of the engine do not
 * come back to life. */
enum { CHUNK_BITS = FAB_OBJ_CHUNK_BITS, CHUNK_SLOTS = FAB_OBJ_CHUNK_SLOTS, MAX_CHUNKS = FAB_OBJ_MAX_CHUNKS };
typedef fab_obj_slot slot;

_Atomic(slot*) fab_obj_chunks[MAX_CHUNKS];
#define g_chunks fab_obj_chunks
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t g_nslots;    /* slots in allocated chunks */
static uint32_t g_free_head; /* index + 1 */
static uint64_t g_generation;
static _Atomic uint32_t g_live[FAB_OBJ_KINDS]; /* live handles per kind (changed under g_lock, read without) */

static slot* slot_at(uint32_t idx) {
  if (idx >= (uint32_t)MAX_CHUNKS * CHUNK_SLOTS) return NULL;
  slot* chunk = atomic_load_explicit(&g_chunks[idx >> CHUNK_BITS], memory_order_acquire);
  return chunk ? &chunk[idx & (CHUNK_SLOTS - 1)] : NULL;
}

static int grow(void) {
  uint32_t c = g_nslots >> CHUNK_BITS;
  if (c >= MAX_CHUNKS) return -1;
  slot* chunk = calloc(CHUNK_SLOTS, sizeof(slot));
  if (!chunk) return -1;
  for (uint32_t i = 0; i < CHUNK_SLOTS; i++) chunk[i].next_free = (i + 1 < CHUNK_SLOTS) ? g_nslots + i + 2 : 0;
  g_free_head = g_nslots + 1;
  g_nslots += CHUNK_SLOTS;
  atomic_store_explicit(&g_chunks[c], chunk, memory_order_release);
  return 0;
}

void* fab_obj_add(fab_obj_kind kind, void* ptr) {
  pthread_mutex_lock(&g_lock);
  if (!g_free_head && grow() != 0) {
    pthread_mutex_unlock(&g_lock);
    return NULL;
  }
  uint32_t idx = g_free_head - 1;
  slot* s = slot_at(idx);
  g_free_head = s->next_free;
  uint64_t gen = (++g_generation) & 0xffffffULL; /* 24 bits: handle = gen << 40 | idx + 1 */
  if (!gen) gen = ++g_generation & 0xffffffULL;
  s->ptr = ptr;
  atomic_store_explicit(&s->id, (gen << 8) | (uint64_t)kind, memory_order_release);
  atomic_fetch_add_explicit(&g_live[kind], 1, memory_order_relaxed);
  pthread_mutex_unlock(&g_lock);
  return (void*)(uintptr_t)((gen << 40) | ((uint64_t)idx + 1));
}

#define lookup fab_obj_lookup

void* fab_obj_remove(const void* handle, fab_obj_kind kind) {
  pthread_mutex_lock(&g_lock);
  uint64_t id;
  slot* s = lookup(handle, &id);
  void* ptr = NULL;
  if (s && (id & 0xff) == (uint64_t)kind) {
    ptr = s->ptr;
    atomic_store_explicit(&s->id, 0, memory_order_release);
    s->ptr = NULL;
    uint32_t idx = (uint32_t)(((uint64_t)(uintptr_t)handle & 0xffffffffULL) - 1);
    s->next_free = g_free_head;
    g_free_head = idx + 1;
    atomic_fetch_sub_explicit(&g_live[kind], 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_lock);
  return ptr;
}

void fab_obj_reset(void) {
  pthread_mutex_lock(&g_lock);
  for (int c = 0; c < MAX_CHUNKS; c++) {
    slot* chunk = atomic_exchange(&g_chunks[c], NULL);
    free(chunk);
  }
  g_nslots = 0;
  g_free_head = 0;
  for (int k = 0; k < FAB_OBJ_KINDS; k++) atomic_store_explicit(&g_live[k], 0, memory_order_relaxed);
  pthread_mutex_unlock(&g_lock);
}

uint32_t fab_obj_live(fab_obj_kind kind) {
  return (unsigned)kind < FAB_OBJ_KINDS ? atomic_load_explicit(&g_live[kind], memory_order_relaxed) : 0;
}

const char* fab_obj_kind_name(fab_obj_kind kind) {
  switch (kind) {
    case FAB_OBJ_CTX: return "context";
    case FAB_OBJ_LISTEN: return "listen comm";
    case FAB_OBJ_SEND: return "send comm";
    case FAB_OBJ_RECV: return "recv comm";
    case FAB_OBJ_MR: return "memory handle";
    case FAB_OBJ_COLL: return "RMA collective comm";
    case FAB_OBJ_COLL_CTX: return "RMA context";
    case FAB_OBJ_COLL_WIN: return "symmetric memory handle";
    case FAB_OBJ_RAILS_LISTEN: return "listen comm (several rails)";
    case FAB_OBJ_RAILS_SEND: return "send comm (several rails)";
    case FAB_OBJ_RAILS_RECV: return "recv comm (several rails)";
    case FAB_OBJ_RAILS_MR: return "memory handle (several rails)";
    default: return "unknown handle";
  }
}
