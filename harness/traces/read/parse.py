"""Read one rank's Kineto/Chrome trace into a `RankTrace`.

What is taken from where (the format facts: docs/collector.md):
1. rank: `distributedInfo.rank`, else the harness metadata, else the file name (with a warning);
2. steps: `ProfilerStep#N` on the main thread, else the harness phase ranges, else one window;
3. communication: on GPU the kernels of communication libraries (comm_kernels.py: NCCL/RCCL,
   identity from their args, else from the args of the host's `record_param_comms` op that
   launched them, else from the kernel name; DeepEP, NVSHMEM, MSCCL++, custom all-reduce, ...
   by name) and `gloo:*` ranges on gloo worker threads;
4. compute: GPU kernels that are not communication (memcpy/memset are kept apart, as copies);
   on a trace with no GPU kernels, the main thread's `aten::` ops (a GPU run whose trace holds
   no kernels is said so in a warning);
5. a GPU interval belongs to the step its launch (matched by correlation id) happened in;
6. with neither NCCL kernels nor gloo ranges, the main thread's `c10d::<collective>_` ops;
7. host ops per step and who called each blocking sync: host.py;
8. kept condensed: compute and copies folded into each step's cover (overlap.cover_steps: the
   lengths the overlap analysis reads, the compute inside communication and the idle gaps),
   and per collective its run-up by kernel/op name (runup.py); no interval of compute or
   copies is kept, so a parsed rank is small whatever the trace's size (and is what an in-job
   summary stores).
"""

from __future__ import annotations

import bisect
import json
import re
from array import array
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np

from harness.paths import (
    DEFAULT_GROUP_DESC,
    RANGE_PREFIX,
    STEP_PHASES,
    TRACE_PATTERN,
    WATCH_GROUP_DESC,
    WATCH_RANGE,
    WORKER_RANK_PATTERN,
    groups_path,
)
from harness.traces.analyse.overlap import cover_steps
from harness.traces.analyse.rank_list import groups_text
from harness.traces.model import CommOp, RankTrace, Step, number_by_group
from harness.traces.read.comm_kernels import BATCH_P2P, POINT_TO_POINT, canonical_collective, looks_like_comm
from harness.traces.read.comm_kernels import classify as classify_kernel
from harness.traces.read.comm_kernels import plain as plain_kernel
from harness.traces.read.decode import (
    NO_ARGS,
    Args,
    Columns,
    Mark,
    Trace,
    TraceError,
    as_numpy,
    decode_trace,
    is_sorted,
    number,
    read_bytes,
)
from harness.traces.read.gloo_groups import Ran, read_sidecar, thread_groups, unnamed_groups
from harness.traces.read.host_ops import (
    attribute_syncs,
    count_host_ops,
    nest,
    nest_order,
    op_floor_us,
    sync_costs,
)
from harness.traces.read.phases import is_model, step_phases
from harness.traces.read.practices import practices_in
from harness.traces.read.runup import NO_PHASE, NO_STEP, Spans, merged_by_step, merged_pieces, set_run_ups

__all__ = ["TraceError", "load_json", "parse_trace"]

GLOO_RANGE = re.compile(r"^gloo:(?P<coll>\w+)")
C10D_OP = re.compile(r"^c10d::_?(?P<coll>[a-z_]+?)(?:_base)?_$")  # c10d::allreduce_, c10d::_allgather_base_
STEP_NAME = re.compile(r"^ProfilerStep#(?P<n>\d+)$")
# A rank in a file name, for traces without distributedInfo: ours and composer's `rank<R>...`,
# `worker<R>`, accelerate's ProfileKwargs `profile_<process index>.json`, torchtune's
# `r<rank>-<date>.<time>.pt.trace.json`. (Lightning's names hold the local rank only.)
FILE_RANK = re.compile(r"(?:rank|worker)[-_]?(?P<rank>\d+)|^profile_(?P<index>\d+)$|^r(?P<short>\d+)-", re.IGNORECASE)
LAUNCH_CALL = re.compile(
    r"^(?:cuda|cu|hip)(?:LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|"
    r"ModuleLaunchKernel|GraphLaunch)"
)
PARAM_COMMS = "record_param_comms"
# The warning for a GPU run's trace without device activity (analysis.py says it once for all ranks).
NO_KERNELS = (
    "trace of a GPU run (it lists GPUs or an NCCL backend) with no GPU kernels: the profiler got no CUPTI "
    "activity (run under nsys or ncu, which hold CUPTI, or without ProfilerActivity.CUDA); analysed from the "
    "host's ops as if on CPU"
)
COMM_OP = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:)")


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
    worker = m["worker"] if m else path.name.removesuffix(".gz").removesuffix(".json")
    wm = WORKER_RANK_PATTERN.match(worker) or FILE_RANK.search(worker)
    if wm:
        rank = int(next(v for k, v in wm.groupdict().items() if v is not None and k != "host"))
        warnings.append(f"{path.name}: no distributedInfo; rank {rank} taken from the file name")
        return rank, None, "file name"
    raise TraceError(f"{path}: no distributedInfo and no rank in the file name; rename it to rank<N>.pt.trace.json")


# torch.profiler.tensorboard_trace_handler names a trace `<worker>.<time>.pt.trace.json(.gz)`, the
# worker `<host name>_<pid>` by default (torch/profiler/profiler.py).
HANDLER_WORKER = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)$")


