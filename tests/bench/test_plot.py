#!/usr/bin/env python3
"""bench.plot: plot.py turns a netbench CSV (plot_fixture.csv) into its four
PNG figures, and without matplotlib it exits 2 saying how to install it;
plot_nccl.py turns nccl-tests logs (plot_nccl_fixture_*.log, rows of a real
run) into one figure per collective and refuses a run with wrong elements.
matplotlib is required (tests/install-deps.sh installs it)."""

import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT = os.path.join(HERE, "plot.py")
PLOT_NCCL = os.path.join(HERE, "plot_nccl.py")
NCCL_LOGS = [f"{label}=" + os.path.join(HERE, f"plot_nccl_fixture_{label.lower()}.log") for label in ("Socket", "Fabric")]
FIXTURE = os.path.join(HERE, "plot_fixture.csv")
FIGURES = ("latency", "bandwidth", "ratio", "summary")


def run_plot(*args, env=None, script=PLOT):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def png_size(path):
    """(width, height) from the IHDR chunk; fails unless path is a PNG."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def assert_png(test, path, min_side):
    """path is a PNG of at least min_side pixels each way, with something drawn in it."""
    w, h = png_size(path)
    test.assertGreaterEqual(min(w, h), min_side, f"{path}: {w}x{h}")
    test.assertGreater(os.path.getsize(path), 10000, f"{path}: almost empty")


class Plot(unittest.TestCase):
    def test_plots_the_fixture(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.fail(f"{sys.executable} has no matplotlib: run bash tests/install-deps.sh (python3-matplotlib)")
        with tempfile.TemporaryDirectory() as out:
            r = run_plot("--out", out, "--prefix", "t-", FIXTURE)
            self.assertEqual(r.returncode, 0, r.stderr)
            want = [os.path.join(out, f"t-{name}.png") for name in FIGURES]
            self.assertEqual(sorted(r.stdout.split()), sorted(want), "plot.py prints the files it wrote")
            self.assertEqual(sorted(os.listdir(out)), sorted(os.path.basename(p) for p in want))
            for path in want:
                assert_png(self, path, 400)

    def test_rejects_a_csv_that_is_not_netbench(self):
        with tempfile.TemporaryDirectory() as out:
            bad = os.path.join(out, "bad.csv")
            with open(bad, "w") as f:
                f.write("a,b\n1,2\n")
            r = run_plot("--out", out, bad)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("is not a netbench CSV", r.stderr)

    def test_without_matplotlib_exits_2_and_says_so(self):
        with tempfile.TemporaryDirectory() as stub:
            os.mkdir(os.path.join(stub, "matplotlib"))
            with open(os.path.join(stub, "matplotlib", "__init__.py"), "w") as f:
                f.write("raise ImportError('hidden by test_plot.py')\n")
            # NETBENCH_PLOT_REEXEC: do not retry with /usr/bin/python3 either.
            r = run_plot("--out", stub, FIXTURE, env={"PYTHONPATH": stub, "NETBENCH_PLOT_REEXEC": "1"})
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("matplotlib is not installed", r.stderr)
            self.assertFalse([n for n in os.listdir(stub) if n.endswith(".png")])


class PlotNccl(unittest.TestCase):
    def test_plots_one_figure_per_collective(self):
        with tempfile.TemporaryDirectory() as out:
            r = run_plot("--out", out, "--prefix", "n-", *NCCL_LOGS, script=PLOT_NCCL)
            self.assertEqual(r.returncode, 0, r.stderr)
            want = os.path.join(out, "n-all_reduce.png")
            self.assertEqual(r.stdout.split(), [want])
            assert_png(self, want, 300)

    def test_refuses_a_run_with_wrong_elements(self):
        with tempfile.TemporaryDirectory() as out:
            bad = os.path.join(out, "bad.log")
            with open(NCCL_LOGS[1].split("=", 1)[1]) as f, open(bad, "w") as g:
                for line in f:  # one wrong element in the 2 KiB row
                    g.write(line.replace("0.05       0    38.39", "0.05       1    38.39"))
            r = run_plot("--out", out, NCCL_LOGS[0], f"Fabric={bad}", script=PLOT_NCCL)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("1 wrong elements at 2048 bytes", r.stderr)
            self.assertFalse([n for n in os.listdir(out) if n.endswith(".png")])

    def test_rejects_what_is_not_label_equals_log(self):
        r = run_plot(NCCL_LOGS[0].split("=", 1)[1], script=PLOT_NCCL)
        self.assertEqual(r.returncode, 2)
        self.assertIn("is not LABEL=LOG", r.stderr)


if __name__ == "__main__":
    unittest.main()
