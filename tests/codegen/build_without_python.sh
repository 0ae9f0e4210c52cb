#!/usr/bin/env bash
# A configure and build with no Python at all, from the checked-in generated/:
# CMake is kept from finding one (CMAKE_DISABLE_FIND_PACKAGE_Python3) and any
# python3 or python on PATH fails loudly. The build must say that it skipped
# the freshness check, and yield a plugin that exports NCCL's tables.
#   build_without_python.sh <source dir> <work dir> <cmake generator>
set -euo pipefail
src=$1 work=$2 gen=$3
rm -rf "$work"
mkdir -p "$work/shim"
for p in python3 python; do
  printf '#!/bin/sh\necho "build_without_python: %s was called: $*" >&2\nexit 99\n' "$p" >"$work/shim/$p"
  chmod +x "$work/shim/$p"
done
export PATH=$work/shim:$PATH
cmake -S "$src" -B "$work/build" -G "$gen" -DFABRIC_BUILD_TESTS=OFF -DCMAKE_DISABLE_FIND_PACKAGE_Python3=ON \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; echo "FAILED: configure without Python"; exit 1; }
grep -q "building from the checked-in generated/ without checking it" "$work/configure.log" ||
  { cat "$work/configure.log"; echo "FAILED: the configure did not say that it skips the check"; exit 1; }
cmake --build "$work/build" --target nccl-net-fabric >"$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log"; echo "FAILED: build without Python"; exit 1; }
so=$work/build/libnccl-net-fabric.so
nm -D --defined-only "$so" | grep -q " ncclNetPlugin_v12$" || { echo "FAILED: $so exports no ncclNetPlugin_v12"; exit 1; }
echo "passed: configured and built without Python; $(basename "$so") exports $(nm -D --defined-only "$so" | grep -c ' nccl[A-Za-z]*Plugin_v[0-9]*$') tables"
