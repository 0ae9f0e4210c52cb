/*
 * Helpers for the engine's unit tests: a logger that counts WARN lines,
 * provider selection, data patterns and a clock. Tests that need two
 * processes are functional tests (tests/functional, tests/common/ft_harness.h).
 */
#ifndef UNIT_UTIL_H
#define UNIT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "fab_api.h"

extern const fab_api fab_api_core;

/* --- logging -------------------------------------------------------------- */

void ut_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
int ut_warns(void);
void ut_reset_warns(void);

/* --- providers ------------------------------------------------------------- */

/* Sets FABRIC_PROVIDER (and FI_TCP_IFACE=lo for tcp) for this process. */
void ut_use_provider(const char* prov);

/* --- data and time ------------------------------------------------------------ */

void ut_fill(void* buf, size_t len, uint64_t seed);
/* Index of the first byte that differs from the pattern, or -1. */
long ut_verify(const void* buf, size_t len, uint64_t seed);
int64_t ut_now_ms(void);

#endif /* UNIT_UTIL_H */
