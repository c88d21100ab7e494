"""The device timeline on simulated GPU jobs (tests/devicesim.py): the host runs ahead of the
device, streams overlap, a step's parts add up to its span, and every span is counted once.
Each expected number is worked out from the scenario by hand, in the comments."""

from __future__ import annotations

from pathlib import Path

import pytest
from devicesim import Sim, write_all

from harness.collect.analysis import Analysis, analyze
from harness.collect.discover import group_ranks
from harness.collect.parse import parse_trace

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
            (1, 4000.0, 4000.0, 0.0), (2, 4000.0, 4000.0, 0.0), (3, 4000.0, 4000.0, 0.0), (4, 4200.0, 4000.0, 0.0)]
        assert [(o.comm_us, o.overlapped_comm_us, o.exposed_comm_us) for o in rows] == [
            (0.0, 0.0, 0.0), (200.0, 200.0, 0.0), (200.0, 200.0, 0.0), (400.0, 200.0, 200.0)]
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
            4505.0, 4000.0, 2000.0, 1500.0)
        assert (first.exposed_comm_us, first.exposed_transfer_us, first.exposed_wait_us, first.idle_us) == (
            500.0, 500.0, 0.0, 5.0)
        for o in rows:
            assert o.compute_us + o.exposed_comm_us + o.memcpy_us + o.idle_us == o.window_us
