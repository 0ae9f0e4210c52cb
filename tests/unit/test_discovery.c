/* Device discovery and properties over real providers (tcp;ofi_rxm on lo,
 * shm), lifecycle (init/finalize reference counting), virtual devices. */
#define _GNU_SOURCE /* sched_setaffinity */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "fab_conn.h"
#include "fab_transport.h"
#include "fab_wire.h"
#include "rdma/rd_proto.h"
#include "unit_util.h"

static const fab_api* api = &fab_api_core;

static void check_props(int dev, const char* prov) {
  fab_properties p;
  cr_assert_eq(api->get_properties(dev, &p), FAB_OK);
  cr_assert_not_null(p.name);
  cr_assert_gt(strlen(p.name), 0);
  if (!strcmp(prov, "tcp")) cr_assert_str_eq(p.name, "lo", "FI_TCP_IFACE=lo selects the lo domain");
  cr_assert(p.ptr_support & FAB_PTR_HOST);
  cr_assert_eq(p.ptr_support & FAB_PTR_CUDA, 0, "no CUDA on this machine");
  cr_assert_eq(p.reg_is_global, 1);
  cr_assert_eq(p.force_flush, 0);
  cr_assert_gt(p.speed_mbps, 0);
  cr_assert_eq(p.max_recvs, FAB_MAX_RECVS);
  cr_assert_geq(p.max_comms, 256);
  cr_assert_eq(p.net_device_type, 0);
  cr_assert_eq(p.net_device_version, 0);
  cr_assert_eq(p.vprops.ndevs, 1);
  cr_assert_eq(p.vprops.devs[0], dev);
  cr_assert_gt(p.max_p2p_bytes, 0);
  cr_assert_leq(p.max_p2p_bytes, INT_MAX, "sizes are reported as int");
  cr_assert_gt(p.max_coll_bytes, 0);
  cr_assert_eq(p.max_multi_request_size, 1);
  cr_assert_eq(p.rail_id, -1);
  cr_assert_eq(p.plane_id, -1);
  cr_assert_neq(p.guid, 0);
}

static void discover(const char* prov) {
  ut_use_provider(prov);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  int n = 0;
  cr_assert_eq(api->devices(&n), FAB_OK);
  cr_assert_geq(n, 1);
  for (int i = 0; i < n; i++) check_props(i, prov);
  fab_properties a, b;
  api->get_properties(0, &a);
  char name[256];
  snprintf(name, sizeof(name), "%s", a.name); /* property strings live until the last finalize */
  /* The guid is a stable hash: a second engine incarnation reports the same. */
  cr_assert_eq(api->finalize(ctx), FAB_OK);
  cr_assert_eq(api->init(&ctx, 2, NULL, ut_logger, NULL), FAB_OK);
  api->get_properties(0, &b);
  cr_assert_eq(a.guid, b.guid);
  cr_assert_str_eq(name, b.name);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
  cr_assert_eq(ut_warns(), 0);
}

Test(discovery, tcp) { discover("tcp"); }
Test(discovery, shm) { discover("shm"); }

