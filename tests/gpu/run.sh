#!/usr/bin/env bash
# GPU check of the Fabric NCCL net plugin on one host with 2 GPUs.
#
#   bash tests/gpu/run.sh <plugin-dir> <out-dir>
#
# <plugin-dir>: libnccl-net-fabric.so (all tables) and libnccl-net-fabric-v6.so ... -v11.so.
# <out-dir>:    gets results.csv, summary.md, warnings.txt, nccl-logs.tar.gz, run.log (5 files).
# Exit status: 0 if every configuration passed, 1 if any failed or was skipped, 2 on bad usage.
#
# Knobs (environment; defaults in brackets):
#   PHASES ["full baseline versions"]  which phases, in this order
#   PROGRAMS ["c torch"]  PROVIDERS ["tcp shm"]  VERSIONS ["6 7 8 9 10 11"]
#   BUDGET_S [540]        wall-clock budget of the whole script; runs that would not fit are SKIPPED
#   FULL_TIMEOUT [120]    per full-sweep run (seconds)    QUICK_TIMEOUT [45]  per --quick run
#   HUNG_TIMEOUT [30]     cap for later Fabric runs of a provider once one of its runs timed out
#   FULL_SIZES / QUICK_SIZES  override the programs' size lists (e.g. "8,1K,1M")
#   OP_TIMEOUT [60]       programs' own per-collective timeout
#   EXPECT_ALL_VERSION [11]   table NCCL 2.28 must load from libnccl-net-fabric.so
#   NCCL_DEBUG_SUBSYS_RUN ["INIT,ENV,NET"]   EXTRA_ENV ["" ; "A=1 B=2" added to every run]
#   IGNORE_OTHER_WARN [0] 1: NCCL WARN lines unrelated to the network don't fail a run
#   NRANKS [2]  WORK_DIR [mktemp]  NCCL_CHECK_BIN (skip the build)  TORCHRUN (command)
set -u -o pipefail

usage() { sed -n '2,/^set /p' "$0" | grep '^#' >&2; exit 2; }
[ $# -eq 2 ] || usage
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ -d "$1" ] || { echo "run.sh: plugin dir '$1' does not exist" >&2; exit 2; }
PLUGIN_DIR=$(cd "$1" && pwd)
mkdir -p "$2" || { echo "run.sh: cannot create out dir '$2'" >&2; exit 2; }
OUT_DIR=$(cd "$2" && pwd)

PHASES=${PHASES:-"full baseline versions"}
PROGRAMS=${PROGRAMS:-"c torch"}
PROVIDERS=${PROVIDERS:-"tcp shm"}
VERSIONS=${VERSIONS:-"6 7 8 9 10 11"}
BUDGET_S=${BUDGET_S:-540}
FULL_TIMEOUT=${FULL_TIMEOUT:-120}
QUICK_TIMEOUT=${QUICK_TIMEOUT:-45}
HUNG_TIMEOUT=${HUNG_TIMEOUT:-30}
RESERVE_S=${RESERVE_S:-25}
MIN_RUN_S=${MIN_RUN_S:-20}
OP_TIMEOUT=${OP_TIMEOUT:-60}
FULL_SIZES=${FULL_SIZES:-}
QUICK_SIZES=${QUICK_SIZES:-}
EXPECT_ALL_VERSION=${EXPECT_ALL_VERSION:-11}
NCCL_DEBUG_SUBSYS_RUN=${NCCL_DEBUG_SUBSYS_RUN:-INIT,ENV,NET}
EXTRA_ENV=${EXTRA_ENV:-}
IGNORE_OTHER_WARN=${IGNORE_OTHER_WARN:-0}
NRANKS=${NRANKS:-2}
WORK=${WORK_DIR:-$(mktemp -d /tmp/fabric-gpu.XXXXXX)}
mkdir -p "$WORK/logs" "$WORK/bin" "$WORK/inc"

# Everything this script prints also goes to run.log.
exec > >(tee -a "$OUT_DIR/run.log") 2>&1
TEE_PID=$!

