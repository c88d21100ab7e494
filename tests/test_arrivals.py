"""The live watch's reading of arrivals at collectives inside the phases that hold them
(harness/watch/arrivals.py): exact answers on hand-built arrivals, the watch's verdict with and
without them, the step clock's phase spans, and the watch's gathering of them (clock offsets per
host)."""

from __future__ import annotations

from pathlib import Path

import torch
from watch_stub import GrouplessWatch

from harness.run.timing import StepClock
from harness.traces.analyse.noise import GPU, SHARED_CPU
from harness.traces.analyse.stragglers import Thresholds
from harness.watch.arrivals import (
    TIMING_PATIENCE_NS,
    HeldArrivals,
    TimingPatience,
    held_lateness_ms,
    my_arrivals,
    untimed_steps,
)
from harness.watch.rule import COLLECTIVE_PHASES, WatchJudge, own_work_phases, pack_rows, step_row
from harness.watch.rule import judge_interval as judge_tables

MS = 1_000_000  # ns


def spans(starts_ms: list[float], phase: str = "backward", step: int = 10, length_ms: float = 100.0) -> list[dict]:
    """One span per rank: `phase` of `step` starting at each of `starts_ms`."""
    return [{step: {phase: [int(s * MS), int((s + length_ms) * MS)]}} for s in starts_ms]


def arrivals(times_ms: list[list[float]], phase: str = "backward", step: int = 10, first_seq: int = 1) -> list[list]:
    """Per rank, its arrivals at collectives first_seq, first_seq + 1, ... of group 0 (CPU: issued
    when arrived)."""
    return [[(step, phase, "0", first_seq + k, int(t * MS), int(t * MS)) for k, t in enumerate(ts)] for ts in times_ms]


def test_a_sleep_before_asynchronous_buckets_counts_once() -> None:
    # DDP: both ranks start backward at 0 and issue buckets 5, 10 and 15 ms in; rank 1 sleeps
    # 20 ms first, so it issues each bucket 20 ms later (the buckets do not block).
    late = held_lateness_ms(spans([0, 0]), arrivals([[5, 10, 15], [25, 30, 35]]), [10], ["backward"])
    assert late is not None
    assert late.tolist() == [[[0.0]], [[20.0]]]


def test_a_sleep_before_a_blocking_collective_counts_once() -> None:
    # FSDP: all-gathers block. Rank 1 sleeps 20 ms at the start of forward: it issues the first
    # all-gather at 20 (rank 0 at 0 waits for it), both are back in step and issue the next two
    # at 25 and 30.
    late = held_lateness_ms(
        spans([0, 0], "forward"), arrivals([[0, 25, 30], [20, 25, 30]], "forward"), [10], ["forward"]
    )
    assert late is not None
    assert late.tolist() == [[[0.0]], [[20.0]]]


def test_lateness_a_rank_enters_the_phase_with_is_not_counted_there() -> None:
    # Rank 1 slept in data: it starts backward 20 ms late and issues every bucket 20 ms late.
    late = held_lateness_ms(spans([0, 20]), arrivals([[5, 10, 15], [25, 30, 35]]), [10], ["backward"])
    assert late is not None
    assert late.tolist() == [[[0.0]], [[0.0]]]


def test_a_slowness_spread_over_asynchronous_buckets_adds_up() -> None:
    # Rank 1 computes each bucket 2 ms longer: 2, 4, 6 ms late at the three buckets.
    late = held_lateness_ms(spans([0, 0]), arrivals([[5, 10, 15], [7, 14, 21]]), [10], ["backward"])
    assert late is not None
    assert late.tolist() == [[[0.0]], [[6.0]]]


def test_between_blocking_collectives_a_spread_slowness_counts_as_its_largest_stretch() -> None:
    # Rank 1 computes each layer 2 ms longer and every all-gather puts the ranks back in step:
    # 2 ms late at the second and at the third. Counted once (the recorder does not say when a
    # rank left a collective); the watch's CPU-time reading counts the rest.
    late = held_lateness_ms(spans([0, 0], "forward"), arrivals([[0, 5, 12], [0, 7, 14]], "forward"), [10], ["forward"])
    assert late is not None
    assert late.tolist() == [[[0.0]], [[2.0]]]


