"""The host side of a trace: which threads do the model's work, how many ops they dispatch per
step, and who called each blocking host-device sync. Pure functions of a decoded `Trace`.

Both read every cpu op once at most: the op count is one pass over the op columns; the sync
callers are one pass, with a stack, over the ops of the threads that synchronised (usually the
main thread and autograd's device thread).
"""

from __future__ import annotations

import bisect
import re
from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from harness.traces import native
from harness.traces.model import Step
from harness.traces.read.decode import Trace, as_numpy
from harness.traces.read.phases import is_data

StepAt = Callable[[float], "int | None"]  # the step a host timestamp falls in
Event = tuple[float, float, str, bool]  # (start_us, end_us, name, is a cpu op (not an annotation))

# Host calls that block until the device catches up (cudaMemcpy without Async is synchronous).
SYNC_CALL = re.compile(r"^(?:cuda|hip)(?:StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy)$")
MEMCPY_CALL = re.compile(r"^(?:cuda|hip)Memcpy")
STEP_MARK = re.compile(r"^ProfilerStep#\d+$")

# Who called a blocking sync (`caller_of`); anything else is "other: <the op or range it ran in>".
ITEM = "item"  # .item() / printing a tensor / a Python number from a device tensor
COPY_TO_HOST = "copy to host"  # .cpu(), .to("cpu"), .tolist(), .numpy()
COPY_TO_DEVICE = "copy to device"  # .to("cuda") from pageable memory, or without non_blocking
COPY = "copy"  # a blocking copy whose direction the trace does not say (no memcpy recorded), or device to device
GRAD_SCALER = "GradScaler"  # GradScaler.step() reading found_inf
DDP_LOGGER = "DDP logger"  # DistributedDataParallel's runtime logger timing its iterations
OTHER = "other"
# Syncs that the training code did not ask for: the sync-bound rule does not count them (advisor.py).
NOT_USERS = frozenset({GRAD_SCALER, DDP_LOGGER})

ITEM_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
DDP_FORWARD = "DistributedDataParallel.forward"  # the record_function range of DDP's forward
# GradScaler.step() runs this op over the gradients, then reads its found_inf with .item()
# (torch/amp/grad_scaler.py, _maybe_opt_step), unless the optimizer is fused.
AMP_UNSCALE = "aten::_amp_foreach_non_finite_check_and_unscale_"
# DataLoader's pin-memory thread runs these (torch/utils/data/_utils/pin_memory.py).
PIN_OPS = frozenset({"aten::pin_memory", "aten::_pin_memory"})
TO_HOST = re.compile(r"DtoH|DeviceToHost")  # Kineto: "Memcpy DtoH (Device -> Pageable)"; ROCm: "CopyDeviceToHost"
TO_DEVICE = re.compile(r"HtoD|HostToDevice")


def caller_of(chain: Sequence[str], is_op: Sequence[bool]) -> tuple[str, int]:
    """Who called a sync, from the names of the cpu ops and annotations enclosing it on its
    thread (outermost first; `is_op[i]`: chain[i] is a cpu op, not an annotation), and the
    position in `chain` of the one that decided (-1: none).

    1. walk the chain from the innermost outwards; the first cpu op met decides:
       aten::item/_local_scalar_dense -> "item", aten::to/_to_copy/copy_ -> "copy", any other
       -> "other: <that op>";
    2. reaching DDP's forward range before any cpu op -> "DDP logger" (its runtime logger
       synchronises on its timing events at the start of forward, outside any op);
    3. no cpu op and no DDP forward: "other: <the innermost annotation, ProfilerStep aside>",
       or "other" when nothing but the step encloses it."""
    for i in range(len(chain) - 1, -1, -1):
        name = chain[i]
        if name in ITEM_OPS:
            return ITEM, i
        if name in COPY_OPS:
            return COPY, i
        if is_op[i]:
            return f"{OTHER}: {name}", i
        if name == DDP_FORWARD:
            return DDP_LOGGER, i
    inner = next((n for n in reversed(chain) if not STEP_MARK.match(n)), None)
    return (f"{OTHER}: {inner}" if inner else OTHER), -1


def copy_direction(memcpy_name: str | None) -> str:
    """ "copy to host" / "copy to device" from the name of the device copy a blocking copy
    waited for; "copy" when there is none or it is device to device."""
    if memcpy_name is not None:
        if TO_HOST.search(memcpy_name):
            return COPY_TO_HOST
        if TO_DEVICE.search(memcpy_name):
            return COPY_TO_DEVICE
    return COPY


