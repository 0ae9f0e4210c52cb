/*
 * Liveness of peers on this host (intra-host providers with our endpoint
 * names, i.e. shm). Such a peer's name carries its pid, fabric_<pid>_<nonce>_<n>
 * (fab_endpoint.c), and its endpoint is a region /dev/shm/<name>. libfabric
 * 1.17's shm cannot be trusted with a dead peer:
 *  - inserting the name of a region that is gone leaves the peer map in a
 *    state where a later send faults or stalls every later connect;
 *  - a send takes a spin lock inside the peer's region, which a process
 *    killed in its progress still holds: the sender spins forever;
 *  - a small send (a liveness probe) completes locally, so it proves nothing;
 *  - an endpoint completes its sends in order, so a send the dead peer never
 *    took holds up every later send of that endpoint.
 * So the plugin asks the kernel instead: the process exists (kill(pid, 0),
 * not a zombie) and its region exists. This assumes the peers share our pid
 * namespace, as shm's own single-copy path (CMA) does.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fab_engine.h"

/* The pid in an address of our name form (after an optional "scheme://"),
 * or 0 when addr is not one. */
static long name_pid(const char* name, size_t len, const char** base) {
  if (len == 0 || name[len - 1] != '\0') return 0;
  const char* s = strstr(name, "://");
  s = s ? s + 3 : name;
  *base = s;
  if (strncmp(s, "fabric_", 7) != 0) return 0;
  char* end = NULL;
  long pid = strtol(s + 7, &end, 10);
  return pid > 0 && end && *end == '_' ? pid : 0;
}

/* 1 when the process is gone: no such process, or a zombie. */
static int process_gone(long pid) {
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* p = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return p && (p[2] == 'Z' || p[2] == 'X');
}

int fab_peer_local_gone(const fab_endpoint* ep, const void* addr, size_t len, char* why, size_t why_len) {
  if (!ep->dev->local_only || ep->dev->info->addr_format != FI_ADDR_STR) return 0;
  const char* base = NULL;
  long pid = name_pid(addr, len, &base);
  if (!pid) return 0;
  char path[160];
  struct stat st;
  snprintf(path, sizeof(path), "/dev/shm/%s", base);
  if (stat(path, &st) != 0 && errno == ENOENT) {
    snprintf(why, why_len, "its shared-memory endpoint %s is gone (process %ld exited or closed it)", path, pid);
    return 1;
  }
  if (process_gone(pid)) {
    snprintf(why, why_len, "its process %ld has exited", pid);
    return 1;
  }
  return 0;
}

/* The address of a in ep's AV, or NULL. */
static const fab_av_entry* av_entry(const fab_endpoint* ep, fi_addr_t a) {
  for (size_t i = 0; i < ep->av_count; i++)
    if (ep->av_cache[i].fi_addr == a) return &ep->av_cache[i];
  return NULL;
}

int fab_peer_local_state(const fab_endpoint* ep, fi_addr_t peer, char* why, size_t why_len) {
  if (!ep->dev->local_only || ep->dev->info->addr_format != FI_ADDR_STR) return -1;
  const fab_av_entry* a = av_entry(ep, peer);
  const char* base;
  if (!a || !name_pid((const char*)a->addr, a->len, &base)) return -1;
  return fab_peer_local_gone(ep, a->addr, a->len, why, why_len);
}