def test_each_pass_of_a_phase_is_entered_anew() -> None:
    # FSDP with two micro-batches: backward from 0 to 20 ms and from 40 to 60 ms (forward
    # between). Rank 1 computes its second forward 6 ms longer: it enters the second backward
    # 6 ms late and issues its all-gathers there 6 ms late, at 46 and 51: forward's to account,
    # not backward's. In the first pass it sleeps 3 ms before its second all-gather (at 8, rank
    # 0 at 5): 3 ms of backward's.
    two_passes = [
        {10: {"backward": [0, 20 * MS, 40 * MS, 60 * MS]}},
        {10: {"backward": [0, 20 * MS, 46 * MS, 66 * MS]}},
    ]
    late = held_lateness_ms(two_passes, arrivals([[0, 5, 40, 45], [0, 8, 46, 51]]), [10], ["backward"])
    assert late is not None
    assert late.tolist() == [[[0.0]], [[3.0]]]

    # on GPU (arrivals at -duration: rank 0's all-gathers take 9 ms, rank 1's 9 and 6 in the
    # first pass, 3 and 9 in the second) a pass's first collective carries what the rank
    # entered the pass with (6 ms): not counted; the 3 ms it added in the first pass are
    def device(issued_ms: list[float], durations_ms: list[float]) -> list:
        return [
            (10, "backward", "0", k + 1, int(t * MS), -int(d * MS))
            for k, (t, d) in enumerate(zip(issued_ms, durations_ms))
        ]

    on_gpu = [device([0, 5, 40, 45], [9, 9, 9, 9]), device([0, 8, 46, 51], [9, 6, 3, 9])]
    late = held_lateness_ms(two_passes, on_gpu, [10], ["backward"], device=True)
    assert late is not None
    assert late.tolist() == [[[0.0]], [[3.0]]]


def test_the_punctual_mark_is_the_lower_quartile_and_clocks_are_offset_per_host() -> None:
    # 4 ranks: the punctual mark is the earliest (the lower quartile of 4). Ranks 2 and 3 read a
    # clock 1 s ahead: their offset puts them back.
    starts = [0.0, 0.0, 1000.0, 1000.0]
    times = [[5.0], [8.0], [1005.0], [1035.0]]
    late = held_lateness_ms(spans(starts), arrivals(times), [10], ["backward"], offsets_ns=[0, 0, 1000 * MS, 1000 * MS])
    assert late is not None
    assert late[:, 0, 0].tolist() == [0.0, 3.0, 0.0, 30.0]


def test_only_collectives_every_rank_issued_count_and_a_span_one_rank_lacks_gives_none() -> None:
    times = arrivals([[5, 10], [25, 30]])
    times[0].append((10, "backward", "0", 99, 12 * MS, 12 * MS))  # one rank only: not matched
    late = held_lateness_ms(spans([0, 0]), times, [10], ["backward"])
    assert late is not None and late.tolist() == [[[0.0]], [[20.0]]]
    # step 11 has no backward on any rank: nothing there; on one rank only: not judged by arrivals
    late = held_lateness_ms(spans([0, 0]), times, [10, 11], ["backward"])
    assert late is not None and late.tolist() == [[[0.0], [0.0]], [[20.0], [0.0]]]
    one_sided = spans([0, 0])
    one_sided[0] = {**one_sided[0], 11: {"backward": [0, 1]}}
    assert held_lateness_ms(one_sided, times, [10, 11], ["backward"]) is None


