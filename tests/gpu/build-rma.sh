#!/usr/bin/env bash
# Builds what tests/gpu/run-rma.sh needs into <dir> (CPU machine): the plugin,
# nccl_rma_check against NCCL 2.30.7's headers, and NCCL 2.30.7 itself (the
# tarball from ../shared/gpu, unpacked on the GPU machine).
#   bash tests/gpu/build-rma.sh build-gpu-rma      (BUILD_DIR: the plugin's build directory, default build/)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:?usage: build-rma.sh <dir>}
tarball=${NCCL_TARBALL:-$top/../shared/gpu/nccl-2.30.7-sm90.tar.xz}
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
build=${BUILD_DIR:-$top/build}
bash "$top/tests/build.sh" "$build" >/dev/null
cp "$build/libnccl-net-fabric.so" "$dir/"
nccl=$(mktemp -d)
tar xJf "$tarball" -C "$nccl" nccl/build/include nccl/build/lib
# libnccl was built against a newer glibc (the GPU machine's): its own
# references resolve there, so they are not checked here
gcc -O2 -Wall -Wextra -I"$nccl/nccl/build/include" -I"$cuda/include" "$top/tests/gpu/nccl_rma_check.c" \
    "$nccl/nccl/build/lib/libnccl.so.2" -Wl,--allow-shlib-undefined -L"$cuda/lib64" -lcudart_static -ldl -lrt \
    -lpthread -o "$dir/nccl_rma_check"
rm -rf "$nccl"
cp "$tarball" "$dir/"
echo "built $dir: $(ls "$dir" | tr '\n' ' ')"
