"""The device timeline on simulated GPU jobs (tests/devicesim.py): the host runs ahead of the
device, streams overlap, a step's parts add up to its span, and every span is counted once.
Each expected number is worked out from the scenario by hand, in the comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.traces.read.discover import group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.run_analysis import Analysis, analyze

from devicesim import Sim, write_all

GEMM = "ampere_sgemm_128x64_nn"


def analysed(tmp_path: Path, sim: Sim) -> Analysis:
    paths = write_all(sim.run(), tmp_path)
    return analyze(group_ranks([parse_trace(p) for p in paths]))


def rows_of(a: Analysis, rank: int) -> list:
    return sorted((o for o in a.overlap if o.rank == rank), key=lambda o: o.step)


def gpu_bound(world: int = 2, steps: int = 4, annotations: bool = False) -> Sim:
    """Every rank, per step: four 1000 us GEMMs on stream 7, then an all-reduce (200 us transfer)
    on the comm stream once the fourth is done. The host only launches (25 us a step), so it runs
    ahead and the device works back to back: step n's GEMMs run [5 + 4000(n-1), 5 + 4000n] and
    its all-reduce 200 us after them, under step n+1's GEMMs. A device sync after the last step."""
    sim = Sim(world_size=world, gpu_step_annotations=annotations)
    for r in range(world):
        h = sim.rank(r)
        for n in range(1, steps + 1):
            with h.step(n):
                last = None
                for _ in range(4):
                    last = h.launch(GEMM, 1000.0)
                h.collective("allreduce", 200.0, after=last)
        h.sync(kind="device")
    return sim


@pytest.mark.parametrize("annotations", [False, True])
def test_a_device_running_behind_its_host_is_busy(tmp_path: Path, annotations: bool) -> None:
    a = analysed(tmp_path, gpu_bound(annotations=annotations))
    for rank in (0, 1):
        rows = rows_of(a, rank)
        # spans from each step's first GEMM to the next's: 4000 us each, the last to its
        # all-reduce's end (4200 us); the device never idles; each all-reduce runs under the
        # next step's GEMMs, but the last one's 200 us, which nothing covers
        assert [(o.step, o.window_us, o.compute_us, o.idle_us) for o in rows] == [
            (1, 4000.0, 4000.0, 0.0),
            (2, 4000.0, 4000.0, 0.0),
            (3, 4000.0, 4000.0, 0.0),
            (4, 4200.0, 4000.0, 0.0),
        ]
        assert [(o.comm_us, o.overlapped_comm_us, o.exposed_comm_us) for o in rows] == [
            (0.0, 0.0, 0.0),
            (200.0, 200.0, 0.0),
            (200.0, 200.0, 0.0),
            (400.0, 200.0, 200.0),
        ]
        for o in rows:
            assert o.compute_us + o.exposed_comm_us + o.memcpy_us + o.idle_us == o.window_us
        # the host's steps are 25 us: the device's spans, not the host's, hold the device's time
        assert [s.dur_us for s in a.traces[rank].steps] == [25.0, 25.0, 25.0, 25.0]
        spans = [(s.cover.lo_us, s.cover.hi_us) for s in a.traces[rank].steps]
        assert all(x[1] == y[0] for x, y in zip(spans, spans[1:]))
        assert sum(o.window_us for o in rows) == spans[-1][1] - spans[0][0] == 16200.0