def test_recorder_entries_are_placed_in_this_rank_s_phases() -> None:
    # A collective's group is the name every rank gives it, not the recorder's pg_id, which
    # numbers only the groups this rank is in (rank 2 of groups [0, 1] and [2, 3]: "2" is its 1);
    # an entry without a name (an older recorder) keeps its pg_id.
    entries = [
        {"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 1, "time_created_ns": 5 * MS},
        {"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 2, "time_created_ns": 150 * MS},
        {"pg_id": 1, "collective_seq_id": 7, "time_created_ns": 6 * MS, "is_p2p": True},  # point-to-point
        {"pg_id": 1, "process_group": ("2", "undefined"), "collective_seq_id": 3, "time_created_ns": 50 * MS},
        {"pg_id": 4, "collective_seq_id": 1, "time_created_ns": 60 * MS, "is_p2p": False},
    ]
    spans_ns = {10: {"backward": [0, 100 * MS], "data": [100 * MS, 200 * MS]}}
    assert my_arrivals(entries, spans_ns, ["backward"]) == [
        (10, "backward", "0", 1, 5 * MS, 5 * MS),
        (10, "backward", "2", 3, 50 * MS, 50 * MS),
        (10, "backward", "4", 1, 60 * MS, 60 * MS),
    ]


BASE = {"data": 1.0, "h2d": 0.0, "forward": 20.0, "loss": 1.0, "backward": 60.0, "optimizer": 10.0}


def _tables(n_ranks: int, steps: list[int], cpu_backward_ms: dict[int, float] | None = None) -> torch.Tensor:
    """Every rank's table: the same phase times and CPU times (backward's per rank if given)."""
    out = []
    for r in range(n_ranks):
        cpu = {p: 0.0 for p in BASE} | {"backward": (cpu_backward_ms or {}).get(r, 20.0)}
        recs = [{"step": s, "step_ms": 100.0, "phases_ms": dict(BASE), "phases_cpu_ms": cpu} for s in steps]
        out.append(pack_rows([step_row(rec) for rec in recs], len(steps)))
    return torch.stack(out)


def _held(n_ranks: int, steps: list[int], sleeper: int, sleep_ms: float) -> HeldArrivals:
    """DDP's backward on every step: each rank starts it at the same time and issues two buckets
    5 and 10 ms in; `sleeper` first sleeps `sleep_ms`."""
    spans_ns, arrived = [], []
    for r in range(n_ranks):
        delay = sleep_ms if r == sleeper else 0.0
        spans_ns.append({s: {"backward": [s * 1000 * MS, (s * 1000 + 100) * MS]} for s in steps})
        times = [(s, k, int((s * 1000 + delay + 5 * (k + 1)) * MS)) for s in steps for k in range(2)]
        arrived.append([(s, "backward", "0", 2 * s + k, t, t) for s, k, t in times])
    return HeldArrivals(spans_ns=spans_ns, arrivals=arrived, offsets_ns=[0.0] * n_ranks)


def test_the_watch_names_a_rank_that_sleeps_inside_backward_from_its_arrivals() -> None:
    # Every rank's backward lasts 60 ms and takes 20 ms of CPU time; rank 2 slept 30 ms of it
    # before its buckets, the others waited for it. By phase times and CPU times nobody is late;
    # by arrivals rank 2 is 30 ms late in backward every step.
    steps = [10, 11, 12, 13]
    tables = _tables(4, steps)
    own = own_work_phases("ddp")
    blind = judge_tables(tables, {}, own, noise=SHARED_CPU, th=Thresholds(), held_phases=("backward",))
    assert blind.stragglers == []
    v = judge_tables(
        tables, {}, own, noise=SHARED_CPU, th=Thresholds(), held_phases=("backward",), arrivals=_held(4, steps, 2, 30.0)
    )
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 0.0, 30.0, 0.0]
    [s] = v.stragglers
    assert (s.rank, s.phase, s.excess_ms, s.steps_late) == (2, "backward", 30.0, 4)


def test_with_arrivals_a_rank_computing_longer_is_still_judged_by_its_cpu_time_where_that_says_more() -> None:
    # Rank 1 spends 50 ms of backward on its core against the others' 20, spread over its
    # layers (its arrivals show none of it: the ranks are back in step at each collective).
    steps = [10, 11, 12, 13]
    v = judge_tables(
        _tables(3, steps, {1: 50.0}),
        {},
        own_work_phases("fsdp"),
        noise=SHARED_CPU,
        th=Thresholds(),
        held_phases=("forward", "backward"),
        arrivals=HeldArrivals(
            spans_ns=[{s: {"forward": [0, 1], "backward": [2, 3]} for s in steps}] * 3,
            arrivals=[[], [], []],
            offsets_ns=[0.0] * 3,
        ),
    )
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 30.0, 0.0]
    [s] = v.stragglers
    assert (s.rank, s.phase, s.excess_ms) == (1, "backward", 30.0)


def test_the_step_clock_spans_each_phase_on_the_epoch_clock_when_the_watch_is_on() -> None:
    clock = StepClock(cuda=False, thread_time=True)
    clock.start(0)
    clock.mark("forward")
    clock.mark("backward")
    clock.finish()
    [rec] = clock.poll()
    span = rec["phases_span_ns"]
    assert set(span) == {"forward", "backward"}
    assert span["forward"][0] <= span["forward"][1] == span["backward"][0] <= span["backward"][1]
    plain = StepClock(cuda=False)
    plain.start(0)
    plain.mark("forward")
    plain.finish()
    assert "phases_span_ns" not in plain.poll()[0]


