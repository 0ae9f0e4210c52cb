"""Shim and driver functions for one version's table, from its slot arguments.

A shim is `static ncclResult_t net_v8_isend(<NCCL's parameters>)`: convert each
argument as the spec says, call the core function, convert results back.
A driver is `static fab_result drv_isend(<core parameters>)`: the inverse, used
by tests and the benchmark to call the plugin exactly as that NCCL version would.
"""

from .convert import DRIVER_ARRAY_MAX, CFunction, Sink, StructConv, cast, checks, copy_problem, numeric_problem

STRUCT_CONVS = ("struct_in", "struct_out")
ARRAY_CONVS = ("widen_array", "narrow_array")
ONE_CONVS = ("one", "widen_one")  # a scalar that the core takes as an array of one


def _bad(a, message, key="conv"):
    return a.node.error(message, key)


def _slot_where(table, slot):
    return f"{table.c_name}.{slot.name} (version {table.version})"


def _bind(spec, table, slot):
    """[(ArgInst, core parameter name, core CType)] for the arguments passed on."""
    fn, out, seen = slot.core, [], {}
    for a in slot.args:
        if a.conv is None:
            raise a.node.error(f"missing conversion: argument '{a.name}' of {_slot_where(table, slot)} has no conv")
        if a.conv == "ignore":
            continue
        to = a.defn.to
        if to is None:
            raise a.node.error(f"conv = \"{a.conv}\" needs to = <parameter of {fn.name}>")
        core_t = fn.arg(to)
        if core_t is None:
            raise a.node.error(f"'{to}' is not a parameter of {fn.name}({', '.join(n for n, _ in fn.args)})", "to")
        if to in seen:
            raise a.node.error(f"arguments '{seen[to]}' and '{a.name}' both bind {fn.name}'s '{to}'", "to")
        seen[to] = a.name
        _check_arg(spec, table, slot, a, core_t)
        out.append((a, to, core_t))
    return out


def _check_arg(spec, table, slot, a, core_t):
    t, conv = a.type, a.conv
    problem = None
    if conv == "copy":
        problem = copy_problem(t, core_t)
    elif conv in ("widen", "narrow"):
        problem = numeric_problem(conv, t, core_t)
    elif conv in ARRAY_CONVS:
        if not (t.is_pointer and core_t.is_pointer):
            problem = f"{conv} needs pointers on both sides"
        else:
            problem = numeric_problem(conv.split("_")[0], t.element(), core_t.element())
        if problem is None and (a.defn.count is None or slot.arg(a.defn.count) is None):
            raise _bad(a, f"{conv} needs count = <argument holding the element count>", "count")
        if problem is None and a.defn.max is None:
            raise _bad(a, f"{conv} needs max = <C constant bounding count>", "max")
    elif conv in ONE_CONVS:
        if not core_t.is_pointer:
            problem = f"{conv} needs a pointer on the core side (an array of one element)"
        elif conv == "one":
            problem = copy_problem(t, core_t.element())
        else:
            problem = numeric_problem("widen", t, core_t.element())
    elif conv in STRUCT_CONVS:
        if t.ref.ptr != 1 or t.struct is None or core_t.ref.ptr != 1 or core_t.struct is None:
            problem = f"{conv} needs struct pointers on both sides ({t.spelling} vs {core_t.spelling})"
        else:
            StructConv(spec, t.struct, core_t.struct, a.node).rules()
    if problem:
        raise _bad(a, problem)


# ---- shims ------------------------------------------------------------------------------


def shim_function(spec, table, slot):
    fam, fn = table.family, slot.core
    ret = slot.returns.spelling
    sink = Sink("shim", f"{table.symbol}.{slot.name}", ret)
    pre, post, exprs = [], [], {}
    for a, to, core_t in _bind(spec, table, slot):
        exprs[to] = _shim_arg(spec, slot, a, core_t, sink, pre, post)
    args = []
    for p, _ in fn.args:
        if p in exprs:
            args.append(exprs[p])
        elif p in slot.defn.fill:
            args.append(slot.defn.fill[p])
        else:
            raise slot.defn.node.error(f"missing conversion: {fn.name}'s parameter '{p}' gets no value in "
                                       f"{_slot_where(table, slot)}: bind an argument to it (to = \"{p}\") "
                                       f"or give fill.{p}")
    call = f"{fn.name}({', '.join(args)})"
    if post:
        body = pre + [f"fab_result rc = {call};", f"if (rc != FAB_OK) return ({ret})rc;"] + post + \
               [f"return ({ret})FAB_OK;"]
    else:
        body = pre + [f"return ({ret}){call};"]
    params = [a.type.decl(a.name) for a in slot.args] or ["void"]
    return CFunction(f"{fam.key}_v{table.version}_{slot.name}", ret, params, body, slot.name)


