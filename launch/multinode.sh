#!/usr/bin/env bash
# Multi-node launch: run this once on every node (same arguments, its own NODE_RANK).
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 launch/multinode.sh --mode comm --parallel fsdp
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=node0 launch/multinode.sh --mode comm --parallel fsdp
#
# Environment (defaults in brackets):
#   NNODES          number of nodes [1]
#   NODE_RANK       this node's index, 0..NNODES-1 [0]; informational with c10d rendezvous,
#                   which assigns ranks itself (torchrun orders nodes by arrival)
#   NPROC_PER_NODE  processes per node [GPUs this node's processes see: the entries of
#                   CUDA_VISIBLE_DEVICES when it is set, else nvidia-smi -L; at least 1]
#   MASTER_ADDR     host of the c10d rendezvous store, reachable from every node [127.0.0.1]
#   MASTER_PORT     its port [29500]
#   RDZV_ID         rendezvous id, the same on every node of one job [harness-<MASTER_PORT>]
#   LOCAL_ADDR      address this node advertises to the others [torchrun's choice]
#   MAX_RESTARTS    torchrun --max-restarts [0]
#   TORCHRUN        the torchrun to use [torchrun on PATH, else .venv/bin/torchrun]
#
# Every node writes its ranks' files under its own profiler_logs/<run>/ (the run name is agreed
# by all ranks). Gather those folders in one place and run the collector over them.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
if [ -z "${NPROC_PER_NODE:-}" ]; then
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        # nvidia-smi lists every GPU of the node; CUDA (and so each rank) sees only these.
        # Set but empty: CUDA sees none, and one process runs.
        IFS=, read -ra visible <<< "$CUDA_VISIBLE_DEVICES"
        NPROC_PER_NODE=${#visible[@]}
    else
        NPROC_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    fi
    [ "${NPROC_PER_NODE:-0}" -gt 0 ] || NPROC_PER_NODE=1
fi
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
RDZV_ID=${RDZV_ID:-harness-$MASTER_PORT}
MAX_RESTARTS=${MAX_RESTARTS:-0}
TORCHRUN=${TORCHRUN:-$(command -v torchrun || echo "$here/.venv/bin/torchrun")}
extra=()
[ -n "${LOCAL_ADDR:-}" ] && extra+=(--local-addr "$LOCAL_ADDR")

echo "multinode: node $NODE_RANK of $NNODES, $NPROC_PER_NODE proc(s), rendezvous $MASTER_ADDR:$MASTER_PORT ($RDZV_ID)" >&2
exec "$TORCHRUN" \
    --nnodes "$NNODES" \
    --nproc-per-node "$NPROC_PER_NODE" \
    --rdzv-backend c10d \
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    --rdzv-id "$RDZV_ID" \
    --max-restarts "$MAX_RESTARTS" \
    "${extra[@]}" \
    -m harness.train "$@"
