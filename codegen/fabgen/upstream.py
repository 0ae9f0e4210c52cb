"""Checks the specs against upstream plugin headers, and drafts a new version.

    generate.py --check-upstream DIR            every table and struct the specs
                                                describe, against DIR's headers
    generate.py --import DIR --family rma --version 17
                                                the spec delta for a version the
                                                specs lack, to review

DIR is where NCCL keeps its plugin headers (a checkout's src/include/plugin);
nothing from it is copied into this repository. The headers are read with a
small parser for the shapes NCCL uses: `typedef struct {...} name;`, aliases
`typedef old new;`, `typedef enum {...} name;`, function-pointer members,
nested and anonymous `struct`/`union` members, `volatile` and `const`, and
`#define NAME <integer>`. Sizes of upstream structs are computed (LP64) so an
anonymous union the specs describe in part is still checked by size.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from . import ctypes
from .spec import SpecError
from .versions import parse_range

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_STRUCT = re.compile(r"\btypedef\s+(struct|union)\s*\w*\s*\{")
# Types the plugin headers use but take from elsewhere (LP64 Linux): NCCL's os/linux.h makes ncclPid_t a pid_t.
_EXTERNAL = {"ncclPid_t": (4, 4), "pid_t": (4, 4)}
_ENUM = re.compile(r"\btypedef\s+enum\s*\w*\s*\{[^}]*\}\s*(\w+)\s*;")
_AGGREGATE = re.compile(r"^(struct|union)\s*\w*\s*\{")
_ALIAS = re.compile(r"\btypedef\s+(?!struct\b|enum\b|union\b)([A-Za-z_]\w*)\s+([A-Za-z_]\w*)\s*;")
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+\(?[ \t]*(-?\d+)[ \t]*\)?[ \t]*$", re.M)
_FUNC = re.compile(r"^(?P<ret>.+?)\(\s*\*\s*(?P<name>\w+)\s*\)\s*\((?P<params>.*)\)$", re.S)
_DATA = re.compile(r"^(?P<type>.+?)\b(?P<name>[A-Za-z_]\w*)\s*(?:\[(?P<len>[^\]]*)\])?$", re.S)


@dataclass
class Member:
    name: str
    type: str            # normalized ("void*[]", "const char*"); a function's return type for slots
    line: int
    length: str | None = None    # array length text (fields)
    params: list | None = None   # [(name, type)] for function pointers
    children: list | None = None  # members of a nested struct or union ("" names an anonymous one)


@dataclass
class Struct:
    name: str
    file: str
    line: int
    members: list = field(default_factory=list)
    kind: str = "struct"         # or "union"


class Headers:
    """Every typedef'd struct, alias and integer #define under a directory."""

    def __init__(self, root):
        self.root = root
        self.structs, self.aliases, self.defines, self.enums = {}, {}, {}, set()
        self.files = []
        for dirpath, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                if name.endswith(".h"):
                    self.files.append(os.path.relpath(os.path.join(dirpath, name), root))
                    self._read(os.path.join(dirpath, name))

    def _read(self, path):
        with open(path, errors="replace") as f:
            raw = f.read()
        text = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n") + " ", raw)
        rel = os.path.relpath(path, self.root)
        for m in _DEFINE.finditer(text):
            self.defines[m.group(1)] = int(m.group(2))
        for m in _ALIAS.finditer(text):
            self.aliases[m.group(2)] = (m.group(1), rel, _line(text, m.start()))
        for m in _ENUM.finditer(text):
            self.enums.add(m.group(1))
        for m in _STRUCT.finditer(text):
            end = _closing_brace(text, m.end() - 1)
            tail = re.match(r"\s*(\w+)\s*;", text[end + 1:])
            if not tail:
                continue
            s = Struct(tail.group(1), rel, _line(text, m.start()), kind=m.group(1))
            s.members = _members(text[m.end():end], _line(text, m.end()))
            self.structs[s.name] = s

    def find(self, name):
        """The struct behind name, following aliases; None when absent."""
        seen = set()
        while name not in self.structs and name in self.aliases and name not in seen:
            seen.add(name)
            name = self.aliases[name][0]
        return self.structs.get(name)

    def where(self, name):
        """'file:line' of a struct or alias named name."""
        if name in self.structs:
            return f"{os.path.join(self.root, self.structs[name].file)}:{self.structs[name].line}"
        _, rel, line = self.aliases[name]
        return f"{os.path.join(self.root, rel)}:{line}"

    def versions_of(self, pattern):
        """{version: name} of every struct or alias named like pattern ("ncclRma_v{v}_t")."""
        rx = re.compile("^" + re.escape(pattern).replace(re.escape("{v}"), r"(\d+)") + "$")
        found = {}
        for name in list(self.structs) + list(self.aliases):
            m = rx.match(name)
            if m:
                found[int(m.group(1))] = name
        return found

    def length(self, text):
        text = (text or "").strip()
        if text.isdigit():
            return int(text)
        return self.defines.get(text)

    def layout(self, member, seen=()):
        """(size, align) of a member (LP64), or None where a type is unknown."""
        if member.params is not None or member.type.endswith("*") or member.type.endswith("[]"):
            one = ctypes.POINTER
        elif member.children is not None:
            parts = [self.layout(c, seen) for c in member.children]
            if None in parts:
                return None
            rows = [(str(i), size, align) for i, (size, align) in enumerate(parts)]
            pack = ctypes.union_layout if member.type == "union" else ctypes.struct_layout
            one = pack(rows)[:2]
        else:
            one = self._type_layout(member.type.replace("const ", "").replace("volatile ", ""), seen)
        if one is None or member.length is None:
            return one
        n = self.length(member.length)
        return (one[0] * n, one[1]) if n is not None else None

    def struct_layout(self, s):
        """(size, align) of an upstream struct or union, or None where a member's type is unknown."""
        return self.layout(Member(s.name, s.kind, s.line, children=s.members))

    def _type_layout(self, name, seen):
        prim = ctypes.PRIMITIVES.get(name)
        if prim:
            return prim[:2]
        if name in _EXTERNAL:
            return _EXTERNAL[name]
        while name in self.aliases and name not in self.structs and name not in self.enums:
            name = self.aliases[name][0]
            if name in ctypes.PRIMITIVES:
                return ctypes.PRIMITIVES[name][:2]
        if name in self.enums:
            return ctypes.ENUM
        s = self.structs.get(name)
        if s is None or name in seen:
            return None
        return self.layout(Member(name, s.kind, s.line, children=s.members), seen + (name,))  # seen: no cycles


