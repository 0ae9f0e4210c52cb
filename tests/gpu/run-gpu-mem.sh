#!/usr/bin/env bash
# On a 1-GPU machine: GPU memory through the plugin (fabric-gpu-mem) on
# libfabric 2.x with CUDA, every provider, transport and memory kind, then
# netbench with GPU buffers against raw libfabric on the same buffers.
#
#   bash tests/gpu/run-gpu-mem.sh <dir from build-gpu-mem.sh> <out-dir>
#
# <out-dir> gets summary.txt (one line per run: PASS, NOT-OFFERED with the
# plugin's reason, or FAIL), logs.tar.gz (every run's output), and the
# netbench CSVs. Knobs: RUNS="shm:rdma:cuda ..." (default: the matrix below),
# NETBENCH=0 skips netbench, BUDGET_S (default 540).
set -uo pipefail
dir=$(cd "${1:?usage: run-gpu-mem.sh <dir> <out>}" && pwd)
out=${2:?usage: run-gpu-mem.sh <dir> <out>}
mkdir -p "$out/logs"
start=$(date +%s)
budget=${BUDGET_S:-540}
export LD_LIBRARY_PATH=$dir/lf2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset FI_PROVIDER FI_TCP_IFACE FABRIC_TRANSPORT FABRIC_EAGER_MAX FABRIC_GPU_MEMORY FABRIC_LOCAL_SEND_ENDPOINTS
summary=$out/summary.txt
: >"$summary"
{
  echo "== $(date -u +%FT%TZ) on $(hostname)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2
  echo "libfabric: $("$dir/lf2/bin/fi_info" --version | tr '\n' ' ')"
  for p in shm tcp; do
    n=$(FI_TCP_IFACE=lo "$dir/lf2/bin/fi_info" -p "$p" -c FI_HMEM 2>/dev/null | grep -c 'provider:')
    echo "fi_info -p $p -c FI_HMEM: $n entries"
  done
} | tee -a "$summary"

left() { echo $((budget - ($(date +%s) - start))); }

# name plugin-dir env... -- args...
run() {
  local name=$1 plugin=$2; shift 2
  local envs=() args=()
  while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  args=("$@")
  local t=$(( $(left) - 20 ))
  if (( t < 20 )); then echo "SKIPPED  $name (budget)" | tee -a "$summary"; return; fi
  (( t > 150 )) && t=150
  local log=$out/logs/$name.log t0=$(date +%s)
  env "${envs[@]}" FI_TCP_IFACE=lo FABRIC_TEST_VERBOSE=1 timeout "$t" "$dir/bin/fabric-gpu-mem" "${args[@]}" \
    "$plugin/libnccl-net-fabric.so" >"$log" 2>&1
  local rc=$? secs=$(( $(date +%s) - t0 ))
  local why verdict
  case $rc in
    0) verdict=PASS; why=$(grep -m1 'fabric-gpu-mem: PASS' "$log" | sed 's/^fabric-gpu-mem: PASS: //') ;;
    3) verdict=NOT-OFFERED; why=$(grep -m1 'GPU memory (' "$log" | sed 's/.*GPU memory/GPU memory/') ;;
    124) verdict=TIMEOUT; why="no result in ${t} s: $(grep -m1 -i 'phase\|FAILED' "$log")" ;;
    *) verdict=FAIL; why=$(grep -m1 'FAILED' "$log") ;;
  esac
  local extra
  extra=$(grep -h '^overtake:\|^realloc:' "$log" | tr '\n' ' ')
  echo "$verdict  $name (${secs} s): $why ${extra}" | tee -a "$summary"
}

lf2=$dir/plugin-lf2
lf1=$dir/plugin-lf1
if [[ -z ${RUNS:-} ]]; then
  RUNS="shm:sendrecv:cuda shm:sendrecv:dmabuf shm:rdma:cuda tcp:sendrecv:cuda tcp:rdma:cuda"
  RUNS="$RUNS shm:rdma:cuda:eager shm:sendrecv:cuda:oneep shm:sendrecv:cuda:lf1 shm:sendrecv:host"
fi
for r in $RUNS; do
  IFS=: read -r prov tp mem variant <<<"$r"
  envs=(FI_PROVIDER=$prov FABRIC_TRANSPORT=$tp FABRIC_GPU_MEMORY=1)
  plugin=$lf2
  case ${variant:-} in
    eager) envs+=(FABRIC_EAGER_MAX=4096) ;;           # the copy of an eager message into GPU memory
    oneep) envs+=(FABRIC_LOCAL_SEND_ENDPOINTS=0) ;;   # both comms on one endpoint: the provider's own ordering
    lf1) plugin=$lf1 ;;                               # the plugin built against 1.17, on the 2.x runtime
  esac
  run "$prov.$tp.$mem${variant:+.$variant}" "$plugin" "${envs[@]}" -- --mem "$mem"
done

# --- netbench: GPU buffers, plugin against raw libfabric on the same buffers ------------------------------
if [[ ${NETBENCH:-1} == 1 ]]; then
  for mem in cuda dmabuf host; do
    t=$(( $(left) - 15 ))
    if (( t < 30 )); then echo "SKIPPED  netbench.shm.$mem (budget)" | tee -a "$summary"; continue; fi
    (( t > 150 )) && t=150
    log=$out/logs/netbench.shm.$mem.log
    FABRIC_GPU_MEMORY=1 timeout "$t" "$dir/bin/netbench-lf2" --provider shm --mem "$mem" --tests lat,bw --reps 3 --lat-sizes 8,4K,64K --bw-sizes 64K,1M,8M,64M \
      --csv "$out/netbench-shm-$mem.csv" "$lf2/libnccl-net-fabric.so" >"$log" 2>&1
    rc=$?
    echo "$( ((rc == 0)) && echo PASS || echo "FAIL(rc $rc)")  netbench.shm.$mem: $(grep -m1 'all transfers verified' "$log")" |
      tee -a "$summary"
  done
fi
tar czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$out/logs"
echo "== done in $(( $(date +%s) - start )) s" | tee -a "$summary"
! grep -q '^FAIL\|^TIMEOUT' "$summary"
