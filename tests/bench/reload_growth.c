/*
 * Reload growth (hardening issue, item 9): the cycle NCCL 2.28+ drives, with a transfer in flight. Two
 * processes, each cycle: dlopen the plugin, init (ncclNetPlugin_v12), connect a pair, post a 4 MiB
 * send and receive, deregister and close both comms before the transfer completes, finalize, dlclose.
 * Prints each side's resident growth per cycle after 20 warm-up cycles. Not built by CMake (a manual
 * measurement, docs/known-bugs.md):
 *   gcc -O1 -o /tmp/reload tests/bench/reload_growth.c -ldl
 *   FI_PROVIDER=tcp FI_TCP_IFACE=lo /tmp/reload build/libnccl-net-fabric.so 200
 *   FI_PROVIDER=shm /tmp/reload build/libnccl-net-fabric.so 200
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static long rss_kb(void) { FILE* f = fopen("/proc/self/statm", "r"); long a, b; fscanf(f, "%ld %ld", &a, &b); fclose(f); return b * 4; }
typedef int (*fn)();
int main(int argc, char** argv) {
  int n = atoi(argv[2]);
  int p2c[2], c2p[2];
  pipe(p2c); pipe(c2p);
  int child = fork() == 0;
  static char buf[4 << 20];
  long r0 = 0;
  memset(buf, 1, sizeof buf); /* resident from the start: growth is not the buffer filling in */
  for (int i = 0; i < n; i++) {
    void* dl = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    void** t = dlsym(dl, "ncclNetPlugin_v12");
    fn init = t[1], listen = t[4], connect = t[5], accept = t[6], regMr = t[7], deregMr = t[9], isend = t[10],
       irecv = t[11], closeSend = t[14], closeRecv = t[15], closeListen = t[16], finalize = t[20];
    void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL, *mh = NULL, *req = NULL;
    char h[128];
    init(&ctx, 1, NULL, NULL, NULL);
    if (!child) {
      listen(ctx, 0, h, &lc);
      write(p2c[1], h, 128);
      while (!rc) accept(lc, &rc, NULL);
      regMr(rc, buf, sizeof buf, 1, &mh);
      size_t sz = sizeof buf; int tag = 1; void* d = buf;
      while (!req) irecv(rc, 1, &d, &sz, &tag, &mh, NULL, &req);
      usleep(200);
      deregMr(rc, mh);
      closeRecv(rc);
      closeListen(lc);
      char x; write(p2c[1], "x", 1); read(c2p[0], &x, 1);
    } else {
      read(p2c[0], h, 128);
      while (!sc) connect(ctx, 0, h, &sc, NULL);
      regMr(sc, buf, sizeof buf, 1, &mh);
      while (!req) isend(sc, buf, sizeof buf, 1, mh, NULL, &req);
      char x; read(p2c[0], &x, 1);
      deregMr(sc, mh);
      closeSend(sc);
      write(c2p[1], "y", 1);
    }
    finalize(ctx);
    dlclose(dl);
    if (i == 20) r0 = rss_kb();
  }
  printf("%s: %d cycles: %.2f KiB per cycle after 20 (rss %ld KiB)\n", child ? "sender" : "receiver", n,
         (double)(rss_kb() - r0) / (n - 21), rss_kb());
  if (!child) wait(NULL);
  return 0;
}