class ThreeRankWatch(GrouplessWatch):
    """Rank 0's watch in a 3-rank job over two hosts, without a process group: the arrivals'
    all-gather hands back this rank's payload and the others' from `others`."""

    def __init__(self, tmp_path: Path, others: list) -> None:
        super().__init__(tmp_path, hosts={0: "a", 1: "a", 2: "b"}, warmup_steps=0, cpu=True)
        self.read_arrivals, self.others = True, others

    def _all_gather_object(self, out: list, obj: object) -> None:
        out[:] = [obj, *self.others]


def test_the_watch_gathers_arrivals_and_puts_other_hosts_on_rank_0_s_clock(tmp_path: Path, monkeypatch) -> None:
    # Rank 0 issued collective (0, 1) 5 ms into step 10's backward. Every rank left the tables'
    # all-gather together: ranks 0 and 1 at 100 and 104 ns on host a's clock, rank 2 at 1 s + 100
    # on host b's, 1 s ahead: host b's offset is 1 s less the median of host a's, 102 ns.
    entries = [{"pg_id": 0, "collective_seq_id": 1, "time_created_ns": 5 * MS, "is_p2p": False}]
    monkeypatch.setattr("harness.watch.exchange.recorder_entries", lambda backend: entries)
    span = {10: {"backward": [0, 100 * MS]}}
    others = [(span, [(10, "backward", "0", 1, 6 * MS, 6 * MS)], 104, []), (span, [], 1_000_000_100, [])]
    watch = ThreeRankWatch(tmp_path, others)
    watch.add({"step": 10, "step_ms": 100.0, "phases_ms": {}, "phases_span_ns": {"backward": [0, 100 * MS]}})
    got = watch._arrivals(100)
    assert got is not None
    assert got.offsets_ns == [0.0, 0.0, 1_000_000_100 - 102]
    assert got.arrivals[0] == [(10, "backward", "0", 1, 5 * MS, 5 * MS)]
    assert got.spans_ns[0] == span
    # a rank whose recorder cannot be read: no arrivals this interval (the CPU time is read)
    assert ThreeRankWatch(tmp_path, [others[0], None])._arrivals(100) is None


def device(durations_ms: list[list[float]], phase: str = "forward", step: int = 10, issued_ms: float = 1.0) -> list:
    """Per rank, its arrivals at collectives 1, 2, ... of group 0 as NCCL times them on GPU: each
    issued by the host `issued_ms` apart, arrived at -duration."""
    return [
        [(step, phase, "0", 1 + k, int((k + 1) * issued_ms * MS), -int(d * MS)) for k, d in enumerate(mine)]
        for mine in durations_ms
    ]


def test_on_gpu_a_rank_s_arrival_is_its_collective_s_end_less_its_duration() -> None:
    # FSDP forward, three all-gathers ending together on both ranks. Rank 1's layer before the
    # second ran 4 ms longer: it started that all-gather 4 ms after rank 0, whose kernel waited
    # for it (6 ms against 2); they are back in step at the third.
    late = held_lateness_ms(spans([0, 0], "forward"), device([[2, 6, 2], [2, 2, 2]]), [10], ["forward"], device=True)
    assert late is not None
    assert late.tolist() == [[[0.0]], [[4.0]]]
    # What a rank entered the phase with shows at its first collective and is not counted here
    # (the phases before, on its device, hold it): 3 ms late there, 4 ms at the second.
    late = held_lateness_ms(spans([0, 0], "forward"), device([[5, 6, 2], [2, 2, 2]]), [10], ["forward"], device=True)
    assert late is not None
    assert late.tolist() == [[[0.0]], [[4.0]]]
    # A layer after each all-gather 3 ms slower: the punctual rank waits 3 ms at each of the
    # three all-gathers after the first (its stream's waits, one after the other, add up).
    late = held_lateness_ms(
        spans([0, 0], "forward"), device([[2, 5, 5, 5], [2, 2, 2, 2]]), [10], ["forward"], device=True
    )
    assert late is not None
    assert late.tolist() == [[[0.0]], [[9.0]]]


