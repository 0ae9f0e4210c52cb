/*
 * Comms over several rails (core/rails/fab_rails.h). FABRIC_RAILS=4 (set here
 * before init) lists every device four times, each copy with its own domain
 * and endpoint; makeVDevice fuses 2 or 4 copies of device 0 into a device
 * whose comms run one rail per member. Through every table with makeVDevice
 * (net v9+) and the core, on both providers and transports; tables without
 * it check that the copies are devices of their own.
 */
#define _GNU_SOURCE /* sched_setaffinity */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_prof.h"
#include "ft_criterion.h"

enum { T_MS = 30000, COPIES = 4, NTAGS = 5, PER_TAG = 6 };

static int g_rails_seen; /* bit per rail that carried a started event */

static fab_result note_rail(void** eh, int type, void* phandle, int64_t id, void* ext) {
  if (type == FAB_PROF_START && ext) g_rails_seen |= 1 << ((const fab_prof_event_v1*)ext)->rail;
  if (eh && type == FAB_PROF_START) *eh = NULL; /* declined: no stop follows */
  return FAB_OK;
}

/* Opens the side with FABRIC_RAILS=COPIES; returns how many devices the
 * provider itself has (the copies of device d are d + k * that). */
static int open_with_copies(ft_side* s, ft_peer* peer) {
  setenv("FABRIC_RAILS", "4", 1);
  ft_side_open(s, peer, ft_api_selected());
  int whole = s->ndev / COPIES * COPIES == s->ndev;
  FT_CHECK(whole, "%d devices with FABRIC_RAILS=%d: expected a multiple", s->ndev, COPIES);
  return s->ndev / COPIES;
}

/* The virtual device fusing the first n copies of device 0. */
static int fuse(ft_side* s, int nphys, int n) {
  fab_vdevice_props vp = {.ndevs = n};
  for (int k = 0; k < n; k++) vp.devs[k] = k * nphys;
  int d = -1;
  FT_OK(s->api->make_vdevice(&d, &vp));
  fab_properties p, m;
  FT_OK(s->api->get_properties(d, &p));
  FT_OK(s->api->get_properties(0, &m));
  FT_CHECK(p.speed_mbps == n * m.speed_mbps, "a device of %d rails reports %d Mb/s, its member %d", n, p.speed_mbps,
           m.speed_mbps);
  FT_CHECK(p.guid == m.guid, "the fused device's guid is its first member's (as NCCL's fused IB devices)");
  return d;
}

/* Opens the side, fuses n copies and connects both ways. 0 (the side
 * closed again) where this table cannot: no makeVDevice, or a core-only case
 * run through a table. */
static int open_fused_conns(ft_side* s, ft_peer* peer, ft_conn* c, int nconns, int n, int core_only) {
  int nphys = open_with_copies(s, peer);
  if ((core_only && ft_api_selected() != FT_API_CORE) || !s->api->make_vdevice) {
    ft_side_close(s);
    return 0;
  }
  s->dev = fuse(s, nphys, n);
  FT_OK(s->api->get_properties(s->dev, &s->props));
  ft_connect_all(s, c, nconns, T_MS);
  return 1;
}
static int open_fused(ft_side* s, ft_peer* peer, ft_conn* c, int n, int core_only) {
  return open_fused_conns(s, peer, c, 1, n, core_only);
}

/* Posts with a parent handle, as NCCL does (the profiler events name the
 * rail), retrying while the plugin returns no request. */
static char g_ph;
static void* post_send(ft_side* s, void* comm, void* data, size_t len, int tag, void* mh) {
  void* r = NULL;
  for (int64_t end = ft_now_ms() + T_MS; !r && ft_now_ms() < end;)
    FT_OK(s->api->isend(comm, data, len, tag, mh, &g_ph, &r));
  FT_CHECK(r != NULL, "isend gave no request for %d ms", T_MS);
  return r;
}

static void* post_recv(ft_side* s, void* comm, int n, void** data, size_t* cap, int* tags, void** mhs) {
  void* phs[FAB_MAX_RECVS] = {&g_ph, &g_ph, &g_ph, &g_ph, &g_ph, &g_ph, &g_ph, &g_ph};
  void* r = NULL;
  for (int64_t end = ft_now_ms() + T_MS; !r && ft_now_ms() < end;)
    FT_OK(s->api->irecv(comm, n, data, cap, tags, mhs, phs, &r));
  FT_CHECK(r != NULL, "irecv gave no request for %d ms", T_MS);
  return r;
}

/* PER_TAG messages on each of NTAGS tags both ways, sizes cycling through
 * 0 B .. 1 MiB, posted a tag's worth at a time; every byte checked. */
static void stream(ft_side* s, ft_conn* c) {
  static const size_t sizes[] = {0, 1, 4096, 65539, 1 << 20, 8};
  enum { N = NTAGS * PER_TAG, MAX = 1 << 20 };
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, (size_t)N * MAX);
  ft_mr_alloc(s, &rm, c->recv_comm, (size_t)N * MAX);
  void* reqs[2 * N];
  int nreq = 0;
  for (int k = 0; k < PER_TAG; k++) {
    for (int t = 0; t < NTAGS; t++) {
      int i = k * NTAGS + t;
      char* sb = (char*)sm.buf + (size_t)i * MAX;
      char* rb = (char*)rm.buf + (size_t)i * MAX;
      size_t len = sizes[(k + t) % 6];
      ft_fill(sb, len, 1000 + (uint64_t)i);
      size_t cap = MAX;
      int tag = 100 + t;
      reqs[nreq++] = post_recv(s, c->recv_comm, 1, (void**)&rb, &cap, &tag, &rm.mh);
      reqs[nreq++] = post_send(s, c->send_comm, sb, len, tag, sm.mh);
    }
  }
  int got[2 * N][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, nreq, &got[0][0], FAB_MAX_RECVS, T_MS, "a stream over rails");
  for (int k = 0; k < PER_TAG; k++) {
    for (int t = 0; t < NTAGS; t++) {
      int i = k * NTAGS + t;
      size_t len = sizes[(k + t) % 6];
      FT_CHECK(got[2 * i][0] == (int)len, "message %d of tag %d: %d bytes received, %zu sent", k, 100 + t,
               got[2 * i][0], len);
      ft_verify_or_fail((char*)rm.buf + (size_t)i * MAX, len, 1000 + (uint64_t)i, "a message over rails");
    }
  }
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}

/* A grouped receive of three tags, which fall on different rails; twice,
 * so the second lands on others again. */
static void grouped(ft_side* s, ft_conn* c) {
  if (s->props.max_recvs < 3) return;
  enum { LEN = 300000 };
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, 3 * LEN);
  ft_mr_alloc(s, &rm, c->recv_comm, 3 * LEN);
  for (int round = 0; round < 2; round++) {
    void* d[3];
    size_t cap[3];
    int tags[3] = {7, 8, 9};
    void* mhs[3] = {rm.mh, rm.mh, rm.mh};
    void* reqs[4];
    for (int i = 0; i < 3; i++) {
      d[i] = (char*)rm.buf + (size_t)i * LEN;
      cap[i] = LEN;
      ft_fill((char*)sm.buf + (size_t)i * LEN, LEN - (size_t)i, 50 + (uint64_t)(round * 3 + i));
    }
    reqs[0] = post_recv(s, c->recv_comm, 3, d, cap, tags, mhs);
    for (int i = 0; i < 3; i++)
      reqs[1 + i] = post_send(s, c->send_comm, (char*)sm.buf + (size_t)i * LEN, LEN - (size_t)i, tags[i], sm.mh);
    int got[4][FAB_MAX_RECVS];
    ft_wait_all(s, reqs, 4, &got[0][0], FAB_MAX_RECVS, T_MS, "a grouped receive over rails");
    for (int i = 0; i < 3; i++) {
      FT_CHECK(got[0][i] == LEN - i, "buffer %d of the grouped receive: %d bytes, expected %d", i, got[0][i], LEN - i);
      ft_verify_or_fail(d[i], LEN - (size_t)i, 50 + (uint64_t)(round * 3 + i), "a grouped receive over rails");
    }
  }
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}

