"""The bottleneck advisor: one verdict per rank, with the numbers behind it and the next step.

Pure function of the collector's `Analysis` (parsed traces on aligned clocks, overlap, matched
collectives, stragglers). Bottlenecks: data-bound, sync-bound, launch-bound, comm-exposed,
kernel-bound, straggler, healthy. Each threshold states its source in `Rules`
(docs/thresholds.md lists those still without one). Blocking syncs are judged by who called them (host.py): the
training code's own, GradScaler's (named as such), DDP's runtime logger's (never counted).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, TypedDict, cast

from harness.sourced import threshold
from harness.traces.analyse.overlap import StepOverlap, data_spans
from harness.traces.analyse.rank_list import ranks_phrase
from harness.traces.model import RankTrace
from harness.traces.read.host_ops import DDP_LOGGER, GRAD_SCALER, NOT_USERS
from harness.traces.read.parse import DDP_REDUCER
from harness.traces.read.phases import is_data
from harness.traces.run_analysis import Analysis

# Dense matrix math: the work a model is made of. On GPU by kernel name, on CPU by aten op.
# `triton_tem_*`: Inductor's template kernels (max-autotune), every one a matmul, convolution
# or flex attention (triton_tem_fused_mm_0, triton_tem_fused_addmm_relu_1, triton_tem_fused_bmm_2).
GEMM = re.compile(
    r"gemm|cutlass|xmma|cublas|nvjet|wgrad|dgrad|fprop|conv|^triton_tem_|"
    r"^aten::(?:mm|addmm|bmm|baddbmm|addmv|mv|dot)$",
    re.IGNORECASE,
)
# CPU ops that move or re-view memory: on GPU these are memcpy/memset (not kernels) or nothing.
MEMORY_OPS = re.compile(
    r"^aten::(?:copy_|_to_copy|to|clone|contiguous|as_strided|view|_unsafe_view|reshape|empty\w*|"
    r"zero_|fill_|resize_|set_|detach|t|transpose|permute|expand|select|slice|unsqueeze|squeeze)$"
)
BOTTLENECKS = (
    "straggler",
    "data-bound",
    "sync-bound",
    "launch-bound",
    "comm-exposed",
    "kernel-bound",
    "host-bound",
    "copy-bound",
    "healthy",
)


@dataclass(frozen=True)
class Rules:
    """Thresholds of the decision tree (shares are of the rank's mean step time), each with its
    source (docs/thresholds.md).

    Healthy needs evidence, not the absence of a rule: compute is the largest part of the
    device's time (ahead of idle, exposed transfer and copies each) and matrix math is at least
    kernel_gemm_share of it, and a GPU is busy at least gpu_bound_busy_share of its time (on
    CPU the main thread's "idle" is the Python between ops, part of any eager step). Otherwise
    the largest of those names the rank: idle (host-bound), exposed transfer (comm-exposed),
    copies (copy-bound), or compute of small kernels."""

    data_share: float = threshold(
        0.10,
        kind="definition",
        source="the step's time lost waiting for the input pipeline at the material share (10% of the step, "
        "bench/detect/score.py: what a cause must cost to be worth naming, as sync_cost_share): on GPU the device's "
        "idle inside the data phase (a wait hidden behind queued kernels costs nothing), on CPU the data phase itself. "
        "torch-tb-profiler advised on DataLoader time over 5% of the step",
    )
    sync_cost_share: float = threshold(
        0.10,
        kind="definition",
        source="GPU idle caused by the training code's blocking syncs (GradScaler's count, named; DDP's logger's "
        "never): the material share of the step (Thresholds.rel_late's); below it removing every sync buys less "
        "than GPU steps vary. A count says little: a sync on an empty queue costs microseconds",
    )
    sync_per_step: float = threshold(
        1.0, kind="definition", source="GradScaler's advice: it syncs at least once a step"
    )
    launch_op_ratio: float = threshold(
        39.0,
        kind="measurement",
        source="each op taking less step time than this many bare ops (RankTrace.op_floor_us, measured in the "
        "same trace) spends the material share (10%) of the step or more on eager overhead: on real GPU traces an "
        "aten op that launches one kernel holds the host 2.1 and 7.2 bare ops (A100, V100; bench/RESULTS.md, "
        "'Eager overhead'), 3.9 their geometric middle, and 3.9 / 0.10 = 39. That counts the op's own host time, "
        "not the Python between ops (a CPU step of overhead alone reads 8.7-9.5 there), so it errs toward fewer "
        "launch-bound verdicts",
    )
    launch_us_per_op: float = threshold(
        20.0,
        kind="measurement",
        source="where the trace cannot measure a bare op: an eager op's dispatch costs 5-20 us of host time from "
        "fast CPUs to shared VMs. On GPU also one launch's host cost: kernels that keep the device busy less than "
        "it per launch end before the host can issue the next",
    )
    comm_transfer_share: float = threshold(
        0.50,
        kind="definition",
        source="communication's transfer (not waiting, DDP's reducer included) half the rank's own step or more: "
        "moving data, not computing, is the larger part of its step",
    )
    comm_exposed_share: float = threshold(
        0.10,
        kind="definition",
        source="of it not hidden behind compute: the material share (10% of the step, bench/detect/score.py: what a "
        "cause must cost to be worth naming, as sync_cost_share); torch-tb-profiler advised on communication "
        "over 10% of the step too",
    )
    kernel_gemm_share: float = threshold(
        0.50,
        kind="definition",
        source="matrix math under half of compute time: the model's own work is not the most of what the device "
        "computes (and healthy needs at least half)",
    )
    gpu_bound_busy_share: float = threshold(
        0.90,
        kind="measurement",
        source="a GPU busy this much (compute, exposed transfer, copies) is GPU-bound, the host ahead of it: healthy "
        "GPU jobs without per-step syncs keep their device 96-99% busy inside every step (real V100/A100 traces, "
        "../shared/design.md, 'GPU time, as real GPU jobs show it'); 0.90 sits below the lowest of those by "
        "the material share's margin. Below it the device idles more than that margin: launch-bound's bound "
        "with many launches, and healthy's floor",
    )


ADVICE = {
    "straggler": "the other ranks wait for this one: fix its slow phase first (see the straggler table); the "
    "rest of the job cannot go faster than it",
    "data-bound": "the input pipeline starves the step: more DataLoader workers (num_workers; the lab: --num-workers), "
    "persistent workers, pinned memory, prefetching; move decoding/augmentation offline or to the GPU",
    "sync-bound": "host-device syncs stall the device every step (.item(), .cpu(), printing tensors, "
    "synchronous copies): keep values on the device, log them every N steps, copy with non_blocking=True "
    "from pinned memory",
    "launch-bound": "eager overhead: the step is many tiny ops and the host cannot issue them fast enough: "
    "torch.compile (fusion), CUDA graphs, a larger batch per step, fused optimizers (foreach/fused)",
    "comm-exposed": "communication is not hidden behind compute: overlap it (DDP bucket_cap_mb, FSDP "
    "prefetch), send less (bf16/fp16 gradients, gradient compression, sparse embeddings), "
    "or do more compute per step (larger batch, gradient accumulation)",
    "kernel-bound": "memory-bound elementwise/normalisation kernels dominate: fuse them (torch.compile), "
    "use bf16/fp16, fused implementations (fused layer norm, fused optimizers)",
    "host-bound": "the device waits on its host: profile the host side (Python overhead between launches, CPU "
    "contention, pinned threads, the ops that run between kernels); wrap the step's parts in "
    "record_function ranges to see which; torch.compile or CUDA graphs take the host off the path",
    "copy-bound": "host-device copies take the device's time: pin host memory and copy with non_blocking=True, "
    "keep tensors on the device between steps, move less (smaller dtypes)",
    "healthy": "the time goes to the model's matrix math with no dominant overhead: scale the batch or the "
    "model, or look at kernel efficiency (precision, tensor cores, channels_last)",
}


# When GradScaler's own found_inf check is what syncs (fp16 with an optimizer that is not fused).
GRAD_SCALER_ADVICE = (
    "GradScaler reads found_inf with .item() before every optimizer step (fp16 autocast with an "
    "optimizer that is not fused): use a fused optimizer (Adam/AdamW/SGD with fused=True: GradScaler "
    "then leaves the check to the optimizer, on the device), or bf16 autocast, which needs no "
    "GradScaler"
)


class Evidence(TypedDict, total=False):
    """The numbers the rules read for one rank (`rank_evidence`, step by step in its docstring),
    as report.json's `diagnosis[].evidence`. Shares are of the rank's own step (its exposed
    waiting for later peers taken out) or of its device time; ms figures are per step."""

    step_ms: float
    """the measured step"""
    own_step_ms: float
    """the step less its exposed waiting for later peers"""
    waiting_share: float
    """exposed waiting / step"""
    data_share: float
    """the step's time lost to the input pipeline / own step: on GPU the device's idle inside the
    data phase, on CPU the data phase (less waiting inside it)"""
    host_ops_per_step: float
    """aten ops dispatched outside the data phase"""
    us_per_op: float | None
    """(own step - data phase) / host ops: the step time each op accounts for"""
    op_floor_us: float | None
    """one bare op's cost on this machine (RankTrace.op_floor_us)"""
    op_cost_ratio: float | None
    """us_per_op / op_floor_us: each op's step time in bare ops"""
    launches_per_step: float
    """kernel launches"""
    device_us_per_launch: float | None
    """GPU: the device's busy time per kernel launch"""
    syncs_per_step: float
    """blocking host-device syncs"""
    sync_share: float
    """blocking sync calls' time / own step"""
    syncs_by_caller: dict[str, float]
    """syncs per step by caller"""
    sync_ms_by_caller: dict[str, float]
    """sync calls' ms per step by caller"""
    user_syncs_per_step: float
    """syncs of callers not in host_ops.NOT_USERS"""
    sync_cost_share: float
    """the device idle the syncs cause / own step"""
    sync_cost_ms_by_caller: dict[str, float]
    """that idle's ms per step by caller"""
    user_sync_cost_share: float
    """the same for callers not in NOT_USERS"""
    compute_share: float
    """compute / device time less exposed waiting"""
    reducer_share: float
    """CPU: DDP's reducer / the same"""
    exposed_transfer_share: float
    """exposed transfer / the same"""
    memcpy_share: float
    """copies and memsets / the same"""
    idle_share: float
    """device idle / the same"""
    device_lag_ms: float | None
    """GPU: how far the device runs behind the host (median over steps)"""
    transfer_share: float
    """collective transfer (+ DDP's reducer) / own step"""
    gemm_share: float
    """matrix-math kernels' share of the model's compute"""
    top_compute: list[list[Any]]
    """[[name, share]] the three largest compute names"""
    device: str
    """"gpu" or "cpu\""""
    practices: list[str]
    """what the trace shows the job already does (practices.py)"""
    waits_for: list[list[Any]]
    """[[rank, ms per step]] the stragglers it waited on beyond the noise"""
    late_ms_per_step: float
    """stragglers: lateness at collectives"""
    cost_ms_per_step: float
    """stragglers: share of the collectives' delay"""
    blame_ms: float
    """stragglers: the others' waiting it caused, total"""
    late_fraction: float
    """stragglers: share of its collectives at which it was late"""
    pattern: str | None
    """stragglers: persistent or intermittent"""
    slow_phase: str | None
    """stragglers: the phase it is slow in"""


@dataclass(frozen=True)
class Diagnosis:
    """`diagnosis[]`: one per rank, judged on the rank's own work (its waiting for later peers
    taken out)."""

    rank: int
    """the rank"""
    host: str
    """its machine"""
    bottleneck: str
    """straggler, data-bound, sync-bound, launch-bound, comm-exposed, kernel-bound or healthy"""
    reason: str
    """the rule that fired, with its numbers"""
    evidence: Evidence
    """the numbers the rules read (`Evidence`)"""
    advice: str
    """what to do about it"""
    waits_for: list[list[Any]]
    """[[rank, ms per step]] the stragglers it waited on beyond the noise, most first"""


def _share(x: float, total: float) -> float:
    return round(x / total, 4) if total > 0 else 0.0


# Per name, not per rank and step: every rank holds the same few hundred names (kernel names are
# long C++ signatures: the searches were 1.6 of 16 s profiled at 1024 ranks x 10 steps).
@functools.lru_cache(maxsize=1 << 16)
def _is_memory_op(name: str) -> bool:
    return MEMORY_OPS.match(name) is not None


@functools.lru_cache(maxsize=1 << 16)
def _is_gemm(name: str) -> bool:
    return GEMM.search(name) is not None


def waiting_in_data(trace: RankTrace, waits: list[tuple[float, float]]) -> float:
    """The time the rank waited for later peers inside its data phases (`waits`: each of its
    collectives' [arrival, arrival + wait], aligned clock): a loop that runs a collective while
    it loads (Hugging Face's Trainer counts tokens across ranks there) waits for a slow rank in
    its data phase, which is the slow rank's input pipeline, not its own."""
    spans = data_spans(trace)
    if not spans or not waits:
        return 0.0
    # each wait meets only the spans that start before it ends, back to where every earlier span
    # has ended before it starts (`reach`: the latest end so far, as spans may overlap): the sum
    # over every (span, wait) pair without visiting the pairs that add nothing
    starts = [a for a, _ in spans]
    reach = list(itertools.accumulate((b for _, b in spans), max))
    total = 0.0
    for w0, w1 in waits:
        j = bisect.bisect_left(starts, w1) - 1
        while j >= 0 and reach[j] > w0:
            a, b = spans[j]
            total += max(min(b, w1) - max(a, w0), 0.0)
            j -= 1
    return total


def rank_evidence(
    trace: RankTrace,
    rows: list[StepOverlap],
    transfer_ms_per_step: float,
    waits: list[tuple[float, float]] | None = None,
) -> Evidence:
    """The per-rank numbers the rules read, means over the rank's analysed steps, judged on the
    rank's own work: the time it spent exposed waiting for later peers (overlap.rank_overlap,
    step 4) is taken out of the step and of the device window first, so a victim is diagnosed
    as it would run without the straggler:

    1. step_ms (measured); waiting_share = exposed waiting / step; own_step_ms = step - exposed
       waiting; data_share = the step's time lost to the input pipeline / own step: on GPU the
       device's idle inside the data phases (overlap.rank_overlap, step 8: a load hidden
       behind queued kernels costs nothing), on CPU the data phase less its waiting for later
       peers (`waiting_in_data`);
    2. host_ops_per_step (the aten ops of every model thread outside the data phase,
       host.count_host_ops) and us_per_op = (own step - data phase) / host ops: the step time
       each dispatched op accounts for; op_cost_ratio = us_per_op / op_floor_us (one bare op's
       dispatch on this machine, host_ops.op_floor_us; null where not measurable);
    3. launches_per_step; device_us_per_launch (GPU) = the device's busy time (compute, exposed
       transfer, copies) / its launches; syncs_per_step, sync_share (blocking sync calls' time / own step);
       syncs_by_caller and sync_ms_by_caller (per step, by host.caller_of's callers);
       user_syncs_per_step: the syncs of callers not in host_ops.NOT_USERS (GradScaler, DDP's logger);
       sync_cost_share (the device idle the syncs cause, host_ops.sync_costs / own step),
       sync_cost_ms_by_caller, user_sync_cost_share (callers not in NOT_USERS);
    4. compute, exposed transfer, copy and idle shares of the device spans less the exposed
       waiting (device time: GPU kernels, or the CPU main thread's ops on CPU-only traces);
       device_lag_ms (GPU): the median over steps of the device's span start - the host's step
       start (how far the device runs behind);
    5. transfer_share = (the run's collective transfer time per step (waits.InstanceWaits
       .transfer_us summed over the step's collectives) + this rank's DDP reducer time per step)
       / own step: on CPU traces DDP's reducer (scaling gradients, copying them into buckets) is
       communication work, so its time also leaves compute_share;
    6. gemm_share = matrix-math kernels' (or ops' self) time / all the model's compute by name
       (forward, loss, backward; CPU memory-movement ops and the reducer left out, as memcpy is
       on GPU); top_compute = the three names with the largest share."""
    steps = trace.steps
    n = max(len(steps), 1)
    step_us = sum(s.dur_us for s in steps) / n
    wait_us = sum(r.exposed_wait_us for r in rows) / n
    own_us = max(step_us - wait_us, 0.0)
    data_us = (
        max(
            sum(v for s in steps for k, v in s.phases_us.items() if is_data(k)) - waiting_in_data(trace, waits or []),
            0.0,
        )
        / n
    )
    # what the wait for the input pipeline costs the step: on GPU the device's idle in it, on CPU
    # all of it (the host is the device)
    data_cost_us = sum(r.idle_in_data_us for r in rows) / n if trace.device == "gpu" else data_us
    ops = sum(s.host_ops for s in steps) / n
    by_name: dict[str, float] = {}
    for s in steps:
        for k, v in s.compute_by_name_us.items():
            if not _is_memory_op(k):
                by_name[k] = by_name.get(k, 0.0) + max(v, 0.0)
    reducer_us = by_name.pop(DDP_REDUCER, 0.0)
    total = sum(by_name.values())
    gemm = sum(v for k, v in by_name.items() if _is_gemm(k))
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:3]
    callers: dict[str, list[float]] = {}
    for s in steps:
        for k, c in s.syncs_by_caller.items():
            acc = callers.setdefault(k, [0.0, 0.0, 0.0])
            acc[0] += c
            acc[1] += s.sync_us_by_caller.get(k, 0.0)
            acc[2] += s.sync_cost_us_by_caller.get(k, 0.0)
    by_count = sorted(callers.items(), key=lambda kv: -kv[1][0])
    window = (sum(r.window_us for r in rows) or step_us * n) - sum(r.exposed_wait_us for r in rows)
    busy_us = sum(r.compute_us + r.exposed_transfer_us + r.memcpy_us for r in rows)
    launches = sum(s.launches for s in steps)
    lags = [s.cover.lo_us - s.start_us for s in steps if s.cover is not None]
    return {
        "step_ms": round(step_us / 1e3, 3),
        "own_step_ms": round(own_us / 1e3, 3),
        "waiting_share": _share(wait_us, step_us),
        "data_share": _share(data_cost_us, own_us),
        "host_ops_per_step": round(ops, 1),
        "us_per_op": round((own_us - data_us) / ops, 2) if ops else None,
        "op_floor_us": trace.op_floor_us,
        "op_cost_ratio": (
            round((own_us - data_us) / ops / trace.op_floor_us, 1) if ops and trace.op_floor_us else None
        ),
        "launches_per_step": round(launches / n, 1),
        "device_us_per_launch": round(busy_us / launches, 2) if trace.device == "gpu" and launches else None,
        "syncs_per_step": round(sum(s.syncs for s in steps) / n, 2),
        "sync_share": _share(sum(s.sync_us for s in steps) / n, own_us),
        "syncs_by_caller": {k: round(c / n, 2) for k, (c, _, _) in by_count},
        "sync_ms_by_caller": {k: round(us / n / 1e3, 3) for k, (_, us, _) in by_count},
        "user_syncs_per_step": round(sum(c for k, (c, _, _) in by_count if k not in NOT_USERS) / n, 2),
        "sync_cost_share": _share(sum(s.sync_cost_us for s in steps) / n, own_us),
        "sync_cost_ms_by_caller": {k: round(cost / n / 1e3, 3) for k, (_, _, cost) in by_count},
        "user_sync_cost_share": _share(sum(cost for k, (_, _, cost) in by_count if k not in NOT_USERS) / n, own_us),
        "compute_share": _share(max(sum(r.compute_us for r in rows) - reducer_us, 0.0), window),
        # CPU: DDP's reducer's time, taken out of compute (communication work): with the three
        # shares below, the device's time less its exposed waiting, whole
        "reducer_share": _share(min(reducer_us, sum(r.compute_us for r in rows)), window),
        "exposed_transfer_share": _share(sum(r.exposed_transfer_us for r in rows), window),
        "memcpy_share": _share(sum(r.memcpy_us for r in rows), window),
        "idle_share": _share(sum(r.idle_us for r in rows), window),
        # GPU: how far the device runs behind the host (its step span's start after the host's
        # step start, median over steps): a device busy while the host runs ahead is GPU-bound
        "device_lag_ms": round(statistics.median(lags) / 1e3, 4) if lags and trace.device == "gpu" else None,
        "transfer_share": _share(transfer_ms_per_step * 1e3 + reducer_us / n, own_us),
        "gemm_share": _share(gemm, total),
        "top_compute": [[k, _share(v, total)] for k, v in top],
        "device": trace.device,
        "practices": list(trace.practices),
    }


def _not_counted_note(ev: Evidence, counted: str | None) -> str:
    """The syncs the rule did not count, said by whom: DDP's logger always, GradScaler unless
    it is `counted` (the verdict's cause)."""
    by = ev.get("syncs_by_caller", {})
    notes = []
    if by.get(GRAD_SCALER, 0) and counted != GRAD_SCALER:
        notes.append(
            f"GradScaler {by[GRAD_SCALER]:.1f} per step (its found_inf check: a fused optimizer or bf16 avoids it)"
        )
    if by.get(DDP_LOGGER, 0):
        notes.append(
            f"DDP's runtime logger {by[DDP_LOGGER]:.1f} per step (it times DDP's first 10 iterations and "
            "every 100th: profile later steps)"
        )
    return f"; syncs not the model's: {'; '.join(notes)}" if notes else ""


def _largest_overhead(ev: Evidence) -> tuple[str, float]:
    """The largest part of the device's time that is not compute: idle, exposed transfer or copies."""
    parts = {
        "host-bound": ev["idle_share"],
        "comm-exposed": ev["exposed_transfer_share"],
        "copy-bound": ev.get("memcpy_share", 0.0),
    }
    kind = max(parts, key=parts.__getitem__)
    return kind, parts[kind]


def _busy_share(ev: Evidence) -> float:
    """The device's busy share of its time: compute, exposed transfer and copies."""
    return ev["compute_share"] + ev["exposed_transfer_share"] + ev.get("memcpy_share", 0.0)


def _gpu_busy(ev: Evidence, rules: Rules) -> bool:
    """A GPU busy at least gpu_bound_busy_share of its time: its host runs ahead of it, so however
    many ops the host issues, the step waits for kernels, not for launches."""
    return ev["device"] == "gpu" and _busy_share(ev) >= rules.gpu_bound_busy_share


def _gpu_bound_note(ev: Evidence, rules: Rules) -> str:
    """'; GPU-bound: the device is busy 99% of its time, 3.20 ms behind its host' for a busy GPU."""
    busy = _busy_share(ev)
    if not _gpu_busy(ev, rules):
        return ""
    lag = ev.get("device_lag_ms")
    behind = f", {lag:.2f} ms behind its host" if lag is not None and lag > 0 else ""
    return f"; GPU-bound: the device is busy {busy:.0%} of its time{behind} (the host runs ahead)"


def classify(ev: Evidence, rules: Rules = Rules()) -> tuple[str, str]:
    """The decision tree, in the classic order (input pipeline first; then syncs; then launch
    overhead; then communication; then kernels): the first rule that holds names the
    bottleneck, with the figures that fired it. Returns (bottleneck, reason).

    Syncs (GPU), by what they cost the device, not by their count: 1. the device idle the
    training code's own syncs cause (callers not in host_ops.NOT_USERS) >= sync_cost_share of the
    step; else 2. GradScaler's alone, GradScaler named as the cause; DDP's logger's never count.
    The reason of any verdict names the syncs it did not count.

    Healthy needs positive evidence: compute is the largest part of the device's time and
    matrix math at least kernel_gemm_share of it. When no rule fires and that does not hold,
    the largest part that is not compute names the rank (host-bound: the device idles on its
    host; comm-exposed; copy-bound), or kernel-bound when compute leads with little matrix math."""
    gpu = ev["device"] == "gpu"
    by = ev.get("syncs_by_caller", {})
    cost_by = ev.get("sync_cost_ms_by_caller", {})
    own_ms = ev.get("own_step_ms") or 0.0
    user_cost = ev.get("user_sync_cost_share", 0.0)
    scaler_cost = cost_by.get(GRAD_SCALER, 0.0) / own_ms if own_ms else 0.0
    counted = None
    compute, gemm = ev["compute_share"], ev["gemm_share"]
    if ev["data_share"] >= rules.data_share:
        kind, reason = (
            "data-bound",
            (
                f"the device idles {ev['data_share']:.0%} of the step while the host waits for the input pipeline "
                f"(>= {rules.data_share:.0%})"
                if gpu
                else f"{ev['data_share']:.0%} of the step waits for the input pipeline (>= {rules.data_share:.0%})"
            ),
        )
    elif gpu and user_cost >= rules.sync_cost_share:
        kind, reason = (
            "sync-bound",
            (
                f"blocking syncs from the training code leave the device idle "
                f"{user_cost:.0%} of the step (>= {rules.sync_cost_share:.0%}): "
                f"{_sync_callers(by, cost_by, lambda k: k not in NOT_USERS)}"
            ),
        )
    elif gpu and by.get(GRAD_SCALER, 0) >= rules.sync_per_step and scaler_cost >= rules.sync_cost_share:
        counted = GRAD_SCALER
        kind, reason = (
            "sync-bound",
            (
                f"GradScaler syncs {by[GRAD_SCALER]:.1f} times per step (its .item() on "
                "found_inf before the optimizer step: fp16 without a fused optimizer), leaving "
                f"the device idle {scaler_cost:.0%} of the step"
            ),
        )
    elif (
        ev["us_per_op"] is not None
        and _ops_are_overhead(ev, rules)
        and not _gpu_busy(ev, rules)  # a device busy most of its step waits for no launch
    ):
        kind, reason = (
            "launch-bound",
            (
                f"{ev['host_ops_per_step']:.0f} ops per step at {ev['us_per_op']:.1f} us of "
                f"step time each{_op_cost_words(ev, rules)}"
            ),
        )
    elif gpu and _launches_starve_the_device(ev, rules):
        kind, reason = (
            "launch-bound",
            (
                f"{ev['launches_per_step']:.0f} kernel launches per step, each keeping the device busy "
                f"{ev['device_us_per_launch']:.1f} us (under one eager launch, {rules.launch_us_per_op:.0f} us), "
                f"with the device idle {ev['idle_share']:.0%} of the time"
            ),
        )
    elif ev["transfer_share"] >= rules.comm_transfer_share and ev["exposed_transfer_share"] >= rules.comm_exposed_share:
        kind, reason = (
            "comm-exposed",
            (
                f"collectives transfer for {ev['transfer_share']:.0%} of the step and "
                f"{ev['exposed_transfer_share']:.0%} of device time is exposed transfer "
                "(waiting for peers not counted)"
            ),
        )
    else:
        other, share = _largest_overhead(ev)
        idle_gpu = gpu and not _gpu_busy(ev, rules)  # not healthy, whatever leads
        compute_leads = not idle_gpu and compute >= share
        if compute_leads and gemm >= rules.kernel_gemm_share:
            kind, reason = (
                "healthy",
                (
                    f"compute is the largest part of device time ({compute:.0%}; idle "
                    f"{ev['idle_share']:.0%}, exposed transfer {ev['exposed_transfer_share']:.0%}), "
                    f"{gemm:.0%} of it matrix math; data {ev['data_share']:.0%} of the step"
                ),
            )
        elif compute_leads:
            kind, reason = (
                "kernel-bound",
                (
                    f"compute is the largest part of device time ({compute:.0%}), only "
                    f"{gemm:.0%} of it matrix math; top: {_top(ev)}"
                ),
            )
        else:
            kind = other
            # a GPU idle beyond the material share is not healthy though its compute may lead
            largest = (
                "the largest part of device time after compute"
                if compute >= share
                else "the largest part of device time"
            )
            waiting = "the device is idle" if gpu else "the main thread runs no op (Python between ops, waits)"
            reason = {
                "host-bound": f"{waiting} {ev['idle_share']:.0%} of its time, waiting on its host (no input "
                "pipeline, sync or launch cause above its bound: data "
                f"{ev['data_share']:.0%}, syncs {ev.get('sync_cost_share', 0.0):.0%} of the step, "
                f"{ev['launches_per_step']:.0f} launches)",
                "comm-exposed": f"exposed transfer is {largest} ({share:.0%}; compute "
                f"{compute:.0%}), though collectives transfer for only "
                f"{ev['transfer_share']:.0%} of the step",
                "copy-bound": f"host-device copies are {largest} ({share:.0%}; compute {compute:.0%})",
            }[other]
    return kind, reason + _gpu_bound_note(ev, rules) + _not_counted_note(ev, counted)


def _launches_starve_the_device(ev: Evidence, rules: Rules) -> bool:
    """A GPU starved by its launches: 1. it is not GPU-bound (busy under gpu_bound_busy_share);
    2. its busy time per launch is under one eager launch's host cost (launch_us_per_op): each
    kernel ends before the host can issue the next. The host work between launches is not told
    apart from their dispatch: the reason gives the launches per step and the idle."""
    per_launch = ev.get("device_us_per_launch")
    return per_launch is not None and not _gpu_busy(ev, rules) and per_launch < rules.launch_us_per_op


def _ops_are_overhead(ev: Evidence, rules: Rules) -> bool:
    """Whether eager overhead is the material share of the step or more: each op's share of the
    step under launch_op_ratio bare ops where the trace measured one, else under
    launch_us_per_op (one eager op's host cost). The op count is not held to a bound: few ops
    that take little step time each are as much overhead as many."""
    ratio, us = ev.get("op_cost_ratio"), ev["us_per_op"]
    if ratio is not None:
        return ratio < rules.launch_op_ratio
    return us is not None and us < rules.launch_us_per_op


def _op_cost_words(ev: Evidence, rules: Rules) -> str:
    """The bound the op cost was held to, in the reason's words."""
    ratio = ev.get("op_cost_ratio")
    if ratio is not None:
        return (
            f", {ratio:.0f}x a bare op's dispatch ({ev.get('op_floor_us')} us) "
            f"(< {rules.launch_op_ratio:.0f}x: the material share of the step or more is eager overhead)"
        )
    return f" (< {rules.launch_us_per_op:.0f} us, one eager op's host cost at most)"


def _top(ev: Evidence) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in ev["top_compute"])


