"""Steps' covers (overlap.cover_steps): the compute and copies folded at parse time must give the
overlap the intervals gave. The oracle is the overlap as it was computed from the kept intervals
(kept here): the same rows and gaps, exactly, on generated steps, compute, copies and collectives
(overlapping, touching, outside every step, zero-length; CPU and GPU windows), on the rank's own
clock and after the shift onto the aligned clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.collect.model import Busy, CommOp, RankTrace, Step
from harness.collect.overlap import (
    MIN_GAP_US,
    Gap,
    LongestGaps,
    StepOverlap,
    _split,
    clip,
    cover_steps,
    intersect,
    length,
    merge,
    rank_overlap,
    step_gaps,
    subtract,
)

# Whole and half microseconds, offsets in whole ones: every sum and difference is exact, so the
# shifted results must match to the bit as well.
TIME = st.integers(0, 800).map(lambda t: t / 2)
STEP_OF = st.one_of(st.none(), st.integers(1, 3))
INTERVAL = st.tuples(TIME, st.integers(0, 300).map(lambda d: d / 2), STEP_OF)
COMM = st.tuples(TIME, st.integers(0, 300).map(lambda d: d / 2), STEP_OF, st.sampled_from(["0", "1"]),
                 st.integers(0, 200).map(lambda w: w / 2))


def _overlap_from_intervals(trace: RankTrace, compute: list[Busy], copies: list[Busy],
                            waits: dict) -> tuple[list[StepOverlap], list[Gap]]:
    """The overlap as computed before covers, from the rank's compute and copy intervals."""
    rows: list[StepOverlap] = []
    gaps: list[Gap] = []
    comp_by: dict[int, list] = {}
    for a, b, s in compute:
        if s is not None:
            comp_by.setdefault(s, []).append((a, b))
    copy_by: dict[int, list] = {}
    for a, b, s in copies:
        if s is not None:
            copy_by.setdefault(s, []).append((a, b))
    comm_by: dict[int, list] = {}
    for c in trace.comms:
        if c.step is not None:
            comm_by.setdefault(c.step, []).append(c)
    for step in trace.steps:
        comps, comms, cops = comp_by.get(step.number, []), comm_by.get(step.number, []), copy_by.get(step.number, [])
        if trace.device == "gpu":
            spans = comps + cops + [(c.start_us, c.end_us) for c in comms]
            if not spans:
                continue
            lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        else:
            lo, hi = step.start_us, step.end_us
        # zero-length pieces dropped: they split exposed and idle gaps in two before covers
        C, K = ([(a, b) for a, b in clip(merge(x), lo, hi) if b > a] for x in (comps, cops))
        M, T = _split(comms, waits, trace.rank, lo, hi)
        busy = merge(C + [(a, b) for a, b in M if b > a] + K)
        exposed, moving = subtract(M, C), subtract(T, C)
        by_pg = {}
        for pg in sorted({c.pg for c in comms}):
            Mp, Tp = _split([c for c in comms if c.pg == pg], waits, trace.rank, lo, hi)
            exp_p, mov_p = length(subtract(Mp, C)), length(subtract(Tp, C))
            by_pg[pg] = {"comm_us": length(Mp), "exposed_wait_us": exp_p - mov_p, "exposed_transfer_us": mov_p}
        rows.append(StepOverlap(rank=trace.rank, step=step.number, window_us=hi - lo, compute_us=length(C),
                                comm_us=length(M), overlapped_comm_us=length(intersect(C, M)),
                                exposed_comm_us=length(exposed), exposed_wait_us=length(exposed) - length(moving),
                                exposed_transfer_us=length(moving), idle_us=hi - lo - length(busy), by_pg=by_pg,
                                memcpy_us=length(K)))
        # naming the gaps is shared (overlap.step_gaps); the pieces are the oracle's own
        idle = [(a, b) for a, b in subtract([(lo, hi)], busy) if b - a >= MIN_GAP_US]
        gaps.extend(step_gaps(trace.rank, step.number, comms, moving, subtract(exposed, moving), idle))
    return rows, gaps


