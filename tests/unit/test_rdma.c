/*
 * The rdma transport and the core's one-sided operations against bad input,
 * in one process over loopback (tcp;ofi_rxm and shm): forged remote CQ data
 * and mailbox entries play the hostile peer, through the very handler a
 * peer's write reaches. Each case checks the error, the one WARN, and that no
 * byte was written where it must not be.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fab_conn.h"
#include "fab_mr.h"
#include "fab_remote.h"
#include "rdma/rd.h"
#include "unit_util.h"

static const fab_api* api = &fab_api_core;

typedef struct conn {
  fab_ctx* ctx;
  void *s, *r, *l;
  fab_comm *sc, *rc;
} conn;

static void open_conn_with(const char* prov, const char* transport, conn* c) {
  ut_use_provider(prov);
  setenv("FABRIC_TRANSPORT", transport, 1);
  setenv("FABRIC_EAGER_MAX", "4096", 0); /* the eager path on (off by default) unless the environment says otherwise */
  setenv("FABRIC_TAGGED_MAX", "0", 0);   /* announced at post (unit.rdma), or asked (unit.rdma.asked sets it) */
  cr_assert_eq(api->init(&c->ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_assert_eq(fab_g.devs[0]->ops, strcmp(transport, "rdma") ? &fab_sendrecv_ops : &fab_rdma_ops,
               "FABRIC_TRANSPORT=%s runs that transport", transport);
  unsigned char h[FAB_HANDLE_SIZE];
  cr_assert_eq(api->listen(c->ctx, 0, h, &c->l), FAB_OK);
  c->s = c->r = NULL;
  for (int64_t end = ut_now_ms() + 20000; !c->s || !c->r;) {
    cr_assert_lt(ut_now_ms(), end, "loopback connect timed out");
    if (!c->s) cr_assert_eq(api->connect(c->ctx, 0, NULL, h, &c->s, NULL), FAB_OK);
    if (!c->r) cr_assert_eq(api->accept(c->l, &c->r, NULL), FAB_OK);
  }
  c->sc = fab_obj_get(c->s, FAB_OBJ_SEND);
  c->rc = fab_obj_get(c->r, FAB_OBJ_RECV);
}

static void open_conn(const char* prov, conn* c) { open_conn_with(prov, "rdma", c); }

static void close_conn(conn* c) {
  cr_assert_eq(api->close_send(c->s), FAB_OK);
  cr_assert_eq(api->close_recv(c->r), FAB_OK);
  cr_assert_eq(api->close_listen(c->l), FAB_OK);
  cr_assert_eq(api->finalize(c->ctx), FAB_OK);
}

/* What a peer's write with remote CQ data looks like to our endpoint. */
/* A peer's write whose CQ data says `word` (rd_proto.h's logical word),
 * in the device's wire format, with the length such a write would have. */
static void forge(fab_comm* target, uint64_t word) {
  fab_endpoint* ep = target->ep;
  unsigned type = rd_cq_type(word);
  uint32_t slot = rd_cq_slot(word);
  size_t len = sizeof(uint64_t);
  if (type == RD_DATA && slot != RD_ONESIDED_SLOT) len = rd_cq_low(word);
  if (type == RD_EAGER && slot != RD_ACK_SLOT) len = sizeof(rd_eager_hdr) + rd_cq_low(word);
  fab_cqe e = {.op_context = NULL, .flags = FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA, .len = len,
               .data = rd_cq_wire(ep->dev->cq_narrow, word)};
  pthread_mutex_lock(&ep->lock);
  ep->dev->remote_data(ep, &e);
  pthread_mutex_unlock(&ep->lock);
}

static void* post_recv(conn* c, void* buf, size_t size, void* mh, int tag) {
  void* q = NULL;
  for (int64_t end = ut_now_ms() + 5000; !q;) {
    cr_assert_lt(ut_now_ms(), end);
    cr_assert_eq(api->irecv(c->r, 1, &buf, &size, &tag, &mh, NULL, &q), FAB_OK);
  }
  return q;
}

static fab_result wait_req(void* q, int* size) {
  int done = 0;
  fab_result rc = FAB_OK;
  for (int64_t end = ut_now_ms() + 20000; !done && rc == FAB_OK;) {
    cr_assert_lt(ut_now_ms(), end, "request never completed");
    rc = api->test(q, &done, size);
  }
  return rc;
}

enum { LEN = 65536 };

/* Forged data completions: every field is checked against what was
 * announced; a violation fails the connection with one WARN and writes
 * nothing. */
static void forged_data(const char* prov) {
  conn c;
  open_conn(prov, &c);
  char* rb = malloc(LEN);
  memset(rb, 0x5a, LEN);
  void* rmh;
  cr_assert_eq(api->reg_mr(c.r, rb, LEN, FAB_PTR_HOST, &rmh), FAB_OK);
  void* q = post_recv(&c, rb, 64, rmh, 7);
  fab_req* r = q;
  uint32_t id = c.rc->local_id;
  ut_reset_warns();
  forge(c.rc, rd_cq_word(RD_DATA, id + 1000, 0, 8)); /* no such connection (closed meanwhile): ignored */
  cr_assert_eq(ut_warns(), 0, "a write for a closed connection is not an error");
  cr_assert_eq(c.rc->error, FAB_OK, "a write naming another connection does not fail this one");
  ut_reset_warns();
  forge(c.rc, rd_cq_word(RD_DATA, id, (r->pool_index << 3) | 5, 8)); /* buffer 5 of a 1-buffer receive */
  cr_assert_eq(ut_warns(), 1);
  cr_assert_eq(c.rc->error, FAB_ERR_REMOTE, "a write naming a buffer that is not posted fails the connection");
  forge(c.rc, rd_cq_word(RD_DATA, id, r->pool_index << 3, 65)); /* larger than the buffer */
  forge(c.rc, rd_cq_word(RD_DATA, id, 40 << 3, 8));              /* a request never used */
  cr_assert_eq(ut_warns(), 1, "a failed connection does not log every further forgery");
  for (int i = 0; i < LEN; i++) cr_assert_eq((unsigned char)rb[i], 0x5a, "byte %d was written", i);
  int done = 0;
  cr_assert_neq(api->test(q, &done, NULL), FAB_OK, "the pending receive reports the failure");
  cr_assert_eq(done, 1);
  void* q2 = NULL;
  cr_assert_neq(api->irecv(c.r, 1, (void*[]){rb}, (size_t[]){8}, (int[]){1}, &rmh, NULL, &q2), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK, "deregistration always goes through (NCCL deregisters before close)");
  close_conn(&c);
  free(rb);
}

Test(rdma, forged_data_tcp) { forged_data("tcp"); }
Test(rdma, forged_data_shm) { forged_data("shm"); }

/* A duplicate completion for a buffer already complete is a protocol error. */
static void duplicate_data(const char* prov) {
  conn c;
  open_conn(prov, &c);
  char *sb = calloc(1, LEN), *rb = calloc(1, LEN);
  void *smh, *rmh, *sq = NULL;
  cr_assert_eq(api->reg_mr(c.s, sb, LEN, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, LEN, FAB_PTR_HOST, &rmh), FAB_OK);
  void* rq = post_recv(&c, rb, LEN, rmh, 3);
  uint32_t slot = ((fab_req*)rq)->pool_index << 3;
  memset(sb, 0x11, LEN);
  while (!sq) cr_assert_eq(api->isend(c.s, sb, 100, 3, smh, NULL, &sq), FAB_OK);
  int got = -1;
  cr_assert_eq(wait_req(rq, &got), FAB_OK);
  cr_assert_eq(got, 100);
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  ut_reset_warns();
  forge(c.rc, rd_cq_word(RD_DATA, c.rc->local_id, slot, 100));
  cr_assert_eq(ut_warns(), 1);
  cr_assert_eq(c.rc->error, FAB_ERR_REMOTE, "a second write for a completed receive fails the connection");
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
  free(sb);
  free(rb);
}

Test(rdma, duplicate_data_tcp) { duplicate_data("tcp"); }
Test(rdma, duplicate_data_shm) { duplicate_data("shm"); }

/* A forged announcement in the sender's mailbox (wrong number, or a slot out
 * of range) fails the send with one WARN; nothing is written. */
static void forged_announcement(const char* prov, int which) {
  conn c;
  open_conn(prov, &c);
  char* sb = calloc(1, LEN);
  void *smh, *sq = NULL;
  cr_assert_eq(api->reg_mr(c.s, sb, LEN, FAB_PTR_HOST, &smh), FAB_OK);
  rd_scomm* s = fab_comm_tp(c.sc);
  rd_ctrl bad = {.addr = 0x1000, .key = 1, .size = 64, .index = 0, .tag = 1, .slot = 0, .check = RD_CTRL_MAGIC};
  if (which == 0) bad.index = 5;                  /* not the announcement the mailbox expects */
  if (which == 1) bad.slot = RD_RECV_REQS << 3;   /* no such receive */
  if (which == 2) bad.check ^= 1;                 /* garbage */
  s->box[0] = bad;
  ut_reset_warns();
  forge(c.sc, rd_cq_word(RD_CTRL, c.sc->local_id, 0, 0));
  forge(c.sc, rd_cq_word(RD_CTRL, c.sc->local_id, 0, RD_SLOTS)); /* a mailbox entry out of range */
  cr_assert_eq(ut_warns(), 1, "the connection fails with one WARN");
  cr_assert_eq(c.sc->error, FAB_ERR_REMOTE);
  ut_reset_warns();
  fab_result rc = api->isend(c.s, sb, 64, 1, smh, NULL, &sq);
  cr_assert_neq(rc, FAB_OK, "a send on a connection whose peer broke the protocol fails");
  cr_assert_eq(sq, NULL);
  cr_assert_eq(ut_warns(), 1);
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  close_conn(&c);
  free(sb);
}

/* The malformed entry itself, seen when the sender consumes it. */
static void forged_entry(const char* prov, int which) {
  conn c;
  open_conn(prov, &c);
  char* sb = calloc(1, LEN);
  void *smh, *sq = NULL;
  cr_assert_eq(api->reg_mr(c.s, sb, LEN, FAB_PTR_HOST, &smh), FAB_OK);
  rd_scomm* s = fab_comm_tp(c.sc);
  rd_ctrl bad = {.addr = 0x1000, .key = 1, .size = 64, .index = 0, .tag = 1, .slot = 0, .check = RD_CTRL_MAGIC};
  if (which == 0) bad.index = 5, bad.check = 5 ^ RD_CTRL_MAGIC;
  if (which == 1) bad.slot = RD_RECV_REQS << 3;
  if (which == 2) bad.check ^= 1;
  if (which == 3) bad.size = (uint64_t)1 << 40;
  s->box[0] = bad;
  ut_reset_warns();
  forge(c.sc, rd_cq_word(RD_CTRL, c.sc->local_id, 0, 0));
  fab_result rc = api->isend(c.s, sb, 64, 1, smh, NULL, &sq);
  cr_assert_neq(rc, FAB_OK, "a malformed announcement (case %d) fails the send", which);
  cr_assert_eq(sq, NULL, "nothing was posted");
  cr_assert_eq(ut_warns(), 2, "one WARN for the protocol error, one for the send");
  cr_assert_eq(c.sc->error, FAB_ERR_REMOTE);
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  close_conn(&c);
  free(sb);
}

Test(rdma, forged_announcement_tcp) { forged_announcement("tcp", 0); }
Test(rdma, forged_announcement_shm) { forged_announcement("shm", 0); }
Test(rdma, forged_entry_number) { forged_entry("tcp", 0); }
Test(rdma, forged_entry_slot) { forged_entry("shm", 1); }
Test(rdma, forged_entry_checksum) { forged_entry("tcp", 2); }
Test(rdma, forged_entry_size) { forged_entry("shm", 3); }

/* A send larger than its receive: nothing is written, the receive fails as
 * truncated with one WARN, and the connection is failed (on every transport
 * alike: the next call on either comm that knows returns the error). Above FABRIC_EAGER_MAX
 * the sender knows the buffer and refuses the send too; an eager message
 * (small) left before the sender could know, so its send succeeds. */
static void truncation_case(conn* c, char* sb, char* rb, void* smh, void* rmh, size_t rsize, size_t ssize,
                            int sender_knows) {
  memset(rb, 0x5a, LEN);
  void* rq = post_recv(c, rb, rsize, rmh, 4);
  void* sq = NULL;
  while (!sq) cr_assert_eq(api->isend(c->s, sb, ssize, 4, smh, NULL, &sq), FAB_OK);
  ut_reset_warns();
  fab_result src = wait_req(sq, NULL);
  cr_assert_eq(wait_req(rq, NULL), FAB_ERR_INVALID_USAGE, "the receive reports truncation");
  if (sender_knows) cr_assert_eq(src, FAB_ERR_INVALID_USAGE, "the send is refused");
  cr_assert_eq(ut_warns(), src == FAB_OK ? 1 : 2, "one WARN per failed request");
  /* a tagged message (asked announcements, small) fills the buffer before its excess goes to the sink */
  int filled = fab_g.params.tagged_max && ssize <= fab_g.params.tagged_max;
  for (int i = filled ? (int)rsize : 0; i < LEN; i++) cr_assert_eq((unsigned char)rb[i], 0x5a, "byte %d was written", i);
  ut_reset_warns();
  void* again = NULL;
  size_t len = 64;
  int tag = 4;
  cr_assert_eq(api->irecv(c->r, 1, (void*[]){rb}, &len, &tag, &rmh, NULL, &again), FAB_ERR_INVALID_USAGE,
               "the receiving comm is failed after a truncation");
  cr_assert_null(again);
  if (sender_knows)
    cr_assert_eq(api->isend(c->s, sb, 8, 4, smh, NULL, &again), FAB_ERR_INVALID_USAGE,
                 "the sending comm that refused the send is failed too");
  cr_assert_eq(ut_warns(), sender_knows ? 2 : 1, "one WARN per refused call");
}

static void truncation_on_new_conn(const char* prov, size_t rsize, size_t ssize, int sender_knows) {
  conn c;
  open_conn(prov, &c);
  char *sb = malloc(LEN), *rb = malloc(LEN);
  memset(sb, 0x11, LEN);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sb, LEN, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, LEN, FAB_PTR_HOST, &rmh), FAB_OK);
  truncation_case(&c, sb, rb, smh, rmh, rsize, ssize, sender_knows);
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
  free(sb);
  free(rb);
}

