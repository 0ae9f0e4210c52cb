/*
 * Unloading and crashing never hang, and leave no files behind.
 *
 * libfabric (Debian 1.17) loads libinfinipath, whose signal handlers call
 * exit(); exit runs our library destructor while the crashed or signalled
 * thread may still hold a lock of the plugin (core/fabric/fab_signals.c). Each case
 * runs in a forked child that holds the shared endpoint's lock in a second
 * thread, as a thread stuck inside the plugin would, and then ends.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fab_engine.h"
#include "unit_util.h"

static _Atomic int held;

static void* hold_forever(void* arg) {
  pthread_mutex_lock(arg);
  atomic_store(&held, 1);
  for (;;) pause();
  return NULL;
}

/* Child: init, create the endpoint (its listen comm closed again, so that
 * unload gets as far as the endpoint locks), lock it from another thread. */
static void child_setup(void) {
  ut_use_provider("shm");
  fab_ctx* ctx = NULL;
  if (fab_api_core.init(&ctx, 1, NULL, ut_logger, NULL) != FAB_OK) _exit(90);
  unsigned char h[FAB_HANDLE_SIZE];
  void* lc = NULL;
  if (fab_api_core.listen(ctx, 0, h, &lc) != FAB_OK) _exit(91);
  fab_endpoint* ep = atomic_load(&fab_g.eps[0]);
  if (!ep) _exit(92);
  if (fab_api_core.close_listen(lc) != FAB_OK) _exit(93);
  pthread_t t;
  pthread_create(&t, NULL, hold_forever, &ep->lock);
  while (!atomic_load(&held)) sched_yield();
}

/* Files under /dev/shm named for pid's endpoints (fabric_<pid>_...). */
static int regions_of(pid_t pid) {
  char prefix[32];
  snprintf(prefix, sizeof(prefix), "fabric_%d_", (int)pid);
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
  closedir(d);
  return n;
}

/* Parent: the child's wait status within limit_ms, or fails. */
static int wait_child(pid_t pid, int limit_ms, const char* what) {
  int64_t deadline = ut_now_ms() + limit_ms;
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (ut_now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      cr_assert_fail("%s: the process did not end within %d ms (hung in unload?)", what, limit_ms);
    }
    usleep(10000);
  }
  return st;
}

Test(unload, exit_with_endpoint_lock_held, .timeout = 60) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    child_setup();
    exit(0); /* runs the destructor */
  }
  int st = wait_child(pid, 8000, "exit() while a thread holds the endpoint lock");
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child ended with status 0x%x", st);
  cr_assert_eq(regions_of(pid), 0, "the child left its shared-memory regions in /dev/shm");
}

Test(unload, sigterm_with_endpoint_lock_held, .timeout = 60) {
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    child_setup();
    kill(getpid(), SIGTERM);
    for (;;) pause();
  }
  int st = wait_child(pid, 8000, "SIGTERM while a thread holds the endpoint lock");
  cr_assert(WIFSIGNALED(st) || WIFEXITED(st), "the child ended with status 0x%x", st);
}

/* exit() in one thread while another is inside test() (issue 26 item 6): the
 * destructor used to free the comm under the running test() (a crash in
 * fab_req_put; rdma on tcp 7 of 7 runs). A loopback connection in a child, a
 * receive that never matches, a thread testing it without pause, and exit()
 * from the main thread. */
static const fab_api* api = &fab_api_core;
static _Atomic int testing;

static void* test_forever(void* req) {
  for (int done = 0;;) {
    api->test(req, &done, NULL);
    atomic_store(&testing, 1);
  }
  return NULL;
}

static void exit_while_testing_child(const char* prov, const char* transport) {
  ut_use_provider(prov);
  setenv("FABRIC_TRANSPORT", transport, 1);
  fab_ctx* ctx = NULL;
  if (api->init(&ctx, 1, NULL, ut_logger, NULL) != FAB_OK) _exit(90);
  unsigned char h[FAB_HANDLE_SIZE];
  void *l = NULL, *s = NULL, *r = NULL;
  if (api->listen(ctx, 0, h, &l) != FAB_OK) _exit(91);
  for (int64_t end = ut_now_ms() + 20000; !s || !r;) {
    if (ut_now_ms() > end) _exit(92);
    if (!s && api->connect(ctx, 0, NULL, h, &s, NULL) != FAB_OK) _exit(93);
    if (!r && api->accept(l, &r, NULL) != FAB_OK) _exit(94);
  }
  static char buf[1 << 16];
  void* mh = NULL;
  if (api->reg_mr(r, buf, sizeof(buf), FAB_PTR_HOST, &mh) != FAB_OK) _exit(95);
  void* data = buf;
  size_t size = sizeof(buf);
  int tag = 7;
  void* req = NULL;
  while (!req)
    if (api->irecv(r, 1, &data, &size, &tag, &mh, NULL, &req) != FAB_OK) _exit(96);
  pthread_t t;
  pthread_create(&t, NULL, test_forever, req);
  while (!atomic_load(&testing)) sched_yield();
  usleep(20000);
  exit(0); /* runs the destructor while test_forever is inside test() */
}

static void exit_while_testing(const char* prov, const char* transport) {
  for (int round = 0; round < 4; round++) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) exit_while_testing_child(prov, transport);
    int st = wait_child(pid, 20000, "exit() while another thread is inside test()");
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s %s, round %d: the child ended with %s %d", prov, transport,
              round, WIFSIGNALED(st) ? "signal" : "status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    cr_assert_eq(regions_of(pid), 0, "%s %s: the child left its shared-memory regions in /dev/shm", prov, transport);
  }
}

Test(unload, exit_while_testing_tcp_rdma, .timeout = 120) { exit_while_testing("tcp", "rdma"); }
Test(unload, exit_while_testing_tcp_sendrecv, .timeout = 120) { exit_while_testing("tcp", "sendrecv"); }
Test(unload, exit_while_testing_shm_rdma, .timeout = 120) { exit_while_testing("shm", "rdma"); }
Test(unload, exit_while_testing_shm_sendrecv, .timeout = 120) { exit_while_testing("shm", "sendrecv"); }

static int btr_files(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    n += l > 4 && !strcmp(e->d_name + l - 4, ".btr");
  }
  closedir(d);
  return n;
}

Test(unload, crash_leaves_no_btr_file, .timeout = 60) {
  char dir[] = "/tmp/fabric-unload-XXXXXX";
  cr_assert(mkdtemp(dir) != NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    if (chdir(dir) != 0) _exit(93);
    child_setup();
    raise(SIGSEGV);
    _exit(94);
  }
  int st = wait_child(pid, 8000, "SIGSEGV while a thread holds the endpoint lock");
  int n = btr_files(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  (void)!system(cmd);
  cr_assert(n == 0, "a crash left %d *.btr file(s) in the working directory", n);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "the crash ended as status 0x%x, not SIGSEGV", st);
}
