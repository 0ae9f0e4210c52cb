/* Two-process harness: peer spawn, control channel, watchdog, logger,
 * patterns. See ft_harness.h. */
#include "ft_harness.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* process state                                                             */

static int g_role = FT_PARENT;
static const char* g_role_name = NULL; /* a third process's own name (ft_name_process) */
static int g_have_peer = 0;     /* inside ft_run_pair */
static ft_peer* g_peer = NULL;  /* for failure handling and the watchdog */
static char g_phase[160] = "start";
static char g_test[64] = "";
static ft_fail_hook g_hook = NULL;
static const char* g_note = NULL;

void ft_set_note(const char* note) { g_note = note; }

void ft_set_fail_hook(ft_fail_hook hook) { g_hook = hook; }
int ft_role(void) { return g_role; }
const char* ft_role_name(void) {
  if (g_role_name) return g_role_name;
  return g_role == FT_PARENT ? "parent" : "child";
}

void ft_name_process(const char* test, const char* role) {
  snprintf(g_test, sizeof g_test, "%s", test);
  g_role_name = role;
}

void ft_phase(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_phase, sizeof g_phase, fmt, ap);
  va_end(ap);
}

int64_t ft_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------------------ */
/* framing                                                                   */

enum { FT_MAGIC = 0x46544354u /* "FTCT" */, FT_TAG_MAX = 48 };
typedef struct {
  uint32_t magic;
  uint32_t len;
  char tag[FT_TAG_MAX];
} ft_frame;
static const char FT_TAG_FAIL[] = "!FAIL";

