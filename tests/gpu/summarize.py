#!/usr/bin/env python3
"""Reads the work dir of run.sh (configs.tsv, libs.tsv, logs/<config>/...) and writes
<out>/results.csv, <out>/summary.md, <out>/warnings.txt and <work>/verdict.md.
Exit status 0 if every configuration passed, else 1. Standard library only."""
import argparse
import collections
import csv
import glob
import os
import re
import sys

HEADER = "program,provider,net,version_lib,op,bytes,time_us,algbw_GBs,busbw_GBs,correct"
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
ROW_RE = re.compile(r"^(nccl_check|torch_check),")
PLAN_RE = re.compile(r"^# plan: tests=(\d+)")
# NCCL 2.28 log lines (src/plugin/net/net_v*.cc, src/plugin/net.cc, src/init.cc, src/transport/net.cc)
LOADED_RE = re.compile(r"NET/Plugin: Loaded net plugin (\S+) \(v(\d+)\)")
USING_RE = re.compile(r"Using network (\S+)")
VIA_RE = re.compile(r"via NET/([^/\s]+)")
NCCLVER_RE = re.compile(r"NCCL version (\S+)")
PLUGIN_LINE_RE = re.compile(r"NET/Plugin|[Ll]oaded net plugin|ncclNetPlugin_v|Using network|NET plugin|"
                            r"external network plugin|NET/Fabric|Fabric|libfabric|NCCL_NET")
WARN_RE = re.compile(r"NCCL WARN|libfabric:\d+:.*<warn>")
NETWARN_RE = re.compile(r"NET/|[Pp]lugin|[Ff]abric|FI_|provider", re.IGNORECASE)
PREFIX_RE = re.compile(r"^\S+:\d+:\d+ ")  # host:pid:tid
INFO_RE = re.compile(r"^\[\d+\] NCCL INFO ")  # [cudaDev] NCCL INFO
RANK_PREFIX_RE = re.compile(r"^\[(?:rank|default)\d*\]:\s*")  # torchrun --tee style prefix, if any


def read(path, limit=None):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read() if limit is None else f.read(limit)
    except OSError:
        return ""


