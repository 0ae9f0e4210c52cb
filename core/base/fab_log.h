/*
 * Logging through NCCL's logger. Convention (NCCL's plugin README): WARN with
 * flags ALL and the source file; INFO with a subsystem and the function name.
 * Without a logger, WARN lines go to stderr and INFO is dropped.
 *
 * Rule: every failure logs exactly one WARN, in the function that detects it;
 * callers pass the result code up without logging again.
 */
#ifndef FAB_LOG_H
#define FAB_LOG_H

#include "fab_core.h"

void fab_log_set_logger(fab_logger_fn logger);
fab_logger_fn fab_log_logger(void);

void fab_log_warn(const char* file, int line, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void fab_log_info(unsigned long subsys, const char* func, int line, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define FAB_WARN(...) fab_log_warn(__FILE__, __LINE__, __VA_ARGS__)
#define FAB_INFO(subsys, ...) fab_log_info((subsys), __func__, __LINE__, __VA_ARGS__)

/* The runtime's buffers as isend and irecv take them, for a comm whose
 * largest message is max bytes on device dev: FAB_OK, or one WARN naming what
 * is wrong (over maxP2pBytes, no buffer, no memory handle: NCCL registers
 * every buffer it moves, so a NULL handle for a non-empty one is a caller's
 * bug whatever the provider needs). i: the buffer's index in a grouped
 * receive, -1 for a send. */
__attribute__((cold)) fab_result fab_buffer_refused(const char* dev, size_t max, int i, const void* data,
                                                    size_t size);
static inline fab_result fab_buffer_ok(const char* dev, size_t max, int i, const void* data, size_t size,
                                       const void* mhandle) {
  if (__builtin_expect(size <= max && ((data && mhandle) || !size), 1)) return FAB_OK;
  return fab_buffer_refused(dev, max, i, data, size);
}

#endif /* FAB_LOG_H */
