#include "unit_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_warns;

void ut_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  if (level != FAB_LOG_WARN) return;
  __atomic_add_fetch(&g_warns, 1, __ATOMIC_SEQ_CST);
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "WARN %s:%d %s\n", file, line, msg);
}

int ut_warns(void) { return __atomic_load_n(&g_warns, __ATOMIC_SEQ_CST); }
void ut_reset_warns(void) { __atomic_store_n(&g_warns, 0, __ATOMIC_SEQ_CST); }

void ut_use_provider(const char* prov) {
  setenv("FABRIC_PROVIDER", prov, 1);
  if (!strcmp(prov, "tcp")) setenv("FI_TCP_IFACE", "lo", 1);
}

int64_t ut_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t next(uint64_t* x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

void ut_fill(void* buf, size_t len, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  unsigned char* c = buf;
  for (size_t i = 0; i < len; i++) c[i] = (unsigned char)(i % 8 == 0 ? next(&x) : x >> (8 * (i % 8)));
}

long ut_verify(const void* buf, size_t len, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  const unsigned char* c = buf;
  for (size_t i = 0; i < len; i++) {
    unsigned char want = (unsigned char)(i % 8 == 0 ? next(&x) : x >> (8 * (i % 8)));
    if (c[i] != want) return (long)i;
  }
  return -1;
}
