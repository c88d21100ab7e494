"""Read one rank's Kineto/Chrome trace into a `RankTrace`.

What is taken from where (the format facts are in ../shared/design.md):
1. rank: `distributedInfo.rank`, else the harness metadata, else the file name (with a warning);
2. steps: `ProfilerStep#N` on the main thread, else the harness phase ranges, else one window;
3. communication: NCCL/RCCL kernels on GPU (identity from their args, else from the kernel name)
   and `gloo:*` ranges on gloo worker threads;
4. compute: GPU kernels that are not communication (memcpy/memset/sync are neither); on a trace
   with no GPU kernels, the main thread's `aten::` ops;
5. a GPU interval belongs to the step its launch (matched by correlation id) happened in;
6. with neither NCCL kernels nor gloo ranges, the main thread's `c10d::<collective>_` ops.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.collect.decode import LAUNCH_CATS, Event, Trace, TraceError, decode_trace, number, read_bytes
from harness.collect.model import Busy, CommOp, RankTrace, Step, by_interval, number_by_group
from harness.paths import RANGE_PREFIX, STEP_PHASES, WORKER_RANK_PATTERN, TRACE_PATTERN

__all__ = ["TraceError", "load_json", "parse_trace"]

NCCL_KERNEL = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_(?P<coll>[A-Za-z]+)", re.IGNORECASE)
GLOO_RANGE = re.compile(r"^gloo:(?P<coll>\w+)")
C10D_OP = re.compile(r"^c10d::_?(?P<coll>[a-z_]+?)(?:_base)?_$")  # c10d::allreduce_, c10d::_allgather_base_
STEP_NAME = re.compile(r"^ProfilerStep#(?P<n>\d+)$")
FILE_RANK = re.compile(r"(?:rank|worker)[-_]?(?P<rank>\d+)", re.IGNORECASE)
LAUNCH_CALL = re.compile(r"^(?:cuda|cu|hip)(?:LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|ModuleLaunchKernel|GraphLaunch)")
# Host calls that block until the device catches up (cudaMemcpy without Async is synchronous).
SYNC_CALL = re.compile(r"^(?:cuda|hip)(?:StreamSynchronize|DeviceSynchronize|EventSynchronize|Memcpy)$")
COMM_OP = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:)")


def canonical_collective(name: str) -> str:
    """`all_reduce`, `AllReduce`, `allreduce` -> `allreduce` (letters only, lower case)."""
    return re.sub(r"[^a-z]", "", name.lower())


def load_json(path: Path) -> dict[str, Any]:
    """The whole trace document as dicts (the merged trace rewrites every event; the analysis
    itself reads the typed events of `decode_trace`)."""
    raw = read_bytes(path)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: not valid JSON ({exc.__class__.__name__}: {exc}); truncated file?") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: JSON without a traceEvents list; not a PyTorch profiler trace")
    return doc


def _rank_of(doc: Trace, path: Path, warnings: list[str]) -> tuple[int, int | None, str]:
    info, meta = doc.distributed_info, doc.meta
    if info is not None and isinstance(info.get("rank"), int):
        return info["rank"], info.get("world_size"), "distributedInfo"
    if isinstance(meta.get("rank"), int):
        return meta["rank"], meta.get("world_size"), "harness metadata"
    m = TRACE_PATTERN.match(path.name)
    worker = m["worker"] if m else path.name
    wm = WORKER_RANK_PATTERN.match(worker) or FILE_RANK.search(worker)
    if wm:
        warnings.append(f"{path.name}: no distributedInfo; rank {int(wm['rank'])} taken from the file name")
        return int(wm["rank"]), None, "file name"
    raise TraceError(f"{path}: no distributedInfo and no rank in the file name; rename it to rank<N>.pt.trace.json")


def _main_thread(events: list[Event]) -> tuple[Any, Any] | None:
    for e in events:
        if e.cat == "user_annotation" and STEP_NAME.match(e.name):
            return e.pid, e.tid
    busy: dict[tuple[Any, Any], float] = defaultdict(float)
    for e in events:
        if e.cat == "cpu_op":
            busy[(e.pid, e.tid)] += e.dur
    return max(busy, key=busy.get) if busy else None


def _steps(events: list[Event], on_main: list[Event], warnings: list[str], name: str) -> tuple[list[Step], str]:
    steps: dict[int, Step] = {}
    for e in on_main:
        m = STEP_NAME.match(e.name)
        if m and not e.cat.startswith("gpu"):
            n = int(m["n"])
            if n not in steps:
                steps[n] = Step(number=n, start_us=e.ts, end_us=e.ts + e.dur)
    if steps:
        return sorted(steps.values(), key=lambda s: s.start_us), "ProfilerStep"
    first = RANGE_PREFIX + STEP_PHASES[0]
    marks = [e for e in on_main if e.name == first]
    if marks:
        warnings.append(f"{name}: no ProfilerStep#N markers; steps taken from the harness ranges")
        ends = [e.ts for e in marks[1:]] + [max(x.ts + x.dur for x in on_main)]
        return [Step(number=i, start_us=e.ts, end_us=end) for i, (e, end) in enumerate(zip(marks, ends))], "harness ranges"
    if not events:
        return [], "whole trace"
    warnings.append(f"{name}: no ProfilerStep#N markers or harness ranges; the whole trace is one step")
    start = events[0].ts
    end = max(e.ts + e.dur for e in events)
    return [Step(number=0, start_us=start, end_us=end)], "whole trace"


class _StepIndex:
    """Which step contains a host timestamp (steps sorted by start, non-overlapping)."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.starts = [s.start_us for s in steps]

    def at(self, ts: float) -> int | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i >= 0 and ts <= self.steps[i].end_us:
            return self.steps[i].number
        return None


