#!/usr/bin/env bash
# One command: install what is missing, build, and run the whole suite:
# the normal build (every CTest label) and an AddressSanitizer/UBSan build
# (unit, abi and functional tests).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc)
bash "$top/tests/install-deps.sh"

echo "== build and test (RelWithDebInfo) =="
bash "$top/tests/build.sh" "$top/build"
ctest --test-dir "$top/build" --output-on-failure -j "$jobs" --timeout 900

echo "== build and test under AddressSanitizer + UBSan =="
bash "$top/tests/build.sh" "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug -DFABRIC_SANITIZE=ON
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$top/build-asan" --output-on-failure -j "$jobs" --timeout 900 -L 'unit|abi|functional'
