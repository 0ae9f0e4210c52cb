"""generate.py --check-upstream and --import against header fixtures written
here in NCCL's shape (tests/codegen/upstream_fixture): the specs match them,
and each kind of difference is reported with the line in the spec and in the
header."""

import os
import re
import shutil
import unittest

from spec_edit import TOP, TempDir, copy_specs, edit, run_generator

FIXTURE = os.path.join(TOP, "tests", "codegen", "upstream_fixture")
OPT_FLAGS = '{ name = "optFlags", type = "uint32_t", since = 15, conv = "copy", to = "opt_flags" }'


def copy_fixture(tmp):
    dst = os.path.join(tmp, "plugin")
    shutil.copytree(FIXTURE, dst)
    return dst


class CheckUpstream(unittest.TestCase):
    def check(self, spec=None, headers=FIXTURE, ignore=("rma:90", "profiler:90")):
        args = ["--check-upstream", headers] + (["--spec-dir", spec] if spec else [])
        for i in ignore:
            args += ["--ignore", i]
        return run_generator(*args)

    def test_specs_match_the_fixture(self):
        rc, out, err = self.check()
        self.assertEqual(rc, 0, err)
        self.assertIn("0 difference(s)", out)
        self.assertIn("rma: v13, v17 described here, not in", out, "what the headers lack is a note, not a difference")
        self.assertIn("rma v90: in upstream", out)
        self.assertIn("not described (--ignore)", out)
        self.assertIn("net: no ncclNet_vN_t in", out, "a family the headers do not have is a note")

    def test_a_version_upstream_has_and_the_specs_lack(self):
        rc, _, err = self.check(ignore=("profiler:90",))
        self.assertEqual(rc, 1)
        self.assert_difference(err, "abi/rma.toml", "rma/rma_v90.h", "rma v90 is not described here",
                               "--import DIR --family rma --version 90", "--ignore rma:90")
        rc, _, err = self.check(ignore=("rma:91-", "profiler:90"))
        self.assertEqual(rc, 1, "an ignored range that does not cover v90 does not hide it")
        rc, _, _ = self.check(ignore=("rma", "profiler"))
        self.assertEqual(rc, 0, "a whole family may be ignored")

    def test_a_bad_ignore(self):
        rc, _, err = self.check(ignore=("rmx:90",))
        self.assertEqual(rc, 1)
        self.assertIn("--ignore rmx:90: no family 'rmx' in the specs", err)
        rc, _, err = self.check(ignore=("rma:x",))
        self.assertEqual(rc, 1)
        self.assertIn("'x' is not a version range", err)

    def test_versions_a_spec_leaves_out_on_purpose(self):
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            with open(f"{headers}/profiler/profiler_v4.h", "w") as f:
                f.write("typedef struct {\n  const char* name;\n} ncclProfiler_v4_t;\n")
            rc, out, err = self.check(headers=headers)
            self.assertEqual(rc, 0, err)
            self.assertIn("profiler v4: in upstream", out)
            self.assertIn("(v4 and older (NCCL 2.27 and before): a uint8_t event type", out,
                          "abi/profiler.toml says why v4 is left out")
            spec = copy_specs(tmp)
            with open(f"{spec}/profiler.toml") as f:
                text = f.read()
            with open(f"{spec}/profiler.toml", "w") as f:
                f.write(re.sub(r"\[family\.not_described\]\n[^\n]*\n", "", text))
            rc, _, err = self.check(spec, headers)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v4.h", "profiler v4 is not described")

    def assert_difference(self, err, spec_file, header_file, *words):
        lines = [ln for ln in err.splitlines() if ln.startswith("difference:")]
        self.assertTrue(lines, err)
        hit = [ln for ln in lines if re.search(r"%s:\d+: " % re.escape(spec_file), ln)
               and re.search(r"%s:\d+" % re.escape(header_file), ln) and all(w in ln for w in words)]
        self.assertTrue(hit, f"no difference naming {spec_file}, {header_file}, {words}:\n{err}")

    def test_an_argument_type(self):
        with TempDir() as tmp:
            spec = copy_specs(tmp)
            edit(f"{spec}/rma.toml", OPT_FLAGS, OPT_FLAGS.replace('"uint32_t"', '"int"'), count=3)
            rc, _, err = self.check(spec)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/rma.toml", "rma/rma_v15.h", "iput", "optFlags", "int here",
                                   "says uint32_t")

    def test_a_struct_pointer_made_void(self):
        with TempDir() as tmp:
            spec = copy_specs(tmp)
            edit(f"{spec}/rma.toml", '"16" = "ncclRmaProperties_v{v}_t*"', '"16" = "void*"')
            rc, _, err = self.check(spec)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/rma.toml", "rma/rma_v16.h", "getRmaProperties", "rmaProps",
                                   "void* here", "ncclRmaProperties_v16_t*")

    def test_a_struct_field(self):
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            edit(f"{headers}/rma/rma_v14.h", "  int rankStride;", "  long rankStride;")
            rc, _, err = self.check(headers=headers)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/rma.toml", "rma/rma_v14.h", "ncclRmaConfig_v14_t.rankStride",
                                   "says long")

    def test_a_slot_inserted(self):
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            edit(f"{headers}/rma/rma_v15.h", "  ncclResult_t (*devices)(int* ndev);\n",
                 "  ncclResult_t (*devices)(int* ndev);\n  ncclResult_t (*abort)(void* collComm);\n")
            rc, _, err = self.check(headers=headers)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/rma.toml", "rma/rma_v15.h", "ncclRma_v15_t slots are", "'abort'")

    def test_an_argument_missing(self):
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            edit(f"{headers}/rma/rma_v16.h", "uint32_t rank, uint32_t optFlags,\n                       void** request);",
                 "uint32_t rank, void** request);")
            rc, _, err = self.check(headers=headers)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/rma.toml", "rma/rma_v16.h", "ncclRma_v16_t.iget")

    def test_a_per_version_enum_alias_and_a_partial_struct(self):
        rc, out, err = self.check()
        self.assertEqual(rc, 0, err)
        self.assertIn("ncclProfilerEventDescr_v6_t: fields from 'u' on are compared by size", out)
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            edit(f"{headers}/profiler/profiler_v6.h", "typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;",
                 "typedef int ncclProfilerEventState_v6_t;")
            edit(f"{headers}/profiler/profiler_v6.h", "  void* parentObj;\n  int rank;", "  void* parentObj;\n  long rank;")
            rc, _, err = self.check(headers=headers)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v6.h", "recordEventState", "eState",
                                   "ncclProfilerEventState_v6_t")
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v6.h", "ncclProfilerEventDescr_v6_t.rank",
                                   "says long")

    def test_an_anonymous_union_checked_by_size_and_shared_member(self):
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            edit(f"{headers}/profiler/profiler_v6.h", "      int parentGroup;\n", "      int parentGroup;\n      void* extra;\n")
            edit(f"{headers}/profiler/profiler_v6.h", "      int64_t id;\n      void* data;", "      int64_t id;\n      int data;")
            edit(f"{headers}/profiler/profiler_v6.h", "  struct {\n    void* data;\n  } netPlugin;\n} ncclProfilerEventStateArgs",
                 "  struct {\n    void* data;\n  } netPlugin;\n  struct {\n    double t[2];\n  } wide;\n"
                 "} ncclProfilerEventStateArgs")
            rc, _, err = self.check(headers=headers)
            self.assertEqual(rc, 1)
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v6.h",
                                   "ncclProfilerEventDescr_v6_t is 112 bytes here", "is 120")
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v6.h",
                                   "ncclProfilerEventDescr_v6_t.u is 88 bytes here", "union is 96")
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v6.h",
                                   "ncclProfilerEventDescr_v6_t.u.netPlugin.data is void* here", "says int")
            self.assert_difference(err, "abi/profiler.toml", "profiler/profiler_v6.h",
                                   "ncclProfilerEventStateArgs_v6_t is 8 bytes here", "is 16")


