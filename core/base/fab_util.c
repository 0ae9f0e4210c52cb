#include "fab_util.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int64_t fab_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Bitwise CRC: it only ever covers a few hundred bytes of handshake data, so a
 * table would cost more cache than it saves. */
uint32_t fab_crc32c(const void* data, size_t len) {
  const unsigned char* p = data;
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < len; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint64_t fab_fnv1a(uint64_t seed, const void* data, size_t len) {
  const unsigned char* p = data;
  uint64_t h = seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fab_random64(void) {
  static _Atomic uint64_t counter;
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    v = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 16) ^
              atomic_fetch_add(&counter, 1));
  }
  return v ? v : 1;
}