FT_PAIR_TEST(rails_transfers, 120) {
  ft_side s;
  int nphys = open_with_copies(&s, peer);
  int profiled = ft_net_since(&s.lib, 10);
  fab_ctx* ctx2 = NULL;
  if (profiled) FT_OK(s.api->init(&ctx2, 0x7a11, &s.config, ft_logger, note_rail));
  if (!s.api->make_vdevice) { /* no fused devices before net v9: a copy is a device of its own */
    s.dev = nphys;
    ft_conn c;
    ft_connect_all(&s, &c, 1, T_MS);
    stream(&s, &c);
    ft_sync(peer, "copy", T_MS);
    ft_close_all(&s, &c, 1);
  }
  for (int n = 2; s.api->make_vdevice && n <= COPIES; n += 2) {
    s.dev = fuse(&s, nphys, n);
    FT_OK(s.api->get_properties(s.dev, &s.props));
    ft_conn c;
    ft_connect_all(&s, &c, 1, T_MS);
    g_rails_seen = 0;
    stream(&s, &c);
    grouped(&s, &c);
    if (profiled)
      FT_CHECK(g_rails_seen == (1 << n) - 1, "the operations ran on rails 0x%x of a device of %d", g_rails_seen, n);
    ft_sync(peer, "rails", T_MS);
    ft_close_all(&s, &c, 1);
  }
  if (ctx2 && s.api->finalize) FT_OK(s.api->finalize(ctx2));
  ft_side_close(&s);
}

/* FABRIC_NIC_RAILS=4: the runtime sees the devices it would see without it,
 * with the same name, PCI path, speed and guid, each one NIC as NCCL counts
 * (vProps: itself), while a comm on one carries its messages over four
 * rails, each with its own endpoint and connection: every byte checked, and
 * through the profiler events every rail seen carrying traffic. */
static int same_str(const char* a, const char* b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

FT_PAIR_TEST(rails_nic, 120) {
  ft_side s;
  ft_side_open(&s, peer, ft_api_selected());
  int ndev = s.ndev;
  fab_properties one = s.props;
  char name[FAB_NAME_MAX], pci[FAB_NAME_MAX];
  snprintf(name, sizeof name, "%s", one.name ? one.name : "");
  snprintf(pci, sizeof pci, "%s", one.pci_path ? one.pci_path : "");
  ft_side_close(&s);
  setenv("FABRIC_NIC_RAILS", "4", 1);
  ft_side_open(&s, peer, ft_api_selected());
  FT_CHECK(s.ndev == ndev, "FABRIC_NIC_RAILS=4: %d devices, %d without it", s.ndev, ndev);
  FT_CHECK(same_str(s.props.name, name) && same_str(s.props.pci_path, one.pci_path ? pci : NULL),
           "device 0 is %s at %s, and %s at %s without FABRIC_NIC_RAILS", s.props.name,
           s.props.pci_path ? s.props.pci_path : "(none)", name, one.pci_path ? pci : "(none)");
  FT_CHECK(s.props.speed_mbps == one.speed_mbps && s.props.guid == one.guid,
           "device 0 reports %d Mb/s and guid %llx; %d and %llx without FABRIC_NIC_RAILS", s.props.speed_mbps,
           (unsigned long long)s.props.guid, one.speed_mbps, (unsigned long long)one.guid);
  if (s.api->make_vdevice)
    FT_CHECK(s.props.vprops.ndevs == 1 && s.props.vprops.devs[0] == 0, "device 0's vProps: %d devices, first %d",
             s.props.vprops.ndevs, s.props.vprops.devs[0]);
  int profiled = ft_net_since(&s.lib, 10);
  fab_ctx* ctx2 = NULL;
  if (profiled) FT_OK(s.api->init(&ctx2, 0x7a12, &s.config, ft_logger, note_rail));
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  g_rails_seen = 0;
  stream(&s, &c);
  grouped(&s, &c);
  if (profiled) FT_CHECK(g_rails_seen == 0xf, "the operations ran on rails 0x%x of a NIC of 4", g_rails_seen);
  ft_sync(peer, "nic rails", T_MS);
  ft_close_all(&s, &c, 1);
  if (ctx2 && s.api->finalize) FT_OK(s.api->finalize(ctx2));
  ft_side_close(&s);
}

/* --- stripes ------------------------------------------------------------------
 * Each rank sends with its own FABRIC_STRIPE_THRESHOLD (parent 64 KiB, child
 * 512 KiB): a receiver must use its sender's, which the handshake carries.
 * Sizes around the threshold and far above it, into buffers of exactly
 * their size and into larger ones; then a grouped receive mixing split and
 * whole messages. Every byte and every size checked. */
enum { STRIPE_PARENT = 64 << 10, STRIPE_CHILD = 512 << 10, STRIPE_CAP = 8 << 20, NSTRIPED = 7 };

static size_t striped_size(size_t thr, int i) {
  const size_t sizes[NSTRIPED] = {thr - 1, thr, thr + 1, 3 * thr + 5, (4 << 20) + 3, 1, 0};
  return sizes[i];
}

static int count_split(size_t thr) {
  int n = 0;
  for (int i = 0; i < NSTRIPED; i++) n += striped_size(thr, i) >= thr;
  return n;
}

#ifdef FT_WITH_CORE
#include "fab_rails.h"
/* The splits the core sent on this comm (the white-box half of the check:
 * the bytes alone would also arrive whole). */
static int splits_sent(void* send_comm) {
  if (ft_api_selected() != FT_API_CORE) return -1;
  fab_rails_comm* rc = fab_obj_get(send_comm, FAB_OBJ_RAILS_SEND);
  return rc && rc->stripes ? rc->stripes->next_seq : 0;
}
#else
static int splits_sent(void* send_comm) {
  (void)send_comm;
  return -1;
}
#endif

static void stripes_stream(ft_side* s, ft_conn* c, size_t mine, size_t theirs) {
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, (size_t)NSTRIPED * STRIPE_CAP);
  ft_mr_alloc(s, &rm, c->recv_comm, (size_t)NSTRIPED * STRIPE_CAP);
  void* reqs[2 * NSTRIPED];
  int splits_before = splits_sent(c->send_comm);
  for (int i = 0; i < NSTRIPED; i++) {
    char* rb = (char*)rm.buf + (size_t)i * STRIPE_CAP;
    size_t cap = i % 2 ? STRIPE_CAP : striped_size(theirs, i); /* exact, or larger than the message */
    int tag = 30 + i % 3;
    reqs[2 * i] = post_recv(s, c->recv_comm, 1, (void**)&rb, &cap, &tag, &rm.mh);
    char* sb = (char*)sm.buf + (size_t)i * STRIPE_CAP;
    ft_fill(sb, striped_size(mine, i), 7000 + (uint64_t)i);
    reqs[2 * i + 1] = post_send(s, c->send_comm, sb, striped_size(mine, i), tag, sm.mh);
  }
  int got[2 * NSTRIPED][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, 2 * NSTRIPED, &got[0][0], FAB_MAX_RECVS, T_MS, "messages split over rails");
  for (int i = 0; i < NSTRIPED; i++) {
    FT_CHECK(got[2 * i][0] == (int)striped_size(theirs, i), "message %d: %d bytes received, %zu sent", i, got[2 * i][0],
             striped_size(theirs, i));
    ft_verify_or_fail((char*)rm.buf + (size_t)i * STRIPE_CAP, striped_size(theirs, i), 7000 + (uint64_t)i,
                      "a message split over rails");
  }
  int splits = splits_before < 0 ? -1 : splits_sent(c->send_comm) - splits_before;
  FT_CHECK(splits < 0 || splits == count_split(mine), "%d sends were split over the rails, expected %d", splits,
           count_split(mine));
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}