def specs_up_to_v16(tmp):
    """A copy of abi/ whose RMA family stops at v16, so the v90 fixture is drafted against v16."""
    spec = copy_specs(tmp)
    edit(f"{spec}/rma.toml", "versions = [13, 14, 15, 16, 17]", "versions = [13, 14, 15, 16]")
    with open(f"{spec}/rma.toml") as f:
        text = f.read()
    with open(f"{spec}/rma.toml", "w") as f:
        f.write(re.sub(r'^17 = ".*"\n', "", text, flags=re.M))
    return spec


class Import(unittest.TestCase):
    def draft90(self):
        with TempDir() as tmp:
            rc, out, err = run_generator("--spec-dir", specs_up_to_v16(tmp), "--import", FIXTURE, "--family", "rma",
                                         "--version", "90")
        self.assertEqual(rc, 0, err)
        return out

    def test_drafts_the_delta_of_a_new_version(self):
        out = self.draft90()
        self.assertIn('[table.layout] "90" = { size = 184, slots = ["name", "init", "devices", "getRmaProperties"', out)
        self.assertIn("slot iflush: argument 'optFlags' uint32_t is new at position 5: "
                      '{ name = "optFlags", type = "uint32_t", since = 90, conv = "ignore" }', out)
        self.assertIn('slot abort (new, index 22): since = 90, args = [{ name = "collComm", type = "void*" }]', out)

    def test_a_new_argument_gets_a_conversion(self):
        out = self.draft90()
        self.assertIn("slot connect: argument 'abortFlag' volatile uint32_t* is new at position 7: "
                      '{ name = "abortFlag", type = "volatile uint32_t*", since = 90, conv = "copy", '
                      'to = "abort_flag" }', out, "a core parameter of the same name (snake case) takes it")
        self.assertIn("slot iflush: argument 'optFlags' uint32_t is new at position 5: "
                      '{ name = "optFlags", type = "uint32_t", since = 90, conv = "ignore" }  '
                      "# fab_rma_iflush has no parameter for it", out)

    def test_a_struct_reused_from_an_older_version(self):
        out = self.draft90()
        self.assertIn("slot getRmaProperties: argument 'rmaProps' keeps ncclRmaProperties_v16_t* (the spec would "
                      'render ncclRmaProperties_v90_t*): type = { "-16" = "ncclRmaProperties_v{v}_t*", '
                      '"90-" = "ncclRmaProperties_v16_t*" }', out)

    def test_a_changed_struct_gets_fields_and_a_layout(self):
        out = self.draft90()
        self.assertIn("struct ncclRmaConfig_v90_t: field 'rankStride' is gone in v90: add until = 16; the core's "
                      "rank_stride then takes its absent value", out)
        self.assertIn('struct ncclRmaConfig_v90_t: field \'peerList\' is new: { name = "peerList", type = "int*", '
                      'since = 90, conv = "ignore" }  # fab_rma_config has no field for it', out)
        self.assertIn('struct ncclRmaConfig_v90_t: field \'flags\' is new: { name = "flags", type = "int", '
                      'since = 90, conv = "ignore" }', out)
        self.assertIn('struct ncclRmaConfig_v90_t: layout "90" = { size = 24, align = 8, offsets = { nContexts = 0, '
                      'trafficClass = 4, peerList = 8, flags = 16 } }', out)

    def test_an_anonymous_union_that_changed(self):
        rc, out, err = run_generator("--import", FIXTURE, "--family", "profiler", "--version", "90")
        self.assertEqual(rc, 0, err)
        self.assertIn("struct ncclProfilerEventDescr_v90_t: the anonymous union is 104 bytes (v7: 112 as 'u', "
                      "ncclProfilerEventDescrUnion_v7_t): record the new size in its layout and resize any filler", out)
        self.assertIn("struct ncclProfilerEventDescr_v90_t: 128 bytes (v7: 136)", out)
        self.assertIn('struct ncclProfilerEventDescr_v90_t: layout "90" = { size = 128, align = 8, offsets = { '
                      'type = 0, parentObj = 8, rank = 16, u = 24 } }', out)
        self.assertIn("struct ncclProfilerEventStateArgs_v90_t: the part ncclProfilerEventStateArgs_v7_t describes "
                      "is unchanged (8 bytes): extend its layout range to 90", out)
        self.assertNotIn("ncclProfilerEventState_v90_t", out, "an enum's per-version name is no struct to draft")
        self.assertNotIn("changes type", out, "the enum under its per-version name is the same type")

    def test_a_changed_union_gets_its_layout(self):
        with TempDir() as tmp:
            headers = copy_fixture(tmp)
            edit(f"{headers}/profiler/profiler_v90.h", "typedef union {\n  struct {\n    size_t transSize;",
                 "typedef union {\n  struct {\n    double t[2];\n  } wide;\n  struct {\n    size_t transSize;")
            rc, out, err = run_generator("--import", headers, "--family", "profiler", "--version", "90")
            self.assertEqual(rc, 0, err)
            self.assertIn("struct ncclProfilerEventStateArgs_v90_t: 16 bytes (v7: 8)", out)
            self.assertIn('struct ncclProfilerEventStateArgs_v90_t: layout "90" = { size = 16, align = 8, offsets = { '
                          'wide = 0, proxyStep = 0, netPlugin = 0 } }', out, "a union's size is its widest member's")

    def test_refuses_a_version_already_described(self):
        rc, _, err = run_generator("--import", FIXTURE, "--family", "rma", "--version", "16")
        self.assertEqual(rc, 1)
        self.assertIn("rma v16 is already described in abi/rma.toml", err)

    def test_needs_family_and_version(self):
        rc, _, err = run_generator("--import", FIXTURE)
        self.assertEqual(rc, 1)
        self.assertIn("--import needs --family and --version", err)


if __name__ == "__main__":
    unittest.main()
