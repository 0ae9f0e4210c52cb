/* netbench: small helpers shared by the harness and the transports. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nb.h"

int nb_rank = -1;

uint64_t nb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* libfabric's shm provider names its regions /dev/shm/<pid>:<n>:<m> and
 * removes them only when the endpoint is closed; a process that stops on a
 * failure leaves 16 MiB behind per endpoint, and a later process that gets
 * the same pid then fails fi_enable with EBUSY. A failing rank removes its
 * own regions before it exits. */
void nb_cleanup_shm(void) {
  char prefix[32];
  int n = snprintf(prefix, sizeof(prefix), "%d:", (int)getpid());
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  for (struct dirent* e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, (size_t)n) == 0) {
      char path[300];
      snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
      unlink(path);
    }
  }
  closedir(d);
}

void nb_die(const char* fmt, ...) {
  va_list ap;
  char msg[1024];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "netbench[rank %d]: FAILED: %s\n", nb_rank, msg);
  fflush(stderr);
  nb_cleanup_shm();
  _exit(2);
}

void nb_log(const char* fmt, ...) {
  va_list ap;
  char msg[1024];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "netbench[rank %d]: %s\n", nb_rank, msg);
}
