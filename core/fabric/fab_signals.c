/*
 * Signal handlers our dependencies install behind the application's back.
 *
 * libfabric 1.17 (Debian) links libpsm_infinipath, whose libinfinipath
 * installs handlers for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM
 * in its constructor, unless IPATH_NO_BACKTRACE is set. On a crash they write
 * <program>-<pid>,<host>.btr into the working directory, and on every one of
 * those signals they call exit(1): exit runs the library destructors (ours
 * included) while the crashed or signalled thread still holds whatever lock
 * it held, so a crash could become a process that never exits. The
 * constructor runs when libfabric is loaded, i.e. before any code of ours, so
 * setting IPATH_NO_BACKTRACE from here is too late (and setenv is not safe
 * with other threads running); instead, handlers that live in those
 * libraries are put back to the default action, once at load and once after
 * discovery (a provider may install more when it initialises). Handlers of
 * the application are never touched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <string.h>

#include "fab_engine.h"

static int foreign_handler(const struct sigaction* sa) {
  void* fn = (sa->sa_flags & SA_SIGINFO) ? (void*)sa->sa_sigaction : (void*)sa->sa_handler;
  if (fn == (void*)SIG_DFL || fn == (void*)SIG_IGN) return 0;
  Dl_info di;
  if (!dladdr(fn, &di) || !di.dli_fname) return 0;
  return strstr(di.dli_fname, "libinfinipath") || strstr(di.dli_fname, "libpsm");
}

int fab_signals_reset_psm(void) {
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE, SIGINT, SIGTERM, SIGQUIT};
  int n = 0;
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
    struct sigaction sa;
    if (sigaction(sigs[i], NULL, &sa) != 0 || !foreign_handler(&sa)) continue;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    if (sigaction(sigs[i], &dfl, NULL) == 0) n++;
  }
  return n;
}

__attribute__((constructor)) static void fab_signals_at_load(void) { fab_signals_reset_psm(); }
