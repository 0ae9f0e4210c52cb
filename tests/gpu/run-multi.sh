#!/usr/bin/env bash
# Several NCCL communicators per process through the plugin (GPU host, 2 GPUs):
# runs tests/gpu/multi_comm_check.py under torchrun on tcp and shm, with the
# network path forced as in run.sh, and reports per provider how many plugin
# inits (one per communicator and rank) and endpoints NCCL's log shows.
#
#   bash tests/gpu/run-multi.sh <plugin-dir> <out-dir>
#
# Exit status: 0 when both providers pass, 1 otherwise.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lib=$(cd "${1:?usage: run-multi.sh <plugin-dir> <out-dir>}" && pwd)/libnccl-net-fabric.so
out=${2:?usage: run-multi.sh <plugin-dir> <out-dir>}
mkdir -p "$out"
if command -v torchrun >/dev/null 2>&1; then tr=(torchrun); else tr=(python3 -m torch.distributed.run); fi
status=0
for prov in tcp shm; do
  log="$out/multi-$prov.log"
  NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_NET_PLUGIN="$lib" NCCL_NET=Fabric \
    FI_PROVIDER=$prov FI_TCP_IFACE=lo NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET \
    timeout 240 "${tr[@]}" --nproc_per_node=2 "$here/multi_comm_check.py" >"$log" 2>&1
  rc=$?
  grep -E "^multi_comm_check" "$log"
  printf '%s: exit %d, plugin inits %d, endpoints %d, WARN lines %d\n' "$prov" "$rc" \
    "$(grep -c 'Assigned NET plugin Fabric' "$log")" "$(grep -c 'NET/Fabric: endpoint on' "$log")" \
    "$(grep -c ' WARN ' "$log")"
  if [ "$rc" -ne 0 ] || ! grep -q "multi_comm_check: PASS" "$log" || grep -q ' WARN ' "$log"; then status=1; fi
done
exit $status
