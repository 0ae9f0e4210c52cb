/* netbench measurements: ping-pong latency, windowed streams (bandwidth,
 * bidirectional bandwidth, message rate), connection setup, memory
 * registration, and resident memory per comm. Every test runs its points'
 * repetitions with raw and plugin interleaved. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nb_bench.h"

/* ------------------------------------------------------------------------ */
/* Ping-pong latency.                                                        */

/* The size a ping-pong receive is posted with: the message's, or
 * --lat-recv-size when larger (a runtime's whole buffer slot). */
static size_t pingpong_recv_size(size_t size) { return cfg.lat_recv_size > size ? cfg.lat_recv_size : size; }

static double run_pingpong(int m, bufset* s, bufset* r, size_t size, int iters, int warm) {
  size_t rsize = pingpong_recv_size(size);
  void* sc = modes[m].sc;
  void* rc = modes[m].rc;
  void* sb = s->buf[0];
  void* rb = r->buf[0];
  void* smh = s->mh[m][0];
  void* rmh = r->mh[m][0];
  double* lat = calloc((size_t)iters, sizeof(double));
  int total = iters + warm;
  barrier();
  if (nb_rank == 0) {
    for (int it = 0; it < total; it++) {
      if (sampled((uint64_t)it, (uint64_t)total)) fill_samples(sb, size, tseed((uint64_t)it, 0));
      uint64_t t0 = nb_now_ns();
      void* rq = post_recv(m, rc, rb, rsize, 1, rmh);
      void* sq = post_send(m, sc, sb, size, 1, smh);
      int sd = 0, rd = 0, got = -1;
      while (!sd || !rd) {
        if (!sd) chk(OPS(m)->test(X(m), sq, &sd, NULL), m, "test");
        if (!rd) chk(OPS(m)->test(X(m), rq, &rd, &got), m, "test");
      }
      uint64_t t1 = nb_now_ns();
      if ((size_t)got != size ||
          (sampled((uint64_t)it, (uint64_t)total) && check_samples(rb, size, tseed((uint64_t)it, 1))))
        verify_fail(m, "ping-pong", size, (uint64_t)it);
      if (it >= warm) lat[it - warm] = (double)(t1 - t0) / 2e3; /* one-way, us */
    }
  } else {
    void* rq = post_recv(m, rc, rb, rsize, 1, rmh);
    for (int it = 0; it < total; it++) {
      int got = wait_req(m, rq);
      int due = sampled((uint64_t)it, (uint64_t)total);
      if ((size_t)got != size || (due && check_samples(rb, size, tseed((uint64_t)it, 0))))
        verify_fail(m, "ping-pong", size, (uint64_t)it);
      if (due) fill_samples(sb, size, tseed((uint64_t)it, 1));
      if (it + 1 < total) rq = post_recv(m, rc, rb, rsize, 1, rmh);
      void* sq = post_send(m, sc, sb, size, 1, smh);
      wait_req(m, sq);
    }
  }
  barrier();
  double med = nb_rank == 0 ? median(lat, iters) : 0;
  free(lat);
  return med;
}

/* ------------------------------------------------------------------------ */
/* Streaming: a window of in-flight sends and/or receives.                   */

typedef struct {
  void* req;
  uint64_t msg;    /* message index carried by this slot */
  uint64_t filled; /* send: message index + 1 whose pattern the buffer holds */
  int busy;
} slot_t;

/* Runs one stream of nmsg messages. send/recv select the directions this
 * rank takes part in. Returns this rank's elapsed seconds from the start
 * barrier to its last completion. */
