/* fabric-info: the command line, and the report as text or JSON. See info.h
 * and docs/troubleshooting.md.
 *
 *   fabric-info [--json] [--selftest] [--bytes SIZE] [--timeout-ms N] [--plugin PATH] [--version] [--help]
 *
 * Exit status: 0 when the plugin loaded and every exported net version
 * reported a device (and the self-test, when asked, moved every byte);
 * 1 otherwise; 2 for a bad command line. */
#include <dlfcn.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fab_version.h" /* the build tree's (codegen/version.cmake) */
#include "info.h"

static const char* ptr_kinds(int bits, char* buf, size_t len) {
  snprintf(buf, len, "%s%s%s", bits & FAB_PTR_HOST ? "host " : "", bits & FAB_PTR_CUDA ? "cuda " : "",
           bits & FAB_PTR_DMABUF ? "dmabuf " : "");
  size_t n = strlen(buf);
  if (n) buf[n - 1] = '\0';
  return buf;
}

/* The plugin's own explanation of GPU memory (its "GPU memory" log line,
 * else its first CUDA line), or "". */
static const char* gpu_reason(const info_report* r) {
  for (int i = 0; i < r->nlog; i++)
    if (strstr(r->log[i], "GPU memory")) return r->log[i];
  for (int i = 0; i < r->nlog; i++)
    if (strstr(r->log[i], "CUDA")) return r->log[i];
  return "";
}

static void text_devices(const info_version* v) {
  printf("  %sncclNetPlugin_v%d:", v->neuron ? "Neuron " : "", v->version);
  if (v->error[0]) {
    printf(" %s\n", v->error);
    return;
  }
  printf(" %d device(s)\n", v->ndev);
  for (int d = 0; d < v->ndev; d++) {
    const fab_properties* p = &v->props[d];
    char kinds[32];
    printf("    dev %d %s: ptrSupport %s, speed %d Mbps, maxRecvs %d, regIsGlobal %d, maxComms %d, maxP2pBytes %zu, "
           "pci %s", d, v->names[d], ptr_kinds(p->ptr_support, kinds, sizeof kinds), p->speed_mbps, p->max_recvs,
           p->reg_is_global, p->max_comms, p->max_p2p_bytes, v->pci[d][0] ? v->pci[d] : "(none)");
    if (p->vprops.ndevs > 1) {
      printf(", fuses");
      for (int k = 0; k < p->vprops.ndevs; k++) printf(" %d", p->vprops.devs[k]);
    }
    if (v->neuron && v->version >= 5)
      printf(", rma_supported %d, max_write_inline_size %zu, max_mr_key_size %zu%s", p->rma_supported,
             p->max_write_inline_size, p->max_mr_key_size,
             p->rma_supported ? "" : " (one-sided calls need FABRIC_TRANSPORT=rdma)");
    printf("\n");
  }
}