static int write_all(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* 0 ok, -1 EOF/error, -2 timeout */
static int read_all(int fd, void* buf, size_t len, int64_t deadline) {
  char* p = buf;
  while (len) {
    int64_t left = deadline - ft_now_ms();
    if (left <= 0) return -2;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, left > 1000 ? 1000 : (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) continue;
    ssize_t n = read(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static void describe_status(int status, char* out, size_t len) {
  if (WIFEXITED(status)) {
    int code = WEXITSTATUS(status);
    snprintf(out, len, "exited with status %d%s", code,
             code == FT_EXIT_FAIL ? " (a check failed)" : code == 23 ? " (LeakSanitizer?)" : "");
  } else if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    snprintf(out, len, "was killed by signal %d (%s)%s", sig, strsignal(sig),
             sig == SIGALRM ? ": its watchdog fired, it hung" : "");
  } else {
    snprintf(out, len, "ended with wait status 0x%x", status);
  }
}

/* Reads a pending FAIL frame from the child, if any, without blocking long. */
static int read_peer_failure(ft_peer* p, char* out, size_t len) {
  for (int i = 0; i < 64; i++) {
    ft_frame f;
    if (read_all(p->fd, &f, sizeof f, ft_now_ms() + 200) != 0) return 0;
    if (f.magic != FT_MAGIC) return 0;
    size_t n = f.len;
    char* body = malloc(n + 1);
    if (!body) return 0;
    if (read_all(p->fd, body, n, ft_now_ms() + 200) != 0) {
      free(body);
      return 0;
    }
    body[n] = 0;
    if (strcmp(f.tag, FT_TAG_FAIL) == 0) {
      snprintf(out, len, "%s", body);
      free(body);
      return 1;
    }
    free(body);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* failure                                                                   */

static void kill_child(ft_peer* p) {
  if (!p || p->role != FT_PARENT || p->pid <= 0 || p->reaped) return;
  kill(p->pid, SIGKILL);
  int st;
  while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
  }
  p->reaped = 1;
  p->status = st;
  ft_shm_cleanup(p->pid);
}

static __attribute__((noreturn)) void fail_message(const char* msg) {
  if (g_have_peer && g_role == FT_CHILD && g_peer) {
    ft_frame f = {.magic = FT_MAGIC, .len = (uint32_t)strlen(msg)};
    snprintf(f.tag, sizeof f.tag, "%s", FT_TAG_FAIL);
    (void)write_all(g_peer->fd, &f, sizeof f);
    (void)write_all(g_peer->fd, msg, f.len);
    fprintf(stderr, "%s\n", msg);
    _exit(FT_EXIT_FAIL);
  }
  alarm(0);
  if (g_have_peer && g_peer) kill_child(g_peer);
  g_have_peer = 0;
  fprintf(stderr, "%s\n", msg);
  if (g_hook) g_hook(msg);
  exit(1);
}

void ft_fail_at(const char* file, int line, const char* fmt, ...) {
  char body[1536], msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  const char* base = strrchr(file, '/');
  snprintf(msg, sizeof msg, "[%s%s%s] %s:%d: %s (phase: %s)%s%s", g_test, g_test[0] ? " " : "", ft_role_name(),
           base ? base + 1 : file, line, body, g_phase, g_note ? " -- " : "", g_note ? g_note : "");
  fail_message(msg);
}

/* ------------------------------------------------------------------------ */
/* logger                                                                    */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_warns = 0;
static int g_expect = 0;
static char g_last_warn[1024] = "";
static char g_watch[128] = ""; /* ft_log_watch */
static int g_watched = 0;

void ft_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  static int verbose = -1, quiet = -1;
  if (verbose < 0) {
    const char* v = getenv("FABRIC_TEST_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    const char* q = getenv("FABRIC_TEST_QUIET");
    quiet = q && *q && strcmp(q, "0") != 0;
  }
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt ? fmt : "(null format)", ap);
  va_end(ap);
  if (g_watch[0]) {
    pthread_mutex_lock(&g_log_lock);
    if (g_watch[0] && strstr(msg, g_watch)) g_watched++;
    pthread_mutex_unlock(&g_log_lock);
  }
  if (level == FAB_LOG_WARN) {
    pthread_mutex_lock(&g_log_lock);
    g_warns++;
    int expected = g_expect > 0;
    snprintf(g_last_warn, sizeof g_last_warn, "%s", msg);
    pthread_mutex_unlock(&g_log_lock);
    if (!quiet)
      fprintf(stderr, "[%s %s] %sWARN %s:%d %s\n", g_test, ft_role_name(), expected ? "expected " : "",
              file ? file : "?", line, msg);
  } else if (verbose) {
    fprintf(stderr, "[%s %s] L%d %s:%d %s\n", g_test, ft_role_name(), level, file ? file : "?", line, msg);
  }
}

int ft_log_warns(void) {
  pthread_mutex_lock(&g_log_lock);
  int n = g_warns;
  pthread_mutex_unlock(&g_log_lock);
  return n;
}

const char* ft_log_last_warn(void) {
  static char copy[1024];
  pthread_mutex_lock(&g_log_lock);
  snprintf(copy, sizeof copy, "%s", g_last_warn);
  pthread_mutex_unlock(&g_log_lock);
  return copy;
}

void ft_log_watch(const char* substr) {
  pthread_mutex_lock(&g_log_lock);
  snprintf(g_watch, sizeof g_watch, "%s", substr ? substr : "");
  g_watched = 0;
  pthread_mutex_unlock(&g_log_lock);
}

int ft_log_watched(void) {
  pthread_mutex_lock(&g_log_lock);
  int n = g_watched;
  pthread_mutex_unlock(&g_log_lock);
  return n;
}

void ft_log_reset(void) {
  pthread_mutex_lock(&g_log_lock);
  g_warns = 0;
  g_last_warn[0] = 0;
  pthread_mutex_unlock(&g_log_lock);
}

void ft_log_expect_warns(int expected) {
  pthread_mutex_lock(&g_log_lock);
  g_expect = expected;
  pthread_mutex_unlock(&g_log_lock);
}

/* ------------------------------------------------------------------------ */
/* watchdog                                                                  */

static void watchdog(int sig) {
  (void)sig;
  char buf[400];
  int n = snprintf(buf, sizeof buf, "[%s %s] WATCHDOG: the test hung (phase: %s); killing it", g_test,
                   ft_role_name(), g_phase);
  if (n < 0) n = 0;
  if (n >= (int)sizeof buf) n = (int)sizeof buf - 1;
  if (g_role == FT_CHILD && g_peer) {
    /* Tell the parent where we hung; it reports it with our exit status. */
    ft_frame f = {.magic = FT_MAGIC, .len = (uint32_t)n};
    memcpy(f.tag, FT_TAG_FAIL, sizeof FT_TAG_FAIL);
    (void)write_all(g_peer->fd, &f, sizeof f);
    (void)write_all(g_peer->fd, buf, (size_t)n);
  }
  (void)!write(2, "\n", 1);
  (void)!write(2, buf, (size_t)n);
  (void)!write(2, "\n", 1);
  if (g_role == FT_PARENT && g_peer && g_peer->pid > 0 && !g_peer->reaped) kill(g_peer->pid, SIGKILL);
  signal(SIGALRM, SIG_DFL);
  raise(SIGALRM);
}

/* ------------------------------------------------------------------------ */
/* peer                                                                      */

void ft_run_pair(const char* name, ft_body_fn body, void* arg, int timeout_s) {
  snprintf(g_test, sizeof g_test, "%s", name);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) FT_FAIL("socketpair: %s", strerror(errno));
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) FT_FAIL("fork: %s", strerror(errno));
  ft_peer peer = {0};
  g_peer = &peer;
  g_have_peer = 1;
  if (pid == 0) {
    close(sv[0]);
    peer.role = FT_CHILD;
    peer.fd = sv[1];
    g_role = FT_CHILD;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(FT_EXIT_FAIL);
    signal(SIGALRM, watchdog); /* reports the phase to the parent, then dies of SIGALRM */
    alarm((unsigned)timeout_s);
    ft_phase("body");
    body(&peer, arg);
    ft_phase("leak check");
    if (ft_leak_check()) FT_FAIL("LeakSanitizer found leaks in the child (see the report above)");
    fflush(NULL);
    _exit(FT_EXIT_OK);
  }
  close(sv[1]);
  peer.role = FT_PARENT;
  peer.fd = sv[0];
  peer.pid = pid;
  g_role = FT_PARENT;
  signal(SIGALRM, watchdog);
  alarm((unsigned)timeout_s + 2); /* the child's fires first, so a hung child is named as such */
  ft_phase("body");
  body(&peer, arg);
  ft_phase("waiting for the child to exit");
  if (!ft_wait_child(&peer, timeout_s * 1000)) FT_FAIL("the child did not exit within %d s after the parent finished", timeout_s);
  ft_check_child_ok(&peer);
  /* Leaks in this (Criterion's) process would only be printed at exit, not
   * fail the test: check now, after the body unloaded the plugin. */
  ft_phase("leak check");
  if (ft_leak_check()) FT_FAIL("LeakSanitizer found leaks in the parent (see the report above)");
  alarm(0);
  signal(SIGALRM, SIG_DFL);
  close(peer.fd);
  g_have_peer = 0;
  g_peer = NULL;
}

int ft_wait_child(ft_peer* p, int timeout_ms) {
  if (p->reaped) return 1;
  int64_t deadline = ft_now_ms() + timeout_ms;
  for (;;) {
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
      p->reaped = 1;
      p->status = st;
      ft_shm_cleanup(p->pid); /* whatever shm regions it did not close */
      return 1;
    }
    if (r < 0 && errno != EINTR) return 1;
    if (ft_now_ms() >= deadline) return 0;
    usleep(2000);
  }
}

