#!/usr/bin/env bash
# The README's install from a build tree, as written: `cmake --install` into /usr/local as root, after which a
# program finds the plugin by its bare name with no LD_LIBRARY_PATH (the install refreshes the loader's cache),
# the installed README's links to docs/ resolve, and `--target uninstall` removes every file again.
# Needs root. usage: tests/package/install.sh [BUILD_DIR]
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$top/build-install-check}
prefix=/usr/local
fail() { echo "install.sh: FAILED: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "SKIPPED: installing into $prefix needs root"; exit 0; }
[[ ! -e $prefix/lib/libnccl-net-fabric.so ]] || fail "$prefix/lib/libnccl-net-fabric.so exists already; remove it first"

cmake -S "$top" -B "$out" -G Ninja -DFABRIC_BUILD_TESTS=OFF >/dev/null
cmake --build "$out" >/dev/null
cmake --install "$out" >"$out/install.log"
trap 'cmake --build "$out" --target uninstall >/dev/null 2>&1 || true' EXIT
grep -q "Ran ldconfig" "$out/install.log" || { cat "$out/install.log"; fail "the install did not refresh the loader's cache"; }

env -u LD_LIBRARY_PATH NCCL_NET_PLUGIN=fabric FI_PROVIDER=shm "$prefix/bin/fabric-info" >"$out/fabric-info.txt" 2>&1 ||
  { cat "$out/fabric-info.txt"; fail "the installed fabric-info reports a problem"; }
grep -q "^plugin libnccl-net-fabric.so ($prefix/lib/libnccl-net-fabric.so)" "$out/fabric-info.txt" ||
  { cat "$out/fabric-info.txt"; fail "the plugin was not found by its bare name in $prefix/lib"; }
echo "installed: found by its bare name in $prefix/lib"

doc=$prefix/share/doc/libnccl-net-fabric
links=$(grep -o '](docs/[A-Za-z0-9_./-]*)' "$doc/README.md" | sed 's/^](\(.*\))$/\1/' | sort -u)
[[ -n $links ]] || fail "the installed README links no docs (was it installed?)"
for l in $links; do [[ -f $doc/$l ]] || fail "the installed README links $l, which the install does not ship"; done
echo "installed README: its $(wc -w <<<"$links") links to docs/ resolve"

trap - EXIT
cmake --build "$out" --target uninstall >"$out/uninstall.log"
left=""
while read -r f; do if [[ -e $f || -L $f ]]; then left="$left $f"; fi; done <"$out/install_manifest.txt"
[[ -z $left ]] || fail "uninstall left:$left"
if ldconfig -p | grep -q "libnccl-net-fabric.so .*=> $prefix"; then fail "the loader's cache still lists the library"; fi
echo "install.sh: installs into $prefix, is found by its bare name, and uninstalls without a trace"