static void print_text(const info_report* r, int failed) {
  printf("libfabric %s (API version); providers with RDM endpoints:", r->fi_version);
  for (int i = 0; i < r->nproviders; i++) printf(" %s", r->providers[i]);
  printf("%s\n", r->nproviders ? "" : " none");
  printf("settings:%s\n", r->nenv ? "" : " none (defaults: the first provider that fits, transport auto)");
  for (int i = 0; i < r->nenv; i++)
    if (r->env_ignored[i][0])
      printf("  %s   <- ignored, it %s\n", r->env[i], r->env_ignored[i] + strlen(r->env[i]) + 1);
    else
      printf("  %s%s\n", r->env[i], r->env_unknown[i] ? "   <- not a setting of this plugin (docs/params.md lists them)" : "");
  for (int i = 0; i < r->nnccl; i++) printf("NCCL would not use this plugin: %s\n", r->nccl[i]);
  if (r->load_error[0]) {
    printf("plugin %s: cannot be loaded: %s\n", r->plugin, r->load_error);
    printf("what to do: install the library where the loader finds it, or give its path (NCCL_NET_PLUGIN, --plugin)\n");
    return;
  }
  printf("plugin %s (%s)\n  tables:", r->plugin, r->plugin_file);
  for (int i = 0; i < r->ntables; i++) printf(" %s", r->tables[i]);
  printf("\nthe plugin says (provider, transport and why):\n");
  for (int i = 0; i < r->nlog; i++) printf("  %s%s\n", r->log_level[i] == FAB_LOG_WARN ? "WARN " : "", r->log[i]);
  printf("devices, as each exported net version reports them:\n");
  for (int i = 0; i < r->nversions; i++) text_devices(&r->versions[i]);
  const char* g = gpu_reason(r);
  int cuda = r->nversions && r->versions[0].ndev && (r->versions[0].props[0].ptr_support & FAB_PTR_CUDA);
  printf("GPU memory: %s%s%s\n", cuda ? "yes" : "no", g[0] ? ": " : "", g);
  if (r->selftest_ran) {
    if (r->selftest_ok)
      printf("selftest: passed: %zu bytes from one process to another, every byte checked, %.3f s (%.2f GB/s; a "
             "health check, netbench measures speed)\n",
             r->selftest_bytes, r->selftest_seconds,
             r->selftest_seconds > 0 ? (double)r->selftest_bytes / r->selftest_seconds / 1e9 : 0.0);
    else
      printf("selftest: FAILED: %s\n", r->selftest_detail);
  }
  if (failed && !r->selftest_ran)
    printf("problem: the plugin did not report a device through every table; the WARN lines above say why\n");
}

