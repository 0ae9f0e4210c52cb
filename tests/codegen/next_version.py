#!/usr/bin/env python3
"""Proves that a new ABI version needs specs only, no hand-written C.

Writes the delta of docs/adding-an-abi-version.md §4 (a hypothetical net v90,
numbered far from NCCL's own so a real version never collides with it: a copy
of v12 whose iflush takes size_t sizes, plus one appended function mapped onto
an existing core call) into a copy of abi/, renders it, configures and builds
the project against the rendered directory, and runs the ABI loader, layout
and export tests on the result. With --versions all (no version list given to
CMake) the new table must be exported by default: the spec alone decides.
With --delta none it checks a plain subset build (e.g. --versions 8).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

from spec_edit import TOP, append, edit

V90_SLOT = '''
[[table.slot]]
name = "getDeviceCount"
since = 90
optional = true
doc = "Hypothetical v90 addition, answered by the core's device count."
core = "fab_devices"
args = [{ name = "count", type = "int*", conv = "copy", to = "ndev" }]
'''

IFLUSH_SIZES = ('  { name = "sizes", type = "int*", conv = "copy", to = "sizes" },\n'
                '  { name = "mhandles", type = "void**", conv = "copy", to = "mhandles" },\n')
IFLUSH_SIZES_V90 = ('  { name = "sizes", type = { "-12" = "int*", "90-" = "size_t*" }, '
                    'conv = { "-12" = "copy", "90-" = "narrow_array" }, count = "n", max = "FAB_MAX_RECVS", '
                    'to = "sizes" },\n'
                    '  { name = "mhandles", type = "void**", conv = "copy", to = "mhandles" },\n')


def apply_v90(spec):
    """The whole delta for net v90, exactly as the guide shows it."""
    net, common = os.path.join(spec, "net.toml"), os.path.join(spec, "common.toml")
    edit(net, "versions = [6, 7, 8, 9, 10, 11, 12]", "versions = [6, 7, 8, 9, 10, 11, 12, 90]")
    edit(net, '12 = "2.30 –"\n', '12 = "2.30 –"\n90 = "hypothetical (test only)"\n')
    edit(net, IFLUSH_SIZES, IFLUSH_SIZES_V90)
    edit(net, '"12" = { size = 128,', '"12-90" = { size = 128,')
    with open(net) as f:
        v12 = re.search(r'^"11-12" = \{ size = 176, slots = \[(.*)\] \}$', f.read(), re.M)
    edit(net, v12.group(0), v12.group(0) + f'\n"90" = {{ size = 184, slots = [{v12.group(1)}, "getDeviceCount"] }}')
    append(net, V90_SLOT)
    edit(common, "[constant.NCCL_NET_MAX_DEVS_PER_NIC_V12]\nvalue = 8\n",
         "[constant.NCCL_NET_MAX_DEVS_PER_NIC_V12]\nvalue = 8\n\n[constant.NCCL_NET_MAX_DEVS_PER_NIC_V90]\nvalue = 8\n")


def exported_symbols(library):
    """The dynamic symbols library defines."""
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work-dir", required=True, help="scratch directory (emptied first)")
    p.add_argument("--source-dir", default=TOP, help="the CMake project to configure")
    p.add_argument("--delta", choices=["v90", "none"], default="v90")
    p.add_argument("--versions", default="all", help="FABRIC_NET_VERSIONS; all: leave CMake's default")
    p.add_argument("--generator", default="")
    p.add_argument("--cmake", default="cmake")
    p.add_argument("--ctest", default="ctest")
    args = p.parse_args()

    work = os.path.abspath(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    spec, gen, build = (os.path.join(work, d) for d in ("abi", "generated", "build"))
    shutil.copytree(os.path.join(TOP, "abi"), spec)
    if args.delta == "v90":
        apply_v90(spec)

    run([sys.executable, os.path.join(TOP, "codegen", "generate.py"), "--spec-dir", spec, "--out-dir", gen])
    if args.delta == "v90":
        with open(os.path.join(gen, "shims", "fab_shim_net_v90.c")) as f:
            shim = f.read()
        assert ".getDeviceCount = net_v90_getDeviceCount" in shim, "the appended slot is exported"
        assert "sizes_core[i] = (int)sizes[i];" in shim, "iflush narrows size_t sizes with a check"

    configure = [args.cmake, "-S", args.source_dir, "-B", build, f"-DPython3_EXECUTABLE={sys.executable}",
                 f"-DFABRIC_ABI_DIR={spec}", f"-DFABRIC_GENERATED_DIR={gen}"]
    if args.versions != "all":
        configure.append(f"-DFABRIC_NET_VERSIONS={args.versions}")
    if args.generator:
        configure += ["-G", args.generator]
    run(configure)
    run([args.cmake, "--build", build, "--target", "nccl-net-fabric", "abi_loader", "abi_layout"])
    run([args.ctest, "--test-dir", build, "--output-on-failure", "-R", "^abi_(loader|layout|exports)$"])
    if args.delta == "v90" and args.versions == "all":
        symbols = exported_symbols(os.path.join(build, "libnccl-net-fabric.so"))
        assert "ncclNetPlugin_v90" in symbols, f"a default build exports the new version: {sorted(symbols)}"
        assert "ncclNetPlugin_v12" in symbols, "and every version it exported before"
    print(f"net {args.delta} ({args.versions}): rendered, built and loaded from specs alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