def _line(text, pos):
    return text.count("\n", 0, pos) + 1


def _closing_brace(text, open_pos):
    depth = 0
    for i in range(open_pos, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(text) - 1


def _split(text, sep):
    """(part, offset) split at sep outside parentheses, brackets and braces."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append((text[start:i], start))
            start = i + 1
    if text[start:].strip():
        out.append((text[start:], start))
    return out


def normalize(type_text):
    """One spelling per C type: "void **" -> "void**", "void* x[]" (as "void*[]")."""
    ref = ctypes.parse_type(" ".join(type_text.split()))
    if ref is None:
        return " ".join(type_text.split())
    base = ref.qualifiers + ref.base + "*" * ref.ptr
    return base + ("[]" if ref.array == "" else "")


def _members(body, first_line):
    """The members of a struct or union body that starts on first_line."""
    out = []
    for part, offset in _split(body, ";"):
        lead = len(part) - len(part.lstrip())
        member = _member(part, first_line + body.count("\n", 0, offset + lead))
        if member:
            out.append(member)
    return out


def _aggregate(part, line):
    """A nested `struct {...} name` or `union {...};` (anonymous) member, or None."""
    raw = part.strip()
    m = _AGGREGATE.match(raw)
    if not m:
        return None
    close = _closing_brace(raw, m.end() - 1)
    tail = re.match(r"^\s*(\w*)\s*(?:\[([^\]]*)\])?\s*$", raw[close + 1:])
    if not tail:
        return None
    children = _members(raw[m.end():close], line + raw.count("\n", 0, m.end()))
    return Member(tail.group(1), m.group(1), line, length=tail.group(2), children=children)


def _member(part, line):
    nested = _aggregate(part, line)
    if nested:
        return nested
    part = " ".join(part.split())
    if not part:
        return None
    m = _FUNC.match(part)
    if m:
        params = []
        for p, _ in _split(m.group("params"), ","):
            p = p.strip()
            if not p or p == "void":
                continue
            d = _DATA.match(p)
            if d:
                params.append((d.group("name"), normalize(d.group("type") + ("[]" if d.group("len") is not None else ""))))
            else:
                params.append(("", normalize(p)))
        return Member(m.group("name"), normalize(m.group("ret")), line, params=params)
    d = _DATA.match(part)
    if not d:
        return None
    return Member(d.group("name"), normalize(d.group("type")), line, length=d.group("len"))


# ---- the spec side ------------------------------------------------------------------------------


class SpecLines:
    """Finds the line of a slot, an argument or a struct field in a spec file."""

    def __init__(self, spec_dir):
        self.dir = spec_dir
        self.cache = {}

    def _lines(self, label):
        if label not in self.cache:
            path = os.path.join(self.dir, os.path.basename(label))
            try:
                with open(path) as f:
                    self.cache[label] = f.read().splitlines()
            except OSError:
                self.cache[label] = []
        return self.cache[label]

    def slot(self, label, slot, arg=None):
        lines = self._lines(label)
        start = self._after(lines, 0, r'^\[\[table\.slot\]\]')
        while start is not None:
            nxt = self._after(lines, start + 1, r'^\[\[table\.slot\]\]')
            end = nxt if nxt is not None else len(lines)
            for i in range(start, end):
                if re.match(r'^name\s*=\s*"%s"' % re.escape(slot), lines[i]):
                    if arg is None:
                        return i + 1
                    for j in range(i, end):
                        if re.search(r'\{\s*name\s*=\s*"%s"' % re.escape(arg), lines[j]):
                            return j + 1
                    return i + 1
            start = nxt
        return 1

    def family_versions(self, label):
        lines = self._lines(label)
        hit = self._after(lines, 0, r'^versions\s*=')
        return hit + 1 if hit is not None else 1

    def field(self, label, struct_key, name):
        lines = self._lines(label)
        start = self._after(lines, 0, r'^\[struct\.%s\]' % re.escape(struct_key))
        if start is None:
            return 1
        for j in range(start, len(lines)):
            if re.search(r'\{\s*name\s*=\s*"%s"' % re.escape(name), lines[j]):
                return j + 1
        return start + 1

    @staticmethod
    def _after(lines, i, pattern):
        for j in range(i, len(lines)):
            if re.match(pattern, lines[j]):
                return j
        return None


def _spec_type(defn, v):
    text = defn.type.at(v, "type") if hasattr(defn.type, "at") else defn.type
    return normalize(text.replace("{v}", str(v)))


# ---- --check-upstream ---------------------------------------------------------------------------


def parse_ignores(spec, texts):
    """--ignore FAMILY[:RANGE] ... -> {family key: [VRange or None]}; ValueError names a bad one."""
    keys = {f.key: f for f in spec.families}
    out = {}
    for text in texts or []:
        key, _, rng = text.partition(":")
        if key not in keys:
            raise ValueError(f"--ignore {text}: no family '{key}' in the specs (have: {', '.join(keys)})")
        try:
            out.setdefault(key, []).append(parse_range(rng, keys[key].node, "--ignore") if rng else None)
        except SpecError:
            raise ValueError(f"--ignore {text}: '{rng}' is not a version range (write 17, 15-17, 17- or -4)")
    return out


def _ignored(fam, v, ignores):
    """Why version v of fam may be absent from the specs, or None."""
    for r in ignores.get(fam.key, []):
        if r is None or v in r:
            return "--ignore"
    for r, reason in fam.not_described:
        if v in r:
            return reason
    return None


def coverage(spec, headers, spec_dir, ignores):
    """Whole versions: (differences, notes). Every table version upstream has and the specs lack is a
    difference unless ignored; versions only the specs have are a note (NCCL drops the headers of
    versions it no longer loads; older releases still load them)."""
    diffs, notes, families = [], [], set()
    for fam in spec.families:
        up = headers.versions_of(fam.table)
        families.add(fam.table.split("_v{v}")[0])
        if not up:
            notes.append(f"{fam.key}: no {fam.table.replace('{v}', 'N')} in {headers.root}; its versions are not "
                         f"compared")
            continue
        line = SpecLines(spec_dir).family_versions(fam.file)
        for v in sorted(set(up) - set(fam.versions)):
            why = _ignored(fam, v, ignores)
            if why:
                notes.append(f"{fam.key} v{v}: in upstream {headers.where(up[v])}, not described ({why})")
            else:
                diffs.append(f"{fam.file}:{line}: {fam.key} v{v} is not described here; upstream "
                             f"{headers.where(up[v])} declares {up[v]}. Draft it with --import DIR --family "
                             f"{fam.key} --version {v}, or pass --ignore {fam.key}:{v}")
        only_here = [v for v in fam.versions if v not in up]
        if only_here:
            notes.append(f"{fam.key}: v{', v'.join(map(str, only_here))} described here, not in {headers.root} "
                         f"(releases that no longer ship a header may still be loaded by older NCCL)")
    others = _undescribed_families(headers, families)
    if others:
        notes.append(f"upstream families no spec describes (not compared): {', '.join(others)}")
    return diffs, notes


def _undescribed_families(headers, described):
    """'tuner v2-v7' for each <family>/<family>_vN.h group whose tables no spec names."""
    groups = {}
    for rel in headers.files:
        m = re.match(r"^(\w+)/\1_v(\d+)\.h$", rel.replace(os.sep, "/"))
        if m:
            groups.setdefault(m.group(1), []).append(int(m.group(2)))
    out = []
    for fam, vs in sorted(groups.items()):
        names = {n for v in vs for n in list(headers.structs) + list(headers.aliases) if n.endswith(f"_v{v}_t")}
        if not any(n.split(f"_v")[0] in described for n in names):
            out.append(f"{fam} v{min(vs)}-v{max(vs)}")
    return out


def check(spec, headers, spec_dir, ignores=None):
    """(differences, notes): each difference names both places; notes say what was not found."""
    where = SpecLines(spec_dir)
    diffs, notes = coverage(spec, headers, spec_dir, ignores or {})
    _NAME_NOTES.clear()
    for fam in spec.families:
        for v, table in fam.tables.items():
            up = headers.find(table.c_name)
            if up is None:
                continue
            diffs += _check_table(table, up, headers, where, fam.file)
    for inst in sorted(spec.instances.values(), key=lambda i: i.c_name):
        up = headers.find(inst.c_name)
        if up is None:
            notes.append(f"{inst.c_name}: not in {headers.root} ({inst.family.file} describes it)")
            continue
        diffs += _check_struct(inst, up, headers, where)
    return diffs, notes + _NAME_NOTES


def _up(headers, s, m=None):
    return f"{os.path.join(headers.root, s.file)}:{m.line if m else s.line}"


def _check_table(table, up, headers, where, label):
    diffs = []
    ours = [s.name for s in table.slots]
    theirs = [m.name for m in up.members]
    if ours != theirs:
        diffs.append(f"{label}:{where.slot(label, ours[0])}: {table.c_name} slots are {ours}; upstream "
                     f"{_up(headers, up)} has {theirs}")
        return diffs
    for slot, m in zip(table.slots, up.members):
        at = f"{table.c_name}.{slot.name}"
        if slot.data is not None:
            if normalize(slot.data.spelling) != m.type or m.params is not None:
                diffs.append(f"{label}:{where.slot(label, slot.name)}: {at} is data of type {slot.data.spelling}; "
                             f"upstream {_up(headers, up, m)} declares {m.type}")
            continue
        if m.params is None:
            diffs.append(f"{label}:{where.slot(label, slot.name)}: {at} is a function; upstream "
                         f"{_up(headers, up, m)} declares data")
            continue
        diffs += _check_args(table, slot, m, headers, up, where, label)
    return diffs


def _check_args(table, slot, m, headers, up, where, label):
    diffs, at = [], f"{table.c_name}.{slot.name}"
    for i in range(max(len(slot.args), len(m.params))):
        a = slot.args[i] if i < len(slot.args) else None
        p = m.params[i] if i < len(m.params) else None
        line = where.slot(label, slot.name, a.name if a else None)
        if a is None:
            diffs.append(f"{label}:{line}: {at} has {len(slot.args)} arguments; upstream {_up(headers, up, m)} has "
                         f"{len(m.params)} (argument {i + 1} '{p[0]}' {p[1]} is missing here)")
        elif p is None:
            diffs.append(f"{label}:{line}: {at} argument {i + 1} '{a.name}' ({_spec_type(a.defn, table.version)}) "
                         f"is not in upstream {_up(headers, up, m)}")
        else:
            ours = _spec_type(a.defn, table.version)
            if not _same_type(headers, ours, p[1]):
                diffs.append(f"{label}:{line}: {at} argument {i + 1} '{a.name}' is {ours} here; upstream "
                             f"{_up(headers, up, m)} says {p[1]} '{p[0]}'")
            elif p[0] and p[0] != a.name:
                _NAME_NOTES.append(f"{label}:{line}: {at} argument {i + 1} is named '{a.name}' here, '{p[0]}' "
                                   f"upstream {_up(headers, up, m)} (names are not part of the ABI)")
    return diffs


_NAME_NOTES = []


def _same_type(headers, ours, theirs):
    """Equal spellings, or equal once upstream's typedef aliases are followed (NCCL names a shared enum
    per version: typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t)."""
    def base(text):
        seen = set()
        while text in headers.aliases and text not in seen:
            seen.add(text)
            text = headers.aliases[text][0]
        return text
    return ours == theirs or base(ours) == base(theirs)


def _check_struct(inst, up, headers, where):
    if inst.family.union:
        return _check_union(inst, up, headers, where)
    diffs, label, key = [], inst.family.file, inst.family.key
    ours = [name for _, name, _ in inst.fields]
    theirs = [m.name for m in up.members]
    if inst.family.partial:
        shared = 0
        while shared < min(len(ours), len(theirs)) and ours[shared] == theirs[shared]:
            shared += 1
        _NAME_NOTES.append(f"{label}:{where.field(label, key, ours[shared] if shared < len(ours) else ours[0])}: "
                           f"{inst.c_name}: fields from '{ours[shared] if shared < len(ours) else '-'}' on are "
                           f"compared by size and by the members named alike ({inst.family.partial})")
        diffs += _check_partial_rest(inst, up, headers, where, shared)
        ours, theirs = ours[:shared], theirs[:shared]
    if ours != theirs:
        line = where.field(label, key, ours[0] if ours else "")
        return [f"{label}:{line}: {inst.c_name} fields are {ours}; upstream {_up(headers, up)} has {theirs}"]
    for (fd, name, t), m in zip(inst.fields[:len(ours)], up.members):
        line = where.field(label, key, name)
        ours_t = _spec_type(fd, inst.version) if inst.version is not None else normalize(fd.type.at(None, "type"))
        base = ours_t.split("[")[0]
        if base != m.type or m.params is not None:
            diffs.append(f"{label}:{line}: {inst.c_name}.{name} is {ours_t} here; upstream {_up(headers, up, m)} "
                         f"says {m.type}")
            continue
        if (t.length is not None) != (m.length is not None):
            diffs.append(f"{label}:{line}: {inst.c_name}.{name}: array here {t.length}, upstream "
                         f"{_up(headers, up, m)} [{m.length}]")
        elif t.length is not None and headers.length(m.length) not in (None, t.length):
            diffs.append(f"{label}:{line}: {inst.c_name}.{name} has {t.length} elements here; upstream "
                         f"{_up(headers, up, m)} has {m.length} = {headers.length(m.length)}")
    return diffs


def _check_partial_rest(inst, up, headers, where, shared):
    """The part of a partly described struct past its shared fields: the struct's size, and where our
    next field stands for an upstream nested aggregate (an anonymous union), its size and the members
    both name (the union's netPlugin), field by field."""
    diffs, label, key = [], inst.family.file, inst.family.key
    whole = headers.struct_layout(up)
    if whole is not None and whole[0] != inst.size:
        diffs.append(f"{label}:{where.field(label, key, inst.fields[0][1])}: {inst.c_name} is {inst.size} bytes "
                     f"here; upstream {_up(headers, up)} is {whole[0]}")
    if shared >= min(len(inst.fields), len(up.members)):
        return diffs
    (_, name, t), m = inst.fields[shared], up.members[shared]
    if m.children is None or t.struct is None:
        return diffs
    line, at = where.field(label, key, name), f"{inst.c_name}.{name}"
    size = headers.layout(m)
    if size is not None and size[0] != t.size:
        diffs.append(f"{label}:{line}: {at} is {t.size} bytes here; upstream {_up(headers, up, m)} "
                     f"{m.type} is {size[0]}")
    return diffs + _alike_members(t.struct.fields, m.children, f"{label}:{line}: {at}", headers, up)


def _alike_members(our_fields, their_members, prefix, headers, up):
    """Members both sides name, where both are aggregates (a union's netPlugin): field by field."""
    diffs, theirs = [], {c.name: c for c in their_members if c.name}
    for _, member, mt in our_fields:
        c = theirs.get(member)
        if c is None or mt.struct is None or c.children is None:
            continue
        if [f[1] for f in mt.struct.fields] != [g.name for g in c.children]:
            diffs.append(f"{prefix}.{member} fields are {[f[1] for f in mt.struct.fields]}; upstream "
                         f"{_up(headers, up, c)} has {[g.name for g in c.children]}")
            continue
        for (_, fname, ft), g in zip(mt.struct.fields, c.children):
            if normalize(ft.spelling) != g.type:
                diffs.append(f"{prefix}.{member}.{fname} is {ft.spelling} here; upstream {_up(headers, up, g)} "
                             f"says {g.type}")
    return diffs


def _check_union(inst, up, headers, where):
    """A union the spec describes by the members the plugin uses and a filler: its size, and the members
    both sides name."""
    label, key = inst.family.file, inst.family.key
    line = where.field(label, key, inst.fields[0][1])
    _NAME_NOTES.append(f"{label}:{line}: {inst.c_name}: a union compared by size and by the members named alike")
    diffs = []
    whole = headers.struct_layout(up)
    if up.kind != "union":
        diffs.append(f"{label}:{line}: {inst.c_name} is a union here; upstream {_up(headers, up)} declares a "
                     f"{up.kind}")
    elif whole is not None and whole[0] != inst.size:
        diffs.append(f"{label}:{line}: {inst.c_name} is {inst.size} bytes here; upstream {_up(headers, up)} is "
                     f"{whole[0]}")
    return diffs + _alike_members(inst.fields, up.members, f"{label}:{line}: {inst.c_name}", headers, up)


# ---- --import ---------------------------------------------------------------------------------


def draft(spec, headers, family_key, version):
    """Lines of TOML-like text: what the family's spec needs for `version`."""
    fam = next((f for f in spec.families if f.key == family_key), None)
    if fam is None:
        raise ValueError(f"no family '{family_key}' in the specs (have: {', '.join(f.key for f in spec.families)})")
    if version in fam.versions:
        raise ValueError(f"{family_key} v{version} is already described in {fam.file}; use --check-upstream")
    c_name = fam.table.replace("{v}", str(version))
    up = headers.find(c_name)
    if up is None:
        raise ValueError(f"{c_name} is not in {headers.root}")
    base_v = max([v for v in fam.versions if v < version] or fam.versions)
    base = fam.tables[base_v]
    out = [f"# {fam.file}: {family_key} v{version} from {_up(headers, up)}, against v{base_v}. Review each line;",
           "# layouts are recomputed by the generator and must match what you record.",
           f"[family] versions += [{version}]; releases.\"{version}\" = \"<NCCL releases that load it>\"",
           f"[table.layout] \"{version}\" = {{ size = {8 * len(up.members)}, slots = "
           f"[{', '.join(repr(m.name).replace(chr(39), chr(34)) for m in up.members)}] }}"]
    theirs = {m.name: (i, m) for i, m in enumerate(up.members)}
    for s in base.slots:
        if s.name not in theirs:
            out.append(f"slot {s.name}: not in v{version}: add until = {base_v}")
    for i, m in enumerate(up.members):
        out += _draft_slot(headers, base, m, i, version, base_v)
    out += _draft_structs(spec, headers, up, version, base_v)
    return out


def _vtype(t, version):
    return re.sub(r"_v%d_t\b" % version, "_v{v}_t", t)


def _snake(name):
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _core_param(core, name):
    """The core function's parameter a new argument would go to, or None."""
    if core is None or isinstance(core, str):
        return None
    wanted = {name, _snake(name)}
    return next((n for n, _ in core.args if n in wanted), None)


def _arg_line(name, t_v, version, core):
    """A spec line for a new argument, with a drafted conversion."""
    to = _core_param(core, name)
    conv = f'conv = "copy", to = "{to}"' if to else 'conv = "ignore"'
    line = f'{{ name = "{name}", type = "{t_v}", since = {version}, {conv} }}'
    if not to and core is not None and not isinstance(core, str):
        line += f"  # {core.name} has no parameter for it: ignored, or add one to the core"
    return line


def _draft_slot(headers, base, m, index, version, base_v):
    s = base.slot(m.name)
    if s is None:
        if m.params is None:
            return [f"slot {m.name} (new, index {index}): data = \"{m.type}\", since = {version}"]
        args = ", ".join(f'{{ name = "{n}", type = "{_vtype(t, version)}" }}' for n, t in m.params)
        return [f"slot {m.name} (new, index {index}): since = {version}, args = [{args}]",
                f"slot {m.name}: core = \"<core function>\" and a conversion per argument, or optional = true "
                f"to export NULL"]
    if m.params is None or s.data is not None:
        return []
    out = []
    # What the spec renders for `version` if each argument's text is extended unchanged: a type with {v}
    # names the new version's struct, which upstream may not have (v17 reuses ncclRmaProperties_v16_t).
    raw = {a.name: a.defn.type.at(base_v, "type") for a in s.args}
    names_theirs = [n for n, _ in m.params]
    for pos, (n, t) in enumerate(m.params):
        t_v = _vtype(t, version)
        if n not in raw:
            out.append(f"slot {m.name}: argument '{n}' {t} is new at position {pos + 1}: "
                       + _arg_line(n, t_v, version, s.core))
            continue
        extended = normalize(raw[n].replace("{v}", str(version)))
        if _same_type(headers, extended, t):
            continue
        reuse = "{v}" in raw[n] and re.sub(r"_v\d+_t\b", "_v{v}_t", t) == " ".join(raw[n].split())
        why = f"keeps {t} (the spec would render {extended})" if reuse else f"changes type to {t}"
        out.append(f"slot {m.name}: argument '{n}' {why}: type = {{ \"-{base_v}\" = \"{raw[n]}\", "
                   f"\"{version}-\" = \"{t_v}\" }}")
    for n in raw:
        if n not in names_theirs:
            out.append(f"slot {m.name}: argument '{n}' is gone in v{version}: add until = {base_v}")
    return out


def _draft_structs(spec, headers, table_struct, version, base_v):
    out, seen = [], set()
    for m in table_struct.members:
        for _, t in m.params or []:
            name = re.sub(r"\W", "", t.replace("[]", "").replace("const", "").replace("volatile", ""))
            if name in seen or not re.search(r"_v\d+_t$", name):
                continue
            seen.add(name)
            if not name.endswith(f"_v{version}_t"):
                continue
            up = headers.find(name)
            prev = name.replace(f"_v{version}_t", f"_v{base_v}_t")
            inst = spec.instances.get(prev)
            if up is None:
                if not _is_alias_of_non_struct(headers, name):
                    out.append(f"struct {name}: not found in the headers")
                continue
            out += _draft_struct(spec, headers, up, name, prev, inst, version, base_v)
    return out


def _is_alias_of_non_struct(headers, name):
    """A per-version name for an enum or a primitive (typedef ncclProfilerEventState_t ..._v7_t)."""
    seen = set()
    while name in headers.aliases and name not in seen:
        seen.add(name)
        name = headers.aliases[name][0]
    return bool(seen) and name not in headers.structs


def _draft_stand_in(headers, up, name, prev, inst, version, base_v):
    """A struct or union the spec describes in part (inst.family.partial or .union): compared by the leading
    fields, the members both sides name, and sizes; upstream's anonymous aggregate stands where ours
    has a named one."""
    whole = headers.struct_layout(up)
    notes = []
    for i, (_, n, t) in enumerate(inst.fields):
        m = next((c for c in up.members if c.name == n), None)
        if m is None and not inst.family.union and i < len(up.members) and up.members[i].name == "" \
                and up.members[i].children is not None:
            m = up.members[i]  # the anonymous union our named field stands for
        if m is None:
            continue
        size = headers.layout(m)
        if size is not None and size[0] != t.size:
            what = f"the anonymous {m.type}" if not m.name else f"member '{n}'"
            notes.append(f"struct {name}: {what} is {size[0]} bytes (v{base_v}: {t.size} as '{n}', "
                         f"{t.spelling}): record the new size in its layout and resize any filler")
    if whole is not None and whole[0] != inst.size:
        notes.append(f"struct {name}: {whole[0]} bytes (v{base_v}: {inst.size})")
    if not notes:
        return [f"struct {name}: the part {prev} describes is unchanged ({inst.size} bytes): extend its layout "
                f"range to {version}"]
    return notes + [_layout_line(headers, up, name, version, [n for _, n, _ in inst.fields])]


def _draft_struct(spec, headers, up, name, prev, inst, version, base_v):
    if inst is not None and (inst.family.partial or inst.family.union):
        return _draft_stand_in(headers, up, name, prev, inst, version, base_v)
    fields = [(f.name, f.type + (f"[{f.length}]" if f.length else "")) for f in up.members]
    reused = f" (upstream: a typedef of {up.name})" if up.name != name else ""
    ours = [(n, _spec_type(fd, base_v)) for fd, n, _ in inst.fields] if inst else None
    if inst is not None and [n for n, _ in ours] == [n for n, _ in fields] and \
            [t for _, t in ours] == [t.split("[")[0] for _, t in fields]:
        return [f"struct {name}: same fields as {prev}{reused}: extend its since/until to {version} and record "
                f"layout \"{version}\" (it renders as a typedef of {prev})"]
    if inst is None:
        return [f"struct {name}: fields {fields} (new){reused}", _layout_line(headers, up, name, version)]
    out = [f"struct {name}: fields {fields} (v{base_v}: {ours}){reused}"]
    theirs = dict(fields)
    core = spec.core.structs.get(inst.family.core) if inst.family.core else None
    core_fields = {f.name for f in core.fields} if core else set()
    for fd, n, _ in inst.fields:
        if n not in theirs:
            absent = f"; the core's {fd.core} then takes its absent value" if fd.core else ""
            out.append(f"struct {name}: field '{n}' is gone in v{version}: add until = {base_v}{absent}")
    for n, t in fields:
        if n in dict(ours):
            continue
        target = next((c for c in (n, _snake(n)) if c in core_fields), None)
        conv = f'conv = "copy", core = "{target}"' if target else 'conv = "ignore"'
        note = "" if target or not core_fields else f"  # {core.name} has no field for it: ignored, or add one"
        out.append(f'struct {name}: field \'{n}\' is new: {{ name = "{n}", type = "{_vtype(t, version)}", '
                   f'since = {version}, {conv} }}{note}')
    out.append(_layout_line(headers, up, name, version))
    return out


def _layout_line(headers, up, name, version, our_names=None):
    """The layout record a struct's spec needs, computed from the header (LP64). our_names: the spec's
    field names, where an anonymous member stands at the same place as a named one of ours."""
    rows = []
    for i, f in enumerate(up.members):
        one = headers.layout(f)
        if one is None:
            return f"struct {name}: layout \"{version}\": a member's size is unknown here; compute it by hand"
        label = f.name or (our_names[i] if our_names and i < len(our_names) else f"<anonymous {f.type}>")
        rows.append((label, one[0], one[1]))
    size, align, offsets = (ctypes.union_layout if up.kind == "union" else ctypes.struct_layout)(rows)
    return (f"struct {name}: layout \"{version}\" = {{ size = {size}, align = {align}, offsets = "
            f"{{ {', '.join(f'{k} = {v}' for k, v in offsets.items())} }} }}")