def _top_level(events: list[Event]) -> list[Event]:
    """Events (sorted by start) not nested inside an earlier one."""
    out: list[Event] = []
    end = -float("inf")
    for e in events:
        if e.ts >= end:
            out.append(e)
            end = e.ts + e.dur
    return out


def parse_trace(path: Path) -> RankTrace:
    """Parse one trace file (see the module docstring for what comes from where)."""
    warnings: list[str] = []
    doc = decode_trace(path)
    if doc.dropped:
        warnings.append(f"{path.name}: {doc.dropped} malformed event(s) left out")
    rank, world_size, rank_source = _rank_of(doc, path, warnings)
    meta = doc.meta
    host = str(meta.get("host") or doc.host_name or "unknown")
    base_ns = number(doc.base_time_ns) or 0.0
    events = doc.events
    if not events:
        warnings.append(f"{path.name}: no timed events (ph X with a time and a duration); nothing to analyse in it")
    main = _main_thread(events)
    on_main = [e for e in events if (e.pid, e.tid) == main]
    steps, steps_source = _steps(events, on_main, warnings, path.name)
    index = _StepIndex(steps)
    by_number = {s.number: s for s in steps}

    for e in on_main:
        if e.cat != "user_annotation":
            continue
        if e.name.startswith(RANGE_PREFIX):
            st = index.at(e.ts)
            if st is not None:
                step = by_number[st]
                phase = e.name[len(RANGE_PREFIX):]
                step.phases_us[phase] = step.phases_us.get(phase, 0.0) + e.dur
                step.phase_spans.append((phase, e.ts, e.ts + e.dur))
    main_ops = [e for e in on_main if e.cat == "cpu_op"]
    for e in _top_level(main_ops):
        st = index.at(e.ts)
        if st is not None:
            ops = by_number[st].top_ops_us
            ops[e.name] = ops.get(e.name, 0.0) + e.dur

    launch_ts: dict[Any, float] = {}
    for e in events:
        if e.cat in LAUNCH_CATS:
            corr = e.args.correlation
            if corr is not None:
                launch_ts[corr] = e.ts
            st = index.at(e.ts)
            if st is not None:
                if LAUNCH_CALL.match(e.name):
                    by_number[st].launches += 1
                elif SYNC_CALL.match(e.name):
                    by_number[st].syncs += 1
                    by_number[st].sync_us += e.dur
    _count_host_ops(main_ops, steps, index, by_number)

    comms: list[CommOp] = []
    compute: list[Busy] = []
    kernels = [e for e in events if e.cat == "kernel"]
    for e in kernels:
        args = e.args
        launched = launch_ts.get(args.correlation, e.ts)
        step = index.at(launched)
        m = NCCL_KERNEL.match(e.name)
        if m:
            coll = args.collective or m["coll"]
            pg = "default" if args.process_group is None else args.process_group
            comms.append(CommOp(name=canonical_collective(str(coll)), pg=str(pg), start_us=e.ts, end_us=e.ts + e.dur,
                                nelems=_int(args.in_nelems), dtype=args.dtype, step=step, thread=(e.pid, e.tid)))
        else:
            compute.append((e.ts, e.ts + e.dur, step, e.name))
            if step is not None and _in_model_phase(by_number[step], launched):
                by_name = by_number[step].compute_by_name_us
                by_name[e.name] = by_name.get(e.name, 0.0) + e.dur
    for e in events:
        if e.cat != "user_annotation":
            continue
        m = GLOO_RANGE.match(e.name)
        if m:
            comms.append(CommOp(name=canonical_collective(m["coll"]), pg="default", start_us=e.ts,
                                end_us=e.ts + e.dur, step=index.at(e.ts), thread=(e.pid, e.tid)))
    if not comms:
        # No NCCL kernels and no gloo worker ranges (older torch, other CPU backends): the
        # main thread's c10d ops are the only sign of communication; they span the blocking
        # call, so they stand in for the collective's interval.
        for e in main_ops:
            m = C10D_OP.match(e.name)
            if m and m["coll"] not in ("wait", "barrier"):
                comms.append(CommOp(name=canonical_collective(m["coll"]), pg="default", start_us=e.ts,
                                    end_us=e.ts + e.dur, step=index.at(e.ts), thread=main))
        if comms:
            warnings.append(f"{path.name}: no gloo:* or NCCL communication ranges; using the main thread's c10d ops")
    if not kernels:
        for e in main_ops:
            if e.name.startswith("aten::"):
                compute.append((e.ts, e.ts + e.dur, index.at(e.ts), e.name))
        _self_times(main_ops, index, by_number)
    comms.sort(key=lambda c: c.start_us)
    compute.sort(key=by_interval)
    number_by_group(comms)
    return RankTrace(rank=rank, world_size=world_size if isinstance(world_size, int) else None, host=host,
                     path=str(path), run_id=meta.get("run_id"), device="gpu" if kernels else "cpu", steps=steps,
                     comms=comms, compute=compute, warnings=warnings, steps_source=steps_source,
                     rank_source=rank_source, base_us=base_ns / 1e3)