static double run_stream(int m, bufset* s, bufset* r, size_t size, int window, long nmsg, int do_send, int do_recv) {
  void* sc = modes[m].sc;
  void* rc = modes[m].rc;
  slot_t* ss = calloc((size_t)window, sizeof(slot_t));
  slot_t* rs = calloc((size_t)window, sizeof(slot_t));
  long sent_posted = 0, sent_done = 0, recv_posted = 0, recv_done = 0;
  /* The receiver pre-posts its window before the start barrier. */
  if (do_recv)
    for (int i = 0; i < window && recv_posted < nmsg; i++) {
      rs[i].msg = (uint64_t)recv_posted++;
      rs[i].req = post_recv(m, rc, r->buf[i], size, 2, r->mh[m][i]);
      rs[i].busy = 1;
    }
  barrier();
  uint64_t t0 = nb_now_ns();
  while ((do_send && sent_done < nmsg) || (do_recv && recv_done < nmsg)) {
    for (int i = 0; i < window; i++) {
      if (do_send) {
        slot_t* q = &ss[i];
        if (!q->busy && sent_posted < nmsg) {
          uint64_t msg = (uint64_t)sent_posted;
          if (q->filled != msg + 1) { /* once per message, not per "not now" retry */
            if (sampled(msg, (uint64_t)nmsg)) fill_samples(s->buf[i], size, tseed(msg, nb_rank));
            q->filled = msg + 1;
          }
          void* req = NULL;
          chk(OPS(m)->isend(X(m), sc, s->buf[i], size, 2, s->mh[m][i], &req), m, "isend");
          if (req) {
            q->req = req;
            q->msg = msg;
            q->busy = 1;
            sent_posted++;
          }
        } else if (q->busy) {
          int done = 0;
          chk(OPS(m)->test(X(m), q->req, &done, NULL), m, "test");
          if (done) {
            q->busy = 0;
            sent_done++;
          }
        }
      }
      if (do_recv) {
        slot_t* q = &rs[i];
        if (q->busy) {
          int done = 0, got = -1;
          chk(OPS(m)->test(X(m), q->req, &done, &got), m, "test");
          if (done) {
            if ((size_t)got != size ||
                (sampled(q->msg, (uint64_t)nmsg) && check_samples(r->buf[i], size, tseed(q->msg, 1 - nb_rank))))
              verify_fail(m, "stream", size, q->msg);
            q->busy = 0;
            recv_done++;
          }
        }
        if (!q->busy && recv_posted < nmsg) {
          void* req = NULL;
          chk(OPS(m)->irecv(X(m), rc, r->buf[i], size, 2, r->mh[m][i], &req), m, "irecv");
          if (req) {
            q->req = req;
            q->msg = (uint64_t)recv_posted++;
            q->busy = 1;
          }
        }
      }
    }
  }
  uint64_t t1 = nb_now_ns();
  free(ss);
  free(rs);
  barrier();
  return (double)(t1 - t0) / 1e9;
}

/* ------------------------------------------------------------------------ */
/* The schedule: points x repetitions x modes, interleaved.                  */

/* Mode order of repetition rep: ascending, then descending (raw, plugin /
 * plugin, raw / ...; with a second plugin raw, A, B / B, A, raw / ...), so
 * neither mode always runs first or right after the other. */
static int order_of(int rep, int k) { return (rep % 2 == 0) ? k : NMODES - 1 - k; }

#define FOR_REPS_MODES(rep, m)                                   \
  for (int rep = 0; rep < cfg.reps; rep++)                       \
    for (int k_ = 0; k_ < NMODES; k_++)                          \
      for (int m = order_of(rep, k_), once_ = 1; once_; once_ = 0) \
        if (mode_on(m))

static void set_salt(int test, size_t param, int rep, int m) {
  run_salt = mix64(cfg.seed ^ mix64(((uint64_t)test << 48) ^ ((uint64_t)param << 8) ^ ((uint64_t)rep << 2) ^ (uint64_t)m));
}