def nest_order(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """The positions of events given by start in nest order: by start, the longer first among
    events starting together (the outer one of a nest), else in their given order."""
    return np.lexsort((-dur, ts))


def nest(starts: np.ndarray, ends: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stack walk of parse._self_times over intervals in walk order: each one's parent (-1:
    none) and its flag, `own` or inherited from its parent (for the DDP reducer booking).

    1. walk the intervals with a stack of open ones: pop while the top ended by this one's start;
    2. its parent is the top of the stack then (-1: empty); push it;
    3. flag = own, or the parent's flag when there is a parent (a nest inherits it).
    Natively (`_nest.c`) when the extension is built and not switched off, else in Python."""
    n = len(starts)
    parent, flag = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
    nest = native.function("nest")
    if nest is not None:
        nest(
            np.ascontiguousarray(starts, dtype=np.float64),
            np.ascontiguousarray(ends, dtype=np.float64),
            np.ascontiguousarray(own, dtype=bool),
            parent,
            flag,
        )
        return parent, flag
    up, inherited, mine = [-1] * n, [False] * n, own.tolist()
    stack: list[int] = []
    ends_us = ends.tolist()
    for i, t in enumerate(starts.tolist()):
        while stack and ends_us[stack[-1]] <= t:
            stack.pop()
        if stack:
            top = stack[-1]
            up[i] = top
            inherited[i] = inherited[top] or mine[i]
        else:
            inherited[i] = mine[i]
        stack.append(i)
    parent[:], flag[:] = up, inherited
    return parent, flag


def enclosing(starts: np.ndarray, ends: np.ndarray, times: Sequence[float]) -> list[list[int]]:
    """For each time (ascending), the positions of the intervals [start, end) that contain it
    (start <= t < end), in the intervals' order; given in nest order (by start, the longer first
    among equal starts: a parent before its children), that is outermost first.

    1. each interval holds a run of the times: from the first at or after its start to the last
       before its end (two binary searches, for all intervals at once);
    2. the intervals whose run is not empty are dealt to their times, in order: beyond the
       searches, the work is the size of the answer, not the number of intervals."""
    at = np.asarray(times, dtype=np.float64)
    lo, hi = np.searchsorted(at, starts, side="left"), np.searchsorted(at, ends, side="left")
    out: list[list[int]] = [[] for _ in range(len(at))]
    for k in np.flatnonzero(hi > lo).tolist():
        for j in range(int(lo[k]), int(hi[k])):
            out[j].append(k)
    return out


def count_host_ops(doc: Trace, main: int | None, by_number: dict[int, Step]) -> set[int]:
    """Set each step's `host_ops`: the `aten::` ops (any depth) that the model's threads start in
    it outside its data phase. Returns the threads counted.

    1. per thread and step, count the aten ops by start, leaving out those in the step's data
       phase (a harness range on the main thread; its time is left out on every thread);
    2. the model's threads: every thread with ops (on GPU, backward runs on autograd's device
       thread, not the main one), except gloo's workers (threads holding `gloo:*` ranges) and
       DataLoader's pin-memory thread (threads running aten::pin_memory/_pin_memory); the main
       thread always counts;
    3. host_ops = the sum over the model's threads."""
    names = doc.names
    ops = doc.ops
    name, thread = as_numpy(ops.name), as_numpy(ops.thread)
    aten = np.array([n.startswith("aten::") for n in names], dtype=bool)[name]
    pin = aten & np.array([n in PIN_OPS for n in names], dtype=bool)[name]
    counts: dict[int, dict[int, int]] = {}
    pinning: set[int] = set()
    steps = sorted(by_number.values(), key=lambda s: s.start_us)
    for s, nxt in zip(steps, steps[1:] + [None]):
        lo = bisect.bisect_left(ops.ts, s.start_us)
        hi = bisect.bisect_right(ops.ts, s.end_us)
        if nxt is not None:  # an op at the very start of the next step is that step's (as in _StepIndex)
            hi = min(hi, bisect.bisect_left(ops.ts, nxt.start_us))
        c = counts[s.number] = defaultdict(int)
        for i, j in _outside(ops.ts, lo, hi, [(a, b) for p, a, b in s.phase_spans if is_data(p)]):
            threads, n = np.unique(thread[i:j][aten[i:j]], return_counts=True)
            for th, k in zip(threads.tolist(), n.tolist()):
                c[th] += k
            pinning.update(thread[i:j][pin[i:j]].tolist())
    gloo = {m.thread for m in doc.marks if m.cat == "user_annotation" and m.name.startswith("gloo:")}
    model = {th for c in counts.values() for th in c if th == main or (th not in gloo and th not in pinning)}
    for number, per_thread in counts.items():
        by_number[number].host_ops += sum(v for th, v in per_thread.items() if th in model)
    return model