static void stripes_grouped(ft_side* s, ft_conn* c, size_t mine, size_t theirs) {
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, 3 * (size_t)STRIPE_CAP);
  ft_mr_alloc(s, &rm, c->recv_comm, 3 * (size_t)STRIPE_CAP);
  int tags[3] = {40, 41, 42};
  void* d[3];
  size_t cap[3], len[3], their_len[3];
  void* mhs[3] = {rm.mh, rm.mh, rm.mh};
  void* reqs[4];
  for (int i = 0; i < 3; i++) {
    len[i] = i == 1 ? 100 : (i + 1) * mine + 7; /* split, whole, split */
    their_len[i] = i == 1 ? 100 : (i + 1) * theirs + 7;
    d[i] = (char*)rm.buf + (size_t)i * STRIPE_CAP;
    cap[i] = STRIPE_CAP;
    ft_fill((char*)sm.buf + (size_t)i * STRIPE_CAP, len[i], 8000 + (uint64_t)i);
  }
  reqs[0] = post_recv(s, c->recv_comm, 3, d, cap, tags, mhs);
  for (int i = 0; i < 3; i++)
    reqs[1 + i] = post_send(s, c->send_comm, (char*)sm.buf + (size_t)i * STRIPE_CAP, len[i], tags[i], sm.mh);
  int got[4][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, 4, &got[0][0], FAB_MAX_RECVS, T_MS, "a grouped receive of split messages");
  for (int i = 0; i < 3; i++) {
    FT_CHECK(got[0][i] == (int)their_len[i], "buffer %d: %d bytes, expected %zu", i, got[0][i], their_len[i]);
    ft_verify_or_fail(d[i], their_len[i], 8000 + (uint64_t)i, "a grouped receive of split messages");
  }
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}

FT_PAIR_TEST(rails_stripes, 120) {
  int parent = ft_role() == FT_PARENT;
  size_t mine = parent ? STRIPE_PARENT : STRIPE_CHILD, theirs = parent ? STRIPE_CHILD : STRIPE_PARENT;
  char v[32];
  snprintf(v, sizeof(v), "%zu", mine);
  setenv("FABRIC_STRIPE_THRESHOLD", v, 1);
  setenv("FABRIC_STRIPE_SIZE", "65536", 1);
  ft_side s;
  int nphys = open_with_copies(&s, peer);
  if (!s.api->make_vdevice) {
    ft_side_close(&s);
    return;
  }
  for (int n = 2; n <= COPIES; n += 2) {
    s.dev = fuse(&s, nphys, n);
    FT_OK(s.api->get_properties(s.dev, &s.props));
    ft_conn c;
    ft_connect_all(&s, &c, 1, T_MS);
    stripes_stream(&s, &c, mine, theirs);
    if (s.props.max_recvs >= 3) stripes_grouped(&s, &c, mine, theirs);
    ft_sync(peer, "stripes", T_MS);
    ft_close_all(&s, &c, 1);
  }
  ft_side_close(&s);
}

/* Tests req until it fails; the failing call logs exactly one WARN, which
 * names `why`. A request that completes instead fails the test. */
static void expect_request_fails(ft_side* s, void* req, const char* why) {
  for (int64_t end = ft_now_ms() + T_MS; ft_now_ms() < end;) {
    int done = 0, sizes[FAB_MAX_RECVS];
    int w0 = ft_log_warns();
    ft_log_expect_warns(1);
    fab_result rc = s->api->test(req, &done, sizes);
    ft_log_expect_warns(0);
    if (rc != FAB_OK) {
      FT_CHECK(ft_log_warns() - w0 == 1, "%d WARN lines for the failure, expected 1", ft_log_warns() - w0);
      FT_CHECK(strstr(ft_log_last_warn(), why) != NULL, "the WARN: %s (expected it to say \"%s\")",
               ft_log_last_warn(), why);
      return;
    }
    FT_CHECK(!done, "the request completed (%d bytes); it should have failed: %s", sizes[0], why);
  }
  FT_FAIL("the request neither failed nor completed in %d ms (%s)", T_MS, why);
}

/* Tests a send in a thread of its own until told to stop (or it ends), so
 * that the provider progresses it while the test's thread waits for the
 * peer's verdict, as NCCL's proxy thread would keep testing it. */
typedef struct send_driver {
  ft_side* s;
  void* req;
  atomic_int stop;
  pthread_t thread;
} send_driver;

static void* drive_send(void* arg) {
  send_driver* d = arg;
  while (!atomic_load(&d->stop)) {
    int done = 0;
    if (d->s->api->test(d->req, &done, NULL) != FAB_OK || done) break;
  }
  return NULL;
}

static void drive_start(send_driver* d, ft_side* s, void* req) {
  d->s = s;
  d->req = req;
  atomic_init(&d->stop, 0);
  FT_CHECK(pthread_create(&d->thread, NULL, drive_send, d) == 0, "pthread_create");
}

static void drive_stop(send_driver* d) {
  atomic_store(&d->stop, 1);
  pthread_join(d->thread, NULL);
}

/* A split message larger than its buffer: the receive fails as truncated
 * once the notice names the size (stripe 0 alone fits), one WARN, no hang;
 * nothing is written past the buffer. */
FT_PAIR_TEST(rails_stripe_truncated, 60) {
  setenv("FABRIC_STRIPE_THRESHOLD", "65536", 1);
  ft_side s;
  ft_conn c;
  if (!open_fused(&s, peer, &c, 2, 0)) return;
  enum { SENT = 2 << 20, CAP = 1 << 20, GUARD = 4096 };
  ft_mr m;
  int parent = ft_role() == FT_PARENT;
  ft_mr_alloc(&s, &m, parent ? c.send_comm : c.recv_comm, SENT + GUARD);
  if (parent) {
    ft_fill(m.buf, SENT, 99);
    send_driver d;
    drive_start(&d, &s, post_send(&s, c.send_comm, m.buf, SENT, 50, m.mh)); /* never completes */
    ft_sync(peer, "truncated", T_MS);
    drive_stop(&d);
  } else {
    memset(m.buf, 0x5a, SENT + GUARD);
    size_t cap = CAP;
    int tag = 50;
    void* req = post_recv(&s, c.recv_comm, 1, &m.buf, &cap, &tag, &m.mh);
    expect_request_fails(&s, req, "truncated");
    const unsigned char* past = (const unsigned char*)m.buf + CAP;
    for (size_t i = 0; i < SENT + GUARD - CAP; i++)
      FT_CHECK(past[i] == 0x5a, "byte %zu past the %d-byte buffer was written", i, CAP);
    ft_sync(peer, "truncated", T_MS);
  }
  ft_close_all(&s, &c, 1);
  ft_mr_free(&s, &m);
  ft_side_close(&s);
}

