#!/usr/bin/env bash
# The README followed literally by a new user on a fresh Debian 12, as root: a minimal bookworm tree made by
# debootstrap, a clone of this checkout inside it, then the README's commands in order (demo on tcp and shm, the
# Debian package with fabric-info --selftest and its removal, cmake --install with fabric-info, a wrong
# NCCL_NET_PLUGIN that must be flagged, and the uninstall target). Not part of the test command: it needs root,
# network access to a Debian mirror and about 1.5 GB of disk, and takes a few minutes.
#
#   bash tests/package/fresh-debian12.sh [DIR]      (DIR: where the tree goes, default /tmp/fabric-deb12)
#
# Prints one "STEP ... rc=N" line per step and exits non-zero when a step did not do what the README says.
set -u -o pipefail
[ "$(id -u)" = 0 ] || { echo "fresh-debian12.sh: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
ROOT=${1:-/tmp/fabric-deb12}
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

command -v debootstrap > /dev/null || { apt-get update -q && apt-get install -y -q debootstrap; } > /dev/null
if [ ! -x "$ROOT/bin/bash" ]; then
  debootstrap --variant=minbase bookworm "$ROOT" "$MIRROR" > "$ROOT.debootstrap.log" 2>&1 ||
    { echo "debootstrap failed: $ROOT.debootstrap.log" >&2; exit 1; }
fi
BARE=$(mktemp -d)/fabric.git
git clone -q --bare "$SRC" "$BARE"
mounted=()
bind() { mkdir -p "$ROOT$2" && mount "${@:3}" "$1" "$ROOT$2" && mounted=("$ROOT$2" "${mounted[@]}"); }
cleanup() { for m in "${mounted[@]}"; do umount -l "$m"; done; rm -rf "$(dirname "$BARE")"; }
trap cleanup EXIT
bind proc /proc -t proc
bind /dev /dev --bind
bind /dev/pts /dev/pts --bind
bind tmpfs /dev/shm -t tmpfs -o size=4g
bind "$BARE" /mnt/fabric.git --bind
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"

cat > "$ROOT/root/walk.sh" <<'EOF'
export DEBIAN_FRONTEND=noninteractive HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fail=0
step() { local name=$1; shift; "$@" > "/tmp/$name.log" 2>&1; local rc=$?; echo "STEP $name rc=$rc"; return $rc; }
must() { step "$@" || { fail=1; tail -5 "/tmp/$1.log"; }; }
cd /root
must git sh -c 'apt-get update -q && apt-get install -y -q git && rm -rf fabric && git clone -q /mnt/fabric.git fabric'
cd fabric
must demo-tcp bash tests/demo.sh && grep -E "^moved|round trip" /tmp/demo-tcp.log
must demo-shm bash tests/demo.sh shm && grep -E "^moved|round trip" /tmp/demo-shm.log
must deb-build sh -c 'cmake -S . -B build-deb -DCMAKE_INSTALL_PREFIX=/usr -DFABRIC_BUILD_TESTS=OFF && cmake --build build-deb'
must deb-pack sh -c 'cd build-deb && cpack -G DEB'
must deb-install sh -c 'dpkg -i build-deb/libnccl-net-fabric_*.deb'
must deb-selftest env NCCL_NET_PLUGIN=fabric fabric-info --selftest && tail -1 /tmp/deb-selftest.log
must deb-remove dpkg -r libnccl-net-fabric
must install cmake --install build --prefix /usr/local
must info env NCCL_NET_PLUGIN=fabric fabric-info && grep -m1 "fabric 0" /tmp/info.log
if step wrong-plugin env NCCL_NET_PLUGIN=/wrong/path fabric-info; then
  echo "fabric-info said all is well with NCCL_NET_PLUGIN=/wrong/path"; fail=1
else
  grep -m1 "NCCL would not use this plugin" /tmp/wrong-plugin.log || fail=1
fi
must uninstall cmake --build build --target uninstall
if ls /usr/local/lib/libnccl-net-fabric* /usr/local/bin/fabric-info > /dev/null 2>&1; then
  echo "uninstall left files behind"; fail=1
fi
exit $fail
EOF
chroot "$ROOT" /bin/bash /root/walk.sh
rc=$?
echo "fresh-debian12.sh: $([ $rc = 0 ] && echo "every step as the README says" || echo "a step failed") (tree: $ROOT)"
exit $rc
