"""CPU ranks judged at their peers' speed and beyond their peers' lateness, on hand-built traces
whose answers are known exactly (tracebuild.cpu_ring_docs: each step's run-up is its own work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.collect.analyse.speed import op_speed
from harness.collect.analyse.stragglers import peer_baseline

from tracebuild import cpu_ring_docs, gpu_docs, run_analysis

# A rank's work per step at a speed of 1 (tracebuild.CPU_OPS and their gaps): 2000 + 4 x 100 us.
WORK_US = 2400.0


def test_a_rank_on_a_busier_core_is_slower_not_a_straggler(tmp_path: Path) -> None:
    # Rank 1 runs every op and every gap between them 1.25x as long: it arrives 600 us after
    # rank 0 at every all-reduce. Its ops take 1.25 / 1.125 of the median rank's (the mean of
    # two), rank 0's 1 / 1.125; at those speeds both run-ups are 2700 us: nobody is late.
    a = run_analysis(tmp_path, cpu_ring_docs(2, 6, speed=[1.0, 1.25]))
    res = a.stragglers
    by = {r.rank: r for r in res.ranks}
    assert by[0].speed == pytest.approx(1 / 1.125) and by[1].speed == pytest.approx(1.25 / 1.125)
    assert by[1].late_ms == pytest.approx(0.6)  # as it happened
    assert by[0].beyond_peers_ms == pytest.approx(0.0, abs=1e-9)
    assert by[1].beyond_peers_ms == pytest.approx(0.0, abs=1e-9)
    assert res.verdict == "balanced"


def test_a_sleep_on_the_busier_core_is_found_at_its_peers_speed(tmp_path: Path) -> None:
    # The same, and rank 1 sleeps 450 us before every all-reduce: it arrives 1050 us late; at
    # its peers' speed its run-up is (3000 + 450) / (1.25 / 1.125) = 3105 us against rank 0's
    # 2700: 405 us beyond. The bound is 8% of the clean step, rank 0's own work at its peers'
    # speed: (its 3450 + 200 us step less its 1050 us wait) x 1.125 = 2925 us -> 234 us.
    a = run_analysis(tmp_path, cpu_ring_docs(2, 6, speed=[1.0, 1.25], sleep_us=lambda r, s: 450.0 * r))
    res = a.stragglers
    [s] = res.stragglers
    assert s.rank == 1 and s.late_ms == pytest.approx(1.05)
    assert s.beyond_peers_ms == pytest.approx(0.405)
    assert res.bounds_ms["relative"] == pytest.approx(0.08 * 2.925)
    assert res.bounds_ms["jitter"] == 0.0 and res.threshold_ms == pytest.approx(0.234)
    assert s.pattern == "persistent" and s.steps_late == 6


def test_extra_work_in_the_op_it_repeats_is_the_rank_s_own(tmp_path: Path) -> None:
    # Rank 1 runs a 1400 us matmul each step, rank 0 a 200 us one: aten::mm votes 1.75 and 0.25,
    # the four other names 1.0 each; the median keeps both ranks at 1.0, and rank 1's 1.2 ms of
    # extra work is its lateness beyond rank 0, whole.
    docs = cpu_ring_docs(2, 6, extra_mm_us=lambda r, s: 1400.0 if r else 200.0)
    res = run_analysis(tmp_path, docs).stragglers
    assert [r.speed for r in res.ranks] == [1.0, 1.0]
    [s] = res.stragglers
    assert s.rank == 1 and s.late_ms == pytest.approx(1.2) and s.beyond_peers_ms == pytest.approx(1.2)


def test_lateness_every_rank_shows_is_not_straggling(tmp_path: Path) -> None:
    # Time-slicing on 2 ranks: rank 0 is held up 2 ms in odd steps, rank 1 in even ones. Each is
    # 1 ms late per step, over 8% of the clean step; beyond its peer, neither is.
    docs = cpu_ring_docs(2, 8, sleep_us=lambda r, s: 2000.0 if s % 2 == r else 0.0)
    res = run_analysis(tmp_path, docs).stragglers
    assert [r.late_ms for r in res.ranks] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert [r.beyond_peers_ms for r in res.ranks] == [pytest.approx(0.0), pytest.approx(0.0)]
    assert res.bounds_ms["relative"] < 1.0 and res.verdict == "balanced"


def test_a_rank_held_up_for_a_few_steps_where_ranks_are_late_by_turns_is_noise(tmp_path: Path) -> None:
    # Rank 0 is held up 1 ms in steps 1-4, rank 1 3 ms in steps 6-8: 0.5 and 1.125 ms late per
    # step, rank 1 0.625 ms beyond rank 0, over 8% of the clean step (rank 0's own work: 3.1 ms
    # -> 0.248). But rank 0's own lateness swings by a median absolute deviation of 0.5 ms from
    # step to step (the run's own-work jitter is 0: rank 1's work never moves), so the peers'
    # lateness jitter bound is 1.5 ms, and rank 1 is within it.
    def held(r: int, s: int) -> float:
        return 1000.0 if r == 0 and s <= 4 else 3000.0 if r == 1 and s >= 6 else 0.0

    res = run_analysis(tmp_path, cpu_ring_docs(2, 8, sleep_us=held)).stragglers
    assert [r.late_ms for r in res.ranks] == [pytest.approx(0.5), pytest.approx(1.125)]
    assert res.ranks[1].beyond_peers_ms == pytest.approx(0.625)
    assert res.bounds_ms["relative"] == pytest.approx(0.248) and res.bounds_ms["jitter"] == 0.0
    assert res.bounds_ms["late_jitter"] == pytest.approx(1.5)
    assert res.verdict == "balanced"


def test_a_straggler_among_four_stands_out_from_its_peers_lateness(tmp_path: Path) -> None:
    # In step s rank s % 4 is held up 600 us (each rank in 2 of 8 steps: 150 us per step), and
    # rank 2 sleeps 1000 us more every step. The punctual mark is the earliest arrival, 2400 us;
    # the peers' baseline the median of the lower half (150, 150); rank 2 is 1150 us late per
    # step, 1000 us beyond.
    docs = cpu_ring_docs(4, 8, sleep_us=lambda r, s: (600.0 if s % 4 == r else 0.0) + (1000.0 if r == 2 else 0.0))
    res = run_analysis(tmp_path, docs).stragglers
    late = {r.rank: r.late_ms for r in res.ranks}
    assert late == {0: pytest.approx(0.15), 1: pytest.approx(0.15), 2: pytest.approx(1.15), 3: pytest.approx(0.15)}
    assert [(s.rank, s.beyond_peers_ms) for s in res.stragglers] == [(2, pytest.approx(1.0))]
    assert res.bounds_ms["outlier"] == 0.0  # the lower half agree


def test_op_speed_needs_cpu_ranks_and_enough_names(tmp_path: Path) -> None:
    gpu = run_analysis(tmp_path / "gpu", gpu_docs()).traces
    assert op_speed(gpu) == {0: 1.0, 1: 1.0}  # a GPU rank's slower device is its own straggling
    # Two steps: only aten::linear spends 1 ms on every rank (2 x 900 us): fewer than three names
    # vote, not estimated. Three steps: aten::linear, aten::mul and aten::add do (aten::relu's
    # 900 us does not), each 1.5x as long on rank 1, the median rank's 1.25x.
    cpu = run_analysis(tmp_path / "cpu", cpu_ring_docs(2, 2, speed=[1.0, 1.5])).traces
    assert op_speed(cpu) == {0: 1.0, 1: 1.0}
    cpu = run_analysis(tmp_path / "cpu3", cpu_ring_docs(2, 3, speed=[1.0, 1.5])).traces
    assert op_speed(cpu) == {0: pytest.approx(1 / 1.25), 1: pytest.approx(1.5 / 1.25)}


def test_one_preempted_step_is_not_a_slower_core(tmp_path: Path) -> None:
    # Rank 1 waits 2400 us for a core in step 3 of 8 (its ops and gaps twice as long there): its
    # ops' totals are 9/8 of rank 0's. Step by step every name's ratio is 1 in seven steps of
    # eight, so both ranks run at 1.0 and their run-ups are judged as they were (over the totals
    # rank 0 came out at 0.941 and was judged 7% of every run-up behind rank 1). Of four ranks,
    # the same: the other three are the median.
    for n in (2, 4):
        docs = cpu_ring_docs(n, 8, core_wait_us=lambda r, s: 2400.0 if (r, s) == (1, 3) else 0.0)
        res = run_analysis(tmp_path / str(n), docs).stragglers
        assert [r.speed for r in res.ranks] == [1.0] * n
        assert res.ranks[1].late_ms == pytest.approx(0.3) and res.ranks[1].steps_late == 1
        assert [r.steps_late for r in res.ranks if r.rank != 1] == [0] * (n - 1) and res.verdict == "balanced"


def test_peer_baseline_is_the_median_of_the_lower_half() -> None:
    assert peer_baseline([]) == 0.0
    assert peer_baseline([5.0]) == 5.0
    assert peer_baseline([9.0, 1.0]) == 1.0  # two ranks: the punctual one's
    assert peer_baseline([0.0, 4.0, 1.0, 9.0]) == 0.5
    assert peer_baseline([3.0, 1.0, 2.0, 100.0, 50.0]) == 1.5


def test_one_stall_is_not_a_straggler_but_a_recurring_delay_is(tmp_path: Path) -> None:
    # Rank 1 is held up 5000 us in step 1 of 5 only: 1 ms late per step, over every bound (its
    # peer never moves), but late in one step. Rank 1 held up 1500 us in every 2nd step of 6 is
    # 0.75 ms late per step, late in 3.
    stall = run_analysis(tmp_path / "stall", cpu_ring_docs(2, 5, sleep_us=lambda r, s: 5000.0 * r * (s == 1)))
    assert stall.stragglers.ranks[1].beyond_peers_ms == pytest.approx(1.0)
    assert stall.stragglers.threshold_ms < 1.0 and stall.stragglers.verdict == "balanced"
    assert stall.stragglers.ranks[1].steps_late == 1
    every_2nd = run_analysis(tmp_path / "k2", cpu_ring_docs(2, 6, sleep_us=lambda r, s: 1500.0 * r * (s % 2 == 0)))
    [s] = every_2nd.stragglers.stragglers
    assert s.rank == 1 and s.beyond_peers_ms == pytest.approx(0.75) and s.steps_late == 3