/* Bytes of the well-formed UTF-8 sequence at s (1 to 4), or 0 when it is not one. */
static int utf8_len(const unsigned char* s) {
  int n = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3 : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
  if (n == 0 || (n == 2 && s[0] < 0xc2) || (n == 4 && s[0] > 0xf4)) return 0;
  for (int i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if ((n == 3 && s[0] == 0xe0 && s[1] < 0xa0) || (n == 3 && s[0] == 0xed && s[1] >= 0xa0) ||
      (n == 4 && s[0] == 0xf0 && s[1] < 0x90) || (n == 4 && s[0] == 0xf4 && s[1] >= 0x90))
    return 0; /* overlong, a surrogate, or past U+10FFFF */
  return n;
}

/* A JSON string: quotes, backslashes and control bytes escaped, and every byte that is not part of
 * well-formed UTF-8 (a path or an interface name may hold any bytes) written as U+FFFD. */
static void json_value(const char* text) {
  const unsigned char* s = (const unsigned char*)text;
  putchar('"');
  while (*s) {
    int n = utf8_len(s);
    if (n == 0) {
      fputs("\\ufffd", stdout);
      s++;
    } else if (*s == '"' || *s == '\\') {
      printf("\\%c", *s++);
    } else if (*s < 0x20 || *s == 0x7f) {
      printf("\\u%04x", *s++);
    } else {
      fwrite(s, 1, (size_t)n, stdout);
      s += n;
    }
  }
  putchar('"');
}

static void json_str(const char* key, const char* s, int comma) {
  printf("\"%s\": ", key);
  json_value(s);
  if (comma) printf(", ");
}

static void json_devices(const info_version* v) {
  printf("{\"version\": %d, \"family\": \"%s\", ", v->version, v->neuron ? "neuron" : "net");
  json_str("error", v->error, 1);
  printf("\"devices\": [");
  for (int d = 0; d < v->ndev; d++) {
    const fab_properties* p = &v->props[d];
    printf("%s{", d ? ", " : "");
    json_str("name", v->names[d], 1);
    json_str("pciPath", v->pci[d], 1);
    printf("\"ptrSupport\": %d, \"speed\": %d, \"maxRecvs\": %d, \"regIsGlobal\": %d, \"maxComms\": %d, "
           "\"maxP2pBytes\": %zu, \"vDevices\": [", p->ptr_support, p->speed_mbps, p->max_recvs, p->reg_is_global,
           p->max_comms, p->max_p2p_bytes);
    for (int k = 0; k < p->vprops.ndevs && p->vprops.ndevs > 1; k++) printf("%s%d", k ? ", " : "", p->vprops.devs[k]);
    printf("]");
    if (v->neuron && v->version >= 5)
      printf(", \"rmaSupported\": %d, \"maxWriteInlineSize\": %zu, \"maxMrKeySize\": %zu", p->rma_supported,
             p->max_write_inline_size, p->max_mr_key_size);
    printf("}");
  }
  printf("]}");
}

/* The facts the plugin states in its INFO lines, for the JSON report: each device's provider, domain and
 * transport ("device N: provider P domain D, transport T, ..."), and yes/no with a reason code in brackets
 * for GPU memory ("GPU memory (CUDA...): no on P with transport T [code]: why") and one-sided calls
 * ("...one-sided calls (...): no [code]: why"). */
static void json_facts(const info_report* r) {
  printf("\"devices\": [");
  int n = 0;
  for (int i = 0; i < r->nlog; i++) {
    const char* at = strstr(r->log[i], "device ");
    int idx;
    char prov[64], dom[128], tp[32];
    if (!at || !strstr(at, ": provider ") ||
        sscanf(at, "device %d: provider %63s domain %127[^,], transport %31[^,]", &idx, prov, dom, tp) != 4)
      continue;
    printf("%s{\"index\": %d, ", n++ ? ", " : "", idx);
    json_str("provider", prov, 1);
    json_str("domain", dom, 1);
    json_str("transport", tp, 0);
    printf("}");
  }
  printf("], ");
  const char* keys[2] = {"gpuMemory", "oneSided"};
  const char* marks[2] = {"GPU memory (CUDA", "one-sided calls ("};
  for (int k = 0; k < 2; k++) {
    const char* line = NULL;
    for (int i = 0; i < r->nlog && !line; i++)
      if (strstr(r->log[i], marks[k])) line = r->log[i];
    const char* answer = line ? strstr(strstr(line, marks[k]), "): ") : NULL;
    char code[48] = "";
    int yes = answer && strncmp(answer + 3, "yes", 3) == 0;
    const char* open = answer ? strchr(answer, '[') : NULL;
    if (open) sscanf(open, "[%47[a-z_]]", code);
    printf("\"%s\": {\"available\": %s, ", keys[k], yes ? "true" : "false");
    json_str("code", line ? code : "not_reported", 1);
    json_str("detail", line ? line : "", 0);
    printf("}, ");
  }
}

static void json_list(const char* key, const char (*items)[64], int n) {
  printf("\"%s\": [", key);
  for (int i = 0; i < n; i++) printf("%s", i ? ", " : ""), json_value(items[i]);
  printf("], ");
}

static void print_json(const info_report* r, int failed) {
  printf("{");
  printf("\"schema\": 3, "); /* 2: versions, unknownSettings, ncclWouldNotUse; 3: devices, oneSided, gpuMemory {} */
  json_str("fabric_info_version", FAB_VERSION " (commit " FAB_COMMIT ")", 1);
  json_str("libfabric", r->fi_version, 1);
  json_list("providers", r->providers, r->nproviders);
  printf("\"settings\": [");
  for (int i = 0; i < r->nenv; i++) printf("%s", i ? ", " : ""), json_value(r->env[i]);
  printf("], \"unknownSettings\": [");
  for (int i = 0, k = 0; i < r->nenv; i++)
    if (r->env_unknown[i]) printf("%s", k++ ? ", " : ""), json_value(r->env[i]);
  printf("], \"ignoredSettings\": [");
  for (int i = 0, k = 0; i < r->nenv; i++)
    if (r->env_ignored[i][0]) printf("%s", k++ ? ", " : ""), json_value(r->env_ignored[i]);
  printf("], \"ncclWouldNotUse\": [");
  for (int i = 0; i < r->nnccl; i++) printf("%s", i ? ", " : ""), json_value(r->nccl[i]);
  printf("], ");
  json_str("plugin", r->plugin, 1);
  json_str("pluginFile", r->plugin_file, 1);
  json_str("loadError", r->load_error, 1);
  printf("\"tables\": [");
  for (int i = 0; i < r->ntables; i++) printf("%s", i ? ", " : ""), json_value(r->tables[i]);
  printf("], \"log\": [");
  for (int i = 0; i < r->nlog; i++) {
    printf("%s{\"level\": \"%s\", ", i ? ", " : "", r->log_level[i] == FAB_LOG_WARN ? "warn" : "info");
    json_str("text", r->log[i], 0);
    printf("}");
  }
  printf("], \"versions\": [");
  for (int i = 0; i < r->nversions; i++) printf("%s", i ? ", " : ""), json_devices(&r->versions[i]);
  printf("], ");
  json_facts(r);
  if (r->selftest_ran) {
    printf("\"selftest\": {\"ok\": %s, \"bytes\": %zu, \"seconds\": %.6f, ", r->selftest_ok ? "true" : "false",
           r->selftest_bytes, r->selftest_seconds);
    json_str("detail", r->selftest_detail, 0);
    printf("}, ");
  }
  printf("\"ok\": %s}\n", failed ? "false" : "true");
}

static int usage(const char* argv0, FILE* to, int status) {
  fprintf(to,
          "usage: %s [--json] [--selftest] [--bytes SIZE] [--timeout-ms N] [--profiles] [--plugin PATH] [--version]\n"
          "       [--help]\n"
          "  What the NCCL net plugin sees on this machine: libfabric and its providers, the settings that steer\n"
          "  the plugin, its exported tables, and every device as each exported net version reports it.\n"
          "  --selftest    also move SIZE bytes (default 64M) between two processes through the plugin's newest\n"
          "                net table and check every byte\n"
          "  --profiles    also what the plugin chooses (transport, one-sided calls) under each test-only NIC\n"
          "                profile (FABRIC_NIC_PROFILE: EFA's, verbs', cxi's limits imposed on this provider)\n"
          "  --plugin PATH the library (default: libnccl-net-fabric.so, found the way NCCL finds it)\n"
          "  --version     this tool's version and commit (the plugin's own is in its report: \"fabric x.y.z\")\n"
          "  Exit status 0: all is well; 1: something is wrong (the report says what); 2: bad command line.\n",
          argv0);
  return status;
}

/* Whether the loader finds name (as NCCL would dlopen it). */
static int loads(const char* name) {
  void* dl = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (dl) dlclose(dl);
  return dl != NULL;
}

/* NCCL_NET names the network NCCL must use: another name than ours, and NCCL
 * never selects this plugin, however the library was found. */
static void nccl_net_name(info_report* r) {
  const char* want = getenv("NCCL_NET");
  if (want && *want && strcasecmp(want, "Fabric") != 0)
    snprintf(r->nccl[r->nnccl++], INFO_LINE, "NCCL_NET=%s: NCCL selects only a plugin of that name; this one is "
             "named Fabric (NCCL_NET=Fabric, or unset it)", want);
}

/* The library NCCL (2.27 and later) would load for the net plugin, the way it
 * resolves NCCL_NET_PLUGIN: each comma-separated entry verbatim, then, with
 * no '/' and not of the form lib*.so, as libnccl-net-<entry>.so; unset:
 * libnccl-net.so; "none": no external plugin. Where NCCL would load none, or
 * NCCL_NET names another plugin, r->nccl says why, and this report shows
 * libnccl-net-fabric.so. */
static const char* nccl_plugin(info_report* r, char* buf, size_t len) {
  const char* fallback = "libnccl-net-fabric.so";
  const char* list = getenv("NCCL_NET_PLUGIN");
  if (!list || !*list) {
    if (loads("libnccl-net.so")) return "libnccl-net.so";
    snprintf(r->nccl[r->nnccl++], INFO_LINE, "NCCL_NET_PLUGIN is unset, so NCCL loads libnccl-net.so, which the "
             "loader does not find: set NCCL_NET_PLUGIN=fabric (this report shows %s)", fallback);
    return fallback;
  }
  if (!strcasecmp(list, "none")) {
    snprintf(r->nccl[r->nnccl++], INFO_LINE, "NCCL_NET_PLUGIN=none: NCCL loads no external plugin (this report shows "
             "%s)", fallback);
    return fallback;
  }
  for (const char* s = list; *s;) {
    size_t n = strcspn(s, ",");
    char entry[256];
    snprintf(entry, sizeof(entry), "%.*s", (int)(n < sizeof(entry) ? n : sizeof(entry) - 1), s);
    s += n + (s[n] == ',');
    if (!entry[0]) continue;
    if (loads(entry)) return snprintf(buf, len, "%s", entry), buf;
    size_t el = strlen(entry);
    int lib_so = !strncmp(entry, "lib", 3) && el > 6 && !strcmp(entry + el - 3, ".so");
    if (strchr(entry, '/') || lib_so) continue;
    snprintf(buf, len, "libnccl-net-%s.so", entry);
    if (loads(buf)) return buf;
  }
  snprintf(r->nccl[r->nnccl++], INFO_LINE, "NCCL_NET_PLUGIN=%s: the loader finds none of its entries (as names, or "
           "as libnccl-net-<name>.so), so NCCL uses its own transports (this report shows %s)", list, fallback);
  return fallback;
}

static int parse_size(const char* s, size_t* out) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  if (*end == 'K' || *end == 'k') v <<= 10, end++;
  else if (*end == 'M' || *end == 'm') v <<= 20, end++;
  else if (*end == 'G' || *end == 'g') v <<= 30, end++;
  if (*end || v == 0) return -1;
  *out = (size_t)v;
  return 0;
}