def test_a_comm_stream_hides_behind_compute(tmp_path: Path) -> None:
    # Per step (host-bound enough that each step's work starts when launched): four 1000 us
    # backward kernels; bucket 1's all-reduce (1500 us) waits for the second and runs beside the
    # third and fourth: fully hidden; bucket 2's (500 us) waits for the fourth: exposed. A
    # stream sync ends each step, so each span is the step's own work: [5, 4505] in step 1.
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        for n in range(1, 3):
            with h.step(n):
                ks = [h.launch(GEMM, 1000.0) for _ in range(4)]
                h.collective("allreduce", 1500.0, after=ks[1])
                h.collective("allreduce", 500.0, after=ks[3])
                h.sync(kind="device")
    a = analysed(tmp_path, sim)
    for rank in (0, 1):
        rows = rows_of(a, rank)
        # step 1: GEMMs [5, 4005]; bucket 1 [2005, 3505], bucket 2 [4005, 4505]; the host's
        # sync returns at 4505 and launches step 2's first GEMM there: it runs at 4505 + 5
        # (latency), so step 1's span is [5, 4510], 5 us of it idle
        first = rows[0]
        assert (first.window_us, first.compute_us, first.comm_us, first.overlapped_comm_us) == (
            4505.0,
            4000.0,
            2000.0,
            1500.0,
        )
        assert (first.exposed_comm_us, first.exposed_transfer_us, first.exposed_wait_us, first.idle_us) == (
            500.0,
            500.0,
            0.0,
            5.0,
        )
        for o in rows:
            assert o.compute_us + o.exposed_comm_us + o.memcpy_us + o.idle_us == o.window_us


def diagnosed(tmp_path: Path, sim: Sim) -> tuple[Analysis, dict[int, object]]:
    from harness.traces.analyse.advisor import diagnose

    a = analysed(tmp_path, sim)
    return a, {d.rank: d for d in diagnose(a)}


def test_a_busy_device_ahead_of_nothing_is_healthy_and_gpu_bound(tmp_path: Path) -> None:
    _, d = diagnosed(tmp_path, gpu_bound())
    for rank in (0, 1):
        assert d[rank].bottleneck == "healthy", d[rank].reason
        # spans: 4000 us of GEMM each, 200 us of exposed all-reduce at the end: busy 100%; the
        # device starts step n 3975(n-1) + 5 us after the host does: 5, 3980, 7955, 11930, median 5967.5
        assert d[rank].evidence["idle_share"] == 0.0 and d[rank].evidence["device_lag_ms"] == 5.9675
        assert "GPU-bound: the device is busy 100% of its time, 5.97 ms behind its host" in d[rank].reason


def sync_loop(after_sync_us: float, before_us: float = 0.0, steps: int = 4) -> Sim:
    """One rank per step: `before_us` of host work between two GEMMs (when > 0), then `.item()`,
    then `after_sync_us` of host work with the queue drained (the device waits for it)."""
    sim = Sim(world_size=1)
    h = sim.rank(0)
    for n in range(1, steps + 1):
        with h.step(n):
            h.launch(GEMM, 7000.0 if not before_us else 2000.0)
            if before_us:
                h.cpu(before_us, "aten::_python_side")
                h.launch(GEMM, 2000.0)
            h.item()
            if after_sync_us:
                h.cpu(after_sync_us, "aten::_host_side")
    return sim


def test_a_sync_is_weighed_by_the_idle_it_causes(tmp_path: Path) -> None:
    # 30%: per 10007 us step, a 7000 us GEMM [t+5, t+7005], item()'s copy [t+7005, t+7007] and
    # its sync [t+10, t+7007], then 3000 us on the host: the device idles [t+7007, t+10012],
    # 3005 us, until the next step's GEMM; the last step's sync has nothing after it (the
    # trace ends): 3 x 3.005 / 4 = 2.254 ms a step, 22.5% of it
    _, d = diagnosed(tmp_path / "a", sync_loop(3000.0))
    ev = d[0].evidence
    assert ev["sync_cost_ms_by_caller"] == {"item": 2.254} and ev["user_sync_cost_share"] == 0.2252
    assert d[0].bottleneck == "sync-bound"
    assert d[0].reason.startswith(
        "blocking syncs from the training code leave the device idle 23% of the step "
        "(>= 10%): item 1.0 per step (2.25 ms of device idle)"
    )
    # 1%: 5000 us of host work between two 2000 us GEMMs idles the device 3005 us a step, but
    # the sync after the second GEMM drains a queue the host refills at once: 5 us a step. A
    # count of one sync per step with a 43% idle device was sync-bound; weighed, it is host-bound
    _, d = diagnosed(tmp_path / "b", sync_loop(0.0, before_us=5000.0))
    ev = d[0].evidence
    assert ev["sync_cost_ms_by_caller"] == {"item": 0.004} and ev["syncs_by_caller"] == {"item": 1.0}
    assert d[0].bottleneck == "host-bound", d[0].reason
    assert ev["idle_share"] == pytest.approx(0.43, abs=0.005)