ts() { date +%H:%M:%S; }
log() { echo "[$(ts) +${SECONDS}s] $*"; }

log "fabric GPU check: plugin dir $PLUGIN_DIR, out dir $OUT_DIR, work dir $WORK"
log "phases: $PHASES | programs: $PROGRAMS | providers: $PROVIDERS | versions: $VERSIONS | budget ${BUDGET_S}s"

# ---------------------------------------------------------------- environment record
ENVTXT=$WORK/env.txt
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname 2>/dev/null)"
  echo "kernel: $(uname -r)"
  echo "--- nvidia-smi -L"; nvidia-smi -L 2>&1 | head -16
  echo "--- gcc: $(gcc --version 2>&1 | head -1)"
  echo "--- nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) | tail -1)"
  echo "--- system NCCL"; ls -la /usr/lib/x86_64-linux-gnu/libnccl* 2>&1
  echo "--- libfabric"; (ldconfig -p 2>/dev/null | grep -i libfabric) || echo "libfabric not in ldconfig cache"
  echo "--- inherited NCCL_/FI_/FABRIC_/TORCH_ variables"; env | grep -E '^(NCCL_|FI_|FABRIC_|TORCH_|CUDA_VISIBLE)' | sort
  echo "--- plugin dir"; ls -la "$PLUGIN_DIR"
} >"$ENVTXT" 2>&1
log "environment recorded in env.txt: $(grep -c . "$ENVTXT") lines; GPUs: $(nvidia-smi -L 2>/dev/null | grep -c GPU)"

