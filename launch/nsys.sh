#!/usr/bin/env bash
# Nsight Systems around a torchrun job: CUDA, NVTX and OS runtime, one report per rank. NVTX
# carries the harness:* phase ranges and NCCL's own ranges (Nsight Systems has no `nccl` trace
# option: NCCL reports through NVTX).
#   launch/nsys.sh --nproc_per_node 2 -- --mode comm
# Arguments before `--` go to torchrun, after it to harness.train. NSYS_OUT sets the folder
# [profiler_logs/nsys]. harness.train runs with --no-profile: torch.profiler (Kineto) and Nsight
# Systems would both subscribe to CUPTI, which takes one subscriber (a --profile of yours comes
# later on the command line and wins).
set -euo pipefail
command -v nsys >/dev/null || { echo "nsys.sh: nsys (Nsight Systems) is not on PATH; install it or load its module" >&2; exit 2; }
torchrun_args=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do torchrun_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
no_profile=(--no-profile)
for arg in "$@"; do [ "$arg" = "--no-profile" ] && no_profile=(); done
out=${NSYS_OUT:-profiler_logs/nsys}
mkdir -p "$out"
# %q{RANK} puts each rank's RANK environment variable into its report name.
exec torchrun "${torchrun_args[@]}" --no-python \
    nsys profile --trace cuda,nvtx,osrt --sample none --cpuctxsw none \
    --capture-range=none --force-overwrite true --output "$out/rank%q{RANK}" \
    python -m harness.train "${no_profile[@]}" "$@"
