#!/usr/bin/env bash
# Runs a command for CTest and checks its exit status AND its output; CTest's
# PASS_REGULAR_EXPRESSION alone would ignore the exit status.
# usage: expect_run.sh (--ok | --fails) [--match ERE]... [--no-match ERE]... -- command [args...]
#   --ok       the command must exit 0;  --fails  it must exit non-zero (not by a signal)
#   --match    its output (stdout and stderr) must match ERE; --no-match: must not
set -uo pipefail
want="" matches=() rejects=()
while (($#)); do
  case $1 in
    --ok) want=ok ;;
    --fails) want=fails ;;
    --match) matches+=("$2"); shift ;;
    --no-match) rejects+=("$2"); shift ;;
    --) shift; break ;;
    *) echo "expect_run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $want && $# -gt 0 ]] || { echo "expect_run.sh: need --ok or --fails and a command after --" >&2; exit 2; }
out=$(mktemp) || exit 2
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
bad=0
if [[ $want == ok && $status -ne 0 ]]; then
  echo "expect_run.sh: FAILED: exit status $status, expected 0" >&2; bad=1
elif [[ $want == fails && ($status -eq 0 || $status -gt 128) ]]; then
  echo "expect_run.sh: FAILED: exit status $status, expected a failure exit (1..128)" >&2; bad=1
fi
for re in "${matches[@]}"; do
  grep -Eq -- "$re" "$out" || { echo "expect_run.sh: FAILED: no output line matches '$re'" >&2; bad=1; }
done
for re in "${rejects[@]}"; do
  grep -Eq -- "$re" "$out" && { echo "expect_run.sh: FAILED: output matches '$re'" >&2; bad=1; }
done
exit $bad
