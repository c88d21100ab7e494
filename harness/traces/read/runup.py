"""Each collective's run-up on its own rank: what the rank did between its previous collective
and this one. Computed once per trace at parse time (then the per-kernel intervals can be
dropped, and an in-job summary carries the same figures); read by the straggler phase
attribution. Pure functions over `Spans`, a trace's compute intervals as numpy columns."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.traces.model import CommOp
from harness.traces.read.comm_kernels import POINT_TO_POINT

IDLE = "idle (waiting on the host)"
# The run-up's waiting at point-to-point ops (`p2p_wait_us`), a key of run_up_us of its own:
# neither the host's time in a phase nor compute.
P2P_WAIT = "waiting at point-to-point ops"
# A GPU kernel gated on another stream's op (a CUDA event wait) starts within a few microseconds
# of that op's end (the event's signal and the block scheduler's pick-up); a compute stream
# that resumes within this long of a receive's end was waiting for it. A host-bound gap ends at
# a launch instead, which is as likely to fall in any 50 us as in any other: a stretch the rule
# could mistake is at most the gap's own length, and only where a receive ended 50 us before.
P2P_HANDOVER_US = 50.0
# An op queued behind another on one stream (or waiting for it) starts where that one ends, but
# can read as starting a hair before or after it: a trace's start and duration are rounded apart
# (kineto: to the ns), and a clock shift adds float error. Within this long, one ends where the
# next starts; a microsecond is far below any run-up or wait the rules judge. (stragglers.last_syncs
# too.)
HANDOVER_US = 1.0
OP_PREFIX = "op:"
# A GPU collective's run-up by phase (`set_run_ups`, 4): the keys are this prefix and the phase.
PHASE_PREFIX = "phase:"
NO_PHASE = "outside its ranges"  # run-up time that no phase range launched or covered
NO_STEP = -1  # Spans.step of an interval that belongs to no step


@dataclass
class Spans:
    """Intervals by kernel (GPU) or aten op (CPU) name, as columns: start_us, end_us, step (the
    step it belongs to, NO_STEP: none) and name (an index into `names`). `add` appends one;
    `columns` gives them as numpy arrays, by (start, end)."""

    names: list[str]
    start_us: array = field(default_factory=lambda: array("d"))
    end_us: array = field(default_factory=lambda: array("d"))
    step: array = field(default_factory=lambda: array("q"))
    name: array = field(default_factory=lambda: array("q"))

    def add(self, start_us: float, end_us: float, step: int | None, name: int) -> None:
        self.start_us.append(start_us)
        self.end_us.append(end_us)
        self.step.append(NO_STEP if step is None else step)
        self.name.append(name)

    def extend(self, start_us: np.ndarray, end_us: np.ndarray, step: np.ndarray, name: np.ndarray) -> None:
        for col, values in ((self.start_us, start_us), (self.end_us, end_us), (self.step, step), (self.name, name)):
            col.frombytes(np.ascontiguousarray(values, dtype=np.dtype(col.typecode)).tobytes())

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        start, end = np.frombuffer(self.start_us, dtype=np.float64), np.frombuffer(self.end_us, dtype=np.float64)
        order = np.lexsort((end, start))  # stable: equal intervals keep the order they were added in
        return (
            start[order],
            end[order],
            np.frombuffer(self.step, dtype=np.int64)[order],
            np.frombuffer(self.name, dtype=np.int64)[order],
        )


def merged_pieces(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals [x, y) given by non-decreasing x, as disjoint (start, end) columns:
    an interval starting at or before the furthest end so far joins the current piece (as
    overlap.union does, touching intervals included)."""
    if not len(x):
        return x, y
    reach = np.maximum.accumulate(y)
    first = np.ones(len(x), dtype=bool)
    first[1:] = x[1:] > reach[:-1]
    starts = np.flatnonzero(first)
    ends = np.append(starts[1:], len(x)) - 1
    return x[starts], reach[ends]