def _trace(device: str, steps: list[tuple[float, float]], comms: list) -> tuple[RankTrace, dict]:
    ops, waits = [], {}
    for i, (start, d, step, pg, wait) in enumerate(sorted(comms, key=lambda c: c[:2])):
        ops.append(CommOp(name=f"allreduce{i % 3}", pg=pg, start_us=start, end_us=start + d, step=step, seq=i))
        waits[(0, pg, i)] = wait
    return (RankTrace(rank=0, world_size=2, host="h", run_id=None, device=device, comms=ops,
                      steps=[Step(number=n + 1, start_us=a, end_us=a + d) for n, (a, d) in enumerate(steps)]), waits)


def _shift(rows: list[Busy], off: float) -> list[Busy]:
    return [(a - off, b - off, s) for a, b, s in rows]


@settings(max_examples=300, deadline=None)
@given(device=st.sampled_from(["cpu", "gpu"]), steps=st.lists(st.tuples(TIME, TIME), min_size=1, max_size=3),
       compute=st.lists(INTERVAL, max_size=14), copies=st.lists(INTERVAL, max_size=4),
       comms=st.lists(COMM, max_size=6), offset=st.integers(-500, 500).map(float))
def test_covers_give_the_overlap_the_intervals_gave(device: str, steps: list, compute: list, copies: list,
                                                    comms: list, offset: float) -> None:
    compute = sorted(((a, a + d, s) for a, d, s in compute), key=lambda b: b[:2])  # as parse gives them
    copies = sorted(((a, a + d, s) for a, d, s in copies), key=lambda b: b[:2])
    trace, waits = _trace(device, steps, comms)
    expected = _overlap_from_intervals(trace, compute, copies, waits)
    cover_steps(trace, compute, copies)
    assert rank_overlap(trace, waits) == expected
    # folded on the rank's own clock, then shifted with the rank: the same as shifting the
    # intervals first
    moved = trace.shifted(offset)
    assert rank_overlap(moved, waits) == _overlap_from_intervals(moved, _shift(compute, offset),
                                                                 _shift(copies, offset), waits)


def test_a_cover_keeps_only_what_the_overlap_reads() -> None:
    # CPU step [0, 1000]: compute [0, 300] and [450, 900] (and one of no step), an all-reduce
    # [250, 400]: C ∩ M is [250, 300]; idle [400, 450] (50 us: listed) and [900, 1000]; the
    # compute outside the all-reduce is not kept
    trace, _ = _trace("cpu", [(0.0, 1000.0)], [(250.0, 150.0, 1, "0", 0.0)])
    cover_steps(trace, [(0.0, 300.0, 1), (450.0, 900.0, 1), (950.0, 1200.0, None)], [])
    c = trace.steps[0].cover
    assert (c.lo_us, c.hi_us, c.compute_us, c.overlapped_us, c.busy_us) == (0.0, 1000.0, 750.0, 50.0, 850.0)
    assert c.compute_in_comm == [(250.0, 300.0)]
    assert c.idle == [(400.0, 450.0), (900.0, 1000.0)]
    assert c.work_end_us == 900.0  # the interval of no step is not the step's work
    # a GPU step that launched nothing has no cover, and no overlap row
    gpu, _ = _trace("gpu", [(0.0, 10.0)], [])
    cover_steps(gpu, [], [])
    assert gpu.steps[0].cover is None and rank_overlap(gpu) == ([], [])


@settings(max_examples=200, deadline=None)
@given(ranks=st.lists(st.lists(st.integers(0, 6), max_size=30), max_size=12), keep=st.integers(1, 8))
def test_the_longest_gaps_are_those_of_sorting_them_all(ranks: list, keep: int) -> None:
    # few distinct durations: ties everywhere, which must keep the order the gaps came in
    everything, longest = [], LongestGaps(keep)
    for r, durations in enumerate(ranks):
        gaps = [Gap(rank=r, step=1, start_us=float(i), dur_us=float(d), kind="idle", collective=None)
                for i, d in enumerate(durations)]
        everything.extend(gaps)
        longest.add(gaps)
    assert longest.gaps == sorted(everything, key=lambda g: -g.dur_us)[:keep]
    assert longest.total == len(everything)
