"""Steps' covers (overlap.cover_steps): the compute and copies folded at parse time must give the
overlap the intervals give. The oracle computes the overlap straight from the kept intervals
(kept here) over its own step spans: the same rows and gaps, exactly, on generated steps,
compute, copies and collectives (overlapping, touching, outside every step, zero-length; CPU and
GPU spans), on the rank's own clock and after the shift onto the aligned clock; and every row's
parts add up to its span."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.traces.analyse.overlap import (
    MIN_GAP_US,
    Gap,
    LongestGaps,
    StepOverlap,
    _split,
    clip,
    cover_steps,
    intersect,
    length,
    rank_overlap,
    step_gaps,
    subtract,
    union,
)
from harness.traces.model import Busy, CommOp, RankTrace, Step

# Whole and half microseconds, offsets in whole ones: every sum and difference is exact, so the
# shifted results must match to the bit as well.
TIME = st.integers(0, 800).map(lambda t: t / 2)
STEP_OF = st.one_of(st.none(), st.integers(1, 3))
INTERVAL = st.tuples(TIME, st.integers(0, 300).map(lambda d: d / 2), STEP_OF)
COMM = st.tuples(
    TIME,
    st.integers(0, 300).map(lambda d: d / 2),
    STEP_OF,
    st.sampled_from(["0", "1"]),
    st.integers(0, 200).map(lambda w: w / 2),
)


def _spans(trace: RankTrace, compute: list[Busy], copies: list[Busy]) -> dict[int, tuple[float, float]]:
    """The oracle's own step spans: CPU, the steps; GPU, from each step's first own device work
    (non-decreasing in host order) to the next such start, the last to the latest own end."""
    if trace.device != "gpu":
        return {s.number: (s.start_us, s.end_us) for s in trace.steps}
    own = [(a, b, st) for a, b, st in compute + copies] + [(c.start_us, c.end_us, c.step) for c in trace.comms]
    firsts, floor, last = [], float("-inf"), float("-inf")
    for s in sorted(trace.steps, key=lambda s: s.start_us):
        mine = [(a, b) for a, b, st in own if st == s.number]
        if mine:
            floor = max(floor, min(a for a, _ in mine))
            last = max(last, max(b for _, b in mine))
            firsts.append((s.number, floor))
    return {n: (lo, firsts[i + 1][1] if i + 1 < len(firsts) else max(last, lo)) for i, (n, lo) in enumerate(firsts)}


def _overlap_from_intervals(
    trace: RankTrace, compute: list[Busy], copies: list[Busy], waits: dict
) -> tuple[list[StepOverlap], list[Gap]]:
    """The overlap computed straight from the rank's compute and copy intervals over each span:
    every interval, whatever step launched it, clipped to the span."""
    rows: list[StepOverlap] = []
    gaps: list[Gap] = []
    spans = _spans(trace, compute, copies)
    for step in trace.steps:
        if step.number not in spans:
            continue
        lo, hi = spans[step.number]
        comms = [
            c
            for c in sorted(trace.comms, key=lambda c: c.start_us)
            if (c.start_us < hi and c.end_us > lo) or (c.start_us == c.end_us and lo <= c.start_us < hi)
        ]
        # zero-length pieces dropped: they split exposed and idle gaps in two before covers
        C, K = ([(a, b) for a, b in clip(union([(a, b) for a, b, _ in x]), lo, hi) if b > a] for x in (compute, copies))
        M, T = _split(comms, waits, trace.rank, lo, hi)
        busy = union(C + [(a, b) for a, b in M if b > a] + K)
        exposed, moving = subtract(M, C), subtract(T, C)
        by_pg = {}
        for pg in sorted({c.pg for c in comms}):
            Mp, Tp = _split([c for c in comms if c.pg == pg], waits, trace.rank, lo, hi)
            exp_p, mov_p = length(subtract(Mp, C)), length(subtract(Tp, C))
            by_pg[pg] = {"comm_us": length(Mp), "exposed_wait_us": exp_p - mov_p, "exposed_transfer_us": mov_p}
        rows.append(
            StepOverlap(
                rank=trace.rank,
                step=step.number,
                window_us=hi - lo,
                compute_us=length(C),
                comm_us=length(M),
                overlapped_comm_us=length(intersect(C, M)),
                exposed_comm_us=length(exposed),
                exposed_wait_us=length(exposed) - length(moving),
                exposed_transfer_us=length(moving),
                idle_us=hi - lo - length(busy),
                by_pg=by_pg,
                memcpy_us=length(subtract(K, union(C + M))),
            )
        )
        # naming the gaps is shared (overlap.step_gaps); the pieces are the oracle's own
        idle = [(a, b) for a, b in subtract([(lo, hi)], busy) if b - a >= MIN_GAP_US]
        gaps.extend(step_gaps(trace.rank, step.number, comms, moving, subtract(exposed, moving), idle))
    return rows, gaps


def _trace(device: str, steps: list[tuple[float, float]], comms: list) -> tuple[RankTrace, dict]:
    ops, waits = [], {}
    for i, (start, d, step, pg, wait) in enumerate(sorted(comms, key=lambda c: c[:2])):
        ops.append(CommOp(name=f"allreduce{i % 3}", pg=pg, start_us=start, end_us=start + d, step=step, seq=i))
        waits[(0, pg, i)] = wait
    return (
        RankTrace(
            rank=0,
            world_size=2,
            host="h",
            run_id=None,
            device=device,
            comms=ops,
            steps=[Step(number=n + 1, start_us=a, end_us=a + d) for n, (a, d) in enumerate(steps)],
        ),
        waits,
    )


def _shift(rows: list[Busy], off: float) -> list[Busy]:
    return [(a - off, b - off, s) for a, b, s in rows]


@settings(max_examples=300, deadline=None)
@given(
    device=st.sampled_from(["cpu", "gpu"]),
    steps=st.lists(st.tuples(TIME.map(lambda t: t / 8), TIME), min_size=1, max_size=3),
    compute=st.lists(INTERVAL, max_size=14),
    copies=st.lists(INTERVAL, max_size=4),
    comms=st.lists(COMM, max_size=6),
    offset=st.integers(-500, 500).map(float),
)
def test_covers_give_the_overlap_the_intervals_gave(
    device: str, steps: list, compute: list, copies: list, comms: list, offset: float
) -> None:
    compute = sorted(((a, a + d, s) for a, d, s in compute), key=lambda b: b[:2])  # as parse gives them
    copies = sorted(((a, a + d, s) for a, d, s in copies), key=lambda b: b[:2])
    at, consecutive = 0.0, []
    for gap, d in steps:  # ProfilerSteps follow one another on the host
        consecutive.append((at + gap, d))
        at += gap + d
    trace, waits = _trace(device, consecutive, comms)
    expected = _overlap_from_intervals(trace, compute, copies, waits)
    cover_steps(trace, compute, copies)
    assert rank_overlap(trace, waits) == expected
    rows = expected[0]
    for r in rows:  # every instant of a span counted once
        assert r.compute_us + r.exposed_comm_us + r.memcpy_us + r.idle_us == r.window_us
        assert r.exposed_wait_us + r.exposed_transfer_us == r.exposed_comm_us
    spans = sorted((s.cover.lo_us, s.cover.hi_us) for s in trace.steps if s.cover is not None)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # consecutive, never overlapping
    if device == "gpu" and spans:
        assert sum(r.window_us for r in rows) == spans[-1][1] - spans[0][0]
    # folded on the rank's own clock, then shifted with the rank: the same as shifting the
    # intervals first
    moved = trace.shifted(offset)
    assert rank_overlap(moved, waits) == _overlap_from_intervals(
        moved, _shift(compute, offset), _shift(copies, offset), waits
    )


def test_a_cover_keeps_only_what_the_overlap_reads() -> None:
    # CPU step [0, 1000]: compute [0, 300] and [450, 900], and [950, 1200] launched in no step
    # (it still keeps the device busy inside the step), an all-reduce [250, 400]: C ∩ M is
    # [250, 300]; idle [400, 450] and [900, 950] (50 us each: listed); the compute outside the
    # all-reduce is not kept
    trace, _ = _trace("cpu", [(0.0, 1000.0)], [(250.0, 150.0, 1, "0", 0.0)])
    cover_steps(trace, [(0.0, 300.0, 1), (450.0, 900.0, 1), (950.0, 1200.0, None)], [])
    c = trace.steps[0].cover
    assert (c.lo_us, c.hi_us, c.compute_us, c.overlapped_us, c.busy_us) == (0.0, 1000.0, 800.0, 50.0, 900.0)
    assert c.compute_in_comm == [(250.0, 300.0)]
    assert c.idle == [(400.0, 450.0), (900.0, 950.0)]
    assert c.work_end_us == 900.0  # the interval of no step is not the step's work
    # a GPU step that launched nothing has no cover, and no overlap row
    gpu, _ = _trace("gpu", [(0.0, 10.0)], [])
    cover_steps(gpu, [], [])
    assert gpu.steps[0].cover is None and rank_overlap(gpu) == ([], [])


def test_a_device_running_a_step_behind_is_busy_not_idle() -> None:
    # The host runs steps 1-3 at [0, 100], [100, 200], [200, 300] and launches 190 us of
    # kernels in each; the device runs them back to back from 10: step 1's at [10, 200], step
    # 2's at [200, 390], step 3's at [390, 580]. Windows built from each step's own work
    # ([10, 200], [200, 390], ...) are right here; what matters is that no time is counted
    # twice: the spans are [10, 200], [200, 390], [390, 580], each all compute, no idle. A copy
    # of step 2 at [380, 400] runs under step 3's compute for 10 us: memcpy counts only the
    # 0 us it runs alone... and none of it is idle.
    trace, _ = _trace("gpu", [(0.0, 100.0), (100.0, 100.0), (200.0, 100.0)], [])
    cover_steps(trace, [(10.0, 200.0, 1), (200.0, 390.0, 2), (390.0, 580.0, 3)], [(380.0, 400.0, 2)])
    rows, gaps = rank_overlap(trace)
    assert [(r.step, r.window_us, r.compute_us, r.memcpy_us, r.idle_us) for r in rows] == [
        (1, 190.0, 190.0, 0.0, 0.0),
        (2, 190.0, 190.0, 0.0, 0.0),
        (3, 190.0, 190.0, 0.0, 0.0),
    ]
    assert gaps == []
    # with the device's own ProfilerStep annotations, those mark the spans' starts
    cover_steps(
        trace,
        [(10.0, 200.0, 1), (200.0, 390.0, 2), (390.0, 580.0, 3)],
        [(380.0, 400.0, 2)],
        {1: (5.0, 200.0), 2: (200.0, 400.0), 3: (390.0, 580.0)},
    )
    rows, gaps = rank_overlap(trace)
    assert [(r.step, r.window_us, r.compute_us, r.idle_us) for r in rows] == [
        (1, 195.0, 190.0, 5.0),
        (2, 190.0, 190.0, 0.0),
        (3, 190.0, 190.0, 0.0),
    ]


def test_step_windows_of_their_own_work_would_overlap() -> None:
    # Two streams: each step launches compute [t, t+50] on one and a copy on a side stream
    # that runs 150 us later (a prefetch for a later step). Windows of each step's own work
    # overlapped and called the other step's compute idle; the spans do not: step 1 [0, 100]
    # holds its compute and idle [50, 100]; step 2 [100, 250] holds its compute, step 1's copy
    # [150, 160] and idle; parts add up to each span.
    trace, _ = _trace("gpu", [(0.0, 100.0), (100.0, 100.0)], [])
    cover_steps(trace, [(0.0, 50.0, 1), (100.0, 150.0, 2)], [(150.0, 160.0, 1), (240.0, 250.0, 2)])
    rows, _ = rank_overlap(trace)
    assert [(r.step, r.window_us, r.compute_us, r.memcpy_us, r.idle_us) for r in rows] == [
        (1, 100.0, 50.0, 0.0, 50.0),
        (2, 150.0, 50.0, 20.0, 80.0),
    ]


@settings(max_examples=200, deadline=None)
@given(ranks=st.lists(st.lists(st.integers(0, 6), max_size=30), max_size=12), keep=st.integers(1, 8))
def test_the_longest_gaps_are_those_of_sorting_them_all(ranks: list, keep: int) -> None:
    # few distinct durations: ties everywhere, which must keep the order the gaps came in
    everything, longest = [], LongestGaps(keep)
    for r, durations in enumerate(ranks):
        gaps = [
            Gap(rank=r, step=1, start_us=float(i), dur_us=float(d), kind="idle", collective=None)
            for i, d in enumerate(durations)
        ]
        everything.extend(gaps)
        longest.add(gaps)
    assert longest.gaps == sorted(everything, key=lambda g: -g.dur_us)[:keep]
    assert longest.total == len(everything)