Test(discovery, max_p2p_param) {
  ut_use_provider("shm");
  setenv("FABRIC_MAX_P2P_BYTES", "1M", 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  fab_properties p;
  api->get_properties(0, &p);
  cr_assert_eq(p.max_p2p_bytes, 1 << 20);
  api->finalize(ctx);
}

/* Starts the engine and reads device 0's properties; the caller finalizes (p->name lives until then). */
static fab_ctx* init_dev0_props(fab_properties* p) {
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  api->get_properties(0, p);
  return ctx;
}

/* FABRIC_LINK_SPEED_MBPS replaces the speed a device reports (the provider's, the interface's on tcp, or 100 Gb/s
 * where neither has one). */
Test(discovery, link_speed_param) {
  ut_use_provider("shm");
  fab_properties p;
  fab_ctx* ctx = init_dev0_props(&p);
  cr_assert_eq(p.speed_mbps, 100000, "shm has no link speed: 100 Gb/s is reported");
  api->finalize(ctx);
  setenv("FABRIC_LINK_SPEED_MBPS", "10000", 1);
  ctx = init_dev0_props(&p);
  unsetenv("FABRIC_LINK_SPEED_MBPS");
  cr_assert_eq(p.speed_mbps, 10000);
  api->finalize(ctx);
}

/* tcp reports its interface's speed as NCCL's Socket transport reads it, so that NCCL tunes both alike:
 * loopback has none, and Socket says 10 Gb/s there (100 Gb/s had NCCL pick LL for 128 KiB all_reduce, Socket
 * Simple). */
Test(discovery, tcp_reports_the_interface_speed) {
  ut_use_provider("tcp");
  fab_properties p;
  fab_ctx* ctx = init_dev0_props(&p);
  cr_assert_str_eq(p.name, "lo");
  cr_assert_eq(p.speed_mbps, 10000, "loopback has no speed: NCCL Socket's 10 Gb/s, not %d", p.speed_mbps);
  api->finalize(ctx);
}

/* The sysfs speed file: Mb/s when positive; unreadable (loopback), -1 (virtual NICs) or junk is none. */
Test(discovery, interface_speed_file) {
  char path[] = "/tmp/fabric-speed-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  const char* cases[][2] = {{"25000\n", "25000"}, {"-1\n", "0"}, {"unknown\n", "0"}, {"", "0"}, {"400000", "400000"}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    cr_assert_eq(ftruncate(fd, 0), 0);
    cr_assert_eq(pwrite(fd, cases[i][0], strlen(cases[i][0]), 0), (ssize_t)strlen(cases[i][0]));
    cr_assert_eq(fab_iface_read_speed(path), atoi(cases[i][1]), "file '%s'", cases[i][0]);
  }
  close(fd);
  unlink(path);
  cr_assert_eq(fab_iface_read_speed(path), 0, "no file");
  cr_assert_eq(fab_iface_read_speed("/sys/class/net/lo/speed"), 0, "loopback's file fails to read");
}

/* FABRIC_NIC_RAILS=0 (the default): rails per NIC from the provider, the interfaces' speeds (0: unknown) and the
 * CPUs the process may run on, at most 8 over all NICs. */
Test(discovery, nic_rails_rule) {
  static const struct {
    int socket, cpus, nics, mbps[5], rails;
  } cases[] = {
      {0, 64, 1, {0}, 1},                         /* a NIC that moves the data itself */
      {1, 64, 1, {0}, 4},                         /* loopback, most virtual NICs: speed unknown */
      {1, 10, 1, {100000}, 4},                    /* 10 CPUs: four threads and the runtime's, twice over */
      {1, 9, 1, {0}, 2},                          /* */
      {1, 6, 1, {0}, 2},                          /* */
      {1, 5, 1, {0}, 1},                          /* */
      {1, 1, 1, {0}, 1},                          /* mpirun's default binding of two ranks */
      {1, 64, 1, {25000}, 1},                     /* one connection fills 25 Gb/s */
      {1, 64, 1, {40000}, 4},                     /* */
      {1, 64, 2, {25000, 10000}, 1},              /* every interface slow */
      {1, 64, 2, {25000, 0}, 4},                  /* one may be fast */
      {1, 64, 2, {100000, 100000}, 4},            /* 8 rails in all */
      {1, 64, 3, {0, 0, 0}, 2},                   /* 12 would not fit one fused device */
      {1, 64, 4, {0, 0, 0, 0}, 2},                /* */
      {1, 64, 5, {0, 0, 0, 0, 0}, 1},             /* */
  };
  for (size_t i = 0; i < FAB_ARRAY_SIZE(cases); i++) {
    char why[160] = "";
    int got = fab_nic_rails_rule(cases[i].socket, cases[i].cpus, cases[i].mbps, cases[i].nics, why, sizeof(why));
    cr_assert_eq(got, cases[i].rails, "case %zu: %d rails, expected %d (%s)", i, got, cases[i].rails, why);
    cr_assert_neq(why[0], 0, "case %zu says why", i);
  }
}

static void nic_rails_after_init(int* rails, int* chosen) {
  fab_properties p;
  fab_ctx* ctx = init_dev0_props(&p);
  cr_assert_str_eq(p.name, "lo", "the runtime sees the NIC, whatever its rails");
  cr_assert_eq(atomic_load(&fab_g.nview), 1);
  *rails = fab_g.nic_rails;
  *chosen = fab_g.nic_rails_auto;
  api->finalize(ctx);
}

