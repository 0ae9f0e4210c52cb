/*
 * Which interfaces a socket-based provider (tcp) offers NCCL as devices.
 * Each interface is a domain of its own; loopback and container bridges
 * are among them, and NCCL may put a multi-node job's channels on any
 * device it is offered. FABRIC_EXCLUDE_IF (default "lo,docker0", as the
 * leading peer plugin's exclusion list) names interfaces that discovery
 * (fab_device.c) leaves out, unless the user chose interfaces with
 * FI_TCP_IFACE or nothing else would remain (then every peer is on this
 * host, and loopback is the way to it).
 *
 * It also says how fast such an interface is: libfabric's tcp leaves the
 * link speed out, and NCCL's tuning reads the speed a device reports (which
 * protocol each size takes). The figure is the one NCCL's own Socket
 * transport reports for the same interface, so both get NCCL's same tuning.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fab_engine.h"

int fab_iface_socket_provider(const struct fi_info* fi) {
  const char* p = fi->fabric_attr->prov_name;
  return p && (!strncmp(p, "tcp", 3) || !strncmp(p, "sockets", 7));
}

/* Whether name matches one comma-separated entry of list (an entry ending
 * in '*' matches by prefix). */
static int listed(const char* name, const char* list) {
  size_t n = strlen(name);
  for (const char* s = list; *s;) {
    size_t len = strcspn(s, ",");
    if (len && s[len - 1] == '*' ? !strncmp(name, s, len - 1) : (len == n && !strncmp(name, s, n))) return 1;
    s += len + (s[len] == ',');
  }
  return 0;
}

int fab_iface_listed(const struct fi_info* fi) {
  const char* dom = fi->domain_attr->name;
  return fab_iface_socket_provider(fi) && dom && !getenv("FI_TCP_IFACE") && listed(dom, fab_g.params.exclude_if);
}

int fab_iface_read_speed(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  long mbps = 0;
  int ok = fscanf(f, "%ld", &mbps) == 1; /* loopback's file fails to read; many virtual NICs say -1 */
  fclose(f);
  return ok && mbps > 0 && mbps <= INT_MAX ? (int)mbps : 0;
}

int fab_iface_known_speed_mbps(const struct fi_info* fi) {
  const char* dom = fi->domain_attr->name;
  if (!fab_iface_socket_provider(fi) || !dom || !*dom || strchr(dom, '/') || strstr(dom, "..")) return 0;
  char path[96 + sizeof("/sys/class/net//speed")];
  if ((size_t)snprintf(path, sizeof(path), "/sys/class/net/%s/speed", dom) >= sizeof(path)) return 0;
  return fab_iface_read_speed(path);
}

int fab_iface_speed_mbps(const struct fi_info* fi) {
  if (!fab_iface_socket_provider(fi)) return 0;
  int mbps = fab_iface_known_speed_mbps(fi);
  return mbps ? mbps : FAB_IFACE_UNKNOWN_SPEED_MBPS;
}