static void truncation(const char* prov) {
  truncation_on_new_conn(prov, 50, 100, 0); /* eager, announced, or tagged */
  size_t max = fab_g.params.tagged_max ? fab_g.params.tagged_max : (size_t)atoi(getenv("FABRIC_EAGER_MAX"));
  cr_assert_gt(LEN, max + 64, "the large case must be above the eager limit");
  truncation_on_new_conn(prov, max + 32, max + 64, 1);
}

Test(rdma, truncation_tcp) { truncation("tcp"); }
Test(rdma, truncation_shm) { truncation("shm"); }

/* The rdma transport writes into registered receive buffers only: a receive
 * without a memory handle is refused before anything is announced. */
Test(rdma, receive_needs_registration) {
  conn c;
  open_conn("tcp", &c);
  char rb[64];
  void* q = NULL;
  ut_reset_warns();
  cr_assert_neq(api->irecv(c.r, 1, (void*[]){rb}, (size_t[]){64}, (int[]){1}, NULL, NULL, &q), FAB_OK);
  cr_assert_eq(q, NULL);
  cr_assert_eq(ut_warns(), 1);
  close_conn(&c);
}

/* Both ends must run the same transport: a connect request naming another
 * one is refused, and the connector fails at once with a WARN naming both. */
Test(rdma, transport_mismatch) {
  ut_use_provider("tcp");
  setenv("FABRIC_TRANSPORT", "rdma", 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  unsigned char h[FAB_HANDLE_SIZE];
  void *l, *s = NULL, *r = NULL;
  cr_assert_eq(api->listen(ctx, 0, h, &l), FAB_OK);
  cr_assert_eq(api->connect(ctx, 0, NULL, h, &s, NULL), FAB_OK); /* the request names rdma */
  fab_device* d = fab_g.devs[0];
  ut_reset_warns();
  fab_result rc = FAB_OK;
  for (int64_t end = ut_now_ms() + 10000; rc == FAB_OK && !s;) {
    cr_assert_lt(ut_now_ms(), end, "a transport mismatch must not hang");
    d->ops = &fab_sendrecv_ops; /* the listener's side runs sendrecv */
    cr_assert_eq(api->accept(l, &r, NULL), FAB_OK);
    d->ops = &fab_rdma_ops;
    cr_assert_eq(r, NULL, "the mismatched request is refused");
    rc = api->connect(ctx, 0, NULL, h, &s, NULL);
  }
  cr_assert_eq(rc, FAB_ERR_INVALID_USAGE);
  cr_assert_eq(s, NULL);
  cr_assert_eq(ut_warns(), 2, "one WARN on each side");
  cr_assert_eq(api->close_listen(l), FAB_OK);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

/* The core's window check: nothing outside [0, len) of a window is posted. */
Test(rma, window_bounds) {
  fab_window w = {.addr = 0x10000, .len = 4096, .key = 9};
  cr_assert(fab_window_covers(&w, 0, 4096));
  cr_assert(fab_window_covers(&w, 4096, 0));
  cr_assert(!fab_window_covers(&w, 1, 4096));
  cr_assert(!fab_window_covers(&w, 4097, 0));
  cr_assert(!fab_window_covers(&w, UINT64_MAX, 2), "offset + length wrapping around");
  cr_assert(!fab_window_covers(&w, 2, UINT64_MAX));
  conn c;
  open_conn("tcp", &c);
  char buf[64];
  fab_op op;
  memset(&op, 0, sizeof(op));
  fab_endpoint* ep = c.sc->ep;
  cr_assert_eq(fab_remote_writedata(ep, c.sc->peer, buf, 64, NULL, &w, 4090, 0, &op), -FI_EINVAL);
  cr_assert_eq(fab_remote_write(ep, c.sc->peer, buf, 64, NULL, &w, 4033, &op), -FI_EINVAL);
  cr_assert_eq(fab_remote_read(ep, c.sc->peer, buf, 64, NULL, &w, 1ull << 63, &op), -FI_EINVAL);
  cr_assert_eq(fab_remote_inject_writedata(ep, c.sc->peer, buf, 8, &w, 4089, 0, &op), -FI_EINVAL);
  close_conn(&c);
}

/* FABRIC_TRANSPORT=auto follows the measured table (docs/performance.md):
 * rdma on tcp;ofi_rxm, sendrecv on shm; naming a transport overrides it. */
static const fab_transport_ops* chosen(const char* prov, const char* transport) {
  ut_use_provider(prov);
  setenv("FABRIC_TRANSPORT", transport, 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  const fab_transport_ops* t = fab_g.devs[0]->ops;
  cr_assert_eq(api->finalize(ctx), FAB_OK);
  return t;
}

Test(rdma, auto_on_tcp) { cr_assert_eq(chosen("tcp", "auto"), &fab_rdma_ops); }
Test(rdma, auto_on_shm) { cr_assert_eq(chosen("shm", "auto"), &fab_sendrecv_ops); }
Test(rdma, named_on_shm) { cr_assert_eq(chosen("shm", "rdma"), &fab_rdma_ops); }
Test(rdma, named_sendrecv_on_tcp) { cr_assert_eq(chosen("tcp", "sendrecv"), &fab_sendrecv_ops); }
/* params.md's rule: a bad value is one WARN and the default (auto). */
Test(rdma, unknown_transport) {
  ut_use_provider("tcp");
  setenv("FABRIC_TRANSPORT", "carrier-pigeon", 1);
  fab_ctx* ctx;
  ut_reset_warns();
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_expect_eq(ut_warns(), 1);
  cr_expect_eq(fab_g.devs[0]->ops, &fab_rdma_ops, "auto's choice on tcp");
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

Test(rdma, transport_name_without_case) {
  ut_reset_warns();
  cr_expect_eq(chosen("shm", "RDMA"), &fab_rdma_ops);
  cr_expect_eq(chosen("tcp", "SendRecv"), &fab_sendrecv_ops);
  cr_expect_eq(ut_warns(), 0);
}

/* Back-pressure (hardening item 6): with no receive posted, nothing moves
 * but a bounded number of small messages (the eager ring's slots, or the
 * tagged credits under asked announcements). The other sends wait in the
 * sender's queue (no provider buffering at the receiver can grow), complete
 * only as receives are posted, and in order. */
static void no_receive_no_transfer(const char* prov, size_t SZ) {
  enum { N = 200 };
  conn c;
  open_conn(prov, &c);
  /* asked announcements: a small message goes as a tagged message, at most RD_TAGGED_CREDITS before the
   * receiver takes some; announced at post: a small one into the eager ring's slots */
  size_t tmax = fab_g.devs[0]->tagged_max;
  int asked = tmax > 0;
  int eager = asked ? SZ <= tmax : SZ <= fab_g.params.eager_max;
  int bound = asked ? RD_TAGGED_CREDITS / (int)rd_tagged_weight(SZ) : RD_EAGER_SLOTS;
  char* sb = malloc((size_t)N * SZ);
  char* rb = malloc((size_t)N * SZ);
  for (int i = 0; i < N; i++) memset(sb + (size_t)i * SZ, (char)(i + 1), SZ);
  memset(rb, 0, (size_t)N * SZ);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sb, (size_t)N * SZ, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, (size_t)N * SZ, FAB_PTR_HOST, &rmh), FAB_OK);
  void* sq[N];
  for (int i = 0; i < N; i++) {
    sq[i] = NULL;
    while (!sq[i]) cr_assert_eq(api->isend(c.s, sb + (size_t)i * SZ, SZ, 9, smh, NULL, &sq[i]), FAB_OK);
  }
  /* Above the eager limit nothing moves; below it at most the 16 ring slots'
   * worth (the receiver's bounded buffering), the rest waits. */
  int completed = 0;
  for (int round = 0; round < 2000; round++) {
    for (int i = 0; i < N; i++) {
      if (!sq[i]) continue;
      int done = 0;
      cr_assert_eq(api->test(sq[i], &done, NULL), FAB_OK);
      if (done) sq[i] = NULL, completed++;
    }
  }
  rd_scomm* s = fab_comm_tp(c.sc);
  cr_assert_leq((size_t)completed * SZ, (size_t)RD_TAGGED_CREDITS * RD_TAGGED_CREDIT_BYTES,
                "%d sends of %zu bytes completed with no receive posted: more bytes than the credits allow", completed,
                SZ);
  cr_assert_leq(completed, eager ? bound : 0, "%d sends completed with no receive posted", completed);
  if (eager) cr_assert_eq(completed, bound, "the eager ring's slots (or the tagged credits) are used");
  cr_assert_eq(s->nwait, (uint32_t)(N - completed), "the rest waits in the sender's queue");
  for (size_t i = 0; i < N * SZ; i++) cr_assert_eq(rb[i], 0, "byte %zu arrived with no receive posted", i);
  if (asked && eager) cr_assert_eq(rd_r(c.rc)->next_index, 0, "nothing was announced");
  for (int i = 0; i < N; i++) {
    void* rq = post_recv(&c, rb + (size_t)i * SZ, SZ, rmh, 9);
    int got = -1;
    cr_assert_eq(wait_req(rq, &got), FAB_OK);
    cr_assert_eq(got, SZ);
    cr_assert_eq(rb[(size_t)i * SZ], (char)(i + 1), "message %d out of order", i); /* (i + 1) fits a char: N < 255 */
    cr_assert_eq(rb[(size_t)i * SZ + SZ - 1], (char)(i + 1));
  }
  for (int i = 0; i < N; i++)
    if (sq[i]) cr_assert_eq(wait_req(sq[i], NULL), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
  free(sb);
  free(rb);
}

Test(rdma, no_receive_no_transfer_tcp) { no_receive_no_transfer("tcp", 32768); }
Test(rdma, no_receive_no_transfer_shm) { no_receive_no_transfer("shm", 32768); }
Test(rdma, no_receive_eager_bounded_tcp) { no_receive_no_transfer("tcp", 100); }
Test(rdma, no_receive_eager_bounded_shm) { no_receive_no_transfer("shm", 100); }
/* Large tagged messages take credits by size: 200000 bytes weigh 4, so 32 go
 * (about 6 MiB) where 128 small ones would. */
Test(rdma, no_receive_large_tagged_bounded_tcp) {
  setenv("FABRIC_TAGGED_MAX", "262144", 1);
  no_receive_no_transfer("tcp", 200000);
}

/* Confirmations of large tagged messages on tcp (rd_tagged_confirm_due):
 * one write per burst, not per message. While another tagged receive is
 * posted a taken message's credits stay with the receiver; the message that
 * ends the burst sends them all; and one held by a receive never filled
 * goes at a test after RD_CONFIRM_HOLD_MS. Only the endpoint is polled in
 * between (no test on the receive side), so only a take can confirm. */
static int sender_credits_after_polls(conn* c, int polls) {
  for (int i = 0; i < polls; i++) fab_ep_poll(c->sc->ep);
  pthread_mutex_lock(&c->sc->ep->lock);
  int n = (int)rd_s(c->sc)->tcredits;
  pthread_mutex_unlock(&c->sc->ep->lock);
  return n;
}

/* Until the receiver took `credits` worth of messages (or gave them back). */
static void take_polling(conn* c, int credits) {
  for (int64_t end = ut_now_ms() + 10000;
       rd_r(c->rc)->credits < credits && sender_credits_after_polls(c, 1) != RD_TAGGED_CREDITS;)
    cr_assert_lt(ut_now_ms(), end, "the receiver never took the messages");
}

/* Until every credit is back at the sender: `why` fails after 10 s. */
static void credits_come_back(conn* c, const char* why) {
  for (int64_t end = ut_now_ms() + 10000; sender_credits_after_polls(c, 1) != RD_TAGGED_CREDITS;)
    cr_assert_lt(ut_now_ms(), end, "%s", why);
}

/* The confirmation tests' pair: tcp, and buffers of n messages of
 * CONFIRM_SZ bytes each way, sent tagged and heavy enough to be confirmed. */
enum { CONFIRM_SZ = 100000 };
typedef struct confirm_pair {
  conn c;
  char *sb, *rb;
  void *smh, *rmh;
} confirm_pair;

static void confirm_open(confirm_pair* p, int n) {
  setenv("FABRIC_TAGGED_MAX", "262144", 1);
  open_conn("tcp", &p->c);
  cr_assert(rd_tagged_confirms(p->c.sc, rd_tagged_weight(CONFIRM_SZ)), "tcp confirms messages of %d bytes",
            CONFIRM_SZ);
  size_t len = (size_t)n * CONFIRM_SZ;
  p->sb = malloc(len);
  p->rb = malloc(len);
  cr_assert_eq(api->reg_mr(p->c.s, p->sb, len, FAB_PTR_HOST, &p->smh), FAB_OK);
  cr_assert_eq(api->reg_mr(p->c.r, p->rb, len, FAB_PTR_HOST, &p->rmh), FAB_OK);
}

/* Message i of the send buffer, and a receive into slot i. */
static void* confirm_send(confirm_pair* p, int i) {
  void* q = NULL;
  cr_assert_eq(api->isend(p->c.s, p->sb + (size_t)i * CONFIRM_SZ, CONFIRM_SZ, 9, p->smh, NULL, &q), FAB_OK);
  cr_assert(q);
  return q;
}

static void* confirm_recv(confirm_pair* p, int i) {
  return post_recv(&p->c, p->rb + (size_t)i * CONFIRM_SZ, CONFIRM_SZ, p->rmh, 9);
}

/* The buffers go (after the comms' close too: allowed while the context lives). */
static void confirm_free(confirm_pair* p) {
  cr_assert_eq(api->dereg_mr(p->c.s, p->smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(p->c.r, p->rmh), FAB_OK);
  free(p->sb);
  free(p->rb);
}

Test(rdma, confirm_once_per_burst_tcp) {
  enum { N = 5 };
  confirm_pair p;
  confirm_open(&p, N);
  conn* c = &p.c;
  int w = (int)rd_tagged_weight(CONFIRM_SZ);
  void *rq[N], *sq[N];
  /* one message taken, two more receives posted: its credits wait */
  for (int i = 0; i < 3; i++) rq[i] = confirm_recv(&p, i);
  sq[0] = confirm_send(&p, 0);
  take_polling(c, w);
  int held = sender_credits_after_polls(c, 20000);
  cr_assert_eq(held, RD_TAGGED_CREDITS - w,
               "more receives are posted: the message's credits wait for the burst's end (%d held)", held);
  cr_assert(rd_tagged_unproven(c->sc), "a close would still ask for proof of its delivery");
  /* the burst's last message gives every credit back, at once */
  for (int i = 1; i < 3; i++) sq[i] = confirm_send(&p, i);
  credits_come_back(c, "the message that ends the burst gives every credit back");
  cr_assert(!rd_tagged_unproven(c->sc));
  /* one held by a receive never filled goes at a test once the hold is over */
  for (int i = 3; i < N; i++) rq[i] = confirm_recv(&p, i);
  sq[3] = confirm_send(&p, 3);
  take_polling(c, w);
  usleep(3000 * RD_CONFIRM_HOLD_MS);
  int done = 0;
  cr_assert_eq(api->test(rq[4], &done, NULL), FAB_OK); /* never filled yet: the hold is over */
  cr_assert(!done);
  credits_come_back(c, "a confirmation held by an unfilled receive goes after RD_CONFIRM_HOLD_MS");

  sq[4] = confirm_send(&p, 4);
  for (int i = 0; i < N; i++) {
    int got = -1;
    cr_assert_eq(wait_req(rq[i], &got), FAB_OK);
    cr_assert_eq(got, CONFIRM_SZ);
    cr_assert_eq(wait_req(sq[i], NULL), FAB_OK);
  }
  confirm_free(&p);
  close_conn(c);
  cr_expect_eq(ut_warns(), 0);
}

/* This process's resident memory, KiB. */
static long rss_kib(void) {
  FILE* f = fopen("/proc/self/status", "r");
  cr_assert(f);
  char line[256];
  long kib = -1;
  while (kib < 0 && fgets(line, sizeof(line), f))
    if (!strncmp(line, "VmRSS:", 6)) kib = strtol(line + 6, NULL, 10);
  fclose(f);
  cr_assert_gt(kib, 0);
  return kib;
}

/* A message that arrives before its receive takes a spare buffer of
 * ofi_rxm's receive pool, with rxm's own 4096 posted buffers (the pool grown
 * as the endpoint opens, FABRIC_RXM_WARM_POOL) and with the plugin's 512
 * (FABRIC_RXM_RX_SIZE: the pool's first chunk has spares). Otherwise this
 * first early message makes rxm zero a new chunk of 1024 buffers (17 MiB)
 * inside one poll: 10-13 ms that fell on a timed iteration of NCCL's small
 * all_reduce. */
static void early_message_takes_a_spare(const char* rx_size, const char* warm) {
  enum { SZ = 64 };
  setenv("FABRIC_TAGGED_MAX", "65536", 1);
  setenv("FABRIC_RXM_RX_SIZE", rx_size, 1); /* read before libfabric loads: this test's process is fresh */
  setenv("FABRIC_RXM_WARM_POOL", warm, 1);
  conn c;
  open_conn("tcp", &c);
  static char sb[SZ], rb[SZ];
  void *smh, *rmh, *sq = NULL;
  cr_assert_eq(api->reg_mr(c.s, sb, SZ, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, SZ, FAB_PTR_HOST, &rmh), FAB_OK);
  /* the receive first: whatever a first send costs is paid here */
  void* rq = post_recv(&c, rb, SZ, rmh, 3);
  cr_assert_eq(api->isend(c.s, sb, SZ, 3, smh, NULL, &sq), FAB_OK);
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  cr_assert_eq(wait_req(rq, NULL), FAB_OK);
  long before = rss_kib();
  cr_assert_eq(api->isend(c.s, sb, SZ, 4, smh, NULL, &sq), FAB_OK);
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  for (int64_t end = ut_now_ms() + 50; ut_now_ms() < end;) fab_ep_poll(c.rc->ep); /* it lands, unexpected */
  rq = post_recv(&c, rb, SZ, rmh, 4);
  cr_assert_eq(wait_req(rq, NULL), FAB_OK);
  long grown = rss_kib() - before;
  cr_assert_lt(grown, 8192, "a message taken before its receive grew this process by %ld KiB: rxm's receive pool "
               "had no spare buffer (FABRIC_RXM_RX_SIZE=%s)", grown, rx_size);
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
}

Test(rdma, rxm_pool_grown_at_open_tcp) { early_message_takes_a_spare("0", "1"); }
/* The warm-up off: the spare is the 512 posted buffers' own */
Test(rdma, rxm_pool_spares_at_512_tcp) { early_message_takes_a_spare("512", "0"); }

/* FABRIC_RXM_RX_SIZE: over tcp rxm posts 512 receive buffers per endpoint
 * rather than its own 4096 (16 KiB each, shared by the endpoint's
 * connections), so the first endpoint and its comms cost about 36 MiB
 * rather than 104, on every rail. */
/* ...but never where rxm may run over verbs, whose count is per connection
 * (128 by default), nor over the environment's own value. */
Test(rdma, rxm_rx_size_where_rxm_runs_over_tcp) {
  const char* env = "FI_OFI_RXM_MSG_RX_SIZE";
  unsetenv(env);
  unsetenv("FI_PROVIDER");
  fab_g.params.rxm_rx_size = 512;
  snprintf(fab_g.params.provider, sizeof(fab_g.params.provider), "verbs;ofi_rxm");
  fab_rxm_size_receive_pool();
  cr_expect_null(getenv(env), "rxm may run over verbs: left alone");
  snprintf(fab_g.params.provider, sizeof(fab_g.params.provider), "^verbs");
  fab_rxm_size_receive_pool();
  cr_expect_str_eq(getenv(env) ? getenv(env) : "(unset)", "512", "verbs excluded: set");
  snprintf(fab_g.params.provider, sizeof(fab_g.params.provider), "verbs");
  fab_rxm_size_receive_pool();
  cr_expect_null(getenv(env), "a later start over verbs takes back what an earlier one set");
  setenv(env, "2048", 1);
  snprintf(fab_g.params.provider, sizeof(fab_g.params.provider), "tcp");
  fab_rxm_size_receive_pool();
  cr_expect_str_eq(getenv(env), "2048", "the environment's own value is kept");
  unsetenv(env);
  fab_g.params.rxm_rx_size = 0;
  fab_rxm_size_receive_pool();
  cr_expect_null(getenv(env), "0: rxm's own count");
}

Test(rdma, rxm_rx_size_bounds_endpoint_memory_tcp) {
  long before = rss_kib();
  conn c;
  open_conn("tcp", &c); /* FABRIC_PROVIDER=tcp: rxm cannot run over verbs here */
  long grown = rss_kib() - before;
  cr_expect_lt(grown, 64 * 1024, "the first endpoint and its comms cost %ld KiB: did rxm post its own 4096 "
               "receive buffers (FI_OFI_RXM_MSG_RX_SIZE=%s)?", grown, getenv("FI_OFI_RXM_MSG_RX_SIZE"));
  close_conn(&c);
}

/* A test's CQ read does not wait while another thread holds the endpoint's
 * cq_lock (where a rail's polling thread runs, the lock is its CQ read, which
 * may be copying a 512 KiB message out of its socket): that thread is
 * progressing the endpoint. Waiting for it had NCCL's proxy thread spin for a
 * third of its time in a 64 MiB all_reduce over four rails. */
static void* release_cq_lock_later(void* arg) {
  fab_endpoint* ep = arg;
  usleep(300 * 1000);
  atomic_flag_clear_explicit(&ep->cq_lock, memory_order_release);
  return NULL;
}

Test(rdma, poll_leaves_a_held_cq_to_its_holder_tcp) {
  conn c;
  open_conn("tcp", &c);
  fab_endpoint* ep = c.rc->ep;
  atomic_store(&ep->cq_gated, 1); /* as where a rail's thread runs */
  cr_assert(!atomic_flag_test_and_set_explicit(&ep->cq_lock, memory_order_acquire), "the lock was free");
  pthread_t holder;
  cr_assert_eq(pthread_create(&holder, NULL, release_cq_lock_later, ep), 0);
  int64_t t0 = ut_now_ms();
  cr_expect_eq(fab_ep_poll(ep), FAB_OK);
  int64_t took = ut_now_ms() - t0;
  pthread_join(holder, NULL);
  cr_expect_lt(took, 100, "a poll waited %lld ms for the thread that held the CQ lock", (long long)took);
  cr_expect_eq(fab_ep_poll(ep), FAB_OK, "and reads the CQ once the lock is free");
  cr_expect(!atomic_flag_test_and_set_explicit(&ep->cq_lock, memory_order_acquire), "and leaves it free");
  atomic_flag_clear_explicit(&ep->cq_lock, memory_order_release);
  atomic_store(&ep->cq_gated, 0);
  close_conn(&c);
}

/* A receiver that closes with a receive still posted writes the
 * confirmation it owes first (its sender may be closed already, waiting for
 * proof of delivery): every credit comes back, the closed sender is freed
 * at once, and finalize neither waits out the drain time nor warns. */
Test(rdma, confirm_at_receiver_close_tcp) {
  confirm_pair p;
  confirm_open(&p, 2);
  conn* c = &p.c;
  void* rq = confirm_recv(&p, 0);
  confirm_recv(&p, 1); /* never filled */
  void* sq = confirm_send(&p, 0);
  cr_assert_eq(wait_req(rq, NULL), FAB_OK);
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  cr_assert(rd_tagged_unproven(c->sc), "a receive is still posted: the confirmation waits");
  fab_endpoint* ep = c->sc->ep;
  cr_assert_eq(api->close_recv(c->r), FAB_OK);
  credits_come_back(c, "the receiver's close wrote the confirmation it owed");
  cr_assert(!rd_tagged_unproven(c->sc));
  cr_assert_eq(api->close_send(c->s), FAB_OK);
  for (int64_t end = ut_now_ms() + 5000; atomic_load(&ep->nclosing) > 0 && ut_now_ms() < end;) fab_ep_poll(ep);
  cr_expect_eq(atomic_load(&ep->nclosing), 0, "the closed sender has its proof from the receiver's credits");
  confirm_free(&p);
  cr_assert_eq(api->close_listen(c->l), FAB_OK);
  int64_t t0 = ut_now_ms();
  cr_assert_eq(api->finalize(c->ctx), FAB_OK);
  int64_t took = ut_now_ms() - t0;
  cr_expect_eq(ut_warns(), 0, "the receiver's close confirmed the message");
  cr_expect_lt(took, FAB_CLOSE_DRAIN_MS, "finalize took %lld ms", (long long)took);
}

/* Proof of delivery for a closed send comm over tcp (fab_delivery.c), on
 * both transports. The pair's sends of PROOF_N messages of PROOF_SZ bytes
 * (rdma: tagged, too light to be confirmed) complete before any receive is
 * posted: the receiver took none, so nothing but a delivery probe proves
 * them. */
enum { PROOF_N = 3, PROOF_SZ = 4096 };
static char proof_sb[PROOF_N * PROOF_SZ], proof_rb[PROOF_N * PROOF_SZ];

static void proof_send_all(const char* transport, conn* c, void** smh, void** rmh) {
  setenv("FABRIC_TAGGED_MAX", "262144", 1);
  open_conn_with("tcp", transport, c);
  cr_assert_eq(api->reg_mr(c->s, proof_sb, sizeof(proof_sb), FAB_PTR_HOST, smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c->r, proof_rb, sizeof(proof_rb), FAB_PTR_HOST, rmh), FAB_OK);
  for (size_t i = 0; i < sizeof(proof_sb); i++) proof_sb[i] = (char)(i * 13 + 5);
  memset(proof_rb, 0, sizeof(proof_rb));
  for (int i = 0; i < PROOF_N; i++) {
    void* q = NULL;
    cr_assert_eq(api->isend(c->s, proof_sb + i * PROOF_SZ, PROOF_SZ, 5, *smh, NULL, &q), FAB_OK);
    cr_assert(q);
    cr_assert_eq(wait_req(q, NULL), FAB_OK);
  }
  pthread_mutex_lock(&c->sc->ep->lock);
  uint64_t unproven = c->sc->ops->unproven(c->sc);
  pthread_mutex_unlock(&c->sc->ep->lock);
  cr_assert(unproven, "%s: the receiver took none of them: none is proven", transport);
}

/* Polls both ends until no closed comm is left on the sender's endpoint,
 * for at most ms; how many are left. */
static int closed_left_after(fab_endpoint* sep, fab_endpoint* rep, int ms) {
  for (int64_t end = ut_now_ms() + ms; atomic_load(&sep->nclosing) > 0 && ut_now_ms() < end;) {
    fab_ep_poll(sep);
    if (rep != sep) fab_ep_poll(rep);
  }
  return atomic_load(&sep->nclosing);
}

/* Finalize with what is left: how long it took, in ms. */
static int64_t proof_finish(conn* c, void* smh) {
  cr_assert_eq(api->dereg_mr(c->s, smh), FAB_OK);
  cr_assert_eq(api->close_listen(c->l), FAB_OK);
  int64_t t0 = ut_now_ms();
  cr_assert_eq(api->finalize(c->ctx), FAB_OK);
  return ut_now_ms() - t0;
}

/* The receiver's engine answers the probe as it reads it, before any
 * receive is posted: the closed comm is freed, and the messages, read into
 * the provider's memory, then complete their receives intact. */
static void proven_by_probe(const char* transport) {
  conn c;
  void *smh, *rmh;
  proof_send_all(transport, &c, &smh, &rmh);
  fab_endpoint *sep = c.sc->ep, *rep = c.rc->ep;
  cr_assert_eq(api->close_send(c.s), FAB_OK);
  cr_assert_eq(closed_left_after(sep, rep, 5000), 0, "the receiver's answer freed the closed send comm");
  for (int i = 0; i < PROOF_N; i++) {
    int size = -1;
    cr_assert_eq(wait_req(post_recv(&c, proof_rb + i * PROOF_SZ, PROOF_SZ, rmh, 5), &size), FAB_OK);
    cr_assert_eq(size, PROOF_SZ);
  }
  cr_assert_eq(memcmp(proof_sb, proof_rb, sizeof(proof_sb)), 0, "the messages arrived intact");
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  cr_assert_eq(api->close_recv(c.r), FAB_OK);
  cr_expect_lt(proof_finish(&c, smh), FAB_CLOSE_DRAIN_MS);
  cr_expect_eq(ut_warns(), 0);
}

Test(rdma, closed_sender_proven_by_probe_tcp) { proven_by_probe("rdma"); }
Test(rdma, closed_sender_proven_by_probe_tcp_sendrecv) { proven_by_probe("sendrecv"); }

/* A receiver that closes without taking them says that nothing more will be
 * taken: the closed sender is freed, and finalize neither waits nor warns. */
static void freed_when_receiver_closes(const char* transport) {
  conn c;
  void *smh, *rmh;
  proof_send_all(transport, &c, &smh, &rmh);
  fab_endpoint *sep = c.sc->ep, *rep = c.rc->ep;
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  cr_assert_eq(api->close_recv(c.r), FAB_OK);
  cr_assert_eq(api->close_send(c.s), FAB_OK);
  cr_assert_eq(closed_left_after(sep, rep, 5000), 0, "the receiver's close freed the closed send comm");
  cr_expect_lt(proof_finish(&c, smh), FAB_CLOSE_DRAIN_MS);
  cr_expect_eq(ut_warns(), 0);
}

Test(rdma, closed_sender_freed_when_receiver_closes_tcp) { freed_when_receiver_closes("rdma"); }
Test(rdma, closed_sender_freed_when_receiver_closes_tcp_sendrecv) { freed_when_receiver_closes("sendrecv"); }

/* A peer that never answers (here: the probe and the receiver's close name
 * a comm the other end does not know, as for a peer that stopped calling the
 * plugin): the closed send comm stays parked, finalize waits
 * FAB_CLOSE_DRAIN_MS for its proof, then says in one WARN that the messages
 * may be lost. */
static void unanswered_warns_at_finalize(const char* transport) {
  conn c;
  void *smh, *rmh;
  proof_send_all(transport, &c, &smh, &rmh);
  fab_endpoint *sep = c.sc->ep, *rep = c.rc->ep;
  pthread_mutex_lock(&sep->lock);
  c.sc->peer_id ^= 0x5a5;
  pthread_mutex_unlock(&sep->lock);
  cr_assert_eq(api->close_send(c.s), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  cr_assert_eq(api->close_recv(c.r), FAB_OK);
  cr_assert_eq(closed_left_after(sep, rep, 300), 1, "nothing proves the messages: the closed comm waits");
  cr_assert_eq(ut_warns(), 0);
  int64_t took = proof_finish(&c, smh);
  cr_expect_geq(took, FAB_CLOSE_DRAIN_MS - 50, "finalize waited %lld ms for the proof", (long long)took);
  cr_expect_eq(ut_warns(), 1, "one WARN says the messages may be lost");
}

Test(rdma, closed_sender_unanswered_warns_at_finalize_tcp) { unanswered_warns_at_finalize("rdma"); }
Test(rdma, closed_sender_unanswered_warns_at_finalize_tcp_sendrecv) { unanswered_warns_at_finalize("sendrecv"); }

/* A confirmation whose write the provider refused stays owed and goes at a
 * later test. The refusal is made by shrinking the sender's mailbox as this
 * side knows it, so that the write's window check fails: the same branch as
 * a full transmit queue. */
Test(rdma, confirm_retried_after_failed_write_tcp) {
  confirm_pair p;
  confirm_open(&p, 2);
  conn* c = &p.c;
  int w = (int)rd_tagged_weight(CONFIRM_SZ);
  rd_rcomm* rc = rd_r(c->rc);
  uint64_t box_len = rc->box.len;
  rc->box.len = 0;
  void* rq = confirm_recv(&p, 0);
  void* sq = confirm_send(&p, 0);
  cr_assert_eq(wait_req(rq, NULL), FAB_OK);
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  cr_assert_eq(sender_credits_after_polls(c, 20000), RD_TAGGED_CREDITS - w, "the confirmation could not be written");
  cr_assert(atomic_load(&rc->confirm_owed), "it stays owed");
  cr_assert_eq(rc->credits, w);
  rc->box.len = box_len;
  void* idle = confirm_recv(&p, 1); /* a test to make; it also holds the confirmation for a while */
  usleep(3000 * RD_CONFIRM_HOLD_MS);
  int done = 0;
  cr_assert_eq(api->test(idle, &done, NULL), FAB_OK);
  credits_come_back(c, "the owed confirmation was written at a later test");
  cr_assert(!rd_tagged_unproven(c->sc));
  cr_assert(!atomic_load(&rc->confirm_owed));
  sq = confirm_send(&p, 0);
  cr_assert_eq(wait_req(idle, NULL), FAB_OK);
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  confirm_free(&p);
  close_conn(c);
  cr_expect_eq(ut_warns(), 0);
}

/* A tagged message of host memory within the provider's inject size goes
 * inline (fab_dev_tagged_inline): its request is done as isend returns,
 * before any completion is read (over tcp, libfabric 1.17's CQ writes and
 * reads a socket pair per batch of completions); one byte more is not. Over
 * tcp, the closed send comm then asks the receiver for proof that they
 * arrived: a delivery probe posted after them, answered once the receiver
 * read it (shm places them at once: nothing to prove). */
static void small_message_goes_inline(const char* prov, const char* transport) {
  setenv("FABRIC_TAGGED_MAX", "262144", 1);
  conn c;
  open_conn_with(prov, transport, &c);
  int rdma = !strcmp(transport, "rdma");
  size_t inj = c.sc->ep->dev->inject_size, len = 2 * inj + 2;
  cr_assert(inj > 0 && inj < 65536, "%s injects (%zu bytes)", prov, inj);
  char *sb = malloc(len), *rb = malloc(len);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sb, len, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, len, FAB_PTR_HOST, &rmh), FAB_OK);
  for (size_t i = 0; i < len; i++) sb[i] = (char)(i * 7 + 1);
  memset(rb, 0, len);
  void *small = NULL, *large = NULL;
  cr_assert_eq(api->isend(c.s, sb, inj, 7, smh, NULL, &small), FAB_OK);
  cr_assert(small);
  cr_assert_eq(atomic_load(&((fab_req*)small)->pending), 0, "a message of the inject size (%zu) is done as isend "
               "returns", inj);
  cr_assert_eq(api->isend(c.s, sb + inj, inj + 1, 7, smh, NULL, &large), FAB_OK);
  cr_assert(large);
  cr_assert_neq(atomic_load(&((fab_req*)large)->pending), 0, "one byte more waits for its completion");
  int size = 0;
  cr_assert_eq(wait_req(post_recv(&c, rb, inj, rmh, 7), &size), FAB_OK);
  cr_assert_eq(size, (int)inj);
  cr_assert_eq(wait_req(post_recv(&c, rb + inj, inj + 1, rmh, 7), &size), FAB_OK);
  cr_assert_eq(size, (int)inj + 1);
  cr_assert_eq(memcmp(sb, rb, 2 * inj + 1), 0, "the bytes arrived");
  int done = 0;
  cr_assert_eq(api->test(small, &done, NULL), FAB_OK);
  cr_assert(done);
  cr_assert_eq(wait_req(large, NULL), FAB_OK);
  fab_endpoint* ep = c.sc->ep;
  pthread_mutex_lock(&ep->lock);
  int waits = rdma && rd_tagged_unproven(c.sc);
  pthread_mutex_unlock(&ep->lock);
  if (ep->dev->local_only)
    cr_assert(!waits, "on %s an inline message is placed as it is posted: close has nothing to prove", prov);
  else if (rdma)
    cr_assert(waits, "the receiver holds their credits: a closed comm asks for proof of their delivery");
  int64_t t0 = ut_now_ms();
  cr_assert_eq(api->close_send(c.s), FAB_OK);
  for (int64_t end = ut_now_ms() + 5000; atomic_load(&ep->nclosing) > 0 && ut_now_ms() < end;) fab_ep_poll(ep);
  cr_expect_lt(ut_now_ms() - t0, FAB_CLOSE_DRAIN_MS, "the closed comm had its proof at once");
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  free(sb);
  free(rb);
  cr_assert_eq(api->close_recv(c.r), FAB_OK);
  cr_assert_eq(api->close_listen(c.l), FAB_OK);
  cr_assert_eq(api->finalize(c.ctx), FAB_OK);
  cr_expect_eq(ut_warns(), 0);
}
Test(rdma, small_message_goes_inline_tcp) { small_message_goes_inline("tcp", "rdma"); }
Test(rdma, small_message_goes_inline_shm) { small_message_goes_inline("shm", "rdma"); }
/* the sendrecv transport: on shm (its default there) only, which needs no proof at close */
Test(rdma, small_message_goes_inline_shm_sendrecv) { small_message_goes_inline("shm", "sendrecv"); }

/* Eager and announced messages interleaved on the same tags, before any
 * receive is posted, then taken by grouped receives (the deadlock class of
 * aws-ofi-nccl PR #1194: a large send waiting for its buffer's announcement
 * while small ones of the same tag went ahead eagerly, and more small ones
 * than the eager ring holds). The k-th send of a tag must land in the k-th
 * buffer of that tag whatever path each took; nothing may wait for ever. */
static void eager_interleaved(const char* prov) {
  enum { BIG = 12000, SMALL = 64, NSMALL = 40, ROUNDS = 3, SLOT = BIG };
  conn c;
  open_conn(prov, &c);
  cr_assert_gt(BIG, fab_g.params.eager_max, "BIG must take the announced path");
  cr_assert_leq(SMALL, fab_g.params.eager_max, "SMALL must be able to go eager");
  enum { NMSG = 4 + NSMALL };
  char* sb = malloc((size_t)NMSG * SLOT);
  char* rb = malloc((size_t)NMSG * SLOT);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sb, (size_t)NMSG * SLOT, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, (size_t)NMSG * SLOT, FAB_PTR_HOST, &rmh), FAB_OK);
  for (int round = 0; round < ROUNDS; round++) {
    /* sends, in this order: tag 1 big, tag 1 small, tag 2 small, tag 2 big, then NSMALL small on tag 3 */
    int tags[NMSG];
    size_t sizes[NMSG];
    for (int m = 0; m < NMSG; m++) {
      tags[m] = m < 4 ? 1 + m / 2 : 3;
      sizes[m] = (m == 0 || m == 3) ? BIG : SMALL;
      memset(sb + (size_t)m * SLOT, (char)(round * 50 + m + 1), sizes[m]);
    }
    void* sq[NMSG];
    for (int m = 0; m < NMSG; m++) {
      sq[m] = NULL;
      while (!sq[m]) cr_assert_eq(api->isend(c.s, sb + (size_t)m * SLOT, sizes[m], tags[m], smh, NULL, &sq[m]), FAB_OK);
    }
    for (int poll = 0; poll < 200; poll++) { /* let the eager ones land and be held */
      int done;
      for (int m = 0; m < NMSG; m++)
        if (sq[m] && api->test(sq[m], &done, NULL) == FAB_OK && done) sq[m] = NULL;
    }
    memset(rb, 0, (size_t)NMSG * SLOT);
    /* one grouped receive for tags 1,1,2,2 (every buffer big enough), then
     * groups of 8 for tag 3, posted in the order of their sends */
    void* rq[1 + NSMALL / 8];
    void* d[8];
    size_t rs[8];
    int rt[8];
    void* mh[8];
    for (int i = 0; i < 4; i++) d[i] = rb + (size_t)i * SLOT, rs[i] = SLOT, rt[i] = tags[i], mh[i] = rmh;
    rq[0] = NULL;
    while (!rq[0]) cr_assert_eq(api->irecv(c.r, 4, d, rs, rt, mh, NULL, &rq[0]), FAB_OK);
    for (int g = 0; g < NSMALL / 8; g++) {
      for (int i = 0; i < 8; i++)
        d[i] = rb + (size_t)(4 + g * 8 + i) * SLOT, rs[i] = SLOT, rt[i] = 3, mh[i] = rmh;
      rq[1 + g] = NULL;
      while (!rq[1 + g]) cr_assert_eq(api->irecv(c.r, 8, d, rs, rt, mh, NULL, &rq[1 + g]), FAB_OK);
    }
    int got[8];
    cr_assert_eq(wait_req(rq[0], got), FAB_OK, "round %d: the tags 1/2 group", round);
    for (int i = 0; i < 4; i++) cr_assert_eq(got[i], (int)sizes[i], "round %d buffer %d: %d bytes", round, i, got[i]);
    for (int g = 0; g < NSMALL / 8; g++) {
      cr_assert_eq(wait_req(rq[1 + g], got), FAB_OK, "round %d: tag 3 group %d", round, g);
      for (int i = 0; i < 8; i++) cr_assert_eq(got[i], SMALL);
    }
    for (int m = 0; m < NMSG; m++) {
      if (sq[m]) cr_assert_eq(wait_req(sq[m], NULL), FAB_OK);
      const char* b = rb + (size_t)m * SLOT;
      for (size_t i = 0; i < sizes[m]; i++)
        cr_assert_eq(b[i], (char)(round * 50 + m + 1), "round %d message %d byte %zu: wrong buffer or data", round,
                     m, i);
    }
  }
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
  free(sb);
  free(rb);
}

Test(rdma, eager_interleaved_tcp) { eager_interleaved("tcp"); }
Test(rdma, eager_interleaved_shm) { eager_interleaved("shm"); }

/* A window deregistered while the peer still holds its key (NCCL deregisters
 * before it closes the comm): the deregistration goes through with one WARN,
 * the registration is closed at once so a late write from the peer is refused
 * by the provider (nothing lands), and the receive fails with one WARN
 * instead of waiting for ever. */
static void deregistered_window(const char* prov) {
  enum { SZ = 65536 };
  conn c;
  open_conn(prov, &c);
  char* rb = malloc(SZ);
  memset(rb, 0x5a, SZ);
  void* rmh;
  cr_assert_eq(api->reg_mr(c.r, rb, SZ, FAB_PTR_HOST, &rmh), FAB_OK);
  void* rq = post_recv(&c, rb, SZ, rmh, 6);
  ut_reset_warns();
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  cr_assert_eq(ut_warns(), 1, "the deregistration says the receive will fail");
  ut_reset_warns();
  cr_assert_eq(wait_req(rq, NULL), FAB_ERR_INVALID_USAGE, "the receive fails instead of waiting for ever");
  cr_assert_eq(ut_warns(), 1);
  for (int i = 0; i < SZ; i++) cr_assert_eq((unsigned char)rb[i], 0x5a, "byte %d was written", i);
  close_conn(&c);
  free(rb);
}

Test(rdma, deregistered_window_tcp) { deregistered_window("tcp"); }
Test(rdma, deregistered_window_shm) { deregistered_window("shm"); }

/* --- the narrow (4-byte) CQ data format (rd_proto.h) ------------------------------- */

/* Every kind of word survives the narrow format: what the target reads back
 * is what the writer meant, with the sizes from the completion's length. */
Test(rdma_format, narrow_round_trip) {
  const uint32_t id = RD_NARROW_ID_MAX;
  struct {
    uint64_t word;
    uint64_t len;
  } cases[] = {
      {rd_cq_word(RD_CTRL, id, 0, 511), 48},                               /* an announcement in entry 511 */
      {rd_cq_word(RD_CTRL, id, 0, RD_NO_ENTRY | 0x3fffu << 16), 8},      /* credits only, every slot */
      {rd_cq_word(RD_DATA, id, 0x3fd, 1u << 30), 1u << 30},               /* a 1 GiB write, last slot */
      {rd_cq_word(RD_DATA, id, 0, 0), 0},                                 /* an empty message */
      {rd_cq_word(RD_DATA, 7, RD_ONESIDED_SLOT, 6u << 28 | 0x7ff), 8},   /* one-sided, largest kind and value */
      {rd_cq_word(RD_EAGER, id, 13, 4096), sizeof(rd_eager_hdr) + 4096}, /* eager slot 13 */
      {rd_cq_word(RD_EAGER, id, RD_ACK_SLOT, 0x3fff), 8},                 /* an acknowledgement, mod 2^14 */
      {rd_cq_word(RD_TRUNC, id, 0x155, 0), 0},                            /* ABANDONED */
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    uint64_t wire = rd_cq_wire(1, cases[i].word), back = 0;
    cr_assert_eq(wire >> 32, 0, "case %zu: the narrow word has more than 32 bits", i);
    cr_assert_eq(rd_cq_widen(wire, cases[i].len, &back), 0, "case %zu refused", i);
    cr_expect_eq(back, cases[i].word, "case %zu: 0x%llx came back as 0x%llx", i, (unsigned long long)cases[i].word,
                 (unsigned long long)back);
    cr_expect_eq(rd_cq_wire(0, cases[i].word), cases[i].word, "case %zu: the 8-byte format is the word itself", i);
  }
  /* a refused size is not carried: the receive still fails as truncated */
  uint64_t back = 0;
  cr_assert_eq(rd_cq_widen(rd_cq_wire(1, rd_cq_word(RD_TRUNC, 3, 8, 70000)), 0, &back), 0);
  cr_expect_eq(rd_cq_low(back), RD_SIZE_UNKNOWN);
}

/* Words no writer of ours sends are refused before anything is looked up. */
Test(rdma_format, narrow_refuses_malformed) {
  uint64_t out;
  cr_expect_neq(rd_cq_widen(1ull << 32, 8, &out), 0, "more than 32 bits");
  cr_expect_neq(rd_cq_widen((uint64_t)RD_DATA << 30 | 0x400, 8, &out), 0, "a data slot past 10 bits");
  cr_expect_neq(rd_cq_widen((uint64_t)RD_EAGER << 30 | 3, 8, &out), 0, "an eager message shorter than its header");
  cr_expect_neq(rd_cq_widen((uint64_t)RD_TRUNC << 30 | 0x800, 0, &out), 0, "a truncation slot past 10 bits");
  cr_expect_neq(rd_cq_widen((uint64_t)RD_DATA << 30, 1ull << 32, &out), 0, "a length past 32 bits");
}

/* Counts sent mod 2^14 are widened against the receiver's, either way. */
Test(rdma_format, counts_widen) {
  cr_expect_eq(rd_widen_count(5, 0xfffffff0u), 0x100000005u & 0xffffffffu); /* across the 32-bit wrap */
  cr_expect_eq(rd_widen_count(0x3fff & 100, 0x12340000u + 90), 0x12340000u + 100);
  cr_expect_eq(rd_widen_count(0x3fff & 80, 0x12340000u + 90), 0x12340000u + 80); /* an older one */
  cr_expect_eq(rd_widen_count((0x12344000u + 3) & 0x3fff, 0x12343ff0u), 0x12344003u);
}

/* FABRIC_NIC_PROFILE=efa: 4 bytes of CQ data. shm reports write lengths, so
 * the rdma transport runs there in the narrow format; libfabric 1.x's tcp
 * reports none, so auto takes sendrecv there and names why. */
Test(rdma_format, efa_profile_on_shm) {
  setenv("FABRIC_NIC_PROFILE", "efa", 1);
  cr_assert_eq(chosen("shm", "rdma"), &fab_rdma_ops);
  ut_use_provider("shm");
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  fab_device* d = fab_g.devs[0];
  cr_expect(d->cq_narrow, "the device uses the narrow format");
  cr_expect_leq(d->tags.conn_max, RD_NARROW_ID_MAX, "connection ids fit 15 bits");
  cr_expect(d->mr_local, "EFA asks FI_MR_LOCAL: every buffer registered");
  cr_expect_leq(d->inject_size, 4096, "EFA's inject size");
  cr_expect_leq(d->info->domain_attr->mr_key_size, 4, "EFA's keys are 4 bytes");
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

/* The profile's narrowing of an fi_getinfo answer, on a made-up entry with
 * tcp's limits. */
Test(rdma_format, efa_profile_narrows_an_entry) {
  setenv("FABRIC_NIC_PROFILE", "efa", 1);
  char err[256];
  fab_params_load(&fab_g.params, err, sizeof(err));
  struct fi_info* fi = fi_allocinfo();
  fi->domain_attr->cq_data_size = 8;
  fi->domain_attr->mr_key_size = 8;
  fi->tx_attr->inject_size = 16384;
  fi->tx_attr->msg_order = fi->rx_attr->msg_order = FI_ORDER_SAS | FI_ORDER_WAW | FI_ORDER_RAW;
  struct fi_info* dup = fi_dupinfo(fi);
  cr_expect_null(fab_nic_profile_apply(dup, FI_ORDER_WAW), "EFA grants no entry that orders writes");
  fi = fab_nic_profile_apply(fi, 0);
  cr_assert_not_null(fi);
  cr_expect_eq(fi->domain_attr->cq_data_size, 4);
  cr_expect_eq(fi->domain_attr->mr_key_size, 4);
  cr_expect_eq(fi->tx_attr->inject_size, 4096);
  cr_expect_eq(fi->tx_attr->msg_order, FI_ORDER_SAS);
  cr_expect(fab_nic_profile_mr_local());
  fi_freeinfo(fi);
}

/* verbs: the same CQ data and FI_MR_LOCAL; its RC queue pairs keep write ordering, so tcp's stays granted. */
Test(rdma_format, verbs_profile) {
  setenv("FABRIC_NIC_PROFILE", "verbs", 1);
  ut_use_provider("shm");
  setenv("FABRIC_TRANSPORT", "rdma", 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_expect(fab_g.devs[0]->cq_narrow && fab_g.devs[0]->mr_local);
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

/* An unknown profile: one WARN, and the provider's own limits. */
Test(rdma_format, unknown_profile) {
  setenv("FABRIC_NIC_PROFILE", "carrier-pigeon", 1);
  ut_use_provider("shm");
  setenv("FABRIC_TRANSPORT", "rdma", 1);
  ut_reset_warns();
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_expect(!fab_g.devs[0]->cq_narrow);
  cr_expect_eq(ut_warns(), 1, "one WARN names the unknown profile");
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

Test(rdma_format, efa_profile_on_tcp) {
  setenv("FABRIC_NIC_PROFILE", "efa", 1);
  const fab_transport_ops* want = FI_MAJOR(fi_version()) < 2 ? &fab_sendrecv_ops : &fab_rdma_ops;
  cr_expect_eq(chosen("tcp", "auto"), want);
}

Test(rdma_format, no_profile_is_wide) {
  unsetenv("FABRIC_NIC_PROFILE");
  ut_use_provider("shm");
  setenv("FABRIC_TRANSPORT", "rdma", 1);
  fab_ctx* ctx;
  cr_assert_eq(api->init(&ctx, 1, NULL, ut_logger, NULL), FAB_OK);
  cr_expect(!fab_g.devs[0]->cq_narrow, "shm carries 8 bytes of CQ data");
  cr_assert_eq(api->finalize(ctx), FAB_OK);
}

/* Asked announcements (unit.rdma.asked): a small message is one tagged message and announces nothing; a large
 * one asks for its buffer (one announcement); after it, buffers are announced at post ("ahead"), a large send
 * that finds its announcement writes at once behind a mark, and a small one sent into such a buffer goes
 * tagged while its announcement is dropped; the next buffers are no longer announced ahead. Sizes mixed on one
 * tag then land, every byte in the right buffer. With FABRIC_TAGGED_MAX=0 (unit.rdma) the exchanges run on the
 * announced-at-post protocol and only the bytes are checked. */
static void send_and_check(conn* c, void* rq, char* sb, char* rb, size_t size, void* smh, char fill) {
  memset(sb, fill, size);
  void* sq = NULL;
  while (!sq) cr_assert_eq(api->isend(c->s, sb, size, 7, smh, NULL, &sq), FAB_OK);
  int got = -1;
  cr_assert_eq(wait_req(sq, NULL), FAB_OK);
  cr_assert_eq(wait_req(rq, &got), FAB_OK);
  cr_assert_eq(got, (int)size);
  for (size_t i = 0; i < size; i++) cr_assert_eq(rb[i], fill, "byte %zu of a %zu-byte message", i, size);
}

/* Polls until the sender holds n announcements it has not used (the announcement ahead reached it). */
static void wait_announced(conn* c, uint32_t n) {
  rd_scomm* s = fab_comm_tp(c->sc);
  for (int64_t end = ut_now_ms() + 5000;;) {
    pthread_mutex_lock(&c->sc->ep->lock);
    uint32_t have = s->nann;
    pthread_mutex_unlock(&c->sc->ep->lock);
    if (have >= n) return;
    cr_assert_lt(ut_now_ms(), end, "the announcement ahead never reached the sender");
    fab_ep_poll(c->sc->ep);
  }
}

static void asked_ahead(const char* prov) {
  conn c;
  open_conn(prov, &c);
  size_t tmax = fab_g.params.tagged_max, big = tmax ? 2 * tmax + 100 : 40000, small = 64;
  char* sb = malloc(big);
  char* rb = malloc(8 * big);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sb, big, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, 8 * big, FAB_PTR_HOST, &rmh), FAB_OK);
  rd_rcomm* rr = fab_comm_tp(c.rc);
  send_and_check(&c, post_recv(&c, rb, big, rmh, 7), sb, rb, small, smh, 1);
  if (tmax) cr_assert_eq(rr->next_index, 0, "a small message announces nothing");
  send_and_check(&c, post_recv(&c, rb, big, rmh, 7), sb, rb, big, smh, 2);
  if (tmax) cr_assert_eq(rr->next_index, 1, "a large one is announced once, when asked");
  void* rq = post_recv(&c, rb, big, rmh, 7);
  if (tmax) {
    cr_assert_eq(rr->next_index, 2, "after a large message a buffer is announced at post");
    wait_announced(&c, 1);
  }
  send_and_check(&c, rq, sb, rb, big, smh, 3); /* written at once, behind a mark */
  rq = post_recv(&c, rb, big, rmh, 7);
  if (tmax) wait_announced(&c, 1);
  send_and_check(&c, rq, sb, rb, small, smh, 4); /* tagged (DATA): a small message goes as one tagged message */
  rq = post_recv(&c, rb, big, rmh, 7);
  if (tmax) cr_assert_eq(rr->next_index, 3, "after a small message buffers are no longer announced ahead");
  send_and_check(&c, rq, sb, rb, small, smh, 5);
  /* mixed sizes on one tag, four receives ahead: the k-th send lands in the k-th buffer */
  enum { N = 64, AHEAD = 4 };
  size_t sizes[] = {small, big, 8, big, big, 4096, small, tmax ? tmax : 4096, tmax ? tmax + 1 : 8192};
  enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };
  char* sbs = malloc((size_t)N * big);
  void* smh2;
  cr_assert_eq(api->reg_mr(c.s, sbs, (size_t)N * big, FAB_PTR_HOST, &smh2), FAB_OK);
  void *rqs[N], *sqs[N];
  for (int i = 0; i < N; i++) {
    memset(sbs + (size_t)i * big, (char)(i + 10), sizes[i % NSIZES]);
    if (i < AHEAD) rqs[i] = post_recv(&c, rb + (size_t)(i % 8) * big, big, rmh, 7);
  }
  for (int i = 0; i < N; i++) {
    sqs[i] = NULL;
    while (!sqs[i]) cr_assert_eq(api->isend(c.s, sbs + (size_t)i * big, sizes[i % NSIZES], 7, smh2, NULL, &sqs[i]),
                                 FAB_OK);
    int got = -1;
    cr_assert_eq(wait_req(rqs[i], &got), FAB_OK);
    cr_assert_eq(got, (int)sizes[i % NSIZES], "message %d", i);
    char* at = rb + (size_t)(i % 8) * big;
    cr_assert_eq(at[0], (char)(i + 10), "message %d landed elsewhere", i);
    cr_assert_eq(at[got - 1], (char)(i + 10), "message %d landed elsewhere", i);
    cr_assert_eq(wait_req(sqs[i], NULL), FAB_OK);
    if (i + AHEAD < N) rqs[i + AHEAD] = post_recv(&c, rb + (size_t)((i + AHEAD) % 8) * big, big, rmh, 7);
  }
  cr_assert_eq(api->dereg_mr(c.s, smh2), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.s, smh), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
  free(sbs);
  free(sb);
  free(rb);
}

Test(rdma, asked_ahead_tcp) { asked_ahead("tcp"); }
Test(rdma, asked_ahead_shm) { asked_ahead("shm"); }

/* Asked announcements: a send that could not go yet (out of credits) and whose buffer is then deregistered
 * fails without being read, and its receive fails with it (an abandon message takes it): the next send lands
 * in the next receive, never in the abandoned one. */
static void abandoned_unsent(const char* prov) {
  conn c;
  open_conn(prov, &c);
  if (!fab_g.params.tagged_max) { /* announced at post: dereg_waiting_send covers it */
    close_conn(&c);
    return;
  }
  enum { N = RD_TAGGED_CREDITS, SZ = 64 };
  char* sa = malloc((size_t)(N + 1) * SZ);
  char* sb = malloc(SZ);
  char* rb = malloc((size_t)(N + 2) * SZ);
  memset(sa, 1, (size_t)(N + 1) * SZ);
  memset(sb, 2, SZ);
  memset(rb, 0, (size_t)(N + 2) * SZ);
  void *ma, *mb, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sa, (size_t)(N + 1) * SZ, FAB_PTR_HOST, &ma), FAB_OK);
  cr_assert_eq(api->reg_mr(c.s, sb, SZ, FAB_PTR_HOST, &mb), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, (size_t)(N + 2) * SZ, FAB_PTR_HOST, &rmh), FAB_OK);
  void* sq[N + 2];
  for (int i = 0; i <= N; i++) { /* the last one finds no credit: it waits */
    sq[i] = NULL;
    while (!sq[i]) cr_assert_eq(api->isend(c.s, sa + (size_t)i * SZ, SZ, 3, ma, NULL, &sq[i]), FAB_OK);
  }
  sq[N + 1] = NULL;
  while (!sq[N + 1]) cr_assert_eq(api->isend(c.s, sb, SZ, 3, mb, NULL, &sq[N + 1]), FAB_OK);
  cr_assert_eq(rd_s(c.sc)->unsent, 2, "two sends wait for credits");
  ut_reset_warns();
  cr_assert_eq(api->dereg_mr(c.s, ma), FAB_OK); /* under the waiting send N */
  for (int i = 0; i < N; i++) cr_assert_eq(wait_req(sq[i], NULL), FAB_OK);
  for (int i = 0; i < N + 2; i++) {
    void* rq = post_recv(&c, rb + (size_t)i * SZ, SZ, rmh, 3);
    int got = -1;
    fab_result rc = wait_req(rq, &got);
    if (i == N) {
      cr_assert_eq(rc, FAB_ERR_REMOTE, "the receive of the abandoned send fails");
    } else {
      cr_assert_eq(rc, FAB_OK, "receive %d", i);
      cr_assert_eq(rb[(size_t)i * SZ], i == N + 1 ? 2 : 1, "receive %d got another message's bytes", i);
    }
  }
  cr_assert_eq(wait_req(sq[N], NULL), FAB_ERR_INVALID_USAGE, "the send whose buffer was deregistered fails");
  cr_assert_eq(wait_req(sq[N + 1], NULL), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.s, mb), FAB_OK);
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  close_conn(&c);
  free(sa);
  free(sb);
  free(rb);
}

