/*
 * A profiler plugin for tests: NCCL loads it with
 * NCCL_PROFILER_PLUGIN=<path>/libnccl-profiler-fabric-test.so and it asks for
 * net plugin events only (ncclProfileNetPlugin). Each event from this plugin
 * (pluginId type "FB") is read as fab_prof_event_v1 (docs/profiler.md) and
 * checked: a known layout version, sane fields, a stop for every start, and a
 * last update that names the same operation as its start. Events of other net
 * plugins (NCCL's IB and socket transports) are counted, not read.
 *
 * Output: one line per stopped event (at= its start, us since the epoch of
 * CLOCK_MONOTONIC; us= how long it took) and a summary per communicator at
 * finalize, appended to the file FABRIC_TEST_PROFILER_LOG names (one write()
 * per line, so ranks may share the file), else to stderr. The summary:
 *   summary rank=R comm=ID started=N stopped=N open=N foreign=N unknown=N bad=N
 *           sends=N recvs=N bytes_sent=B bytes_recv=B
 * Lines starting with "bad " say what was wrong with an event.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fab_abi_profiler_v6.h"
#include "fab_prof.h"

enum { EVENT_MAGIC = 0x46425445, EVENT_FREED = 0x64656164 };

typedef struct profiler_ctx {
  pthread_mutex_t lock;
  int rank;
  uint64_t comm_id;
  int log_fd; /* -1: stderr */
  uint64_t started, stopped, foreign, unknown, bad, sends, recvs, bytes_sent, bytes_recv;
} profiler_ctx;

typedef struct net_event {
  uint32_t magic;
  profiler_ctx* ctx;
  fab_prof_event_v1 start;
  char peer[96];
  int updated;
  fab_prof_event_v1 last;
  struct timespec t0;
} net_event;