/* The same over 2 and 4 rails with a polling thread per rail, and messages
 * split over them
 * (FABRIC_RAIL_THREADS; ignored on intra-host providers): started with the
 * first comm on a rail's endpoint, joined when the last one closes. */
FT_PAIR_TEST(rails_threads, 120) {
  setenv("FABRIC_RAIL_THREADS", "2", 1); /* whatever CPUs the test machine has */
  setenv("FABRIC_STRIPE_THRESHOLD", "65536", 1); /* and split messages, whose parts the threads progress */
  setenv("FABRIC_STRIPE_SIZE", "65536", 1);
  ft_side s;
  int nphys = open_with_copies(&s, peer);
  if (!s.api->make_vdevice) {
    ft_side_close(&s);
    return;
  }
  for (int n = 2; n <= COPIES; n += 2) {
    s.dev = fuse(&s, nphys, n);
    FT_OK(s.api->get_properties(s.dev, &s.props));
    ft_conn c;
    ft_connect_all(&s, &c, 1, T_MS);
    stream(&s, &c);
    grouped(&s, &c);
    stripes_stream(&s, &c, STRIPE_PARENT, STRIPE_PARENT);
    ft_sync(peer, "threads", T_MS);
    ft_close_all(&s, &c, 1);
  }
  ft_side_close(&s);
}

/* Threads of this process named as the rails' polling threads; with ticks,
 * also the CPU time (clock ticks) they have used. */
static int rail_threads(long* ticks) {
  DIR* d = opendir("/proc/self/task");
  FT_CHECK(d != NULL, "cannot list /proc/self/task");
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) {
    char path[300], stat[1024] = "";
    snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
    FILE* f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
    if (!f) continue;
    size_t len = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    stat[len] = 0;
    const char* name = strchr(stat, '(');
    const char* rest = strrchr(stat, ')');
    if (!name || !rest || strncmp(name + 1, "fabric-rail", 11)) continue;
    n++;
    long utime = 0, stime = 0; /* fields 14 and 15; rest starts at field 3 */
    int got = sscanf(rest + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &utime, &stime);
    FT_CHECK(got == 2, "cannot read %s", path);
    if (ticks) *ticks += utime + stime;
  }
  closedir(d);
  return n;
}
static int rail_threads_running(void) { return rail_threads(NULL); }

/* How many times the rails' threads went to sleep so far (their voluntary
 * context switches): each wake-up of a sleeping thread adds one when it
 * sleeps again. */
static long rail_threads_sleeps(void) {
  DIR* d = opendir("/proc/self/task");
  FT_CHECK(d != NULL, "cannot list /proc/self/task");
  long sleeps = 0;
  for (struct dirent* e; (e = readdir(d));) {
    char path[300], line[256];
    snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
    FILE* f = e->d_name[0] != '.' ? fopen(path, "r") : NULL;
    if (!f) continue;
    int rail = 0;
    long n = -1;
    while (fgets(line, sizeof(line), f)) {
      if (!strncmp(line, "Name:", 5)) rail = strstr(line, "fabric-rail") != NULL;
      sscanf(line, "voluntary_ctxt_switches: %ld", &n);
    }
    fclose(f);
    if (!rail) continue;
    FT_CHECK(n >= 0, "cannot read %s", path);
    sleeps += n;
  }
  closedir(d);
  return sleeps;
}

/* FABRIC_RAIL_THREADS=1 in a process bound to one CPU (what mpirun does to
 * each of two ranks by default): one WARN says why and what to do, no
 * thread starts, and the caller's thread still moves every message. The
 * same with 2 (always) starts one per rail. */