def _sync_callers(by: dict[str, float], cost_ms: dict[str, float], keep: Any) -> str:
    """'item 6.0 per step (12.30 ms of device idle), copy to device 5.0 (8.10 ms)' for the callers
    `keep(caller)` accepts, costliest first."""
    callers = sorted((k for k in by if keep(k)), key=lambda k: -cost_ms.get(k, 0.0))
    return ", ".join(f"{k} {by[k]:.1f} per step ({cost_ms.get(k, 0.0):.2f} ms of device idle)" for k in callers)


# The advice whose remedies a job may already use: (the words before the remedies, their
# separator, the remedies as (text, the practice it is: practices.py, or None), the words after).
# Built with no practice left out, each is its ADVICE entry (a test holds them to it).
REMEDIES: dict[str, tuple[str, str, tuple[tuple[str, str | None], ...], str]] = {
    "launch-bound": (
        "eager overhead: the step is many tiny ops and the host cannot issue them fast enough: ",
        ", ",
        (
            ("torch.compile (fusion)", "torch.compile"),
            ("CUDA graphs", "CUDA graphs"),
            ("a larger batch per step", None),
            ("fused optimizers (foreach/fused)", "fused optimizer"),
        ),
        "",
    ),
    "kernel-bound": (
        "memory-bound elementwise/normalisation kernels dominate: ",
        ", ",
        (
            ("fuse them (torch.compile)", "torch.compile"),
            ("use bf16/fp16", "bf16"),
            ("fused implementations (fused layer norm, fused optimizers)", None),
        ),
        "",
    ),
    "host-bound": (
        ADVICE["host-bound"].split("; torch.compile")[0] + "; ",
        " or ",
        (("torch.compile", "torch.compile"), ("CUDA graphs", "CUDA graphs")),
        " take the host off the path",
    ),
}
# What to try next where the job already uses a remedy the advice would give.
NEXT_AFTER = {
    "torch.compile": "it already runs torch.compile: look for graph breaks (TORCH_LOGS=graph_breaks) and the "
    "work left outside its compiled graphs",
    "CUDA graphs": "it already replays CUDA graphs: look at what runs outside the captured graphs",
}