# Exported net tables of each library, and whether libfabric resolves.
LIBS_TSV=$WORK/libs.tsv
printf 'lib\tfile\texports\tldd\n' >"$LIBS_TSV"
lib_file() { if [ "$1" = all ]; then echo "$PLUGIN_DIR/libnccl-net-fabric.so"; else echo "$PLUGIN_DIR/libnccl-net-fabric-$1.so"; fi; }
for lib in all $(for v in $VERSIONS; do echo "v$v"; done); do
  f=$(lib_file "$lib")
  if [ -f "$f" ]; then
    ex=$(nm -D --defined-only "$f" 2>/dev/null | awk '{print $NF}' | grep -E '^nccl(Net|CollNet|Gin)Plugin_v[0-9]+$' | sort -V | tr '\n' ' ')
    lddout=$(ldd "$f" 2>&1)
    if echo "$lddout" | grep -q "not found"; then ldds="MISSING: $(echo "$lddout" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
    else ldds=$(echo "$lddout" | grep -o 'libfabric[^ ]* => [^ ]*' | head -1); fi
    printf '%s\t%s\t%s\t%s\n' "$lib" "$f" "${ex:-?}" "${ldds:-?}" >>"$LIBS_TSV"
    log "library $lib: $(basename "$f") exports [${ex:-none found}] ${ldds:-}"
    [ ${#f} -lt 250 ] || log "WARNING: path longer than NCCL's 255-char limit for NCCL_NET_PLUGIN: $f"
  else
    printf '%s\t%s\t%s\t%s\n' "$lib" "$f" "MISSING" "-" >>"$LIBS_TSV"
    log "library $lib: MISSING ($f)"
  fi
done

# ---------------------------------------------------------------- build nccl_check against the system NCCL
BUILD_LOG=$WORK/build.log
NCCL_CHECK=""
build_nccl_check() {
  local inc lib cuda="" cudainc="" cudart="" d f nvcc
  inc=${NCCL_INCLUDE:-}
  lib=${NCCL_LIBRARY:-}
  if [ -z "$inc" ]; then for d in /usr/include /usr/local/include /usr/local/cuda/include; do [ -f "$d/nccl.h" ] && { inc=$d; break; }; done; fi
  if [ -z "$lib" ]; then
    for f in /usr/lib/x86_64-linux-gnu/libnccl.so.2 /usr/lib64/libnccl.so.2 /usr/local/lib/libnccl.so.2 /usr/local/cuda/lib64/libnccl.so.2; do
      [ -e "$f" ] && { lib=$f; break; }
    done
  fi
  nvcc=$(command -v nvcc 2>/dev/null || true)
  [ -n "$nvcc" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc; }
  # CUDA: headers (cuda_runtime.h) and the runtime library (libcudart.so*).
  for d in ${CUDA_HOME:-} /usr/local/cuda ${nvcc:+"$(dirname "$(dirname "$(readlink -f "$nvcc")")")"} /usr/local/cuda-13.0 /usr; do
    [ -n "$d" ] || continue
    for f in "$d/include" "$d/targets/x86_64-linux/include"; do
      [ -f "$f/cuda_runtime.h" ] && { cudainc=$f; cuda=$d; break 2; }
    done
  done
  for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu; do
    for f in "$d/libcudart.so" "$d"/libcudart.so.[0-9]*; do
      [ -e "$f" ] && { cudart=$f; break 2; }
    done
  done
  {
    echo "nccl.h: $inc ($(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH)' "$inc/nccl.h" 2>/dev/null | awk '{print $3}' | paste -sd.))"
    echo "libnccl: $lib -> $(readlink -f "$lib" 2>/dev/null)"
    echo "cuda: $cuda (headers $cudainc, runtime $cudart, nvcc ${nvcc:-none})"
  } >"$BUILD_LOG"
  if [ -z "$inc" ] || [ -z "$lib" ] || [ ! -f "$inc/nccl.h" ]; then echo "nccl.h or libnccl.so.2 not found" >>"$BUILD_LOG"; return 1; fi
  if [ -z "$cudainc" ]; then echo "cuda_runtime.h not found (set CUDA_HOME)" >>"$BUILD_LOG"; return 1; fi
  # A private copy of nccl.h so that no other nccl.h on the include path (CUDA's own) can win.
  cp "$inc/nccl.h" "$WORK/inc/nccl.h" || return 1
  local rpath cmd
  rpath=$(dirname "$lib")
  if [ -n "$cudart" ]; then
    rpath=$rpath:$(dirname "$cudart")
    # shellcheck disable=SC2054 # the commas belong to -Wl
    cmd=(gcc -O2 -g -std=gnu11 -Wall -Wextra -I"$WORK/inc" -I"$cudainc" "$HERE/nccl_check.c"
         -o "$WORK/bin/nccl_check" "$lib" "$cudart" -Wl,--disable-new-dtags,-rpath,"$rpath")
    echo "+ ${cmd[*]}" >>"$BUILD_LOG"
    if "${cmd[@]}" >>"$BUILD_LOG" 2>&1; then
      echo "--- ldd" >>"$BUILD_LOG"; ldd "$WORK/bin/nccl_check" >>"$BUILD_LOG" 2>&1
      return 0
    fi
  fi
  if [ -n "$nvcc" ]; then  # fallback: nvcc (static cudart)
    # shellcheck disable=SC2054 # the commas belong to -Xcompiler
    cmd=("$nvcc" -O2 -x c -Xcompiler -Wall,-Wextra -I"$WORK/inc" "$HERE/nccl_check.c" -o "$WORK/bin/nccl_check"
         -Xlinker "$lib" -Xlinker --disable-new-dtags -Xlinker -rpath="$(dirname "$lib")")
    echo "+ ${cmd[*]}" >>"$BUILD_LOG"
    if "${cmd[@]}" >>"$BUILD_LOG" 2>&1; then
      echo "--- ldd" >>"$BUILD_LOG"; ldd "$WORK/bin/nccl_check" >>"$BUILD_LOG" 2>&1
      return 0
    fi
  fi
  return 1
}
need_c=0
case " $PROGRAMS " in *" c "*) need_c=1 ;; esac
case " $PHASES " in *" versions "*) need_c=1 ;; esac
if [ -n "${NCCL_CHECK_BIN:-}" ]; then
  NCCL_CHECK=$NCCL_CHECK_BIN
  log "nccl_check: using prebuilt $NCCL_CHECK"
