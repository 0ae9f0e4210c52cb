/* fabric-info --profiles: what the plugin chooses on this machine's provider
 * under each test-only NIC profile (FABRIC_NIC_PROFILE: the limits of EFA,
 * verbs, cxi or libfabric 2.x's GPU shm imposed on what carries the bytes
 * here). Each profile is probed in a child process, since the plugin reads
 * the setting once, when it starts; the table comes from the lines the plugin
 * logs at start, which name its transport and its one-sided calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "info.h"

/* core/fabric/fab_nic_profile.c's profiles; "" is none (the provider's own limits) */
static const char* const profiles[] = {"", "efa", "verbs", "cxi", "shm-gpu"};
enum { NPROFILES = sizeof(profiles) / sizeof(profiles[0]) };

typedef struct {
  char transport[32];
  char onesided[INFO_LINE]; /* "yes", "yes, in the 4-byte CQ data format", or "no [...]" */
  char why[INFO_LINE];      /* the transports that could not run, and why */
  char device[INFO_LINE];   /* the device line's facts after the transport */
} profile_row;

/* The text after key in line, up to stop (or the end), into out. */
static int after(const char* line, const char* key, const char* stop, char* out, size_t len) {
  const char* p = strstr(line, key);
  if (!p) return 0;
  p += strlen(key);
  size_t n = stop && strstr(p, stop) ? (size_t)(strstr(p, stop) - p) : strlen(p);
  snprintf(out, len, "%.*s", (int)n, p);
  return 1;
}

static void row_from_log(const info_report* r, profile_row* row) {
  memset(row, 0, sizeof(*row));
  for (int i = 0; i < r->nlog; i++) {
    const char* l = r->log[i];
    if (strstr(l, "device 0: ")) {
      after(l, "transport ", ",", row->transport, sizeof(row->transport));
      after(l, "transport ", NULL, row->device, sizeof(row->device));
    }
    after(l, "one-sided calls (RMA, GIN proxy, Neuron iwrite/iread): ", NULL, row->onesided, sizeof(row->onesided));
    char t[INFO_LINE];
    if (after(l, "NET/Fabric: transport ", "; trying", t, sizeof(t)) && strstr(t, "cannot run"))
      snprintf(row->why + strlen(row->why), sizeof(row->why) - strlen(row->why), "%s%s", row->why[0] ? "; " : "", t);
  }
}

/* One profile (and, when transport is set, that FABRIC_TRANSPORT) in a
 * child; its row comes back through a pipe. 0 when the plugin started. */
static int probe_one(const char* profile, const char* transport, const char* plugin, profile_row* row) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    close(fds[0]);
    if (*profile) setenv("FABRIC_NIC_PROFILE", profile, 1);
    else unsetenv("FABRIC_NIC_PROFILE");
    if (transport) setenv("FABRIC_TRANSPORT", transport, 1);
    static info_report r; /* large: off the stack */
    int bad = info_probe(&r, plugin) != 0 && r.load_error[0];
    profile_row out;
    row_from_log(&r, &out);
    if (bad) snprintf(out.why, sizeof(out.why), "%s", r.load_error);
    ssize_t w = write(fds[1], &out, sizeof(out));
    _exit(w == (ssize_t)sizeof(out) && out.transport[0] ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = read(fds[0], row, sizeof(*row));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (got != (ssize_t)sizeof(*row)) memset(row, 0, sizeof(*row));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* auto did not pick rdma: what the rdma transport (which the one-sided calls
 * need) would do under the same profile. */
static void rdma_forced(const char* profile, const char* plugin) {
  profile_row row;
  int rc = probe_one(profile, "rdma", plugin, &row);
  if (rc == 0 && !strncmp(row.transport, "rdma", 4))
    printf("  %-9s %-10s with FABRIC_TRANSPORT=rdma: one-sided calls %s\n", "", "", row.onesided);
  else
    printf("  %-9s %-10s with FABRIC_TRANSPORT=rdma: %s\n", "", "", row.why[0] ? row.why : "the plugin did not start");
}

int info_profiles(const char* plugin) {
  const char* prov = getenv("FI_PROVIDER");
  const char* chosen = getenv("FABRIC_TRANSPORT");
  printf("what the plugin chooses under each NIC profile (FABRIC_NIC_PROFILE, test only), carried by %s:\n",
         prov && *prov ? prov : "the provider libfabric picks");
  printf("  %-9s %-10s %s\n", "profile", "transport", "one-sided calls (RMA, GIN proxy, Neuron iwrite/iread)");
  int failed = 0;
  for (int i = 0; i < NPROFILES; i++) {
    profile_row row;
    int rc = probe_one(profiles[i], NULL, plugin, &row);
    const char* name = profiles[i][0] ? profiles[i] : "(none)";
    if (rc != 0) {
      printf("  %-9s %-10s the plugin did not start: %s\n", name, "-", row.why[0] ? row.why : "see its log");
      failed = 1;
      continue;
    }
    printf("  %-9s %-10s %s\n", name, row.transport, row.onesided[0] ? row.onesided : "(not said)");
    printf("  %-9s %-10s device: %s\n", "", "", row.device);
    if (row.why[0]) printf("  %-9s %-10s why not another: %s\n", "", "", row.why);
    if (strncmp(row.transport, "rdma", 4) && !(chosen && *chosen)) rdma_forced(profiles[i], plugin);
  }
  return failed;
}
