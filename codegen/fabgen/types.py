"""Named types known to the specs (primitives, enums, callbacks, structs, core
types) and resolved uses of them (CType)."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ctypes


@dataclass
class TypeInfo:
    name: str
    kind: str                      # prim | enum | funcptr | struct | opaque | void
    size: int = 0
    align: int = 1
    range: tuple | None = None     # numeric range, for range checks
    limits: tuple | None = None    # C macros for the range ends
    struct: object = None          # StructInst or CoreStruct for kind == struct
    header: str | None = None      # generated header that defines it (None: system or core)


@dataclass
class CType:
    ref: ctypes.TypeRef
    info: TypeInfo
    length: int | None = None      # element count of a field array

    @property
    def spelling(self):
        return self.ref.spelling

    def decl(self, name):
        return self.ref.decl(name)

    @property
    def is_pointer(self):
        return self.ref.is_pointer()

    @property
    def is_array(self):
        return self.ref.array not in (None, "")

    @property
    def is_scalar_value(self):
        """A plain value (not pointer, not array)."""
        return not self.is_pointer and not self.is_array

    @property
    def size(self):
        if self.is_pointer:
            return ctypes.POINTER[0]
        n = self.length if self.is_array else 1
        return self.info.size * n

    @property
    def align(self):
        return ctypes.POINTER[1] if self.is_pointer else self.info.align

    @property
    def numeric(self):
        """(range, limits) when this is an integer value, else None."""
        if self.is_scalar_value and self.info.range is not None:
            return self.info.range, self.info.limits
        return None

    @property
    def struct(self):
        """The struct behind a value or single pointer, else None."""
        return self.info.struct if self.info.kind == "struct" else None

    @property
    def is_funcptr(self):
        return self.info.kind == "funcptr" and self.ref.ptr == 0 and self.ref.array is None

    def element(self):
        """Element type of an array field or of a pointer (T* -> T)."""
        if self.is_array:
            return CType(ctypes.TypeRef(self.ref.base, self.ref.const, self.ref.ptr, volatile=self.ref.volatile), self.info)
        return CType(self.ref.pointee(), self.info)


def primitive_infos():
    infos = {name: TypeInfo(name, "prim", s, a, r, lim) for name, (s, a, r, lim) in ctypes.PRIMITIVES.items()}
    infos["void"] = TypeInfo("void", "void")
    return infos


@dataclass
class CoreStruct:
    name: str
    fields: list = field(default_factory=list)   # list of CoreField

    def field(self, name):
        return next((f for f in self.fields if f.name == name), None)


@dataclass
class CoreField:
    name: str
    type: CType
    absent: str | None
    node: object


@dataclass
class CoreFunction:
    name: str
    returns: CType
    args: list                                   # list of (name, CType)
    node: object

    def arg(self, name):
        return next((t for n, t in self.args if n == name), None)