/* FABRIC_NIC_RAILS=0, the default, follows the rule with this process's CPUs; bound to one CPU it keeps one
 * connection per NIC; another value is taken as it is, and its rails get threads only when FABRIC_RAIL_THREADS
 * asks. */
Test(discovery, nic_rails_default_follows_the_cpus) {
  ut_use_provider("tcp");
  cpu_set_t set;
  cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
  int cpus = CPU_COUNT(&set), expect = cpus >= 10 ? 4 : cpus >= 6 ? 2 : 1, rails, chosen;
  for (int set0 = 0; set0 < 2; set0++) {
    if (set0) setenv("FABRIC_NIC_RAILS", "0", 1);
    else unsetenv("FABRIC_NIC_RAILS");
    nic_rails_after_init(&rails, &chosen);
    cr_assert_eq(rails, expect, "%s, %d CPUs: %d rails, expected %d", set0 ? "0" : "unset", cpus, rails, expect);
    cr_assert_eq(chosen, expect > 1);
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set)) {
      CPU_SET(c, &one);
      break;
    }
  cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0);
  nic_rails_after_init(&rails, &chosen);
  cr_assert_eq(rails, 1, "bound to one CPU: %d rails", rails);
  cr_assert_eq(chosen, 0);
  setenv("FABRIC_NIC_RAILS", "2", 1);
  nic_rails_after_init(&rails, &chosen);
  unsetenv("FABRIC_NIC_RAILS");
  cr_assert_eq(rails, 2);
  cr_assert_eq(chosen, 0, "rails set by number are not the plugin's choice");
}

/* FABRIC_TAGGED_MAX, unset, is what the device's ofi_rxm sends as one
 * message: over tcp its eager limit, which the engine raises to
 * FABRIC_RXM_EAGER_LIMIT unless the environment sets FI_OFI_RXM_EAGER_LIMIT;
 * else rxm's buffer size. Each name=value sets (value NULL: unsets) a
 * variable for one engine start; the device's value, and what the engine
 * left in FI_OFI_RXM_EAGER_LIMIT, come back. */
static size_t tagged_max_with(const char* prov, const char* const* vars, char* rxm_env, size_t len) {
  static const char* const names[] = {"FI_OFI_RXM_BUFFER_SIZE", "FI_OFI_RXM_EAGER_LIMIT", "FABRIC_TAGGED_MAX",
                                      "FABRIC_RXM_EAGER_LIMIT", "FI_OFI_RXM_ENABLE_DIRECT_SEND", "FABRIC_TRANSPORT"};
  ut_use_provider(prov);
  for (const char* const* v = vars; *v; v += 2) {
    if (v[1]) setenv(v[0], v[1], 1);
    else unsetenv(v[0]);
  }
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  size_t got = fab_g.devs[0]->tagged_max;
  const char* e = getenv("FI_OFI_RXM_EAGER_LIMIT");
  snprintf(rxm_env, len, "%s", e ? e : "(unset)");
  api->finalize(ctx);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strcmp(names[i], "FI_OFI_RXM_EAGER_LIMIT")) unsetenv(names[i]); /* the engine's own setting stays */
  return got;
}

#define TMAX(prov, env, ...) tagged_max_with(prov, (const char* const[]){__VA_ARGS__, NULL}, env, sizeof(env))

