#!/usr/bin/env bash
# Every GPU path of the harness in one command, for a GPU machine lent for a few minutes: the
# self-check's GPU checks, the overhead bench, a lab sweep and the lab-modes check, most important first, each
# cut short where the time left (BUDGET_S, default 540 s) would not hold it. Run from the repo
# root with the machine's own python3 (the one that has PyTorch); no install is made: the
# wheels of launch/gpu_wheels.sh (.whl/) go to /tmp/site, the checkout goes on PYTHONPATH.
# Results go to $OUT (default profiler_logs/gpu-check/): device.txt, selfcheck.json and one log
# per stage, runs.tar.gz (the runs' logs, reports and traces): 8 files. `pytest -m gpu` runs the
# self-check's GPU checks again under pytest (tests/test_gpu.py), left out here to save the time.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-profiler_logs/gpu-check}
BUDGET_S=${BUDGET_S:-540}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d)

# stage NAME SECONDS CMD...: runs CMD with at most SECONDS (less where the budget has less left,
# keeping 10 s to copy results), its output in $OUT/NAME.log; skipped under 30 s left.
stage() {
    local name=$1 want=$2
    shift 2
    local left=$((BUDGET_S - SECONDS - 10))
    local limit=$((want < left ? want : left))
    if [ "$limit" -lt 30 ]; then
        echo "$name: skipped, ${left}s of the budget left" | tee -a "$OUT/summary.log"
        return
    fi
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - t0))s (limit ${limit}s)" | tee -a "$OUT/summary.log"
}

{
    nvidia-smi -L 2>&1
    "$PY" -c "import torch; c = torch.cuda.is_available(); print('torch', torch.__version__, 'cuda', c, torch.cuda.get_device_name(0) if c else '')"
    command -v nsys ncu 2>&1
    # the native tabler, as `pip install` builds it (optional: the collector falls back to Python)
    timeout 90 "$PY" setup.py -q build_ext --inplace 2>&1 | tail -3
    "$PY" -c "from harness.traces import native; print('native tabler built:', native.extension is not None)" 2>&1
} > "$OUT/device.txt" 2>&1
# 300 s: its GPU checks are the issue's core (the lab sweep and the lab-modes check repeat parts of it)
stage selfcheck 300 "$PY" -m harness.selfcheck --quick --out "$WORK/selfcheck"
cp "$WORK/selfcheck/selfcheck.json" "$OUT/" 2>/dev/null
stage overhead 120 "$PY" bench/overhead.py --mode torch --device cuda --steps 200 --reps 3
stage lab 150 "$PY" -m harness.lab three-run --log-dir "$WORK/lab" --row-timeout-s 120
stage lab_modes 120 "$PY" -m harness.selfcheck --only "lab modes" --out "$WORK/lab-modes"
# The runs' step logs, reports and traces, to read offline; past 15 MB only the one-process traced
# run keeps its trace (the smallest GPU trace: what the collector's GPU rules are checked on).
tar -czf "$OUT/runs.tar.gz" -C "$WORK" . 2>/dev/null
if [ "$(stat -c %s "$OUT/runs.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
    rm -f "$OUT/runs.tar.gz"
    tar -cf "$WORK.tar" -C "$WORK" --exclude='*.pt.trace.json*' . 2>/dev/null
    (cd "$WORK" && tar -rf "$WORK.tar" selfcheck/runs/traced/*.pt.trace.json* 2>/dev/null)
    gzip -c "$WORK.tar" > "$OUT/runs.tar.gz" && rm -f "$WORK.tar"
fi
