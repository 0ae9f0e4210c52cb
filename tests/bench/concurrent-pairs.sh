#!/usr/bin/env bash
# How far bandwidth can scale when traffic is spread over several endpoints:
# N netbench process pairs at once, each with its own endpoints and progress
# (pair k pinned to CPUs 2k and 2k+1), one-way bandwidth of raw libfabric and
# of the plugin, summed over the pairs. The ceiling a multi-rail comm could
# reach on this machine and provider (issue 11), measured without one.
#
#   tests/bench/concurrent-pairs.sh <netbench> <plugin.so> <provider> <size> "<N list>" [reps]
#
# Prints one line per N: the sum over pairs of each pair's median, raw and
# plugin, and the per-pair spread. Exit status 1 if any pair failed.
set -uo pipefail
nb=${1:?usage: concurrent-pairs.sh <netbench> <plugin.so> <provider> <size> "<N list>" [reps]}
plugin=${2:?}; prov=${3:?}; size=${4:?}; counts=${5:?}; reps=${6:-3}
tmp=$(mktemp -d)
fail=0
printf '%-8s %-6s %8s %12s %12s %s\n' provider pairs size raw_GBps plugin_GBps "per-pair raw / plugin"
for n in $counts; do
  pids=()
  for ((k = 0; k < n; k++)); do
    FI_TCP_IFACE=lo "$nb" --provider "$prov" --tests bw --bw-sizes "$size" --reps "$reps" --cpus $((2 * k)),$((2 * k + 1)) \
      --csv "$tmp/$n.$k.csv" "$plugin" >"$tmp/$n.$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  python3 - "$tmp" "$n" "$prov" "$size" <<'EOF'
import csv, sys, glob
tmp, n, prov, size = sys.argv[1:]
raw = plug = 0.0
parts = []
for k in range(int(n)):
    try:
        rows = [r for r in csv.reader(l for l in open(f"{tmp}/{n}.{k}.csv") if not l.startswith("#"))]
    except OSError:
        parts.append("failed"); continue
    head, body = rows[0], rows[1:]
    for r in body:
        d = dict(zip(head, r))
        if d["test"] == "bw":
            raw += float(d["raw_median"]); plug += float(d["plugin_median"])
            parts.append(f'{float(d["raw_median"]):.2f}/{float(d["plugin_median"]):.2f}')
print(f"{prov:<8} {n:<6} {size:>8} {raw:12.2f} {plug:12.2f} {' '.join(parts)}")
EOF
done
[[ $fail == 0 ]] || { echo "concurrent-pairs.sh: a pair failed: its log is in $tmp"; exit 1; }
rm -rf "$tmp"