def _shim_arg(spec, slot, a, core_t, sink, pre, post):
    n, t, conv = a.name, a.type, a.conv
    if conv == "copy":
        return cast(n, t, core_t)
    if conv in ("widen", "narrow"):
        for c, e in checks(t, core_t, n):
            pre += sink.guard(c, n, n, e)
        return cast(n, t, core_t)
    if conv in ONE_CONVS:
        elem = core_t.element().ref.without_const()
        if conv == "widen_one":
            for c, e in checks(t, core_t.element(), n):
                pre += sink.guard(c, n, n, e)
        pre += [f"{elem.spelling} {n}_one[1] = {{({elem.spelling}){n}}};"]
        return f"{n}_one"
    if conv in ARRAY_CONVS:
        count, cap = a.defn.count, a.defn.max
        elem_core, elem_abi = core_t.element().ref.without_const(), t.element()
        value = spec.core.constants.get(cap, spec.constants[cap].value if cap in spec.constants else None)
        bound = f"0..{value} ({cap})" if value is not None and not cap.isdigit() else f"0..{cap}"
        pre += [f"{elem_core.spelling} {n}_core[{cap}];", f"if ({n} != NULL) {{"]
        pre += ["  " + ln for ln in sink.guard(f"{count} < 0 || {count} > {cap}", count, count, bound)]
        pre += [f"  for (int i = 0; i < {count}; i++) {{"]
        for c, e in checks(elem_abi, core_t.element(), f"{n}[i]"):
            pre += ["    " + ln for ln in sink.guard(c, n + "[]", n + "[i]", e)]
        pre += [f"    {n}_core[i] = ({elem_core.spelling}){n}[i];", "  }", "}"]
        return f"{n} != NULL ? {n}_core : NULL"
    conv_s = StructConv(spec, t.struct, core_t.struct, a.node)
    core_name = core_t.struct.name
    if conv == "struct_in":
        pre += [f"{core_name} {n}_core;", f"const {core_name}* {n}_in = NULL;", f"if ({n} != NULL) {{",
                f"  memset(&{n}_core, 0, sizeof {n}_core);"]
        pre += ["  " + line for line in conv_s.to_core(f"{n}->", f"{n}_core.", sink, f"{n}.")]
        pre += [f"  {n}_in = &{n}_core;", "}"]
        return f"{n}_in"
    # struct_out
    pre += sink.guard(f"{n} == NULL", n, "0", "a non-NULL pointer")
    pre += [f"{core_name} {n}_core;", f"memset(&{n}_core, 0, sizeof {n}_core);"]
    post += [f"memset({n}, 0, sizeof *{n});"] + conv_s.to_abi(f"{n}_core.", f"{n}->", sink, label=f"{n}.")
    return f"&{n}_core"


# ---- drivers --------------------------------------------------------------------------------


def driver_slot(table, member):
    """(slot, mode) driving a fab_api member in this table; mode is direct or fallback."""
    for mode, fn in [("direct", member.core)] + [("fallback", f) for f in member.fallback]:
        for s in table.slots:
            if s.core not in (None, "null") and s.core.name == fn:
                return s, mode
    return None, None