def human_bytes(n):
    n = int(n)
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return "%d %s" % (n // k, unit)
    return "%d B" % n


def fmt_bw(x):
    x = float(x)
    return "%.3f" % x if x < 1 else "%.2f" % x


def fmt_time(us):
    us = float(us)
    if us <= 0:
        return "-"
    if us >= 10000:
        return "%.2f ms" % (us / 1000)
    return "%.1f us" % us


class Config:
    def __init__(self, rec, work):
        self.__dict__.update(rec)
        self.dir = os.path.join(work, "logs", self.name)
        self.rows = []
        self.plan = None
        self.info_lines = []
        self.loaded = []       # (name, version) per log line
        self.using = collections.Counter()
        self.via = collections.Counter()
        self.nccl_versions = set()
        self.plugin_lines = []
        self.warns = []        # (is_net, file, line)
        self.reasons = []
        self.verdict = "FAIL"

    @property
    def skipped(self):
        return self.note.startswith("SKIPPED")

    def parse(self):
        out = read(os.path.join(self.dir, "stdout.txt"))
        for line in out.splitlines():
            line = RANK_PREFIX_RE.sub("", line)
            if ROW_RE.match(line):
                f = line.strip().split(",")
                if len(f) == 10:
                    self.rows.append(f)
            elif line.startswith("#"):
                self.info_lines.append(line)
                m = PLAN_RE.match(line)
                if m:
                    self.plan = int(m.group(1))
        files = sorted(glob.glob(os.path.join(self.dir, "nccl.*.log")))
        files += [os.path.join(self.dir, "stdout.txt"), os.path.join(self.dir, "stderr.txt")]
        seen_plugin = set()
        for path in files:
            text = read(path, 64 << 20)
            base = os.path.basename(path)
            for line in text.splitlines():
                if WARN_RE.search(line):
                    self.warns.append((bool(NETWARN_RE.search(line)), base, line.strip()))
                if "NCCL INFO" not in line and "NCCL WARN" not in line and not line.startswith("NCCL version"):
                    if not (base == "stderr.txt" and "libfabric" in line):
                        continue
                m = LOADED_RE.search(line)
                if m:
                    self.loaded.append((m.group(1), int(m.group(2))))
                m = USING_RE.search(line)
                if m:
                    self.using[m.group(1)] += 1
                m = VIA_RE.search(line)
                if m:
                    self.via[m.group(1)] += 1
                    continue  # one line per channel: counted, not listed
                m = NCCLVER_RE.search(line)
                if m:
                    self.nccl_versions.add(m.group(1))
                if PLUGIN_LINE_RE.search(line):
                    short = INFO_RE.sub("", PREFIX_RE.sub("", line.strip()))
                    if short not in seen_plugin and len(self.plugin_lines) < 40:
                        seen_plugin.add(short)
                        self.plugin_lines.append(short)

    def judge(self, ignore_other_warn):
        r = self.reasons
        if self.skipped:
            r.append(self.note)
            self.verdict = "SKIPPED"
            return
        rc = self.rc
        if rc in ("124", "137"):
            r.append("timed out (rc %s)" % rc)
        elif rc != "0":
            r.append("exit status %s" % rc)
        if self.plan is None:
            r.append("no plan line (the program did not start properly)")
        elif len(self.rows) != self.plan:
            r.append("%d of %d result lines" % (len(self.rows), self.plan))
        bad = [x for x in self.rows if x[9] != "PASS"]
        if bad:
            counts = collections.Counter(x[9] for x in bad)
            r.append("%d lines not PASS (%s; first: %s %s B %s)" % (
                len(bad), ", ".join("%s %d" % kv for kv in sorted(counts.items())), bad[0][4], bad[0][5], bad[0][9]))
        want = self.net
        if not self.using:
            r.append("no 'Using network' line")
        elif set(self.using) != {want}:
            r.append("Using network %s (want %s)" % ("/".join(sorted(self.using)), want))
        if self.rows and not self.via.get(want):
            r.append("no 'via NET/%s' channel line" % want)
        if self.net == "Fabric":
            vers = sorted({v for (n, v) in self.loaded if n.lower() == "fabric"})
            others = sorted({n for (n, v) in self.loaded if n.lower() != "fabric"})
            if not vers:
                r.append("no 'NET/Plugin: Loaded net plugin Fabric (vN)' line")
            elif self.expect_version not in ("-", "") and vers != [int(self.expect_version)]:
                r.append("loaded table v%s (want v%s)" % ("/v".join(map(str, vers)), self.expect_version))
            if others:
                r.append("other plugin loaded: %s" % ", ".join(others))
        net_w = sum(1 for w in self.warns if w[0])
        other_w = len(self.warns) - net_w
        if net_w:
            r.append("%d network/plugin WARN line(s)" % net_w)
        if other_w and not ignore_other_warn:
            r.append("%d other WARN line(s)" % other_w)
        self.verdict = "PASS" if not r else "FAIL"

    def loaded_str(self):
        vers = sorted({"v%d" % v for (n, v) in self.loaded})
        return "/".join(vers) if vers else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ignore-other-warn", default="0")
    a = ap.parse_args()
    ignore_other = a.ignore_other_warn not in ("0", "", "no", "false")

    with open(os.path.join(a.work, "configs.tsv")) as f:
        configs = [Config(rec, a.work) for rec in csv.DictReader(f, delimiter="\t")]
    libs = {}
    try:
        with open(os.path.join(a.work, "libs.tsv")) as f:
            for rec in csv.DictReader(f, delimiter="\t"):
                libs[rec["lib"]] = rec
    except OSError:
        pass
    for c in configs:
        c.parse()
        c.judge(ignore_other)

    # results.csv
    with open(os.path.join(a.out, "results.csv"), "w") as f:
        f.write(HEADER + "\n")
        for c in configs:
            for x in c.rows:
                f.write(",".join(x) + "\n")

    # warnings.txt
    with open(os.path.join(a.out, "warnings.txt"), "w") as f:
        total = sum(len(c.warns) for c in configs)
        f.write("# WARN lines from the NCCL logs, stdout and stderr of every run: %d in all.\n" % total)
        f.write("# [net] = mentions NET/, plugin, fabric, FI_ or provider; [other] = anything else.\n")
        for c in configs:
            if not c.warns:
                continue
            n_net = sum(1 for w in c.warns if w[0])
            f.write("\n## %s: %d WARN line(s), %d network/plugin\n" % (c.name, len(c.warns), n_net))
            for is_net, base, line in c.warns:
                f.write("[%s] %s: %s\n" % ("net" if is_net else "other", base, line))

    passed = sum(1 for c in configs if c.verdict == "PASS")
    overall = "PASS" if configs and passed == len(configs) else "FAIL"

    # ---- verdict block (also printed last by run.sh)
    V = []
    V.append("## Verdict: %s (%d of %d configurations passed)\n" % (overall, passed, len(configs)))
    V.append("| config | program | net | provider | lib | loaded table | Using network | rows PASS/planned | WARN (net/other) | rc | s | verdict |")
    V.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in configs:
        npass = sum(1 for x in c.rows if x[9] == "PASS")
        plan = c.plan if c.plan is not None else "?"
        n_net = sum(1 for w in c.warns if w[0])
        using = "/".join("%s" % k for k in sorted(c.using)) or "-"
        V.append("| %s | %s | %s | %s | %s | %s | %s | %s/%s | %d/%d | %s | %s | **%s** |" % (
            c.name, c.program, c.net, c.provider, c.lib, c.loaded_str(), using, npass, plan, n_net,
            len(c.warns) - n_net, c.rc, c.seconds, c.verdict))
    fails = [c for c in configs if c.verdict != "PASS"]
    if fails:
        V.append("")
        V.append("Reasons:")
        for c in fails:
            V.append("- **%s** (%s): %s" % (c.name, c.verdict, "; ".join(c.reasons)))
    verdict = "\n".join(V) + "\n"
    with open(os.path.join(a.work, "verdict.md"), "w") as f:
        f.write(verdict)

    # ---- summary.md
    S = []
    env = read(os.path.join(a.work, "env.txt"))
    host = re.search(r"^host: (.*)$", env, re.M)
    date = re.search(r"^date: (.*)$", env, re.M)
    S.append("# Fabric NCCL net plugin: GPU check")
    S.append("")
    S.append("%s on %s. Every run: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO; "
             "Fabric runs: NCCL_NET_PLUGIN=<lib> NCCL_NET=Fabric with FI_PROVIDER=tcp FI_TCP_IFACE=lo or FI_PROVIDER=shm; "
             "Socket runs: NCCL_NET_PLUGIN=none NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo." %
             (date.group(1) if date else "?", host.group(1) if host else "?"))
    S.append("")
    gpus = [l for l in env.splitlines() if l.startswith("GPU ")]
    if gpus:
        S.append("GPUs: " + "; ".join(gpus))
        S.append("")
    seen = set()
    for c in configs:
        for l in c.info_lines:
            key = re.sub(r"(provider|net|lib)=\S+", "", l)
            if ("built against" in l or "torch_check: torch" in l) and key not in seen:
                seen.add(key)
                S.append("- `%s`" % l.lstrip("# "))
    vers = sorted({v for c in configs for v in c.nccl_versions})
    if vers:
        S.append("- NCCL versions in the logs: %s" % ", ".join(vers))
    S.append("")
    S.append(verdict)

    # version / provider matrix
    S.append("## Loaded table per library and provider\n")
    provs = []
    for c in configs:
        if c.net == "Fabric" and c.provider not in provs:
            provs.append(c.provider)
    S.append("| library | exports | " + " | ".join(provs) + " |")
    S.append("|---|---|" + "---|" * len(provs))
    keys = []
    for c in configs:
        if c.net == "Fabric":
            k = (c.lib, c.program, c.phase)
            if k not in keys:
                keys.append(k)
    for lib, prog, phase in keys:
        cells = []
        for p in provs:
            cs = [c for c in configs if (c.lib, c.program, c.phase, c.provider) == (lib, prog, phase, p)]
            if not cs:
                cells.append("")
                continue
            c = cs[0]
            cells.append("%s %s (want v%s)" % (c.verdict, c.loaded_str(), c.expect_version))
        lrec = libs.get(lib, {})
        exports = lrec.get("exports", "?").replace("ncclNetPlugin_", "").replace("ncclCollNetPlugin_", "coll").replace("ncclGinPlugin_", "gin")
        S.append("| %s (%s, %s) | %s | %s |" % (os.path.basename(lrec.get("file", lib)), prog, phase, exports.strip(), " | ".join(cells)))
    base = [c for c in configs if c.net == "Socket"]
    if base:
        S.append("| NCCL Socket baseline | - | %s |" % ", ".join("%s: %s" % (c.program, c.verdict) for c in base))
    S.append("")

    # performance tables
    def pick(program, net, provider):
        for c in configs:
            if c.phase in ("full", "baseline") and c.rows and c.rows[0][0] == program and c.net == net and \
                    (net == "Socket" or c.provider == provider):
                return c
        return None

    for program in ("nccl_check", "torch_check"):
        cols = [("Fabric-tcp", pick(program, "Fabric", "tcp")), ("Fabric-shm", pick(program, "Fabric", "shm")),
                ("Socket", pick(program, "Socket", None))]
        cols = [(n, c) for n, c in cols if c is not None]
        if not cols:
            continue
        S.append("## Performance: %s (time per op, bus bandwidth GB/s)\n" % program)
        for op in OPS:
            table = {}
            sizes = []
            for n, c in cols:
                for x in c.rows:
                    if x[4] != op:
                        continue
                    b = int(x[5])
                    if b not in sizes:
                        sizes.append(b)
                    if x[9] in ("PASS",):
                        table[(n, b)] = "%s | %s" % (fmt_time(x[6]), fmt_bw(x[8]))
                    else:
                        table[(n, b)] = "%s | %s" % (x[9], "-")
            if not sizes:
                continue
            S.append("### %s\n" % op)
            S.append("| size | " + " | ".join("%s time | %s busbw" % (n, n) for n, _ in cols) + " |")
            S.append("|---:|" + "---:|---:|" * len(cols))
            for b in sorted(sizes):
                S.append("| %s | %s |" % (human_bytes(b), " | ".join(table.get((n, b), "- | -") for n, _ in cols)))
            S.append("")

    # plugin lines
    S.append("## NCCL plugin/network lines per configuration (abridged; `via NET/x` lines counted)\n")
    for c in configs:
        if c.skipped:
            continue
        via = ", ".join("NET/%s x%d" % kv for kv in sorted(c.via.items())) or "none"
        S.append("<details><summary>%s: %s, channels via %s</summary>\n" % (c.name, c.verdict, via))
        S.append("```")
        S.extend(c.plugin_lines[:25 if c.phase == "full" else 12] or ["(no matching lines)"])
        S.append("```")
        if c.verdict != "PASS":
            err = read(os.path.join(c.dir, "stderr.txt")).splitlines()
            if err:
                S.append("stderr (last 15 lines):")
                S.append("```")
                S.extend(l[:300] for l in err[-15:])
                S.append("```")
        S.append("</details>\n")

    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(S) + "\n")
    return 0 if overall == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
