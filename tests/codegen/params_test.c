/* The rendered fab_params_load() for a table with every type (params_fixture.toml). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "fab_params.h"

static const char* const vars[] = {"FABTEST_NAME", "FABTEST_COUNT", "FABTEST_OFFSET",
                                   "FABTEST_FLAG", "FABTEST_BYTES", "FABTEST_ANY_SIZE", "FABTEST_MODE"};

static void clear_env(void) {
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

TestSuite(params, .init = clear_env);

Test(params, defaults_when_unset) {
  struct fab_params p;
  char err[256] = "junk";
  cr_assert_eq(fab_params_load(&p, err, sizeof err), 0);
  cr_expect_str_eq(err, "");
  cr_expect_str_eq(p.name, "abc");
  cr_expect_eq(p.count, 16);
  cr_expect_eq(p.offset, -3);
  cr_expect_eq(p.flag, 1);
  cr_expect_eq(p.bytes, 1048576u);
  cr_expect_eq(p.any_size, 0u);
}

Test(params, good_values) {
  setenv("FABTEST_NAME", "tcp", 1);
  setenv("FABTEST_COUNT", "256", 1);
  setenv("FABTEST_OFFSET", "-2147483648", 1);
  setenv("FABTEST_FLAG", "Off", 1);
  setenv("FABTEST_BYTES", "512M", 1);
  setenv("FABTEST_ANY_SIZE", "3t", 1);
  struct fab_params p;
  char err[256];
  cr_assert_eq(fab_params_load(&p, err, sizeof err), 0, "%s", err);
  cr_expect_str_eq(p.name, "tcp");
  cr_expect_eq(p.count, 256);
  cr_expect_eq(p.offset, -2147483647 - 1);
  cr_expect_eq(p.flag, 0);
  cr_expect_eq(p.bytes, (size_t)512 << 20);
  cr_expect_eq(p.any_size, (size_t)3 << 40);
}

Test(params, bad_values_fall_back_and_are_reported) {
  setenv("FABTEST_COUNT", "257", 1);
  setenv("FABTEST_OFFSET", "12abc", 1);
  setenv("FABTEST_FLAG", "maybe", 1);
  setenv("FABTEST_BYTES", "-1", 1);
  setenv("FABTEST_ANY_SIZE", "99999999999999999999", 1);
  struct fab_params p;
  char err[512];
  cr_assert_eq(fab_params_load(&p, err, sizeof err), 5, "%s", err);
  cr_expect_eq(p.count, 16);
  cr_expect_eq(p.offset, -3);
  cr_expect_eq(p.flag, 1);
  cr_expect_eq(p.bytes, 1048576u);
  cr_expect_eq(p.any_size, 0u);
  cr_expect(strstr(err, "FABTEST_COUNT=257 is outside") != NULL, "%s", err);
  cr_expect(strstr(err, "FABTEST_OFFSET=12abc is not an integer") != NULL, "%s", err);
  cr_expect(strstr(err, "FABTEST_FLAG=maybe is not a boolean") != NULL, "%s", err);
  cr_expect(strstr(err, "FABTEST_BYTES=-1 is not a size") != NULL, "%s", err);
  cr_expect(strstr(err, "; ") != NULL, "complaints are separated");
}

/* A choice is matched without regard to case and stored as spelled in the
 * table; anything else is one complaint and the default. */
Test(params, choices) {
  struct fab_params p;
  char err[256];
  cr_expect_str_eq((fab_params_load(&p, err, sizeof err), p.mode), "auto");
  setenv("FABTEST_MODE", "FAST", 1);
  cr_assert_eq(fab_params_load(&p, err, sizeof err), 0, "%s", err);
  cr_expect_str_eq(p.mode, "fast");
  setenv("FABTEST_MODE", "", 1);
  cr_assert_eq(fab_params_load(&p, err, sizeof err), 0, "%s", err);
  cr_expect_str_eq(p.mode, "", "the empty choice");
  setenv("FABTEST_MODE", "fastest", 1);
  cr_assert_eq(fab_params_load(&p, err, sizeof err), 1);
  cr_expect_str_eq(p.mode, "auto");
  cr_expect(strstr(err, "FABTEST_MODE=fastest is not one of auto, fast, (empty); using auto") != NULL, "%s", err);
}

Test(params, long_string_and_small_buffer) {
  char big[FAB_PARAM_STRING_MAX + 10];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  setenv("FABTEST_NAME", big, 1);
  setenv("FABTEST_COUNT", "0", 1);
  struct fab_params p;
  char err[8];
  cr_expect_eq(fab_params_load(&p, err, sizeof err), 2);
  cr_expect_str_eq(p.name, "abc");
  cr_expect_lt(strlen(err), sizeof err, "errbuf is never overrun");
  cr_expect_eq(fab_params_load(&p, NULL, 0), 2, "errbuf is optional");
}