def host_from_file_name(name: str, pid: Any) -> str | None:
    """The host in a `tensorboard_trace_handler` file name, for a trace that names none: the
    worker part is `<host>_<pid>` and that pid is the trace's own (its main thread's process);
    a worker named otherwise (`worker0_step_12`) says nothing of its host."""
    m = TRACE_PATTERN.match(name)
    w = HANDLER_WORKER.match(m["worker"]) if m else None
    if w is None or str(pid) != w["pid"]:
        return None
    return w["host"]


def _main_thread(doc: Trace) -> int | None:
    """The thread (index into doc.threads) the training loop ran on: the one with the first
    ProfilerStep annotation, else the one with the most cpu-op time."""
    for m in doc.marks:
        if m.cat == "user_annotation" and STEP_NAME.match(m.name):
            return m.thread
    busy: dict[int, float] = defaultdict(float)
    for th, d in zip(doc.ops.thread, doc.ops.dur):
        busy[th] += d
    return max(busy, key=busy.__getitem__) if busy else None


class _Ops:
    """The main thread's cpu ops as columns (start order): ts, dur, name id."""

    def __init__(self, doc: Trace, main: int | None) -> None:
        ops = doc.ops
        mine = as_numpy(ops.thread) == (-1 if main is None else main)
        self.ts, self.dur, self.name = (
            array(c.typecode, as_numpy(c)[mine].tobytes()) for c in (ops.ts, ops.dur, ops.name)
        )

    def __iter__(self) -> Iterator[tuple[float, float, int]]:
        return zip(self.ts, self.dur, self.name)

    def end_us(self) -> float:
        return max((t + d for t, d, _ in self), default=-float("inf"))


def _steps(
    doc: Trace, main_marks: list[Mark], main_ops: _Ops, main: int | None, warnings: list[str], name: str
) -> tuple[list[Step], str]:
    steps: dict[int, Step] = {}
    for e in main_marks:
        m = STEP_NAME.match(e.name)
        if m and not e.cat.startswith("gpu"):
            n = int(m["n"])
            if n not in steps:
                steps[n] = Step(number=n, start_us=e.ts, end_us=e.ts + e.dur)
    if steps:
        return sorted(steps.values(), key=lambda s: s.start_us), "ProfilerStep"
    first = RANGE_PREFIX + STEP_PHASES[0]
    marks = [e for e in main_marks if e.name == first]
    if marks:
        warnings.append(f"{name}: no ProfilerStep#N markers; steps taken from the harness ranges")
        launches = doc.launches
        main_end = max(
            [
                main_ops.end_us(),
                max((m.ts + m.dur for m in main_marks), default=-float("inf")),
                max(
                    (t + d for t, d, th in zip(launches.ts, launches.dur, launches.thread) if th == main),
                    default=-float("inf"),
                ),
            ]
        )
        ends = [e.ts for e in marks[1:]] + [main_end]
        return (
            [Step(number=i, start_us=e.ts, end_us=end) for i, (e, end) in enumerate(zip(marks, ends))],
            "harness ranges",
        )
    if not doc.count:
        return [], "whole trace"
    warnings.append(f"{name}: no ProfilerStep#N markers or harness ranges; the whole trace is one step")
    return [Step(number=0, start_us=doc.first_ts, end_us=doc.last_end)], "whole trace"


