/*
 * N-rank harness for the one-sided (RMA) tests: fork N processes, give each
 * its rank, a shared page for listen handles and a barrier, and a deadline.
 * A failed check in any rank prints "rank R: file:line: message" and exits
 * non-zero; the parent reports every rank's exit and fails if any did.
 * The plugin is loaded after the fork, in each rank, through the table
 * FABRIC_TEST_RMA_API names (13..17: ncclRmaPlugin_vN; gin11, gin12:
 * ncclGinPlugin_vN; "core" uses the engine linked in).
 */
#ifndef RMA_RANKS_H
#define RMA_RANKS_H

#include <stdint.h>

#include "fab_api.h"

enum { RR_MAX_RANKS = 8 };

typedef struct rr_ctx {
  int rank, nranks;
  fab_rma_api api;
  int version;              /* 0: the core */
  void* dl;
} rr_ctx;

__attribute__((noreturn, format(printf, 3, 4))) void rr_fail_at(const char* file, int line, const char* fmt, ...);
#define RR_FAIL(...) rr_fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define RR_CHECK(cond, ...)                                                       \
  do {                                                                            \
    if (!(cond)) rr_fail_at(__FILE__, __LINE__, "check `" #cond "` failed: " __VA_ARGS__); \
  } while (0)
#define RR_OK(call)                                                                                           \
  do {                                                                                                        \
    fab_result rr_rc_ = (call);                                                                               \
    if (rr_rc_ != FAB_OK) rr_fail_at(__FILE__, __LINE__, "`%s` returned %d (last WARN: %s)", #call, (int)rr_rc_, \
                                     rr_last_warn());                                                        \
  } while (0)

/* Runs body in nranks processes; returns 0 when every rank passed. */
int rr_run(int nranks, int timeout_s, void (*body)(rr_ctx* c));

/* What this rank is doing (reported with a failure or a hang). */
void rr_phase(rr_ctx* c, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* What a rank does while it waits at a barrier (drive its progress: a
 * peer's reads and writes need it on some providers, as NCCL's proxy thread
 * gives it); NULL: nothing. */
void rr_set_idle(void (*fn)(void* arg), void* arg);
/* All ranks wait here (phase names the point, for a hang report). */
void rr_barrier(rr_ctx* c, const char* phase);
/* This rank is about to be killed on purpose: its death does not fail the run. */
void rr_expect_death(rr_ctx* c);
/* Shared scratch: each rank's 128-byte handle, and a 64-bit word per rank. */
void* rr_handle(int rank);
volatile uint64_t* rr_word(int rank);

/* The logger handed to init: counts WARN lines. */
void rr_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
int rr_warns(void);
const char* rr_last_warn(void);
/* Marks the next n WARNs as expected (printed as such). */
void rr_expect_warns(int n);

int64_t rr_now_ms(void);

#endif /* RMA_RANKS_H */
