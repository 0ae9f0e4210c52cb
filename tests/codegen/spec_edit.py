"""Helpers for tests that run the generator on an edited copy of the specs."""

import contextlib
import io
import os
import shutil
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "codegen"))

import generate  # noqa: E402


def copy_specs(tmp):
    """A copy of abi/ under tmp, still named abi/ so messages read abi/<file>."""
    dst = os.path.join(tmp, "abi")
    shutil.copytree(os.path.join(TOP, "abi"), dst)
    return dst


def edit(path, old, new, count=1):
    """Replaces old by new in path; old must occur exactly `count` times."""
    with open(path) as f:
        text = f.read()
    found = text.count(old)
    if found != count:
        raise AssertionError(f"{path}: expected {count} occurrence(s) of {old!r}, found {found}")
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def append(path, text):
    with open(path, "a") as f:
        f.write(text)


def run_generator(*args):
    """Runs generate.py in-process; returns (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = generate.main(list(args))
    return rc, out.getvalue(), err.getvalue()


class TempDir:
    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="fabgen-test-")
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self.path, ignore_errors=True)
