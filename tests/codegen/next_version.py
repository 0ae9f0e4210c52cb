#!/usr/bin/env python3
"""Proves that a new ABI version needs specs only, no hand-written C.

Writes the delta of docs/adding-an-abi-version.md (a hypothetical net v13: a
copy of v12 whose iflush takes size_t sizes, plus one appended function mapped
onto an existing core call) into a copy of abi/, renders it, configures and
builds the project against the rendered directory exporting only the chosen
versions, and runs the ABI loader, layout and export tests on the result.
With --delta none it checks a plain subset build (e.g. --versions 8).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

from spec_edit import TOP, append, edit

V13_SLOT = '''
[[table.slot]]
name = "getDeviceCount"
since = 13
optional = true
doc = "Hypothetical v13 addition, answered by the core's device count."
core = "fab_devices"
args = [{ name = "count", type = "int*", conv = "copy", to = "ndev" }]
'''

IFLUSH_SIZES = ('  { name = "sizes", type = "int*", conv = "copy", to = "sizes" },\n'
                '  { name = "mhandles", type = "void**", conv = "copy", to = "mhandles" },\n')
IFLUSH_SIZES_V13 = ('  { name = "sizes", type = { "-12" = "int*", "13-" = "size_t*" }, '
                    'conv = { "-12" = "copy", "13-" = "narrow_array" }, count = "n", max = "FAB_MAX_RECVS", '
                    'to = "sizes" },\n'
                    '  { name = "mhandles", type = "void**", conv = "copy", to = "mhandles" },\n')


def apply_v13(spec):
    """The whole delta for net v13, exactly as the guide shows it."""
    net, common = os.path.join(spec, "net.toml"), os.path.join(spec, "common.toml")
    edit(net, "versions = [6, 7, 8, 9, 10, 11, 12]", "versions = [6, 7, 8, 9, 10, 11, 12, 13]")
    edit(net, '12 = "2.30 –"\n', '12 = "2.30 –"\n13 = "hypothetical (test only)"\n')
    edit(net, IFLUSH_SIZES, IFLUSH_SIZES_V13)
    edit(net, '"12" = { size = 128,', '"12-13" = { size = 128,')
    with open(net) as f:
        v12 = re.search(r'^"11-12" = \{ size = 176, slots = \[(.*)\] \}$', f.read(), re.M)
    edit(net, v12.group(0), v12.group(0) + f'\n"13" = {{ size = 184, slots = [{v12.group(1)}, "getDeviceCount"] }}')
    append(net, V13_SLOT)
    edit(common, "[constant.NCCL_NET_MAX_DEVS_PER_NIC_V12]\nvalue = 8\n",
         "[constant.NCCL_NET_MAX_DEVS_PER_NIC_V12]\nvalue = 8\n\n[constant.NCCL_NET_MAX_DEVS_PER_NIC_V13]\nvalue = 8\n")


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--work-dir", required=True, help="scratch directory (emptied first)")
    p.add_argument("--source-dir", default=TOP, help="the CMake project to configure")
    p.add_argument("--delta", choices=["v13", "none"], default="v13")
    p.add_argument("--versions", default="13")
    p.add_argument("--generator", default="")
    p.add_argument("--cmake", default="cmake")
    p.add_argument("--ctest", default="ctest")
    args = p.parse_args()

    work = os.path.abspath(args.work_dir)
    shutil.rmtree(work, ignore_errors=True)
    spec, gen, build = (os.path.join(work, d) for d in ("abi", "generated", "build"))
    shutil.copytree(os.path.join(TOP, "abi"), spec)
    if args.delta == "v13":
        apply_v13(spec)

    run([sys.executable, os.path.join(TOP, "codegen", "generate.py"), "--spec-dir", spec, "--out-dir", gen])
    if args.delta == "v13":
        with open(os.path.join(gen, "shims", "fab_shim_net_v13.c")) as f:
            shim = f.read()
        assert ".getDeviceCount = net_v13_getDeviceCount" in shim, "the appended slot is exported"
        assert "sizes_core[i] = (int)sizes[i];" in shim, "iflush narrows size_t sizes with a check"

    configure = [args.cmake, "-S", args.source_dir, "-B", build, f"-DPython3_EXECUTABLE={sys.executable}",
                 f"-DFABRIC_ABI_DIR={spec}", f"-DFABRIC_GENERATED_DIR={gen}", f"-DFABRIC_NET_VERSIONS={args.versions}"]
    if args.generator:
        configure += ["-G", args.generator]
    run(configure)
    run([args.cmake, "--build", build, "--target", "nccl-net-fabric", "abi_loader", "abi_layout"])
    run([args.ctest, "--test-dir", build, "--output-on-failure", "-R", "^abi_(loader|layout|exports)$"])
    print(f"net v{args.versions}: rendered, built and loaded from specs alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
