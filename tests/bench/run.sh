#!/usr/bin/env bash
# The full side-by-side measurement behind docs/performance.md: netbench on
# tcp;ofi_rxm (loopback) and shm, 5 interleaved repetitions each, CSV per
# provider, then the plots (skipped with a note when matplotlib is missing).
# Usage: tests/bench/run.sh [build-dir] [out-dir] [extra netbench options...]
# Timings are only meaningful on an otherwise idle machine.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-$top/build}
out=${2:-$build/bench-results}
shift 2 || shift $# || true
bench=$build/tests/bench/netbench
plugin=$build/libnccl-net-fabric.so
[ -x "$bench" ] || { echo "run.sh: $bench not built (bash tests/build.sh $build)" >&2; exit 2; }
mkdir -p "$out"
{
  echo "# $(date -u +%FT%TZ) $(uname -srm), $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# git $(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$top" diff --quiet 2>/dev/null || echo ' (modified)')"
} > "$out/conditions.txt"
for prov in tcp shm; do
  echo "== $prov =="
  FI_TCP_IFACE=${FI_TCP_IFACE:-lo} "$bench" --provider "$prov" --reps 5 --csv "$out/$prov.csv" "$@" "$plugin" |
    tee "$out/$prov.txt"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/conditions.txt"
# Debian's interpreter carries python3-matplotlib; a pyenv one earlier in PATH usually does not
python=$(command -v /usr/bin/python3 || command -v python3)
"$python" "$top/tests/bench/plot.py" --out "$out" "$out/tcp.csv" "$out/shm.csv" ||
  echo "run.sh: no plots (see the message above); the CSV files are in $out"
