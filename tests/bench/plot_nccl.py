#!/usr/bin/env python3
"""Turns nccl-tests logs into PNG plots for docs/performance.md: the plugin
against NCCL's Socket transport (or any other configuration), per collective.

usage: plot_nccl.py [--out DIR] [--prefix NAME] LABEL=LOG [LABEL=LOG ...]

Each LOG is the output of one nccl-tests run (all_reduce_perf, sendrecv_perf,
...); the collective is read from its "# Collective test starting" line.
Several logs with one label and collective (rounds of the same run) are
combined: the median out-of-place time per size, with min..max bars. The
first label is the reference. Writes, per collective:
  <prefix><collective>.png   bus bandwidth vs size, and each label's time
                             divided by the reference's time vs size
Exits 1 when a log holds no result rows or reports wrong elements, 2 on bad
usage or without matplotlib (Debian: apt-get install python3-matplotlib).
"""
import argparse
import os
import re
import statistics
import sys

from plot import human, pyplot_or_none  # beside this script

ROW = re.compile(r"^\s+(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+|N/A)")
START = re.compile(r"^# Collective test starting: (\S+?)(_perf)?\s*$")


def load(path):
    """(collective, {size: (time_us, busbw_gbs)}) of one nccl-tests log."""
    coll, rows = None, {}
    with open(path, errors="replace") as f:
        for line in f:
            m = START.match(line)
            if m:
                coll = m.group(1)
                continue
            m = ROW.match(line)
            if not m:
                continue
            size, time_us, busbw, wrong = int(m.group(1)), float(m.group(2)), float(m.group(4)), m.group(5)
            if size == 0:
                continue  # all_gather's 0-byte row: nothing moved, and no place on a log axis
            if wrong not in ("0", "N/A"):
                sys.exit(f"plot_nccl.py: {path}: {wrong} wrong elements at {size} bytes; not plotting a failed run")
            rows[size] = (time_us, busbw)
    if not rows:
        sys.exit(f"plot_nccl.py: {path} has no nccl-tests result rows")
    if not coll:
        coll = os.path.basename(path).split(".")[0]
    return coll, rows


def combine(runs):
    """{size: (median, lo, hi) of time, median busbw} over the runs of one label."""
    sizes = sorted(set().union(*(r.keys() for r in runs)))
    out = {}
    for s in sizes:
        times = [r[s][0] for r in runs if s in r]
        bws = [r[s][1] for r in runs if s in r]
        out[s] = (statistics.median(times), min(times), max(times), statistics.median(bws))
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="directory for the PNG files")
    ap.add_argument("--prefix", default="nccl-", help="file name prefix")
    ap.add_argument("logs", nargs="+", metavar="LABEL=LOG")
    args = ap.parse_args(argv)
    pairs = []
    for item in args.logs:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            ap.error(f"{item!r} is not LABEL=LOG")
        if not os.path.isfile(path):
            ap.error(f"{path}: no such file")
        pairs.append((label, path))
    return args, pairs


def main(argv):
    args, pairs = parse_args(argv)
    plt = pyplot_or_none(__file__)
    if plt is None:
        return 2
    labels = []
    data = {}  # collective -> label -> [runs]
    for label, path in pairs:
        coll, rows = load(path)
        if label not in labels:
            labels.append(label)
        data.setdefault(coll, {}).setdefault(label, []).append(rows)
    os.makedirs(args.out, exist_ok=True)
    for coll, by_label in sorted(data.items()):
        ref = next((l for l in labels if l in by_label), None)
        combined = {l: combine(by_label[l]) for l in labels if l in by_label}
        fig, (bw_ax, ratio_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
        for label, series in combined.items():
            sizes = sorted(series)
            color = f"C{labels.index(label)}"  # one color per label in both panels
            bw_ax.plot(sizes, [series[s][3] for s in sizes], marker="o", ms=3, color=color, label=label)
            if label == ref:
                continue
            common = [s for s in sizes if s in combined[ref]]
            ratio = [series[s][0] / combined[ref][s][0] for s in common]
            lo = [series[s][1] / combined[ref][s][0] for s in common]
            hi = [series[s][2] / combined[ref][s][0] for s in common]
            ratio_ax.errorbar(common, ratio, yerr=[[r - l for r, l in zip(ratio, lo)], [h - r for r, h in zip(ratio, hi)]],
                              marker="o", ms=3, capsize=2, color=color, label=f"{label} ÷ {ref}")
        for ax in (bw_ax, ratio_ax):
            ax.set_xscale("log", base=2)
            ticks = sorted(set().union(*(c.keys() for c in combined.values())))[::2]
            ax.set_xticks(ticks)
            ax.set_xticklabels([human(t) for t in ticks], rotation=45)
            ax.set_xlabel("message size (bytes)")
            ax.grid(True, alpha=0.3)
        bw_ax.set_ylabel("bus bandwidth (GB/s), median")
        bw_ax.set_title(f"{coll}: bus bandwidth")
        ratio_ax.axhline(1.0, color="grey", lw=1)
        ratio_ax.set_ylabel(f"time ÷ {ref}'s (lower is faster)")
        ratio_ax.set_title(f"{coll}: time against {ref}, median (min..max)")
        bw_ax.legend()
        if len(combined) > 1:
            ratio_ax.legend()
        fig.tight_layout()
        path = os.path.join(args.out, f"{args.prefix}{coll}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