class _StepIndex:
    """Which step contains a host timestamp (steps sorted by start, non-overlapping)."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.starts = [s.start_us for s in steps]

    def at(self, ts: float) -> int | None:
        i = self._position(ts)
        return None if i < 0 else self.steps[i].number

    def _position(self, ts: float) -> int:
        i = bisect.bisect_right(self.starts, ts) - 1
        return i if i >= 0 and ts <= self.steps[i].end_us else -1

    def positions(self, ts: np.ndarray) -> np.ndarray:
        """For every time in `ts`, the position in `steps` of the step containing it (as `at`
        finds it), -1 where it is in none."""
        if not self.steps:
            return np.full(len(ts), -1, dtype=np.int64)
        starts = np.array(self.starts)
        if np.isnan(starts).any():  # bisection over NaN starts: only `at`'s own search gives its answer
            return np.array([self._position(t) for t in ts.tolist()], dtype=np.int64)
        i = np.searchsorted(starts, ts, side="right") - 1
        ends = np.array([s.end_us for s in self.steps])
        return np.where((i >= 0) & (ts <= ends[np.maximum(i, 0)]), i, -1)

    def numbers(self, pos: np.ndarray) -> np.ndarray:
        """The step number at each position from `positions`, NO_STEP where it is -1."""
        return np.array([s.number for s in self.steps] + [NO_STEP], dtype=np.int64)[pos]

    def at_each(self, ts: np.ndarray) -> np.ndarray:
        """`at` for every time in `ts`, NO_STEP where it is in no step."""
        return self.numbers(self.positions(ts))


class _LaunchTimes:
    """When and on which host thread the kernel with a given correlation id was launched (the
    last launch, if a producer reused an id): correlation ids in order, searched by bisection;
    ids grow with time in real traces, so usually nothing is sorted."""

    def __init__(self, launches: Columns) -> None:
        if not len(launches) or min(launches.corr) >= 0:  # every launch has an id (real traces): no filtering
            self.corr, self.ts, self.thread = launches.corr, launches.ts, launches.thread
        else:
            keep = [i for i, c in enumerate(launches.corr) if c >= 0]
            self.corr, self.thread = (
                array(col.typecode, [col[i] for i in keep]) for col in (launches.corr, launches.thread)
            )
            self.ts = array(launches.ts.typecode, [launches.ts[i] for i in keep])
        corr = self.corr
        if not is_sorted(corr):
            order = sorted(range(len(corr)), key=corr.__getitem__)
            self.corr = array("q", [corr[i] for i in order])
            self.ts, self.thread = array("d", [self.ts[i] for i in order]), array("i", [self.thread[i] for i in order])

    def _at(self, corr: int) -> int:
        if corr < 0:
            return -1
        i = bisect.bisect_right(self.corr, corr) - 1
        return i if i >= 0 and self.corr[i] == corr else -1

    def times(self, corr: np.ndarray, default: np.ndarray) -> np.ndarray:
        """For every correlation id in `corr`, the launch time (`default` where the trace holds
        no launch with that id, or the id is negative): what `_at` finds, for all at once."""
        found, safe = self._found(corr)
        return np.where(found, as_numpy(self.ts)[safe], default) if len(self.corr) else default.copy()

    def held(self, corr: np.ndarray) -> np.ndarray:
        """For every correlation id in `corr`, whether the trace holds its launch; all True in a
        trace that holds no launch at all (then nothing says when anything was launched)."""
        return self._found(corr)[0] if len(self.corr) else np.ones(len(corr), dtype=bool)

    def _found(self, corr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = as_numpy(self.corr)
        if not len(ids):
            return np.zeros(len(corr), dtype=bool), np.zeros(len(corr), dtype=np.int64)
        i = np.searchsorted(ids, corr, side="right") - 1
        safe = np.maximum(i, 0)
        return (corr >= 0) & (i >= 0) & (ids[safe] == corr), safe

    def launch(self, corr: int) -> tuple[float, int] | None:
        """(host time, thread index) of the launch, None when the trace does not hold it."""
        i = self._at(corr)
        return (self.ts[i], self.thread[i]) if i >= 0 else None


class _ParamComms:
    """The host's `record_param_comms` ops that carry a collective's args, per thread, by start:
    the CPU side of an NCCL kernel launched inside one."""

    def __init__(self, doc: Trace) -> None:
        self.by_thread: dict[int, list[tuple[float, float, Args]]] = defaultdict(list)
        self.starts: dict[int, list[float]] = {}
        ops = doc.ops
        rpc = doc.names.index(PARAM_COMMS) if PARAM_COMMS in doc.names else -1
        if rpc < 0 or not len(ops) or max(ops.extra) < 0:  # older traces: these ops carry no collective args
            return
        for t, d, n, th, extra in zip(ops.ts, ops.dur, ops.name, ops.thread, ops.extra):
            if n == rpc and extra >= 0:
                self.by_thread[th].append((t, t + d, doc.args[extra]))
        self.starts = {th: [e[0] for e in v] for th, v in self.by_thread.items()}

    def around(self, ts: float, thread: int) -> Args | None:
        """The args of the op on `thread` that contains host time `ts`: the last one to start by
        then (these ops do not nest: each wraps one collective call), if it has not ended."""
        starts = self.starts.get(thread)
        i = bisect.bisect_right(starts, ts) - 1 if starts else -1
        if i < 0:
            return None
        _, end, args = self.by_thread[thread][i]
        return args if end >= ts else None


def _name_mask(names: list[str], name: np.ndarray, pattern: re.Pattern[str]) -> np.ndarray:
    """For each event (its name ids in `name`), whether its name matches `pattern`: each name
    used is matched once."""
    matches = np.zeros(len(names), dtype=bool)
    for n in np.unique(name).tolist():
        matches[n] = bool(pattern.match(names[n]))
    return matches[name]


def count_launches(doc: Trace, index: _StepIndex) -> None:
    """Each step's `launches`: the kernel launch calls (LAUNCH_CALL, any thread) that start in it."""
    launches = doc.launches
    if not len(launches):
        return
    pos = index.positions(as_numpy(launches.ts)[_name_mask(doc.names, as_numpy(launches.name), LAUNCH_CALL)])
    for k, count in enumerate(np.bincount(pos[pos >= 0], minlength=len(index.steps)).tolist()):
        index.steps[k].launches += count


def add_by_name(
    index: _StepIndex, pos: np.ndarray, name: np.ndarray, dur: np.ndarray, names: list[str], field: str
) -> None:
    """Into each step's dict `field` (empty until then): the events' durations summed per name,
    for the events at step positions `pos` (-1: in no step, left out).
    1. one key per (step position, name id) present;
    2. per key, the durations summed in event order, from 0.0 (bincount adds in input order: the
       same sum as a loop adding them one by one);
    3. names entered in each step's dict in order of their first event."""
    keep = pos >= 0
    width = len(names)
    ids, first, inverse = np.unique(pos[keep] * width + name[keep], return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=dur[keep], minlength=len(ids))
    for u in np.argsort(first, kind="stable").tolist():
        k, n = divmod(int(ids[u]), width)
        getattr(index.steps[k], field)[names[n]] = float(totals[u])


