"""The what-if replay (replay.Replay): built once per run and replayed a collective at a time over
its ranks, it must give exactly what the replay gave as a loop over every rank of every
collective, redone for each set of fixed ranks. The oracle is that loop (kept here); generated
runs of 2-7 ranks, several steps, collectives of all ranks or of subgroups (arrivals after the
previous end, overlapping it, first in the step), ranks without collectives, any set of ranks
fixed."""

from __future__ import annotations

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.traces.align.matching import Instance
from harness.traces.align.waits import InstanceWaits, instance_waits
from harness.traces.analyse.replay import Replay, steps_to_replay
from harness.traces.model import CommOp, RankTrace, Step


def _median_or(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default


def _replay_step_loop(step_span_us: dict[int, tuple[float, float]], ws: list[InstanceWaits], fixed: set[int]) -> float:
    """One step's replayed duration as the loop over ranks computed it."""
    ws = sorted(ws, key=lambda w: (w.last_arrival_us, w.index))
    prev: dict[int, InstanceWaits] = {}
    kind: dict[tuple[int, int], str] = {}
    run: dict[tuple[int, int], float] = {}
    for w in ws:
        for r, a in w.arrival_us.items():
            p = prev.get(r)
            if p is None:
                kind[w.index, r], base = "start", step_span_us[r][0] if r in step_span_us else a
            elif a >= p.end_us[r]:
                kind[w.index, r], base = "end", p.end_us[r]
            else:
                kind[w.index, r], base = "arrival", p.arrival_us[r]
            run[w.index, r] = max(a - base, 0.0)
            prev[r] = w
    ranks = set(step_span_us) | set(prev)
    tail = {}
    for r in ranks:
        lo, hi = step_span_us.get(r, (0.0, 0.0))
        tail[r] = max(hi - prev[r].end_us[r], 0.0) if r in prev else max(hi - lo, 0.0)
    unfixed_tails = [tail[r] for r in ranks if r not in fixed and r in prev]
    unfixed_solo = [tail[r] for r in ranks if r not in fixed and r not in prev]
    arrived: dict[int, float] = {}
    ended: dict[int, float] = {}
    for w in ws:
        peers = [q for q in w.arrival_us if q not in fixed]
        new_arrival = {}
        for r in w.arrival_us:
            k = kind[w.index, r]
            point = 0.0 if k == "start" else (ended[r] if k == "end" else arrived[r])
            r_run = run[w.index, r]
            if r in fixed:
                r_run = min(r_run, _median_or([run[w.index, q] for q in peers], r_run))
            new_arrival[r] = point + r_run
        start = max(new_arrival.values())
        transfer = {r: max(w.end_us[r] - w.last_arrival_us, 0.0) for r in w.arrival_us}
        for r in w.arrival_us:
            arrived[r] = new_arrival[r]
            t = transfer[r]
            if r in fixed:
                t = min(t, _median_or([transfer[q] for q in peers], t))
            ended[r] = start + t
    longest = 0.0
    for r in ranks:
        if r in ended:
            t = tail[r] if r not in fixed else min(tail[r], _median_or(unfixed_tails, tail[r]))
            longest = max(longest, ended[r] + t)
        else:
            longest = max(longest, tail[r] if r not in fixed else min(tail[r], _median_or(unfixed_solo, tail[r])))
    return longest


def _replay_loop(traces: list[RankTrace], waits: list[InstanceWaits], fixed: set[int]) -> float | None:
    steps = steps_to_replay(traces, waits)  # the grouping by step is shared; the replay itself is the oracle's
    if not steps:
        return None
    return statistics.mean(_replay_step_loop(spans, ws, fixed) for spans, ws in steps) / 1e3


TIME = st.integers(0, 2000).map(lambda t: t / 4)
# per collective: its step, its participants (a bit mask over the ranks), per rank (start, duration)
COLLECTIVE = st.tuples(
    st.integers(1, 3),
    st.integers(1, 127),
    st.lists(st.tuples(TIME, st.integers(0, 400).map(lambda d: d / 4)), min_size=7, max_size=7),
)


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[RankTrace], list[InstanceWaits], list[set[int]]]:
    n = draw(st.integers(2, 7))
    steps_of = [draw(st.lists(st.integers(1, 3), max_size=3, unique=True)) for _ in range(n)]
    traces = [
        RankTrace(
            rank=r,
            world_size=n,
            host="h",
            run_id=None,
            device="gpu",
            comms=[],
            steps=[
                Step(number=s, start_us=s * 1000.0 + draw(TIME), end_us=s * 1000.0 + 600 + draw(TIME))
                for s in steps_of[r]
            ],
        )
        for r in range(n)
    ]
    instances = []
    for k, (step, mask, times) in enumerate(draw(st.lists(COLLECTIVE, max_size=12))):
        ranks = [r for r in range(n) if mask >> r & 1]
        if len(ranks) < 2:
            continue
        ops = {
            r: CommOp(
                name="allreduce",
                pg="0",
                start_us=step * 1000.0 + times[r][0],
                end_us=step * 1000.0 + times[r][0] + times[r][1],
                step=step,
            )
            for r in ranks
        }
        instances.append(Instance(key=(k,), name="allreduce", pg="0", step=step, ops=ops))
    fixed = [set(draw(st.lists(st.integers(0, n - 1), max_size=n))) for _ in range(3)] + [set(), set(range(n))]
    return traces, instance_waits(instances), fixed


