#!/usr/bin/env bash
# Stand-in for torchrun in the self-test: runs the mock nccl_check ($FAKE_TORCH_BIN)
# with the script's options and relabels its lines as torch_check's.
set -u -o pipefail
nproc=2
while [ $# -gt 0 ]; do
  case $1 in
    --nproc_per_node=*) nproc=${1#*=}; shift ;;
    *.py) shift; break ;;
    *) shift ;;
  esac
done
"$FAKE_TORCH_BIN" --nranks "$nproc" "$@" | sed -u 's/^nccl_check,/torch_check,/'