def _advice_text(kind: str, practices: list[str]) -> str:
    """ADVICE[kind] without the remedies the job already uses (REMEDIES), and what to try next
    instead (NEXT_AFTER) where one was."""
    if kind not in REMEDIES:
        return ADVICE[kind]
    before, sep, remedies, after = REMEDIES[kind]
    kept = [text for text, practice in remedies if practice not in practices]
    used = [p for _, p in remedies if p is not None and p in practices]
    text = before + sep.join(kept) + after if kept else before.rstrip(":; ")
    return text + "".join(f"; {NEXT_AFTER[p]}" for p in used if p in NEXT_AFTER)


def advice_for(kind: str, ev: Evidence, rules: Rules = Rules()) -> str:
    """ADVICE[kind] less the remedies the job already uses (`_advice_text`), except for a
    sync-bound rank whose costly syncs are GradScaler's rather than the training code's
    (classify's rule 2), and GradScaler's advice added where it syncs too."""
    by = ev.get("syncs_by_caller", {})
    scaler = by.get(GRAD_SCALER, 0) >= rules.sync_per_step
    advice = _advice_text(kind, list(ev.get("practices", [])))
    if kind == "sync-bound" and scaler:
        user = ev.get("user_sync_cost_share", 0.0) >= rules.sync_cost_share
        return f"{advice}; {GRAD_SCALER_ADVICE}" if user else GRAD_SCALER_ADVICE
    return advice


