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

# file stem -> floor; a header's inline functions belong to the floor of the
# file of the same stem (fab_engine.h: the provider layer's shared types).
FLOORS = {
    "helpers": (0, ["fab_util", "fab_log", "fab_objtab", "fab_pool", "fab_wire", "fab_cuda", "fab_params",
                    "fab_tagmap", "fab_devcopy"]),
    "provider": (1, ["fab_engine", "fab_device", "fab_nic_profile", "fab_iface", "fab_mr", "fab_endpoint", "fab_ep_local", "fab_rma", "fab_rma_buf", "fab_req", "fab_peer", "fab_signals",
                 "fab_prof", "fab_pwin"]),
    "transports": (2, ["fab_transport", "sr", "rd", "rd_send", "rd_recv", "rd_common", "rd_proto", "rd_eager"]),
    "connections": (3, ["fab_conn", "fab_ctx", "fab_conn_ep", "fab_ctrl", "fab_listen", "fab_connect", "fab_comm"]),
    "rails": (4, ["fab_rails", "fab_rails_data", "fab_rails_stripe", "fab_rails_route"]),
    "api": (5, ["fab_plugin", "fab_data", "fab_api_core", "fab_api", "fab_core", "fab_coll", "fab_coll_ops",
                "fab_coll_target", "fab_coll_stage", "fab_coll_xchg", "fab_coll_api", "fab_p2p_rma"]),
}
FLOOR_OF = {stem: (level, name) for name, (level, stems) in FLOORS.items() for stem in stems}

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
    unknown = sorted({p.stem for p in texts} - set(FLOOR_OF))
    floor = {node(p): FLOOR_OF.get(p.stem) for p in texts}
    if unknown:
        print("files without a floor in check_layers.py (add them, and to docs/architecture.md):", unknown)
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
        if p.parent.name == "core":
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
