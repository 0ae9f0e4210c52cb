#!/usr/bin/env bash
# Builds what tests/gpu/run-rma.sh needs into <dir> (CPU machine): the plugin,
# nccl_rma_check against NCCL 2.30.7's headers, and NCCL 2.30.7 itself (the
# tarball from ../shared/gpu, unpacked on the GPU machine).
#   bash tests/gpu/build-rma.sh build-gpu-rma      (BUILD_DIR: the plugin's build directory, default build/)
# LF2_CUDA=<prefix> (a libfabric 2.x built with CUDA, as tests/gpu/build-gpu-mem.sh makes in <dest>/lf2) adds
# <dir>/lf2: that libfabric's libraries and the plugin built against it, for run-rma.sh's "shm-direct" run (GPU
# windows registered with shm's FI_HMEM entry, no staging).
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
gcc -O2 -Wall -shared -fPIC -o "$dir/stackdump.so" "$top/tests/gpu/stackdump.c" # stacks of a hung run (no gdb there)
if [[ -n ${LF2_CUDA:-} ]]; then
  lf=$(cd "$LF2_CUDA" && pwd)
  work=$dir.work
  mkdir -p "$work"
  rm -f "$work/build-lf2/CMakeCache.txt"
  PKG_CONFIG_PATH=$lf/lib/pkgconfig cmake -S "$top" -B "$work/build-lf2" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    >"$work/build-lf2.log" 2>&1 && cmake --build "$work/build-lf2" --target nccl-net-fabric >>"$work/build-lf2.log" 2>&1 ||
    { tail -20 "$work/build-lf2.log"; echo "build-rma.sh: FAILED: the plugin against $lf"; exit 1; }
  rm -rf "$dir/lf2"
  mkdir -p "$dir/lf2/lib"
  cp -L "$lf/lib/libfabric.so.1" "$dir/lf2/lib/" # the name the plugin asks for, as a file (links may not travel)
  cp "$work/build-lf2/libnccl-net-fabric.so" "$dir/lf2/"
fi
cp "$tarball" "$dir/"
echo "built $dir: $(ls "$dir" | tr '\n' ' ')"