void ft_check_child_ok(ft_peer* p) {
  if (!p->reaped) FT_FAIL("internal: child not reaped");
  if (WIFEXITED(p->status) && WEXITSTATUS(p->status) == 0) return;
  char st[160], why[1600] = "";
  describe_status(p->status, st, sizeof st);
  if (read_peer_failure(p, why, sizeof why)) FT_FAIL("the child %s: %s", st, why);
  FT_FAIL("the child %s", st);
}

void ft_send(ft_peer* p, const char* tag, const void* buf, size_t len) {
  ft_frame f = {.magic = FT_MAGIC, .len = (uint32_t)len};
  snprintf(f.tag, sizeof f.tag, "%s", tag);
  if (write_all(p->fd, &f, sizeof f) != 0 || (len && write_all(p->fd, buf, len) != 0)) {
    if (p->role == FT_PARENT && ft_wait_child(p, 2000)) ft_check_child_ok(p);
    FT_FAIL("control channel: cannot send '%s' to the peer (it is gone)", tag);
  }
}

void ft_recv(ft_peer* p, const char* tag, void* buf, size_t len, int timeout_ms) {
  ft_frame f;
  char saved[sizeof g_phase];
  memcpy(saved, g_phase, sizeof saved);
  snprintf(g_phase, sizeof g_phase, "%.100s; waiting for '%s' from the peer", saved, tag);
  int r = read_all(p->fd, &f, sizeof f, ft_now_ms() + timeout_ms);
  if (r == -2) FT_FAIL("control channel: no '%s' from the peer within %d ms", tag, timeout_ms);
  if (r != 0) {
    if (p->role == FT_PARENT && ft_wait_child(p, 3000)) ft_check_child_ok(p);
    FT_FAIL("control channel: the peer closed it while '%s' was awaited (it died)", tag);
  }
  if (f.magic != FT_MAGIC) FT_FAIL("control channel: bad frame magic 0x%x", f.magic);
  f.tag[FT_TAG_MAX - 1] = 0;
  if (strcmp(f.tag, FT_TAG_FAIL) == 0) {
    char why[1600];
    size_t n = f.len < sizeof why - 1 ? f.len : sizeof why - 1;
    if (read_all(p->fd, why, n, ft_now_ms() + 1000) != 0) n = 0;
    why[n] = 0;
    if (p->role == FT_PARENT) {
      ft_wait_child(p, 3000);
      kill_child(p);
    }
    FT_FAIL("the peer failed: %s", why);
  }
  if (strncmp(f.tag, tag, FT_TAG_MAX - 1) != 0 || f.len != len)
    FT_FAIL("control channel desync: awaited '%s' (%zu bytes), got '%s' (%u bytes)", tag, len, f.tag, f.len);
  if (len && read_all(p->fd, buf, len, ft_now_ms() + timeout_ms) != 0)
    FT_FAIL("control channel: truncated '%s'", tag);
  memcpy(g_phase, saved, sizeof saved);
}

