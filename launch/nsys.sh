#!/usr/bin/env bash
# Nsight Systems around a torchrun job: CUDA, NVTX (the harness:* phase ranges), OS runtime and
# NCCL, one report per rank.
#   launch/nsys.sh --nproc_per_node 2 -- --mode comm --no-profile
# Arguments before `--` go to torchrun, after it to harness.train. NSYS_OUT sets the folder
# [profiler_logs/nsys]. Tip: pass --no-profile so torch.profiler and Nsight don't both trace.
set -euo pipefail
command -v nsys >/dev/null || { echo "nsys.sh: nsys (Nsight Systems) is not on PATH; install it or load its module" >&2; exit 2; }
torchrun_args=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do torchrun_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=${NSYS_OUT:-profiler_logs/nsys}
mkdir -p "$out"
# %q{RANK} puts each rank's RANK environment variable into its report name.
exec torchrun "${torchrun_args[@]}" --no-python \
    nsys profile --trace cuda,nvtx,osrt,nccl --sample none --cpuctxsw none \
    --capture-range=none --force-overwrite true --output "$out/rank%q{RANK}" \
    python -m harness.train "$@"