Test(rdma, abandoned_unsent_tcp) { abandoned_unsent("tcp"); }
Test(rdma, abandoned_unsent_shm) { abandoned_unsent("shm"); }

/* A rail's thread pumps the live comms of its endpoint: only helped send
 * comms' waiting sends. A receive comm on the same endpoint (its transport
 * area laid out otherwise, a stale backlog entry where a send comm counts
 * its waiting sends) is left untouched. */
static void pump_leaves_receives(const char* prov) {
  conn c;
  open_conn(prov, &c);
  rd_rcomm* rr = rd_r(c.rc);
  size_t n = sizeof(rr->backlog) / sizeof(rr->backlog[0]);
  for (size_t i = 0; i < n; i++) rr->backlog[i].r = (fab_req*)(uintptr_t)0xdead0000; /* left by a flush */
  size_t area = fab_rdma_ops.comm_size;
  unsigned char* before = malloc(area);
  memcpy(before, rr, area);
  c.rc->helped = 1;
  fab_endpoint* ep = c.rc->ep;
  pthread_mutex_lock(&ep->lock);
  fab_rdma_ops.pump(c.rc);
  ep->hooks->pump(ep);
  pthread_mutex_unlock(&ep->lock);
  c.rc->helped = 0;
  cr_assert(!memcmp(before, rr, area), "the pump changed a receive comm's state");
  for (size_t i = 0; i < n; i++) rr->backlog[i].r = NULL;
  free(before);
  close_conn(&c);
}