def test_many_small_launches_are_launch_bound(tmp_path: Path) -> None:
    # 400 elementwise kernels of 3 us a step, each after 20 us of host work: the device idles
    # ~88% of the time (3 of every 25 us busy)
    sim = Sim(world_size=1)
    h = sim.rank(0)
    for n in range(1, 4):
        with h.step(n):
            for _ in range(400):
                h.cpu(20.0, "aten::add")
                h.launch("vectorized_elementwise_kernel", 3.0)
    _, d = diagnosed(tmp_path, sim)
    assert d[0].bottleneck == "launch-bound", d[0].reason
    assert d[0].evidence["launches_per_step"] == 400.0 and d[0].evidence["idle_share"] == pytest.approx(0.88, abs=0.01)


def test_a_straggler_blocked_in_syncs_is_named_by_them(tmp_path: Path) -> None:
    # Rank 1 copies five inputs to the device from pageable memory each step: each blocking
    # cudaMemcpy stages 1000 us on the host (its device idle meanwhile: the queue is empty)
    # before a 50 us copy; 5.3 ms a step late at the all-reduce. Rank 0 has no copies.
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        for n in range(1, 5):
            with h.step(n):
                if r == 1:
                    for _ in range(5):
                        h.to_device(50.0, stage_us=1000.0)
                k = h.launch(GEMM, 1000.0)
                h.collective("allreduce", 100.0, after=k)
                h.sync(kind="device")
    a, d = diagnosed(tmp_path, sim)
    [s] = a.stragglers.stragglers
    assert s.rank == 1 and d[1].bottleneck == "straggler"
    # the copies' 5 x 1006 us (1000 staging with nothing queued, 6 of lead lost after each),
    # and the device sync that ends each step: it drains a queue the next step's staging would
    # have hidden behind (1005 us in three of the four steps)
    assert s.syncs == {"copy to device": [5.0, 5.03], "other": [1.0, 0.754]}
    assert "its syncs made it late: copy to device 5.0 per step (5.03 ms of device idle)" in d[1].reason


def test_a_straggler_slow_on_its_host_is_not_blamed_on_its_syncs(tmp_path: Path) -> None:
    # Rank 1 reads a value with .item() after each of three short kernels, then does 2000 us of
    # host work: ~6 ms late a step. Each sync blocked only while its 500 us kernel ran, so it
    # cost at most that (the host would have lost no more lead without it): 1.5 ms of the 6. Its
    # host's work made it late, not its syncs.
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        for n in range(1, 5):
            with h.step(n):
                for _ in range(3):
                    h.launch(GEMM, 500.0)
                    if r == 1:
                        h.item()
                        h.cpu(2000.0, "aten::_log_metrics")
                k = h.launch(GEMM, 1000.0)
                h.collective("allreduce", 100.0, after=k)
                h.sync(kind="device")
    a, d = diagnosed(tmp_path, sim)
    [s] = a.stragglers.stragglers
    assert s.rank == 1 and s.syncs == {} and "its syncs made it late" not in d[1].reason
    assert d[1].evidence["sync_cost_ms_by_caller"]["item"] == pytest.approx(1.5, abs=0.05)


def phased_job(slow_us: dict[int, float], steps: int = 6) -> Sim:
    """Two ranks, no sync in the loop (the host runs ahead of its GPU). Per step: data (200 us of
    host work), forward (three 1000 us GEMMs), backward (three 1000 us GEMMs, then the all-reduce,
    300 us, once the last is done), optimizer (a 200 us kernel waiting for the all-reduce). Rank 1's
    forward GEMMs are longer by slow_us[step] / 3 each in the steps named: a slower GPU."""
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        for n in range(1, steps + 1):
            extra = slow_us.get(n, 0.0) / 3 if r == 1 else 0.0
            with h.step(n):
                with h.range("data"):
                    h.cpu(200.0, "aten::copy_")
                with h.range("forward"):
                    for _ in range(3):
                        h.launch(GEMM, 1000.0 + extra)
                with h.range("backward"):
                    last = None
                    for _ in range(3):
                        last = h.launch(GEMM, 1000.0)
                    reduced = h.collective("allreduce", 300.0, after=last)
                with h.range("optimizer"):
                    h.launch("void at::native::multi_tensor_apply_kernel", 200.0, after=reduced)
        h.sync(kind="device")
    return sim


