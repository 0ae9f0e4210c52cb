"""Loads abi/*.toml into one checked model.

Shared files (no [family]) hold constants, enums, callbacks and structs used by
several families; they render into their own header. A family file holds one
[family], its [table] of function slots and the structs only it uses; every
version of the family renders into a header of its own.

Structs and tables are described once with version ranges and instantiated per
version on demand; every instance's computed LP64 layout is compared with the
layout recorded in the spec (taken from NCCL's headers, docs/abi-facts.md).
"""

import os
import re

from . import ctypes
from .defs import (ARG_CONVS, FIELD_CONVS, IDENT, ApiMember, ArgDef, ArgInst, Callback, Constant, Core, Enum,
                   EnumValue, Family, FieldDef, SlotDef, SlotInst, StructFamily, StructInst, TableInst)
from .spec import SpecError, load_toml
from .types import CType, CoreField, CoreFunction, CoreStruct, TypeInfo, primitive_infos
from .versions import VMap, active, check_disjoint, choice_check, parse_range, read_since_until, string_check


class Spec:
    """Every spec file of one directory, loaded and checked."""

    def __init__(self, spec_dir, label=None):
        self.dir = spec_dir
        self.label = label or os.path.basename(os.path.normpath(spec_dir))
        self.files = []                # labels, in load order
        self.constants, self.enums, self.callbacks = {}, {}, {}
        self.structs, self.families = [], []
        self.shared_headers = {}       # header -> file label
        self.core = None
        self.types = primitive_infos()
        self.instances = {}            # c_name -> StructInst
        self._load()

    # ---- loading -------------------------------------------------------

    def _load(self):
        names = sorted(n for n in os.listdir(self.dir) if n.endswith(".toml"))
        if not names:
            raise SpecError(self.label, "(dir)", "no *.toml spec files")
        docs = [load_toml(os.path.join(self.dir, n), f"{self.label}/{n}") for n in names]
        for doc in docs:
            self.files.append(doc.file)
            self._load_file(doc)
        if self.core is None:
            raise SpecError(self.label, "core", "no spec file has a [core] table (the core API the shims call)")
        self.families.sort(key=lambda f: (not f.export, f.file))   # exported families first
        self._resolve_core()
        # Family structs first, version by version, so a layout error names the
        # earliest version it affects; shared structs come as tables need them.
        for sf in self.structs:
            if sf.family is not None:
                for v in sf.family.versions:
                    if active(sf.since, sf.until, v):
                        self._instance(sf, v, sf.node, "c_name")
        for fam in self.families:
            for v in fam.versions:
                fam.tables[v] = self._table(fam, v)
            self._check_fills(fam)
        for sf in self.structs:
            if not sf.versioned and sf.c_name not in self.instances:
                self._instance(sf, None, sf.node, "c_name")
        self._find_aliases()

    def _load_file(self, doc):
        doc.keys({"about", "header", "constant", "enum", "callback", "struct", "family", "table", "core"})
        doc.get("about", str)
        fam = self._family(doc.child("family")) if doc.has("family") else None
        header = doc.get("header", str)
        if fam is None and any(doc.has(k) for k in ("constant", "enum", "callback", "struct")) and not header:
            raise doc.error("a shared spec file needs 'header': the generated header its types go to")
        if fam is not None:
            if header:
                raise doc.error("a family file renders one header per version; give [family].header instead", "header")
            for k in ("constant", "enum", "callback"):
                if doc.has(k):
                    raise doc.error(f"{k}s belong in a shared spec file (one without [family])", k)
            if not doc.has("table"):
                raise doc.error("a family file needs a [table] of function slots")
            self._table_def(fam, doc.child("table"))
        elif doc.has("table"):
            raise doc.error("[table] needs a [family] in the same file", "table")
        if header:
            self.shared_headers[header] = doc.file
        if doc.has("constant"):
            for name, node in doc.child("constant").items():
                self._constant(name, node)
        if doc.has("enum"):
            for name, node in doc.child("enum").items():
                self._enum(name, node)
        if doc.has("callback"):
            for name, node in doc.child("callback").items():
                self._callback(name, node)
        if doc.has("struct"):
            for key, node in doc.child("struct").items():
                self._struct_family(key, node, fam, header)
        if doc.has("core"):
            if self.core is not None:
                raise doc.error(f"[core] is already given in {self.core.file}", "core")
            self._core(doc.child("core"))

    def _unique(self, name, node, what):
        if not IDENT.match(name):
            raise node.error(f"'{name}' is not a C identifier")
        for reg in (self.constants, self.enums, self.callbacks):
            if name in reg:
                raise node.error(f"{what} '{name}' is already defined in {reg[name].file}")

    def _constant(self, name, node):
        self._unique(name, node, "constant")
        if isinstance(node.data, int) and not isinstance(node.data, bool):
            self.constants[name] = Constant(name, node.data, False, "", None, node.file)
            return
        node.keys({"value", "hex", "doc", "installed"}, {"value"})
        self.constants[name] = Constant(name, node.get("value", int), node.get("hex", bool, False),
                                        node.get("doc", str, ""), node.get("installed", str), node.file)

    def _enum(self, name, node):
        self._unique(name, node, "enum")
        node.keys({"doc", "hex", "installed", "values"}, {"values"})
        installed = node.get("installed", str)
        values, seen = [], set()
        for vn in node.child("values").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
            vn.keys({"name", "value", "doc", "installed"}, {"name", "value"})
            vname = vn.get("name", str)
            if vname in seen or vname in self.constants:
                raise vn.error(f"enum value '{vname}' is defined twice", "name")
            seen.add(vname)
            inst = vn.get("installed", (str, bool), installed)
            values.append(EnumValue(vname, vn.get("value", int), vn.get("doc", str, ""),
                                    inst if isinstance(inst, str) else None))
        self.enums[name] = Enum(name, node.get("doc", str, ""), node.get("hex", bool, False), values, node.file)
        self.types[name] = TypeInfo(name, "enum", *ctypes.ENUM, range=ctypes.ENUM_RANGE,
                                    limits=("INT_MIN", "INT_MAX"))

    def _callback(self, name, node):
        self._unique(name, node, "callback")
        node.keys({"doc", "returns", "args", "variadic"}, {"returns", "args"})
        args = []
        for an in node.child("args").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
            an.keys({"name", "type"}, {"name", "type"})
            args.append((an.get("name", str), an.get("type", str)))
        self.callbacks[name] = Callback(name, node.get("doc", str, ""), node.get("returns", str), args,
                                        node.get("variadic", bool, False), node.file, node)
        self.types[name] = TypeInfo(name, "funcptr", *ctypes.POINTER)

    def _struct_family(self, key, node, fam, header):
        node.keys({"c_name", "doc", "since", "until", "fields", "layout", "core", "null_value", "installed", "union",
                   "partial"},
                  {"c_name", "fields", "layout"})
        since, until = read_since_until(node)
        c_name = node.get("c_name", str)
        sf = StructFamily(key, c_name, node.get("doc", str, ""), since, until, [], None,
                          node.get("core", str), node.get("null_value", str), node.file, node, fam, header,
                          installed=node.get("installed", str), union=node.get("union", bool, False),
                          partial=node.get("partial", str))
        if sf.union and sf.core is not None:
            raise node.error("a union has no core conversion (convert the struct that holds it, member by member)",
                             "core")
        if sf.versioned:
            sf.pattern = re.compile("^" + re.escape(c_name).replace(r"\{v\}", r"(\d+)") + "$")
        elif since is not None or until is not None:
            raise node.error("since/until need a versioned c_name (one with {v})")
        for other in self.structs:
            if other.c_name == c_name:
                raise node.error(f"c_name '{c_name}' is already used by struct '{other.key}' in {other.file}", "c_name")
        seen = set()
        for fn in node.child("fields").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
            fdef = self._field(fn)
            sf.fields.append(fdef)
            seen.add(fdef.name)
        if sf.versioned:
            lay = node.child("layout")
            if not lay.is_table():
                raise lay.error("expected a table of version ranges to layout records")
            sf.layout = VMap.parse(node, "layout", lambda val, n, k: None)
        else:
            sf.layout = node.child("layout")
        self.structs.append(sf)

    def _field(self, fn):
        fn.keys({"name", "type", "since", "until", "conv", "core", "count", "value", "expr", "doc"}, {"name", "type"})
        since, until = read_since_until(fn)
        name = fn.get("name", str)
        if not IDENT.match(name):
            raise fn.error(f"'{name}' is not a C identifier", "name")
        conv = VMap.parse(fn, "conv", choice_check(FIELD_CONVS)) if fn.has("conv") else None
        return FieldDef(name, since, until, VMap.parse(fn, "type", string_check), conv, fn.get("core", str),
                        fn.get("count", str), _str_or_int(fn, "value"), fn.get("expr", str), fn.get("doc", str, ""), fn)

    def _family(self, node):
        node.keys({"name", "title", "versions", "table", "symbol", "header", "export", "plugin_name",
                   "handle_size", "releases", "status", "doc", "api", "library", "not_described"},
                  {"name", "title", "versions", "table", "symbol", "header", "releases"})
        versions = node.get("versions", list)
        if not versions or any(not isinstance(v, int) or isinstance(v, bool) for v in versions):
            raise node.error("expected a non-empty list of version numbers", "versions")
        if sorted(set(versions)) != versions:
            raise node.error("versions must be increasing and unique", "versions")
        for key in ("table", "symbol", "header"):
            if "{v}" not in node.get(key, str):
                raise node.error(f"'{node.data[key]}' must contain {{v}} (the version number)", key)
        releases = {}
        rel = node.child("releases")
        rel.keys({str(v) for v in versions})
        for v in versions:
            if str(v) not in rel.data:
                raise rel.error(f"no NCCL releases given for version {v}")
            releases[v] = rel.get(str(v), str)
        export = node.get("export", (bool, list), False)
        if isinstance(export, list):
            if not export or any(v not in versions for v in export):
                raise node.error(f"export lists versions the family does not describe (have: {versions})", "export")
            exported = set(export)
        else:
            exported = set(versions) if export else set()
        def handle_check(value, n, k):
            if not isinstance(value, (int, str)) or isinstance(value, bool):
                raise n.error("expected a byte count or a constant's name", k)
        handle = VMap.parse(node, "handle_size", handle_check) if node.has("handle_size") else None
        fam = Family(node.get("name", str), node.get("title", str), versions, node.get("table", str),
                     node.get("symbol", str), node.get("header", str), bool(exported), node.get("plugin_name", str, ""),
                     None, releases, node.get("status", str, "exported" if exported == set(versions) else ""),
                     node.get("doc", str, ""), node.file, node)
        fam.export_versions = exported
        fam.not_described = self._not_described(node, versions)
        if exported and not fam.plugin_name:
            raise node.error("an exported family needs plugin_name (the table's name string)")
        if exported != set(versions) and not fam.status:
            raise node.error("a family with versions that are not exported needs 'status' saying why")
        fam._handle = handle
        fam.api = node.get("api", str, "fab_api")
        fam.library = node.get("library", str, "nccl-net-fabric")
        if not re.fullmatch(r"[a-z][a-z0-9-]*", fam.library):
            raise node.error(f"'{fam.library}' is not a library name (lower case, digits, '-'; built as lib<name>.so)",
                             "library")
        for other in self.families:
            if other.key == fam.key:
                raise node.error(f"family '{fam.key}' is already defined in {other.file}", "name")
            if other.library == fam.library:
                mine = {fam.symbol.replace("{v}", str(v)) for v in fam.export_versions}
                clash = sorted(mine & {other.symbol.replace("{v}", str(v)) for v in other.export_versions})
                if clash:
                    raise node.error(f"{', '.join(clash)} would be exported twice from lib{fam.library}.so (also by "
                                     f"family '{other.key}' in {other.file}): give this family a library of its own",
                                     "library")
        self.families.append(fam)
        return fam

    @staticmethod
    def _not_described(node, versions):
        """[(VRange, reason)]: upstream versions the family knowingly leaves out (--check-upstream)."""
        if not node.has("not_described"):
            return []
        nd, out = node.child("not_described"), []
        for key in nd.data:
            r = parse_range(key, nd, key)
            if any(v in r for v in versions):
                raise nd.error(f"'{key}' covers versions the family describes ({versions})", key)
            out.append((r, nd.get(key, str)))
        check_disjoint([(r, r.text) for r, _ in out], nd)
        return out

    def _table_def(self, fam, node):
        node.keys({"doc", "layout", "slot"}, {"layout", "slot"})
        fam.layout = VMap.parse(node, "layout", lambda val, n, k: None)
        for sn in node.child("slot").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
            fam.slots.append(self._slot_def(fam, sn))

    def _slot_def(self, fam, sn):
        sn.keys({"name", "doc", "since", "until", "data", "returns", "args", "core", "fill", "optional"}, {"name"})
        since, until = read_since_until(sn)
        data = sn.get("data", str)
        if data is not None and (sn.has("args") or sn.has("core")):
            raise sn.error("a data slot (like the name string) has no args or core function")
        if data is None and not sn.has("args"):
            raise sn.error("missing required key 'args' (use [] for a function without parameters)")
        args = []
        if sn.has("args"):
            for an in sn.child("args").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
                args.append(self._arg_def(an))
        core = VMap.parse(sn, "core", string_check) if sn.has("core") else None
        fill = {}
        if sn.has("fill"):
            fn = sn.child("fill")
            fn.keys(set(fn.data))
            for k in fn.data:
                fill[k] = _str_or_int(fn, k)
        return SlotDef(sn.get("name", str), since, until, data, sn.get("returns", str, "ncclResult_t"), args, core,
                       fill, sn.get("optional", bool, False), sn.get("doc", str, ""), sn)

    def _arg_def(self, an):
        an.keys({"name", "type", "since", "until", "conv", "to", "count", "max", "value", "doc"}, {"name", "type"})
        since, until = read_since_until(an)
        name = an.get("name", str)
        if not IDENT.match(name):
            raise an.error(f"'{name}' is not a C identifier", "name")
        conv = VMap.parse(an, "conv", choice_check(ARG_CONVS)) if an.has("conv") else None
        return ArgDef(name, since, until, VMap.parse(an, "type", string_check), conv, an.get("to", str),
                      an.get("count", str), _str_or_int(an, "max"), _str_or_int(an, "value"),
                      an.get("doc", str, ""), an)

    def _core(self, node):
        node.keys({"header", "constants", "types", "struct", "function", "api"},
                  {"header", "types", "struct", "function", "api"})
        consts = {}
        if node.has("constants"):
            cn = node.child("constants")
            for k in cn.data:
                consts[k] = cn.get(k, int)
        types = {}
        tn = node.child("types")
        for k in tn.data:
            kind = tn.get(k, str)
            if kind not in ("enum", "opaque", "funcptr"):
                raise tn.error(f"'{kind}' is not one of: enum, funcptr, opaque", k)
            types[k] = kind
        self.core = Core(node.get("header", str), consts, types, {}, {}, [], node.file, node)

    def _resolve_core(self):
        core, node = self.core, self.core.node
        for name, kind in core.types.items():
            size = ctypes.ENUM if kind == "enum" else ctypes.POINTER
            self.types[name] = TypeInfo(name, kind, *size, range=ctypes.ENUM_RANGE if kind == "enum" else None,
                                        limits=("INT_MIN", "INT_MAX") if kind == "enum" else None)
        sn = node.child("struct")
        for name in sn.data:
            self.types[name] = TypeInfo(name, "struct", struct=CoreStruct(name))
        for name, st in sn.items():
            st.keys({"fields"}, {"fields"})
            cs = self.types[name].struct
            for fn in st.child("fields").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
                fn.keys({"name", "type", "absent"}, {"name", "type"})
                t = self.resolve(fn.get("type", str), None, fn, "type", core=True)
                cs.fields.append(CoreField(fn.get("name", str), t, fn.get("absent", str), fn))
            core.structs[name] = cs
        for name, fnode in node.child("function").items():
            fnode.keys({"returns", "args"}, {"args"})
            ret = self.resolve(fnode.get("returns", str, "fab_result"), None, fnode, "returns", core=True, ret=True)
            args = []
            for an in fnode.child("args").elements(lambda i, v: v.get("name") if isinstance(v, dict) else None):
                an.keys({"name", "type"}, {"name", "type"})
                args.append((an.get("name", str), self.resolve(an.get("type", str), None, an, "type", core=True)))
            core.functions[name] = CoreFunction(name, ret, args, fnode)
        for an in node.child("api").elements(lambda i, v: v.get("member") if isinstance(v, dict) else None):
            an.keys({"member", "core", "fallback", "after_fallback", "absent", "api"}, {"member", "core"})
            fallback = an.get("fallback", (str, list), ())
            fallback = (fallback,) if isinstance(fallback, str) else tuple(fallback)
            m = ApiMember(an.get("member", str), an.get("core", str), fallback,
                          an.get("after_fallback", str), an.get("absent", str), an, an.get("api", str, "fab_api"))
            for k, fns in (("core", (m.core,)), ("fallback", m.fallback)):
                for fn in fns:
                    if not isinstance(fn, str) or fn not in core.functions:
                        raise an.error(f"'{fn}' is not a function of [core.function]", k)
            if m.absent not in (None, "null", "ok"):
                raise an.error(f"'{m.absent}' is not one of: null, ok", "absent")
            core.api.append(m)
        apis = {m.api for m in core.api}
        for fam in self.families:
            if fam.export and fam.api not in apis:
                raise fam.node.error(f"no [[core.api]] member belongs to '{fam.api}': its drivers would be empty", "api")
            fam.handle_sizes = {}
            if fam._handle is None:
                if fam.export:
                    raise fam.node.error("an exported family needs handle_size (the bytes of its connection handle)")
                fam.handle_size = None
                continue
            for v in fam.versions:
                h = fam._handle.at(v, "handle_size")
                if isinstance(h, str):
                    if h not in self.constants:
                        raise fam.node.error(f"unknown constant '{h}'", "handle_size")
                    h = self.constants[h].value
                fam.handle_sizes[v] = h
            fam.handle_size = fam.handle_sizes[fam.versions[-1]]

    # ---- types -------------------------------------------------------------

    def resolve(self, text, v, node, key, core=False, ret=False):
        """Resolves a type string used at version v (None: unversioned)."""
        if "{v}" in text:
            if v is None:
                raise node.error(f"'{text}' uses {{v}} outside a versioned definition", key)
            text = text.replace("{v}", str(v))
        ref = ctypes.parse_type(text)
        if ref is None:
            raise node.error(f"'{text}' is not a C type", key)
        info = self._lookup(ref.base, node, key, core)
        if info.kind == "void" and ref.ptr == 0 and not (ret and ref.array is None):
            raise node.error("void is only valid behind a pointer or as a return type", key)
        if info.kind == "opaque" and ref.ptr == 0:
            raise node.error(f"'{ref.base}' is opaque: use a pointer to it", key)
        length = None
        if ref.array not in (None, ""):
            length = self._array_length(ref.array, node, key, core)
        return CType(ref, info, length)

    def _array_length(self, text, node, key, core):
        if text.isdigit():
            return int(text)
        if text in self.constants:
            return self.constants[text].value
        if core and text in self.core.constants:
            return self.core.constants[text]
        raise node.error(f"unknown constant '{text}' as array length", key)

    def _lookup(self, base, node, key, core):
        info = self.types.get(base)
        if info is not None:
            if not core and self._is_core_type(base):
                raise node.error(f"'{base}' is a core type; ABI specs use NCCL's types", key)
            return info
        for sf in self.structs:
            if sf.versioned:
                m = sf.pattern.match(base)
                if m:
                    return self._struct_info(self._instance(sf, int(m.group(1)), node, key))
            elif sf.c_name == base:
                return self._struct_info(self._instance(sf, None, node, key))
        raise node.error(f"unknown type '{base}'", key)

    def _is_core_type(self, name):
        return self.core is not None and (name in self.core.types or name in self.core.node.data.get("struct", {}))

    @staticmethod
    def _struct_info(inst):
        return TypeInfo(inst.c_name, "struct", inst.size, inst.align, struct=inst, header=inst.header)

    def _instance(self, sf, v, node, key):
        c_name = sf.c_name.replace("{v}", str(v)) if v is not None else sf.c_name
        inst = self.instances.get(c_name)
        if inst is not None:
            if not inst.done:
                raise node.error(f"struct {c_name} contains itself", key)
            return inst
        if v is not None and not active(sf.since, sf.until, v):
            raise node.error(f"{c_name}: struct '{sf.key}' ({sf.file}) does not exist in version {v}", key)
        if sf.family is not None:
            if v not in sf.family.versions:
                raise node.error(f"{c_name}: family '{sf.family.key}' has no version {v}", key)
            header = sf.family.header_for(v)
        else:
            header = sf.header
        inst = StructInst(sf, v, c_name, header)
        self.instances[c_name] = inst
        names = {}
        for fd in sf.fields:
            if v is not None and not active(fd.since, fd.until, v):
                continue
            if v is None and (fd.since is not None or fd.until is not None):
                raise fd.node.error("since/until need a versioned struct")
            if fd.name in names:
                raise fd.node.error(f"duplicate field '{fd.name}' in {c_name} (also {names[fd.name]})", "name")
            names[fd.name] = fd.node.path
            t = self.resolve(fd.type.at(v, "type"), v, fd.node, "type")
            if t.ref.array == "":
                raise fd.node.error("a struct field array needs a length", "type")
            inst.fields.append((fd, fd.name, t))
        layout = ctypes.union_layout if sf.union else ctypes.struct_layout
        inst.size, inst.align, inst.offsets = layout([(n, t.size, t.align) for _, n, t in inst.fields])
        inst.done = True
        self._check_struct_layout(sf, inst, v)
        return inst

    # ---- layouts -----------------------------------------------------------

    def _check_struct_layout(self, sf, inst, v):
        if sf.versioned:
            rec = None
            for r, val in sf.layout.entries:
                if v in r:
                    rec = sf.layout.node.child(r.text)
            if rec is None:
                raise sf.node.error(f"no recorded layout for {inst.c_name}: add layout.\"{v}\" with its size and "
                                    "field offsets (from NCCL's header of that version)", "layout")
        else:
            rec = sf.layout
        rec.keys({"size", "align", "offsets"}, {"size", "offsets"})
        where = f"{inst.c_name}"
        offs = rec.child("offsets")
        offs.keys(set(offs.data))
        for name in offs.data:
            if name not in inst.offsets:
                raise offs.error(f"{where} has no field '{name}' in this version", name)
        for _, name, t in inst.fields:
            if name not in offs.data:
                raise offs.error(f"{where}: field '{name}' has no recorded offset")
            want = offs.get(name, int)
            if inst.offsets[name] != want:
                raise offs.error(f"layout mismatch in {where}: field '{name}' is at offset {inst.offsets[name]} by "
                                 f"the field list but recorded at {want}; check the order and types of the fields",
                                 name)
        size = rec.get("size", int)
        if size != inst.size:
            raise rec.error(f"layout mismatch in {where}: computed size {inst.size}, recorded {size}", "size")
        align = rec.get("align", int)
        if align is not None and align != inst.align:
            raise rec.error(f"layout mismatch in {where}: computed alignment {inst.align}, recorded {align}", "align")

    def _find_aliases(self):
        """Identical consecutive versions of a shared struct become typedefs of the first."""
        for sf in self.structs:
            if not sf.versioned or sf.family is not None:
                continue
            insts = sorted((i for i in self.instances.values() if i.family is sf), key=lambda i: i.version)
            for prev, cur in zip(insts, insts[1:]):
                if self._shape(prev) == self._shape(cur):
                    cur.alias_of = prev.alias_of or prev.c_name

    def _shape(self, inst):
        """Field names and types, with struct types replaced by the struct they alias."""
        def canon(t):
            s = t.struct
            return (s.alias_of or s.c_name) if s is not None and t.is_scalar_value else t.spelling
        return [(n, canon(t), t.ref.array) for _, n, t in inst.fields]

    # ---- tables ------------------------------------------------------------

    def _table(self, fam, v):
        c_name = fam.table.replace("{v}", str(v))
        slots, seen = [], {}
        for sd in fam.slots:
            if not active(sd.since, sd.until, v):
                continue
            if sd.name in seen:
                raise sd.node.error(f"duplicate slot '{sd.name}' in {c_name} (version {v}; also {seen[sd.name]})",
                                    "name")
            seen[sd.name] = sd.node.path
            slots.append(self._slot(fam, sd, v, len(slots)))
        table = TableInst(fam, v, c_name, fam.symbol.replace("{v}", str(v)), fam.header_for(v), slots, 8 * len(slots))
        self._check_table_layout(fam, table)
        return table

    def _slot(self, fam, sd, v, index):
        if sd.data is not None:
            return SlotInst(sd, sd.name, index, self.resolve(sd.data, v, sd.node, "data"), None, [], None)
        ret = self.resolve(sd.returns, v, sd.node, "returns", ret=True)
        args, names = [], {}
        for ad in sd.args:
            if not active(ad.since, ad.until, v):
                continue
            if ad.name in names:
                raise ad.node.error(f"duplicate argument '{ad.name}' in {sd.name} (version {v})", "name")
            names[ad.name] = ad
            t = self.resolve(ad.type.at(v, "type"), v, ad.node, "type")
            if t.is_array:
                raise ad.node.error("a parameter array has no length: write 'T*' or 'T[]'", "type")
            conv = ad.conv.at(v, "conversion") if ad.conv else None
            args.append(ArgInst(ad, ad.name, t, conv, ad.node))
        core = None
        exported = v in fam.export_versions
        if sd.core is not None and (exported or any(r is None or v in r for r, _ in sd.core.entries)):
            name = sd.core.at(v, "core function")
            if name == "null":
                core = "null"
            elif name not in self.core.functions:
                raise sd.node.error(f"'{name}' is not a function of [core.function] (or \"null\")", "core")
            else:
                core = self.core.functions[name]
        elif exported:
            raise sd.node.error(f"missing conversion: slot '{sd.name}' of exported {fam.table.replace('{v}', str(v))} "
                                "names no core function (core = \"fab_...\" or \"null\")")
        return SlotInst(sd, sd.name, index, None, ret, args, core)

    def _check_fills(self, fam):
        """Every fill key must name a parameter of the slot's core function in some version."""
        for sd in fam.slots:
            params = set()
            for table in fam.tables.values():
                s = table.slot(sd.name)
                if s is not None and s.defn is sd and s.core not in (None, "null"):
                    params |= {n for n, _ in s.core.args}
            for key in sd.fill:
                if key not in params:
                    raise sd.node.error(f"'{key}' is not a parameter of the core function this slot calls "
                                        f"(have: {', '.join(sorted(params)) or 'none'})", f"fill.{key}")

    def _check_table_layout(self, fam, table):
        rec = None
        for r, _ in fam.layout.entries:
            if r is None:
                raise fam.layout.node.error("expected a table of version ranges to layout records")
            if table.version in r:
                rec = fam.layout.node.child(r.text)
        if rec is None:
            raise fam.layout.node.error(f"no recorded layout for {table.c_name}: add \"{table.version}\" = "
                                        "{ size = ..., slots = [...] } (from NCCL's header of that version)")
        rec.keys({"size", "slots"}, {"size", "slots"})
        want = rec.get("slots", list)
        got = [s.name for s in table.slots]
        for i in range(max(len(want), len(got))):
            w = want[i] if i < len(want) else None
            g = got[i] if i < len(got) else None
            if w != g:
                raise rec.error(f"layout mismatch in {table.c_name}: slot {i} (offset {8 * i}) is "
                                f"{_q(g)} by the slot list but recorded as {_q(w)}", "slots")
        size = rec.get("size", int)
        if size != table.size:
            raise rec.error(f"layout mismatch in {table.c_name}: {len(got)} slots make {table.size} bytes, "
                            f"recorded {size}", "size")

    # ---- queries -------------------------------------------------------------

    def family(self, key):
        return next(f for f in self.families if f.key == key)

    def shared_instances(self, header):
        return sorted((i for i in self.instances.values() if i.header == header and i.family.family is None),
                      key=lambda i: (self.structs.index(i.family), i.version or 0))

    def family_instances(self, fam, v):
        return sorted((i for i in self.instances.values() if i.family.family is fam and i.version == v),
                      key=lambda i: self.structs.index(i.family))


def _q(name):
    return f"'{name}'" if name is not None else "nothing"


def _str_or_int(node, key):
    v = node.get(key, (str, int))
    return str(v) if isinstance(v, int) else v
