"""The generator on a Python without tomllib (3.9 and 3.10: RHEL 9, Amazon
Linux 2023, Ubuntu 22.04): tomllib is hidden and the tomli package read the
specs instead; --check then proves the rendering byte-identical to the
checked-in generated/ and docs/. Exits 77 (ctest: skipped, not passed) where
tomli is not installed."""

import os
import runpy
import sys

try:
    import tomli  # noqa: F401
except ImportError:
    print(f"SKIPPED: the tomli package is not installed for {sys.executable} (Debian: python3-tomli)")
    sys.exit(77)

sys.modules["tomllib"] = None  # an import of it now raises ImportError, as on Python 3.10
top = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.argv = [os.path.join(top, "codegen", "generate.py"), "--spec-dir", os.path.join(top, "abi"),
            "--params", os.path.join(top, "core", "params.toml"), "--check"]
runpy.run_path(sys.argv[0], run_name="__main__")
