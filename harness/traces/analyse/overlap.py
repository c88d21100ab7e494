"""Communication/computation overlap per rank and step, and the gaps where the device waits."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harness.traces.model import Busy, CommOp, Interval, RankTrace, StepCover
from harness.traces.read.phases import is_data

MIN_GAP_US = 50.0  # gaps shorter than this are not listed (they are still counted in idle/exposed)
LONGEST_GAPS = 200  # the gaps an analysis keeps (and the report lists): the longest, over all ranks


def union(intervals: list[Interval]) -> list[Interval]:
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


def data_spans(trace: RankTrace) -> list[Interval]:
    """The rank's data phases (the input pipeline, phases.is_data), every step's, by start; they
    may overlap (a data phase inside another)."""
    return sorted((a, b) for s in trace.steps for p, a, b in s.phase_spans if is_data(p))


@dataclass(kw_only=True, slots=True)  # slots: ranks x steps of them
class StepOverlap:
    rank: int
    step: int
    window_us: float  # the step's span (device_spans): compute + exposed_comm + memcpy + idle
    compute_us: float
    comm_us: float
    overlapped_comm_us: float
    exposed_comm_us: float  # = exposed_wait_us + exposed_transfer_us
    exposed_wait_us: float  # exposed, and only waiting for a later peer
    exposed_transfer_us: float  # exposed while moving data
    idle_us: float  # neither compute, communication nor a copy
    # process group -> {comm_us, exposed_wait_us, exposed_transfer_us} (groups may overlap in time)
    by_pg: dict[str, dict[str, float]] = field(default_factory=dict)
    memcpy_us: float = 0.0  # host<->device copies and memsets (GPU) while no compute or communication runs
    idle_in_data_us: float = 0.0  # of idle_us, what lies in the rank's data phases (the host waiting to load)


@dataclass(kw_only=True)
class Gap:
    """`gaps[]`: a stretch of a rank's step with its device neither computing nor hiding its
    communication, longest first (at most LONGEST_GAPS; `gaps_total` counts all)."""

    rank: int
    """the rank"""
    step: int
    """the step"""
    start_us: float
    """its start on the aligned clock of merged.pt.trace.json.gz"""
    dur_us: float
    """its length"""
    kind: str
    """exposed_wait (communication not hidden by compute, waiting for a later peer),
    exposed_transfer (the same while moving data) or idle (neither compute, communication nor a copy)"""
    collective: str | None
    """the collective exposed, or the one that ended last before an idle gap"""


OpWaits = dict[tuple[int, str, int], float]  # (rank, process group, seq) -> that op's wait, us


def _split(
    comms: list[CommOp], waits: OpWaits, rank: int, lo: float, hi: float
) -> tuple[list[Interval], list[Interval]]:
    """The comms' union clipped to [lo, hi], and the part of it where some op is transferring:
    an op waits from its start for `wait` (until the last peer arrives), then transfers."""
    spans, moving = [], []
    for c in comms:
        w = min(max(waits.get((rank, c.pg, c.seq), 0.0), 0.0), c.dur_us)
        spans.append((c.start_us, c.end_us))
        if c.start_us + w < c.end_us:
            moving.append((c.start_us + w, c.end_us))
    return clip(union(spans), lo, hi), clip(union(moving), lo, hi)


def _timed(merged: list[Interval]) -> list[Interval]:
    return [(a, b) for a, b in merged if b > a]


def device_spans(
    trace: RankTrace,
    own: Mapping[int, Interval],
    marks: Mapping[int, Interval] | None = None,
    starts: Mapping[int, float] | None = None,
    comm_starts: Mapping[int, list[float]] | None = None,
) -> dict[int, Interval]:
    """The rank's step spans: consecutive, non-overlapping intervals of the timeline its device
    (on CPU: its main thread) works on, one per step that has one; what `cover_steps` partitions.

    CPU: each step's own ProfilerStep interval (the host is the device).
    GPU: the device runs behind the host (a healthy job launches step N+1 while the device still
    runs step N), so a step's span is cut from the device's timeline, not the host's:
    1. the step's device start b_N = the start of its `gpu_user_annotation` ProfilerStep where
       the trace has one (`marks`), else when its main stream starts its first kernel of the
       step (`starts`: the stream of most of its compute, parse.main_stream_starts; a side
       stream's prefetch runs ahead of the step) or, where earlier, when one of the step's
       collectives (`comm_starts`, by launch) starts once all the device work the steps before
       launched has ended (not for the trace's first step, whose elders' work is not in it):
       it runs beside nothing of theirs, and the main stream may wait for it (FSDP's first
       all-gather, which waits for the optimizer, and the first layer for it: its wait for a
       late peer is the step's), else the earliest start of the device
       work it launched (`own`: kernels, copies, memsets and collectives by launch); a stream
       runs its work in launch order, so b grows with N;
    2. over the steps in host order, b is made non-decreasing (a side stream's early start
       cannot move a step before the one launched ahead of it);
    3. span N = [b_N, b_M), M the next step with a device start; the last span ends at the
       latest end of the device work launched in any of the steps (or of its annotation), so
       the spans cover the device's time from the first step's start to the end of the work
       the steps launched;
    4. a step that launched nothing and has no annotation has no span: its time belongs to the
       span before it.
    `own` maps a step to (first start, last end) of the device work it launched."""
    if trace.device != "gpu":
        return {s.number: (s.start_us, s.end_us) for s in trace.steps}
    marks, starts = marks or {}, starts or {}
    firsts: list[tuple[int, float]] = []
    last_end = -math.inf
    floor = -math.inf
    for s in sorted(trace.steps, key=lambda s: s.start_us):
        where = marks.get(s.number) or own.get(s.number)
        if where is None:
            continue
        begin = where[0] if s.number in marks else starts.get(s.number, where[0])
        if s.number not in marks and comm_starts and firsts:  # the first step's elders are not in the trace
            begin = min([begin, *(c for c in comm_starts.get(s.number, ()) if last_end <= c)])
        floor = max(floor, begin)
        firsts.append((s.number, floor))
        last_end = max(last_end, where[1], own.get(s.number, where)[1])
    spans: dict[int, Interval] = {}
    for i, (number, lo) in enumerate(firsts):
        hi = firsts[i + 1][1] if i + 1 < len(firsts) else max(last_end, lo)
        spans[number] = (lo, hi)
    return spans


def cover_steps(
    trace: RankTrace,
    compute: list[Busy],
    copies: list[Busy],
    marks: Mapping[int, Interval] | None = None,
    starts: Mapping[int, float] | None = None,
) -> None:
    """Fold the rank's compute and copy intervals into its steps (`Step.cover`): what of them
    `rank_overlap` needs, so that the intervals themselves need not be kept. `compute` and
    `copies` are (start_us, end_us, step that launched it or None) on the trace's clock;
    `marks` the device's ProfilerStep annotations by step, where the trace has them; `starts`
    each step's main stream's first kernel.

    1. each step's span [lo, hi] (`device_spans`); a step without one gets no cover;
    2. C = union of ALL compute intervals, M = of all communication intervals, K = of all copies
       (GPU memcpy/memset), whatever step launched them, clipped to the span, zero-length pieces
       dropped (a kernel of no duration hides nothing and splits no gap): the device's time
       inside the span is what ran there;
    3. window = hi - lo, compute = |C|, overlapped = |C ∩ M|, busy = |C ∪ M ∪ K|, memcpy =
       |K - (C ∪ M)| (the copies' time that nothing else covers), so that every instant of
       the span is counted once: compute + (M - C) + memcpy + idle = window;
    4. kept as intervals: C ∩ M (what the split of exposed communication into waiting and
       transfer still needs of C: every part of the communication lies in M) and the idle
       pieces window - (C ∪ M ∪ K) at least MIN_GAP_US long;
    5. work_end = the latest end of the compute and copies the step launched, unclipped (where
       the merged trace's window of that step ends)."""
    own: dict[int, list[float]] = {}

    def owned(a: float, b: float, st: int | None) -> None:
        if st is not None:
            got = own.get(st)
            if got is None:
                own[st] = [a, b]
            else:
                got[0], got[1] = min(got[0], a), max(got[1], b)

    work_end: dict[int, float] = {}
    for a, b, st in (*compute, *copies):
        owned(a, b, st)
        if st is not None and b > work_end.get(st, -math.inf):
            work_end[st] = b
    comm_starts: dict[int, list[float]] = {}
    for c in trace.comms:
        owned(c.start_us, c.end_us, c.step)
        if c.step is not None:
            comm_starts.setdefault(c.step, []).append(c.start_us)
    spans = device_spans(trace, {k: (v[0], v[1]) for k, v in own.items()}, marks, starts, comm_starts)
    every = [
        _Merged(union([(a, b) for a, b, _ in compute])),
        _Merged(union([(a, b) for a, b, _ in copies])),
        _Merged(union([(c.start_us, c.end_us) for c in trace.comms])),
    ]
    for step in trace.steps:
        span = spans.get(step.number)
        if span is None:
            step.cover = None
            continue
        lo, hi = span
        C, K, M = (_timed(x.clipped(lo, hi)) for x in every)
        both = intersect(C, M)
        busy = union(C + M + K)
        step.cover = StepCover(
            lo_us=lo,
            hi_us=hi,
            window_us=hi - lo,
            compute_us=length(C),
            memcpy_us=length(subtract(K, union(C + M))),
            overlapped_us=length(both),
            busy_us=length(busy),
            compute_in_comm=both,
            idle=[(a, b) for a, b in subtract([(lo, hi)], busy) if b - a >= MIN_GAP_US],
            work_end_us=work_end.get(step.number),
        )


class _Merged:
    """Disjoint intervals by start (`union`'s), clipped to a window by binary search: each step
    reads only the pieces in its span, not the rank's every interval."""

    def __init__(self, merged: list[Interval]) -> None:
        self.merged = merged
        self.ends = [b for _, b in merged]  # disjoint and by start: the ends are in order too

    def clipped(self, lo: float, hi: float) -> list[Interval]:
        out = []
        for k in range(bisect.bisect_left(self.ends, lo), len(self.merged)):  # from the first ending at or after lo
            a, b = self.merged[k]
            if a >= hi:
                break
            if b > lo:
                out.append((max(a, lo), min(b, hi)))
        return out


def comms_in(comms: list[CommOp], lo: float, hi: float) -> list[CommOp]:
    """The ops of `comms` that run inside [lo, hi), whatever step launched them (an op of no
    duration: that starts inside it)."""
    return [
        c for c in comms if (c.start_us < hi and c.end_us > lo) or (c.start_us == c.end_us and lo <= c.start_us < hi)
    ]


class _ByStart:
    """A rank's collectives by start, and `comms_in` of a window by binary search: only those
    starting from (lo - the longest one's duration) to hi are looked at."""

    def __init__(self, comms: list[CommOp]) -> None:
        self.comms = sorted(comms, key=lambda c: c.start_us)
        self.starts = [c.start_us for c in self.comms]
        self.longest = max((c.dur_us for c in self.comms), default=0.0)

    def within(self, lo: float, hi: float) -> list[CommOp]:
        a = bisect.bisect_left(self.starts, lo - self.longest)
        b = bisect.bisect_left(self.starts, hi)
        return comms_in(self.comms[a:b], lo, hi)


def rank_overlap(trace: RankTrace, waits: OpWaits | None = None) -> tuple[list[StepOverlap], list[Gap]]:
    """Overlap of one rank, span by span, from its steps' covers (`cover_steps`, steps 1-3:
    span, C, M, K and their lengths; idle gaps):
    4. the ops in the span are every op of the rank that runs in it (`comms_in`), whatever
       step launched it; comm = |M|, exposed = comm - overlapped, idle = window - busy (a copy
       keeps the device busy, so it is not idle); compute + exposed + memcpy + idle = window;
    5. each op waits from its start for its `waits` entry (last arrival - own arrival at the
       matched instance; 0 for an op matched on no other rank) and transfers for the rest;
       T = union of the transferring parts: exposed_transfer = |T - C|, exposed_wait =
       exposed - exposed_transfer (exposed while every running op only waits); T and M lie
       in M, so C ∩ M stands in for C;
    6. the same split per process group, over that group's ops alone;
    7. gaps: the intervals of T - C (exposed_transfer), of (M - C) - T (exposed_wait), at least
       MIN_GAP_US long, and the cover's idle pieces (idle), each naming its collective (for
       idle: the last one in the span to end before it, if any);
    8. idle_in_data = |idle pieces ∩ the union of the rank's data phases (any step's)|: on GPU
       the host loads the next batch while the device still runs the step before, so a data
       phase costs the device only where it idles in it (the span's idle, not the step's own
       host phase).
    """
    waits = waits or {}
    rows: list[StepOverlap] = []
    gaps: list[Gap] = []
    every = _ByStart(trace.comms)
    data = union(data_spans(trace))
    data_ends = [b for _, b in data]
    for step in trace.steps:
        cover = step.cover
        if cover is None:
            continue
        lo, hi = cover.lo_us, cover.hi_us
        comms = every.within(lo, hi)
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
        rows.append(
            StepOverlap(
                rank=trace.rank,
                step=step.number,
                window_us=window,
                compute_us=cover.compute_us,
                comm_us=length(M),
                overlapped_comm_us=cover.overlapped_us,
                exposed_comm_us=length(exposed),
                exposed_wait_us=length(exposed) - length(moving),
                exposed_transfer_us=length(moving),
                idle_us=window - cover.busy_us,
                by_pg=by_pg,
                memcpy_us=cover.memcpy_us,
                idle_in_data_us=length(intersect(_within(data, data_ends, lo, hi), list(cover.idle))),
            )
        )
        gaps.extend(step_gaps(trace.rank, step.number, comms, moving, subtract(exposed, moving), cover.idle))
    return rows, gaps


def _within(merged: list[Interval], ends: list[float], lo: float, hi: float) -> list[Interval]:
    """`clip(merged, lo, hi)` from the first interval ending after `lo` (`ends`: merged's ends),
    not from the start: a step visits its own few intervals, not every step's."""
    out = []
    for a, b in itertools.islice(merged, bisect.bisect_right(ends, lo), None):
        if a >= hi:
            break
        out.append((max(a, lo), min(b, hi)))
    return out


def step_gaps(
    rank: int,
    step: int,
    comms: list[CommOp],
    transfer: Iterable[Interval],
    wait: Iterable[Interval],
    idle: Iterable[Interval],
) -> list[Gap]:
    """A step's gaps: the exposed transfer and exposed waiting pieces at least MIN_GAP_US long,
    each naming the first collective (in `comms`' order) running over it, and the `idle` pieces
    (a cover's: already that long, measured before any shift), each naming the collective that
    ended last before it in the step (the first of those ending together), if any.

    Found by bisection, not a scan of the step's collectives per piece (a tensor-parallel step
    has ~80 collectives and as many pieces): the running one starts at the first collective whose
    prefix maximum of ends passes the piece's start (none before it ends after that start); the
    one ending last before an idle piece is the last in end order up to its start."""
    gaps = []
    reach = list(itertools.accumulate((c.end_us for c in comms), max))
    for kind, pieces in (("exposed_transfer", transfer), ("exposed_wait", wait)):
        for a, b in pieces:
            if b - a >= MIN_GAP_US:
                i = bisect.bisect_right(reach, a)
                name = next((c.name for c in comms[i:] if c.start_us < b and c.end_us > a), None)
                gaps.append(Gap(rank=rank, step=step, start_us=a, dur_us=b - a, kind=kind, collective=name))
    by_end = sorted(range(len(comms)), key=lambda i: (comms[i].end_us, -i))
    ends = [comms[i].end_us for i in by_end]
    for a, b in idle:
        k = bisect.bisect_right(ends, a)
        name = comms[by_end[k - 1]].name if k else None
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
        self._held = sorted(self._held, key=_longest_first)[: self.keep]

    @property
    def gaps(self) -> list[Gap]:
        self._trim()
        return list(self._held)


def _longest_first(g: Gap) -> float:
    return -g.dur_us
