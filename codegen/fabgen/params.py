"""core/params.toml: the environment parameters, checked strictly."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .spec import load_toml

TYPES = {"string", "int", "bool", "size"}
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
SIZE_MAX = (1 << 64) - 1
STRING_MAX = 256        # bytes a string parameter may hold, terminator included


@dataclass
class Param:
    name: str
    env: str            # full variable name
    field: str          # C field of struct fab_params
    type: str
    default: object
    min: int | None
    max: int | None
    doc: str
    choices: list | None = None  # string parameters that name one of a few values (matched without case)

    @property
    def c_type(self):
        return {"string": "char", "int": "int", "bool": "int", "size": "size_t"}[self.type]

    @property
    def c_default(self):
        if self.type == "string":
            return _c_string(self.default)
        if self.type == "bool":
            return "1" if self.default else "0"
        return str(self.default) + ("u" if self.type == "size" else "")

    @property
    def c_min(self):
        lo = self.min if self.min is not None else (INT_MIN if self.type == "int" else 0)
        if self.type == "int" and lo == INT_MIN:
            return "INT_MIN"
        return str(lo) + ("u" if self.type == "size" else "")

    @property
    def c_max(self):
        hi = self.max if self.max is not None else (INT_MAX if self.type == "int" else SIZE_MAX)
        if hi == INT_MAX and self.type == "int":
            return "INT_MAX"
        if hi == SIZE_MAX:
            return "SIZE_MAX"
        return str(hi) + ("u" if self.type == "size" else "")

    @property
    def range_cond(self):
        """C condition on v that is true when v is out of range ("" when nothing to check)."""
        if self.type == "int":
            return f"v < {self.c_min} || v > {self.c_max}"
        conds = []
        if self.min:
            conds.append(f"v < {self.c_min}")
        if self.max is not None and self.max < SIZE_MAX:
            conds.append(f"v > {self.c_max}")
        return " || ".join(conds)

    @property
    def doc_default(self):
        if self.type == "string":
            return f"`{self.default}`" if self.default else "(empty)"
        if self.type == "bool":
            return "1" if self.default else "0"
        return _human(self.default) if self.type == "size" else str(self.default)

    @property
    def c_choices(self):
        return ", ".join(_c_string(c) for c in self.choices)

    @property
    def doc_range(self):
        if self.choices:
            return ", ".join(f"`{c}`" if c else "(empty)" for c in self.choices)
        if self.type in ("string", "bool"):
            return "0 or 1" if self.type == "bool" else ""
        lo = self.min if self.min is not None else None
        hi = self.max if self.max is not None else None
        show = _human if self.type == "size" else str
        if lo is None and hi is None:
            return ""
        return f"{show(lo) if lo is not None else '…'} – {show(hi) if hi is not None else '…'}"


@dataclass
class Params:
    prefix: str
    params: list
    file: str


def load(path, label=None):
    doc = load_toml(path, label)
    doc.keys({"prefix", "param"}, {"prefix"})
    prefix = doc.get("prefix", str)
    if not NAME.match(prefix.rstrip("_")) or not prefix.endswith("_"):
        raise doc.error(f"'{prefix}' should be upper case and end in '_' (e.g. FABRIC_)", "prefix")
    params, seen = [], set()
    if doc.has("param"):
        for node in doc.child("param").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
            p = _param(node, prefix)
            if p.name in seen:
                raise node.error(f"parameter '{p.name}' is defined twice", "name")
            seen.add(p.name)
            params.append(p)
    return Params(prefix, params, doc.file)


def _param(node, prefix):
    node.keys({"name", "type", "default", "min", "max", "doc", "choices"}, {"name", "type", "default", "doc"})
    name = node.get("name", str)
    if not NAME.match(name):
        raise node.error(f"'{name}' is not an upper-case name (A-Z, 0-9, _)", "name")
    ptype = node.get("type", str)
    if ptype not in TYPES:
        raise node.error(f"'{ptype}' is not one of: {', '.join(sorted(TYPES))}", "type")
    kind = {"string": str, "int": int, "bool": bool, "size": int}[ptype]
    default = node.get("default", kind)
    lo, hi = node.get("min", int), node.get("max", int)
    if ptype in ("string", "bool") and (lo is not None or hi is not None):
        raise node.error(f"min/max apply to int and size parameters, not {ptype}", "min" if lo is not None else "max")
    if ptype == "int":
        for key, v in (("default", default), ("min", lo), ("max", hi)):
            if v is not None and not INT_MIN <= v <= INT_MAX:
                raise node.error(f"{v} does not fit a C int", key)
    if ptype == "size":
        for key, v in (("default", default), ("min", lo), ("max", hi)):
            if v is not None and not 0 <= v <= SIZE_MAX:
                raise node.error(f"{v} is not a size (0 .. 2^64-1)", key)
    if lo is not None and hi is not None and lo > hi:
        raise node.error(f"min {lo} is larger than max {hi}", "min")
    if ptype in ("int", "size") and ((lo is not None and default < lo) or (hi is not None and default > hi)):
        raise node.error(f"default {default} is outside min/max", "default")
    if ptype == "string" and len(default.encode()) >= STRING_MAX:
        raise node.error(f"default is longer than {STRING_MAX - 1} bytes", "default")
    choices = node.get("choices", list) if node.has("choices") else None
    if choices is not None:
        if ptype != "string":
            raise node.error("choices apply to string parameters only", "choices")
        if not choices or any(not isinstance(c, str) or c != c.lower() for c in choices):
            raise node.error("choices must be a non-empty list of lower-case strings", "choices")
        if len(set(choices)) != len(choices):
            raise node.error("choices repeat a value", "choices")
        if default not in choices:
            raise node.error(f"default '{default}' is not one of the choices", "default")
    doc = node.get("doc", str).strip()
    if not doc:
        raise node.error("doc must say what the parameter does", "doc")
    return Param(name, prefix + name, name.lower(), ptype, default, lo, hi, " ".join(doc.split()), choices)


def _c_string(s):
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{out}"'


def _human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return str(n)