# A metadata-only op: no data is touched, so its recorded duration is one dispatcher call with the
# profiler's bookkeeping, the machine's unit of per-op cost. as_strided is in every eager
# training step (views, slices and selects call it) on CPU and GPU alike: in the lab's CPU runs,
# and in every real GPU trace of tests/data/traces but the event-sampled ones.
FLOOR_OP = "aten::as_strided"
FLOOR_MIN_CALLS = 20  # fewer: too few for a median to stand for the machine


def op_floor_us(doc: Trace, threads: set[int]) -> float | None:
    """The median duration of FLOOR_OP on the model's `threads` (count_host_ops' threads), in us:
    what one bare op costs on this machine under the profiler. None with fewer than
    FLOOR_MIN_CALLS calls (sampled traces, other frameworks), or where every duration is a whole
    microsecond (older Kineto's clock: coarser than the op itself)."""
    try:
        index = doc.names.index(FLOOR_OP)
    except ValueError:
        return None
    ops = doc.ops
    calls = np.flatnonzero(as_numpy(ops.name) == index)  # the few FLOOR_OP calls, then their threads
    calls = calls[np.isin(as_numpy(ops.thread)[calls], np.fromiter(threads, dtype=np.int64, count=len(threads)))]
    if len(calls) < FLOOR_MIN_CALLS:
        return None
    durs = as_numpy(ops.dur)[calls]
    if not np.any(durs != np.floor(durs)):  # whole microseconds (older Kineto): too coarse for a sub-us op
        return None
    return round(float(np.median(durs)), 4)


def _outside(ts: array, lo: int, hi: int, holes: list[tuple[float, float]]) -> list[tuple[int, int]]:
    """The position ranges [a, b) within [lo, hi) of the events (by start `ts`) that start in
    none of `holes` (each [start, end])."""
    out = []
    for a, b in sorted(holes):
        out.append((lo, min(hi, bisect.bisect_left(ts, a))))
        lo = max(lo, bisect.bisect_right(ts, b))
    out.append((lo, hi))
    return [(a, b) for a, b in out if a < b]


Sync = tuple[float, float, str, int]  # (start_us, end_us, caller, step number) of a blocking sync call


def attribute_syncs(doc: Trace, step_at: StepAt, by_number: dict[int, Step]) -> list[Sync]:
    """Set each step's `syncs`/`sync_us` (the blocking sync calls starting in it and their time)
    and the same by caller (`syncs_by_caller`, `sync_us_by_caller`); return the syncs (what
    `sync_costs` weighs).

    1. the syncs: host calls named by SYNC_CALL, on any thread, placed in the step they start in;
    2. per thread that synchronised, the cpu ops and annotations enclosing each sync
       (`enclosing`), merged outermost first; `caller_of` names the caller;
    3. a copy's direction: the device copy (gpu_memcpy, by correlation id) of the sync call
       itself when it is a cudaMemcpy, else of the last memcpy call on the thread since the
       deciding copy op started (`copy_direction`);
    4. an "item" sync is GradScaler's when an AMP_UNSCALE op started before it on its thread in
       the same step and no sync was given to that op yet (GradScaler reads found_inf once
       after unscaling; a later .item() in the step is the user's)."""
    launches, names = doc.launches, doc.names
    kind = {n: (bool(SYNC_CALL.match(names[n])), bool(MEMCPY_CALL.match(names[n]))) for n in set(launches.name)}
    wanted = {n for n, (is_sync, is_memcpy) in kind.items() if is_sync or is_memcpy}
    if not any(is_sync for is_sync, _ in kind.values()):
        return []
    syncs: dict[int, list[tuple[int, int]]] = defaultdict(list)  # thread -> [(launch position, step)]
    memcpy: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(launches.name):
        if n in wanted:
            is_sync, is_memcpy = kind[n]
            th = launches.thread[i]
            if is_memcpy:
                memcpy[th].append(i)
            st = step_at(launches.ts[i]) if is_sync else None
            if st is not None:
                syncs[th].append((i, st))
    if not syncs:
        return []
    out: list[Sync] = []
    copy_names = {c: names[n] for c, n in zip(doc.copies.corr, doc.copies.name) if c >= 0}
    ops = doc.ops
    op_ts, op_dur, op_name, op_thread = (as_numpy(c) for c in (ops.ts, ops.dur, ops.name, ops.thread))
    is_unscale = np.array([n == AMP_UNSCALE for n in names], dtype=bool)
    for th, found in syncs.items():
        mine = np.flatnonzero(op_thread == th)  # by start
        order = mine[nest_order(op_ts[mine], op_dur[mine])]
        op_start = op_ts[order]
        op_end = op_start + op_dur[order]
        marks = sorted(
            ((m.ts, m.ts + m.dur, m.name, False) for m in doc.marks if m.thread == th and m.cat == "user_annotation"),
            key=lambda e: (e[0], e[0] - e[1]),
        )
        times = [launches.ts[i] for i, _ in found]
        unscale = op_ts[mine][is_unscale[op_name[mine]]].tolist() if len(mine) else []
        used: set[int] = set()
        mem = memcpy.get(th, [])
        mem_ts = [launches.ts[i] for i in mem]
        op_chains = enclosing(op_start, op_end, times)
        mark_chains = enclosing(np.array([e[0] for e in marks]), np.array([e[1] for e in marks]), times)
        for (i, st), op_at, mark_at in zip(found, op_chains, mark_chains):
            chain = sorted(
                [(float(op_start[k]), float(op_end[k]), names[op_name[order[k]]], True) for k in op_at]
                + [marks[k] for k in mark_at],
                key=lambda e: (e[0], e[0] - e[1]),
            )
            caller, at = caller_of([e[2] for e in chain], [e[3] for e in chain])
            t = launches.ts[i]
            if caller == COPY:
                if kind[launches.name[i]][1]:
                    corr = launches.corr[i]
                else:
                    j = bisect.bisect_right(mem_ts, t) - 1
                    corr = launches.corr[mem[j]] if j >= 0 and mem_ts[j] >= chain[at][0] else -1
                caller = copy_direction(copy_names.get(corr))
            elif caller == ITEM:
                j = bisect.bisect_left(unscale, t) - 1
                if j >= 0 and j not in used and step_at(unscale[j]) == st:
                    used.add(j)
                    caller = GRAD_SCALER
            step = by_number[st]
            d = launches.dur[i]
            step.syncs += 1
            step.sync_us += d
            step.syncs_by_caller[caller] = step.syncs_by_caller.get(caller, 0) + 1
            step.sync_us_by_caller[caller] = step.sync_us_by_caller.get(caller, 0.0) + d
            out.append((t, t + d, caller, st))
    return out


