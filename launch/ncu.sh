#!/usr/bin/env bash
# Nsight Compute around a torchrun job: kernel-level metrics for the hot kernels of one rank.
#   launch/ncu.sh --nproc_per_node 2 -- --mode kernel --steps 12
# Arguments before `--` go to torchrun, after it to harness.train, which runs with --no-profile
# (torch.profiler's CUPTI use and ncu don't mix) and --cuda-profiler-api: ncu starts with
# --profile-from-start off and profiles from the first measured step (after --warmup-steps) on,
# not start-up kernels (DDP's parameter broadcast, step 0, autotuning).
# NCCL kernels are left out: ncu replays one kernel at a time, and a collective replayed on one
# rank waits for peers that never come.
# Environment: NCU_RANK, the rank to profile [0] (others run unprofiled); NCU_KERNELS, a regex a
# kernel's function name must match [any]; NCU_SKIP, matching kernels to skip after the warm-up
# [0]; NCU_COUNT, kernels to profile [50]; NCU_SET [detailed]; NCU_NCCL=1 to keep NCCL kernels
# (one process per collective only); NCU_OUT [profiler_logs/ncu].
set -euo pipefail
command -v ncu >/dev/null || { echo "ncu.sh: ncu (Nsight Compute) is not on PATH; install it or load its module" >&2; exit 2; }
torchrun_args=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do torchrun_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
for var in NCU_RANK NCU_SKIP NCU_COUNT; do
    value=${!var:-0}
    [[ "$value" =~ ^[0-9]+$ ]] || { echo "ncu.sh: $var=$value must be a whole number" >&2; exit 2; }
done
out=${NCU_OUT:-profiler_logs/ncu}
mkdir -p "$out"
# One --kernel-name regex (matched anywhere in the function name, as ncu's regex: filters are):
# not starting with "nccl" (ncclKernel_*, ncclDevKernel_*), and containing NCU_KERNELS if set.
regex=${NCU_KERNELS:-}
if [ "${NCU_NCCL:-0}" != 1 ]; then
    regex="^(?!nccl).*${regex:+(?:$regex).*}"
fi
export NCU_REGEX=$regex NCU_RANK=${NCU_RANK:-0} NCU_SKIP=${NCU_SKIP:-0} NCU_COUNT=${NCU_COUNT:-50} \
    NCU_SET=${NCU_SET:-detailed} NCU_OUT=$out
harness_args=(--no-profile --cuda-profiler-api "$@")
for arg in "$@"; do [ "$arg" = "--no-profile" ] && harness_args=(--cuda-profiler-api "$@"); done
# Each rank decides for itself whether it runs under ncu; the regex reaches it through the
# environment and stays one argument (no word splitting, no globbing).
exec torchrun "${torchrun_args[@]}" --no-python bash -c '
if [ "$RANK" = "$NCU_RANK" ]; then
    filter=()
    [ -n "$NCU_REGEX" ] && filter=(--kernel-name-base function --kernel-name "regex:$NCU_REGEX")
    exec ncu --set "$NCU_SET" --profile-from-start off --launch-skip "$NCU_SKIP" --launch-count "$NCU_COUNT" \
        "${filter[@]}" --target-processes all --force-overwrite --export "$NCU_OUT/rank$RANK" \
        python -m harness.train "$@"
else
    exec python -m harness.train "$@"
fi' _ "${harness_args[@]}"