elif [ $need_c = 1 ]; then
  if build_nccl_check; then
    NCCL_CHECK=$WORK/bin/nccl_check
    log "nccl_check built: $(grep -E '^(nccl.h|libnccl):' "$BUILD_LOG" | tr '\n' ' ')"
    grep -E 'warning|error' "$BUILD_LOG" | head -5
  else
    log "nccl_check BUILD FAILED; C runs will be marked BUILD_FAILED. Last lines of build.log:"
    tail -15 "$BUILD_LOG"
  fi
fi

# ---------------------------------------------------------------- torchrun
if [ -n "${TORCHRUN:-}" ]; then
  read -r -a TORCHRUN_CMD <<<"$TORCHRUN"
elif command -v torchrun >/dev/null 2>&1; then
  TORCHRUN_CMD=(torchrun)
else
  TORCHRUN_CMD=(python3 -m torch.distributed.run)
fi

# ---------------------------------------------------------------- one configuration
CONFIGS=$WORK/configs.tsv
printf 'name\tprogram\tphase\tnet\tprovider\tlib\tlibfile\texpect_version\trc\tseconds\tnote\n' >"$CONFIGS"

# Variables inherited from the caller that would change what NCCL or libfabric does.
mapfile -t INHERITED < <(compgen -e | grep -E '^(NCCL_|FI_|FABRIC_)' || true)
UNSET_ARGS=()
for v in "${INHERITED[@]}"; do UNSET_ARGS+=(-u "$v"); done
read -r -a EXTRA_ARR <<<"$EXTRA_ENV"

# Kill what a run left behind, by the pids it wrote (torchrun's workers may live in their own session).
reap_pids() {
  local dir=$1 f pid
  for f in "$dir"/pid.*; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null)
    [ -n "$pid" ] || continue
    if [ -d "/proc/$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -e torch_check -e nccl_check; then
      log "  reaping leftover process $pid ($(basename "$f"))"
      kill -KILL "$pid" 2>/dev/null
    fi
  done
}

declare -A HUNG=()  # provider -> 1 once a Fabric run with it timed out