int main(int argc, char** argv) {
  int json = 0, selftest = 0, profiles = 0, timeout_ms = 60000;
  size_t bytes = (size_t)64 << 20;
  const char* plugin = NULL; /* --plugin: that file, as given; else the one NCCL would load */
  char nccl_name[300];
  static const struct option opts[] = {
      {"help", no_argument, NULL, 'h'},      {"version", no_argument, NULL, 'V'},
      {"json", no_argument, NULL, 'j'},      {"selftest", no_argument, NULL, 's'},
      {"plugin", required_argument, NULL, 'p'}, {"bytes", required_argument, NULL, 'b'},
      {"timeout-ms", required_argument, NULL, 't'}, {"profiles", no_argument, NULL, 'P'},
      {NULL, 0, NULL, 0}};
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    switch (c) {
      case 'h': return usage(argv[0], stdout, 0);
      case 'V': printf("fabric-info %s (commit %s)\n", FAB_VERSION, FAB_COMMIT); return 0;
      case 'j': json = 1; break;
      case 's': selftest = 1; break;
      case 'P': profiles = 1; break;
      case 'p': plugin = optarg; break;
      case 'b':
        if (parse_size(optarg, &bytes)) return usage(argv[0], stderr, 2);
        break;
      case 't':
        timeout_ms = atoi(optarg);
        if (timeout_ms <= 0) return usage(argv[0], stderr, 2);
        break;
      default: return usage(argv[0], stderr, 2);
    }
  }
  if (optind < argc) return usage(argv[0], stderr, 2);
  static info_report r; /* large: off the stack */
  nccl_net_name(&r);
  if (!plugin) plugin = nccl_plugin(&r, nccl_name, sizeof(nccl_name));
  int failed = info_probe(&r, plugin) != 0 || r.nnccl > 0; /* unknown FABRIC_ names are flagged, not failed */
  if (selftest && !r.load_error[0]) failed |= info_selftest(&r, plugin, bytes, timeout_ms) != 0;
  if (json) print_json(&r, failed);
  else print_text(&r, failed);
  if (profiles && !json && !r.load_error[0]) failed |= info_profiles(plugin) != 0;
  return failed ? 1 : 0;
}