void test_latency(void) {
  for (int i = 0; i < cfg.nlat; i++) {
    size_t size = cfg.lat_sizes[i];
    int iters = cfg.lat_iters;
    if (size && cfg.lat_bytes / size < (size_t)iters) iters = (int)(cfg.lat_bytes / size);
    if (iters < 20) iters = 20;
    int warm = iters / 20 + 10;
    point_t* p = point_new("lat", (long)size, 1, "us", 0);
    bufset s, r;
    bufset_init(&s, 1, size, 1);
    bufset_init(&r, 1, pingpong_recv_size(size), 0);
    FOR_REPS_MODES(rep, m) {
      set_salt(T_LAT, size, rep, m);
      double v = run_pingpong(m, &s, &r, size, iters, warm);
      full_check(m, &s, &r, size, 1);
      point_add(p, m, v);
    }
    if (pingpong_recv_size(size) > size)
      snprintf(p->note, sizeof(p->note), "%d iters, recv %zu", iters, pingpong_recv_size(size));
    else
      snprintf(p->note, sizeof(p->note), "%d iters", iters);
    bufset_fini(&s, 1);
    bufset_fini(&r, 0);
  }
}

static int bw_window(size_t size, int window) {
  int w = window;
  while (w > 1 && (size_t)w * size > cfg.max_mem) w--;
  return w;
}

static void test_stream(int test, const char* name, size_t size, int window, long nmsg, const char* unit) {
  int bidir = test == T_BIBW;
  point_t* p = point_new(name, (long)size, window, unit, 1);
  bufset s, r;
  int is_sender = bidir || nb_rank == 0, is_receiver = bidir || nb_rank == 1;
  bufset_init(&s, is_sender ? window : 1, size, 1);
  bufset_init(&r, is_receiver ? window : 1, size, 0);
  long warm = 2L * window < nmsg ? 2L * window : nmsg;
  FOR_REPS_MODES(rep, m) {
    set_salt(test, size, rep, m);
    run_stream(m, &s, &r, size, window, warm, is_sender, is_receiver);
    set_salt(test, size, rep + 1000, m);
    double mine = run_stream(m, &s, &r, size, window, nmsg, is_sender, is_receiver);
    double theirs = xchg_double(mine);
    double t = mine > theirs ? mine : theirs; /* the slower side bounds the transfer */
    double v;
    if (test == T_RATE)
      v = (double)nmsg / t / 1e6; /* Mmsg/s */
    else
      v = (double)nmsg * (double)size * (bidir ? 2.0 : 1.0) / t / 1e9; /* GB/s */
    set_salt(test, size, rep + 2000, m);
    full_check(m, &s, &r, size, bidir);
    point_add(p, m, v);
  }
  snprintf(p->note, sizeof(p->note), "%ld msgs", nmsg);
  bufset_fini(&s, 1);
  bufset_fini(&r, 0);
}

void test_bandwidth(int test) {
  const char* name = test == T_BW ? "bw" : "bibw";
  for (int i = 0; i < cfg.nbw; i++) {
    size_t size = cfg.bw_sizes[i];
    int w = bw_window(size, cfg.window);
    long nmsg = (long)(cfg.bw_bytes / size);
    if (nmsg < 4L * w) nmsg = 4L * w;
    test_stream(test, name, size, w, nmsg, "GB/s");
  }
}

void test_rate(void) {
  test_stream(T_RATE, "rate", cfg.rate_size, cfg.rate_window, cfg.rate_msgs, "Mmsg/s");
}

/* Connection setup: rank 1 listens n times and sends the handles, rank 0
 * connects, both poll; timed on rank 0 from "go" to rank 1's "all accepted".
 * Every new comm then carries one verified 8-byte message (untimed). */
static double run_setup(int m, int n) {
  void** sc = calloc((size_t)n, sizeof(void*));
  void** rc = calloc((size_t)n, sizeof(void*));
  barrier();
  uint64_t t0 = nb_now_ns();
  comms_establish(m, n, nb_rank == 0 ? sc : NULL, nb_rank == 1 ? rc : NULL);
  barrier();
  uint64_t t1 = nb_now_ns();
  /* Verify each comm: 8 bytes carrying its index. */
  uint64_t* b = buf_alloc(8);
  void* mh;
  for (int i = 0; i < n; i++) {
    void* comm = nb_rank == 0 ? sc[i] : rc[i];
    chk(OPS(m)->reg_mr(X(m), comm, b, 8, &mh), m, "regMr");
    if (nb_rank == 0) {
      b[0] = pat(run_salt, (size_t)i);
      wait_req(m, post_send(m, comm, b, 8, 3, mh));
    } else {
      b[0] = 0;
      int got = wait_req(m, post_recv(m, comm, b, 8, 3, mh));
      if (got != 8 || b[0] != pat(run_salt, (size_t)i)) verify_fail(m, "new comm", 8, (uint64_t)i);
    }
    chk(OPS(m)->dereg_mr(X(m), comm, mh), m, "deregMr");
  }
  buf_free(b, 8);
  for (int i = 0; i < n; i++) {
    if (nb_rank == 0) chk(OPS(m)->close_send(X(m), sc[i]), m, "closeSend");
    else chk(OPS(m)->close_recv(X(m), rc[i]), m, "closeRecv");
  }
  barrier();
  free(sc);
  free(rc);
  return (double)(t1 - t0) / 1e6; /* ms */
}

