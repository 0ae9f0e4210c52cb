#!/usr/bin/env bash
# NCCL's host one-sided API through the plugin's RMA table on 2 GPUs
# (tests/gpu/nccl_rma_check.c), GPU machine:
#   bash tests/gpu/run-rma.sh <dir> <out>
# <dir> from tests/gpu/build-rma.sh. Runs the check once on NCCL's own path
# (no plugin: the test checked against NCCL itself), then through the plugin
# with the network path forced, once per provider. A plugin run passes when
# the program passes, NCCL's log shows Fabric as its RMA plugin and holds no
# WARN. Knobs: PROVIDERS ["tcp shm"], ARGS (for nccl_rma_check), T [240] s per run,
# EXTRA_ENV ("A=1 B=2", added to the plugin runs), BASELINE [1] (0: skip the run without plugin),
# PLUGIN [<dir>/libnccl-net-fabric.so] (another build, for an A/B in one machine).
# Provider "shm-hmem" (needs <dir>/lf2, build-rma.sh with LF2_CUDA): shm of a CUDA-enabled libfabric 2.x with
# FABRIC_GPU_MEMORY=1: its FI_HMEM entry (inject size 0: control writes from bounce slots). shm refuses
# FI_OPT_CUDA_API_PERMITTED=false (it copies GPU memory with cudaMemcpy from inside our calls), so GPU windows
# must be staged; its log must say so.
set -u -o pipefail
dir=$(cd "${1:?usage: run-rma.sh <dir> <out>}" && pwd)
out=${2:?usage: run-rma.sh <dir> <out>}
mkdir -p "$out"
nccl=/tmp/nccl230
mkdir -p "$nccl"
tar xJf "$dir/nccl-2.30.7-sm90.tar.xz" -C "$nccl"
export LD_LIBRARY_PATH=$nccl/nccl/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0
summary=$out/summary.txt
: >"$summary"
fails=0

run() { # name, program arguments (one word), then env assignments
  local name=$1 args=$2
  shift 2
  local t0=$SECONDS
  timeout "${T:-240}" env "$@" "$dir/nccl_rma_check" $args >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$summary"
  grep -E "^(transfer|many|barrier|rereg|timing),|FAILED|ERROR|killed" "$out/$name.log" | sort | uniq -c | head -40 >>"$summary"
  [ $rc -eq 0 ] || fails=$((fails + 1))
  return $rc
}

[ "${BASELINE:-1}" = 0 ] || run baseline "--no-timing ${ARGS:-}" NCCL_DEBUG=WARN
for prov in ${PROVIDERS:-tcp shm}; do
  plugin=${PLUGIN:-$dir/libnccl-net-fabric.so} fi_prov=$prov direct=()
  if [ "$prov" = shm-hmem ]; then
    plugin=$dir/lf2/libnccl-net-fabric.so fi_prov=shm
    direct=(LD_LIBRARY_PATH="$dir/lf2/lib:$LD_LIBRARY_PATH" FABRIC_GPU_MEMORY=1)
  fi
  run "$prov" "${ARGS:-}" NCCL_NET_PLUGIN="$plugin" NCCL_NET=Fabric NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      NCCL_LSA_TEAM_SIZE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET FI_PROVIDER="$fi_prov" FI_TCP_IFACE=lo \
      FABRIC_TRANSPORT=rdma "${direct[@]}" ${EXTRA_ENV:-}
  log=$out/$prov.log
  grep -E "NET/Fabric: (RMA group on .*GPU windows|device 0:|GPU memory)" "$log" | sed 's/^.*NET\/Fabric: //' | sort -u |
    sed 's/^/   /' >>"$summary"
  if [ "$prov" = shm-hmem ] && ! grep -q "GPU windows staged through host memory (the provider may call CUDA itself" "$log"; then
    echo "   FAIL: the plugin did not say it stages GPU windows on shm's FI_HMEM entry" >>"$summary"
    fails=$((fails + 1))
  fi
  grep -E "RMA/Plugin: (Loaded|Assigned)|NET/Fabric: RMA group" "$log" | sed 's/^[^ ]* //' | sort -u | sed 's/^/   /' >>"$summary"
  if ! grep -q "RMA/Plugin: Assigned plugin Fabric to comm" "$log"; then
    echo "   FAIL: NCCL's log does not show Fabric as its RMA plugin" >>"$summary"
    fails=$((fails + 1))
  fi
  if grep -E "NCCL WARN|NET/Fabric.*WARN| WARN " "$log" >"$out/$prov.warn"; then
    echo "   FAIL: $(wc -l <"$out/$prov.warn") WARN lines, first: $(head -1 "$out/$prov.warn")" >>"$summary"
    fails=$((fails + 1))
  fi
  rm -f "$out/$prov.warn"
done
cat "$summary"
echo "run-rma: $fails failed"
[ $fails -eq 0 ]
