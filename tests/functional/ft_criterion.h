/*
 * Criterion glue for the functional suite. Each binary runs against one API
 * (FABRIC_TEST_API) and one provider (FI_PROVIDER), set by CTest.
 *
 * FT_PAIR_TEST(name, timeout_s) { ... } defines a Criterion test whose body
 * runs in two processes (peer->role tells which); see ft_harness.h.
 */
#ifndef FT_CRITERION_H
#define FT_CRITERION_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "ft_api.h"

static inline void ft_cr_fail(const char* msg) { cr_assert_fail("%s", msg); }

static inline void ft_test_init(void) {
  ft_set_fail_hook(ft_cr_fail);
  ft_log_reset();
}

#define FT_PAIR_TEST(name, timeout_s)                                                   \
  static void ft_body_##name(ft_peer* peer, void* arg);                                 \
  Test(functional, name, .init = ft_test_init, .timeout = (timeout_s) + 30) {           \
    ft_run_pair(#name, ft_body_##name, NULL, (timeout_s));                              \
  }                                                                                     \
  static void ft_body_##name(ft_peer* peer, void* arg)

/* The provider under test, as FI_PROVIDER names it ("tcp", "shm"), or "". */
static inline const char* ft_provider(void) {
  const char* p = getenv("FABRIC_PROVIDER");
  if (!p || !*p) p = getenv("FI_PROVIDER");
  return p ? p : "";
}
static inline int ft_provider_is(const char* name) { return strncmp(ft_provider(), name, strlen(name)) == 0; }

/* An error path: the call must fail and log exactly `warns` WARN lines
 * (fab_core.h: every failure logs exactly one). */
#define FT_EXPECT_ERROR(call)                                                                         \
  do {                                                                                                \
    int ft_w0_ = ft_log_warns();                                                                      \
    ft_log_expect_warns(1);                                                                           \
    fab_result ft_rc_ = (call);                                                                       \
    ft_log_expect_warns(0);                                                                           \
    int ft_dw_ = ft_log_warns() - ft_w0_;                                                             \
    if (ft_rc_ == FAB_OK) FT_FAIL("`%s` succeeded; an error was expected", #call);                    \
    if (ft_dw_ != 1)                                                                                  \
      FT_FAIL("`%s` returned %d as expected but logged %d WARN lines (expected exactly 1; last: %s)", \
              #call, (int)ft_rc_, ft_dw_, ft_log_last_warn());                                        \
  } while (0)

#endif /* FT_CRITERION_H */