def test_a_slower_gpus_phase_is_the_phase_that_launched_its_kernels(tmp_path: Path) -> None:
    # Rank 1's forward kernels take 1500 us more a step. Its host ran ahead: at the device's
    # times the host was steps further, so its ranges then said nothing ("outside its ranges").
    # The kernels' launches were in forward: 1.5 ms a step of forward over rank 0's.
    a = analysed(tmp_path, phased_job({n: 1500.0 for n in range(1, 7)}))
    [s] = a.stragglers.stragglers
    assert (s.rank, s.phase, s.pattern) == (1, "forward", "persistent")
    assert s.phase_excess_ms == pytest.approx(1.5, rel=0.01)
    # the device's step is ~6.7 ms, the host's ProfilerStep a few launches: lateness is not capped by the latter
    assert s.late_ms == pytest.approx(1.5, rel=0.01)


def test_an_intermittent_straggler_does_not_set_its_own_bound(tmp_path: Path) -> None:
    # Rank 1 is 3 ms slow every other step: 1.5 ms a step on average, 22% of the ~6.7 ms clean
    # step. The swing of its own work (a MAD of 1.5 ms) and the waiting it gives rank 0 stay out
    # of the jitter: rank 0's own work does not vary, so the jitter is 0 and 8% of the clean step bounds it.
    a = analysed(tmp_path, phased_job({n: 3000.0 for n in range(1, 9, 2)}, steps=8))
    res = a.stragglers
    [s] = res.stragglers
    assert (s.rank, s.phase, s.pattern) == (1, "forward", "intermittent")
    assert res.bounds_ms["jitter"] == pytest.approx(0.0, abs=1e-6)
    assert s.late_ms == pytest.approx(1.5, rel=0.05)


def test_a_step_s_first_collective_that_starts_after_the_steps_before_opens_its_span(tmp_path: Path) -> None:
    # FSDP's shape: each step all-gathers (100 us) once the previous step's optimizer (stream 7)
    # is done, its GEMM (1000 us) waits for the all-gather, then the optimizer (200 us). Rank 1's
    # optimizer of step 2 runs 3000 us longer. Both devices: step 1's all-gather [5, 105], GEMM
    # [105, 1105], optimizer [1105, 1305]; step 2's all-gather [1305, 1405], GEMM [1405, 2405];
    # rank 0's optimizer [2405, 2605], rank 1's [2405, 5605]. Step 3's all-gather: rank 0 is
    # there at 2605 and waits for rank 1 at 5605, ends 5705; GEMM [5705, 6705], optimizer
    # [6705, 6905]. A span opens at the step's all-gather where that starts after everything the
    # steps before launched (not for the first step, whose elders are not in the trace): rank
    # 0's wait for rank 1 (2605-5605) is its step 3's, where it waited, not its step 2's.
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        gate = None
        for n in range(1, 4):
            with h.step(n):
                gathered = h.collective("allgather", 100.0, after=gate)
                h.launch(GEMM, 1000.0, after=gathered)
                gate = h.launch("void at::native::multi_tensor_apply_kernel", 3200.0 if (r, n) == (1, 2) else 200.0)
        h.sync(kind="device")
    a = analysed(tmp_path, sim)
    assert [(o.step, o.window_us) for o in rows_of(a, 0)] == [(1, 1200.0), (2, 1300.0), (3, 4300.0)]
    assert [(o.step, o.window_us) for o in rows_of(a, 1)] == [(1, 1200.0), (2, 4300.0), (3, 1300.0)]
