"""Communication/computation overlap per rank and step, and the gaps where the device waits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from harness.collect.model import Busy, CommOp, Interval, RankTrace, StepCover

MIN_GAP_US = 50.0  # gaps shorter than this are not listed (they are still counted in idle/exposed)
LONGEST_GAPS = 200  # the gaps an analysis keeps (and the report lists): the longest, over all ranks


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


@dataclass(kw_only=True, slots=True)  # slots: ranks x steps of them
class StepOverlap:
    rank: int
    step: int
    window_us: float
    compute_us: float
    comm_us: float
    overlapped_comm_us: float
    exposed_comm_us: float  # = exposed_wait_us + exposed_transfer_us
    exposed_wait_us: float  # exposed, and only waiting for a later peer
    exposed_transfer_us: float  # exposed while moving data
    idle_us: float  # neither compute, communication nor a copy
    # process group -> {comm_us, exposed_wait_us, exposed_transfer_us} (groups may overlap in time)
    by_pg: dict[str, dict[str, float]] = field(default_factory=dict)
    memcpy_us: float = 0.0  # host<->device copies and memsets (GPU), whatever else runs with them


@dataclass(kw_only=True)
class Gap:
    rank: int
    step: int
    start_us: float
    dur_us: float
    # "exposed_wait" (communication not hidden by compute, waiting for a later peer),
    # "exposed_transfer" (the same while moving data) or "idle" (neither compute, communication
    # nor a copy)
    kind: str
    collective: str | None  # the collective exposed, or the one that ended last before an idle gap


OpWaits = dict[tuple[int, str, int], float]  # (rank, process group, seq) -> that op's wait, us


def _split(comms: list[CommOp], waits: OpWaits, rank: int, lo: float,
           hi: float) -> tuple[list[Interval], list[Interval]]:
    """The comms' union clipped to [lo, hi], and the part of it where some op is transferring:
    an op waits from its start for `wait` (until the last peer arrives), then transfers."""
    spans, moving = [], []
    for c in comms:
        w = min(max(waits.get((rank, c.pg, c.seq), 0.0), 0.0), c.dur_us)
        spans.append((c.start_us, c.end_us))
        if c.start_us + w < c.end_us:
            moving.append((c.start_us + w, c.end_us))
    return clip(merge(spans), lo, hi), clip(merge(moving), lo, hi)


def _timed(merged: list[Interval]) -> list[Interval]:
    return [(a, b) for a, b in merged if b > a]


def cover_steps(trace: RankTrace, compute: list[Busy], copies: list[Busy]) -> None:
    """Fold the rank's compute and copy intervals into its steps (`Step.cover`): what of them
    `rank_overlap` needs, so that the intervals themselves need not be kept. For every step N:

    1. C = union of the compute intervals of step N, M = union of its communication intervals,
       K = union of its copies (GPU memcpy/memset) (GPU: intervals launched in step N; CPU:
       intervals starting inside the step);
    2. window [lo, hi] = the ProfilerStep interval on a CPU trace; on GPU, first start to last
       end of step N's device intervals, copies included (device work runs behind the host),
       no cover when there are none; C, M and K are clipped to the window, and their
       zero-length pieces dropped (a kernel of no duration hides nothing and splits no gap);
    3. window = hi - lo, compute = |C|, memcpy = |K|, overlapped = |C ∩ M|, busy = |C ∪ M ∪ K|;
    4. kept as intervals: C ∩ M (what the split of exposed communication into waiting and
       transfer still needs of C: every part of the communication lies in M) and the idle
       pieces window - (C ∪ M ∪ K) at least MIN_GAP_US long;
    5. work_end = the latest end of step N's compute and copies, unclipped.
    `compute` and `copies` are (start_us, end_us, step) on the trace's clock."""
    comp_by: dict[int, list[Interval]] = {}
    for a, b, st in compute:
        if st is not None:
            comp_by.setdefault(st, []).append((a, b))
    copy_by: dict[int, list[Interval]] = {}
    for a, b, st in copies:
        if st is not None:
            copy_by.setdefault(st, []).append((a, b))
    comm_by: dict[int, list[Interval]] = {}
    for c in trace.comms:
        if c.step is not None:
            comm_by.setdefault(c.step, []).append((c.start_us, c.end_us))
    for step in trace.steps:
        comps = comp_by.get(step.number, [])
        spans = comm_by.get(step.number, [])
        cops = copy_by.get(step.number, [])
        if trace.device == "gpu":
            every = comps + cops + spans
            if not every:
                step.cover = None
                continue
            lo, hi = min(a for a, _ in every), max(b for _, b in every)
        else:
            lo, hi = step.start_us, step.end_us
        C, K, M = (_timed(clip(merge(x), lo, hi)) for x in (comps, cops, spans))
        both = intersect(C, M)
        busy = merge(C + M + K)
        step.cover = StepCover(
            lo_us=lo, hi_us=hi, window_us=hi - lo, compute_us=length(C), memcpy_us=length(K),
            overlapped_us=length(both), busy_us=length(busy), compute_in_comm=both,
            idle=[(a, b) for a, b in subtract([(lo, hi)], busy) if b - a >= MIN_GAP_US],
            work_end_us=max((b for _, b in comps + cops), default=None))


