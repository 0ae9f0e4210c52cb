"""Every kind of spec mistake stops the generator with
'<spec file>: <key path>: <what is wrong>' and writes nothing."""

import os
import re
import unittest

from spec_edit import TOP, TempDir, append, copy_specs, edit, run_generator

ISEND_TAG = '{ name = "tag", type = "int", conv = "copy", to = "tag" }'
ISEND_SIZE_TYPE = 'type = { "-8" = "int", "9-" = "size_t" }, conv = { "-8" = "widen", "9-" = "copy" }, to = "size"'


class SpecErrors(unittest.TestCase):
    def generate_broken(self, change):
        """Applies change(spec_dir) to a copy of abi/ and returns the error line."""
        with TempDir() as tmp:
            spec = copy_specs(tmp)
            change(spec)
            out = os.path.join(tmp, "out")
            rc, _, err = run_generator("--spec-dir", spec, "--out-dir", out)
            self.assertEqual(rc, 1, err)
            self.assertFalse(os.path.exists(out), "nothing may be written when a spec is wrong")
            self.assertTrue(err.startswith("error: abi/"), err)
            return err.strip()

    def test_unknown_key(self):
        err = self.generate_broken(lambda d: edit(f"{d}/net.toml", ISEND_TAG, ISEND_TAG[:-2] + ', colour = "red" }'))
        self.assertIn("abi/net.toml: table.slot[isend].args[tag].colour: unknown key 'colour'", err)

    def test_unknown_function_in_a_fallback_list(self):
        err = self.generate_broken(lambda d: edit(f"{d}/core.toml", 'fallback = ["fab_listen_one_rail", "fab_listen_short"]',
                                                  'fallback = ["fab_listen_one_rail", "fab_listen_shrot"]'))
        self.assertIn("abi/core.toml: core.api[listen].fallback: 'fab_listen_shrot' is not a function of [core.function]",
                      err)

    def test_same_symbol_twice_in_one_library(self):
        err = self.generate_broken(lambda d: edit(f"{d}/neuron.toml", 'library = "nccom-net-fabric"\n', ""))
        self.assertIn("ncclNetPlugin_v6 would be exported twice from libnccl-net-fabric.so", err)
        self.assertIn("give this family a library of its own", err)

    def test_one_needs_a_pointer_in_the_core(self):
        err = self.generate_broken(lambda d: edit(
            f"{d}/neuron.toml", '{ name = "size", type = "int", until = 4, conv = "widen_one", to = "sizes" }',
            '{ name = "size", type = "int", until = 4, conv = "widen_one", to = "n" }'))
        self.assertIn("abi/neuron.toml: table.slot[irecv].args[size]", err)
        self.assertIn("widen_one needs a pointer on the core side", err)

    def test_volatile_is_kept(self):
        err = self.generate_broken(lambda d: edit(f"{d}/core.toml", '{ name = "abort_flag", type = "const volatile uint32_t*" }',
                                                  '{ name = "abort_flag", type = "const uint32_t*" }'))
        self.assertIn("abi/rma.toml: table.slot[connect].args[abortFlag]", err)
        self.assertIn("drops volatile", err)

    def test_unknown_key_in_struct_field(self):
        err = self.generate_broken(lambda d: edit(
            f"{d}/common.toml", '{ name = "trafficClass", type = "int", conv = "copy", core = "traffic_class" }',
            '{ name = "trafficClass", type = "int", conv = "copy", core = "traffic_class", sincee = 3 }'))
        self.assertIn("abi/common.toml: struct.ncclNetCommConfig.fields[trafficClass].sincee: unknown key 'sincee'",
                      err)

    def test_missing_conversion(self):
        err = self.generate_broken(lambda d: edit(f"{d}/net.toml", ISEND_TAG, '{ name = "tag", type = "int", to = "tag" }'))
        self.assertIn("abi/net.toml: table.slot[isend].args[tag]: missing conversion: argument 'tag'", err)

    def test_missing_conversion_of_a_struct_field(self):
        err = self.generate_broken(lambda d: edit(
            f"{d}/net.toml", '{ name = "port", type = "int", conv = "copy", core = "port" }',
            '{ name = "port", type = "int", core = "port" }'))
        self.assertIn("abi/net.toml: struct.ncclNetProperties.fields[port]: missing conversion: field 'port'", err)

    def test_core_parameter_left_unbound(self):
        err = self.generate_broken(lambda d: edit(f"{d}/net.toml", 'fill = { phandle = "NULL" }\n', ""))
        self.assertIn("abi/net.toml: table.slot[isend]: missing conversion: fab_isend's parameter 'phandle'", err)

    def test_fill_of_unknown_parameter(self):
        err = self.generate_broken(lambda d: edit(f"{d}/net.toml", 'fill = { phandle = "NULL" }',
                                                  'fill = { phandle = "NULL", pHandle = "NULL" }'))
        self.assertIn("abi/net.toml: table.slot[isend].fill.pHandle: 'pHandle' is not a parameter", err)

    def test_overlapping_version_ranges(self):
        err = self.generate_broken(lambda d: edit(
            f"{d}/net.toml", ISEND_SIZE_TYPE, ISEND_SIZE_TYPE.replace('"9-" = "size_t"', '"8-" = "size_t"')))
        self.assertIn("abi/net.toml: table.slot[isend].args[size].type.8-: overlapping version ranges '-8' and '8-'",
                      err)

    def test_duplicate_slot(self):
        err = self.generate_broken(lambda d: append(f"{d}/net.toml", """
[[table.slot]]
name = "test"
since = 12
core = "fab_test"
args = [{ name = "request", type = "void*", conv = "copy", to = "request" }]
"""))
        self.assertIn("abi/net.toml: table.slot[test].name: duplicate slot 'test' in ncclNet_v12_t", err)

    def test_unknown_type(self):
        err = self.generate_broken(lambda d: edit(
            f"{d}/net.toml", '{ name = "done", type = "int*", conv = "copy", to = "done" }',
            '{ name = "done", type = "integer*", conv = "copy", to = "done" }'))
        self.assertIn("abi/net.toml: table.slot[test].args[done].type: unknown type 'integer'", err)

    def test_swapped_fields_of_the_same_type(self):
        speed = '  { name = "speed", type = "int", conv = "copy", core = "speed_mbps" },\n'
        port = '  { name = "port", type = "int", conv = "copy", core = "port" },\n'
        err = self.generate_broken(lambda d: edit(f"{d}/net.toml", speed + port, port + speed))
        self.assertIn("abi/net.toml: struct.ncclNetProperties.layout.6.offsets.port: layout mismatch in "
                      "ncclNetProperties_v6_t: field 'port' is at offset 28 by the field list but recorded at 32",
                      err)

    def test_swapped_slots(self):
        def swap(d):
            path = f"{d}/net.toml"
            with open(path) as f:
                text = f.read()
            a = text.index('[[table.slot]]\nname = "closeSend"')
            b = text.index('[[table.slot]]\nname = "closeRecv"')
            c = text.index('[[table.slot]]\nname = "closeListen"')
            with open(path, "w") as f:
                f.write(text[:a] + text[b:c] + text[a:b] + text[c:])
        err = self.generate_broken(swap)
        self.assertIn("abi/net.toml: table.layout.6.slots: layout mismatch in ncclNet_v6_t: slot 14 (offset 112) is "
                      "'closeRecv' by the slot list but recorded as 'closeSend'", err)

    def test_wrong_recorded_size(self):
        err = self.generate_broken(lambda d: edit(f"{d}/common.toml", '"12-" = { size = 36,', '"12-" = { size = 40,'))
        self.assertIn("abi/common.toml: struct.ncclNetVDeviceProps.layout.12-.size: layout mismatch in "
                      "ncclNetVDeviceProps_v12_t: computed size 36, recorded 40", err)

    def test_union_size_is_its_largest_member(self):
        err = self.generate_broken(lambda d: edit(f"{d}/profiler.toml", '"5-6" = { size = 88, align = 8, offsets = { '
                                                  'netPlugin = 0, other = 0 } }', '"5-6" = { size = 88, align = 8, '
                                                  'offsets = { netPlugin = 0, other = 16 } }'))
        self.assertIn("abi/profiler.toml: struct.ncclProfilerEventDescrUnion.layout.5-6.offsets.other: layout mismatch "
                      "in ncclProfilerEventDescrUnion_v5_t: field 'other' is at offset 0", err)
        err = self.generate_broken(lambda d: edit(f"{d}/profiler.toml", '"-6" = "uint64_t[11]"',
                                                  '"-6" = "uint64_t[12]"'))
        self.assertIn("ncclProfilerEventDescrUnion_v5_t: computed size 96, recorded 88", err)

    def test_union_has_no_core_conversion(self):
        err = self.generate_broken(lambda d: edit(f"{d}/profiler.toml", 'c_name = "ncclProfilerEventStateArgs_v{v}_t"',
                                                  'c_name = "ncclProfilerEventStateArgs_v{v}_t"\ncore = "fab_properties"'))
        self.assertIn("abi/profiler.toml: struct.ncclProfilerEventStateArgs.core: a union has no core conversion", err)

    def test_exported_family_needs_handle_size(self):
        err = self.generate_broken(lambda d: edit(f"{d}/rma.toml", 'handle_size = "NCCL_GIN_HANDLE_MAXSIZE"\n', ""))
        self.assertIn("abi/rma.toml: family: an exported family needs handle_size", err)

    def test_int_copied_into_size_t_pointer(self):
        err = self.generate_broken(lambda d: edit(
            f"{d}/net.toml", 'conv = { "-8" = "widen_array", "9-" = "copy" }', 'conv = "copy"'))
        self.assertIn("abi/net.toml: table.slot[irecv].args[sizes].conv: copy from int* to const size_t* "
                      "reinterprets the elements; use widen_array", err)

    def test_version_without_layout_record(self):
        err = self.generate_broken(lambda d: edit(f"{d}/net.toml", "versions = [6, 7, 8, 9, 10, 11, 12]",
                                                  "versions = [6, 7, 8, 9, 10, 11, 12, 13]"))
        self.assertIn("abi/net.toml: family.releases: no NCCL releases given for version 13", err)

    def test_bad_parameter_table(self):
        with TempDir() as tmp:
            params = os.path.join(tmp, "params.toml")
            with open(params, "w") as f:
                f.write('prefix = "FABRIC_"\n[[param]]\nname = "X"\ntype = "int"\ndefault = 5\nmax = 4\ndoc = "x"\n')
            rc, _, err = run_generator("--params", params, "--out-dir", os.path.join(tmp, "out"))
            self.assertEqual(rc, 1)
            self.assertIn("params.toml: param[X].default: default 5 is outside min/max", err)

    def test_bad_parameter_choices(self):
        cases = [
            ('type = "int"\ndefault = 1\nchoices = ["a"]', "param[X].choices: choices apply to string parameters only"),
            ('type = "string"\ndefault = "a"\nchoices = ["a", "B"]', "choices must be a non-empty list of lower-case"),
            ('type = "string"\ndefault = "c"\nchoices = ["a", "b"]', "param[X].default: default 'c' is not one of the choices"),
        ]
        for body, want in cases:
            with TempDir() as tmp:
                params = os.path.join(tmp, "params.toml")
                with open(params, "w") as f:
                    f.write('prefix = "FABRIC_"\n[[param]]\nname = "X"\n' + body + '\ndoc = "x"\n')
                rc, _, err = run_generator("--params", params, "--out-dir", os.path.join(tmp, "out"))
                self.assertEqual(rc, 1, body)
                self.assertIn(want, err)


