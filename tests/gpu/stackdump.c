/*
 * stackdump.so: every thread's stack of a hung process, on machines without a
 * debugger (the GPU machines have no gdb). Preload it
 * (LD_PRELOAD=.../stackdump.so), then `kill -USR2 <pid>`: the thread that takes
 * the signal sends another to each thread of the process, and each writes its
 * own backtrace to stderr, one "stackdump <pid>/<tid>:" header per thread, one
 * thread after another.
 *
 *   gcc -O2 -shared -fPIC -o stackdump.so stackdump.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DUMP_SIGNAL (SIGRTMIN + 7)

static volatile sig_atomic_t dumping; /* the thread signalled last has not finished its dump */

static void dump_own(int sig) {
  (void)sig;
  void* frames[64];
  char head[64];
  int n = backtrace(frames, 64);
  int len = snprintf(head, sizeof(head), "stackdump %d/%ld:\n", (int)getpid(), (long)syscall(SYS_gettid));
  if (write(2, head, (size_t)len) < 0) return;
  backtrace_symbols_fd(frames, n, 2);
  dumping = 0;
}

static void dump_all(int sig) {
  DIR* d = opendir("/proc/self/task");
  long self = syscall(SYS_gettid);
  for (struct dirent* e; d && (e = readdir(d));) {
    long tid = atol(e->d_name);
    if (tid <= 0 || tid == self) continue;
    dumping = 1;
    if (syscall(SYS_tgkill, getpid(), tid, DUMP_SIGNAL) != 0) continue;
    for (int i = 0; i < 1000 && dumping; i++) usleep(1000); /* at most 1 s each */
  }
  if (d) closedir(d);
  dump_own(sig);
}

__attribute__((constructor)) static void install(void) {
  void* warm[2];
  backtrace(warm, 2); /* loads the unwinder now, not inside a handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_flags = SA_RESTART;
  sa.sa_handler = dump_all;
  sigaction(SIGUSR2, &sa, NULL);
  sa.sa_handler = dump_own;
  sigaction(DUMP_SIGNAL, &sa, NULL);
}
