/* fabric-info --selftest: two processes on this host connect through the
 * plugin's newest net table (as NCCL would: listen, connect, accept, regMr,
 * isend, irecv, test), and one sends the other `bytes` in 4 MiB messages;
 * every byte is checked. See info.h. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "info.h"

enum { CHUNK = 4 << 20, TAG = 7 };

typedef struct {
  fab_api api;
  void* dl;
  fab_ctx* ctx;
  void* comm;   /* send comm (rank 0 after connect) or recv comm */
  void* listen;
  int64_t deadline_ms;
  char why[INFO_LINE];
} side;

static int64_t now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int fail(side* s, const char* what, fab_result rc) {
  snprintf(s->why, sizeof s->why, "%s failed (result %d)", what, (int)rc);
  return -1;
}

static int timed_out(side* s, const char* what) {
  if (now_ms() < s->deadline_ms) return 0;
  snprintf(s->why, sizeof s->why, "%s did not finish in time: is the provider usable between two processes here?",
           what);
  return 1;
}

static int open_side(side* s, const char* plugin) {
  char sym[40];
  s->dl = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (!s->dl) return snprintf(s->why, sizeof s->why, "dlopen: %s", dlerror()), -1;
  if (info_bind_newest(s->dl, &s->api, sym, sizeof sym) != 0)
    return snprintf(s->why, sizeof s->why, "the library exports no ncclNetPlugin table"), -1;
  fab_result rc = s->api.init(&s->ctx, 0x5e1f, NULL, info_logger, NULL);
  return rc == FAB_OK ? 0 : fail(s, "init", rc);
}

/* Waits for a request; 0 when it completed. */
static int wait_req(side* s, void* req, const char* what) {
  int done = 0, sizes[FAB_MAX_RECVS];
  while (!done) {
    fab_result rc = s->api.test(req, &done, sizes);
    if (rc != FAB_OK) return fail(s, what, rc);
    if (!done && timed_out(s, what)) return -1;
  }
  return 0;
}

static void fill(unsigned char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((seed + i * 131) >> 3 ^ i >> 12);
}

static long first_bad(const unsigned char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)((seed + i * 131) >> 3 ^ i >> 12)) return (long)i;
  return -1;
}

/* Posts one CHUNK piece (retrying while the plugin says "not now"). */
static void* post_chunk(side* s, void* comm, int sending, void* data, size_t len, void* mh) {
  void* req = NULL;
  int tag = TAG;
  while (!req) {
    fab_result rc = sending ? s->api.isend(comm, data, len, tag, mh, NULL, &req)
                            : s->api.irecv(comm, 1, &data, &len, &tag, &mh, NULL, &req);
    if (rc != FAB_OK) return fail(s, sending ? "isend" : "irecv", rc), NULL;
    if (!req && timed_out(s, sending ? "isend" : "irecv")) return NULL;
  }
  return req;
}

/* Moves `bytes` in CHUNK pieces, WINDOW in flight as NCCL keeps them:
 * sending, or receiving and checking. *secs: the time the pieces took. */
static int transfer(side* s, void* comm, int sending, unsigned char* buf, size_t bytes, uint64_t seed, double* secs) {
  /* buf: the pattern (sending) or zeros (receiving), written before connect */
  enum { WINDOW = 8 };
  void* mh = NULL;
  fab_result rc = s->api.reg_mr(comm, buf, bytes, FAB_PTR_HOST, &mh);
  if (rc != FAB_OK) return fail(s, "regMr", rc);
  void* inflight[WINDOW] = {0};
  size_t nchunks = (bytes + CHUNK - 1) / CHUNK, posted = 0, done = 0;
  int bad = 0;
  int64_t t0 = now_ms();
  while (done < nchunks && !bad) {
    while (posted < nchunks && posted - done < WINDOW && !bad) {
      size_t off = posted * (size_t)CHUNK, len = bytes - off < CHUNK ? bytes - off : CHUNK;
      void* req = post_chunk(s, comm, sending, buf + off, len, mh);
      if (req) inflight[posted++ % WINDOW] = req;
      else bad = -1;
    }
    if (!bad) bad = wait_req(s, inflight[done++ % WINDOW], sending ? "a send" : "a receive");
  }
  *secs = (double)(now_ms() - t0) / 1000.0;
  long at = bad || sending ? -1 : first_bad(buf, bytes, seed);
  if (at >= 0) bad = (snprintf(s->why, sizeof s->why, "received data differs at byte %ld", at), -1);
  s->api.dereg_mr(comm, mh);
  return bad;
}

