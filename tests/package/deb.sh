#!/usr/bin/env bash
# Builds the Debian package, checks what it holds and declares, installs it on
# this machine, checks that a program finds the plugin by its bare name with
# no LD_LIBRARY_PATH (fabric-info's default is the bare name, as NCCL's dlopen)
# and that `fabric-info --selftest` passes from the installed files, then
# removes it again. Needs root (dpkg -i). usage: tests/package/deb.sh [BUILD_DIR]
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$top/build-package-check}
pkg=libnccl-net-fabric
fail() { echo "deb.sh: FAILED: $*" >&2; exit 1; }

contact="fabric package check <package-check@localhost>" # a distributor names itself (FABRIC_PACKAGE_CONTACT)
cmake -S "$top" -B "$out" -G Ninja -DCMAKE_INSTALL_PREFIX=/usr -DFABRIC_BUILD_TESTS=OFF \
  "-DFABRIC_PACKAGE_CONTACT=$contact" >/dev/null
cmake --build "$out" >/dev/null
rm -f "$out"/${pkg}_*.deb
(cd "$out" && cpack -G DEB >/dev/null)
deb=$(ls "$out"/${pkg}_*.deb)
echo "package: $deb"

multiarch=$(gcc -print-multiarch)
contents=$(dpkg-deb -c "$deb")
for f in "./usr/lib/$multiarch/libnccl-net-fabric.so" "./usr/lib/$multiarch/libnccom-net-fabric.so" ./usr/bin/fabric-info \
         ./usr/share/doc/$pkg/README.md; do
  grep -q " $f\$" <<<"$contents" || fail "the package lacks $f"
done
depends=$(dpkg-deb -f "$deb" Depends)
grep -q "libfabric1" <<<"$depends" || fail "Depends does not name libfabric1: $depends"
echo "depends: $depends"
maintainer=$(dpkg-deb -f "$deb" Maintainer)
[ "$maintainer" = "$contact" ] || fail "Maintainer is '$maintainer', not the FABRIC_PACKAGE_CONTACT given ('$contact')"

if dpkg-query -W -f='${Status}' $pkg 2>/dev/null | grep -q "install ok installed"; then
  fail "$pkg is already installed here; remove it first (dpkg -r $pkg) so this check leaves the machine as it was"
fi
dpkg -i "$deb" >/dev/null
trap 'dpkg -P $pkg >/dev/null' EXIT
[ -e "/usr/lib/$multiarch/libnccl-net-fabric.so" ] || fail "not installed into /usr/lib/$multiarch"
for prov in shm tcp; do
  env -u LD_LIBRARY_PATH NCCL_NET_PLUGIN=fabric FI_PROVIDER=$prov FI_TCP_IFACE=lo /usr/bin/fabric-info --selftest --bytes 16M \
    > "$out/fabric-info.$prov.txt" 2>&1 || { cat "$out/fabric-info.$prov.txt"; fail "fabric-info --selftest on $prov"; }
  grep -Eq "^plugin libnccl-net-fabric.so \((/usr)?/lib/$multiarch/libnccl-net-fabric.so\)" "$out/fabric-info.$prov.txt" ||
    { cat "$out/fabric-info.$prov.txt"; fail "fabric-info did not load the installed library by its bare name"; }
  grep "^selftest:" "$out/fabric-info.$prov.txt"
done
echo "deb.sh: the package builds, installs into /usr/lib/$multiarch, and works from the installed files"