static void out_line(profiler_ctx* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_line(profiler_ctx* c, const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(c->log_fd >= 0 ? c->log_fd : STDERR_FILENO, line, (size_t)n);
  (void)w;
}

static const char* op_name(int op) { return op == FAB_PROF_OP_SEND ? "send" : op == FAB_PROF_OP_RECV ? "recv" : "?"; }
static const char* transport_name(int t) {
  return t == FAB_PROF_TRANSPORT_SENDRECV ? "sendrecv" : t == FAB_PROF_TRANSPORT_RDMA ? "rdma" : "?";
}
static const char* path_name(int p) {
  static const char* names[] = {"?", "message", "control", "write", "eager"};
  return p >= FAB_PROF_PATH_MESSAGE && p <= FAB_PROF_PATH_EAGER ? names[p] : "?";
}

/* What is wrong with an event's data, or NULL. */
static const char* invalid(const fab_prof_event_v1* e) {
  if (e->op != FAB_PROF_OP_SEND && e->op != FAB_PROF_OP_RECV) return "op is neither send nor recv";
  if (e->transport != FAB_PROF_TRANSPORT_SENDRECV && e->transport != FAB_PROF_TRANSPORT_RDMA)
    return "unknown transport";
  if (e->path < FAB_PROF_PATH_MESSAGE || e->path > FAB_PROF_PATH_EAGER) return "unknown path";
  if (e->nsubs < 1 || e->sub >= e->nsubs) return "sub is not below nsubs";
  if (e->op == FAB_PROF_OP_SEND && e->nsubs != 1) return "a send with nsubs != 1";
  if (!e->peer || !e->peer[0]) return "no peer address";
  if (e->conn_id == 0) return "connection id 0";
  return NULL;
}

static void bad_event(profiler_ctx* c, const char* what, const fab_prof_event_v1* e) {
  pthread_mutex_lock(&c->lock);
  c->bad++;
  pthread_mutex_unlock(&c->lock);
  if (e)
    out_line(c, "bad rank=%d %s: op=%d transport=%d path=%d tag=%d sub=%u/%u conn=%u", c->rank, what, e->op,
             e->transport, e->path, e->tag, e->sub, e->nsubs, e->conn_id);
  else
    out_line(c, "bad rank=%d %s", c->rank, what);
}

static ncclResult_t prof_init(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                              int nranks, int rank, ncclDebugLogger_t logfn) {
  (void)commName, (void)nNodes, (void)nranks, (void)logfn;
  profiler_ctx* c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  pthread_mutex_init(&c->lock, NULL);
  c->rank = rank;
  c->comm_id = commId;
  const char* path = getenv("FABRIC_TEST_PROFILER_LOG");
  c->log_fd = path && *path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
  *eActivationMask = ncclProfileNetPlugin;
  *context = c;
  return ncclSuccess;
}

static int is_ours(int64_t id) { return (id & ~(int64_t)0xffff) == FAB_PROF_TYPE; }

static ncclResult_t prof_start(void* context, void** eHandle, ncclProfilerEventDescr_v6_t* d) {
  profiler_ctx* c = context;
  *eHandle = NULL;
  if (d->type != ncclProfileNetPlugin) return ncclSuccess;
  int64_t id = d->u.netPlugin.id;
  const fab_prof_event_v1* e = d->u.netPlugin.data;
  if (!is_ours(id) || (id & 0xffff) != FAB_PROF_EVENT_VERSION) {
    pthread_mutex_lock(&c->lock);
    if (is_ours(id)) c->unknown++;
    else c->foreign++;
    pthread_mutex_unlock(&c->lock);
    return ncclSuccess;
  }
  const char* why = e ? invalid(e) : "no event data";
  if (why) {
    bad_event(c, why, e);
    return ncclSuccess;
  }
  net_event* ev = calloc(1, sizeof *ev);
  if (!ev) return ncclSuccess; /* not started: NCCL sends no stop for it */
  ev->magic = EVENT_MAGIC;
  ev->ctx = c;
  ev->start = *e;
  snprintf(ev->peer, sizeof ev->peer, "%s", e->peer);
  ev->start.peer = NULL; /* valid during the callback only */
  clock_gettime(CLOCK_MONOTONIC, &ev->t0);
  pthread_mutex_lock(&c->lock);
  c->started++;
  pthread_mutex_unlock(&c->lock);
  *eHandle = ev;
  return ncclSuccess;
}

static ncclResult_t prof_record(void* eHandle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v6_t* args) {
  net_event* ev = eHandle;
  if (!ev) return ncclSuccess;
  if (ev->magic != EVENT_MAGIC) return ncclInternalError;
  const fab_prof_event_v1* e = args ? args->netPlugin.data : NULL;
  if (state != ncclProfilerNetPluginUpdate || !e) {
    bad_event(ev->ctx, "an update that is not a net plugin update with data", NULL);
    return ncclSuccess;
  }
  const char* why = invalid(e);
  if (!why && (e->op != ev->start.op || e->tag != ev->start.tag || e->sub != ev->start.sub ||
               e->conn_id != ev->start.conn_id || e->transport != ev->start.transport))
    why = "the update names another operation than its start";
  if (!why && e->result == 0 && e->size > ev->start.size) why = "more bytes moved than posted";
  if (why) {
    bad_event(ev->ctx, why, e);
    return ncclSuccess;
  }
  ev->last = *e;
  ev->last.peer = NULL;
  ev->updated = 1;
  return ncclSuccess;
}

static ncclResult_t prof_stop(void* eHandle) {
  net_event* ev = eHandle;
  if (!ev) return ncclSuccess;
  if (ev->magic != EVENT_MAGIC) return ncclInternalError; /* stopped twice, or not ours */
  profiler_ctx* c = ev->ctx;
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double us = (double)(t1.tv_sec - ev->t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - ev->t0.tv_nsec) / 1e3;
  const fab_prof_event_v1* s = &ev->start;
  const fab_prof_event_v1* l = ev->updated ? &ev->last : s;
  pthread_mutex_lock(&c->lock);
  c->stopped++;
  if (ev->updated && l->result == 0) {
    if (s->op == FAB_PROF_OP_SEND) c->sends++, c->bytes_sent += l->size;
    else c->recvs++, c->bytes_recv += l->size;
  }
  pthread_mutex_unlock(&c->lock);
  out_line(c, "event rank=%d op=%s tag=%d sub=%u/%u posted=%llu moved=%llu result=%d transport=%s path=%s->%s rail=%u "
           "conn=%u updated=%d us=%.1f at=%.1f peer=%s",
           c->rank, op_name(s->op), s->tag, s->sub, s->nsubs, (unsigned long long)s->size,
           (unsigned long long)(ev->updated ? l->size : 0), ev->updated ? l->result : -1, transport_name(s->transport),
           path_name(s->path), path_name(l->path), l->rail, s->conn_id, ev->updated, us,
           (double)ev->t0.tv_sec * 1e6 + (double)ev->t0.tv_nsec / 1e3, ev->peer);
  ev->magic = EVENT_FREED;
  free(ev);
  return ncclSuccess;
}

static ncclResult_t prof_finalize(void* context) {
  profiler_ctx* c = context;
  pthread_mutex_lock(&c->lock);
  out_line(c, "summary rank=%d comm=%llx started=%llu stopped=%llu open=%llu foreign=%llu unknown=%llu bad=%llu "
           "sends=%llu recvs=%llu bytes_sent=%llu bytes_recv=%llu",
           c->rank, (unsigned long long)c->comm_id, (unsigned long long)c->started, (unsigned long long)c->stopped,
           (unsigned long long)(c->started - c->stopped), (unsigned long long)c->foreign,
           (unsigned long long)c->unknown, (unsigned long long)c->bad, (unsigned long long)c->sends,
           (unsigned long long)c->recvs, (unsigned long long)c->bytes_sent, (unsigned long long)c->bytes_recv);
  pthread_mutex_unlock(&c->lock);
  if (c->log_fd >= 0) close(c->log_fd);
  pthread_mutex_destroy(&c->lock);
  free(c);
  return ncclSuccess;
}

__attribute__((visibility("default"))) ncclProfiler_v6_t ncclProfiler_v6 = {
    .name = "FabricTest",
    .init = prof_init,
    .startEvent = prof_start,
    .stopEvent = prof_stop,
    .recordEventState = prof_record,
    .finalize = prof_finalize,
};
