"""Turns the spec's conversions into C statements.

Two directions of the same description:
  shim    NCCL calls the version's table -> convert arguments -> core function.
          Every conversion that can lose a value is range-checked and a bad
          value is reported through fab_bad_argument (never truncated).
  driver  a test calls through struct fab_api -> convert arguments -> the
          version's table. Drivers pass what a caller of that version could
          pass: plain C casts, no checks.
Struct conversions run field by field in the direction data flows: to_core
(NCCL's struct -> core struct) or to_abi (core struct -> NCCL's struct).
"""

from dataclasses import dataclass, field

from . import ctypes
from .defs import StructInst
from .types import CoreStruct, CType

DRIVER_ARRAY_MAX = "FAB_DRIVER_ARRAY_MAX"


@dataclass
class CFunction:
    """A rendered C function: signature pieces and body lines."""
    name: str
    returns: str
    params: list
    body: list = field(default_factory=list)
    slot: str = ""


# ---- casts and compatibility ------------------------------------------------------


def cast(expr, src: CType, dst: CType):
    if src.spelling == dst.spelling:
        return expr
    if dst.ref.const and not src.ref.const and src.ref.without_const().spelling == dst.ref.without_const().spelling:
        return expr  # T* -> const T* converts implicitly
    if src.is_funcptr and dst.is_funcptr:
        # Function pointer types differ in enum-vs-int parameters only; go
        # through the generic function pointer type so -Wcast-function-type
        # stays quiet.
        return f"({dst.spelling})(void (*)(void)){expr}"
    return f"({dst.spelling}){expr}"


def copy_problem(abi: CType, core: CType):
    """Why `copy` cannot convert between abi and core, or None."""
    if abi.is_pointer != core.is_pointer:
        return f"copy between {abi.spelling} and {core.spelling} mixes a pointer and a value"
    if abi.is_pointer:
        if abi.ref.volatile and not core.ref.volatile:
            return f"copy from {abi.spelling} to {core.spelling} drops volatile (the value may change under us)"
        if abi.ref.ptr != core.ref.ptr and not (abi.ref.array == "" or core.ref.array == ""):
            if not ("void" in (abi.info.name, core.info.name) or core.info.kind == "opaque"):
                return f"copy between {abi.spelling} and {core.spelling} changes the pointer depth"
        if "void" in (abi.info.name, core.info.name) or core.info.kind == "opaque":
            return None
        if abi.element().numeric and core.element().numeric and abi.info.range != core.info.range:
            kind = "widen_array" if abi.info.size < core.info.size else "narrow_array"
            return (f"copy from {abi.spelling} to {core.spelling} reinterprets the elements; "
                    f"use {kind} (with count and max)")
        if abi.ref.base != core.ref.base and not (abi.element().numeric and core.element().numeric):
            return f"copy between unrelated pointers {abi.spelling} and {core.spelling}"
        return None
    if abi.is_funcptr and core.is_funcptr:
        return None
    if abi.numeric and core.numeric:
        if abi.info.range != core.info.range:
            kind = "widen" if abi.info.size < core.info.size else "narrow"
            return f"copy between {abi.spelling} and {core.spelling} changes the range; use {kind}"
        return None
    if abi.info.name != core.info.name and not (abi.info.kind == core.info.kind == "prim"
                                                 and abi.info.size == core.info.size
                                                 and abi.info.range == core.info.range):
        return f"copy between {abi.spelling} and {core.spelling} is not a plain copy"
    return None


def numeric_problem(conv, abi: CType, core: CType):
    if not (abi.numeric and core.numeric):
        return f"{conv} needs integers on both sides, not {abi.spelling} and {core.spelling}"
    if conv == "widen" and not abi.info.size < core.info.size:
        return f"widen needs the ABI type narrower than the core's ({abi.spelling} vs {core.spelling})"
    if conv == "narrow" and not abi.info.size > core.info.size:
        return f"narrow needs the ABI type wider than the core's ({abi.spelling} vs {core.spelling})"
    return None


def checks(src: CType, dst: CType, expr):
    """Range conditions (C, expectation) for storing expr of type src into dst."""
    out = []
    for cond, expect in ctypes.range_checks(src.info.range, dst.info.range, dst.info.limits, src.spelling):
        out.append((cond.replace("{x}", expr), expect))
    return out


# ---- errors inside generated code -------------------------------------------------------


class Sink:
    """Where a generated function reports a conversion failure."""

    def __init__(self, side, where, returns):
        self.side, self.where, self.returns = side, where, returns

    def fail(self, what, value, expect):
        if self.side == "shim":
            value = value if value.isdigit() else f"(long long)({value})"
            return f"return ({self.returns})fab_bad_argument(\"{self.where}\", \"{what}\", {value}, \"{expect}\");"
        return "return FAB_ERR_INTERNAL;"

    def guard(self, cond, what, value, expect):
        """Two lines: the condition, then the failure."""
        return [f"if ({cond})", f"  {self.fail(what, value, expect)}"]


# ---- struct fields --------------------------------------------------------------------------


