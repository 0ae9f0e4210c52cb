/*
 * Two-process test harness for the functional suite, the demo and anything
 * else that has to drive the plugin "the way NCCL does" between two ranks.
 *
 *  - ft_run_pair() forks a peer; both processes run the same body with a
 *    different role and talk over a socketpair (handle exchange, sync points).
 *  - Every wait has a deadline. A check that fails in either process stops
 *    both, and the parent reports the first failure with the role, the file,
 *    the line and the phase the failing side was in.
 *  - The plugin is loaded after the fork, in each process, through the API
 *    selected by FABRIC_TEST_API ("core" or "6".."12"; see ft_api.h).
 *
 * Nothing here uses Criterion: the functional tests install a failure hook
 * that calls cr_assert_fail, the demo one that exits.
 */
#ifndef FT_HARNESS_H
#define FT_HARNESS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "fab_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- failure reporting ------------------------------------------------- */

enum { FT_PARENT = 0, FT_CHILD = 1 };
enum { FT_EXIT_OK = 0, FT_EXIT_FAIL = 10 };

/* Called in the parent (or a process without a peer) with the complete
 * failure message; must not return (cr_assert_fail longjmps, exit exits). */
typedef void (*ft_fail_hook)(const char* message);
void ft_set_fail_hook(ft_fail_hook hook);
/* Names a process that is neither of the pair (a helper forked by a case),
 * so that its failure lines say which case and which process they are from. */
void ft_name_process(const char* test, const char* role);

__attribute__((noreturn, format(printf, 3, 4))) void ft_fail_at(const char* file, int line, const char* fmt, ...);

#define FT_FAIL(...) ft_fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define FT_CHECK(cond, ...)                   \
  do {                                        \
    if (!(cond)) ft_fail_at(__FILE__, __LINE__, "check `" #cond "` failed: " __VA_ARGS__); \
  } while (0)
/* A plugin call that must succeed. */
#define FT_OK(call)                                                                           \
  do {                                                                                        \
    fab_result ft_rc_ = (call);                                                               \
    if (ft_rc_ != FAB_OK) ft_fail_at(__FILE__, __LINE__, "`%s` returned %d (last WARN: %s)", #call, (int)ft_rc_, \
                                     ft_log_last_warn());                                      \
  } while (0)

/* A sentence added to every failure message while set (NULL clears it):
 * what a failure at this point most likely means. */
void ft_set_note(const char* note);

/* What this process is doing, reported with failures and by the watchdog. */
void ft_phase(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
const char* ft_role_name(void);
int ft_role(void);

/* Monotonic milliseconds. */
int64_t ft_now_ms(void);

/* --- the test logger handed to the plugin's init ------------------------- */

/* Counts WARN lines and keeps the last one; prints WARNs to stderr unless
 * FABRIC_TEST_QUIET=1, and INFO lines when FABRIC_TEST_VERBOSE=1. */
void ft_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
int ft_log_warns(void);
const char* ft_log_last_warn(void); /* "" when none; the buffer is per process */
void ft_log_reset(void);
/* Counts log lines of any level that contain substr (NULL or "" stops), from
 * now on; ft_log_watched says how many so far. */
void ft_log_watch(const char* substr);
int ft_log_watched(void);
/* Marks WARNs as expected (prints them as "expected WARN"), for error-path tests. */
void ft_log_expect_warns(int expected);

/* --- peer process and control channel ---------------------------------- */

typedef struct ft_peer {
  int role;   /* FT_PARENT or FT_CHILD */
  int fd;     /* this side of the socketpair */
  pid_t pid;  /* the child's pid, in the parent */
  int reaped; /* the parent has collected the child's status */
  int status; /* waitpid status once reaped */
} ft_peer;

typedef void (*ft_body_fn)(ft_peer* peer, void* arg);

/* Forks; the child runs body(peer, arg) and exits, the parent runs the same
 * body, then waits (at most timeout_s after its own body ends) for the child
 * and fails unless it exited 0. Both processes get a watchdog of timeout_s:
 * a hang anywhere is a failure naming the phase. The child runs a leak check
 * before it exits when built with LeakSanitizer. */
void ft_run_pair(const char* name, ft_body_fn body, void* arg, int timeout_s);

/* Control messages: framed, tagged, every receive bounded by timeout_ms. A
 * tag mismatch is a protocol desync and fails the test. */
void ft_send(ft_peer* p, const char* tag, const void* buf, size_t len);
void ft_recv(ft_peer* p, const char* tag, void* buf, size_t len, int timeout_ms);
/* Symmetric: send mine, receive the peer's (same length). */
void ft_xchg(ft_peer* p, const char* tag, const void* mine, void* theirs, size_t len, int timeout_ms);
void ft_sync(ft_peer* p, const char* tag, int timeout_ms);
/* 1 when a message (or the peer's end of the channel) is there to read
 * within timeout_ms; reads nothing. */
int ft_peer_sent(ft_peer* p, int timeout_ms);

/* The parent waits for the child to exit; returns 1 when it has (status in
 * p->status), 0 on timeout. */
int ft_wait_child(ft_peer* p, int timeout_ms);
/* Fails the test with a description unless the child exited with status 0. */
void ft_check_child_ok(ft_peer* p);

/* --- data patterns --------------------------------------------------------- */

/* Byte i of a message with seed s depends on (s, i) only, so a byte landing at
 * the wrong offset or in the wrong message is caught. */
uint64_t ft_seed(uint64_t a, uint64_t b, uint64_t c);
void ft_fill(void* buf, size_t len, uint64_t seed);
/* Returns 1 if every byte matches; otherwise 0 and the first bad offset. */
int ft_verify(const void* buf, size_t len, uint64_t seed, size_t* bad_offset);
/* Fails the test naming the first bad byte (expected, got, offset, length). */
void ft_verify_or_fail(const void* buf, size_t len, uint64_t seed, const char* what);
/* Poison used for receive buffers and guard zones. */
enum { FT_POISON = 0xA5 };
void ft_check_poison(const void* buf, size_t len, const char* what);

/* Page-aligned buffer of at least len bytes (never NULL; len 0 gives a page). */
void* ft_alloc(size_t len);
void ft_free(void* buf, size_t len);

/* --- environment hygiene --------------------------------------------------- */

/* Removes /dev/shm/<pid>:<n>:<m> regions of libfabric's shm provider that a
 * dead process with this pid left behind (see ft_harness.c); returns how many. */
/* How many shared-memory regions process pid holds under /dev/shm. */
int ft_shm_count(pid_t pid);
int ft_shm_cleanup(pid_t pid);

/* --- sanitizer helpers ------------------------------------------------------ */

/* Runs LeakSanitizer now when it is linked in; returns 1 if leaks were found. */
int ft_leak_check(void);
int ft_sanitized(void);

#ifdef __cplusplus
}
#endif
#endif /* FT_HARNESS_H */
