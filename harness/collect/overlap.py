"""Communication/computation overlap per rank and step, and the gaps where the device waits."""

from __future__ import annotations

from dataclasses import dataclass

from harness.collect.model import Interval, RankTrace

MIN_GAP_US = 50.0  # gaps shorter than this are not listed (they are still counted in idle/exposed)


def merge(intervals: list[Interval]) -> list[Interval]:
    """Union of intervals as sorted, disjoint intervals."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def length(merged: list[Interval]) -> float:
    return sum(b - a for a, b in merged)


def intersect(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists (two-pointer sweep)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(x: list[Interval], y: list[Interval]) -> list[Interval]:
    """Parts of merged `x` not covered by merged `y`."""
    out: list[Interval] = []
    j = 0
    for a, b in x:
        cur = a
        while j < len(y) and y[j][1] <= cur:
            j += 1
        k = j
        while k < len(y) and y[k][0] < b:
            if y[k][0] > cur:
                out.append((cur, y[k][0]))
            cur = max(cur, y[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def clip(merged: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in merged if b > lo and a < hi]


@dataclass(kw_only=True)
class StepOverlap:
    rank: int
    step: int
    window_us: float
    compute_us: float
    comm_us: float
    overlapped_comm_us: float
    exposed_comm_us: float
    idle_us: float


@dataclass(kw_only=True)
class Gap:
    rank: int
    step: int
    start_us: float
    dur_us: float
    kind: str  # "exposed_comm" (communication not hidden by compute) or "idle" (neither)
    collective: str | None  # the collective exposed, or the one that ended last before an idle gap


def rank_overlap(trace: RankTrace, min_gap_us: float = MIN_GAP_US) -> tuple[list[StepOverlap], list[Gap]]:
    """Overlap of one rank, step by step.

    For every step N:
    1. C = union of the compute intervals of step N, M = union of its communication intervals
       (GPU: intervals launched in step N; CPU: intervals starting inside the step);
    2. window = the ProfilerStep interval on a CPU trace; on GPU, first start to last end of
       step N's device intervals (device work runs behind the host);
       C and M are clipped to the window;
    3. compute = |C|, comm = |M|, overlapped = |C ∩ M|, exposed = comm - overlapped,
       idle = window - |C ∪ M|;
    4. gaps: the intervals of M - C (exposed communication) and of window - (C ∪ M) (idle),
       at least `min_gap_us` long, each naming its collective (for idle: the last one to end
       before it in that step, if any).
    """
    rows: list[StepOverlap] = []
    gaps: list[Gap] = []
    comp_by: dict[int, list[Interval]] = {}
    for a, b, st in trace.compute:
        if st is not None:
            comp_by.setdefault(st, []).append((a, b))
    comm_by: dict[int, list] = {}
    for c in trace.comms:
        if c.step is not None:
            comm_by.setdefault(c.step, []).append(c)
    for step in trace.steps:
        comps = comp_by.get(step.number, [])
        comms = comm_by.get(step.number, [])
        if trace.device == "gpu":
            spans = comps + [(c.start_us, c.end_us) for c in comms]
            if not spans:
                continue
            lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        else:
            lo, hi = step.start_us, step.end_us
        C = clip(merge(comps), lo, hi)
        M = clip(merge([(c.start_us, c.end_us) for c in comms]), lo, hi)
        both = intersect(C, M)
        busy = merge(C + M)
        window = hi - lo
        rows.append(StepOverlap(rank=trace.rank, step=step.number, window_us=window, compute_us=length(C),
                                comm_us=length(M), overlapped_comm_us=length(both),
                                exposed_comm_us=length(M) - length(both), idle_us=window - length(busy)))
        for a, b in subtract(M, C):
            if b - a >= min_gap_us:
                name = next((c.name for c in comms if c.start_us < b and c.end_us > a), None)
                gaps.append(Gap(rank=trace.rank, step=step.number, start_us=a, dur_us=b - a, kind="exposed_comm", collective=name))
        for a, b in subtract([(lo, hi)], busy):
            if b - a >= min_gap_us:
                before = [c for c in comms if c.end_us <= a]
                name = max(before, key=lambda c: c.end_us).name if before else None
                gaps.append(Gap(rank=trace.rank, step=step.number, start_us=a, dur_us=b - a, kind="idle", collective=name))
    return rows, gaps
