#!/usr/bin/env python3
"""nm -D --defined-only on the plugin must list exactly the configured
ncclNetPlugin_vN tables: no core symbol, no GIN/RMA/collNet table."""

import argparse
import re
import subprocess
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lib", required=True)
    p.add_argument("--versions", required=True, help="comma-separated net versions the build exports")
    p.add_argument("--exports", required=True, help="generated exports/fabric_exports.cmake")
    args = p.parse_args()

    with open(args.exports) as f:
        symbols = dict(re.findall(r"set\(FABRIC_GEN_NET_SYMBOL_(\d+) (\S+)\)", f.read()))
    want = set()
    for v in args.versions.split(","):
        if v not in symbols:
            print(f"net v{v} is configured but not in {args.exports}", file=sys.stderr)
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
    names = sorted(want, key=lambda s: int(re.sub(r"\D", "", s)))
    print(f"{args.lib}: exports exactly {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