def set_run_ups(
    comms: list[CommOp],
    spans: Spans,
    first_step_start_us: float | None,
    launch_phases: Spans | None = None,
    host_phases: list[tuple[str, float, float]] | None = None,
    blocking_p2p: bool = False,
    exchange_ends_us: Sequence[float] = (),
) -> None:
    """Set every op's `run_up_start_us`, `run_up_us` and `p2p_wait_us`.

    1. run-up window = [lo, hi]: hi = the op's start; lo = the latest end among the rank's
       collectives and `exchange_ends_us` that ended by then, else the first step's start, else
       the op's start (point-to-point ops, comm_kernels.POINT_TO_POINT, are no collectives here:
       each ties a rank to one peer, and its group's ranks leave it at their own times;
       `exchange_ends_us` are the ends of exchanges over every rank that are not the job's
       collectives, the harness watch's on CPU: every rank leaves one together, so the time a
       rank spent waiting in it for a later peer is not its own run-up);
    2. run_up_us["op:<name>"] = the time compute spans of that name overlap the window (summed
       in span order, names in order of first appearance);
    3. run_up_us[IDLE] = window length - the union of all compute spans inside it (the device,
       or on CPU the main thread, neither computing nor in a collective's run-up work) - step 5's
       waiting;
    4. GPU traces with phase ranges (`launch_phases`: the compute kernels again, each named by
       the phase range its launch was made in, NO_PHASE for none; `host_phases`: the host's
       phase ranges): run_up_us["phase:<phase>"] = the kernel time of that phase's launches in
       the window (step 2's, by phase instead of by name), plus the stretches of step 3's idle
       that the host spent in that phase: a device idle while its host works in a phase waits
       for that phase's launches. The host runs ahead of its GPU, so the host's ranges at the
       device's times say nothing of the device's work; the launches and the idle do. The
       "phase:" values and step 5's waiting add up to the window length where no two kernels
       overlap;
    5. p2p_wait_us (`p2p_wait`) = the part of the idle spent waiting at point-to-point ops, kept
       under P2P_WAIT in run_up_us and out of steps 3 and 4 (op:, IDLE and P2P_WAIT add up to the
       window where no two spans overlap). Point-to-point ops get no run-up of their own.
    `spans` are the trace's compute intervals by kernel (GPU) or aten op (CPU) name;
    `blocking_p2p`: the trace's point-to-point ops block the thread that calls them (CPU: gloo's
    send and receive return once the data moved), else they are device ops (NCCL kernels)."""
    if not comms:
        return
    by_phase = _PhaseRunUps(launch_phases, host_phases or []) if launch_phases is not None else None
    ends = sorted([c.end_us for c in comms if c.name not in POINT_TO_POINT] + list(exchange_ends_us))
    p2p = P2POps([(c.start_us, c.end_us) for c in comms if c.name in POINT_TO_POINT])
    starts, stops, _, names = spans.columns()
    # Spans that overlap [lo, hi] start in [lo - longest span, hi): only those are visited.
    longest_us = float(np.max(stops - starts)) if len(starts) else 0.0
    for op in comms:
        if op.name in POINT_TO_POINT:  # no collective matched across ranks: nothing reads its run-up
            continue
        hi = op.start_us
        i = bisect.bisect_right(ends, hi) - 1
        lo = ends[i] if i >= 0 else (first_step_start_us if first_step_start_us is not None else hi)
        a, b = np.searchsorted(starts, [lo - longest_us, hi], side="left")
        keep = stops[a:b] > lo
        x, y = np.maximum(starts[a:b][keep], lo), np.minimum(stops[a:b][keep], hi)
        named = names[a:b][keep]
        ids, first, inverse = np.unique(named, return_index=True, return_inverse=True)
        totals = np.bincount(inverse, weights=y - x, minlength=len(ids))  # added in span order, as a loop would
        by_name = {OP_PREFIX + spans.names[ids[k]]: float(totals[k]) for k in np.argsort(first, kind="stable")}
        p, q = merged_pieces(x, y)
        by_name[IDLE] = (hi - lo) - sum((q - p).tolist())
        waits = p2p_wait(lo, hi, p, q, p2p, blocking_p2p) if len(p2p) else []
        if by_phase is not None:
            by_name.update(by_phase.run_up(lo, hi, p, q, waits))
        waited = sum(b - a for a, b in waits)
        if waited > 0:
            by_name[IDLE] -= waited
            by_name[P2P_WAIT] = waited
        op.run_up_start_us = lo
        op.run_up_us = by_name
        op.p2p_wait_us = waited