void test_setup(void) {
  int counts[2] = {1, cfg.setup_comms};
  for (int c = 0; c < 2; c++) {
    int n = counts[c];
    if (c == 1 && n == 1) break;
    point_t* p = point_new("setup", n, 1, "ms", 0);
    FOR_REPS_MODES(rep, m) {
      set_salt(T_SETUP, (size_t)n, rep, m);
      point_add(p, m, run_setup(m, n));
    }
    snprintf(p->note, sizeof(p->note), "total for %d comm%s", n, n > 1 ? "s" : "");
  }
}

/* Memory registration, on rank 0's data send comm (rank 1 idles). Three
 * measurements per buffer size:
 *   mr_fresh:  register a buffer never registered before (distinct address)
 *   mr_cached: register a sub-range of a registered buffer (the
 *              registration cache's hit path; raw has no cache, so its
 *              figure is again a full fi_mr_reg)
 *   mr_dereg:  deregister a fresh registration. */
void test_mr(void) {
  size_t sizes[] = {4096, 1 << 20, 64 << 20};
  int nsizes = cfg.smoke ? 2 : 3;
  for (int si = 0; si < nsizes; si++) {
    size_t size = sizes[si];
    int iters = cfg.mr_iters;
    size_t budget = (size_t)256 << 20;
    if ((size_t)iters * size > budget) iters = (int)(budget / size);
    if (iters < 5) iters = 5;
    point_t* pf = point_new("mr_fresh", (long)size, 1, "us", 0);
    point_t* pc = point_new("mr_cached", (long)size, 1, "us", 0);
    point_t* pd = point_new("mr_dereg", (long)size, 1, "us", 0);
    FOR_REPS_MODES(rep, m) {
      barrier();
      if (nb_rank != 0) {
        barrier();
        continue;
      }
      double* tf = calloc((size_t)iters, sizeof(double));
      double* tc = calloc((size_t)iters, sizeof(double));
      double* td = calloc((size_t)iters, sizeof(double));
      void** bufs = calloc((size_t)iters, sizeof(void*));
      void** mhs = calloc((size_t)iters, sizeof(void*));
      void* comm = modes[m].sc;
      for (int i = 0; i < iters; i++) bufs[i] = buf_alloc(size); /* all live: distinct addresses */
      for (int i = 0; i < iters; i++) {
        uint64_t t0 = nb_now_ns();
        chk(OPS(m)->reg_mr(X(m), comm, bufs[i], size, &mhs[i]), m, "regMr");
        tf[i] = (double)(nb_now_ns() - t0) / 1e3;
      }
      /* Sub-ranges of the (still registered) buffers: a cache hit. */
      for (int i = 0; i < iters; i++) {
        size_t off = size >= 8192 ? 4096 : 0, len = size >= 8192 ? size / 2 : size;
        void* mh;
        uint64_t t0 = nb_now_ns();
        chk(OPS(m)->reg_mr(X(m), comm, (char*)bufs[i] + off, len, &mh), m, "regMr(sub-range)");
        tc[i] = (double)(nb_now_ns() - t0) / 1e3;
        chk(OPS(m)->dereg_mr(X(m), comm, mh), m, "deregMr(sub-range)");
      }
      for (int i = 0; i < iters; i++) {
        uint64_t t0 = nb_now_ns();
        chk(OPS(m)->dereg_mr(X(m), comm, mhs[i]), m, "deregMr");
        td[i] = (double)(nb_now_ns() - t0) / 1e3;
      }
      for (int i = 0; i < iters; i++) buf_free(bufs[i], size);
      point_add(pf, m, median(tf, iters));
      point_add(pc, m, median(tc, iters));
      point_add(pd, m, median(td, iters));
      free(tf), free(tc), free(td), free(bufs), free(mhs);
      barrier();
    }
    snprintf(pf->note, sizeof(pf->note), "%d bufs, median", iters);
    snprintf(pc->note, sizeof(pc->note), "half of a registered buf");
    snprintf(pd->note, sizeof(pd->note), "%d bufs, median", iters);
  }
}

