#!/usr/bin/env python3
"""Medians of nccl-tests logs, one column per configuration.

Reads <dir>/nccl-<collective>-<config>-r<round>.log (one nccl-tests run each) and prints, for every collective and
size, the median over the rounds of the out-of-place time (us) and bus bandwidth (GB/s) of each configuration, and
each configuration's time and bandwidth divided by the first one's (the reference, e.g. NCCL's Socket transport).

    python3 tests/bench/nccl_table.py docs/results/h100x2-2026-11-27-rail-threads socket fabric fabric-nic4t peer
"""
import argparse
import glob
import os
import re
import statistics

ROW = re.compile(r"^\s+(\d+)\s+\d+\s+(?:float|int8|char|half|bfloat16|double|int32)\s+\S+\s+-?\d+\s+(\S+)\s+\S+\s+(\S+)")


def read(directory):
    runs = {}
    for path in glob.glob(os.path.join(directory, "nccl-*.log")):
        m = re.match(r"nccl-(all_reduce|all_gather|alltoall|sendrecv|reduce_scatter|broadcast)-(.+)-r\d+\.log$",
                     os.path.basename(path))
        if not m:
            continue
        coll, config = m.groups()
        with open(path) as f:
            for line in f:
                r = ROW.match(line)
                if r:
                    runs.setdefault((coll, config, int(r.group(1))), []).append((float(r.group(2)), float(r.group(3))))
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("configs", nargs="+", help="configurations in column order; the first is the reference")
    a = ap.parse_args()
    runs = read(a.dir)
    for coll in sorted({k[0] for k in runs}):
        print(f"## {coll}: time us / busbw GB/s (ratio to {a.configs[0]}: time / busbw)")
        print("size", *a.configs, sep="\t")
        for size in sorted({k[2] for k in runs if k[0] == coll}):
            ref = runs.get((coll, a.configs[0], size))
            cells = []
            for c in a.configs:
                v = runs.get((coll, c, size))
                if not v:
                    cells.append("-")
                    continue
                t, bw = statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)
                cell = f"{t:.1f}/{bw:.2f}"
                if ref and c != a.configs[0]:
                    rt, rbw = statistics.median(x[0] for x in ref), statistics.median(x[1] for x in ref)
                    cell += f" ({t / rt:.2f}" + (f"/{bw / rbw:.2f})" if rbw > 0 else ")")
                cells.append(cell)
            print(size, *cells, sep="\t")


if __name__ == "__main__":
    main()