def test_on_gpu_the_lateness_at_backward_s_first_collective_is_forward_s_tail() -> None:
    # Forward (0-100 ms) then backward (100-200 ms) on both ranks, two collectives each (group 0,
    # 1-2 in forward, 3-4 in backward). Rank 1 is 4 ms late at forward's second (its first layer)
    # and 3 ms at backward's first: its last forward layer, after forward's last all-gather,
    # which FSDP2's prefetch shows at the next phase's first collective. Backward follows forward
    # without a gap (one mark ends one and starts the other), so those 3 ms are forward's.
    adjacent = [{10: {"forward": [0, 100 * MS], "backward": [100 * MS, 200 * MS]}} for _ in range(2)]

    def mine(durations_ms: list[float], issued_ms: list[float]) -> list:
        phases = ["forward", "forward", "backward", "backward"]
        return [
            (10, p, "0", 1 + k, int(t * MS), -int(d * MS))
            for k, (p, d, t) in enumerate(zip(phases, durations_ms, issued_ms))
        ]

    issued = [1.0, 2.0, 101.0, 102.0]
    times = [mine([2, 6, 5, 2], issued), mine([2, 2, 2, 2], issued)]
    late = held_lateness_ms(adjacent, times, [10], ["forward", "backward"], device=True)
    assert late is not None
    assert late.tolist() == [[[0.0, 0.0]], [[7.0, 0.0]]]
    # With a gap between them (a phase of own work, judged on its own, ends forward and starts
    # backward), backward's first is left out as before.
    gapped = [{10: {"forward": [0, 90 * MS], "backward": [100 * MS, 200 * MS]}} for _ in range(2)]
    late = held_lateness_ms(gapped, times, [10], ["forward", "backward"], device=True)
    assert late is not None
    assert late.tolist() == [[[0.0, 0.0]], [[4.0, 0.0]]]


def test_on_gpu_a_rank_held_by_its_tensor_parallel_peer_is_not_late_at_the_data_parallel_all_reduce() -> None:
    # Four ranks, two hosts: tensor-parallel groups 1 (ranks 0, 1) and 2 (2, 3), data-parallel
    # groups 3 (0, 2) and 4 (1, 3). Backward on each rank: two tensor-parallel all-reduces, then
    # the data-parallel one. Rank 1's layer before its second runs 6 ms longer: rank 0's kernel
    # there waits for it (8 ms against 2). Both then reach their data-parallel all-reduce 6 ms
    # after their peers on host 1 (4 ms against 10), which waited for them: rank 0's lateness
    # there is rank 1's, and nothing tells when it was released, so those all-reduces are left
    # out. Rank 1: 6 ms late in backward, rank 0 nothing.
    def mine(tp: int, dp: int, durations_ms: list[float]) -> list:
        groups = [(str(tp), 1), (str(tp), 2), (str(dp), 1)]
        return [
            (10, "backward", pg, seq, int((101 + k) * MS), -int(d * MS))
            for k, ((pg, seq), d) in enumerate(zip(groups, durations_ms))
        ]

    times = [mine(1, 3, [2, 8, 4]), mine(1, 4, [2, 2, 4]), mine(2, 3, [2, 2, 10]), mine(2, 4, [2, 2, 10])]
    late = held_lateness_ms(spans([100] * 4), times, [10], ["backward"], device=True)
    assert late is not None
    assert late[:, 0, 0].tolist() == [0.0, 6.0, 0.0, 0.0]


def hsdp_cpu(forward_ms: list[list[float]]) -> list[list]:
    """Four CPU ranks, HSDP's groups: shard groups 1 (ranks 0, 1) and 2 (2, 3), replicate
    groups 3 (0, 2) and 4 (1, 3). Step 9's backward on each rank: a reduce-scatter over its
    shard group, then an all-reduce over its replicate group; step 10's forward: two
    all-gathers over its shard group, issued at `forward_ms[rank]`."""
    shard, replicate = ("1", "1", "2", "2"), ("3", "4", "3", "4")
    return [
        [
            (9, "backward", shard[r], 1, int(-20 * MS), int(-20 * MS)),
            (9, "backward", replicate[r], 1, int(-10 * MS), int(-10 * MS)),
            *((10, "forward", shard[r], 2 + k, int(t * MS), int(t * MS)) for k, t in enumerate(forward_ms[r])),
        ]
        for r in range(4)
    ]