Test(discovery, tagged_max_follows_rxm) {
  char env[32];
  unsetenv("FI_OFI_RXM_EAGER_LIMIT");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_TAGGED_MAX", NULL), 524288, "rxm over tcp, raised to FABRIC_RXM_EAGER_LIMIT");
  cr_assert_str_eq(env, "524288", "the engine raised rxm's eager limit");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_RXM_EAGER_LIMIT", "65536"), 65536, "a later start follows its parameter");
  cr_assert_str_eq(env, "65536");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_RXM_EAGER_LIMIT", "0"), 16384, "0: rxm's own, its buffer size");
  cr_assert_str_eq(env, "(unset)", "the engine took back its own setting");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_TAGGED_MAX", NULL), 524288);
  TMAX("tcp", env, "FABRIC_TRANSPORT", "sendrecv");
  cr_assert_str_eq(env, "(unset)", "sendrecv confirms no tagged message: rxm keeps its limit, whose rendezvous does");
  cr_assert_eq(TMAX("tcp", env, "FI_OFI_RXM_BUFFER_SIZE", "65536", "FABRIC_RXM_EAGER_LIMIT", "0"), 65536);
  cr_assert_eq(TMAX("tcp", env, "FI_OFI_RXM_EAGER_LIMIT", "131072"), 131072, "the user's rxm limit");
  cr_assert_str_eq(env, "131072", "the user's setting is kept");
  unsetenv("FI_OFI_RXM_EAGER_LIMIT");
  cr_assert_eq(TMAX("tcp", env, "FI_OFI_RXM_EAGER_LIMIT", "8388608"), 4194304, "capped at FABRIC_TAGGED_MAX's maximum");
  unsetenv("FI_OFI_RXM_EAGER_LIMIT");
  cr_assert_eq(TMAX("tcp", env, "FI_OFI_RXM_ENABLE_DIRECT_SEND", "0"), 16384, "rxm without direct sends ignores it");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_TAGGED_MAX", "4096"), 4096, "the user's FABRIC_TAGGED_MAX wins");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_RXM_EAGER_LIMIT", "64K"), 65536, "the parameter takes suffixes");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_RXM_EAGER_LIMIT", "0", "FI_OFI_RXM_BUFFER_SIZE", "64K"), 16384,
               "libfabric reads a plain number: 64K leaves rxm's default");
  cr_assert_eq(TMAX("shm", env, "FABRIC_TAGGED_MAX", NULL), 16384, "no rxm: the parameter's default");
  cr_assert_eq(TMAX("tcp", env, "FABRIC_NIC_PROFILE", "verbs"), 16384, "a NIC profile: that NIC's size");
  unsetenv("FABRIC_NIC_PROFILE");
}

/* libfabric 2.x's own tcp (provider "tcp", no rxm; 1.17 has none, so the
 * rule is asked directly): it sends every size at once, so the device sends
 * tagged up to FABRIC_RXM_EAGER_LIMIT, or what tcp keeps for a receive not
 * posted yet. */