/* ------------------------------------------------------------------------ */
/* Resident memory per comm, measured in freshly forked processes so no     */
/* earlier test's freed memory hides the growth.                             */

static double rss_kib(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, res = 0;
  if (!f || fscanf(f, "%ld %ld", &size, &res) != 2) nb_die("cannot read /proc/self/statm");
  fclose(f);
  return (double)res * (double)sysconf(_SC_PAGESIZE) / 1024.0;
}

enum { MEM_INIT_KIB, MEM_FIRST_MS, MEM_FIRST_KIB, MEM_IDLE_KIB, MEM_USED_KIB, MEM_CTX_KIB, MEM_NRES };

static void mem_child(int m, int rep, int wfd) {
  prctl(PR_SET_PDEATHSIG, SIGTERM); /* a killed rank takes its test process with it */
  watchdog_start();                 /* threads do not survive fork */
  double res[MEM_NRES];
  int n = cfg.mem_comms;
  void** sc = calloc((size_t)n + 1, sizeof(void*));
  void** rc = calloc((size_t)n + 1, sizeof(void*));
  int s = nb_rank == 0; /* rank 0 holds send comms, rank 1 recv comms */
  /* Cold start: transport init plus the first comm, which pays the one-time
   * costs (the plugin creates its endpoint on first use, raw at open). */
  barrier();
  uint64_t t0 = nb_now_ns();
  double r0 = rss_kib();
  xport_open(m);
  double ri = rss_kib();
  res[MEM_INIT_KIB] = ri - r0;
  comms_establish(m, 1, s ? sc : NULL, s ? NULL : rc);
  barrier();
  res[MEM_FIRST_MS] = (double)(nb_now_ns() - t0) / 1e6;
  double r1 = rss_kib();
  res[MEM_FIRST_KIB] = r1 - ri;
  comms_establish(m, n, s ? sc + 1 : NULL, s ? NULL : rc + 1);
  barrier();
  double r2 = rss_kib();
  res[MEM_IDLE_KIB] = (r2 - r1) / n;
  /* Use each comm once (8 bytes, verified) and measure again. */
  set_salt(T_MEM, (size_t)n, rep, m);
  uint64_t* b = buf_alloc(8);
  void* mhs[1];
  for (int i = 1; i <= n; i++) {
    void* comm = s ? sc[i] : rc[i];
    chk(OPS(m)->reg_mr(X(m), comm, b, 8, &mhs[0]), m, "regMr");
    if (s) {
      b[0] = pat(run_salt, (size_t)i);
      wait_req(m, post_send(m, comm, b, 8, 4, mhs[0]));
    } else {
      b[0] = 0;
      int got = wait_req(m, post_recv(m, comm, b, 8, 4, mhs[0]));
      if (got != 8 || b[0] != pat(run_salt, (size_t)i)) verify_fail(m, "mem comm", 8, (uint64_t)i);
    }
    chk(OPS(m)->dereg_mr(X(m), comm, mhs[0]), m, "deregMr");
  }
  barrier();
  res[MEM_USED_KIB] = (rss_kib() - r1) / n;
  for (int i = 0; i <= n; i++) {
    if (s) chk(OPS(m)->close_send(X(m), sc[i]), m, "closeSend");
    else chk(OPS(m)->close_recv(X(m), rc[i]), m, "closeRecv");
  }
  barrier();
  /* A second context (for the plugin: a second init, as NCCL does per
   * communicator from net v11 on; for raw: a second endpoint) and its first
   * comm, while the first context stays open. */
  nb_mode first = modes[m];
  double rc0 = rss_kib();
  xport_open(m);
  void* c2 = NULL;
  comms_establish(m, 1, s ? &c2 : NULL, s ? NULL : &c2);
  barrier();
  res[MEM_CTX_KIB] = rss_kib() - rc0;
  if (s) chk(OPS(m)->close_send(X(m), c2), m, "closeSend");
  else chk(OPS(m)->close_recv(X(m), c2), m, "closeRecv");
  barrier();
  xport_close(m);
  modes[m] = first;
  xport_close(m);
  if (write(wfd, res, sizeof(res)) != (ssize_t)sizeof(res)) nb_die("result pipe");
  finishing = 1; /* the parent keeps the socket open: no hang-up to see */
  _exit(0);
}

