#!/usr/bin/env bash
# Bandwidth through one comm of R rails (netbench --rails R: FABRIC_RAILS copies of the provider's device, fused),
# side by side with its reference in the same run: R raw libfabric pairs streaming at once, each with its own
# endpoint and its own thread (what R rails could reach if nothing but the provider limited them; raw netbench has
# no comm over several endpoints of its own). One-way bandwidth, window 16, medians of reps.
#
#   tests/bench/rails.sh <netbench> <plugin.so> <provider> <size> "<R list>" [reps]
#
# Prints per R: the plugin's GB/s over R rails, the R raw pairs' summed GB/s, and plugin/raw. Extra netbench
# options for the plugin runs (--cpus, a table version) go in RAILS_NB_ARGS; FABRIC_RAIL_THREADS passes through.
# Exit status 1 if a run failed.
set -uo pipefail
nb=${1:?usage: rails.sh <netbench> <plugin.so> <provider> <size> "<R list>" [reps]}
plugin=${2:?}; prov=${3:?}; size=${4:?}; counts=${5:?}; reps=${6:-3}
tmp=$(mktemp -d)
fail=0
median() { python3 - "$@" <<'PY'
import csv, sys
total = 0.0
for path in sys.argv[2:]:
    rows = [r for r in csv.reader(l for l in open(path) if not l.startswith("#"))]
    head, body = rows[0], rows[1:]
    for r in body:
        d = dict(zip(head, r))
        if d["test"] == "bw":
            total += float(d[sys.argv[1] + "_median"])
print(f"{total:.3f}")
PY
}
printf '%-8s %5s %8s %14s %16s %8s\n' provider rails size plugin_GBps raw_pairs_GBps ratio
for r in $counts; do
  FI_TCP_IFACE=lo "$nb" --provider "$prov" --modes plugin --tests bw --bw-sizes "$size" --reps "$reps" --rails "$r" \
    ${RAILS_NB_ARGS:-} --csv "$tmp/plugin.$r.csv" "$plugin" >"$tmp/plugin.$r.log" 2>&1 || fail=1
  pids=()
  for ((k = 0; k < r; k++)); do
    FI_TCP_IFACE=lo "$nb" --provider "$prov" --modes raw --tests bw --bw-sizes "$size" --reps "$reps" \
      --csv "$tmp/raw.$r.$k.csv" "$plugin" >"$tmp/raw.$r.$k.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || fail=1; done
  plug=$(median plugin "$tmp/plugin.$r.csv" 2>/dev/null || echo nan)
  raw=$(median raw "$tmp"/raw."$r".*.csv 2>/dev/null || echo nan)
  ratio=$(python3 -c "import sys; p,r=map(float,sys.argv[1:]); print(f'{p/r:.2f}' if r else 'nan')" "$plug" "$raw" 2>/dev/null || echo nan)
  printf '%-8s %5s %8s %14s %16s %8s\n' "$prov" "$r" "$size" "$plug" "$raw" "$ratio"
done
[[ $fail == 0 ]] || { echo "rails.sh: a run failed: the logs are in $tmp"; exit 1; }
rm -rf "$tmp"