void ft_xchg(ft_peer* p, const char* tag, const void* mine, void* theirs, size_t len, int timeout_ms) {
  ft_send(p, tag, mine, len);
  ft_recv(p, tag, theirs, len, timeout_ms);
}

void ft_sync(ft_peer* p, const char* tag, int timeout_ms) { ft_xchg(p, tag, NULL, NULL, 0, timeout_ms); }

int ft_peer_sent(ft_peer* p, int timeout_ms) {
  struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
  return poll(&pfd, 1, timeout_ms) > 0;
}

/* ------------------------------------------------------------------------ */
/* patterns                                                                  */

static inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t ft_seed(uint64_t a, uint64_t b, uint64_t c) { return mix64(mix64(mix64(a) ^ b) ^ c); }

static inline uint64_t word_at(uint64_t seed, size_t word) { return mix64(seed ^ (word * 0xD6E8FEB86659FD93ull)); }
static inline uint8_t byte_at(uint64_t seed, size_t off) {
  return (uint8_t)(word_at(seed, off >> 3) >> ((off & 7) * 8));
}

void ft_fill(void* buf, size_t len, uint64_t seed) {
  uint8_t* b = buf;
  size_t i = 0;
  for (; i < len && (i & 7); i++) b[i] = byte_at(seed, i);
  for (; i + 8 <= len; i += 8) {
    uint64_t w = word_at(seed, i >> 3);
    memcpy(b + i, &w, 8); /* little-endian: byte k of w is offset i+k */
  }
  for (; i < len; i++) b[i] = byte_at(seed, i);
}

