#!/usr/bin/env python3
"""Renders fabric's ABI layer from the specs.

    python3 codegen/generate.py            # refresh generated/ and docs/
    python3 codegen/generate.py --check    # fail if anything is stale
    python3 codegen/generate.py --check-upstream <nccl>/src/include/plugin
                                           # compare the specs with NCCL's headers
    python3 codegen/generate.py --import <nccl>/src/include/plugin --family rma --version 17
                                           # draft the spec delta for a new version

Inputs: abi/*.toml (the ABI specs), core/params.toml (environment parameters),
templates/*.j2. Outputs: generated/ and docs/{abi-matrix,params}.md. Every
problem in a spec stops the run with "<spec file>: <key path>: <what is wrong>".
"""

import argparse
import difflib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fabgen import params as params_mod  # noqa: E402
from fabgen import render  # noqa: E402
from fabgen import upstream  # noqa: E402
from fabgen.model import Spec  # noqa: E402
from fabgen.spec import SpecError  # noqa: E402

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec-dir", default=os.path.join(TOP, "abi"), help="ABI specs (default: abi/)")
    p.add_argument("--params", default=os.path.join(TOP, "core", "params.toml"),
                   help="parameter table (default: core/params.toml)")
    p.add_argument("--templates", default=os.path.join(TOP, "templates"), help="templates (default: templates/)")
    p.add_argument("--out-dir", help="where generated code goes (default: generated/)")
    p.add_argument("--docs-dir", help="where the rendered docs go (default: docs/, or <out-dir>/docs "
                                      "when --out-dir is given)")
    p.add_argument("--check", action="store_true",
                   help="render into a temporary directory and fail if the outputs differ")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.add_argument("--check-upstream", metavar="DIR",
                   help="compare every described table and struct with the plugin headers under DIR "
                        "(a NCCL checkout's src/include/plugin); exit 1 on any difference")
    p.add_argument("--ignore", action="append", metavar="FAMILY[:VERSIONS]",
                   help="with --check-upstream: upstream versions (17, 15-17, 17-) of a family, or the whole "
                        "family, that the specs knowingly lack; repeatable")
    p.add_argument("--import", dest="import_dir", metavar="DIR",
                   help="print the spec delta for --family/--version from the headers under DIR")
    p.add_argument("--family", help="with --import: the family (net, rma, gin, neuron)")
    p.add_argument("--version", type=int, help="with --import: the version the specs lack")
    args = p.parse_args(argv)
    if args.out_dir is None:
        args.out_dir = os.path.join(TOP, "generated")
        args.docs_dir = args.docs_dir or os.path.join(TOP, "docs")
    else:
        args.docs_dir = args.docs_dir or os.path.join(args.out_dir, "docs")
    return args


def build(args):
    spec = Spec(args.spec_dir)
    params = params_mod.load(args.params, _label(args.params)) if args.params else None
    outs = render.outputs(spec, params)
    return render.render(outs, args.templates)


def _label(path):
    rel = os.path.relpath(os.path.abspath(path), TOP)
    return path if rel.startswith("..") else rel


def check(rendered, roots):
    tmp = render.render_to_temp(rendered)
    try:
        fresh = {"out": os.path.join(tmp, "generated"), "docs": os.path.join(tmp, "docs")}
        problems = render.check(rendered, roots)
        for line in problems:
            print(f"stale: {line}", file=sys.stderr)
        shown = 0
        for (root, path), text in sorted(rendered.items()):
            old = render._read(os.path.join(roots[root], path))
            if old is not None and old != text and shown < 3:
                diff = difflib.unified_diff(old.splitlines(), text.splitlines(), os.path.join(roots[root], path),
                                            os.path.join(fresh[root], path), lineterm="", n=1)
                print("\n".join(list(diff)[:40]), file=sys.stderr)
                shown += 1
        return problems
    finally:
        render.remove_temp(tmp)


def against_upstream(args):
    """--check-upstream and --import."""
    try:
        spec = Spec(args.spec_dir)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    root = args.check_upstream or args.import_dir
    if not os.path.isdir(root):
        print(f"error: {root} is not a directory (give a NCCL checkout's src/include/plugin)", file=sys.stderr)
        return 1
    headers = upstream.Headers(root)
    if args.import_dir:
        if not args.family or args.version is None:
            print("error: --import needs --family and --version", file=sys.stderr)
            return 1
        try:
            print("\n".join(upstream.draft(spec, headers, args.family, args.version)))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        ignores = upstream.parse_ignores(spec, args.ignore)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    diffs, notes = upstream.check(spec, headers, args.spec_dir, ignores)
    for n in notes:
        print(f"note: {n}")
    for d in diffs:
        print(f"difference: {d}", file=sys.stderr)
    checked = len(headers.structs)
    print(f"{len(diffs)} difference(s) between {_label(args.spec_dir)} and {root} ({checked} upstream structs read, "
          f"{len(notes)} notes)")
    return 1 if diffs else 0


def main(argv=None):
    args = parse_args(argv)
    if args.check_upstream or args.import_dir:
        return against_upstream(args)
    roots = {"out": args.out_dir, "docs": args.docs_dir}
    try:
        rendered = build(args)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.check:
        problems = check(rendered, roots)
        if problems:
            print(f"\n{len(problems)} generated file(s) are stale. Refresh with: python3 codegen/generate.py"
                  + ("" if args.out_dir == os.path.join(TOP, "generated") else
                     f" --spec-dir {args.spec_dir} --out-dir {args.out_dir}"), file=sys.stderr)
            return 1
        if not args.quiet:
            print(f"generated code is fresh ({len(rendered)} files)")
        return 0
    changed = render.write(rendered, roots)
    if not args.quiet:
        for path in changed:
            print(f"wrote {os.path.relpath(path)}")
        print(f"{len(rendered)} files, {len(changed)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
