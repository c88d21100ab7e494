#!/usr/bin/env bash
# Nsight Compute around a torchrun job: kernel-level metrics for the hottest kernels of one rank.
#   launch/ncu.sh --nproc_per_node 2 -- --mode kernel --no-profile --steps 12
# Arguments before `--` go to torchrun, after it to harness.train. Environment: NCU_RANK, the
# rank to profile [0] (others run unprofiled); NCU_KERNELS, a kernel-name regex [all];
# NCU_COUNT, kernels to profile [50]; NCU_SET [detailed]; NCU_OUT [profiler_logs/ncu].
set -euo pipefail
command -v ncu >/dev/null || { echo "ncu.sh: ncu (Nsight Compute) is not on PATH; install it or load its module" >&2; exit 2; }
torchrun_args=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do torchrun_args+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=${NCU_OUT:-profiler_logs/ncu}
mkdir -p "$out"
filter=(); [ -n "${NCU_KERNELS:-}" ] && filter=(--kernel-name "regex:${NCU_KERNELS}")
export NCU_RANK=${NCU_RANK:-0} NCU_COUNT=${NCU_COUNT:-50} NCU_SET=${NCU_SET:-detailed} NCU_OUT=$out
export NCU_FILTER="${filter[*]:-}"
# Each rank decides for itself whether it runs under ncu.
exec torchrun "${torchrun_args[@]}" --no-python bash -c '
if [ "$RANK" = "$NCU_RANK" ]; then
    exec ncu --set "$NCU_SET" --launch-skip 0 --launch-count "$NCU_COUNT" $NCU_FILTER \
        --target-processes all --force-overwrite --export "$NCU_OUT/rank$RANK" python -m harness.train "$@"
else
    exec python -m harness.train "$@"
fi' _ "$@"
