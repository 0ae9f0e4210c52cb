"""The loaded form of the specs: definitions (what a spec file says, with
version ranges) and instances (one concrete struct or table of one version)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .types import CType
from .versions import VMap

ARG_CONVS = {"copy", "widen", "narrow", "widen_array", "narrow_array", "struct_in", "struct_out", "ignore", "one",
             "widen_one"}
FIELD_CONVS = {"copy", "widen", "narrow", "array", "struct", "default", "derive", "ignore"}
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Constant:
    name: str
    value: int
    hex: bool
    doc: str
    installed: str | None          # installed NCCL header that defines it too (for the value test)
    file: str


@dataclass
class EnumValue:
    name: str
    value: int
    doc: str
    installed: str | None


@dataclass
class Enum:
    name: str
    doc: str
    hex: bool
    values: list
    file: str


@dataclass
class Callback:
    name: str
    doc: str
    returns: str
    args: list                      # (name, type text)
    variadic: bool
    file: str
    node: object
    resolved: tuple = None          # (returns CType, [(name, CType)])


@dataclass
class FieldDef:
    name: str
    since: int | None
    until: int | None
    type: VMap
    conv: VMap | None
    core: str | None
    count: str | None
    value: str | None
    expr: str | None
    doc: str
    node: object


@dataclass
class StructFamily:
    key: str
    c_name: str                     # may contain {v}
    doc: str
    since: int | None
    until: int | None
    fields: list
    layout: object                  # VMap of records (versioned) or a record Node
    core: str | None                # core struct it converts to and from
    null_value: str | None          # initializer a driver passes for a NULL core pointer
    file: str
    node: object
    family: object = None           # owning Family, None for shared structs
    header: str | None = None       # shared structs: the shared header
    installed: str | None = None    # installed NCCL header that defines it too (the abi test compares)
    pattern: object = None
    union: bool = False             # a union: every member at offset 0
    partial: str | None = None      # why only NCCL's leading fields are described by name (--check-upstream)

    @property
    def versioned(self):
        return "{v}" in self.c_name


@dataclass
class StructInst:
    family: StructFamily
    version: int | None
    c_name: str
    header: str
    fields: list = field(default_factory=list)   # (FieldDef, name, CType)
    size: int = 0
    align: int = 1
    offsets: dict = field(default_factory=dict)
    alias_of: str | None = None
    done: bool = False

    def field(self, name):
        return next((f for f in self.fields if f[1] == name), None)


@dataclass
class ArgDef:
    name: str
    since: int | None
    until: int | None
    type: VMap
    conv: VMap | None
    to: str | None
    count: str | None
    max: str | None
    value: str | None
    doc: str
    node: object


@dataclass
class SlotDef:
    name: str
    since: int | None
    until: int | None
    data: str | None
    returns: str
    args: list
    core: VMap | None
    fill: dict
    optional: bool
    doc: str
    node: object


@dataclass
class ArgInst:
    defn: ArgDef
    name: str
    type: CType
    conv: str | None
    node: object


@dataclass
class SlotInst:
    defn: SlotDef
    name: str
    index: int
    data: CType | None
    returns: CType | None
    args: list
    core: object                    # CoreFunction, "null", or None (not exported)

    @property
    def offset(self):
        return 8 * self.index

    def arg(self, name):
        return next((a for a in self.args if a.name == name), None)


@dataclass
class TableInst:
    family: object
    version: int
    c_name: str
    symbol: str
    header: str
    slots: list
    size: int = 0

    def slot(self, name):
        return next((s for s in self.slots if s.name == name), None)


@dataclass
class Family:
    key: str
    title: str
    versions: list
    table: str
    symbol: str
    header: str
    export: bool
    plugin_name: str
    handle_size: int | None
    releases: dict
    status: str
    doc: str
    file: str
    node: object
    slots: list = field(default_factory=list)
    layout: VMap = None
    tables: dict = field(default_factory=dict)
    api: str = "fab_api"            # the core table its drivers fill (core/api/fab_api.h)
    library: str = "nccl-net-fabric"  # the shared library (lib<library>.so) that exports its tables
    export_versions: set = field(default_factory=set)  # versions with an exported table
    not_described: list = field(default_factory=list)  # [(VRange, reason)] upstream versions left out

    def header_for(self, v):
        return self.header.replace("{v}", str(v))


@dataclass
class ApiMember:
    member: str
    core: str
    fallback: tuple            # functions tried in order after core (a string in the spec, or a list)
    after_fallback: str | None
    absent: str | None
    node: object
    api: str = "fab_api"            # the struct in core/api/fab_api.h this member belongs to


@dataclass
class Core:
    header: str
    constants: dict
    types: dict
    structs: dict
    functions: dict
    api: list
    file: str
    node: object