def idle_gaps(lo: float, hi: float, busy_lo: np.ndarray, busy_hi: np.ndarray) -> list[tuple[float, float]]:
    """The window [lo, hi] less the busy pieces [busy_lo, busy_hi] (disjoint, by start, inside
    the window): its idle gaps of positive length, by start."""
    edges = [lo, *np.ravel(np.column_stack((busy_lo, busy_hi))).tolist(), hi]
    return [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i + 1] > edges[i]]


def p2p_wait(
    lo: float,
    hi: float,
    busy_lo: np.ndarray,
    busy_hi: np.ndarray,
    p2p: P2POps,
    blocking: bool,
) -> list[tuple[float, float]]:
    """The stretches of a run-up [lo, hi] its rank spent waiting at point-to-point ops, disjoint,
    by start, inside the idle (the window less the busy pieces [busy_lo, busy_hi], disjoint).

    1. `blocking` (CPU): a send or receive holds its calling thread until its peer's data moved,
       so every idle stretch inside a p2p op is waiting;
    2. else (GPU): a receive runs on a stream of its own and the compute stream waits for it
       only where its work reads the data, so an idle gap is waiting where it ends within
       P2P_HANDOVER_US after a p2p op ends: from the later of the gap's start and that op's
       start, or the start of the ops it queued behind (each ending where the next starts: a
       receive behind a send to the same peer, on one stream, waits for that send too); of
       several such ops, the earliest start. A gap that ends at a launch was the host's; a
       receive posted early spins through host-bound gaps too, so being inside one is not
       enough."""
    out: list[tuple[float, float]] = []
    for g0, g1 in idle_gaps(lo, hi, busy_lo, busy_hi):
        if blocking:
            out.extend(p2p.inside(g0, g1))
        elif g1 < hi:  # a gap ending at the collective's own start is not a receive's
            start = p2p.chain_start(g1)
            if start is not None and g1 > max(start, g0):
                out.append((max(start, g0), g1))
    return out


class P2POps:
    """A rank's point-to-point ops' intervals, by end (GPU: `chain_start`) and merged by start
    (CPU: `inside`)."""

    def __init__(self, ops: list[tuple[float, float]]) -> None:
        by_end = sorted(ops, key=lambda ab: (ab[1], ab[0]))
        self.starts = [a for a, _ in by_end]
        self.ends = [b for _, b in by_end]
        by_start = sorted(ops)
        lo, hi = merged_pieces(np.array([a for a, _ in by_start]), np.array([b for _, b in by_start]))
        self.piece_lo, self.piece_hi = lo.tolist(), hi.tolist()

    def __len__(self) -> int:
        return len(self.ends)

    def inside(self, g0: float, g1: float) -> list[tuple[float, float]]:
        """The parts of [g0, g1] inside the ops, disjoint, by start."""
        out = []
        k = bisect.bisect_right(self.piece_hi, g0)
        while k < len(self.piece_hi) and self.piece_lo[k] < g1:
            a, b = max(self.piece_lo[k], g0), min(self.piece_hi[k], g1)
            if b > a:
                out.append((a, b))
            k += 1
        return out

    def chain_start(self, t: float) -> float | None:
        """The earliest start of the ops ending in [t - P2P_HANDOVER_US, t], each taken back
        through the ops it queued behind (one ending within HANDOVER_US of its start); None
        when no op ends there."""
        a = bisect.bisect_left(self.ends, t - P2P_HANDOVER_US)
        b = bisect.bisect_right(self.ends, t + HANDOVER_US)
        if a >= b:
            return None
        start = min(self.starts[a:b])
        while True:
            j = bisect.bisect_left(self.ends, start - HANDOVER_US)
            k = bisect.bisect_right(self.ends, start + HANDOVER_US)
            before = [self.starts[x] for x in range(j, k) if self.starts[x] < start]
            if not before:
                return start
            start = min(before)


