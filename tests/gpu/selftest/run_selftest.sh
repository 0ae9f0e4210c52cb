#!/usr/bin/env bash
# CPU-only dry run of tests/gpu: builds nccl_check against a mock CUDA/NCCL
# (selftest/mock_cuda_nccl.c), makes stub plugin libraries that export the
# ncclNetPlugin_vN symbols, stands in for torchrun, and drives run.sh through
# passing and failing scenarios. Also compares the data pattern of the C
# program and torch_check.py. Needs gcc, python3, CUDA and NCCL headers.
#
#   bash tests/gpu/selftest/run_selftest.sh
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GPU=$(dirname "$HERE")
T=$(mktemp -d /tmp/fabric-gpu-selftest.XXXXXX)
CUDA_INC=${CUDA_INC:-/usr/local/cuda/include}
NCCL_INC=${NCCL_INC:-}
if [ -z "$NCCL_INC" ]; then for d in /usr/include /usr/local/include "$CUDA_INC"; do [ -f "$d/nccl.h" ] && { NCCL_INC=$d; break; }; done; fi
npass=0 nfail=0
ok() { echo "ok   - $*"; npass=$((npass + 1)); }
bad() { echo "FAIL - $*"; nfail=$((nfail + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

echo "# work dir $T"
mkdir -p "$T/inc"
cp "$NCCL_INC/nccl.h" "$T/inc/" || { echo "no nccl.h"; exit 1; }
gcc -O1 -g -std=gnu11 -Wall -Wextra -Werror -I"$T/inc" -I"$CUDA_INC" "$GPU/nccl_check.c" "$HERE/mock_cuda_nccl.c" \
  -o "$T/nccl_check_mock" -lrt || { echo "mock build failed"; exit 1; }
ok "nccl_check builds with -Wall -Wextra -Werror (against the mock)"

# Data pattern: C and Python agree.
"$T/nccl_check_mock" --nranks 2 --dump-pattern 5000 >"$T/pattern_c.txt"
if python3 - "$GPU" "$T/pattern_c.txt" <<'PY'; then ok "val(rank, i) is the same in nccl_check.c and torch_check.py"; else bad "data pattern differs"; fi
import sys
sys.path.insert(0, sys.argv[1])
import torch_check as t
m = t.value_mask(2)
for line in open(sys.argv[2]):
    r, i, v = line.split()
    if t.pattern(int(i), int(r), m) != int(v):
        print("mismatch", r, i, v, t.pattern(int(i), int(r), m))
        sys.exit(1)
PY

# Stub plugin libraries.
P=$T/plugins
mkdir -p "$P"
all_syms=""
for v in 6 7 8 9 10 11 12; do
  echo "int ncclNetPlugin_v$v = $v;" >"$T/v$v.c"
  all_syms="$all_syms int ncclNetPlugin_v$v = $v;"
  [ "$v" = 12 ] || gcc -shared -fPIC -o "$P/libnccl-net-fabric-v$v.so" "$T/v$v.c"
done
echo "$all_syms" >"$T/all.c"
gcc -shared -fPIC -o "$P/libnccl-net-fabric.so" "$T/all.c"

export NCCL_CHECK_BIN=$T/nccl_check_mock FAKE_TORCH_BIN=$T/nccl_check_mock TORCHRUN="bash $HERE/fake_torchrun.sh"
export FULL_SIZES=8,1K,64K,1M QUICK_SIZES=8,64K

rows() { tail -n +2 "$1/results.csv" | wc -l; }
nfiles() { find "$1" -type f | wc -l; }

# 1. everything passes
O=$T/out1
WORK_DIR=$T/w1 bash "$GPU/run.sh" "$P" "$O" >"$T/s1.log" 2>&1; rc=$?
check "scenario 1: run.sh exits 0 (rc=$rc)" [ "$rc" = 0 ]
check "scenario 1: 240 result lines ($(rows "$O"))" [ "$(rows "$O")" = 240 ]
check "scenario 1: summary says PASS, 18 of 18" grep -q "Verdict: PASS (18 of 18" "$O/summary.md"
check "scenario 1: five files in out dir ($(nfiles "$O"))" [ "$(nfiles "$O")" = 5 ]
check "scenario 1: log bundle holds NCCL logs" bash -c "tar -tzf '$O/nccl-logs.tar.gz' | grep -q 'logs/c-ver-shm-v7/nccl.mockhost'"
check "scenario 1: matrix shows v6 on tcp" grep -q "libnccl-net-fabric-v6.so (c, versions) | v6 | PASS v6 (want v6)" "$O/summary.md"
check "scenario 1: performance table for torch_check" grep -q "## Performance: torch_check" "$O/summary.md"
check "scenario 1: summary printed at the end" grep -q "verdict (repeated from summary.md)" "$T/s1.log"

# 2. wrong table version loaded
O=$T/out2
PHASES=versions VERSIONS="8 9" PROVIDERS=tcp MOCK_TABLE=9 WORK_DIR=$T/w2 bash "$GPU/run.sh" "$P" "$O" >"$T/s2.log" 2>&1; rc=$?
check "scenario 2: exits 1 (rc=$rc)" [ "$rc" = 1 ]
check "scenario 2: v8 flagged (loaded v9)" grep -q "c-ver-tcp-v8\*\* (FAIL): loaded table v9 (want v8)" "$O/summary.md"
check "scenario 2: v9 passes" grep -q "| c-ver-tcp-v9 |.*\*\*PASS\*\*" "$O/summary.md"

# 3. wrong data and a WARN line
O=$T/out3
PHASES=full PROGRAMS=c PROVIDERS=tcp MOCK_CORRUPT=all_gather:1024:1 MOCK_WARN="NET/Fabric : injected warning" \
  WORK_DIR=$T/w3 bash "$GPU/run.sh" "$P" "$O" >"$T/s3.log" 2>&1; rc=$?
check "scenario 3: exits 1 (rc=$rc)" [ "$rc" = 1 ]
check "scenario 3: the FAIL line is in results.csv" grep -q "^nccl_check,tcp,Fabric,all,all_gather,1024,.*,FAIL$" "$O/results.csv"
check "scenario 3: WARN collected" grep -q "injected warning" "$O/warnings.txt"
check "scenario 3: reasons name both" grep -q "1 lines not PASS.*2 network/plugin WARN" "$O/summary.md"

# 4. a hang: run.sh's timeout stops it
O=$T/out4
PHASES=full PROGRAMS="c torch" PROVIDERS=tcp MOCK_HANG=all_reduce:1024:1 OP_TIMEOUT=1000 FULL_TIMEOUT=5 HUNG_TIMEOUT=3 \
  WORK_DIR=$T/w4 bash "$GPU/run.sh" "$P" "$O" >"$T/s4.log" 2>&1; rc=$?
check "scenario 4: exits 1 (rc=$rc)" [ "$rc" = 1 ]
check "scenario 4: timed out" grep -q "timed out (rc 124)" "$O/summary.md"
check "scenario 4: the next tcp run gets the short timeout" grep -q "torch-full-tcp-all: an earlier tcp run timed out; timeout cut to 3s" "$T/s4.log"
check "scenario 4: no process left" bash -c "! pgrep -f '$T/nccl_check_moc[k]' >/dev/null"

# 5. the program's own per-op timeout and a crashed rank: ERROR/TIMEOUT/NOTRUN lines
O=$T/out5
PHASES=full PROGRAMS=c PROVIDERS=tcp MOCK_CRASH=broadcast:65536:0 WORK_DIR=$T/w5 bash "$GPU/run.sh" "$P" "$O" >"$T/s5.log" 2>&1; rc=$?
check "scenario 5: exits 1 (rc=$rc)" [ "$rc" = 1 ]
check "scenario 5: ERROR then NOTRUN lines" bash -c "grep -q 'broadcast,65536,.*,ERROR$' '$O/results.csv' && grep -q ',NOTRUN$' '$O/results.csv'"
check "scenario 5: 20 lines for 20 planned tests ($(rows "$O"))" [ "$(rows "$O")" = 20 ]

# 6. budget exhausted and a missing library
O=$T/out6
rm -f "$P/libnccl-net-fabric-v7.so"
PHASES="versions" VERSIONS="7" PROVIDERS=tcp WORK_DIR=$T/w6 bash "$GPU/run.sh" "$P" "$O" >"$T/s6.log" 2>&1; rc=$?
check "scenario 6a: missing library is SKIPPED and fails the run (rc=$rc)" bash -c "[ $rc = 1 ] && grep -q 'SKIPPED: library missing' '$O/summary.md'"
O=$T/out7
BUDGET_S=30 WORK_DIR=$T/w7 bash "$GPU/run.sh" "$P" "$O" >"$T/s7.log" 2>&1; rc=$?
check "scenario 6b: no budget: all SKIPPED, outputs still written (rc=$rc)" bash -c "[ $rc = 1 ] && grep -q 'SKIPPED: budget' '$O/summary.md' && [ -f '$O/nccl-logs.tar.gz' ]"

# Shared-memory segments of mock runs whose ranks were killed.
for f in /dev/shm/mocknccl.*; do
  [ -e "$f" ] || continue
  pid=${f#/dev/shm/mocknccl.}; pid=${pid%%.*}
  [ -d "/proc/$pid" ] || rm -f "$f"
done
echo "# logs in $T"
echo "$npass passed, $nfail failed"
[ "$nfail" = 0 ]