class StructConv:
    """Field-by-field conversion between one ABI struct instance and a core struct."""

    def __init__(self, spec, inst: StructInst, core: CoreStruct, node):
        self.spec, self.inst, self.core, self.node = spec, inst, core, node
        if inst.family.core != core.name:
            raise node.error(f"{inst.c_name} does not convert to {core.name}: give [struct.{inst.family.key}] "
                             f"core = \"{core.name}\"" if inst.family.core is None else
                             f"{inst.c_name} converts to {inst.family.core}, not {core.name}")

    def rules(self):
        """(FieldDef, name, CType, conv, core field) for every field of this version."""
        out = []
        for fd, name, t in self.inst.fields:
            if fd.conv is None:
                raise fd.node.error(f"missing conversion: field '{name}' of {self.inst.c_name} converts to "
                                    f"{self.core.name} but has no conv")
            conv = fd.conv.at(self.inst.version, "conversion")
            cf = None
            if conv in ("copy", "widen", "narrow", "array", "struct"):
                if fd.core is None:
                    raise fd.node.error(f"conv = \"{conv}\" needs core = <field of {self.core.name}>")
                cf = self.core.field(fd.core)
                if cf is None:
                    raise fd.node.error(f"{self.core.name} has no field '{fd.core}'", "core")
                self._check(fd, name, t, conv, cf)
            elif conv == "default" and fd.value is None:
                raise fd.node.error("conv = \"default\" needs value = <C constant>")
            elif conv == "derive" and fd.expr is None:
                raise fd.node.error("conv = \"derive\" needs expr = <C expression over {core}.<field>>")
            out.append((fd, name, t, conv, cf))
        return out

    def _check(self, fd, name, t, conv, cf):
        problem = None
        if conv == "copy":
            problem = copy_problem(t, cf.type)
        elif conv in ("widen", "narrow"):
            problem = numeric_problem(conv, t, cf.type)
        elif conv == "array":
            if not (t.is_array and cf.type.is_array):
                problem = f"array needs array fields on both sides ({t.decl(name)} vs {cf.type.decl(cf.name)})"
            elif fd.count is None or self.inst.field(fd.count) is None:
                problem = "array needs count = <sibling field holding the element count>"
            else:
                problem = copy_problem(t.element(), cf.type.element())
        elif conv == "struct":
            if t.struct is None or cf.type.struct is None or not t.is_scalar_value:
                problem = f"struct needs struct values on both sides ({t.spelling} vs {cf.type.spelling})"
            else:
                StructConv(self.spec, t.struct, cf.type.struct, fd.node)
        if problem:
            raise fd.node.error(problem, "conv")

    # src and dst are member access prefixes: "props->", "props_core.".

    def to_abi(self, src, dst, sink, clamp_arrays=False, label=""):
        """Statements storing the core struct at src into the ABI struct at dst.
        label names the struct in error messages ("props.")."""
        lines = []
        for fd, name, t, conv, cf in self.rules():
            s, d = f"{src}{cf.name}" if cf else None, f"{dst}{name}"
            if conv in ("copy", "widen", "narrow"):
                if sink.side == "shim":
                    for c, e in checks(cf.type, t, s):
                        lines += sink.guard(c, label + name, s, e)
                lines.append(f"{d} = {cast(s, cf.type, t)};")
            elif conv == "struct":
                lines += StructConv(self.spec, t.struct, cf.type.struct, fd.node).to_abi(
                    s + ".", d + ".", sink, clamp_arrays, f"{label}{name}.")
            elif conv == "array":
                count_cf = self._count_core(fd)
                lines += self._array(f"{src}{count_cf}", s, d, min(t.length, cf.type.length), cf.type.element(),
                                     t.element(), sink, label + fd.count, clamp_arrays)
            elif conv == "default":
                lines.append(f"{d} = {fd.value};")
            elif conv == "derive":
                lines.append(f"{d} = {fd.expr.replace('{core}.', src)};")
        return lines

    def to_core(self, src, dst, sink, label=""):
        """Statements storing the ABI struct at src into the core struct at dst."""
        lines, sourced = [], set()
        for fd, name, t, conv, cf in self.rules():
            s = f"{src}{name}"
            if cf is not None:
                sourced.add(cf.name)
                d = f"{dst}{cf.name}"
            if conv in ("copy", "widen", "narrow"):
                if sink.side == "shim":
                    for c, e in checks(t, cf.type, s):
                        lines += sink.guard(c, label + name, s, e)
                lines.append(f"{d} = {cast(s, t, cf.type)};")
            elif conv == "struct":
                lines += StructConv(self.spec, t.struct, cf.type.struct, fd.node).to_core(
                    s + ".", d + ".", sink, f"{label}{name}.")
            elif conv == "array":
                lines += self._array(f"{src}{fd.count}", s, d, min(t.length, cf.type.length), t.element(),
                                     cf.type.element(), sink, label + fd.count, False)
        for cf in self.core.fields:
            if cf.name in sourced:
                continue
            if cf.absent is None:
                raise self.node.error(f"core field '{cf.name}' of {self.core.name} gets no value from "
                                      f"{self.inst.c_name}: give it absent = \"<C expression>\" in "
                                      f"[core.struct.{self.core.name}]")
            lines.append(f"{dst}{cf.name} = {cf.absent};")
        return lines

    def _count_core(self, fd):
        count = next(r for r in self.rules() if r[1] == fd.count)
        if count[4] is None:
            raise fd.node.error(f"count field '{fd.count}' must convert to a core field", "count")
        return count[4].name

    @staticmethod
    def _array(count, src, dst, cap, src_t, dst_t, sink, what, clamp):
        """Copies count elements; count outside 0..cap fails (or is clamped)."""
        if clamp:
            n = f"({count} < 0 ? 0 : {count} > {cap} ? {cap} : {count})"
            return [f"for (int i = 0; i < {n}; i++) {dst}[i] = {cast(f'{src}[i]', src_t, dst_t)};"]
        return sink.guard(f"{count} < 0 || {count} > {cap}", what, count, f"0..{cap}") + \
            [f"for (int i = 0; i < {count}; i++) {dst}[i] = {cast(f'{src}[i]', src_t, dst_t)};"]
