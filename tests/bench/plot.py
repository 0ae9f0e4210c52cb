#!/usr/bin/env python3
"""Turns netbench CSV files into PNG plots for docs/performance.md.

usage: plot.py [--out DIR] [--prefix NAME] results.csv [more.csv ...]

Each CSV (netbench --csv) gives one series per mode (raw, plugin); several
CSVs (e.g. one per provider) are overlaid, labelled by their provider. Writes:
  <prefix>latency.png     one-way ping-pong latency vs size (min..max bars)
  <prefix>bandwidth.png   one-way and bidirectional bandwidth vs size
  <prefix>ratio.png       plugin/raw per test and size, with the targets
  <prefix>summary.png     message rate, setup time, registration cost, memory

Needs matplotlib (Debian: apt-get install python3-matplotlib); exits 2 with
that message when it is missing.
"""
import argparse
import csv
import os
import sys


def load(path):
    """Returns (provider label, list of row dicts) of one netbench CSV."""
    provider = os.path.basename(path)
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    body = []
    for line in lines:
        if line.startswith("#"):
            for part in line[1:].split(";"):
                part = part.strip()
                if part.startswith("provider="):
                    provider = part[len("provider="):]
            continue
        body.append(line)
    rows = list(csv.DictReader(body))
    if not rows or "ratio_plugin_over_raw" not in rows[0]:
        sys.exit(f"plot.py: {path} is not a netbench CSV (no ratio_plugin_over_raw column)")
    for r in rows:
        for k in ("param", "window", "higher_is_better", "reps"):
            r[k] = int(r[k])
        for k in ("raw_median", "raw_min", "raw_max", "plugin_median", "plugin_min", "plugin_max",
                  "ratio_plugin_over_raw", "plugin_b_median", "plugin_b_min", "plugin_b_max",
                  "ratio_plugin_b_over_raw"):
            try:
                r[k] = float(r.get(k) or "nan")  # plugin_b_*: only with --plugin-b
            except ValueError:
                r[k] = float("nan")
    return provider, rows


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def series(rows, test):
    return sorted((r for r in rows if r["test"] == test), key=lambda r: r["param"])