def _transfer_ms_per_step(a: Analysis) -> float:
    waits = [w for w in a.waits if w.step is not None]
    steps = {w.step for w in waits}
    return sum(w.transfer_us for w in waits) / 1e3 / len(steps) if steps else 0.0


def waiting_note(waits_for: list[list], step_ms: float) -> str:
    """'32% of its step is waiting on rank 1 (8.10 ms), rank 3 (4.20 ms)': empty without waits."""
    if not waits_for:
        return ""
    total = sum(ms for _, ms in waits_for)
    share = f"{total / step_ms:.0%} of its step" if step_ms else f"{total:.2f} ms per step"
    return f"{share} is waiting on " + ", ".join(f"rank {r} ({ms:.2f} ms)" for r, ms in waits_for)


def diagnose(a: Analysis, rules: Rules = Rules()) -> list[Diagnosis]:
    """One `Diagnosis` per rank: a straggler (from the straggler analysis) is named so, with the
    phase it is slow in; every other rank goes through `classify` on its own work (waiting for
    later peers taken out), and says whom it waited for."""
    transfer = _transfer_ms_per_step(a)
    by = {r.rank: r for r in a.stragglers.ranks}
    own_waits: dict[int, list[tuple[float, float]]] = {}
    for w in a.waits:
        for r, arrival in w.arrival_us.items():
            if w.wait_us[r] > 0:
                own_waits.setdefault(r, []).append((arrival, arrival + w.wait_us[r]))
    overlap_of: dict[int, list[StepOverlap]] = {}
    for o in a.overlap:
        overlap_of.setdefault(o.rank, []).append(o)
    out = []
    for t in sorted(a.traces, key=lambda t: t.rank):
        ev = rank_evidence(t, overlap_of.get(t.rank, []), transfer, own_waits.get(t.rank))
        b = by[t.rank]
        ev["waits_for"] = b.waits_for
        if b.straggler:
            ev.update(
                {
                    "late_ms_per_step": round(b.late_ms, 3),
                    "cost_ms_per_step": round(b.cost_ms, 3),
                    "blame_ms": round(b.blame_ms, 3),
                    "late_fraction": round(b.late_fraction, 4),
                    "pattern": b.pattern,
                    "slow_phase": b.phase,
                }
            )
            kind = "straggler"
            reason = (
                f"arrives {b.late_ms:.2f} ms per step after the punctual ranks (its share of the delay: "
                f"{b.cost_ms:.2f} ms); late at "
                f"{b.late_fraction:.0%} of its collectives, in {b.steps_late} of {b.steps} step(s) ({b.pattern})"
                + (f"; slow in {b.phase}" if b.phase else "")
                + late_syncs_note(b.syncs)
            )
            advice = ADVICE[kind] + ("; its host-device syncs first: " + ADVICE["sync-bound"] if b.syncs else "")
        else:
            kind, reason = classify(ev, rules)
            advice = advice_for(kind, ev, rules)
            note = waiting_note(b.waits_for, ev["step_ms"])
            if note:
                reason = f"{note}; on its own work: {reason}"
                advice = _waiting_first(b.waits_for, advice)
        out.append(
            Diagnosis(
                rank=t.rank,
                host=t.host,
                bottleneck=kind,
                reason=reason,
                evidence=ev,
                advice=advice,
                waits_for=b.waits_for,
            )
        )
    return judged_with_peers(out, rules)