class _PhaseRunUps:
    """`set_run_ups`' step 4 for one trace: its kernels by launching phase, and its host phase
    ranges (top-level in each step: disjoint), each sorted by start."""

    def __init__(self, launch_phases: Spans, host_phases: list[tuple[str, float, float]]) -> None:
        self.names = launch_phases.names
        self.start, self.stop, _, self.phase = launch_phases.columns()
        self.longest_us = float(np.max(self.stop - self.start)) if len(self.start) else 0.0
        ranges = sorted(host_phases, key=lambda r: r[1])
        self.host = [(str(n), float(a), float(b)) for n, a, b in ranges]
        self.host_starts = [a for _, a, _ in self.host]

    def run_up(
        self, lo: float, hi: float, busy_lo: np.ndarray, busy_hi: np.ndarray, waits: list[tuple[float, float]]
    ) -> dict[str, float]:
        """`set_run_ups`' step 4 for the window [lo, hi] with its busy pieces; the idle stretches
        in `waits` (`p2p_wait`) go to no phase."""
        out: dict[str, float] = {}
        a, b = np.searchsorted(self.start, [lo - self.longest_us, hi], side="left")
        keep = self.stop[a:b] > lo
        x, y = np.maximum(self.start[a:b][keep], lo), np.minimum(self.stop[a:b][keep], hi)
        totals = np.bincount(self.phase[a:b][keep], weights=y - x, minlength=len(self.names))
        for k in np.flatnonzero(totals).tolist():  # one per phase range in the window
            key = PHASE_PREFIX + self.names[k]
            out[key] = out.get(key, 0.0) + float(totals[k])
        # the idle: the window less the busy pieces and the waits, each stretch given to the
        # host's phase then
        cut_lo = np.concatenate((busy_lo, [a for a, _ in waits]))
        cut_hi = np.concatenate((busy_hi, [b for _, b in waits]))
        order = np.argsort(cut_lo, kind="stable")
        p, q = merged_pieces(cut_lo[order], cut_hi[order])
        for g0, g1 in idle_gaps(lo, hi, p, q):
            for name, t in self._host_overlap(g0, g1).items():
                out[PHASE_PREFIX + name] = out.get(PHASE_PREFIX + name, 0.0) + t
        return out

    def _host_overlap(self, lo: float, hi: float) -> dict[str, float]:
        out: dict[str, float] = {}
        covered = 0.0
        k = max(bisect.bisect_right(self.host_starts, lo) - 1, 0)
        while k < len(self.host) and self.host[k][1] < hi:
            name, a, b = self.host[k]
            t = min(b, hi) - max(a, lo)
            if t > 0:
                out[name] = out.get(name, 0.0) + t
                covered += t
            k += 1
        if hi - lo - covered > 0:
            out[NO_PHASE] = out.get(NO_PHASE, 0.0) + (hi - lo - covered)
        return out


def merged_by_step(spans: Spans) -> list[tuple[float, float, int | None]]:
    """The compute intervals merged per step that launched them (what overlap.cover_steps folds),
    by start; those of no step merged among themselves, with step None (they still keep the
    device busy inside a step's span)."""
    starts, stops, steps, _ = spans.columns()
    if not len(steps):
        return []
    order = np.argsort(steps, kind="stable")  # by step, and by (start, end) within one
    starts, stops, steps = starts[order], stops[order], steps[order]
    bounds = np.flatnonzero(np.diff(steps)) + 1
    out: list[tuple[float, float, int | None]] = []
    for lo, hi in zip(np.concatenate(([0], bounds)).tolist(), np.concatenate((bounds, [len(steps)])).tolist()):
        p, q = merged_pieces(starts[lo:hi], stops[lo:hi])
        st = int(steps[lo])
        out.extend((a, b, None if st == NO_STEP else st) for a, b in zip(p.tolist(), q.tolist()))
    # ties across steps: the step whose first interval was added first comes first
    raw = np.frombuffer(spans.step, dtype=np.int64)
    seen, first = np.unique(raw, return_index=True)
    added = {(None if k == NO_STEP else k): v for k, v in zip(seen.tolist(), first.tolist())}
    out.sort(key=lambda x: (x[0], x[1], added[x[2]]))
    return out