FT_PAIR_TEST(rails_threads_one_cpu, 120) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu() > 0 ? sched_getcpu() : 0, &one);
  FT_CHECK(sched_setaffinity(0, sizeof(one), &one) == 0, "cannot bind the test to one CPU");
  setenv("FABRIC_RAIL_THREADS", "1", 1);
  ft_side s;
  int nphys = open_with_copies(&s, peer);
  if (ft_api_selected() != FT_API_CORE || !s.api->make_vdevice) {
    ft_side_close(&s);
    return;
  }
  s.dev = fuse(&s, nphys, 2);
  FT_OK(s.api->get_properties(s.dev, &s.props));
  ft_conn c;
  int w0 = ft_log_warns();
  ft_log_expect_warns(1);
  ft_connect_all(&s, &c, 1, T_MS);
  ft_log_expect_warns(0);
  FT_CHECK(ft_log_warns() == w0 + 1 && strstr(ft_log_last_warn(), "FABRIC_RAIL_THREADS=1") &&
               strstr(ft_log_last_warn(), "1 CPU") && strstr(ft_log_last_warn(), "--bind-to none"),
           "%d WARNs for rail threads on one CPU, the last: %s", ft_log_warns() - w0, ft_log_last_warn());
  FT_CHECK(rail_threads_running() == 0, "%d rail threads run on one CPU", rail_threads_running());
  stream(&s, &c);
  ft_sync(peer, "one cpu", T_MS);
  ft_close_all(&s, &c, 1);
  setenv("FABRIC_RAIL_THREADS", "2", 1); /* read at init: a new context takes it */
  ft_side_close(&s);
  nphys = open_with_copies(&s, peer);
  s.dev = fuse(&s, nphys, 2);
  FT_OK(s.api->get_properties(s.dev, &s.props));
  ft_connect_all(&s, &c, 1, T_MS);
  FT_CHECK(rail_threads_running() == 2, "%d rail threads with FABRIC_RAIL_THREADS=2 over 2 rails",
           rail_threads_running());
  stream(&s, &c);
  ft_sync(peer, "forced", T_MS);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* Tests req (at most FAB_HELPED_POLL_EVERY - 4 times, 50 ms apart, so the
 * test itself never reads the rail's CQ or posts its sends) until done. */
static int done_by_threads(ft_side* s, void* req) {
  for (int i = 0; i < 60; i++) {
    int done = 0, sizes[FAB_MAX_RECVS];
    FT_OK(s->api->test(req, &done, sizes));
    if (done) return 1;
    usleep(50 * 1000);
  }
  return 0;
}

/* With a thread per rail, the threads move a large message on their own:
 * the send's request-to-send and its write are posted on the sender's rail
 * thread (rd_send_pump), the completions read on both threads; neither
 * side's tests do any of it. */
static void move_by_threads(ft_side* s, ft_conn* c, ft_peer* peer, uint64_t salt) {
  enum { LEN = 512 << 10 }; /* whole, on one rail: below the 1 MiB split threshold of the tests that set one */
  ft_mr sm, rm;
  ft_mr_alloc(s, &sm, c->send_comm, LEN);
  ft_mr_alloc(s, &rm, c->recv_comm, LEN);
  ft_fill(sm.buf, LEN, salt + (uint64_t)ft_role());
  size_t cap = LEN;
  int tag = 200;
  void* rreq = post_recv(s, c->recv_comm, 1, &rm.buf, &cap, &tag, &rm.mh);
  ft_sync(peer, "posted", T_MS);
  usleep(100 * 1000);
  void* sreq = post_send(s, c->send_comm, sm.buf, LEN, tag, sm.mh);
  FT_CHECK(done_by_threads(s, sreq), "a 512 KiB send over rails with threads did not complete in 3 s of tests "
           "that leave progress to the threads");
  FT_CHECK(done_by_threads(s, rreq), "a 512 KiB receive over rails with threads did not complete in 3 s");
  ft_verify_or_fail(rm.buf, LEN, salt + (uint64_t)(ft_role() == FT_PARENT ? FT_CHILD : FT_PARENT),
                    "a message the rail threads moved");
  ft_sync(peer, "moved", T_MS);
  ft_mr_free(s, &sm);
  ft_mr_free(s, &rm);
}

FT_PAIR_TEST(rails_threads_post, 120) {
  setenv("FABRIC_RAIL_THREADS", "2", 1);
  ft_side s;
  ft_conn c;
  if (!open_fused(&s, peer, &c, 2, 1)) return;
  move_by_threads(&s, &c, peer, 77);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* CPU time (ms) the rails' threads use in 500 ms, from 100 ms on (past
 * their idle time), while this process leaves them nothing to do. */
static long idle_rail_threads_cpu_ms(void) {
  usleep(100 * 1000);
  long hz = sysconf(_SC_CLK_TCK), t0 = 0, t1 = 0;
  rail_threads(&t0);
  usleep(500 * 1000);
  rail_threads(&t1);
  return (t1 - t0) * 1000 / hz;
}

/* Two fused rails with a thread each, messages split from 1 MiB: 0 where the
 * test cannot run here. */
static int open_threaded_rails(ft_side* s, ft_peer* peer, ft_conn* c) {
  setenv("FABRIC_RAIL_THREADS", "2", 1);
  setenv("FABRIC_STRIPE_THRESHOLD", "1048576", 1);
  return open_fused(s, peer, c, 2, 1);
}

/* A rail's polling thread sleeps once no request of its comms has been live
 * for a while (a runtime's compute phase), so it costs no core then, and
 * the next request wakes it: a message again moves with tests that leave
 * all progress to the threads. The stream before splits its 1 MiB messages
 * over the rails, so the receiver keeps stripe-notice receives posted on
 * every rail from then on: they must not hold the threads awake. */
FT_PAIR_TEST(rails_threads_sleep_idle, 120) {
  ft_side s;
  ft_conn c;
  if (!open_threaded_rails(&s, peer, &c)) return;
  FT_CHECK(rail_threads_running() == 2, "%d rail threads over 2 rails", rail_threads_running());
  stream(&s, &c);
  ft_sync(peer, "streamed", T_MS);
  long spent_ms = idle_rail_threads_cpu_ms();
  FT_CHECK(spent_ms <= 50, "the rail threads used %ld ms of CPU in 500 ms with no request live", spent_ms);
  move_by_threads(&s, &c, peer, 79);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* While only small requests are live (a receive of 8 bytes waits for its
 * message), the runtime's tests read the CQ and the rails' threads sleep:
 * they cost no core through a phase of small messages. The message then
 * still arrives, and a large one afterwards wakes the threads to move it. */
FT_PAIR_TEST(rails_threads_sleep_small_live, 120) {
  ft_side s;
  ft_conn c;
  if (!open_threaded_rails(&s, peer, &c)) return;
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, 64);
  ft_mr_alloc(&s, &rm, c.recv_comm, 64);
  ft_fill(sm.buf, 8, 91 + (uint64_t)ft_role());
  size_t cap = 8;
  int tag = 400;
  void* rreq = post_recv(&s, c.recv_comm, 1, &rm.buf, &cap, &tag, &rm.mh);
  ft_sync(peer, "posted", T_MS);
  long spent_ms = idle_rail_threads_cpu_ms();
  FT_CHECK(spent_ms <= 50, "the rail threads used %ld ms of CPU in 500 ms with only an 8-byte receive live",
           spent_ms);
  ft_sync(peer, "measured", T_MS);
  void* sreq = post_send(&s, c.send_comm, sm.buf, 8, tag, sm.mh);
  int got[FAB_MAX_RECVS];
  void* reqs[2] = {rreq, sreq};
  ft_wait_all(&s, reqs, 2, got, 1, T_MS, "an 8-byte message while the rails' threads sleep");
  ft_verify_or_fail(rm.buf, 8, 91 + (uint64_t)(ft_role() == FT_PARENT ? FT_CHILD : FT_PARENT),
                    "a small message while the threads slept");
  ft_sync(peer, "small moved", T_MS);
  move_by_threads(&s, &c, peer, 97);
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* Rounds of 8-byte ping-pong on tag 300 into receives of 128 KiB (as NCCL
 * posts its slots): the parent sends first; every byte checked. */
enum { SLOT = 128 << 10, TINY_TAG = 300 };
static void tiny_rounds(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* rm, int rounds, uint64_t salt) {
  int parent = ft_role() == FT_PARENT, got[FAB_MAX_RECVS];
  for (int i = 0; i < rounds; i++) {
    ft_fill(sm->buf, 8, salt + (uint64_t)i * 2 + (uint64_t)!parent);
    for (int leg = 0; leg < 2; leg++) {
      void* req;
      size_t cap = SLOT;
      int tag = TINY_TAG;
      if (parent == (leg == 0)) req = post_send(s, c->send_comm, sm->buf, 8, tag, sm->mh);
      else req = post_recv(s, c->recv_comm, 1, &rm->buf, &cap, &tag, &rm->mh);
      ft_wait_all(s, &req, 1, got, 1, T_MS, "an 8-byte message into a 128 KiB receive");
      if (parent != (leg == 0)) FT_CHECK(got[0] == 8, "an 8-byte message reported %d bytes", got[0]);
    }
    ft_verify_or_fail(rm->buf, 8, salt + (uint64_t)i * 2 + (uint64_t)parent, "an 8-byte ping-pong message");
  }
}

/* Receives on tag 300 into rm[0..n-1] (the next n messages of the tag, on
 * the rails in turn), of cap bytes each. */
static void slot_receives_post(ft_side* s, ft_conn* c, ft_mr* rm, int n, size_t cap, void** reqs) {
  for (int i = 0; i < n; i++) {
    size_t len = cap;
    int tag = TINY_TAG;
    reqs[i] = post_recv(s, c->recv_comm, 1, &rm[i].buf, &len, &tag, &rm[i].mh);
  }
}

/* Messages i = from..n-1 of those receives, len[i] bytes each from sm, and
 * the receives checked. */
static void slot_receives_end(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* rm, int from, int n, const size_t* len,
                              void** rreqs, uint64_t salt) {
  void* reqs[8];
  int k = 0;
  for (int i = from; i < n; i++) {
    ft_fill((char*)sm->buf + SLOT * i, len[i], salt + (uint64_t)i * 2 + (uint64_t)ft_role());
    reqs[k++] = rreqs[i];
    reqs[k++] = post_send(s, c->send_comm, (char*)sm->buf + SLOT * i, len[i], TINY_TAG, sm->mh);
  }
  int got[8][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, k, &got[0][0], FAB_MAX_RECVS, T_MS, "messages into 128 KiB receives");
  int other = ft_role() == FT_PARENT ? FT_CHILD : FT_PARENT;
  for (int i = from; i < n; i++) {
    FT_CHECK(got[2 * (i - from)][0] == (int)len[i], "a %zu-byte message into a 128 KiB receive reported %d bytes",
             len[i], got[2 * (i - from)][0]);
    ft_verify_or_fail(rm[i].buf, len[i], salt + (uint64_t)i * 2 + (uint64_t)other, "a message into a 128 KiB receive");
  }
}

/* NCCL posts 128 KiB slots and larger for messages of any size. After a
 * run of tiny messages into such receives, a comm's receives count as small
 * (FABRIC_RAIL_TINY_MAX): the rails' threads sleep while such receives wait,
 * as in a phase of small operations. A larger message into one of them still
 * lands (read by the tests), and the comm then holds its rail's thread
 * polling for its other receives posted so, and only for them: once they are
 * done, receives small by their size leave the threads asleep again. */
FT_PAIR_TEST(rails_threads_tiny_into_slots, 120) {
  ft_side s;
  ft_conn c;
  if (!open_threaded_rails(&s, peer, &c)) return;
  ft_mr sm, rm[4];
  ft_mr_alloc(&s, &sm, c.send_comm, 4 * SLOT);
  for (int i = 0; i < 4; i++) ft_mr_alloc(&s, &rm[i], c.recv_comm, SLOT);
  tiny_rounds(&s, &c, &sm, &rm[0], 40, 1000); /* 20 messages on each rail */
  void* rreqs[4];
  slot_receives_post(&s, &c, rm, 4, SLOT, rreqs); /* rails 0, 1, 0, 1 */
  ft_sync(peer, "slots posted", T_MS);
  long spent_ms = idle_rail_threads_cpu_ms();
  FT_CHECK(spent_ms <= 50, "the rail threads used %ld ms of CPU in 500 ms while 128 KiB receives waited after a run "
           "of 8-byte messages", spent_ms);
  ft_sync(peer, "measured asleep", T_MS);
  size_t len[4] = {64 << 10, 8, 8, 8}; /* the first larger than tiny: rail 0's comm holds for its third */
  slot_receives_end(&s, &c, &sm, rm, 0, 1, len, rreqs, 2000);
  ft_sync(peer, "large landed", T_MS);
  spent_ms = idle_rail_threads_cpu_ms();
  FT_CHECK(spent_ms >= 100, "the rail threads used only %ld ms of CPU in 500 ms while a 128 KiB receive waited on a "
           "rail whose last message was large: the comm should hold its thread polling", spent_ms);
  ft_sync(peer, "measured held", T_MS);
  slot_receives_end(&s, &c, &sm, rm, 1, 4, len, rreqs, 3000);
  slot_receives_post(&s, &c, rm, 2, 8, rreqs); /* small by their size: no hold outlives the receives it was for */
  ft_sync(peer, "small posted", T_MS);
  spent_ms = idle_rail_threads_cpu_ms();
  FT_CHECK(spent_ms <= 50, "the rail threads used %ld ms of CPU in 500 ms while only 8-byte receives waited",
           spent_ms);
  ft_sync(peer, "measured asleep again", T_MS);
  slot_receives_end(&s, &c, &sm, rm, 0, 2, len + 2, rreqs, 4000);
  ft_mr_free(&s, &sm);
  for (int i = 0; i < 4; i++) ft_mr_free(&s, &rm[i]);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* An 8-byte receive on each of two rails (tags 400 and 401: message 0 of
 * each falls on rail 0 and rail 1), so that only small requests are live
 * there and the rails' threads sleep as in a phase of small messages. */
static void small_receives_post(ft_side* s, ft_conn* c, ft_mr* lm, void** small) {
  for (int i = 0; i < 2; i++) {
    ft_mr_alloc(s, &lm[i], c->recv_comm, 64);
    size_t cap = 8;
    int tag = 400 + i;
    small[i] = post_recv(s, c->recv_comm, 1, &lm[i].buf, &cap, &tag, &lm[i].mh);
  }
}

/* Their messages, sent from sm, and the receives checked and freed. */
static void small_receives_end(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* lm, void** small) {
  void* reqs[4] = {small[0], small[1], NULL, NULL};
  for (int i = 0; i < 2; i++) {
    ft_fill((char*)sm->buf + 64 * i, 8, 700 + (uint64_t)i);
    reqs[2 + i] = post_send(s, c->send_comm, (char*)sm->buf + 64 * i, 8, 400 + i, sm->mh);
  }
  int got[4][FAB_MAX_RECVS];
  ft_wait_all(s, reqs, 4, &got[0][0], FAB_MAX_RECVS, T_MS, "the 8-byte messages that kept the threads asleep");
  for (int i = 0; i < 2; i++) {
    ft_verify_or_fail(lm[i].buf, 8, 700 + (uint64_t)i, "an 8-byte message that kept the threads asleep");
    ft_mr_free(s, &lm[i]);
  }
}

/* One ping-pong round of a mid-size message (above the 16 KiB a rail's
 * thread may be left, below FABRIC_RAIL_SMALL_MAX): the parent sends first,
 * the child answers. */
static void mid_round(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* rm, int round) {
  enum { LEN = 32 << 10 };
  int parent = ft_role() == FT_PARENT, tag = 500, got[FAB_MAX_RECVS];
  ft_fill(sm->buf, LEN, 600 + (uint64_t)round * 2 + (uint64_t)!parent);
  for (int leg = 0; leg < 2; leg++) {
    void* req;
    size_t cap = LEN;
    if (parent == (leg == 0)) req = post_send(s, c->send_comm, sm->buf, LEN, tag, sm->mh);
    else req = post_recv(s, c->recv_comm, 1, &rm->buf, &cap, &tag, &rm->mh);
    ft_wait_all(s, &req, 1, got, 1, T_MS, "a 32 KiB message over rails with sleeping threads");
  }
  ft_verify_or_fail(rm->buf, LEN, 600 + (uint64_t)round * 2 + (uint64_t)parent, "a 32 KiB ping-pong message");
}

/* A lone mid-size send (32 KiB) is posted by the caller, not left to its
 * rail's thread: while only small requests are live the threads sleep, and
 * waking one for the post costs each such message the wake-up (netbench's
 * 32 KiB ping-pong over four rails: 14.8 us against 11.1). An 8-byte
 * receive stays posted on each rail throughout, so the threads sleep as in a
 * phase of small messages, which only a large request, a post left to them
 * or their 100 ms nap ends. */
FT_PAIR_TEST(rails_threads_mid_send_inline, 120) {
  enum { ROUNDS = 24 };
  ft_side s;
  ft_conn c;
  if (!open_threaded_rails(&s, peer, &c)) return;
  ft_mr sm, rm, lm[2];
  ft_mr_alloc(&s, &sm, c.send_comm, 32 << 10);
  ft_mr_alloc(&s, &rm, c.recv_comm, 32 << 10);
  void* small[2];
  small_receives_post(&s, &c, lm, small);
  ft_sync(peer, "small posted", T_MS);
  usleep(50 * 1000); /* past the threads' 10 ms idle time */
  long sleeps0 = rail_threads_sleeps();
  int64_t t0 = ft_now_ms();
  for (int round = 0; round < ROUNDS; round++) mid_round(&s, &c, &sm, &rm, round);
  long woke = rail_threads_sleeps() - sleeps0, naps = 2 * (1 + (ft_now_ms() - t0) / 100);
  FT_CHECK(woke <= naps, "the rail threads woke %ld times over %d rounds of a 32 KiB ping-pong with only small "
           "requests live (at most %ld naps end in that time): lone mid-size sends were left to them", woke,
           ROUNDS, naps);
  ft_sync(peer, "mid moved", T_MS);
  small_receives_end(&s, &c, &sm, lm, small);
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* A burst of mid-size sends from the parent to the child, all posted before
 * any is waited for: a stream, so the rails' threads post all but the first
 * on each rail. */
static void mid_burst(ft_side* s, ft_conn* c, ft_mr* sm, ft_mr* rm, int burst) {
  enum { N = 8, LEN = 32 << 10 };
  int parent = ft_role() == FT_PARENT, got[N][FAB_MAX_RECVS];
  void* reqs[N];
  for (int i = 0; i < N; i++) {
    char* sb = (char*)sm->buf + (size_t)i * LEN;
    void* rb = (char*)rm->buf + (size_t)i * LEN;
    size_t cap = LEN;
    int tag = 500;
    if (parent) ft_fill(sb, LEN, 800 + (uint64_t)burst * N + (uint64_t)i);
    reqs[i] = parent ? post_send(s, c->send_comm, sb, LEN, tag, sm->mh)
                     : post_recv(s, c->recv_comm, 1, &rb, &cap, &tag, &rm->mh);
  }
  ft_wait_all(s, reqs, N, &got[0][0], FAB_MAX_RECVS, T_MS, "a burst of 32 KiB messages over rails");
  for (int i = 0; !parent && i < N; i++)
    ft_verify_or_fail((char*)rm->buf + (size_t)i * LEN, LEN, 800 + (uint64_t)burst * N + (uint64_t)i,
                      "a message of a 32 KiB burst");
}

/* A rail's thread that was woken to post a send stays awake for its idle
 * time (10 ms) before it sleeps again: the sends of a stream left to it then
 * cost one wake-up, not one each. Threads asleep as in a phase of small
 * messages (an 8-byte receive live on each rail), then bursts of 32 KiB
 * sends. */
FT_PAIR_TEST(rails_threads_stream_stays_awake, 120) {
  enum { BURSTS = 24 };
  ft_side s;
  ft_conn c;
  if (!open_threaded_rails(&s, peer, &c)) return;
  ft_mr sm, rm, lm[2];
  ft_mr_alloc(&s, &sm, c.send_comm, 8 * (32 << 10));
  ft_mr_alloc(&s, &rm, c.recv_comm, 8 * (32 << 10));
  void* small[2];
  small_receives_post(&s, &c, lm, small);
  ft_sync(peer, "small posted", T_MS);
  usleep(50 * 1000);
  long sleeps0 = rail_threads_sleeps();
  int64_t t0 = ft_now_ms();
  for (int burst = 0; burst < BURSTS; burst++) mid_burst(&s, &c, &sm, &rm, burst);
  int64_t ms = ft_now_ms() - t0;
  /* Each thread's idle spans, and one more switch per burst: a thread that
   * waits for the endpoint lock the caller holds switches too (seen once: 14
   * in a 7 ms run). Without the awake time it was 147-249: one per post. */
  long woke = rail_threads_sleeps() - sleeps0, awake_spans = 2 * (2 + ms / 10) + BURSTS;
  FT_CHECK(ft_role() == FT_CHILD || woke <= awake_spans, "the rail threads woke %ld times over %d bursts of eight "
           "32 KiB sends in %lld ms (at most %ld if each stays awake 10 ms after a post left to it, with one lock "
           "wait per burst)", woke, BURSTS, (long long)ms, awake_spans);
  ft_sync(peer, "bursts moved", T_MS);
  small_receives_end(&s, &c, &sm, lm, small);
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* A connection closed with a receive posted and never tested to the end
 * leaves no live request behind: the rails' threads, still running for
 * another connection over the same rails, sleep once that one is idle. The
 * receive is large enough for a split message (the split threshold is set
 * low), so it also holds every rail's thread until the close. */
FT_PAIR_TEST(rails_threads_sleep_after_close, 120) {
  setenv("FABRIC_RAIL_THREADS", "2", 1);
  setenv("FABRIC_STRIPE_THRESHOLD", "4096", 1);
  ft_side s;
  ft_conn c[2];
  if (!open_fused_conns(&s, peer, c, 2, 2, 1)) return;
  ft_mr m;
  ft_mr_alloc(&s, &m, c[1].recv_comm, 4096);
  size_t cap = 4096;
  int tag = 300;
  void* buf = m.buf;
  (void)post_recv(&s, c[1].recv_comm, 1, &buf, &cap, &tag, &m.mh); /* the peer never sends it */
  ft_sync(peer, "posted", T_MS);
  ft_close_all(&s, &c[1], 1); /* its registration stays until finalize, its buffer until after */
  stream(&s, &c[0]); /* split messages: the runtime's tests advance them */
  ft_sync(peer, "streamed", T_MS);
  long spent_ms = idle_rail_threads_cpu_ms();
  FT_CHECK(spent_ms <= 50, "the rail threads used %ld ms of CPU in 500 ms after a connection closed with a "
           "receive posted", spent_ms);
  ft_close_all(&s, &c[0], 1);
  ft_side_close(&s);
  ft_free(m.buf, m.len);
}

/* The rails each end's comms run over (0: a comm of one rail). */
static int comm_rails(void* comm, int send) {
#ifdef FT_WITH_CORE
  fab_rails_comm* rc = fab_obj_get(comm, send ? FAB_OBJ_RAILS_SEND : FAB_OBJ_RAILS_RECV);
  if (rc) return rc->n;
  FT_CHECK(fab_obj_kind_of(comm) == (send ? FAB_OBJ_SEND : FAB_OBJ_RECV), "neither a comm over rails nor of one");
  return 0;
#else
  (void)comm, (void)send;
  return -1; /* a table's handle: only the data can tell */
#endif
}

/* One rank's device has `mine` rails (1: the plain device), the other's
 * four: both ways, the connection runs over the smaller count (rail 0's
 * handshake agrees it), moves every byte, and nobody WARNs. */
static void count_differs(ft_peer* peer, int mine) {
  ft_side s;
  int nphys = open_with_copies(&s, peer);
  if (!s.api->make_vdevice) {
    ft_side_close(&s);
    return;
  }
  int parent = ft_role() == FT_PARENT;
  int n = parent ? mine : COPIES;
  s.dev = n == 1 ? 0 : fuse(&s, nphys, n);
  FT_OK(s.api->get_properties(s.dev, &s.props));
  int w0 = ft_log_warns();
  ft_conn c;
  ft_connect_all(&s, &c, 1, T_MS);
  int want = mine == 1 ? 0 : mine;
  int got_send = comm_rails(c.send_comm, 1), got_recv = comm_rails(c.recv_comm, 0);
  FT_CHECK(got_send < 0 || (got_send == want && got_recv == want),
           "device of %d rails against %d: comms over %d (send) and %d (recv) rails, expected %d", n,
           parent ? COPIES : mine, got_send, got_recv, want);
  stream(&s, &c);
  FT_CHECK(ft_log_warns() == w0, "%d WARN lines: %s", ft_log_warns() - w0, ft_log_last_warn());
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* One rank fuses two copies (then none), the other four. */
FT_PAIR_TEST(rails_count_differs, 120) {
  count_differs(peer, 2);
  ft_sync(peer, "two against four", T_MS);
  count_differs(peer, 1);
}

#ifdef FT_WITH_CORE
/* Fails rail 1 of a comm over rails as the liveness check or a provider
 * error would (the core's own call: only the core binary reaches it). */
static void fail_rail(void* handle, fab_obj_kind kind) {
  fab_rails_comm* rc = fab_obj_get(handle, kind);
  FT_CHECK(rc != NULL && rc->n == 2, "not a comm over 2 rails");
  fab_comm* c = rc->c[1];
  pthread_mutex_lock(&c->ep->lock);
  fab_comm_fail(c, FAB_ERR_REMOTE, "the test failed this rail");
  pthread_mutex_unlock(&c->ep->lock);
}

/* One rail of two fails while a grouped receive spans both: that receive,
 * and every later call on either end, fails with one WARN naming rail 1;
 * nothing hangs and nothing partial is reported done. */
FT_PAIR_TEST(rails_one_rail_fails, 60) {
  ft_side s;
  ft_conn c;
  if (!open_fused(&s, peer, &c, 2, 1)) return;
  ft_mr sm, rm;
  ft_mr_alloc(&s, &sm, c.send_comm, 1 << 20);
  ft_mr_alloc(&s, &rm, c.recv_comm, 2 << 20);
  void* d[2] = {rm.buf, (char*)rm.buf + (1 << 20)};
  size_t cap[2] = {1 << 20, 1 << 20};
  int tags[2] = {20, 21}; /* first messages of tags 20 and 21: rails 0 and 1 */
  void* mhs[2] = {rm.mh, rm.mh};
  void* rreq = post_recv(&s, c.recv_comm, 2, d, cap, tags, mhs);
  ft_sync(peer, "posted", T_MS);
  fail_rail(c.recv_comm, FAB_OBJ_RAILS_RECV);
  fail_rail(c.send_comm, FAB_OBJ_RAILS_SEND);
  int done = 0;
  FT_EXPECT_ERROR(s.api->test(rreq, &done, NULL));
  FT_CHECK(done && strstr(ft_log_last_warn(), "rail 1 of 2"), "the WARN: %s", ft_log_last_warn());
  void* r = NULL;
  FT_EXPECT_ERROR(s.api->isend(c.send_comm, sm.buf, 8, 20, sm.mh, NULL, &r)); /* tag 20 goes on rail 0 */
  FT_CHECK(!r && strstr(ft_log_last_warn(), "rail 1 of 2"), "the WARN: %s", ft_log_last_warn());
  FT_EXPECT_ERROR(s.api->irecv(c.recv_comm, 1, d, cap, tags, mhs, NULL, &r));
  FT_CHECK(!r && strstr(ft_log_last_warn(), "rail 1 of 2"), "the WARN: %s", ft_log_last_warn());
  ft_sync(peer, "failed", T_MS);
  ft_close_all(&s, &c, 1); /* first: the receive on rail 0 still holds its buffer */
  ft_mr_free(&s, &sm);
  ft_mr_free(&s, &rm);
  ft_side_close(&s);
}

/* A peer that lies in a notice (stripes that do not add up to its size):
 * the receive waiting for it fails with one WARN, the comm with it; nothing
 * is posted at the offsets it names. Sent through rail 0's own comm, as a
 * peer of another build could. */
FT_PAIR_TEST(rails_stripe_forged_notice, 60) {
  setenv("FABRIC_STRIPE_THRESHOLD", "65536", 1);
  ft_side s;
  ft_conn c;
  if (!open_fused(&s, peer, &c, 2, 1)) return;
  enum { CAP = 1 << 20, TAG = 60 }; /* the first message of tag 60 goes on rail 60 % 2 = 0 */
  if (ft_role() == FT_PARENT) {
    fab_rails_comm* rc = fab_obj_get(c.send_comm, FAB_OBJ_RAILS_SEND);
    FT_CHECK(rc != NULL, "not a comm over rails");
    static fab_stripe_notice n;
    n = (fab_stripe_notice){.magic = FAB_STRIPE_MAGIC, .tag = TAG, .k = 0, .seq = 0, .m = 2, .size = CAP};
    n.len[0] = CAP / 2;
    n.len[1] = 100; /* adds up to less than size */
    n.check = fab_stripe_notice_check(&n);
    void* mh = NULL;
    FT_OK(s.api->reg_mr(rc->rail[0], &n, sizeof(n), FAB_PTR_HOST, &mh));
    void* req = NULL;
    for (int64_t end = ft_now_ms() + T_MS; !req && ft_now_ms() < end;)
      FT_OK(s.api->isend(rc->rail[0], &n, sizeof(n), FAB_STRIPE_TAG_CTRL, mh, NULL, &req));
    FT_CHECK(req != NULL, "the forged notice could not be posted");
    send_driver d;
    drive_start(&d, &s, req);
    ft_sync(peer, "failed", T_MS);
    drive_stop(&d);
    FT_OK(s.api->dereg_mr(rc->rail[0], mh));
  } else {
    ft_mr m;
    ft_mr_alloc(&s, &m, c.recv_comm, CAP);
    size_t cap = CAP;
    int tag = TAG;
    void* req = post_recv(&s, c.recv_comm, 1, &m.buf, &cap, &tag, &m.mh);
    expect_request_fails(&s, req, "do not add up");
    ft_sync(peer, "failed", T_MS);
    ft_close_all(&s, &c, 1);
    ft_mr_free(&s, &m);
    ft_side_close(&s);
    return;
  }
  ft_close_all(&s, &c, 1);
  ft_side_close(&s);
}

/* Rail 1 of 2 fails while a message split over both is in flight (its
 * notice and stripe 0 on rail 0, stripe 1 on rail 1), before the receiver
 * could post stripe 1: the receive fails with one WARN naming rail 1 and
 * never reports the message done; the send fails the same way or, where the
 * provider had taken its stripes, completes; nothing hangs. */
FT_PAIR_TEST(rails_fail_mid_split, 60) {
  setenv("FABRIC_STRIPE_THRESHOLD", "65536", 1);
  ft_side s;
  ft_conn c;
  if (!open_fused(&s, peer, &c, 2, 1)) return;
  enum { LEN = 8 << 20, TAG = 70 };
  /* Static buffers: the rail is failed from inside, so its connection lives on and may still move the stripes
   * after the comms are closed; heap buffers freed then would be written after free. */
  static _Alignas(4096) char send_buf[LEN], recv_buf[LEN];
  ft_mr sm = {.buf = send_buf, .len = LEN, .comm = c.send_comm};
  ft_mr rm = {.buf = recv_buf, .len = LEN, .comm = c.recv_comm};
  FT_OK(s.api->reg_mr(sm.comm, sm.buf, LEN, FAB_PTR_HOST, &sm.mh));
  FT_OK(s.api->reg_mr(rm.comm, rm.buf, LEN, FAB_PTR_HOST, &rm.mh));
  size_t cap = LEN;
  int tag = TAG;
  void* rreq = post_recv(&s, c.recv_comm, 1, &rm.buf, &cap, &tag, &rm.mh);
  ft_sync(peer, "posted", T_MS);
  void* sreq = post_send(&s, c.send_comm, sm.buf, LEN, TAG, sm.mh);
  fail_rail(c.recv_comm, FAB_OBJ_RAILS_RECV);
  fail_rail(c.send_comm, FAB_OBJ_RAILS_SEND);
  expect_request_fails(&s, rreq, "rail 1 of 2");
  /* the send fails the same way, or completed: its stripes were handed off before the rail failed */
  int done = 0, rc = FAB_OK;
  for (int64_t end = ft_now_ms() + T_MS; !done && ft_now_ms() < end;) {
    ft_log_expect_warns(1);
    rc = s.api->test(sreq, &done, NULL);
    ft_log_expect_warns(0);
  }
  FT_CHECK(done, "the send over a failed rail neither failed nor completed in %d ms", T_MS);
  FT_CHECK(rc == FAB_OK || strstr(ft_log_last_warn(), "rail 1 of 2"), "the send's WARN: %s", ft_log_last_warn());
  ft_sync(peer, "failed", T_MS);
  ft_close_all(&s, &c, 1);
  FT_OK(s.api->dereg_mr(sm.comm, sm.mh));
  FT_OK(s.api->dereg_mr(rm.comm, rm.mh));
  ft_side_close(&s);
}
#endif
