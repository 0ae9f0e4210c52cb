# Writes fab_version.h (cmake -P, at every build): the project version and,
# from a git checkout, the commit (with "-dirty" when tracked files differ).
# The header is rewritten only when its text changes.
#   cmake -DSRC=<source dir> -DOUT=<header> -DVERSION=<x.y.z> -P version.cmake
set(commit "")
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS "${SRC}/.git")
  execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    set(commit "")
  else()
    execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${SRC}" status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE dirty OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(dirty)
      string(APPEND commit "-dirty")
    endif()
  endif()
endif()
if(commit STREQUAL "")
  set(commit "unknown (not built from a git checkout)")
endif()
set(text "/* Written by codegen/version.cmake at build time. */\n#define FAB_VERSION \"${VERSION}\"\n#define FAB_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
