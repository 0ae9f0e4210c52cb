#!/usr/bin/env bash
# Builds, on the CPU machine, what tests/gpu/run.sh needs on the GPU machine:
# the all-versions library and one library per single net version NCCL 2.28
# can load (v6..v11), side by side in one folder.
# Usage: tests/gpu/build-variants.sh <out-dir>
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:?usage: build-variants.sh <out-dir>}
mkdir -p "$out"
bash "$top/tests/install-deps.sh"
bash "$top/tests/build.sh" "$top/build-gpu/all" -DFABRIC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release
cp "$top/build-gpu/all/libnccl-net-fabric.so" "$out/libnccl-net-fabric.so"
for v in 6 7 8 9 10 11; do
  bash "$top/tests/build.sh" "$top/build-gpu/v$v" -DFABRIC_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
    -DFABRIC_NET_VERSIONS="$v"
  cp "$top/build-gpu/v$v/libnccl-net-fabric.so" "$out/libnccl-net-fabric-v$v.so"
done
for f in "$out"/*.so; do
  printf '%s: %s\n' "$(basename "$f")" "$(nm -D --defined-only "$f" | awk '/ncclNetPlugin/ {print $3}' | tr '\n' ' ')"
done