def outside_phases(index: _StepIndex, ts: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Whether each host time `ts[i]`, in the step at position `pos[i]` (-1: none), is in that
    step and outside its data and optimizer phases (the phases' own spans, [start, end]
    closed; phases.is_model): in the model's own work (forward, loss, backward, h2d); True
    throughout a step with no phases. Per phase span, two binary searches over the times in order."""
    order = None if bool(np.all(ts[:-1] <= ts[1:])) else np.argsort(ts, kind="stable")
    t, k = (ts, pos) if order is None else (ts[order], pos[order])
    keep = k >= 0
    for j, s in enumerate(index.steps):
        for p, lo, hi in s.phase_spans:
            if not is_model(p):
                a, b = np.searchsorted(t, lo, side="left"), np.searchsorted(t, hi, side="right")
                keep[a:b] &= k[a:b] != j
    if order is None:
        return keep
    out = np.empty_like(keep)
    out[order] = keep
    return out


def main_stream_starts(
    doc: Trace, launch_ts: _LaunchTimes, index: _StepIndex, is_comm_name: np.ndarray
) -> dict[int, float]:
    """Per step, when its main stream (the stream of most of the step's compute kernels' time)
    starts the first work of the step (a kernel, copy or memset it launched): where the device
    starts the step. Side streams (a prefetch, an input copy for a later step) run ahead of it
    in their own order. Only work whose launch is in the trace counts: kernels launched before
    the profiler started belong to no step of it."""
    parts = []
    for cols, comm in ((doc.kernels, is_comm_name), (doc.copies, None)):
        if not len(cols):
            continue
        ts, dur, corr = as_numpy(cols.ts), as_numpy(cols.dur), as_numpy(cols.corr)
        step = index.numbers(index.positions(launch_ts.times(corr, np.full(len(ts), np.nan))))
        compute = ~comm[as_numpy(cols.name)] if comm is not None else np.zeros(len(ts), dtype=bool)
        parts.append((ts, dur, as_numpy(cols.thread), step, compute))
    if not parts:
        return {}
    ts, dur, stream, step, compute = (np.concatenate(x) for x in zip(*parts))
    keep = step != NO_STEP
    ts, dur, stream, step, compute = ts[keep], dur[keep], stream[keep], step[keep], compute[keep]
    if not compute.any():
        return {}
    width = int(stream.max()) + 1
    keys, inverse = np.unique(step.astype(np.int64) * width + stream, return_inverse=True)
    busy = np.bincount(inverse, weights=np.where(compute, dur, 0.0), minlength=len(keys))
    first = np.full(len(keys), np.inf)
    np.minimum.at(first, inverse, ts)
    best: dict[int, tuple[float, float]] = {}  # step -> (its main stream's compute time, that stream's first start)
    for k, t, f in zip(keys.tolist(), busy.tolist(), first.tolist()):
        st = k // width
        if t > 0 and (st not in best or t > best[st][0]):
            best[st] = (t, f)
    return {st: f for st, (_, f) in best.items()}


def _device_work(
    doc: Trace,
    index: _StepIndex,
    launch_ts: _LaunchTimes,
    spans: Spans,
    user_comm: re.Pattern[str] | None,
    warnings: list[str],
    file_name: str,
    is_comm_name: np.ndarray,
    launch_phases: Spans | None = None,
    host_phases: list[tuple[str, float, float]] | None = None,
) -> list[CommOp]:
    """The GPU kernels: communication kernels (comm_kernels.py: NCCL/RCCL and the other
    libraries' families, and the user's `--comm-kernel`) become CommOps (returned, in kernel
    order), the others compute intervals in `spans`; each belongs to the step its launch started
    in (the kernel's own start when the launch is not in the trace). Each step's
    `compute_by_name_us`: the kernel time by name of the kernels launched in the model's own
    work (`outside_phases`), summed in kernel order, names in order of first appearance;
    `is_comm_name[n]`: whether the name with id n is communication. Kernels whose names say
    communication but that no family holds are said in a warning. `launch_phases`, where given:
    the compute kernels again, each named by the host phase range (`host_phases`) its launch was
    made in (runup.NO_PHASE for none), for the run-ups by phase (runup.set_run_ups, 4)."""
    kernels, names = doc.kernels, doc.names
    ts, dur, name, corr = (as_numpy(c) for c in (kernels.ts, kernels.dur, kernels.name, kernels.corr))
    launched = launch_ts.times(corr, ts)
    # a communication kernel whose launch the trace lacks was launched before the window opened:
    # which call, and so which step, it belongs to is unknown (matching.match_collectives, 1)
    held = launch_ts.held(corr)
    pos = index.positions(launched)
    step = index.numbers(pos)
    used = np.unique(name).tolist()
    found = {n: classify_kernel(names[n], user_comm) for n in used}
    is_comm = np.zeros(len(names), dtype=bool)
    is_comm[[n for n in used if found[n] is not None]] = True
    comm = is_comm[name]
    compute = ~comm
    spans.extend(ts[compute], ts[compute] + dur[compute], step[compute], name[compute])
    if launch_phases is not None and host_phases:
        launch_phases.extend(
            ts[compute], ts[compute] + dur[compute], step[compute], phase_at(host_phases, launched[compute])
        )
    _say_lookalikes(names, used, found, name, dur, warnings, file_name)

    model = compute & outside_phases(index, launched, pos)
    add_by_name(index, pos[model], name[model], dur[model], names, "compute_by_name_us")
    is_comm_name[:] = is_comm

    comms: list[CommOp] = []
    param_comms = _ParamComms(doc) if comm.any() else None
    for i in np.flatnonzero(comm).tolist():
        t, d, n, extra = ts[i], dur[i], int(name[i]), kernels.extra[i]
        kind = found[n]
        assert kind is not None  # comm is set only where a family was found
        if kind.family == "NCCL":
            args = doc.args[extra] if extra >= 0 else _launching_comms(param_comms, launch_ts, kernels.corr[i])
            coll = args.collective or kind.collective
            if _point_to_point_batch(kind.collective, args, param_comms):
                coll = BATCH_P2P
            pg = "default" if args.process_group is None else args.process_group
            nelems, dtype, seq = _int(args.in_nelems), _str(args.dtype), _int(args.seq)
        else:  # no args: the name is all there is; the family is its own group
            coll, pg, nelems, dtype, seq = kind.collective, kind.family, None, None, None
        st = int(step[i])
        launch_held = bool(held[i])
        comms.append(
            CommOp(
                name=canonical_collective(str(coll)),
                pg=str(pg),
                start_us=float(t),
                end_us=float(t + d),
                nelems=nelems,
                dtype=dtype,
                step=None if st == NO_STEP or not launch_held else st,
                thread=doc.threads[kernels.thread[i]],
                coll_seq=seq,
                launched=launch_held,
            )
        )
    return comms


def phase_at(host_phases: list[tuple[str, float, float]], ts: np.ndarray) -> np.ndarray:
    """For each time in `ts`, the index of the phase range (disjoint, by start) holding it, or
    len(host_phases) (runup.NO_PHASE) for none."""
    starts = np.array([a for _, a, _ in host_phases], dtype=np.float64)
    ends = np.array([b for _, _, b in host_phases], dtype=np.float64)
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts < ends[np.maximum(k, 0)])
    return np.where(inside, k, len(host_phases))


def _say_lookalikes(
    names: list[str],
    used: list[int],
    found: dict,
    name: np.ndarray,
    dur: np.ndarray,
    warnings: list[str],
    file_name: str,
) -> None:
    """One warning naming the kernels (the longest by total time first) whose names say
    communication but that are counted as compute: no family holds them."""
    odd = [n for n in used if found[n] is None and looks_like_comm(names[n])]
    if not odd:
        return
    total = {n: float(dur[name == n].sum()) for n in odd}
    odd.sort(key=lambda n: -total[n])
    shown = ", ".join(f"`{plain_kernel(names[n])[:60]}` ({total[n] / 1e3:.2f} ms)" for n in odd[:3])
    more = f" and {len(odd) - 3} more" if len(odd) > 3 else ""
    warnings.append(
        f"{file_name}: kernel(s) whose names look like communication are counted as compute: {shown}"
        f"{more}; if they are, pass --comm-kernel REGEX (docs/collector.md, communication kernels)"
    )


def parse_trace(path: Path, comm_kernel: re.Pattern[str] | None = None) -> RankTrace:  # noqa: C901
    """Parse one trace file (see the module docstring for what comes from where); `comm_kernel`:
    kernels it matches are communication too (--comm-kernel, comm_kernels.py)."""
    warnings: list[str] = []
    doc = decode_trace(path)
    if doc.note:
        warnings.append(doc.note)
    if doc.dropped:
        warnings.append(f"{path.name}: {doc.dropped} malformed event(s) left out")
    rank, world_size, rank_source = _rank_of(doc, path, warnings)
    meta = doc.meta
    host = str(meta.get("host") or doc.host_name or "")
    base_ns = number(doc.base_time_ns) or 0.0
    names = doc.names
    if not doc.count:
        warnings.append(f"{path.name}: no timed events (ph X with a time and a duration); nothing to analyse in it")
    main = _main_thread(doc)
    if not host:
        host = host_from_file_name(path.name, doc.threads[main][0] if main is not None else None) or "unknown"
    main_ops = _Ops(doc, main)
    main_marks = [m for m in doc.marks if m.thread == main]
    steps, steps_source = _steps(doc, main_marks, main_ops, main, warnings, path.name)
    if steps_source == "ProfilerStep":
        steps = drop_stub(steps, main_ops.ts, warnings)
    index = _StepIndex(steps)
    by_number = {s.number: s for s in steps}

    in_step: dict[int, list[tuple[float, float, str]]] = defaultdict(list)
    for e in main_marks:
        if e.cat == "user_annotation" and not STEP_NAME.match(e.name) and e.name != WATCH_RANGE:
            st = index.at(e.ts)
            if st is not None and not (e.ts <= by_number[st].start_us and e.ts + e.dur >= by_number[st].end_us):
                in_step[st].append((e.ts, e.ts + e.dur, e.name))  # (a range around the whole step is no phase)
    for st, ranges in in_step.items():
        step = by_number[st]
        for a, b, phase in step_phases(ranges):  # the step's phases: phases.py
            step.phases_us[phase] = step.phases_us.get(phase, 0.0) + (b - a)
            step.phase_spans.append((phase, a, b))

    count_launches(doc, index)
    syncs = attribute_syncs(doc, index.at, by_number)
    floor_us = op_floor_us(doc, count_host_ops(doc, main, by_number))
    aten = [name.startswith("aten::") for name in names]

    comms: list[CommOp] = []
    device_comms: list[CommOp] = []
    starts: dict[int, float] = {}  # each step's device start (main_stream_starts)
    spans, copies = Spans(names), Spans(names)
    kernels = doc.kernels
    # every step's phase ranges in time order (top-level ranges: disjoint), for the GPU run-ups by phase
    host_phases = sorted((sp for s in steps for sp in s.phase_spans), key=lambda sp: sp[1])
    launch_phases = Spans([p for p, _, _ in host_phases] + [NO_PHASE]) if host_phases and len(kernels) else None
    launch_ts = _LaunchTimes(doc.launches) if len(kernels) or len(doc.copies) else None
    if len(kernels):
        assert launch_ts is not None  # made whenever there are kernels
        is_comm_name = np.zeros(len(names), dtype=bool)
        device_comms = _device_work(
            doc, index, launch_ts, spans, comm_kernel, warnings, path.name, is_comm_name, launch_phases, host_phases
        )
        starts = main_stream_starts(doc, launch_ts, index, is_comm_name)
        comms.extend(device_comms)
    elif doc.gpus or _nccl_backend(doc):
        warnings.append(f"{path.name}: {NO_KERNELS}")
    if len(doc.copies):
        assert launch_ts is not None  # made whenever there are copies
        ts, dur = as_numpy(doc.copies.ts), as_numpy(doc.copies.dur)
        copies.extend(
            ts, ts + dur, index.at_each(launch_ts.times(as_numpy(doc.copies.corr), ts)), as_numpy(doc.copies.name)
        )
    gloo: list[CommOp] = []
    for e in doc.marks:
        if e.cat != "user_annotation":
            continue
        m = GLOO_RANGE.match(e.name)
        if m:
            gloo.append(
                CommOp(
                    name=canonical_collective(m["coll"]),
                    pg="default",
                    start_us=e.ts,
                    end_us=e.ts + e.dur,
                    step=index.at(e.ts),
                    thread=doc.threads[e.thread],
                )
            )
    watch_spans = [(e.ts, e.ts + e.dur) for e in main_marks if e.name == WATCH_RANGE]
    gloo = not_the_watch_s(gloo, watch_spans)
    comms.extend(gloo)
    if not comms:
        # No NCCL kernels and no gloo worker ranges (older torch, other CPU backends): the
        # main thread's c10d ops are the only sign of communication; they span the blocking
        # call, so they stand in for the collective's interval.
        main_thread = doc.threads[main] if main is not None else ()
        for t, d, n in main_ops:
            m = C10D_OP.match(names[n])
            if m and m["coll"] not in ("wait", "barrier"):
                comms.append(
                    CommOp(
                        name=canonical_collective(m["coll"]),
                        pg="default",
                        start_us=t,
                        end_us=t + d,
                        step=index.at(t),
                        thread=main_thread,
                    )
                )
        if comms:
            warnings.append(f"{path.name}: no gloo:* or NCCL communication ranges; using the main thread's c10d ops")
    if not len(kernels):
        ts, dur, op_name = (as_numpy(c) for c in (main_ops.ts, main_ops.dur, main_ops.name))
        is_aten = np.array(aten, dtype=bool)[op_name] if len(op_name) else np.zeros(0, dtype=bool)
        spans.extend(ts[is_aten], ts[is_aten] + dur[is_aten], index.at_each(ts[is_aten]), op_name[is_aten])
        _self_times(main_ops, names, index, by_number)
    if syncs and len(kernels):
        sync_costs(syncs, device_busy(spans, copies, device_comms), by_number)
    if world_size == 1 and comms:
        # One rank has no peer to exchange with: its c10d and gloo ops are bookkeeping on the
        # host, and NCCL's kernels local copies, which keep the device busy as copies do.
        for c in device_comms:
            copies.add(c.start_us, c.end_us, c.step, 0)
        warnings.append(
            f"{path.name}: a world of one rank: its {len(comms)} collective call(s) exchange nothing "
            "(not counted as communication)"
        )
        comms = []
    unnamed = unnamed_groups(doc.distributed_info, world_size) if comms and not device_comms else []
    if unnamed and gloo and len(gloo) == len(comms):
        named = name_gloo_groups(path, gloo, base_ns)
        if isinstance(named, list):
            comms, unnamed = named, []
        else:
            warnings.append(f"{path.name}: {named}")
    if unnamed:
        warnings.append(
            f"{path.name}: its {len(comms)} collective(s) carry no process group (gloo's trace ranges name "
            f"none) and rank {rank} is in groups of fewer ranks than the world ({groups_text(unnamed)}): "
            "not matched across ranks, as a collective of one cannot be told from one of another"
        )
    comms.sort(key=lambda c: c.start_us)
    number_by_group(comms)
    set_run_ups(
        comms,
        spans,
        steps[0].start_us if steps else None,
        launch_phases,
        host_phases,
        blocking_p2p=not len(kernels),
        # the watch's exchange blocks the main thread until every rank is in it; on a GPU the host
        # runs ahead of its device, whose run-ups the host's wait does not bound
        exchange_ends_us=[] if len(kernels) else [b for _, b in watch_spans],
    )
    trace = RankTrace(
        rank=rank,
        world_size=world_size if isinstance(world_size, int) else None,
        host=host,
        paths=[str(path)],
        run_id=meta.get("run_id"),
        device="gpu" if len(kernels) else "cpu",
        steps=steps,
        comms=comms,
        warnings=warnings,
        steps_source=steps_source,
        rank_source=rank_source,
        base_us=base_ns / 1e3,
        json_bytes=doc.json_bytes,
        events=count_step_events(doc, steps),
        blocks={str(path): doc.blocks} if doc.blocks else {},
        op_floor_us=floor_us,
        unnamed_groups=unnamed,
        pid=_int(doc.threads[main][0]) if main is not None else None,
        # ts is relative to baseTimeNanoseconds where the trace has one, else epoch microseconds
        started_ns=base_ns + doc.first_ts * 1e3 if doc.count else None,
        practices=practices_in([*names, *{m.name for m in doc.marks}]),
    )
    # the compute and copies, folded into the steps here: no rank's intervals outlive its parse
    cover_steps(trace, merged_by_step(spans), merged_by_step(copies), device_step_marks(doc), starts)
    return trace


def not_the_watch_s(gloo: list[CommOp], watch_spans: list[tuple[float, float]]) -> list[CommOp]:
    """The gloo collectives but those of the harness watch's exchange: the watch's own group
    runs on gloo worker threads of its own, whose every range starts inside one of the main
    thread's `harness:watch` ranges (`watch_spans`); a job's thread with an asynchronous
    collective that started there has its other ranges outside them, and is kept."""
    if not watch_spans:
        return gloo
    starts = sorted(watch_spans)
    firsts = [a for a, _ in starts]

    def inside(t: float) -> bool:
        i = bisect.bisect_right(firsts, t) - 1
        return i >= 0 and t <= starts[i][1]

    outside = {c.thread for c in gloo if not inside(c.start_us)}
    return [c for c in gloo if c.thread in outside]


def name_gloo_groups(path: Path, gloo: list[CommOp], base_ns: float) -> list[CommOp] | str:
    """The gloo collectives (the watch's exchanges already left out) with their process groups
    from the Flight Recorder entries the training job wrote beside the trace (gloo_groups.py);
    or why they cannot be given groups. The world's default group keeps the name "default", which
    the collectives of a trace without the file carry too."""
    sidecar_file = groups_path(path)
    if not sidecar_file.exists():
        return (
            f"no {sidecar_file.name} beside it (the training job writes one where the Flight Recorder is on: "
            "harness.enable_flight_recorder() before init_process_group)"
        )
    sidecar = read_sidecar(sidecar_file)
    if isinstance(sidecar, str):
        return sidecar
    # point-to-point ops (gloo's send and receive, on the calling thread) need no group: they are
    # matched with nothing (matching.py), and the recorder's entries hold none of them
    grouped = [c for c in gloo if c.name not in POINT_TO_POINT]
    ran = [Ran(c.thread, c.start_us, c.name) for c in grouped]
    # the watch's exchanges are no ranges here (not_the_watch_s): their entries are no one's
    issued = [e for e in sidecar.issued(base_ns) if e.desc != WATCH_GROUP_DESC]
    found = thread_groups(ran, issued)
    if isinstance(found, str):
        return f"{sidecar_file.name}: {found}"
    for c in grouped:
        entry = found[c.thread]
        c.pg = "default" if entry.desc == DEFAULT_GROUP_DESC else entry.group
    return gloo


def device_busy(compute: Spans, copies: Spans, comms: list[CommOp]) -> list[tuple[float, float]]:
    """The device's busy time: every kernel, copy, memset and collective kernel, merged, by start."""
    a1, b1, _, _ = compute.columns()
    a2, b2, _, _ = copies.columns()
    a = np.concatenate([a1, a2, np.array([c.start_us for c in comms], dtype=np.float64)])
    b = np.concatenate([b1, b2, np.array([c.end_us for c in comms], dtype=np.float64)])
    order = np.lexsort((b, a))
    p, q = merged_pieces(a[order], b[order])
    return list(zip(p.tolist(), q.tolist()))


def device_step_marks(doc: Trace) -> dict[int, tuple[float, float]]:
    """The device's own ProfilerStep annotations (`gpu_user_annotation`, new traces), by step
    number: from the first to the last device work of the step, as Kineto records them."""
    out: dict[int, tuple[float, float]] = {}
    for m in doc.marks:
        if m.cat == "gpu_user_annotation":
            found = STEP_NAME.match(m.name)
            if found:
                n = int(found["n"])
                lo, hi = out.get(n, (m.ts, m.ts + m.dur))
                out[n] = (min(lo, m.ts), max(hi, m.ts + m.dur))
    return out


# A step of the same loop dispatches about the same host ops, and takes about as long, every
# time; one cut short by the end of its profiler window or of the run (a loop that `break`s, then
# `prof.stop()`, or a run that ends inside the window) holds a fraction of both. Half the window's
# median leaves room for steps of uneven length (a gradient-accumulation step without its
# optimizer still dispatches its whole forward and backward) and none for a stub (a few ops, a
# fraction of a millisecond). Both must hold: a short step with all its ops is a fast step, and
# a long one with few ops did something else (an evaluation) that is still the run's time.
STUB_SHARE = 0.5
STUB_NOTE = "left out: cut short by the end of its profiler window or of the run"


def drop_stub(steps: list[Step], main_op_starts: Any, warnings: list[str]) -> list[Step]:
    """`steps` (by start) without the last one when it is a stub: it holds fewer main-thread
    host ops (starting in it) than STUB_SHARE of the median over the window's steps, and lasts
    less than STUB_SHARE of their median duration. A lone step is kept (nothing to compare it
    with); the drop is said in `warnings`."""
    if len(steps) < 2:
        return steps
    starts = as_numpy(main_op_starts)
    counts = [
        int(np.searchsorted(starts, s.end_us, side="right") - np.searchsorted(starts, s.start_us, side="left"))
        for s in steps
    ]
    full_ops, full_us = float(np.median(counts)), float(np.median([s.dur_us for s in steps]))
    last = steps[-1]
    if counts[-1] >= STUB_SHARE * full_ops or last.dur_us >= STUB_SHARE * full_us:
        return steps
    warnings.append(
        f"step {last.number} ({last.dur_us / 1e3:.2f} ms and {counts[-1]} host op(s) against "
        f"{full_us / 1e3:.2f} ms and {full_ops:.0f} in the median step) {STUB_NOTE}"
    )
    return steps[:-1]


def count_step_events(doc: Trace, steps: list[Step]) -> int:
    """Set each step's `events` (cpu ops, launches, kernels, copies and annotations that start
    in it); returns the same count over the whole trace. Columns and marks are in start order,
    so each step is two binary searches per kind."""
    starts = [c.ts for c in (doc.ops, doc.launches, doc.kernels, doc.copies)] + [[m.ts for m in doc.marks]]
    for step in steps:
        step.events = sum(bisect.bisect_left(ts, step.end_us) - bisect.bisect_left(ts, step.start_us) for ts in starts)
    return sum(len(ts) for ts in starts)


def _point_to_point_batch(kernel_collective: str, args: Args, param_comms: _ParamComms | None) -> bool:
    """Whether an NCCL SendRecv kernel (NCCL runs point-to-point ops and all-to-alls alike) is a
    batch of sends and receives (`batch_isend_irecv`, pipeline schedules' default): it says so
    ("coalesced", torch's name for the batch), or it carries no collective args and was launched
    inside no `record_param_comms` op in a trace whose such ops carry them. torch launches a
    batch's one kernel in ncclGroupEnd, after each send's and receive's own record scope ended
    (pytorch/pytorch#194693), while an all-to-all's kernel carries its args or runs inside its
    op. In older traces those ops carry no args at all (`_ParamComms` is empty), and a bare
    SendRecv kernel there is an all-to-all (torchrec's: c10d::alltoall_base_), as before.
    Not yet checked on a real batched trace (this machine has no GPU)."""
    if kernel_collective != "sendrecv":
        return False
    if args.collective is not None:
        return canonical_collective(str(args.collective)) == "coalesced"
    return args.process_group is None and param_comms is not None and bool(param_comms.by_thread)


def _launching_comms(param_comms: _ParamComms | None, launch_ts: _LaunchTimes, corr: int) -> Args:
    """An NCCL kernel without collective args (e.g. `ncclDevKernel_Generic`): the args of the
    `record_param_comms` op around the host call that launched it, else none."""
    where = launch_ts.launch(corr)
    args = param_comms.around(*where) if param_comms is not None and where is not None else None
    return args or NO_ARGS


def _nccl_backend(doc: Trace) -> bool:
    """Whether distributedInfo or the harness metadata names NCCL as the backend."""
    for src in (doc.distributed_info or {}, doc.meta):
        if "nccl" in str(src.get("backend", "")).lower():
            return True
    return False


REDUCER_PREFIX = "torch::distributed::reducer::"
# Pseudo-name under which CPU traces record the self time of everything DDP's reducer runs
# (scaling gradients and copying them into buckets): communication work, not the model's.
DDP_REDUCER = "ddp reducer"


def _self_times(main_ops: _Ops, names: list[str], index: _StepIndex, by_number: dict[int, Step]) -> None:
    """CPU traces: each step's op self time by name (an op's duration minus its children's),
    communication ops and the data and optimizer phases left out; the CPU-side equivalent of
    GPU kernel time by name.

    1. walk the ops by start, longest first on ties, with a stack of open ops: an op's parent
       is the top of the stack once the ops that ended by its start are popped;
    2. an op is booked under its name, or under `DDP_REDUCER` when it or its parent is (DDP's
       reducer and everything under it, which thereby holds the reducer's whole time);
    3. in its step, outside the data and optimizer phases: credit its duration to its own key
       (unless it is a communication op) and debit it from its parent's (unless the parent is
       one); the credits and debits are summed in walk order, each op's credit first."""
    if not len(main_ops.ts):
        return
    comm = np.array([bool(COMM_OP.match(n)) for n in names], dtype=bool)
    reducer = [n.startswith(REDUCER_PREFIX) for n in names]
    ts_all, dur_all, name_all = (as_numpy(c) for c in (main_ops.ts, main_ops.dur, main_ops.name))
    order = nest_order(ts_all, dur_all)
    ts, dur, name = ts_all[order], dur_all[order], name_all[order]
    parent, key = nest(ts, ts + dur, np.array(reducer, dtype=bool)[name])
    own = np.where(key, len(names), name).astype(np.int64)  # the key booked under; len(names): DDP_REDUCER
    has_parent = parent >= 0
    parent_key = np.where(has_parent, own[np.maximum(parent, 0)], -1)
    # step of each op (its position) and whether it is in the step's data or optimizer phase
    k = index.positions(ts)
    valid = outside_phases(index, ts, k)
    credit = valid & ~comm[name]
    debit = valid & has_parent & ~comm[name[np.maximum(parent, 0)]]
    width = len(names) + 1
    # interleaved in walk order: op i's credit, then its debit
    ids = np.stack([k * width + own, k * width + parent_key], axis=1).ravel()
    amounts = np.stack([dur, -dur], axis=1).ravel()
    used = np.stack([credit, debit], axis=1).ravel()
    ids, amounts = ids[used], amounts[used]
    if not len(ids):
        return
    unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=amounts)  # summed in walk order, as the loop did
    for u in np.argsort(first, kind="stable").tolist():  # keys in order of first touch
        step, booked = divmod(int(unique[u]), width)
        by_name = cast(dict[str, float], index.steps[step].compute_by_name_us)  # a dict until compact()
        label = DDP_REDUCER if booked == len(names) else names[booked]
        by_name[label] = by_name.get(label, 0.0) + float(totals[u])


def _int(v: Any) -> int | None:
    n = number(v)
    return int(n) if n is not None and n == n and abs(n) != float("inf") else None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)
