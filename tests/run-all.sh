#!/usr/bin/env bash
# One command: install what is missing, build, and run the whole suite:
# the normal build (every CTest label) and an AddressSanitizer/UBSan build
# (unit, abi and functional tests).
#
# Tests labelled engine-bug reproduce open engine bugs (docs/known-bugs.md).
# When there are any, they run first, in a step that reports but does not
# gate, until fixed.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)
bash "$top/tests/install-deps.sh"

echo "== build (RelWithDebInfo) =="
bash "$top/tests/build.sh" "$top/build"

if ctest --test-dir "$top/build" -N -L engine-bug | grep -q "Test *#"; then
  echo "== open engine bugs (reported, not gating; docs/known-bugs.md) =="
  if ctest --test-dir "$top/build" -j "$jobs" --timeout 150 -L engine-bug; then
    echo "the open engine-bug tests now pass: remove their engine-bug label"
  else
    echo "the open engine-bug tests still fail, as documented"
  fi
fi

echo "== test (RelWithDebInfo) =="
ctest --test-dir "$top/build" --output-on-failure -j "$jobs" --timeout 900 -LE engine-bug

echo "== Debian package: build, install, load by bare name, self-test, remove =="
if [ "$(id -u)" -eq 0 ]; then
  bash "$top/tests/package/deb.sh" "$top/build-deb"
else
  echo "SKIPPED: tests/package/deb.sh installs the package with dpkg -i and needs root"
fi

echo "== libfabric 2.x: the plugin on a 2.x runtime, and built against it (FABRIC_LIBFABRIC2) =="
bash "$top/tests/libfabric2.sh"

echo "== build and test under AddressSanitizer + UBSan =="
bash "$top/tests/build.sh" "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug -DFABRIC_SANITIZE=ON
# Every case under the sanitizers, through the core and the oldest and newest
# tables on both transports and providers, and the newest Neuron table on
# rdma (its one-sided calls); the versions between are the same engine
# through other generated shims, run in the normal build above (this keeps CI
# within its time budget).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$top/build-asan" --output-on-failure -j "$jobs" --timeout 900 -L 'unit|abi|functional' -LE engine-bug \
  -E 'functional\.(tcp|shm)\.(sendrecv|rdma)\.v(7|8|9|10|11)$|functional\.(tcp|shm)\.sendrecv\.neuron[0-9]+$|functional\.(tcp|shm)\.rdma\.neuron[45]$'