def test_on_cpu_the_first_all_gather_after_another_group_s_collectives_counts_from_the_phase_start() -> None:
    # Rank 1 sleeps 40 ms as forward starts: its first all-gather 40 ms after rank 0's, which
    # waits; both issue the second at 45. The ranks come to that first all-gather from
    # different replicate groups' all-reduces, but on CPU their forward starts are on one
    # clock, after every hold before: rank 1 is 40 ms late in forward, the others nothing.
    late = held_lateness_ms(spans([0] * 4, "forward"), hsdp_cpu([[1, 45], [41, 45], [1, 5], [1, 5]]), [10], ["forward"])
    assert late is not None
    assert late[:, 0, 0].tolist() == [0.0, 40.0, 0.0, 0.0]
    # Rank 0 starts forward 30 ms late (held before it): late at the all-gather by as much as
    # it entered forward with, which is not forward's account.
    late = held_lateness_ms(
        spans([30, 0, 0, 0], "forward"), hsdp_cpu([[31, 35], [1, 35], [1, 5], [1, 5]]), [10], ["forward"]
    )
    assert late is not None
    assert late[:, 0, 0].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_on_gpu_collectives_are_taken_in_the_order_the_hosts_issued_them() -> None:
    # The same collectives listed in another order, and host clocks 1 s apart on rank 1 (its
    # offset): the order is the punctual issue, the durations need no clock.
    times = device([[2, 6, 2], [2, 2, 2]])
    times = [list(reversed(mine)) for mine in times]
    times[1] = [(s, p, g, q, i + 1000 * MS, a) for s, p, g, q, i, a in times[1]]
    starts = spans([0, 1000], "forward")
    late = held_lateness_ms(starts, times, [10], ["forward"], offsets_ns=[0, 1000 * MS], device=True)
    assert late is not None
    assert late.tolist() == [[[0.0]], [[4.0]]]


def test_on_gpu_the_recorder_s_durations_are_arrivals_and_an_untimed_collective_is_left_out() -> None:
    entries = [
        {"pg_id": 0, "collective_seq_id": 1, "time_created_ns": 5 * MS, "is_p2p": False, "duration_ms": 2.5},
        {"pg_id": 0, "collective_seq_id": 2, "time_created_ns": 6 * MS, "is_p2p": False, "duration_ms": None},
        {"pg_id": 0, "collective_seq_id": 3, "time_created_ns": 7 * MS, "is_p2p": False},
    ]
    spans_ns = {10: {"backward": [0, 100 * MS]}}
    assert my_arrivals(entries, spans_ns, ["backward"], device=True) == [(10, "backward", "0", 1, 5 * MS, -2_500_000)]
    assert len(my_arrivals(entries, spans_ns, ["backward"])) == 3  # CPU: every issue is an arrival


def _gpu_tables(n_ranks: int, steps: list[int]) -> torch.Tensor:
    """Every rank's GPU table: the same device time in every phase, no own work measured."""
    out = []
    for _ in range(n_ranks):
        recs = [{"step": s, "step_ms": 100.0, "phases_ms": dict(BASE), "phases_device_ms": dict(BASE)} for s in steps]
        out.append(pack_rows([step_row(rec) for rec in recs], len(steps)))
    return torch.stack(out)


def test_the_watch_names_a_gpu_rank_slow_inside_fsdp_s_forward_from_nccl_s_durations() -> None:
    # 4 FSDP ranks, every phase as long on each device (the slow one works, the others wait).
    # Rank 3 computes each step's second layer 10 ms longer (10% of the 100 ms step, over the
    # 8% bound): it starts the third all-gather 10 ms after the others, whose kernels wait 10 ms
    # longer for it.
    steps = [10, 11, 12, 13]
    arrived, spans_ns = [], []
    for r in range(4):
        mine = []
        for s in steps:
            durations = [2.0, 2.0, 2.0, 2.0] if r == 3 else [2.0, 2.0, 12.0, 2.0]
            mine += device([durations], step=s)[0]
        arrived.append(mine)
        spans_ns.append({s: {"forward": [0, 100 * MS], "backward": [100 * MS, 200 * MS]} for s in steps})
    own = own_work_phases("fsdp")
    tables = _gpu_tables(4, steps)
    both = ("forward", "backward")
    assert judge_tables(tables, {}, own, noise=GPU, th=Thresholds(), held_phases=both).stragglers == []
    held = HeldArrivals(spans_ns=spans_ns, arrivals=arrived, offsets_ns=[0.0] * 4, device=True)
    v = judge_tables(tables, {}, own, noise=GPU, th=Thresholds(), held_phases=both, arrivals=held)
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 0.0, 0.0, 10.0]
    [s] = v.stragglers
    assert (s.rank, s.phase, s.excess_ms, s.steps_late) == (3, "forward", 10.0, 4)