Test(rdma, pump_leaves_receives_tcp) { pump_leaves_receives("tcp"); }

/* A large send on a comm whose rail has a thread waits for that thread; if
 * the comm closes first, close posts it (its write, where its buffer was
 * announced at post; else its request-to-send, and the closed comm writes
 * once the answer lands), and the receive gets every byte. No thread runs
 * here, so only close can. */
Test(rdma, close_posts_send_left_to_thread) {
  conn c;
  open_conn("tcp", &c);
  char* sb = malloc(LEN);
  char* rb = malloc(LEN);
  for (int i = 0; i < LEN; i++) sb[i] = (char)(i * 7 + 3);
  memset(rb, 0, LEN);
  void *smh, *rmh;
  cr_assert_eq(api->reg_mr(c.s, sb, LEN, FAB_PTR_HOST, &smh), FAB_OK);
  cr_assert_eq(api->reg_mr(c.r, rb, LEN, FAB_PTR_HOST, &rmh), FAB_OK);
  void* rq = post_recv(&c, rb, LEN, rmh, 9);
  for (int64_t end = ut_now_ms() + 200; ut_now_ms() < end;) fab_ep_poll(c.sc->ep); /* its announcement lands */
  c.sc->helped = 1;
  fab_ep_helper_large(c.sc->ep, 1); /* the thread polls: a large request is live (no thread here to count it) */
  void* sq = NULL;
  cr_assert_eq(api->isend(c.s, sb, LEN, 9, smh, NULL, &sq), FAB_OK);
  cr_assert_not_null(sq);
  cr_assert_eq(rd_s(c.sc)->nwait, 1, "a large send over a rail with a thread waits for the thread");
  fab_ep_helper_large(c.sc->ep, -1);
  c.sc->helped = 0;
  cr_assert_eq(api->close_send(c.s), FAB_OK);
  int size = 0;
  cr_assert_eq(wait_req(rq, &size), FAB_OK);
  cr_assert_eq(size, LEN);
  for (int i = 0; i < LEN; i++) cr_assert_eq(rb[i], (char)(i * 7 + 3), "byte %d", i);
  cr_assert_eq(api->dereg_mr(c.r, smh), FAB_OK); /* the handle knows its domain */
  cr_assert_eq(api->dereg_mr(c.r, rmh), FAB_OK);
  cr_assert_eq(api->close_recv(c.r), FAB_OK);
  cr_assert_eq(api->close_listen(c.l), FAB_OK);
  cr_assert_eq(api->finalize(c.ctx), FAB_OK);
  free(sb);
  free(rb);
}