NON_MODEL_PHASES = (STEP_PHASES[0], "optimizer")


def _in_model_phase(step: Step, ts: float) -> bool:
    """Whether host time `ts` is in the model's own work (forward, loss, backward, h2d), i.e. not
    in the data or optimizer phase; True throughout a step with no harness ranges."""
    return not any(a <= ts <= b for p, a, b in step.phase_spans if p in NON_MODEL_PHASES)


def _count_host_ops(main_ops: list[Event], steps: list[Step], index: _StepIndex,
                    by_number: dict[int, Step]) -> None:
    """Per step, the main thread's `aten::` ops (any depth) outside its data phase: the eager
    work the host dispatches for the model."""
    data_spans = {s.number: [(a, b) for p, a, b in s.phase_spans if p == STEP_PHASES[0]] for s in steps}
    for e in main_ops:
        if not e.name.startswith("aten::"):
            continue
        st = index.at(e.ts)
        if st is not None and (not data_spans[st] or not any(a <= e.ts <= b for a, b in data_spans[st])):
            by_number[st].host_ops += 1


REDUCER_PREFIX = "torch::distributed::reducer::"
# Pseudo-name under which CPU traces record the self time of everything DDP's reducer runs
# (scaling gradients and copying them into buckets): communication work, not the model's.
DDP_REDUCER = "ddp reducer"


def _self_times(main_ops: list[Event], index: _StepIndex, by_number: dict[int, Step]) -> None:
    """CPU traces: each step's op self time by name (an op's duration minus its children's),
    communication ops and the data and optimizer phases left out; the CPU-side equivalent of
    GPU kernel time by name.

    1. walk the ops by start, longest first on ties, with a stack of open ops;
    2. pop the ops that ended before this one starts; credit its duration to its name and
       debit it from the enclosing op's name;
    3. an op inside DDP's reducer is credited and debited under `DDP_REDUCER` instead, which
       thereby holds the reducer's whole time."""
    stack: list[tuple[Event, str]] = []  # (op, the name its time is booked under)
    for e in sorted(main_ops, key=lambda e: (e.ts, -e.dur)):
        while stack and stack[-1][0].ts + stack[-1][0].dur <= e.ts:
            stack.pop()
        inside = (stack and stack[-1][1] == DDP_REDUCER) or e.name.startswith(REDUCER_PREFIX)
        key = DDP_REDUCER if inside else e.name
        st = index.at(e.ts)
        if st is not None and _in_model_phase(by_number[st], e.ts):
            by_name = by_number[st].compute_by_name_us
            if not COMM_OP.match(e.name):
                by_name[key] = by_name.get(key, 0.0) + e.dur
            if stack and not COMM_OP.match(stack[-1][0].name):
                parent = stack[-1][1]
                by_name[parent] = by_name.get(parent, 0.0) - e.dur
        stack.append((e, key))


def _int(v: Any) -> int | None:
    n = number(v)
    return int(n) if n is not None else None