def test_the_gpu_watch_reads_nccl_s_recorder_and_marks_the_arrivals_as_device_ones(tmp_path: Path, monkeypatch) -> None:
    entries = [{"pg_id": 0, "collective_seq_id": 1, "time_created_ns": 5 * MS, "is_p2p": False, "duration_ms": 3.0}]
    asked = []
    monkeypatch.setattr("harness.watch.exchange.recorder_entries", lambda backend: asked.append(backend) or entries)
    span = {10: {"backward": [0, 100 * MS]}}
    watch = ThreeRankWatch(tmp_path, [(span, [], 100, []), (span, [], 100, [10, 11])])
    watch.cpu, watch.backend = False, "nccl"
    watch.add({"step": 10, "step_ms": 100.0, "phases_ms": {}, "phases_span_ns": {"backward": [0, 100 * MS]}})
    got = watch._arrivals(100)
    assert got is not None and got.device and asked == ["nccl"]
    assert got.arrivals[0] == [(10, "backward", "0", 1, 5 * MS, -3 * MS)]
    assert got.timed_through == 9  # rank 2's steps 10 and 11 wait for NCCL's timing


def test_the_recorder_is_set_to_time_nccl_s_collectives_unless_the_user_chose() -> None:
    from harness.run.flight import enable

    env: dict[str, str] = {}
    assert "TORCH_NCCL_ENABLE_TIMING" in enable(2000, "nccl", env) and env["TORCH_NCCL_ENABLE_TIMING"] == "1"
    env = {"TORCH_NCCL_ENABLE_TIMING": "0"}
    enable(2000, "nccl", env)
    assert env["TORCH_NCCL_ENABLE_TIMING"] == "0"
    env = {}
    enable(2000, "gloo", env)
    assert "TORCH_NCCL_ENABLE_TIMING" not in env


def test_the_step_clock_spans_phases_when_asked_without_thread_time() -> None:
    clock = StepClock(cuda=False, spans=True)
    clock.start(0)
    clock.mark("forward")
    clock.finish()
    [rec] = clock.poll()
    assert set(rec["phases_span_ns"]) == {"forward"} and "phases_cpu_ms" not in rec


def test_a_step_waits_while_nccl_has_not_timed_its_collectives_and_not_for_a_group_that_never_times() -> None:
    def entry(pg: int, seq: int, at_ms: float, duration_ms: float | None) -> dict:
        return {"pg_id": pg, "collective_seq_id": seq, "time_created_ns": int(at_ms * MS), "duration_ms": duration_ms}

    spans_ns = {s: {"backward": [s * 100 * MS, (s * 100 + 50) * MS]} for s in (1, 2, 3)}
    entries = [
        entry(0, 1, 110, 2.0),  # step 1, timed
        entry(0, 2, 210, None),  # step 2: its group timed #1 and nothing later: the watchdog's lag
        entry(0, 3, 310, None),  # step 3, the same
        entry(1, 5, 120, None),  # a group that times nothing: never holds a step back
        entry(2, 1, 130, None),  # a group that timed a later one: this one will not be timed
        entry(2, 2, 140, 1.0),
    ]
    assert untimed_steps(entries, spans_ns, ["backward"]) == [2, 3]
    assert untimed_steps(entries[:1] + entries[3:], spans_ns, ["backward"]) == []
    # at a job's start no group has a duration yet: one still awaited holds its steps back
    assert untimed_steps(entries[3:4], spans_ns, ["backward"], expected={1}) == [1]
    assert untimed_steps(entries[3:4], spans_ns, ["backward"], expected={0}) == []


def test_a_group_s_first_duration_is_awaited_for_a_second_from_when_the_watch_first_saw_it() -> None:
    patience = TimingPatience()
    first = [{"pg_id": 0, "collective_seq_id": 1}, {"pg_id": 7, "collective_seq_id": 1, "is_p2p": True}]
    assert patience.expected(first, now_ns=5 * MS) == {0}  # point-to-point groups are not judged
    later = [*first, {"pg_id": 1, "collective_seq_id": 1}]
    assert patience.expected(later, now_ns=5 * MS + TIMING_PATIENCE_NS - 1) == {0, 1}
    assert patience.expected(later, now_ns=5 * MS + TIMING_PATIENCE_NS) == {1}


def test_the_judge_leaves_steps_after_timed_through_for_the_next_interval() -> None:
    steps = [10, 11, 12, 13]
    held = _held(4, steps, 2, 30.0)
    held.timed_through = 11
    judge = WatchJudge(own_phases=own_work_phases("ddp"), held_phases=("backward",), noise=SHARED_CPU, th=Thresholds())
    got = judge.judge(_tables(4, steps), {}, held)
    assert got is not None and got.verdict.steps == [10, 11] and judge.judged_through == 11


