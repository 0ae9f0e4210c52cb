#!/usr/bin/env bash
# Builds, on the CPU machine, what run-gpu-mem.sh needs on a 1-GPU machine:
#
#   tests/gpu/build-gpu-mem.sh <dest> [<libfabric source .tgz or tree>]
#
# <dest>/lf2         libfabric 2.x with CUDA (dlopen'ed at run time, so it
#                    builds without a GPU), tcp, shm and rxm; built once, cached
# <dest>/plugin-lf2  the plugin built against it (FI_MR_DMABUF: regMrDmaBuf)
# <dest>/plugin-lf1  the plugin of build/ (built against Debian's 1.17)
# <dest>/bin         fabric-gpu-mem and netbench of build/, and netbench-lf2
#                    (built against the 2.x: raw dma-buf registration)
#
# Sources, logs and build trees go to <dest>.work (not carried). The source
# defaults to ../shared/libfabric/*.tgz beside the checkout.
# libfabric's CUDA support needs nvml.h at build time: NVML_INCLUDE names a
# folder holding it, else it comes from PyPI's nvidia-nvml-dev-cu12 (pip).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${1:?usage: build-gpu-mem.sh <dest> [libfabric source]}
src=${2:-$(ls "$top"/../shared/libfabric/*.tgz 2>/dev/null | head -1)}
[[ -n $src ]] || { echo "build-gpu-mem.sh: no libfabric source given or found in ../shared/libfabric"; exit 2; }
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
work=$dest.work
mkdir -p "$work"
jobs=$(nproc)

nvml_include() {
  if [[ -n ${NVML_INCLUDE:-} ]]; then echo "$NVML_INCLUDE"; return; fi
  local d=$work/nvml
  if [[ ! -e $d/include/nvml.h ]]; then
    mkdir -p "$d"
    pip download --no-deps -d "$d" nvidia-nvml-dev-cu12 >"$d/pip.log" 2>&1 ||
      { tail -5 "$d/pip.log"; echo "build-gpu-mem.sh: cannot get nvml.h (set NVML_INCLUDE)"; exit 1; }
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$d"/*.whl "$d/x"
    mkdir -p "$d/include"
    cp "$(find "$d/x" -name nvml.h | head -1)" "$d/include/"
  fi
  echo "$d/include"
}

# --- libfabric 2.x with CUDA --------------------------------------------------------------------------
lf=$dest/lf2
key=$(stat -c '%n %s %Y' "$src")
if [[ ! -e $lf/lib/libfabric.so || "$(cat "$work/lf2.stamp" 2>/dev/null)" != "$key" ]]; then
  inc=$(nvml_include)
  echo "building libfabric with CUDA from $src into $lf (once)"
  rm -rf "$work/lf2-src" "$lf"
  mkdir -p "$work/lf2-src"
  if [[ -f $src ]]; then tar xzf "$src" -C "$work/lf2-src"; else cp -a "$src/." "$work/lf2-src/"; fi
  tree=$(dirname "$(find "$work/lf2-src" -maxdepth 2 -name configure.ac | head -1)")
  (cd "$tree" && ./autogen.sh >"$work/lf2-autogen.log" 2>&1 &&
    ./configure --prefix="$lf" --with-cuda=/usr/local/cuda --enable-cuda-dlopen CPPFLAGS="-I$inc" \
      --enable-tcp --enable-shm --enable-rxm --disable-sockets --disable-verbs --disable-efa --disable-psm2 \
      --disable-psm3 --disable-usnic --disable-opx --disable-ucx --disable-lpp --disable-cxi --disable-mrail \
      --disable-rxd --disable-udp --disable-sm2 --disable-lnx >"$work/lf2-configure.log" 2>&1 &&
    make -j"$jobs" >"$work/lf2-make.log" 2>&1 && make install >"$work/lf2-install.log" 2>&1) ||
    { tail -20 "$work"/lf2-*.log; echo "build-gpu-mem.sh: FAILED: building libfabric"; exit 1; }
  grep -q 'define HAVE_CUDA 1' "$tree/config.h" || { echo "build-gpu-mem.sh: libfabric configured without CUDA"; exit 1; }
  rm -rf "$work/lf2-src" "$lf/share" "$lf/lib/libfabric.a"
  echo "$key" >"$work/lf2.stamp"
fi

# --- the plugin against it, and against 1.17 ----------------------------------------------------------
rm -f "$work/build-lf2/CMakeCache.txt"
PKG_CONFIG_PATH=$lf/lib/pkgconfig cmake -S "$top" -B "$work/build-lf2" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  >"$work/build-lf2.log" 2>&1 &&
  cmake --build "$work/build-lf2" --target nccl-net-fabric netbench >>"$work/build-lf2.log" 2>&1 ||
  { tail -20 "$work/build-lf2.log"; echo "build-gpu-mem.sh: FAILED: the plugin against libfabric 2.x"; exit 1; }
cmake --build "$top/build" --target nccl-net-fabric fabric-gpu-mem netbench >/dev/null
mkdir -p "$dest/plugin-lf2" "$dest/plugin-lf1" "$dest/bin"
cp "$work/build-lf2/libnccl-net-fabric.so" "$dest/plugin-lf2/"
cp "$top/build/libnccl-net-fabric.so" "$dest/plugin-lf1/"
cp "$top/build/tests/gpu/fabric-gpu-mem" "$top/build/tests/bench/netbench" "$dest/bin/"
cp "$work/build-lf2/tests/bench/netbench" "$dest/bin/netbench-lf2"
echo "build-gpu-mem.sh: ready in $dest ($(du -sh "$dest" | cut -f1) to carry)"
