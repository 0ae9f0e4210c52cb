/*
 * netbench harness internals shared by netbench.c (options, ranks, report)
 * and nb_tests.c (the measurements): configuration, the control channel,
 * data patterns, result points, and the per-mode transports with their data
 * comms and registered buffers.
 */
#ifndef NB_BENCH_H
#define NB_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "nb.h"

#define MAX_REPS 64
#define MAX_POINTS 256
#define MAX_SIZES 32
/* raw libfabric, the plugin, and optionally a second plugin build (A/B of a
 * change to the plugin, interleaved in the same run). */
#define NMODES 3
enum { M_RAW = 0, M_PLUGIN = 1, M_PLUGIN_B = 2 };
extern const char* const mode_name[NMODES];

/* ------------------------------------------------------------------------ */
/* Configuration (a POD so rank 0 can send it to a remote rank 1).           */

enum {
  T_LAT = 1 << 0,
  T_BW = 1 << 1,
  T_BIBW = 1 << 2,
  T_RATE = 1 << 3,
  T_SETUP = 1 << 4,
  T_MR = 1 << 5,
  T_MEM = 1 << 6,
  T_ALL = 0x7f,
};

typedef struct {
  uint32_t magic, cfg_size;
  char provider[64];
  int version;
  int dev;
  int rails;          /* --rails */
  int nvdevs;         /* --vdevice: how many devices to fuse, and which */
  int vdevs[8];
  int modes;          /* bit per mode */
  int tests;
  int reps;
  int smoke;
  int verbose;
  int raw_hints;      /* NB_RAW_HINTS_* */
  int raw_rma;        /* --raw-rma */
  int raw_socket;     /* --raw-socket */
  int nccl_profiler;  /* --nccl-profiler */
  int mem;            /* --mem: NB_MEM_* */
  int nlat, nbw;
  size_t lat_sizes[MAX_SIZES];
  size_t bw_sizes[MAX_SIZES];
  int lat_iters;
  size_t lat_bytes;   /* per-point byte budget that caps iterations of large sizes */
  size_t lat_recv_size; /* --lat-recv-size: ping-pong receives at least this large (0: the message's) */
  int window;
  size_t bw_bytes;    /* bytes per bandwidth point and run */
  size_t max_mem;     /* buffer bytes per side and direction */
  int rate_window;
  size_t rate_size;
  int rate_msgs;
  int setup_comms;
  int mem_comms;
  int mr_iters;
  uint64_t seed;
} nb_cfg;
#define CFG_MAGIC 0x4e424346u

extern nb_cfg cfg;
extern char plugin_path[4096];
extern char plugin_b_path[4096];
enum { NB_ENV_B_MAX = 8 };
extern char plugin_b_env[NB_ENV_B_MAX][256];
extern int plugin_b_nenv;
extern int ctl;                /* control socket to the other rank */
extern volatile int finishing; /* set before the last barrier: the watchdog stands down */

/* --- control channel (nb_harness.c) --- */
void ctl_send(const void* p, size_t n);
void ctl_recv(void* p, size_t n);
void barrier(void);
double xchg_double(double mine);
void watchdog_start(void);

/* --- data patterns --- */
static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/* The 8-byte word expected at byte offset off of a transfer with this seed. */
static inline uint64_t pat(uint64_t seed, size_t off) { return mix64(seed ^ ((uint64_t)off * 0x2545f4914f6cdd1dull)); }
/* Whether transfer `it` of `total` carries sampled words: every one in host
 * memory; in GPU memory (where each word is a driver copy that would weigh on
 * the timing) the first and the last, besides the full-buffer check. */
static inline int sampled(uint64_t it, uint64_t total) {
  return nb_mem_kind == NB_MEM_HOST || it == 0 || it + 1 == total;
}
void fill_samples(void* buf, size_t size, uint64_t seed);
int check_samples(const void* buf, size_t size, uint64_t seed);
void fill_full(void* buf, size_t size, uint64_t seed);
long check_full(const void* buf, size_t size, uint64_t seed);

/* --- results --- */
typedef struct {
  char test[32];
  long param;          /* message size, comm count or buffer size */
  int window;
  char unit[16];
  int higher_better;
  double v[NMODES][MAX_REPS];
  int n[NMODES];
  char note[96];
} point_t;

extern point_t points[MAX_POINTS];
extern int npoints;
point_t* point_new(const char* test, long param, int window, const char* unit, int higher_better);
void point_add(point_t* p, int mode, double v);
double median(const double* v, int n);
double vmin(const double* v, int n);
double vmax(const double* v, int n);

/* --- transports, comms, buffers --- */
typedef struct {
  nb_xport x;
  int open;
  void* sc; /* send comm to the peer */
  void* rc; /* recv comm from the peer */
} nb_mode;
extern nb_mode modes[NMODES];
#define X(m) (&modes[m].x)
#define OPS(m) (modes[m].x.ops)

static inline int mode_on(int m) { return cfg.modes & (1 << m); }
void xport_open(int m);
void xport_close(int m);
void chk(int rc, int m, const char* what);
void comms_establish(int m, int n, void** sc, void** rc);
void data_comms_up(int m);
void data_comms_down(int m);
void* buf_alloc(size_t size);
void buf_free(void* p, size_t size);

/* A set of buffers, registered with every open mode. */
typedef struct {
  int n;
  size_t size;
  void** buf;
  void** mh[NMODES];
} bufset;
void bufset_init(bufset* b, int n, size_t size, int is_send);
void bufset_fini(bufset* b, int is_send);

void* post_send(int m, void* comm, void* buf, size_t size, int tag, void* mh);
void* post_recv(int m, void* comm, void* buf, size_t size, int tag, void* mh);
int wait_req(int m, void* req);

/* Seed of one transfer: unique per run, point, iteration and direction. */
extern uint64_t run_salt;
static inline uint64_t tseed(uint64_t it, int dir) { return mix64(run_salt ^ (it << 1) ^ (uint64_t)dir); }
void verify_fail(int m, const char* what, size_t size, uint64_t it) __attribute__((noreturn));
void full_check(int m, bufset* s, bufset* r, size_t size, int both_ways);

/* --- the measurements (nb_tests.c) --- */
void test_latency(void);
void test_bandwidth(int test);
void test_rate(void);
void test_setup(void);
void test_mr(void);
void test_mem(void);

#endif /* NB_BENCH_H */