def test_on_gpu_steps_nccl_has_not_timed_have_their_own_work_judged_now_and_held_phases_later() -> None:
    # FSDP on 4 GPUs, 100 ms steps; from step 12 on rank 2's data phase takes 20 ms more (its
    # device idles for its host's loader). NCCL has timed the collectives through step 11 only.
    # Steps 10-11 are judged whole (nobody late); steps 12-13 by their own work alone (data and
    # optimizer: CUDA events, complete at the step's end), which names rank 2 in data at once.
    def tables(steps: list[int]) -> torch.Tensor:
        out = []
        for r in range(4):
            recs = []
            for s in steps:
                slow = 20.0 if r == 2 and s >= 12 else 0.0
                device = dict(BASE) | {"data": BASE["data"] + slow}
                recs.append({"step": s, "step_ms": 100.0 + slow, "phases_device_ms": device})
            out.append(pack_rows([step_row(rec) for rec in recs], len(steps)))
        return torch.stack(out)

    steps = [10, 11, 12, 13]
    held = HeldArrivals(spans_ns=[{}] * 4, arrivals=[[]] * 4, offsets_ns=[0.0] * 4, device=True, timed_through=11)
    judge = WatchJudge(
        own_phases=own_work_phases("fsdp"), held_phases=COLLECTIVE_PHASES["fsdp"], noise=GPU, th=Thresholds()
    )
    got = judge.judge(tables(steps), {}, held)
    assert got is not None and got.verdict.steps == [10, 11] and got.verdict.stragglers == []
    assert got.ahead is not None and got.ahead.steps == [12, 13] and got.ahead.own_work_only
    [r] = got.new
    assert (r.rank, r.phase, round(r.late_ms, 6)) == (2, "data", 20.0) and got.verdict_of(r) is got.ahead
    assert judge.judged_through == 11  # the held phases of 12-13 are still to be judged
    # Next interval: nothing timed beyond 11 yet, no new step: the flag stands, nothing is new.
    again = judge.judge(tables(steps), {}, held)
    assert again is not None and again.new == [] and again.gone == [] and judge.flagged == {2}
    # Once timed, 12-13 are judged whole: rank 2 still late, already flagged.
    timed = HeldArrivals(spans_ns=[{}] * 4, arrivals=[[]] * 4, offsets_ns=[0.0] * 4, device=True)
    whole = judge.judge(tables(steps), {}, timed)
    assert whole is not None and whole.ahead is None and whole.verdict.steps == [12, 13]
    assert [s.rank for s in whole.verdict.stragglers] == [2] and whole.new == [] and judge.judged_through == 13


def test_a_collective_issued_on_a_phase_boundary_is_the_ending_phase_s() -> None:
    entries = [{"pg_id": 0, "collective_seq_id": 1, "time_created_ns": 100 * MS, "is_p2p": False}]
    spans_ns = {10: {"forward": [0, 100 * MS], "backward": [100 * MS, 200 * MS]}}
    assert my_arrivals(entries, spans_ns, ["forward", "backward"]) == [(10, "forward", "0", 1, 100 * MS, 100 * MS)]
    assert my_arrivals(entries, spans_ns, ["backward"]) == [(10, "backward", "0", 1, 100 * MS, 100 * MS)]


def test_tables_hold_more_steps_where_nccl_s_timing_holds_them_back() -> None:
    from harness.watch.rule import table_rows

    assert table_rows(5, False) == 10 and table_rows(5, True) == 20 and table_rows(0, False) == 2


def test_collectives_in_every_pass_of_a_phase_that_comes_back_are_placed() -> None:
    # gradient accumulation: forward and backward twice in step 10 (a span pair per pass)
    entries = [
        {"pg_id": 0, "collective_seq_id": 1, "time_created_ns": 15 * MS, "is_p2p": False},
        {"pg_id": 0, "collective_seq_id": 2, "time_created_ns": 35 * MS, "is_p2p": False},
        {"pg_id": 0, "collective_seq_id": 3, "time_created_ns": 55 * MS, "is_p2p": False},
    ]
    spans_ns = {10: {"forward": [0, 10 * MS, 20 * MS, 30 * MS], "backward": [10 * MS, 20 * MS, 30 * MS, 40 * MS]}}
    assert my_arrivals(entries, spans_ns, ["backward"]) == [
        (10, "backward", "0", 1, 15 * MS, 15 * MS),
        (10, "backward", "0", 2, 35 * MS, 35 * MS),
    ]
