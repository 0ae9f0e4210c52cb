/*
 * Profiler events (net v10+): NCCL hands the plugin a callback at init
 * (ncclProfilerCallback_t: eHandle, type, pHandle, pluginId, extData) and a
 * parent handle with every isend and irecv buffer. The plugin starts an event
 * when it posts an operation and stops it (with a last update) when test
 * reports it complete; NCCL forwards both to the profiler plugin, which
 * reads extData as the struct below, recognised by pluginId. A start whose
 * eHandle comes back NULL (no profiler loaded, or net events not wanted)
 * costs nothing more. docs/profiler.md documents the layout for profiler
 * authors.
 */
#ifndef FAB_PROF_H
#define FAB_PROF_H

#include <stdatomic.h>
#include <stdint.h>

#include "fab_core.h"

/* pluginId: the type in the upper 16 bits ("FB"), the layout's version in
 * the lower 16, as NCCL's own socket and IB transports encode theirs. */
enum { FAB_PROF_EVENT_VERSION = 1 };
#define FAB_PROF_TYPE ((int64_t)0x4642 << 16)
#define FAB_PROF_PLUGIN_ID (FAB_PROF_TYPE | FAB_PROF_EVENT_VERSION)

/* The callback's type argument (NCCL's ncclProfilerNetEvent*). */
enum { FAB_PROF_START = 0, FAB_PROF_STOP = 1, FAB_PROF_UPDATE = 2, FAB_PROF_UPDATE_AND_STOP = 3 };

enum { FAB_PROF_OP_SEND = 1, FAB_PROF_OP_RECV = 2 };
enum { FAB_PROF_TRANSPORT_SENDRECV = 1, FAB_PROF_TRANSPORT_RDMA = 2 };

/* Where an operation is in its protocol: at start, how it was posted; at
 * stop, how its data moved. */
enum {
  FAB_PROF_PATH_MESSAGE = 1,   /* sendrecv: one tagged message */
  FAB_PROF_PATH_CONTROL = 2,   /* rdma: waiting for its buffer's announcement (send), or announced (receive) */
  FAB_PROF_PATH_WRITE = 3,     /* rdma: the data written into the announced buffer */
  FAB_PROF_PATH_EAGER = 4,     /* rdma: the data written into the receiver's eager ring */
};

/* extData of every event, version 1 (40 bytes). Valid during the callback
 * only: a profiler copies what it keeps. */
typedef struct fab_prof_event_v1 {
  uint8_t op;            /* FAB_PROF_OP_* */
  uint8_t transport;     /* FAB_PROF_TRANSPORT_* */
  uint8_t path;          /* FAB_PROF_PATH_* */
  uint8_t rail;          /* the rail that carried it (0: one rail) */
  int32_t tag;           /* NCCL's tag */
  uint64_t size;         /* start: bytes posted; stop: bytes moved */
  uint32_t conn_id;      /* this end's connection id (the WARN lines and INFO log name it too) */
  uint16_t sub;          /* buffer index in a grouped receive */
  uint16_t nsubs;        /* buffers in that receive (1 for a send) */
  int32_t result;        /* stop: 0 done, else the fab_result / ncclResult_t */
  uint32_t spare;
  const char* peer;      /* the peer's address, printable */
} fab_prof_event_v1;

extern _Atomic(fab_profiler_fn) fab_prof_fn;

/* One started event of a request's buffer. */
typedef struct fab_prof_slot {
  void* eh;  /* NCCL's event handle; NULL: nobody wants it */
  int tag;
  uint16_t sub, nsubs; /* the buffer's place in the runtime's grouped receive */
} fab_prof_slot;

/* A comm's profiler state: its FAB_EXT_PROF slot, made by its first post
 * while a callback is set, used by its owner thread only. */
typedef struct fab_prof_comm {
  uint32_t declined;    /* posts in a row whose starts the callback declined */
  uint32_t skip;        /* posts to leave unannounced before asking again */
  fab_prof_slot* slots; /* FAB_MAX_RECVS per request, from the first event a profiler took */
} fab_prof_comm;

typedef struct fab_req fab_req;
/* After a successful isend/irecv (r posted, r->n buffers): a start event for
 * each buffer NCCL gave a parent handle. NCCL passes its callback and a
 * parent handle whether or not a profiler is loaded; a comm whose last
 * FAB_PROF_DECLINED_MAX posts were all declined asks again only every
 * FAB_PROF_SKIP posts, so no profiler costs nothing measurable, and a
 * profiler that starts wanting net events later misses at most that many
 * operations per comm. */
enum { FAB_PROF_DECLINED_MAX = 16, FAB_PROF_SKIP = 1023 };
void fab_prof_posted(fab_req* r, void* const* phandles, const size_t* sizes, const int* tags);
/* The start events alone, for r posting some buffers of a grouped receive
 * of nsubs: its buffer j is the runtime's buffer subs[j] (the rails floor's
 * share of a receive on one rail; NULL: buffer j), which its events name.
 * Returns whether the profiler took any; fab_prof_count then counts the
 * post on the comm whose pause it joins (a comm over rails: rail 0 for all
 * its rails, so that it pauses as one comm). */
int fab_prof_posted_part(fab_req* r, void* const* phandles, const size_t* sizes, const int* tags, const int* subs,
                         int nsubs);
typedef struct fab_comm fab_comm;
void fab_prof_count(fab_comm* c, int taken);
/* r is complete (or failed) and test reports it: the last update and stop
 * of each event started for it. Only for r->prof. */
void fab_prof_done(fab_req* r);

/* Called by init with NCCL's callback (NULL leaves the current one). */
void fab_prof_set(fab_profiler_fn fn);

static inline fab_profiler_fn fab_prof_active(void) {
  return atomic_load_explicit(&fab_prof_fn, memory_order_relaxed);
}

/* Whether a post on a comm with profiler state p (its FAB_EXT_PROF slot,
 * NULL before its first post) announces profiler events: a callback was
 * given, and the comm is not pausing after its starts were declined. Owner
 * thread. */
static inline int fab_prof_wanted(fab_prof_comm* p) {
  if (__builtin_expect(!fab_prof_active(), 1)) return 0;
  if (p && p->skip) {
    p->skip--;
    return 0;
  }
  return 1;
}

#endif