@settings(max_examples=300, deadline=None)
@given(runs())
def test_the_replay_over_arrays_equals_the_loop_over_ranks(run: tuple) -> None:
    traces, waits, fixed_sets = run
    replay = Replay(traces, waits)
    for fixed in fixed_sets:
        assert replay.step_ms(fixed) == _replay_loop(traces, waits, fixed), fixed


def op(start: float, end: float) -> CommOp:
    """An all-reduce of step 1 on one rank."""
    return CommOp(name="allreduce", pg="0", start_us=start, end_us=end, step=1)


def one_step(ranks: int) -> list[RankTrace]:
    """`ranks` GPU ranks with one step, 0-1000 us."""
    return [
        RankTrace(
            rank=r,
            world_size=ranks,
            host="h",
            run_id=None,
            device="gpu",
            comms=[],
            steps=[Step(number=1, start_us=0.0, end_us=1000.0)],
        )
        for r in range(ranks)
    ]


def test_a_fixed_straggler_arrives_with_its_peers() -> None:
    """Two collectives, three ranks; rank 2 arrives 300 us late at the first. Fixed, its run-up
    becomes the median of ranks 0 and 1 (100 and 120: 110), everything else unchanged: exact."""
    traces = one_step(3)
    first = Instance(
        key=(0,), name="allreduce", pg="0", step=1, ops={0: op(100.0, 450.0), 1: op(120.0, 450.0), 2: op(400.0, 450.0)}
    )
    second = Instance(
        key=(1,), name="allreduce", pg="0", step=1, ops={0: op(600.0, 700.0), 1: op(600.0, 700.0), 2: op(600.0, 700.0)}
    )
    replay = Replay(traces, instance_waits([first, second]))
    # as measured: arrivals 100/120/400, start 400, ends 450; run-ups 150, start 600, end 700; tail 300
    assert replay.step_ms(set()) == 1.0
    # fixed: rank 2's run-up 110, start 120, ends 170; start 320, end 420; + tail 300
    assert replay.step_ms({2}) == 0.72


@settings(max_examples=300, deadline=None)
@given(runs())
def test_no_what_if_replays_slower_than_nothing_fixed(run: tuple) -> None:
    """Fixing ranks only removes excess: every replayed time is a max and sum of run-ups,
    transfers and tails that fixing never lengthens, so identity 5 of tests/identities.py holds
    on any run (a CI run's intermittent straggler replayed 3.8 ms slower fixed while it took its
    peer's longer run-ups in the steps where it was early)."""
    traces, waits, fixed_sets = run
    replay = Replay(traces, waits)
    nothing = replay.step_ms(set())
    for fixed in fixed_sets:
        got = replay.step_ms(fixed)
        assert (got is None) == (nothing is None)
        if got is not None and nothing is not None:
            assert got <= nothing + 1e-9, fixed


def test_a_fixed_rank_keeps_a_run_up_shorter_than_its_peers() -> None:
    """Two ranks, two collectives in a 1000 us step. Rank 1 issues B 90 us after arriving at A,
    before A ends (its run-up counts from that arrival); rank 0 issues B 50 us after A ends at
    200 (from that end), last at 250. Fixed, rank 0 keeps its 50 us: taking rank 1's 90 us from
    its own point (A's end) would put it at 290 and the step at 1040 us, slower than measured."""
    traces = one_step(2)
    a = Instance(key=(0,), name="allreduce", pg="0", step=1, ops={0: op(100.0, 200.0), 1: op(100.0, 200.0)})
    b = Instance(key=(1,), name="allreduce", pg="0", step=1, ops={0: op(250.0, 300.0), 1: op(190.0, 300.0)})
    replay = Replay(traces, instance_waits([a, b]))
    assert replay.step_ms(set()) == 1.0
    assert replay.step_ms({0}) == 1.0
