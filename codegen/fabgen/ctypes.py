"""C types as the specs write them, with LP64 (x86-64 / aarch64 Linux) sizes.

A type is written the way C spells it: "int", "const char*", "void**",
"ncclNetProperties_v8_t*", "int[NCCL_NET_MAX_DEVS_PER_NIC_V9]" (a struct field
array), "void*[]" (a parameter written as an array, e.g. handles[]) or
"volatile uint32_t*" (qualifiers const and volatile, before the base type,
apply to what the pointer points at; they change no size or offset).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# name: (size, align, numeric range or None, C limit macros (min, max) or None)
_I = lambda bits: (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
_U = lambda bits: (0, (1 << bits) - 1)
PRIMITIVES = {
    "char": (1, 1, None, None),
    "bool": (1, 1, None, None),
    "int8_t": (1, 1, _I(8), ("INT8_MIN", "INT8_MAX")),
    "uint8_t": (1, 1, _U(8), ("0", "UINT8_MAX")),
    "int16_t": (2, 2, _I(16), ("INT16_MIN", "INT16_MAX")),
    "uint16_t": (2, 2, _U(16), ("0", "UINT16_MAX")),
    "int": (4, 4, _I(32), ("INT_MIN", "INT_MAX")),
    "unsigned int": (4, 4, _U(32), ("0", "UINT_MAX")),
    "int32_t": (4, 4, _I(32), ("INT32_MIN", "INT32_MAX")),
    "uint32_t": (4, 4, _U(32), ("0", "UINT32_MAX")),
    "float": (4, 4, None, None),
    "long": (8, 8, _I(64), ("LONG_MIN", "LONG_MAX")),
    "unsigned long": (8, 8, _U(64), ("0", "ULONG_MAX")),
    "int64_t": (8, 8, _I(64), ("INT64_MIN", "INT64_MAX")),
    "uint64_t": (8, 8, _U(64), ("0", "UINT64_MAX")),
    "size_t": (8, 8, _U(64), ("0", "SIZE_MAX")),
    "double": (8, 8, None, None),
}
POINTER = (8, 8)
ENUM = (4, 4)
ENUM_RANGE = _I(32)

_TYPE = re.compile(r"^((?:(?:const|volatile)\s+)*)([A-Za-z_][A-Za-z0-9_]*(?:\s+[A-Za-z_][A-Za-z0-9_]*)*)\s*(\**)\s*(\[\s*([A-Za-z0-9_]*)\s*\])?$")


@dataclass(frozen=True)
class TypeRef:
    """One use of a type: base name, qualifiers, pointer depth, optional array."""
    base: str
    const: bool = False
    ptr: int = 0
    array: str | None = None     # None, "" for "T name[]" parameters, or a length (number or constant)
    volatile: bool = False

    @property
    def qualifiers(self):
        return ("const " if self.const else "") + ("volatile " if self.volatile else "")

    @property
    def spelling(self):
        """The type alone, as it appears in a cast: 'const char*'."""
        s = self.qualifiers + self.base + "*" * self.ptr
        return s + ("*" if self.array == "" else "")

    def decl(self, name):
        """A declaration of name with this type: 'int devs[4]', 'void* handles[]'."""
        s = self.qualifiers + self.base + "*" * self.ptr
        sep = " " if name else ""
        if self.array is not None:
            return f"{s}{sep}{name}[{self.array}]"
        return f"{s}{sep}{name}"

    def pointee(self):
        """The type one pointer level down (T* -> T); arrays count as pointers."""
        if self.array == "":
            return TypeRef(self.base, self.const, self.ptr, volatile=self.volatile)
        return TypeRef(self.base, self.const, self.ptr - 1, volatile=self.volatile)

    def without_const(self):
        return TypeRef(self.base, False, self.ptr, self.array, self.volatile)

    def is_pointer(self):
        return self.ptr > 0 or self.array == ""

    def same_type(self, other):
        """Same C type, ignoring a const qualifier and array-vs-pointer spelling."""
        return self.without_const().spelling == other.without_const().spelling


def parse_type(text):
    """Parses a type string; returns TypeRef or None if it is not a type."""
    m = _TYPE.match(text.strip())
    if not m:
        return None
    base = " ".join(m.group(2).split())
    if base in ("const", "volatile"):
        return None
    array = None
    if m.group(4) is not None:
        array = m.group(5)
    quals = m.group(1).split()
    return TypeRef(base=base, const="const" in quals, ptr=len(m.group(3)), array=array, volatile="volatile" in quals)


def align_up(n, a):
    return (n + a - 1) // a * a


def struct_layout(members):
    """members: list of (name, size, align). Returns (size, align, {name: offset})."""
    offset, max_align, offsets = 0, 1, {}
    for name, size, align in members:
        offset = align_up(offset, align)
        offsets[name] = offset
        offset += size
        max_align = max(max_align, align)
    return align_up(offset, max_align), max_align, offsets


def union_layout(members):
    """members: list of (name, size, align). Returns (size, align, {name: 0})."""
    size, max_align = 0, 1
    for _, msize, align in members:
        size, max_align = max(size, msize), max(max_align, align)
    return align_up(size, max_align), max_align, {name: 0 for name, _, _ in members}


def range_checks(src_range, dst_range, dst_limits, src_spelling):
    """The checks a value of range src needs before it is stored in dst.

    Returns a list of (C condition with {x} for the value, expectation text)."""
    if src_range is None or dst_range is None:
        return []
    checks = []
    if src_range[0] < dst_range[0]:
        lo = dst_limits[0]
        checks.append(("{x} < 0" if lo == "0" else f"{{x}} < ({src_spelling}){lo}",
                       ">= 0" if lo == "0" else f">= {lo}"))
    if src_range[1] > dst_range[1]:
        checks.append((f"{{x}} > ({src_spelling}){dst_limits[1]}", f"<= {dst_limits[1]}"))
    return checks