def _waiting_first(waits_for: list[list], advice: str) -> str:
    """A rank that waits for others is told to fix those first."""
    return f"it waits for rank(s) {', '.join(str(r) for r, _ in waits_for)}: fix those first; then {advice}"


# The figures the decision tree reads (classify), compared across ranks by `judged_with_peers`.
DECIDING = (
    "data_share",
    "user_sync_cost_share",
    "host_ops_per_step",
    "us_per_op",
    "op_cost_ratio",
    "launches_per_step",
    "device_us_per_launch",
    "idle_share",
    "transfer_share",
    "exposed_transfer_share",
    "compute_share",
    "gemm_share",
    "memcpy_share",
)
# A figure agrees with its peers' within this many median absolute deviations of theirs (the
# straggler rule's outlier statistic) ...
PEER_MADS = 3.0
# ... or this share of their median (the material share, Thresholds.rel_late's reasoning: a
# difference under it is worth no different advice), or, for a share of the step, one percentage
# point (what the reasons print it to: two figures that print alike agree).
PEER_SHARE = 0.10
PEER_POINT = 0.01


def _agrees(x: float, values: list[float], share: bool) -> bool:
    med = statistics.median(values)
    spread = statistics.median(abs(v - med) for v in values)
    return abs(x - med) <= max(PEER_MADS * spread, PEER_SHARE * abs(med), PEER_POINT if share else 0.0)


