#!/usr/bin/env bash
# Split against whole messages over R rails, side by side in one run: netbench drives one build twice, interleaved,
# as "plugin" with messages split over the rails (FABRIC_STRIPE_THRESHOLD as set, else 256 KiB) and as
# "plugin-b" with FABRIC_STRIPE_THRESHOLD=0 (every message whole on one rail, round-robin). Same device (R copies
# of the provider's device, fused: netbench --rails R), same transport, same process layout.
#
#   tests/bench/stripes.sh <netbench> <plugin.so> <provider> "<R list>" "<window list>" [reps]
#
# Prints per R and window: latency (us, window 1 ping-pong) and one-way bandwidth (GB/s) for split and whole,
# and split/whole (above 1 is better for bandwidth, below 1 for latency). Sizes: STRIPES_LAT (default 1M,16M),
# STRIPES_BW (default 512K,4M,16M). FABRIC_TRANSPORT and FABRIC_RAIL_THREADS pass through to both.
# Exit status 1 if a run failed.
set -uo pipefail
nb=${1:?usage: stripes.sh <netbench> <plugin.so> <provider> "<R list>" "<window list>" [reps]}
plugin=${2:?}; prov=${3:?}; counts=${4:?}; windows=${5:?}; reps=${6:-3}
export FABRIC_STRIPE_THRESHOLD=${FABRIC_STRIPE_THRESHOLD:-262144}
tmp=$(mktemp -d)
mkdir -p "$tmp/b" && cp "$plugin" "$tmp/b/" || exit 1 # plugin-b must be another file to load twice
fail=0
printf '%-8s %-9s %5s %4s %-4s %8s %10s %10s %11s\n' provider transport rails win test size split whole split/whole
for r in $counts; do
  for w in $windows; do
    csv="$tmp/r$r.w$w.csv"
    FI_TCP_IFACE=lo "$nb" --provider "$prov" --modes plugin --tests lat,bw --lat-sizes "${STRIPES_LAT:-1M,16M}" \
      --bw-sizes "${STRIPES_BW:-512K,4M,16M}" --window "$w" --reps "$reps" --rails "$r" \
      --plugin-b "$tmp/b/$(basename "$plugin")" --env-b FABRIC_STRIPE_THRESHOLD=0 --csv "$csv" "$plugin" \
      >"$tmp/r$r.w$w.log" 2>&1 || { fail=1; tail -3 "$tmp/r$r.w$w.log"; continue; }
    python3 - "$csv" "$prov" "${FABRIC_TRANSPORT:-auto}" "$r" "$w" <<'PY'
import csv, sys
path, prov, tr, r, w = sys.argv[1:]
rows = list(csv.reader(l for l in open(path) if not l.startswith("#")))
head = rows[0]
for row in rows[1:]:
    d = dict(zip(head, row))
    if d["test"] == "lat" and w != "1":
        continue
    a, b = float(d["plugin_median"]), float(d["plugin_b_median"])
    print(f'{prov:8s} {tr:9s} {r:>5s} {w:>4s} {d["test"]:4s} {d["param"]:>8s} {a:10.3f} {b:10.3f} {a / b:11.3f}')
PY
  done
done
[[ $fail == 0 ]] || { echo "stripes.sh: a run failed: the logs are in $tmp"; exit 1; }
rm -rf "$tmp"