def driver_function(spec, table, member):
    """A CFunction, "null" (member stays NULL) or raises when nothing drives it."""
    api_fn = spec.core.functions[member.core]
    slot, mode = driver_slot(table, member)
    params = [t.decl(n) for n, t in api_fn.args]
    name = f"drv_{member.member}"
    if slot is None:
        if member.absent == "null":
            return "null"
        if member.absent == "ok":
            return CFunction(name, "fab_result", params, ["return FAB_OK;"])
        raise member.node.error(f"{table.c_name} has no slot calling {member.core} and fab_api.{member.member} "
                                "has no absent rule")
    sink = Sink("driver", "", "fab_result")
    pre, post, exprs = [], [], []
    bound = {to: (a, core_t) for a, to, core_t in _bind(spec, table, slot)}
    for a in slot.args:
        if a.conv == "ignore":
            if a.defn.value is None:
                raise a.node.error("conv = \"ignore\" needs value = <what a driver passes>")
            exprs.append(a.defn.value)
            continue
        to = a.defn.to
        api_t = api_fn.arg(to)
        if api_t is None or api_t.spelling != bound[to][1].spelling:
            raise a.node.error(f"fab_api.{member.member} ({api_fn.name}) has no parameter '{to}' of type "
                               f"{bound[to][1].spelling} to drive {slot.name} with", "to")
        exprs.append(_driver_arg(spec, slot, a, to, api_t, sink, pre, post))
    call = f"tbl->{slot.name}({', '.join(exprs)})"
    after = [member.after_fallback] if mode == "fallback" and member.after_fallback else []
    if post or after:
        body = pre + [f"fab_result rc = (fab_result){call};", "if (rc != FAB_OK) return rc;"] + post + after + \
               ["return FAB_OK;"]
    else:
        body = pre + [f"return (fab_result){call};"]
    return CFunction(name, "fab_result", params, body, slot.name)


def _driver_arg(spec, slot, a, p, api_t, sink, pre, post):
    n, t, conv = a.name, a.type, a.conv
    if conv == "copy":
        return cast(p, api_t, t)
    if conv in ("widen", "narrow"):
        return f"({t.spelling}){p}"
    if conv in ONE_CONVS:  # the core's first element (the version has room for one)
        return f"{p} != NULL ? ({t.spelling}){p}[0] : ({t.spelling})0"
    if conv in ARRAY_CONVS:
        count = slot.arg(a.defn.count).defn.to
        elem = t.element().ref.without_const().spelling
        clamp = f"{count} < 0 ? 0 : {count} > {DRIVER_ARRAY_MAX} ? {DRIVER_ARRAY_MAX} : {count}"
        pre += [f"{elem} {n}_abi[{DRIVER_ARRAY_MAX}];",
                f"if ({p} != NULL) {{",
                f"  int count = {clamp};",
                f"  for (int i = 0; i < count; i++) {n}_abi[i] = ({elem}){p}[i];",
                "}"]
        return f"{p} != NULL ? {n}_abi : NULL"
    conv_s = StructConv(spec, t.struct, api_t.struct, a.node)
    abi_name = t.struct.c_name
    if conv == "struct_in":
        null_value = t.struct.family.null_value
        pre += [f"{abi_name} {n}_abi;", f"{abi_name}* {n}_arg = &{n}_abi;", f"if ({p} != NULL) {{",
                f"  memset(&{n}_abi, 0, sizeof {n}_abi);"]
        pre += ["  " + line for line in conv_s.to_abi(f"{p}->", f"{n}_abi.", sink, clamp_arrays=True)]
        # NCCL never passes NULL where the version has a null_value (a config): mirror that.
        pre += ["} else {", f"  {n}_abi = ({abi_name}){null_value};" if null_value else f"  {n}_arg = NULL;", "}"]
        return f"{n}_arg"
    # struct_out
    pre += [f"{abi_name} {n}_abi;", f"memset(&{n}_abi, 0, sizeof {n}_abi);"]
    post += [f"if ({p} != NULL) {{"] + ["  " + line for line in conv_s.to_core(f"{n}_abi.", f"{p}->", sink)] + ["}"]
    return f"{p} != NULL ? &{n}_abi : NULL"


# ---- facts for the registry and the loader test ---------------------------------------------------


def size_is_int(table):
    """1 when isend takes an int size (what fab_api.size_is_int reports)."""
    for s in table.slots:
        if s.core not in (None, "null") and s.core.name == "fab_isend":
            a = next((a for a in s.args if a.defn.to == "size"), None)
            return int(a is not None and a.type.info.size < 8)
    return 0


def slot_kind(slot):
    if slot.data is not None:
        return "FAB_SLOT_NAME"
    if slot.core == "null":
        if not slot.defn.optional:
            raise slot.defn.node.error(f"NCCL needs '{slot.name}' (it is not optional) but core = \"null\"", "core")
        return "FAB_SLOT_NULL"
    return "FAB_SLOT_OPTIONAL" if slot.defn.optional else "FAB_SLOT_REQUIRED"
