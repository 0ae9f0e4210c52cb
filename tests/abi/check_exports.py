#!/usr/bin/env python3
"""nm -D --defined-only on a plugin library must list exactly the configured
tables of the families it exports (ncclNetPlugin_vN, ncclRmaPlugin_vN and
ncclGinPlugin_vN for NCCL; Neuron's ncclNetPlugin_vN for the Neuron library):
no core symbol, no collNet table."""

import argparse
import re
import subprocess
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lib", required=True)
    p.add_argument("--versions", default="", help="comma-separated net versions the build exports")
    p.add_argument("--rma-versions", default="", help="comma-separated RMA versions the build exports")
    p.add_argument("--gin-versions", default="", help="comma-separated GIN versions the build exports")
    p.add_argument("--neuron-versions", default="", help="comma-separated Neuron versions the build exports")
    p.add_argument("--exports", required=True, help="generated exports/fabric_exports.cmake")
    args = p.parse_args()

    with open(args.exports) as f:
        text = f.read()
    want = set()
    for fam, versions in (("NET", args.versions), ("RMA", args.rma_versions), ("GIN", args.gin_versions),
                          ("NEURON", args.neuron_versions)):
        symbols = dict(re.findall(r"set\(FABRIC_GEN_%s_SYMBOL_(\d+) (\S+)\)" % fam, text))
        for v in filter(None, versions.split(",")):
            if v not in symbols:
                print(f"{fam.lower()} v{v} is configured but not in {args.exports}", file=sys.stderr)
                return 1
            want.add(symbols[v])

    out = subprocess.run(["nm", "-D", "--defined-only", args.lib], check=True, capture_output=True, text=True).stdout
    got = {line.split()[-1] for line in out.splitlines() if line.strip()}
    # Version-node symbols would appear as absolute (A) entries; an anonymous
    # version script has none, so nothing is filtered.
    if got != want:
        print(f"{args.lib}: exported symbols differ from the configuration", file=sys.stderr)
        for s in sorted(got - want):
            print(f"  unexpected: {s}", file=sys.stderr)
        for s in sorted(want - got):
            print(f"  missing:    {s}", file=sys.stderr)
        return 1
    names = sorted(want, key=lambda s: (s[:7], int(re.sub(r"\D", "", s))))
    print(f"{args.lib}: exports exactly {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