def judged_with_peers(out: list[Diagnosis], rules: Rules = Rules()) -> list[Diagnosis]:
    """No verdict flips on a threshold between ranks whose figures agree: with 3+ ranks judged on
    their own work (stragglers aside) and a bottleneck most of them share, a rank given another
    whose every deciding figure (`DECIDING`) agrees with the ranks' (`_agrees`) is judged as they
    are, its own reading kept in the reason. A rank whose figures stand out keeps its verdict."""
    judged = [d for d in out if d.bottleneck != "straggler"]
    if len(judged) < 3:
        return out
    top, n = Counter(d.bottleneck for d in judged).most_common(1)[0]
    if n <= len(judged) / 2:
        return out
    figures = [cast(dict[str, Any], d.evidence) for d in judged]
    values = {k: [f[k] for f in figures if f.get(k) is not None] for k in DECIDING}

    def like_peers(d: Diagnosis) -> bool:
        ev = cast(dict[str, Any], d.evidence)
        return all(_agrees(ev[k], values[k], k.endswith("_share")) for k in DECIDING if ev.get(k) is not None)

    return [
        replace(
            d,
            bottleneck=top,
            reason=f"judged as most ranks ({top}): every figure the rules read is within the ranks' spread; "
            f"on its own figures alone: {d.bottleneck}, {d.reason}",
            advice=_waiting_first(d.waits_for, advice_for(top, d.evidence, rules))
            if waiting_note(d.waits_for, d.evidence["step_ms"])
            else advice_for(top, d.evidence, rules),
        )
        if d.bottleneck not in ("straggler", top) and like_peers(d)
        else d
        for d in out
    ]


def late_syncs_note(syncs: dict[str, list[float]]) -> str:
    """'; its syncs made it late: item 6.0 per step (12.30 ms of device idle), ...' (empty without)."""
    if not syncs:
        return ""
    return "; its syncs made it late: " + ", ".join(
        f"{k} {c:.1f} per step ({ms:.2f} ms of device idle)" for k, (c, ms) in syncs.items()
    )


def diagnosis_line(diagnoses: list[Diagnosis]) -> str:
    """'launch-bound (ranks 0, 1)' style, most common first; many ranks in runs (`ranks_phrase`)."""
    return bottleneck_line([(d.rank, d.bottleneck) for d in diagnoses])


def bottleneck_line(pairs: list[tuple[int, str]]) -> str:
    """`diagnosis_line` of (rank, bottleneck) pairs (report.json's diagnosis rows)."""
    by: dict[str, list[int]] = {}
    for rank, kind in pairs:
        by.setdefault(kind, []).append(rank)
    parts = sorted(by.items(), key=lambda kv: (-len(kv[1]), BOTTLENECKS.index(kv[0])))
    present = [rank for rank, _ in pairs]
    return "; ".join(f"{k} ({ranks_phrase(v, present)})" for k, v in parts)
