#!/usr/bin/env bash
# Configures and builds fabric into a build directory (default: build/).
# Usage: tests/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$top/build}
shift || true
# The system interpreter has tomllib (3.11) and Debian's Jinja2; pin it so
# every machine renders with the same tools.
python=$(command -v /usr/bin/python3 || command -v python3)
# The freshness check of generated/ is mandatory here (a user's build may skip it without Python).
cmake -S "$top" -B "$build" -G Ninja -DPython3_EXECUTABLE="$python" -DFABRIC_CODEGEN_CHECK=ON "$@" >/dev/null
cmake --build "$build"