class Check(unittest.TestCase):
    def test_check_detects_stale_and_missing_files(self):
        with TempDir() as tmp:
            out = os.path.join(tmp, "gen")
            rc, _, err = run_generator("--out-dir", out, "--quiet")
            self.assertEqual(rc, 0, err)
            rc, _, err = run_generator("--out-dir", out, "--check")
            self.assertEqual(rc, 0, err)

            shim = os.path.join(out, "shims", "fab_shim_net_v9.c")
            edit(shim, "fab_isend(", "fab_isend (")
            os.remove(os.path.join(out, "abi", "fab_abi_rma_v15.h"))
            with open(os.path.join(out, "abi", "fab_abi_old.h"), "w") as f:
                f.write("/* DO NOT EDIT: generated by codegen/generate.py */\n")
            rc, _, err = run_generator("--out-dir", out, "--check")
            self.assertEqual(rc, 1)
            self.assertIn("fab_shim_net_v9.c: differs from its spec", err)
            self.assertIn("fab_abi_rma_v15.h: missing", err)
            self.assertIn("fab_abi_old.h: no longer generated", err)
            self.assertIn("3 generated file(s) are stale. Refresh with: python3 codegen/generate.py", err)

            rc, _, err = run_generator("--out-dir", out, "--quiet")
            self.assertEqual(rc, 0, err)
            self.assertFalse(os.path.exists(os.path.join(out, "abi", "fab_abi_old.h")))
            rc, _, err = run_generator("--out-dir", out, "--check")
            self.assertEqual(rc, 0, err)

    def test_checked_in_tree_is_fresh(self):
        rc, _, err = run_generator("--check")
        self.assertEqual(rc, 0, err)


class PackageDoc(unittest.TestCase):
    def test_module_list_names_every_module(self):
        """fabgen/__init__.py's docstring lists each module of the package once."""
        pkg = os.path.join(TOP, "codegen", "fabgen")
        modules = sorted(f[:-3] for f in os.listdir(pkg) if f.endswith(".py") and f != "__init__.py")
        with open(os.path.join(pkg, "__init__.py")) as f:
            doc = f.read().split("Modules,", 1)[1]
        listed = re.findall(r"^  (\w+) ", doc, re.M)
        self.assertEqual(sorted(listed), modules)


if __name__ == "__main__":
    unittest.main()