def plot_vs_size(ax, datasets, test, ylabel, logy):
    import math
    styles = {"raw": "--", "plugin": "-", "plugin_b": ":"}
    any_data = False
    for provider, rows in datasets:
        pts = series(rows, test)
        for mode in ("raw", "plugin", "plugin_b"):
            xs, ys, lo, hi = [], [], [], []
            for r in pts:
                y = r[f"{mode}_median"]
                if math.isnan(y):
                    continue
                x = r["param"] if r["param"] > 0 else 1  # log axis: plot 0 B at 1
                xs.append(x)
                ys.append(y)
                lo.append(max(0.0, y - r[f"{mode}_min"]))
                hi.append(max(0.0, r[f"{mode}_max"] - y))
            if xs:
                any_data = True
                ax.errorbar(xs, ys, yerr=[lo, hi], linestyle=styles[mode], marker="o", markersize=3, capsize=2,
                            label=f"{provider} {mode.replace('_', '-')}")
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("message size (bytes; 0 B plotted at 1)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if any_data:
        ax.legend(fontsize=7)
    return any_data


def pyplot_or_none(script):
    """matplotlib.pyplot (Agg), or None after saying how to install it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        # The distribution's package lands in the system interpreter; a
        # pyenv/venv python3 on PATH does not see it, so try that one once.
        system = "/usr/bin/python3"
        if (os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system)
                and not os.environ.get("NETBENCH_PLOT_REEXEC")):
            os.environ["NETBENCH_PLOT_REEXEC"] = "1"
            os.execv(system, [system, os.path.abspath(script)] + sys.argv[1:])
        name = os.path.basename(script)
        sys.stderr.write(f"{name}: matplotlib is not installed. Install it with\n"
                         "    apt-get install python3-matplotlib      (Debian/Ubuntu, for /usr/bin/python3)\n"
                         "or  python3 -m pip install matplotlib\n"
                         "and run this script with that interpreter.\n")
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--out", default=".", help="output directory (default .)")
    ap.add_argument("--prefix", default="netbench-", help="file name prefix (default netbench-)")
    args = ap.parse_args()

    plt = pyplot_or_none(__file__)
    if plt is None:
        return 2

    datasets = [load(p) for p in args.csv]
    os.makedirs(args.out, exist_ok=True)
    written = []

    def save(fig, name):
        path = os.path.join(args.out, args.prefix + name)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if plot_vs_size(ax, datasets, "lat", "one-way latency, median (us)", True):
        ax.set_title("Ping-pong latency (RTT/2)")
        save(fig, "latency.png")
    else:
        plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    a = plot_vs_size(axes[0], datasets, "bw", "GB/s (1e9 B/s)", False)
    b = plot_vs_size(axes[1], datasets, "bibw", "GB/s, both directions summed", False)
    axes[0].set_title("One-way bandwidth")
    axes[1].set_title("Bidirectional bandwidth")
    if a or b:
        save(fig, "bandwidth.png")
    else:
        plt.close(fig)

    # plugin/raw ratios with the targets.
    fig, ax = plt.subplots(figsize=(7, 4.5))
    any_ratio = False
    for provider, rows in datasets:
        for test, style in (("lat", "o"), ("bw", "s"), ("bibw", "^")):
            for col, line, tag in (("ratio_plugin_over_raw", "-", ""), ("ratio_plugin_b_over_raw", ":", " (plugin-b)")):
                pts = [r for r in series(rows, test) if r[col] == r[col]]
                if pts:
                    any_ratio = True
                    ax.plot([r["param"] if r["param"] > 0 else 1 for r in pts], [r[col] for r in pts], style + line,
                            markersize=3, label=f"{provider} {test}{tag}")
    if any_ratio:
        ax.axhline(1.10, color="red", linestyle=":", linewidth=1, label="latency target <= 1.10")
        ax.axhline(0.95, color="green", linestyle=":", linewidth=1, label="bandwidth target >= 0.95")
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("plugin / raw (median of reps)")
        ax.set_title("Plugin overhead: latency ratio (lower is better), bandwidth ratio (higher is better)")
        ax.title.set_fontsize(9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "ratio.png")
    else:
        plt.close(fig)

    # Summary bars: one panel per scalar test family.
    panels = [("rate", "message rate (Mmsg/s)"), ("setup", "connection setup (ms, total)"),
              ("mr_fresh", "regMr fresh buffer (us)"), ("mr_cached", "regMr sub-range (us)"),
              ("mem_send_comm", "RSS per idle send comm (KiB)"), ("mem_recv_comm", "RSS per idle recv comm (KiB)")]
    present = [(t, l) for t, l in panels if any(series(rows, t) for _, rows in datasets)]
    if present:
        ncol = min(3, len(present))
        nrow = (len(present) + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
        for ax in axes.flat[len(present):]:
            ax.set_visible(False)
        for ax, (test, label) in zip(axes.flat, present):
            labels, bars = [], {"raw": [], "plugin": [], "plugin_b": []}
            for provider, rows in datasets:
                for r in series(rows, test):
                    labels.append(f"{provider}\n{human(r['param'])}")
                    for mode in bars:
                        bars[mode].append(r[f"{mode}_median"])
            shown = [m for m in bars if any(v == v for v in bars[m])]
            width = 0.8 / max(1, len(shown))
            xs = range(len(labels))
            for i, mode in enumerate(shown):
                ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], [0 if v != v else v for v in bars[mode]],
                       width=width, label=mode.replace("_", "-"))
            ax.set_xticks(list(xs))
            ax.set_xticklabels(labels, fontsize=6)
            ax.set_title(label, fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize=6)
        save(fig, "summary.png")

    for p in written:
        print(p)
    if not written:
        sys.stderr.write("plot.py: nothing to plot in the given CSV files\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