/* Rank 0 listens and sends first; rank 1 connects and answers. */
static int connect_pair(side* s, int rank, int handle_pipe[2]) {
  unsigned char handle[FAB_HANDLE_SIZE] = {0};
  void* send_comm = NULL;
  void* recv_comm = NULL;
  fab_result rc;
  if (rank == 0) {
    rc = s->api.listen(s->ctx, 0, handle, &s->listen);
    if (rc != FAB_OK) return fail(s, "listen", rc);
    if (write(handle_pipe[1], handle, sizeof handle) != (ssize_t)sizeof handle) return fail(s, "passing the handle", 0);
  } else if (read(handle_pipe[0], handle, sizeof handle) != (ssize_t)sizeof handle) {
    return fail(s, "reading the handle", 0);
  }
  while (rank == 0 ? !recv_comm : !send_comm) {
    rc = rank == 0 ? s->api.accept(s->listen, &recv_comm, NULL)
                   : s->api.connect(s->ctx, 0, NULL, handle, &send_comm, NULL);
    if (rc != FAB_OK) return fail(s, rank == 0 ? "accept" : "connect", rc);
    if (timed_out(s, rank == 0 ? "accept" : "connect")) return -1;
  }
  s->comm = rank == 0 ? recv_comm : send_comm;
  return 0;
}

static void close_side(side* s, int rank) {
  if (s->comm) rank == 0 ? s->api.close_recv(s->comm) : s->api.close_send(s->comm);
  if (s->listen) s->api.close_listen(s->listen);
  if (s->ctx && s->api.finalize) s->api.finalize(s->ctx);
  if (s->dl) dlclose(s->dl);
}

/* One rank's part: rank 1 sends, rank 0 receives and checks; returns 0, and
 * the seconds the transfer took. */
static int run_rank(int rank, const char* plugin, size_t bytes, int timeout_ms, int handle_pipe[2], double* secs,
                    char* why) {
  side s;
  memset(&s, 0, sizeof s);
  s.deadline_ms = now_ms() + timeout_ms;
  unsigned char* buf = malloc(bytes); /* filled before connecting: the peer's clock starts at connect */
  int rc = buf ? 0 : (snprintf(s.why, sizeof s.why, "out of memory for %zu bytes", bytes), -1);
  if (rc == 0 && rank == 1) fill(buf, bytes, 0xfab1c);
  if (rc == 0 && rank == 0) memset(buf, 0, bytes);
  if (rc == 0) rc = open_side(&s, plugin);
  if (rc == 0) rc = connect_pair(&s, rank, handle_pipe);
  if (rc == 0) rc = transfer(&s, s.comm, rank == 1, buf, bytes, 0xfab1c, secs);
  free(buf);
  close_side(&s, rank);
  snprintf(why, INFO_LINE, "%s", s.why);
  return rc;
}

/* run_rank with the plugin's log kept apart (the probe's log stays the
 * report's); on failure the plugin's last line joins the reason. */
static int run_rank_quietly(int rank, const char* plugin, size_t bytes, int timeout_ms, int handle_pipe[2],
                            double* secs, char* why) {
  static info_report quiet;
  memset(&quiet, 0, sizeof quiet);
  info_log_attach(&quiet);
  int rc = run_rank(rank, plugin, bytes, timeout_ms, handle_pipe, secs, why);
  if (rc && quiet.nlog) snprintf(why + strlen(why), INFO_LINE - strlen(why), "; plugin: %s", quiet.log[quiet.nlog - 1]);
  return rc;
}

int info_selftest(info_report* r, const char* plugin_path, size_t bytes, int timeout_ms) {
  int handle_pipe[2], why_pipe[2];
  r->selftest_ran = 1;
  r->selftest_bytes = bytes;
  if (pipe(handle_pipe) || pipe(why_pipe)) {
    snprintf(r->selftest_detail, INFO_LINE, "pipe: %s", strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    char why[INFO_LINE] = "";
    double secs = 0;
    int rc = run_rank_quietly(1, plugin_path, bytes, timeout_ms, handle_pipe, &secs, why);
    (void)!write(why_pipe[1], why, strlen(why) + 1);
    _exit(rc ? 1 : 0);
  }
  if (pid < 0) {
    snprintf(r->selftest_detail, INFO_LINE, "fork: %s", strerror(errno));
    return -1;
  }
  char why[INFO_LINE] = "";
  double secs = 0;
  int rc = run_rank_quietly(0, plugin_path, bytes, timeout_ms, handle_pipe, &secs, why);
  info_log_attach(r);
  if (rc) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  char child_why[INFO_LINE] = "";
  close(why_pipe[1]);
  (void)!read(why_pipe[0], child_why, sizeof child_why - 1);
  int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  r->selftest_ok = rc == 0 && child_ok;
  r->selftest_seconds = secs;
  if (!r->selftest_ok)
    snprintf(r->selftest_detail, INFO_LINE, "%s%s%s", why, why[0] && (child_why[0] || !child_ok) ? "; the peer: " : "",
             child_why[0] ? child_why : (child_ok ? "" : "its process failed"));
  close(handle_pipe[0]), close(handle_pipe[1]), close(why_pipe[0]);
  return r->selftest_ok ? 0 : -1;
}