int ft_verify(const void* buf, size_t len, uint64_t seed, size_t* bad_offset) {
  const uint8_t* b = buf;
  for (size_t i = 0; i < len; i += 8) {
    if (i + 8 <= len) {
      uint64_t w = word_at(seed, i >> 3), got;
      memcpy(&got, b + i, 8);
      if (got == w) continue;
    }
    for (size_t k = i; k < len && k < i + 8; k++)
      if (b[k] != byte_at(seed, k)) {
        if (bad_offset) *bad_offset = k;
        return 0;
      }
  }
  return 1;
}

void ft_verify_or_fail(const void* buf, size_t len, uint64_t seed, const char* what) {
  size_t bad = 0;
  if (ft_verify(buf, len, seed, &bad)) return;
  const uint8_t* b = buf;
  size_t nbad = 0;
  for (size_t k = bad; k < len; k++) nbad += b[k] != byte_at(seed, k);
  FT_FAIL("%s: data mismatch at byte %zu of %zu: expected 0x%02x, got 0x%02x (%zu bad bytes from there)%s", what,
          bad, len, byte_at(seed, bad), b[bad], nbad,
          b[bad] == FT_POISON ? "; the byte still holds the receive poison, so it was never written" : "");
}

void ft_check_poison(const void* buf, size_t len, const char* what) {
  const uint8_t* b = buf;
  for (size_t i = 0; i < len; i++)
    if (b[i] != FT_POISON)
      FT_FAIL("%s: byte %zu of %zu was overwritten (0x%02x): data landed outside the receive", what, i, len, b[i]);
}

void* ft_alloc(size_t len) {
  size_t n = len ? len : 1;
  void* p = NULL;
  if (posix_memalign(&p, 4096, n) != 0 || !p) FT_FAIL("out of memory allocating %zu bytes", len);
  return p;
}

void ft_free(void* buf, size_t len) {
  (void)len;
  free(buf);
}

/* ------------------------------------------------------------------------ */
/* stale shared-memory regions                                               */

#include <dirent.h>

/* libfabric's shm provider names an endpoint's region /dev/shm/<name>; a
 * process killed before closing its endpoints leaves the file behind. The
 * engine names its regions fabric_<pid>_<nonce>_<n> (core/fabric/fab_endpoint.c),
 * so stale ones never collide, but they still hold memory: after killing a
 * child on purpose the harness removes what the child left, matching both
 * the engine's names and libfabric's default <pid>:<n>:<m>. */
/* Whether a /dev/shm entry is <pid>:<digits>:<digits> or fabric_<pid>_... */
static int shm_region_of(const char* name, pid_t pid) {
  char prefix[32];
  int plen = snprintf(prefix, sizeof prefix, "fabric_%d_", (int)pid);
  if (strncmp(name, prefix, (size_t)plen) == 0) return 1;
  plen = snprintf(prefix, sizeof prefix, "%d:", (int)pid);
  if (strncmp(name, prefix, (size_t)plen) != 0) return 0;
  const char* p = name + plen;
  int colons = 0;
  if (!*p) return 0;
  for (; *p; p++) {
    if (*p == ':') colons++;
    else if (*p < '0' || *p > '9') return 0;
  }
  return colons == 1;
}

/* Counts pid's regions under /dev/shm, removing each when unlink is set. */
static int each_region(pid_t pid, int unlink_them) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;) {
    if (!shm_region_of(e->d_name, pid)) continue;
    char path[300];
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    if (!unlink_them || unlink(path) == 0) n++;
  }
  closedir(d);
  return n;
}

int ft_shm_count(pid_t pid) { return each_region(pid, 0); }

int ft_shm_cleanup(pid_t pid) { return each_region(pid, 1); }

/* ------------------------------------------------------------------------ */
/* sanitizers                                                                */

extern int __lsan_do_recoverable_leak_check(void) __attribute__((weak));

int ft_leak_check(void) {
  if (&__lsan_do_recoverable_leak_check == NULL) return 0;
  return __lsan_do_recoverable_leak_check() != 0;
}

int ft_sanitized(void) { return &__lsan_do_recoverable_leak_check != NULL; }
