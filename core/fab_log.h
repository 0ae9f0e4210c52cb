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

#endif /* FAB_LOG_H */