# run_config NAME PROGRAM PHASE NET PROVIDER LIB MODE TIMEOUT
run_config() {
  local name=$1 prog=$2 phase=$3 net=$4 prov=$5 lib=$6 mode=$7 tmo=$8
  local dir=$WORK/logs/$name libfile="-" expect="-" rc note="" t0 secs
  mkdir -p "$dir"
  if [ "$net" = Fabric ]; then
    libfile=$(lib_file "$lib")
    if [ "$lib" = all ]; then expect=$EXPECT_ALL_VERSION; else expect=${lib#v}; fi
  fi
  if [ "$net" = Fabric ] && [ "${HUNG[$prov]:-0}" = 1 ] && [ "$tmo" -gt "$HUNG_TIMEOUT" ]; then
    log "$name: an earlier $prov run timed out; timeout cut to ${HUNG_TIMEOUT}s"
    tmo=$HUNG_TIMEOUT
  fi
  local remaining=$((BUDGET_S - SECONDS - RESERVE_S))
  if [ "$remaining" -lt "$MIN_RUN_S" ]; then
    note="SKIPPED: budget (${remaining}s left)"
  elif [ "$tmo" -gt "$remaining" ]; then
    tmo=$remaining
  fi
  if [ -z "$note" ] && [ "$net" = Fabric ] && [ ! -f "$libfile" ]; then note="SKIPPED: library missing"; fi
  if [ -z "$note" ] && [ "$prog" = c ] && [ -z "$NCCL_CHECK" ]; then note="SKIPPED: BUILD_FAILED"; fi
  if [ -n "$note" ]; then
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$prog" "$phase" "$net" "$prov" "$lib" "$libfile" "$expect" "-" 0 "$note" >>"$CONFIGS"
    log "$name: $note"
    return
  fi

  local envs=(NCCL_DEBUG=INFO "NCCL_DEBUG_SUBSYS=$NCCL_DEBUG_SUBSYS_RUN" "NCCL_DEBUG_FILE=$dir/nccl.%h.%p.log"
              NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_SOCKET_IFNAME=lo
              GLOO_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 "CHECK_PID_DIR=$dir")
  local specific=()
  if [ "$net" = Fabric ]; then
    specific+=("NCCL_NET_PLUGIN=$libfile" NCCL_NET=Fabric)
    case $prov in
      tcp) specific+=(FI_PROVIDER=tcp FI_TCP_IFACE=lo) ;;
      shm) specific+=(FI_PROVIDER=shm) ;;
      *) specific+=("FI_PROVIDER=$prov") ;;
    esac
  else
    specific+=(NCCL_NET_PLUGIN=none NCCL_NET=Socket)
  fi
  specific+=("${EXTRA_ARR[@]}")
  envs+=("${specific[@]}")

  local args=(--provider "$prov" --net "$net" --lib "$lib" --op-timeout "$OP_TIMEOUT" --nranks "$NRANKS")
  if [ "$mode" = quick ]; then
    if [ -n "$QUICK_SIZES" ]; then args+=(--sizes "$QUICK_SIZES"); else args+=(--quick); fi
  elif [ -n "$FULL_SIZES" ]; then
    args+=(--sizes "$FULL_SIZES")
  fi
  local cmd
  if [ "$prog" = c ]; then
    cmd=("$NCCL_CHECK" "${args[@]}")
  else
    # torch_check takes the same options except --nranks (torchrun's --nproc_per_node).
    local targs=() skip=0 a
    for a in "${args[@]}"; do
      if [ $skip = 1 ]; then skip=0; continue; fi
      if [ "$a" = --nranks ]; then skip=1; continue; fi
      targs+=("$a")
    done
    cmd=("${TORCHRUN_CMD[@]}" --standalone --nnodes=1 --nproc_per_node="$NRANKS" "$HERE/torch_check.py" "${targs[@]}")
  fi
  printf '%s\n' "${envs[@]}" >"$dir/env.txt"
  printf '%q ' "${cmd[@]}" >"$dir/cmd.txt"; echo >>"$dir/cmd.txt"
  log "$name: start (timeout ${tmo}s): ${specific[*]} ${cmd[*]}"
  t0=$SECONDS
  timeout -k 15 "$tmo" env "${UNSET_ARGS[@]}" "${envs[@]}" "${cmd[@]}" >"$dir/stdout.txt" 2>"$dir/stderr.txt" </dev/null
  rc=$?
  secs=$((SECONDS - t0))
  reap_pids "$dir"
  case $rc in 124|137) note="TIMEOUT after ${tmo}s"; [ "$net" = Fabric ] && HUNG[$prov]=1 ;; esac
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$prog" "$phase" "$net" "$prov" "$lib" "$libfile" "$expect" "$rc" "$secs" "$note" >>"$CONFIGS"

  # Progress line: rows, loaded table, network, WARN count.
  local rows pass loaded using warns
  rows=$(grep -cE '(^|\]: *)(nccl|torch)_check,' "$dir/stdout.txt")
  pass=$(grep -cE '(^|\]: *)(nccl|torch)_check,.*,PASS$' "$dir/stdout.txt")
  loaded=$(cat "$dir"/nccl.*.log "$dir/stdout.txt" 2>/dev/null | grep -o 'Loaded net plugin [^ ]* (v[0-9]*)' | sed 's/Loaded net plugin //' | sort -u | tr '\n' ' ')
  using=$(cat "$dir"/nccl.*.log "$dir/stdout.txt" 2>/dev/null | grep -o 'Using network [^ ]*' | sed 's/Using network //' | sort -u | tr '\n' ' ')
  warns=$(cat "$dir"/nccl.*.log "$dir/stdout.txt" "$dir/stderr.txt" 2>/dev/null | grep -c 'NCCL WARN')
  log "$name: rc=$rc ${note:+($note) }in ${secs}s; rows $pass/$rows PASS; loaded [${loaded% }] using [${using% }]; NCCL WARN lines: $warns"
  if [ "$rc" != 0 ]; then
    log "$name: last stderr lines:"
    tail -8 "$dir/stderr.txt" | sed 's/^/    /'
  fi
}

