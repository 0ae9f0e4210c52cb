#include "fab_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#define FAB_LOG_PREFIX "NET/Fabric: "

static _Atomic(fab_logger_fn) g_logger;

void fab_log_set_logger(fab_logger_fn logger) { atomic_store_explicit(&g_logger, logger, memory_order_release); }

fab_logger_fn fab_log_logger(void) { return atomic_load_explicit(&g_logger, memory_order_acquire); }

/* The logger is C-variadic, so a va_list cannot be forwarded: format first,
 * then hand over one "%s" argument. */
static void log_line(int level, unsigned long flags, const char* file, int line, const char* fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  fab_logger_fn logger = fab_log_logger();
  if (logger) {
    logger(level, flags, file, line, FAB_LOG_PREFIX "%s", msg);
  } else if (level == FAB_LOG_WARN) {
    fprintf(stderr, "WARN " FAB_LOG_PREFIX "%s (%s:%d)\n", msg, file, line);
  }
}

void fab_log_warn(const char* file, int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_line(FAB_LOG_WARN, (unsigned long)FAB_SUBSYS_ALL, file, line, fmt, ap);
  va_end(ap);
}

void fab_log_info(unsigned long subsys, const char* func, int line, const char* fmt, ...) {
  if (!fab_log_logger()) return;
  va_list ap;
  va_start(ap, fmt);
  log_line(FAB_LOG_INFO, subsys, func, line, fmt, ap);
  va_end(ap);
}

fab_result fab_bad_argument(const char* function, const char* argument, long long value, const char* expected) {
  FAB_WARN("%s: argument %s = %lld is out of range (expected %s); this is a bug in the caller (NCCL or the test)",
           function ? function : "(unknown function)", argument ? argument : "(unknown)", value,
           expected ? expected : "a valid value");
  return FAB_ERR_INTERNAL;
}

fab_result fab_buffer_refused(const char* dev, size_t max, int i, const void* data, size_t size) {
  const char* fn = i < 0 ? "isend" : "irecv";
  if (size > max) {
    if (i < 0)
      FAB_WARN("isend: size %zu exceeds maxP2pBytes %zu of %s; NCCL must split larger transfers", size, max, dev);
    else FAB_WARN("irecv: sizes[%d] = %zu exceeds maxP2pBytes %zu of %s", i, size, max, dev);
    return FAB_ERR_INTERNAL;
  }
  if (!data) return fab_bad_argument(fn, i < 0 ? "data" : "data[i]", i < 0 ? 0 : i, "a buffer for a non-empty one");
  FAB_WARN("%s: %s is NULL for a buffer of %zu bytes; pass the handle regMr returned for it", fn,
           i < 0 ? "mhandle" : "mhandles[i]", size);
  return FAB_ERR_INTERNAL;
}