static size_t native_tcp_tagged_max(const char* name, const char* value) {
  ut_use_provider("shm");
  setenv(name, value, 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  size_t got = fab_rxm_tagged_max("tcp");
  api->finalize(ctx);
  unsetenv(name);
  return got;
}

Test(discovery, tagged_max_on_tcp_without_rxm) {
  cr_assert_eq(native_tcp_tagged_max("FABRIC_UNIT_NOTHING", "1"), 524288, "FABRIC_RXM_EAGER_LIMIT's default");
  cr_assert_eq(native_tcp_tagged_max("FABRIC_RXM_EAGER_LIMIT", "1M"), 1048576);
  cr_assert_eq(native_tcp_tagged_max("FABRIC_RXM_EAGER_LIMIT", "0"), 16384, "0: FABRIC_TAGGED_MAX's default");
  cr_assert_eq(native_tcp_tagged_max("FI_TCP_MAX_SAVED_SIZE", "65536"), 65536, "tcp's own rendezvous size");
  cr_assert_eq(native_tcp_tagged_max("FABRIC_TAGGED_MAX", "4096"), 4096, "the user's FABRIC_TAGGED_MAX wins");
  cr_assert_eq(native_tcp_tagged_max("FABRIC_NIC_PROFILE", "efa"), 16384, "a NIC profile: that NIC's size");
}

/* The tcp devices' names (one init), and how many there are. */
static int tcp_devices(char names[][FAB_NAME_MAX], int cap) {
  setenv("FABRIC_PROVIDER", "tcp", 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  int n = 0;
  for (int i = 0; i < fab_g.nphys && n < cap; i++) snprintf(names[n++], FAB_NAME_MAX, "%s", fab_g.devs[i]->name);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
  return n;
}

static int named(char names[][FAB_NAME_MAX], int n, const char* name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return 1;
  return 0;
}

/* Without FI_TCP_IFACE, loopback is no NCCL device where another interface
 * exists (a multi-node job's channels could land on it); where it is the
 * only one, every peer is on this host and it stays. */
Test(discovery, tcp_leaves_loopback_out) {
  unsetenv("FI_TCP_IFACE");
  char all[16][FAB_NAME_MAX], some[16][FAB_NAME_MAX];
  setenv("FABRIC_EXCLUDE_IF", "", 1);
  int nall = tcp_devices(all, 16);
  cr_assert(named(all, nall, "lo"), "tcp offers loopback when nothing is excluded");
  unsetenv("FABRIC_EXCLUDE_IF");
  int nsome = tcp_devices(some, 16);
  if (nall == 1) {
    cr_expect(named(some, nsome, "lo"), "the only interface stays");
    return;
  }
  cr_expect(!named(some, nsome, "lo"), "loopback is left out by default");
  cr_expect_eq(nsome, nall - 1, "only loopback is left out");
}

/* FI_TCP_IFACE is the user's choice: it is honoured as given. */
Test(discovery, tcp_iface_chooses_loopback) {
  setenv("FI_TCP_IFACE", "lo", 1);
  unsetenv("FABRIC_EXCLUDE_IF");
  char names[16][FAB_NAME_MAX];
  int n = tcp_devices(names, 16);
  cr_expect(n == 1 && named(names, n, "lo"));
}

Test(discovery, unknown_provider_fails_with_one_warn) {
  ut_use_provider("no-such-provider");
  fab_ctx* ctx = (fab_ctx*)0x1234;
  cr_assert_neq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_assert_null(ctx);
  cr_assert_eq(ut_warns(), 1, "exactly one WARN for the failed init");
  int n = 7;
  cr_assert_neq(api->devices(&n), FAB_OK, "devices before a successful init");
  cr_assert_eq(n, 0);
  /* The next init with a good provider works: nothing stuck half-up. */
  ut_use_provider("shm");
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

Test(lifecycle, refcount_and_process_context) {
  ut_use_provider("shm");
  fab_ctx *a, *b;
  cr_assert_eq(api->init(&a, 1, NULL, ut_logger, NULL), FAB_OK);
  fab_comm_config cfg = {.traffic_class = 3};
  cr_assert_eq(api->init(&b, 2, &cfg, ut_logger, NULL), FAB_OK);
  cr_assert_neq(a, b, "one context per communicator");
  cr_assert_eq(api->finalize(a), FAB_OK);
  int n;
  cr_assert_eq(api->devices(&n), FAB_OK, "still up while b lives");
  ut_reset_warns();
  cr_assert_neq(api->finalize(a), FAB_OK, "double finalize");
  cr_assert_eq(ut_warns(), 1);
  cr_assert_eq(api->finalize(b), FAB_OK);
  cr_assert_neq(api->devices(&n), FAB_OK, "down after the last finalize");
  /* The process context (net v10 and older) keeps the engine up. */
  cr_assert_eq(fab_init_process(ut_logger, NULL), FAB_OK);
  cr_assert_eq(fab_init_process(ut_logger, NULL), FAB_OK, "idempotent");
  cr_assert_eq(api->init(&a, 3, NULL, ut_logger, NULL), FAB_OK);
  cr_assert_eq(api->finalize(a), FAB_OK);
  cr_assert_eq(api->devices(&n), FAB_OK, "the process context lives until unload");
  unsigned char h[FAB_HANDLE_SIZE];
  void* l;
  cr_assert_eq(api->listen(NULL, 0, h, &l), FAB_OK, "NULL ctx = the process context");
  cr_assert_eq(api->close_listen(l), FAB_OK);
}

Test(lifecycle, calls_before_init) {
  unsigned char h[FAB_HANDLE_SIZE];
  void* l = (void*)0x99;
  cr_assert_neq(api->listen(NULL, 0, h, &l), FAB_OK);
  cr_assert_null(l, "outputs are written on failure too");
  fab_properties p;
  cr_assert_neq(api->get_properties(0, &p), FAB_OK);
}

/* Hardening 9: a send comm closed with a send its receiver never takes. On
 * an intra-host provider such a comm has its own endpoint (and shared-memory
 * region), which retires until the send completes; it used to retire for as
 * long as the process lived (142 regions and 795 MB after 600 rounds). After
 * FABRIC_PEER_TIMEOUT_MS it goes. */
static void connect_pair(fab_ctx* ctx, void* l, const unsigned char* h, void** s, void** r) {
  *s = *r = NULL;
  for (int64_t end = ut_now_ms() + 20000; !*s || !*r;) {
    cr_assert_lt(ut_now_ms(), end, "loopback connect timed out");
    if (!*s) cr_assert_eq(api->connect(ctx, 0, NULL, (void*)h, s, NULL), FAB_OK);
    if (!*r) cr_assert_eq(api->accept(l, r, NULL), FAB_OK);
  }
}

Test(lifecycle, untaken_sends_do_not_pin_endpoints) {
  enum { ROUNDS = 5, LEN = 1 << 20 };
  ut_use_provider("shm");
  setenv("FABRIC_TRANSPORT", "sendrecv", 1);
  setenv("FABRIC_PEER_TIMEOUT_MS", "300", 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  unsigned char h[FAB_HANDLE_SIZE];
  void *l, *s0, *r0;
  cr_assert_eq(api->listen(ctx, 0, h, &l), FAB_OK);
  connect_pair(ctx, l, h, &s0, &r0); /* the shared endpoint's comm pair: its tests drive progress */
  char* buf = malloc(LEN);
  memset(buf, 7, LEN);
  fab_endpoint* home = fab_g.eps[0];
  for (int i = 0; i < ROUNDS; i++) {
    void *s1, *r1, *mh, *q = NULL;
    connect_pair(ctx, l, h, &s1, &r1);
    cr_assert_not_null(((fab_comm*)fab_obj_get(s1, FAB_OBJ_SEND))->home, "a second send comm to one peer has its own endpoint");
    cr_assert_eq(api->reg_mr(s1, buf, LEN, FAB_PTR_HOST, &mh), FAB_OK);
    while (!q) cr_assert_eq(api->isend(s1, buf, LEN, 5, mh, NULL, &q), FAB_OK);
    cr_assert_eq(api->dereg_mr(s1, mh), FAB_OK);
    cr_assert_eq(api->close_send(s1), FAB_OK); /* its send is never received */
    cr_assert_eq(api->close_recv(r1), FAB_OK);
  }
  pthread_mutex_lock(&home->lock);
  int retiring = home->nprivates == 0 && !fab_list_empty(&home->privates);
  pthread_mutex_unlock(&home->lock);
  cr_assert(retiring, "the closed comms' own endpoints retire while their sends are pending");
  /* the shared endpoint's progress, well past the timeout */
  void *rmh, *rq = NULL;
  cr_assert_eq(api->reg_mr(r0, buf, 64, FAB_PTR_HOST, &rmh), FAB_OK);
  void* d = buf;
  size_t len = 64;
  int tag = 9;
  while (!rq) cr_assert_eq(api->irecv(r0, 1, &d, &len, &tag, &rmh, NULL, &rq), FAB_OK);
  int empty = 0;
  for (int64_t end = ut_now_ms() + 3000; !empty && ut_now_ms() < end;) {
    int done = 0;
    cr_assert_eq(api->test(rq, &done, NULL), FAB_OK);
    pthread_mutex_lock(&home->lock);
    empty = fab_list_empty(&home->privates);
    pthread_mutex_unlock(&home->lock);
  }
  cr_assert(empty, "own endpoints of closed comms whose sends were never taken are still there after %d ms",
            3000);
  cr_assert_eq(api->dereg_mr(r0, rmh), FAB_OK);
  cr_assert_eq(api->close_send(s0), FAB_OK);
  cr_assert_eq(api->close_recv(r0), FAB_OK);
  cr_assert_eq(api->close_listen(l), FAB_OK);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
  free(buf);
}

Test(vdevice, make_and_validate) {
  ut_use_provider("tcp");
  setenv("FABRIC_RAILS", "2", 1); /* every device twice: at least two devices to fuse */
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  int n;
  api->devices(&n);
  fab_vdevice_props bad = {.ndevs = 1, .devs = {0}};
  int d = -1;
  ut_reset_warns();
  cr_assert_neq(api->make_vdevice(&d, &bad), FAB_OK, "one device is not a fusion");
  bad.ndevs = 9;
  cr_assert_neq(api->make_vdevice(&d, &bad), FAB_OK);
  bad = (fab_vdevice_props){.ndevs = 2, .devs = {0, 0}};
  cr_assert_neq(api->make_vdevice(&d, &bad), FAB_OK, "duplicate member");
  bad = (fab_vdevice_props){.ndevs = 2, .devs = {0, n}};
  cr_assert_neq(api->make_vdevice(&d, &bad), FAB_OK, "member out of range");
  cr_assert_eq(ut_warns(), 4, "one WARN per rejected call");
  cr_assert_geq(n, 2, "FABRIC_RAILS=2 lists every device twice");
  fab_vdevice_props vp = {.ndevs = 2, .devs = {1, 0}};
  cr_assert_eq(api->make_vdevice(&d, &vp), FAB_OK);
  cr_assert_eq(d, n, "appended after the physical devices");
  int n2;
  api->devices(&n2);
  cr_assert_eq(n2, n + 1);
  fab_properties p, p1;
  api->get_properties(d, &p);
  api->get_properties(1, &p1);
  cr_assert_eq(p.vprops.ndevs, 2);
  cr_assert_eq(p.vprops.devs[0], 1);
  cr_assert_eq(p.vprops.devs[1], 0);
  fab_properties p0;
  api->get_properties(0, &p0);
  cr_assert_eq(p.speed_mbps, p1.speed_mbps + p0.speed_mbps, "one rail per member: the members' speeds add up");
  cr_assert_eq(p.max_recvs, FAB_MAX_RECVS);
  cr_assert_eq(p.guid, p1.guid, "the first member's guid, as NCCL's fused IB devices");
  cr_assert(strstr(p.name, "+") != NULL);
  vp.devs[0] = d; /* a virtual device cannot be a member */
  cr_assert_neq(api->make_vdevice(&d, &vp), FAB_OK);
  /* A connection over the virtual device (to itself, one process). */
  unsigned char h[FAB_HANDLE_SIZE];
  void *l, *s = NULL, *r = NULL;
  cr_assert_eq(api->listen(ctx, n, h, &l), FAB_OK);
  for (int i = 0; i < 100000 && (!s || !r); i++) {
    if (!s) cr_assert_eq(api->connect(ctx, n, NULL, h, &s, NULL), FAB_OK);
    if (!r) cr_assert_eq(api->accept(l, &r, NULL), FAB_OK);
  }
  cr_assert(s && r);
  api->close_send(s);
  api->close_recv(r);
  api->close_listen(l);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

/* A listener and a hostile peer's control messages to it: the listener's
 * own endpoint sends them to itself (into its untagged control receives),
 * as a peer that knows the handle could. */
typedef struct raw_listener {
  fab_ctx* ctx;
  void* l;
  unsigned char h[FAB_HANDLE_SIZE];
  fab_wire_handle wh;
  fab_endpoint* ep;
} raw_listener;

static void raw_listen(raw_listener* x, const char* transport) {
  ut_use_provider("tcp");
  setenv("FABRIC_TRANSPORT", transport, 1);
  cr_assert_eq(api->init(&x->ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_assert_eq(api->listen(x->ctx, 0, x->h, &x->l), FAB_OK);
  char why[160];
  cr_assert_eq(fab_wire_handle_decode(x->h, &x->wh, why, sizeof(why)), 0, "%s", why);
  x->ep = ((fab_listener*)fab_obj_get(x->l, FAB_OBJ_LISTEN))->ep;
}

static void raw_sent(fab_op* op, const fab_cqe* done, const struct fi_cq_err_entry* err) { ++*(int*)op->owner; }

/* Sends n messages of len bytes each (consecutive at bufs) and waits until
 * every one has left. */
static void raw_send_to_self(raw_listener* x, const void* bufs, size_t len, int n) {
  fab_endpoint* ep = x->ep;
  fi_addr_t self;
  struct fid_mr* mr = NULL;
  void* desc = NULL;
  int sent = 0;
  fab_op* ops = calloc((size_t)n, sizeof(*ops));
  cr_assert_not_null(ops);
  pthread_mutex_lock(&ep->lock);
  cr_assert_eq(fab_ep_av_insert(ep, x->wh.addr, x->wh.addr_len, &self), 0);
  cr_assert_eq(fab_ep_ctrl_reg(ep, (void*)bufs, len * (size_t)n, &mr, &desc), 0);
  for (int i = 0; i < n; i++) {
    fab_op_init(&ops[i], raw_sent, &sent, 0);
    ssize_t rc;
    while ((rc = fi_send(ep->ep, (const char*)bufs + len * (size_t)i, len, desc, self, &ops[i].ctx)) == -FI_EAGAIN)
      fab_ep_progress_locked(ep);
    cr_assert_eq(rc, 0);
  }
  for (int64_t end = ut_now_ms() + 10000; sent < n && ut_now_ms() < end;) fab_ep_progress_locked(ep);
  cr_assert_eq(sent, n, "%d of %d raw control messages left", sent, n);
  fab_ep_ctrl_dereg(mr);
  pthread_mutex_unlock(&ep->lock);
  free(ops);
}

static void raw_close(raw_listener* x, void* s, void* r) {
  cr_assert_eq(api->close_send(s), FAB_OK);
  cr_assert_eq(api->close_recv(r), FAB_OK);
  cr_assert_eq(api->close_listen(x->l), FAB_OK);
  cr_assert_eq(api->finalize(x->ctx), FAB_OK);
}

/* Issue 26 item 5: a connect request with a valid checksum and the real
 * listen id, but a connector address nothing answers at, reaches the
 * listener ahead of a real one. The listener must give the forged one up
 * with one WARN and accept the real connector in time. */
static void forged_connect_unreachable(const char* transport) {
  raw_listener x;
  raw_listen(&x, transport);
  /* 127.0.0.1 on a port nobody listens at: every connect() is refused */
  struct sockaddr_in nobody = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  fab_wire_tp tp = {.comm_id = 7, .transport = x.ep->dev->ops->id};
  if (x.ep->dev->ops->connect_payload) { /* rdma: a plausible mailbox */
    rd_hello hello = {.box_addr = 0x10000, .box_key = 1, .box_slots = RD_SLOTS};
    memcpy(tp.data, &hello, sizeof(hello));
    tp.len = sizeof(hello);
  }
  static fab_wire_connect forged;
  fab_wire_connect_encode(&forged, x.wh.listen_id, 4242, &nobody, sizeof(nobody), &tp, 1, 0, 0);
  raw_send_to_self(&x, &forged, sizeof(forged), 1);
  ut_reset_warns();
  void *s = NULL, *r = NULL;
  int64_t t0 = ut_now_ms();
  while ((!s || !r) && ut_now_ms() - t0 < 30000) {
    if (!s) cr_assert_eq(api->connect(x.ctx, 0, NULL, x.h, &s, NULL), FAB_OK);
    if (!r) cr_assert_eq(api->accept(x.l, &r, NULL), FAB_OK);
  }
  cr_assert(s && r, "a real connect behind a forged request from an unreachable address was not accepted in %d ms",
            (int)(ut_now_ms() - t0));
  cr_assert_eq(ut_warns(), 1, "one WARN for the forged request, got %d", ut_warns());
  raw_close(&x, s, r);
}

Test(lifecycle, forged_connect_unreachable_sendrecv, .timeout = 90) { forged_connect_unreachable("sendrecv"); }
Test(lifecycle, forged_connect_unreachable_rdma, .timeout = 90) { forged_connect_unreachable("rdma"); }

/* Issue 26 item 12: a flood of malformed control messages costs one WARN
 * per second on the endpoint, not one each, and the listener still works. */
Test(lifecycle, malformed_control_flood, .timeout = 60) {
  enum { N = 40 };
  raw_listener x;
  raw_listen(&x, "sendrecv");
  static unsigned char junk[N][sizeof(fab_wire_connect)];
  srand(26);
  for (int i = 0; i < N; i++)
    for (size_t k = 0; k < sizeof(junk[i]); k++) junk[i][k] = (unsigned char)rand();
  ut_reset_warns();
  raw_send_to_self(&x, junk, sizeof(junk[0]), N);
  void *s, *r;
  connect_pair(x.ctx, x.l, x.h, &s, &r); /* progresses the endpoint: every junk message is read before the answer */
  cr_assert(ut_warns() >= 1 && ut_warns() <= 2, "%d malformed control messages logged %d WARN lines, want 1 or 2",
            N, ut_warns());
  raw_close(&x, s, r);
}
