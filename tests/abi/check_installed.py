#!/usr/bin/env python3
"""abi_installed.c compiles only if every value in the generated lists
(fab_abi_installed.h) equals NCCL's installed headers. Compiles it once as
generated (must succeed), then once per list entry with that entry's value
off by one (must fail, naming the entry): so every entry is compared, and a
list the source does not expand is caught."""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

# "  X(name, value) \", "  X(type, size) \", "  Y(type, field, offset) \"
ENTRY = re.compile(r"^  ([XY])\((\w+)(?:, (\w+))?, (0x[0-9a-fA-F]+|-?\d+)\) \\$")
HEADER = "fab_abi_installed.h"


def compile_with(args, header_text, tmp):
    with open(os.path.join(tmp, HEADER), "w") as f:
        f.write(header_text)
    cmd = [args.cc, *args.cflags.split(), "-fsyntax-only", "-I", tmp, "-I", args.nccl_include, args.source]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stderr


def what(kind, name, field, in_values):
    if field:
        return f"{name}.{field} differs from the spec"
    if kind == "X" and not in_values:
        return f"{name} size differs from the spec"
    return f"{name} differs from the spec"


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cc", required=True)
    p.add_argument("--cflags", default="")
    p.add_argument("--nccl-include", required=True)
    p.add_argument("--generated", required=True, help="the generated abi/ directory")
    p.add_argument("--source", required=True, help="abi_installed.c")
    args = p.parse_args()

    with open(os.path.join(args.generated, HEADER)) as f:
        lines = f.read().split("\n")
    tmp = tempfile.mkdtemp(prefix="abi_installed.")
    try:
        rc, err = compile_with(args, "\n".join(lines), tmp)
        if rc != 0:
            print(f"abi_installed.c does not compile against {args.nccl_include}:\n{err}", file=sys.stderr)
            return 1
        failures, checked, in_values = [], 0, False
        for i, line in enumerate(lines):
            if line.startswith("#define FAB_ABI_"):
                in_values = line.startswith("#define FAB_ABI_VALUES_")
            m = ENTRY.match(line)
            if not m:
                continue
            kind, name, field, value = m.groups()
            changed = list(lines)
            changed[i] = line.replace(f", {value})", f", {int(value, 0) + 1})")
            rc, err = compile_with(args, "\n".join(changed), tmp)
            expect = what(kind, name, field, in_values)
            checked += 1
            if rc == 0 or expect not in err:
                entry = line.rstrip("\\").strip()
                why = "still compiles" if rc == 0 else f"fails without '{expect}':\n{err}"
                failures.append(f"  {entry} off by one: {why}")
        if checked == 0:
            failures.append(f"  no list entries found in {HEADER}")
        if failures:
            print("values the installed-header check does not compare:", *failures, sep="\n", file=sys.stderr)
            return 1
        print(f"abi_installed.c: all {checked} values and layout entries compared with {args.nccl_include}")
        return 0
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