# ---------------------------------------------------------------- the matrix
for phase in $PHASES; do
  case $phase in
    full)
      for prog in $PROGRAMS; do
        for prov in $PROVIDERS; do run_config "$prog-full-$prov-all" "$prog" full Fabric "$prov" all full "$FULL_TIMEOUT"; done
      done ;;
    baseline)
      for prog in $PROGRAMS; do run_config "$prog-baseline-socket" "$prog" baseline Socket none none full "$FULL_TIMEOUT"; done ;;
    versions)
      for v in $VERSIONS; do
        for prov in $PROVIDERS; do run_config "c-ver-$prov-v$v" c versions Fabric "$prov" "v$v" quick "$QUICK_TIMEOUT"; done
      done ;;
    *) log "unknown phase '$phase' (known: full baseline versions)" ;;
  esac
done

# ---------------------------------------------------------------- summary, warnings, logs
log "all runs done; summarizing"
SUMMARY_RC=1
if python3 "$HERE/summarize.py" --work "$WORK" --out "$OUT_DIR" --ignore-other-warn "$IGNORE_OTHER_WARN"; then
  SUMMARY_RC=0
else
  SUMMARY_RC=$?
  [ -f "$OUT_DIR/summary.md" ] || {
    log "summarize.py failed (rc $SUMMARY_RC); writing a bare results.csv"
    { echo "program,provider,net,version_lib,op,bytes,time_us,algbw_GBs,busbw_GBs,correct"
      cat "$WORK"/logs/*/stdout.txt 2>/dev/null | grep -E '^(nccl|torch)_check,'; } >"$OUT_DIR/results.csv"
    cp "$CONFIGS" "$OUT_DIR/summary.md"
    touch "$OUT_DIR/warnings.txt"
  }
fi

# Bundle the logs: large files are cut to their first 2 MiB and last 1 MiB inside the bundle.
BUNDLE=$WORK/bundle
rm -rf "$BUNDLE"; mkdir -p "$BUNDLE"
cp -r "$WORK/logs" "$BUNDLE/" 2>/dev/null
cp "$CONFIGS" "$ENVTXT" "$LIBS_TSV" "$BUNDLE/" 2>/dev/null
[ -f "$BUILD_LOG" ] && cp "$BUILD_LOG" "$BUNDLE/"
find "$BUNDLE" -type f -size +3M | while read -r f; do
  { head -c 2097152 "$f"; printf '\n[... cut by run.sh ...]\n'; tail -c 1048576 "$f"; } >"$f.cut" && mv "$f.cut" "$f"
done
tar -czf "$OUT_DIR/nccl-logs.tar.gz" -C "$BUNDLE" . 2>/dev/null
size=$(stat -c %s "$OUT_DIR/nccl-logs.tar.gz" 2>/dev/null || echo 0)
if [ "$size" -gt 15000000 ]; then
  log "log bundle is $size bytes; cutting every log to 256 KiB"
  find "$BUNDLE" -type f -size +256k | while read -r f; do head -c 262144 "$f" >"$f.cut" && mv "$f.cut" "$f"; done
  tar -czf "$OUT_DIR/nccl-logs.tar.gz" -C "$BUNDLE" . 2>/dev/null
fi
log "out dir: $(find "$OUT_DIR" -maxdepth 1 -type f -printf '%f (%s B) ')"

echo
echo "==================================================================== summary.md"
cat "$OUT_DIR/summary.md"
if [ -f "$WORK/verdict.md" ]; then
  echo
  echo "==================================================================== verdict (repeated from summary.md)"
  cat "$WORK/verdict.md"
fi
log "finished in ${SECONDS}s; exit status $SUMMARY_RC (0 = every configuration passed)"
# Let tee flush run.log before exiting.
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit "$SUMMARY_RC"
