#!/usr/bin/env bash
# One command: install what is missing, build, and run a two-process transfer
# through the plugin's newest exported ABI table over loopback.
# Usage: tests/demo.sh [tcp|shm]   (default tcp)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$top/tests/install-deps.sh"
bash "$top/tests/build.sh" "$top/build" -DFABRIC_BUILD_TESTS=ON
provider=${1:-tcp}
export FI_PROVIDER=$provider
[ "$provider" = tcp ] && export FI_TCP_IFACE=${FI_TCP_IFACE:-lo}
exec "$top/build/tests/functional/fabric-demo" "$top/build/libnccl-net-fabric.so"