def sync_costs(syncs: list[Sync], busy: list[tuple[float, float]], by_number: dict[int, Step]) -> None:
    """Set each step's `sync_cost_us` and `sync_cost_us_by_caller`: what its blocking syncs cost
    the device. A sync costs what the device spends idle because of it, not its count (a
    `cudaStreamSynchronize` on an empty queue costs microseconds):

    1. while the host is blocked in it [s0, s1], the device's idle time (the host waits on
       something that is not device work: a pageable copy staging on the host, an event of an
       idle stream);
    2. after it returns, the host has lost its lead: without the sync it would have been as far
       ahead of the device as the sync blocked it (s1 - s0: the queue it waited to drain). So
       the device's idle from s1 to its next work counts, up to s1 - s0; beyond that the idle
       is the host's own work, which a queue that full would not have hidden either;
    3. per step, in all and per caller: the syncs' windows [s0, s1 + that share] joined (two
       syncs in a row drain the queue once), their idle measured, at most the step.
    `busy`: every kernel, copy, memset and collective of the rank, merged, by start."""
    if not syncs or not busy:
        return
    starts = [a for a, _ in busy]
    ends = [b for _, b in busy]
    windows: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for s0, s1, caller, st in syncs:
        i = bisect.bisect_right(starts, s1) - 1
        if i >= 0 and ends[i] > s1:  # the device is still busy as the sync returns (it ends with what it waited on)
            until = s1
        else:
            nxt = starts[i + 1] if i + 1 < len(starts) else s1
            until = min(nxt, s1 + (s1 - s0))
        windows[st].append((s0, max(until, s1), caller))

    def idle_in(pieces: list[tuple[float, float]]) -> float:
        total = 0.0
        for a, b in _joined(pieces):
            covered = 0.0
            k = bisect.bisect_right(ends, a)  # the first busy piece ending after a
            while k < len(starts) and starts[k] < b:
                covered += max(min(ends[k], b) - max(starts[k], a), 0.0)
                k += 1
            total += (b - a) - covered
        return total

    for st, ws in windows.items():
        step = by_number[st]
        step.sync_cost_us = min(idle_in([(a, b) for a, b, _ in ws]), step.dur_us)
        for caller in dict.fromkeys(c for _, _, c in ws):
            step.sync_cost_us_by_caller[caller] = min(idle_in([(a, b) for a, b, c in ws if c == caller]), step.dur_us)


def _joined(pieces: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(pieces):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
