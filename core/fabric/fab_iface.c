/*
 * Which interfaces a socket-based provider (tcp) offers NCCL as devices.
 * Each interface is a domain of its own; loopback and container bridges
 * are among them, and NCCL may put a multi-node job's channels on any
 * device it is offered. FABRIC_EXCLUDE_IF (default "lo,docker0", as the
 * leading peer plugin's exclusion list) names interfaces that discovery
 * (fab_device.c) leaves out, unless the user chose interfaces with
 * FI_TCP_IFACE or nothing else would remain (then every peer is on this
 * host, and loopback is the way to it).
 */
#include <stdlib.h>
#include <string.h>

#include "fab_engine.h"

static int socket_provider(const struct fi_info* fi) {
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
  return socket_provider(fi) && dom && !getenv("FI_TCP_IFACE") && listed(dom, fab_g.params.exclude_if);
}
