#!/usr/bin/env python3
"""The engine's floors, checked: every call between files of core/ and
transports/ goes to the same floor or a lower one, no files call each
other in a circle, and no core file includes a transport's own header
(docs/architecture.md, "Floors").

A call is a use of a function defined in another file: named with "(" after
it, or passed as a pointer. Functions reached only through a struct of
function pointers (transport ops, endpoint hooks) are not calls: that is how
a lower floor calls back without depending on a higher one.

Usage: check_layers.py [repo root]. Exit 1 with the offending calls listed.
"""
import pathlib
import re
import sys

# folder -> floor. A file's floor is the folder it lives in (core/<floor>/, or transports/ and its
# subfolders); CMake builds each folder as an object library that sees only its own and lower floors'
# headers, so the includes are enforced by the compiler and the calls here. A header's inline functions
# belong to its folder too.
FLOORS = {"base": 0, "fabric": 1, "transports": 2, "conn": 3, "rails": 4, "net": 5, "onesided": 6, "api": 7}


def floor_of(root, p):
    rel = p.relative_to(root).parts
    name = "transports" if rel[0] == "transports" else rel[1] if len(rel) > 2 else None
    return (FLOORS[name], name) if name in FLOORS else None


# a definition starts at column 0: [static] [inline] [attributes] type name(
DEF = re.compile(r"^((?:static\s+|inline\s+|__attribute__\(\([^)]*\)\)\s+)*)"
                 r"(?:const\s+)?(?:struct\s+)?[A-Za-z_]\w*[\s\*]+([a-z_]\w*)\s*\(", re.M)
NAME = re.compile(r"\b([a-z_]\w*)\b")
# Strings, character constants and comments in one left-to-right pass: a "//" inside a string ("://") is
# not a comment, and a quote inside a comment opens no string.
TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*', re.S)


def sources(root):
    for d in ("core", "transports"):
        for p in sorted((root / d).rglob("*.[ch]")):
            yield p


def _blank(m):
    tok = m.group(0)
    if tok[0] in "\"'":
        return tok[0] * 2
    return " " + "\n" * tok.count("\n")  # a comment; its lines are kept


def strip(text):
    return TOKEN.sub(_blank, text)


def node(p):
    """A .c file is its stem; a header's inline functions are "<stem>.h"."""
    return p.stem if p.suffix == ".c" else p.stem + ".h"


def is_definition(text, open_paren):
    """True when the parameter list at open_paren is followed by a body."""
    depth = 0
    for i in range(open_paren, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                rest = re.match(r"\s*(?:__attribute__\(\([^)]*\)\)\s*)*(.)", text[i + 1:], re.S)
                return bool(rest) and rest.group(1) == "{"
    return False


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2])
    defined = {}  # function -> stem
    texts = {}
    for p in sources(root):
        text = strip(p.read_text())
        texts[p] = text
        for m in DEF.finditer(text):
            if not is_definition(text, m.end() - 1):
                continue  # a declaration
            local = "static" in m.group(1) and p.suffix == ".c"  # file-local: names may repeat
            if not local:
                defined.setdefault(m.group(2), node(p))
    unknown = sorted(str(p.relative_to(root)) for p in texts if floor_of(root, p) is None)
    floor = {node(p): floor_of(root, p) for p in texts}
    if unknown:
        print("files outside the floor folders (core/<floor>/, transports/):", unknown)
        return 1
    edges = {}
    for p, text in texts.items():
        if p.suffix != ".c":
            continue  # headers declare; their inline functions are nodes of their own
        for m in NAME.finditer(text):
            callee = defined.get(m.group(1))
            if callee and callee != node(p):
                edges.setdefault(node(p), {}).setdefault(callee, m.group(1))
    bad = []
    for a, outs in edges.items():
        for b, fn in outs.items():
            if floor[b][0] > floor[a][0]:
                bad.append(f"{a} ({floor[a][1]}) calls {fn} of {b} ({floor[b][1]}): upwards")
    # circles among files (headers' inline functions count with their stem)
    state, stack, circles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in edges.get(n, {}):
            if state.get(m) == 1:
                circles.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    bad += ["call circle: " + " -> ".join(c) for c in circles]
    # the core reaches a transport only through fab_transport.h's ops, never its private headers
    for p in texts:
        if p.relative_to(root).parts[0] == "core":
            for m in re.finditer(r'^\s*#\s*include\s+"((?:rdma|sendrecv)/[^"]+)"', p.read_text(), re.M):
                bad.append(f"{p.name} includes {m.group(1)}: a transport's own header (go through fab_transport.h)")
    if bad:
        print("\n".join(bad))
        return 1
    print(f"{len(texts)} files, {sum(len(v) for v in edges.values())} file-to-file call edges: floors respected, "
          "no call circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
