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

#include <stdint.h>

typedef enum {
  FAB_OBJ_NONE = 0,
  FAB_OBJ_CTX = 1,
  FAB_OBJ_LISTEN = 2,
  FAB_OBJ_SEND = 3,
  FAB_OBJ_RECV = 4,
  FAB_OBJ_MR = 5,
} fab_obj_kind;

/* Returns the new handle, or NULL when the table is full or out of memory. */
void* fab_obj_add(fab_obj_kind kind, void* ptr);
/* The object behind handle if it is live and of this kind, else NULL. */
void* fab_obj_get(const void* handle, fab_obj_kind kind);
/* The kind of a live handle, FAB_OBJ_NONE when it is not live. */
fab_obj_kind fab_obj_kind_of(const void* handle);
/* Frees the slot; returns the object, or NULL when the handle was not live. */
void* fab_obj_remove(const void* handle, fab_obj_kind kind);
/* Frees every slot (engine teardown). Live handles become unknown. */
void fab_obj_reset(void);
const char* fab_obj_kind_name(fab_obj_kind kind);

#endif /* FAB_OBJTAB_H */