void test_mem(void) {
  point_t* pi = point_new("mem_init", 0, 1, "KiB", 0);
  point_t* pf = point_new("setup_first", 1, 1, "ms", 0);
  point_t* p1 = point_new("mem_first_comm", 1, 1, "KiB", 0);
  point_t* pc = point_new("mem_per_ctx", 1, 1, "KiB", 0);
  point_t* ps = point_new("mem_send_comm", cfg.mem_comms, 1, "KiB", 0);
  point_t* pr = point_new("mem_recv_comm", cfg.mem_comms, 1, "KiB", 0);
  point_t* pu = point_new("mem_send_used", cfg.mem_comms, 1, "KiB", 0);
  point_t* pv = point_new("mem_recv_used", cfg.mem_comms, 1, "KiB", 0);
  FOR_REPS_MODES(rep, m) {
    int fds[2];
    if (pipe(fds)) nb_die("pipe");
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) nb_die("fork");
    if (pid == 0) {
      close(fds[0]);
      mem_child(m, rep, fds[1]);
    }
    close(fds[1]);
    double res[MEM_NRES];
    ssize_t k = read(fds[0], res, sizeof(res));
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    if (k != (ssize_t)sizeof(res) || !WIFEXITED(st) || WEXITSTATUS(st)) nb_die("%s: memory test process failed", mode_name[m]);
    double peer[MEM_NRES];
    ctl_send(res, sizeof(res));
    ctl_recv(peer, sizeof(peer));
    double* s = nb_rank == 0 ? res : peer;
    double* r = nb_rank == 0 ? peer : res;
    point_add(pi, m, s[MEM_INIT_KIB]);
    point_add(pf, m, s[MEM_FIRST_MS]);
    point_add(p1, m, s[MEM_FIRST_KIB]);
    point_add(pc, m, s[MEM_CTX_KIB]);
    point_add(ps, m, s[MEM_IDLE_KIB]);
    point_add(pr, m, r[MEM_IDLE_KIB]);
    point_add(pu, m, s[MEM_USED_KIB]);
    point_add(pv, m, r[MEM_USED_KIB]);
  }
  snprintf(pi->note, sizeof(pi->note), "RSS growth of init (plugin: no endpoint yet)");
  snprintf(pf->note, sizeof(pf->note), "cold start: init + first comm, fresh process");
  snprintf(p1->note, sizeof(p1->note), "RSS growth of the first send comm (plugin: + endpoint)");
  snprintf(pc->note, sizeof(pc->note), "2nd context (plugin: init per NCCL comm) + its 1st comm");
  snprintf(ps->note, sizeof(ps->note), "RSS/comm, idle, over %d comms", cfg.mem_comms);
  snprintf(pr->note, sizeof(pr->note), "RSS/comm, idle, over %d comms", cfg.mem_comms);
  snprintf(pu->note, sizeof(pu->note), "RSS/comm after one message each");
  snprintf(pv->note, sizeof(pv->note), "RSS/comm after one message each");
}
