/* The N-rank harness of rma_ranks.h. */
#include "rma_ranks.h"

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fab_drivers.h"

typedef struct rr_shared {
  _Atomic uint32_t arrived, generation;
  _Atomic int failed;
  _Atomic int may_die[RR_MAX_RANKS];
  char phase[RR_MAX_RANKS][64];
  unsigned char handles[RR_MAX_RANKS][128];
  volatile uint64_t words[RR_MAX_RANKS];
} rr_shared;

static rr_shared* sh;
static void (*idle_fn)(void*);
static void* idle_arg;

void rr_set_idle(void (*fn)(void* arg), void* arg) {
  idle_fn = fn;
  idle_arg = arg;
}
static int my_rank = -1, my_nranks;
static int warns, expected_warns;
static char last_warn[512];

int64_t rr_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void rr_fail_at(const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d: %s:%d: %s (phase: %s)\n", my_rank, file, line, msg,
          my_rank >= 0 ? sh->phase[my_rank] : "-");
  fflush(stderr);
  if (sh) atomic_store(&sh->failed, 1);
  _exit(10);
}

void rr_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  if (level != 2 /* WARN */) {
    if (getenv("FABRIC_TEST_VERBOSE")) {
      va_list ap;
      va_start(ap, fmt);
      fprintf(stderr, "rank %d INFO ", my_rank);
      vfprintf(stderr, fmt, ap);
      fputc('\n', stderr);
      va_end(ap);
    }
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_warn, sizeof last_warn, fmt, ap);
  va_end(ap);
  warns++;
  fprintf(stderr, "rank %d %sWARN %s:%d %s\n", my_rank, expected_warns > 0 ? "expected " : "", file, line, last_warn);
  if (expected_warns > 0) expected_warns--;
}

int rr_warns(void) { return warns; }
const char* rr_last_warn(void) { return last_warn; }
void rr_expect_warns(int n) { expected_warns = n; }

void* rr_handle(int rank) { return sh->handles[rank]; }
void rr_expect_death(rr_ctx* c) { atomic_store(&sh->may_die[c->rank], 1); }
volatile uint64_t* rr_word(int rank) { return &sh->words[rank]; }

void rr_phase(rr_ctx* c, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sh->phase[c->rank], sizeof sh->phase[c->rank], fmt, ap);
  va_end(ap);
  if (getenv("RR_PHASE_LOG")) /* where the time goes, for a run that is slow */
    fprintf(stderr, "rank %d at %lld ms: %s\n", c->rank, (long long)rr_now_ms(), sh->phase[c->rank]);
}

void rr_barrier(rr_ctx* c, const char* phase) {
  snprintf(sh->phase[c->rank], sizeof sh->phase[c->rank], "barrier %s", phase);
  uint32_t gen = atomic_load(&sh->generation);
  if (atomic_fetch_add(&sh->arrived, 1) + 1 == (uint32_t)c->nranks) {
    atomic_store(&sh->arrived, 0);
    atomic_fetch_add(&sh->generation, 1);
  } else {
    while (atomic_load(&sh->generation) == gen) {
      if (atomic_load(&sh->failed)) _exit(11); /* another rank failed and said why */
      if (!idle_fn) {
        usleep(50);
        continue;
      }
      idle_fn(idle_arg); /* a rank that waits here is still some peer's target */
      sched_yield();     /* and must leave the core to the ranks still working, as NCCL's proxy does */
    }
  }
  snprintf(sh->phase[c->rank], sizeof sh->phase[c->rank], "after %s", phase);
}

static void open_api(rr_ctx* c) {
  const char* v = getenv("FABRIC_TEST_RMA_API");
  if (!v || !*v) v = "16";
  if (strcmp(v, "core") == 0) {
#ifdef RR_WITH_CORE
    c->api = fab_rma_api_core;
    c->version = 0;
    return;
#else
    RR_FAIL("this binary does not link the engine: FABRIC_TEST_RMA_API=core is not available");
#endif
  }
  const char* path = getenv("FABRIC_TEST_PLUGIN");
  if (!path || !*path) path = RR_PLUGIN_PATH;
  c->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!c->dl) RR_FAIL("dlopen(%s): %s", path, dlerror());
  char sym[64];
  if (strncmp(v, "gin", 3) == 0) snprintf(sym, sizeof sym, "ncclGinPlugin_v%s", v + 3); /* GIN v11/v12 */
  else snprintf(sym, sizeof sym, "ncclRmaPlugin_v%s", v);
  void* table = dlsym(c->dl, sym);
  if (!table) RR_FAIL("%s does not export %s", path, sym);
  if (fab_driver_bind(sym, table, &c->api) != 0) RR_FAIL("no driver for %s", sym);
  c->version = c->api.version;
}

static void child(int rank, int nranks, void (*body)(rr_ctx* c)) {
  my_rank = rank;
  my_nranks = nranks;
  rr_ctx c = {.rank = rank, .nranks = nranks};
  open_api(&c);
  body(&c);
  fflush(stdout);
  _exit(0);
}

int rr_run(int nranks, int timeout_s, void (*body)(rr_ctx* c)) {
  if (nranks < 1 || nranks > RR_MAX_RANKS) return 1;
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) return 1;
  memset(sh, 0, sizeof(*sh));
  pid_t pids[RR_MAX_RANKS];
  for (int r = 0; r < nranks; r++) {
    fflush(NULL);
    pids[r] = fork();
    if (pids[r] == 0) child(r, nranks, body);
  }
  int bad = 0, left = nranks;
  int64_t deadline = rr_now_ms() + (int64_t)timeout_s * 1000;
  while (left > 0) {
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p > 0) {
      left--;
      int r = 0;
      while (r < nranks && pids[r] != p) r++;
      if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && atomic_load(&sh->may_die[r])) {
        fprintf(stderr, "rank %d: killed, as the test meant\n", r);
      } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        bad = 1;
        atomic_store(&sh->failed, 1);
        if (WIFSIGNALED(st)) fprintf(stderr, "rank %d: killed by signal %d (phase: %s)\n", r, WTERMSIG(st), sh->phase[r]);
        else if (WEXITSTATUS(st) != 11) fprintf(stderr, "rank %d: exit %d\n", r, WEXITSTATUS(st));
      }
      pids[r] = -1;
      continue;
    }
    if (rr_now_ms() > deadline) {
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) {
          fprintf(stderr, "rank %d: still running after %d s (phase: %s); killed\n", r, timeout_s, sh->phase[r]);
          kill(pids[r], SIGKILL);
        }
      bad = 1;
      deadline = INT64_MAX;
    }
    usleep(1000);
  }
  return bad;
}
