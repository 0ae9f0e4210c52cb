/*
 * Helpers for the engine's unit tests: a logger that counts WARN lines,
 * provider selection, and a forked two-process pair that exchanges bytes
 * over pipes (for the handle) and syncs.
 *
 * UT_CHECK works on both sides: in the parent it fails the Criterion test, in
 * the child it prints the failure and exits non-zero, which the parent then
 * reports.
 */
#ifndef UNIT_UTIL_H
#define UNIT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fab_api.h"

extern const fab_api fab_api_core;

/* --- logging -------------------------------------------------------------- */

void ut_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
int ut_warns(void);
void ut_reset_warns(void);

/* --- providers ------------------------------------------------------------- */

/* Sets FABRIC_PROVIDER (and FI_TCP_IFACE=lo for tcp) for this process. */
void ut_use_provider(const char* prov);

/* --- failures ----------------------------------------------------------------- */

void ut_fail(const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 3, 4), noreturn));
#define UT_CHECK(cond, ...)                                \
  do {                                                     \
    if (!(cond)) ut_fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define UT_OK(expr)                                                              \
  do {                                                                           \
    fab_result ut_rc_ = (expr);                                                  \
    if (ut_rc_ != FAB_OK) ut_fail(__FILE__, __LINE__, "%s = %d", #expr, ut_rc_); \
  } while (0)

/* --- a pair of processes ----------------------------------------------------- */

enum { UT_PARENT = 0, UT_CHILD = 1 };

typedef struct ut_pair {
  int role;
  pid_t child;
  int wfd, rfd;
} ut_pair;

/* Forks; both processes return, with p->role telling which one they are. */
void ut_pair_start(ut_pair* p);
void ut_pair_send(ut_pair* p, const void* buf, size_t len);
void ut_pair_recv(ut_pair* p, void* buf, size_t len);
void ut_pair_sync(ut_pair* p);
/* Child: exits 0. Parent: waits for the child and checks it exited 0. */
void ut_pair_finish(ut_pair* p);

/* --- driving the engine ------------------------------------------------------- */

typedef struct ut_side {
  const fab_api* api;
  fab_ctx* ctx;
  void* listen_comm;
  void* send_comm;
  void* recv_comm;
} ut_side;

/* init + a bidirectional connection to the peer over device 0. */
void ut_side_open(ut_side* s, ut_pair* p);
void ut_side_close(ut_side* s);
/* Connects n comm pairs at once (listen n, swap handles, connect/accept all). */
void ut_connect_many(ut_side* s, ut_pair* p, int n, void** send_comms, void** recv_comms, void** listen_comms);

void* ut_isend(ut_side* s, void* comm, void* data, size_t size, int tag, void* mh);
void* ut_irecv(ut_side* s, void* comm, int n, void** data, const size_t* sizes, const int* tags, void** mhs);
/* Tests until done; returns the last result. */
fab_result ut_wait(ut_side* s, void* req, int* sizes, int timeout_ms);

void ut_fill(void* buf, size_t len, uint64_t seed);
/* Index of the first byte that differs from the pattern, or -1. */
long ut_verify(const void* buf, size_t len, uint64_t seed);
int64_t ut_now_ms(void);

#endif /* UNIT_UTIL_H */
