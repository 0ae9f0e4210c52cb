#!/bin/bash
# fabric-info --selftest on tcp;ofi_rxm: its processes get the receive pool the
# plugin sets (FABRIC_RXM_RX_SIZE, 512 buffers), not rxm's own 4096, so their
# peak memory is well below a run with FABRIC_RXM_RX_SIZE=0. Exit 77 (skipped)
# where the plugin does not set the pool (no ofi_rxm over tcp here).
# usage: rxm_pool.sh FABRIC_INFO PLUGIN
set -u
info=$1 plugin=$2
peak_kib() { # prints "STATUS KIB": exit status and peak resident KiB of the largest process of one run; its report on stderr
  python3 - "$info" "$plugin" <<'PY'
import resource, subprocess, sys
p = subprocess.run([sys.argv[1], "--selftest", "--bytes", "1M", "--plugin", sys.argv[2]], capture_output=True, text=True)
open("/dev/stderr", "w").write(p.stdout + p.stderr)
print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
}
report=$(mktemp)
read -r rc ours < <(peak_kib 2> "$report")
out=$(cat "$report"); rm -f "$report"
[ "$rc" = 0 ] || { echo "$out"; echo "FAIL: fabric-info --selftest exited $rc"; exit 1; }
if ! grep -q "FI_OFI_RXM_MSG_RX_SIZE=512: ofi_rxm posts 512" <<< "$out"; then
  echo "SKIP: the plugin did not set ofi_rxm's receive pool here (no ofi_rxm over tcp)"; exit 77
fi
read -r rc own < <(FABRIC_RXM_RX_SIZE=0 peak_kib 2> /dev/null)
[ "$rc" = 0 ] || { echo "FAIL: fabric-info --selftest with FABRIC_RXM_RX_SIZE=0 exited $rc"; exit 1; }
echo "peak resident: ${ours} KiB with the plugin's 512 receive buffers, ${own} KiB with rxm's own 4096"
if [ $((own - ours)) -lt 30720 ]; then
  echo "FAIL: less than 30 MiB apart: fabric-info's processes did not get the pool the plugin set (a libfabric call before the plugin's init?)"
  exit 1
fi
echo "rxm pool ok"
