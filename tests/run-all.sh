#!/usr/bin/env bash
# One command: install what is missing, build, and run the whole suite:
# the normal build (every CTest label) and an AddressSanitizer/UBSan build
# (unit, abi and functional tests).
#
# Tests labelled engine-bug reproduce open engine bugs (docs/known-bugs.md).
# When there are any, they run first, in a step that reports but does not
# gate, until fixed. Every stage runs even when an earlier one failed, and
# the last line is the verdict: "stages: N passed, N failed (...)".
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)
t0=$(date +%s)

# Every stage runs, whatever an earlier one did (a stage that needs a build
# that failed fails at once); the last line is the verdict.
passed=0 failed=0 failed_names=()
stage() { # name, then the command
  local name=$1; shift
  local s=$(date +%s)
  echo "== $name =="
  if "$@"; then passed=$((passed + 1)); r=passed; else failed=$((failed + 1)); failed_names+=("$name"); r=FAILED; fi
  echo "== $name: $r ($(( $(date +%s) - s )) s) =="
  [[ $r == passed ]]
}
declare -A build_ok=()
built() { [[ -n ${build_ok[$1]:-} ]] || { echo "not run: the build in $1 failed"; return 1; }; }

stage "install dependencies" bash "$top/tests/install-deps.sh"
stage "build (RelWithDebInfo)" bash "$top/tests/build.sh" "$top/build" && build_ok[$top/build]=1

engine_bugs() {
  built "$top/build" || return 1
  ctest --test-dir "$top/build" -N -L engine-bug | grep -q "Test *#" || { echo "none"; return 0; }
  if ctest --test-dir "$top/build" -j "$jobs" --timeout 150 -L engine-bug; then
    echo "the open engine-bug tests now pass: remove their engine-bug label"
  else
    echo "the open engine-bug tests still fail, as documented"
  fi
}
stage "open engine bugs (reported, not gating; docs/known-bugs.md)" engine_bugs

normal_tests() {
  built "$top/build" && ctest --test-dir "$top/build" --output-on-failure -j "$jobs" --timeout 900 -LE engine-bug
}
stage "test (RelWithDebInfo)" normal_tests

deb() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIPPED: tests/package/deb.sh installs the package with dpkg -i and needs root"
    return 0
  fi
  # build trees of their own: the README's build-deb may be a Makefile tree, these are Ninja ones
  bash "$top/tests/package/deb.sh" "$top/build-package-check" &&
    bash "$top/tests/package/install.sh" "$top/build-install-check"
}
stage "packages: the Debian package and cmake --install, each loaded by bare name, then removed" deb

lf2() { built "$top/build" && bash "$top/tests/libfabric2.sh"; }
stage "libfabric 2.x: the plugin on a 2.x runtime, and built against it (FABRIC_LIBFABRIC2)" lf2

stage "build under AddressSanitizer + UBSan" \
  bash "$top/tests/build.sh" "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug -DFABRIC_SANITIZE=ON && build_ok[$top/build-asan]=1
# Every case under the sanitizers, through the core on both transports and
# providers, the newest net table on the transport auto picks on each
# provider (tcp rdma, shm sendrecv), and the newest Neuron table on rdma (its
# one-sided calls); the other versions are the same engine through other
# generated shims, and the eager path is the core's cases again
# with eager writes on; of the one-sided suite, the oldest and newest RMA
# tables and the 2-rank runs (the 4-rank ones are the same code, longer);
# of the NIC-profile cases and rxm's larger eager size, all but the whole core suites, the 64 MiB
# staged puts and the Neuron runs under the profiles; of the suites over four rails, the close and failure
# cases (sendrecv) and not the whole core suite (rdma):
# the rest run in the normal build above (this keeps CI within
# its time budget). CMake's regular expressions take at most 9 groups: the
# exclusions added last name tests whole, without groups.
asan_skip='functional\.(tcp|shm)\.(sendrecv|rdma)\.v(6|7|8|9|10|11)$|functional\.tcp\.sendrecv\.v12$|functional\.shm\.rdma\.v12$|functional\.[a-z]+\.sendrecv\.neuron[0-9]+$|functional\.(tcp|shm)\.rdma\.(neuron[45]|eager)$|functional\.rma\.[a-z]+\.(v1[45]\.n2|.*\.n4)$|functional\.[a-z]+\.(rdma|sendrecv)\.(efa|verbs|cxi|shm-gpu)$|functional\.tcp\.rdma\.rxm16$|functional\.[a-z]+\.rdma\.neuron[0-9]+\.[a-z-]+$|large_puts$|large_puts\.efa$|functional\.tcp\.rdma\.nic_rails$'
asan_tests() {
  built "$top/build-asan" || return 1
  # A regular expression CMake cannot take excludes nothing, silently: check that it excludes some.
  local all left
  all=$(ctest --test-dir "$top/build-asan" -N -L 'unit|abi|functional' | grep -c "Test *#")
  left=$(ctest --test-dir "$top/build-asan" -N -L 'unit|abi|functional' -E "$asan_skip" | grep -c "Test *#")
  if [[ $left -ge $all ]]; then echo "the exclusions below excluded nothing (CMake takes at most 9 groups)"; return 1; fi
  echo "$left of $all entries under the sanitizers"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$top/build-asan" --output-on-failure -j "$jobs" --timeout 900 -L 'unit|abi|functional' \
    -LE engine-bug \
    -E "$asan_skip"
}
stage "test under AddressSanitizer + UBSan" asan_tests

# Why each failed test failed, last: CI shows the start and the end of this
# output, and a failing test's own lines sit in the middle of it.
why_failed() {
  local dir=$1 log=$1/Testing/Temporary/LastTest.log
  [[ -s $dir/Testing/Temporary/LastTestsFailed.log && -f $log ]] || return 0
  echo "-- failed in $(basename "$dir"): $(cut -d: -f2 "$dir/Testing/Temporary/LastTestsFailed.log" | tr '\n' ' ')"
  grep -a -E "check .* failed|FT_FAIL|WATCHDOG|CRASH|Unexpected signal|ERROR: AddressSanitizer|runtime error:|LeakSanitizer|Timeout|hung" \
    "$log" | grep -a -v "expected WARN" | head -n 25
}
for d in "$top/build" "$top/build-asan"; do why_failed "$d"; done

failed_list=$(printf '%s; ' "${failed_names[@]}")
echo "stages: $passed passed, $failed failed${failed_names[*]:+ (${failed_list%; })}; $(( $(date +%s) - t0 )) s in all"
[[ $failed -eq 0 ]]