def rank_overlap(trace: RankTrace, waits: OpWaits | None = None) -> tuple[list[StepOverlap], list[Gap]]:
    """Overlap of one rank, step by step, from its steps' covers (`cover_steps`, steps 1-3:
    window, C, M, K and their lengths; idle gaps):
    4. comm = |M|, exposed = comm - overlapped, idle = window - busy (a copy keeps the device
       busy, so it is not idle);
    5. each op waits from its start for its `waits` entry (last arrival - own arrival at the
       matched instance; 0 for an op matched on no other rank) and transfers for the rest;
       T = union of the transferring parts: exposed_transfer = |T - C|, exposed_wait =
       exposed - exposed_transfer (exposed while every running op only waits); T and M lie
       in M, so C ∩ M stands in for C;
    6. the same split per process group, over that group's ops alone;
    7. gaps: the intervals of T - C (exposed_transfer), of (M - C) - T (exposed_wait), at least
       MIN_GAP_US long, and the cover's idle pieces (idle), each naming its collective (for
       idle: the last one to end before it in that step, if any).
    """
    waits = waits or {}
    rows: list[StepOverlap] = []
    gaps: list[Gap] = []
    comm_by: dict[int, list] = {}
    for c in trace.comms:
        if c.step is not None:
            comm_by.setdefault(c.step, []).append(c)
    for step in trace.steps:
        cover = step.cover
        if cover is None:
            continue
        comms = comm_by.get(step.number, [])
        lo, hi = cover.lo_us, cover.hi_us
        C = list(cover.compute_in_comm)
        M, T = _split(comms, waits, trace.rank, lo, hi)
        window = cover.window_us
        exposed = subtract(M, C)
        moving = subtract(T, C)
        by_pg = {}
        for pg in sorted({c.pg for c in comms}):
            Mp, Tp = _split([c for c in comms if c.pg == pg], waits, trace.rank, lo, hi)
            exp_p, mov_p = length(subtract(Mp, C)), length(subtract(Tp, C))
            by_pg[pg] = {"comm_us": length(Mp), "exposed_wait_us": exp_p - mov_p, "exposed_transfer_us": mov_p}
        rows.append(StepOverlap(rank=trace.rank, step=step.number, window_us=window, compute_us=cover.compute_us,
                                comm_us=length(M), overlapped_comm_us=cover.overlapped_us,
                                exposed_comm_us=length(exposed), exposed_wait_us=length(exposed) - length(moving),
                                exposed_transfer_us=length(moving), idle_us=window - cover.busy_us, by_pg=by_pg,
                                memcpy_us=cover.memcpy_us))
        gaps.extend(step_gaps(trace.rank, step.number, comms, moving, subtract(exposed, moving), cover.idle))
    return rows, gaps


def step_gaps(rank: int, step: int, comms: list[CommOp], transfer: Iterable[Interval], wait: Iterable[Interval],
              idle: Iterable[Interval]) -> list[Gap]:
    """A step's gaps: the exposed transfer and exposed waiting pieces at least MIN_GAP_US long,
    each naming the collective running over it, and the `idle` pieces (a cover's: already that
    long, measured before any shift), each naming the last collective to end before it in the
    step, if any."""
    gaps = []
    for kind, pieces in (("exposed_transfer", transfer), ("exposed_wait", wait)):
        for a, b in pieces:
            if b - a >= MIN_GAP_US:
                name = next((c.name for c in comms if c.start_us < b and c.end_us > a), None)
                gaps.append(Gap(rank=rank, step=step, start_us=a, dur_us=b - a, kind=kind, collective=name))
    for a, b in idle:
        before = [c for c in comms if c.end_us <= a]
        name = max(before, key=lambda c: c.end_us).name if before else None
        gaps.append(Gap(rank=rank, step=step, start_us=a, dur_us=b - a, kind="idle", collective=name))
    return gaps


class LongestGaps:
    """The `keep` longest gaps of the ranks `add`ed one by one, and how many there were in all:
    what the report lists, held in bounded memory whatever the number of ranks (1024 DLRM ranks
    have 110 k gaps). `gaps` equals sorting every gap, in the order added, longest first
    (a stable sort: ties keep that order) and keeping the first `keep`."""

    def __init__(self, keep: int = LONGEST_GAPS) -> None:
        self.keep = keep
        self.total = 0
        self._held: list[Gap] = []  # the longest so far (sorted), then the ones added since

    def add(self, gaps: list[Gap]) -> None:
        self.total += len(gaps)
        self._held.extend(gaps)
        if len(self._held) > 4 * self.keep:
            self._trim()

    def _trim(self) -> None:
        # sorted() is stable, and the held ones are ahead of the ones added after them
        self._held = sorted(self._held, key=_longest_first)[:self.keep]

    @property
    def gaps(self) -> list[Gap]:
        self._trim()
        return list(self._held)


def _longest_first(g: Gap) -> float:
    return -g.dur_us
