"""The detection campaign's watch on generated GPU jobs (bench/detect/gpu_watch.py): the step
records timing.py would write on a GPU, exact on a hand-computed program, and the watch's
verdicts on whole simulated jobs."""

from __future__ import annotations

import sys

import pytest

from devicesim import COMPUTE_STREAM, Sim
from jobs import REPO

sys.path.insert(0, str(REPO / "bench"))

from detect import sim as gen  # noqa: E402
from detect.gpu_watch import step_records, watch_case  # noqa: E402
from detect.real import ONSET_STEP  # noqa: E402

GEMM = "ampere_sgemm_128x64_nn"


def test_step_records_are_the_compute_streams_events() -> None:
    """Two ranks, one step, the simulator's defaults (launch call 5 us, latency 5 us, sync 2 us);
    rank 1's backward kernel is 100 us longer. Host: data [0, 100]; forward launches at 100
    (kernel 105-305); backward launches at 105 (kernel from 305: 605 / 705) and the all-reduce at
    110 (from 605 / 705, ends 755 on both); optimizer launches at 115 (from 755 to 795); item()
    copies 795-797 and returns at 797. Events (a mark's own 5 us to the device on an idle
    stream): start 5, data 105 (nothing launched yet), forward 305, backward 755 (the
    all-reduce, which DDP makes the stream wait for), optimizer 795, end 802. Both ranks' phase
    times are the same: a rank slower inside the phase that holds the all-reduce is not in them
    on a GPU. Its last gradient's event, recorded as the host launches the all-reduce (110),
    completes after the backward kernel (605 / 705): backward's own work is 300 / 400 us. The
    simulator's step 1 is the harness's step 0."""
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        with h.step(1):
            with h.range("data"):
                h.cpu(100.0, "aten::copy_")
            with h.range("forward"):
                h.launch(GEMM, 200.0)
            with h.range("backward"):
                last = h.launch(GEMM, 300.0 + 100.0 * r)
                reduced = h.collective("allreduce", 50.0, after=last)
            with h.range("optimizer"):
                h.launch("void at::native::multi_tensor_apply_kernel", 40.0, after=reduced)
            h.item()
    sim.run()
    for t in sim.truth():
        [(done_us, record)] = step_records(t, COMPUTE_STREAM, sim.launch_latency_us)
        assert done_us == 802.0
        assert record["step"] == 0 and record["step_ms"] == pytest.approx(0.797)
        expected = {"data": 0.1, "forward": 0.2, "backward": 0.45, "optimizer": 0.04}
        assert record["phases_ms"] == pytest.approx(expected)
        assert record["phases_device_ms"] == pytest.approx(expected)  # the stream idled for the whole data phase
        assert record["phases_own_device_ms"] == pytest.approx({"backward": 0.3 + 0.1 * t.rank})


def test_a_host_running_ahead_hides_its_data_phase_from_the_device() -> None:
    """Two steps, no loss read: step 1 as above without item() (its optimizer runs 655-695 on
    the device, its host is done at 120); step 2's data phase is host time 120-220, while the
    stream is still busy until 695: its start and data events both complete then, so the
    device spent nothing on step 2's data (phases_device_ms) though the host spent 100 us
    (phases_ms), and its forward kernel, launched at 220, runs 695-895."""
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        for n in (1, 2):
            with h.step(n):
                with h.range("data"):
                    h.cpu(100.0, "aten::copy_")
                with h.range("forward"):
                    h.launch(GEMM, 200.0)
                with h.range("backward"):
                    last = h.launch(GEMM, 300.0)
                    reduced = h.collective("allreduce", 50.0, after=last)
                with h.range("optimizer"):
                    h.launch("void at::native::multi_tensor_apply_kernel", 40.0, after=reduced)
    sim.run()
    for t in sim.truth():
        _, second = step_records(t, COMPUTE_STREAM, sim.launch_latency_us)[1]
        assert second["phases_device_ms"]["data"] == 0.0 and second["phases_ms"]["data"] == pytest.approx(0.1)
        assert second["phases_device_ms"]["forward"] == pytest.approx(0.2)


def case(**over: object) -> gen.SimCase:
    base = dict(
        ranks=8,
        steps=8,
        data_us=1000.0,
        fwd_kernels=4,
        kernel_us=800.0,
        transfer_us=600.0,
        opt_us=500.0,
        sync_each_step=True,
        jitter=0.01,
        skew_ms=0.0,
        kind="sleep",
        slow=(3,),
        phase="data",
        size=0.3,
        every=1,
        onset=2,
    )
    return gen.SimCase(**{**base, **over})  # type: ignore[arg-type]


def run(c: gen.SimCase) -> dict:
    hosts = {r: "node000" for r in range(c.ranks)}
    return watch_case(c, 11, gen.simulate_with_truth, hosts, COMPUTE_STREAM)


def test_the_watch_flags_a_host_sleep_in_data_in_the_first_interval_it_fills() -> None:
    """Rank 3 sleeps 30% of the step in data from the harness's step 8 (ONSET_STEP), the loop
    reading the loss each step: its device idles that long before its forward, every step. The
    exchange after step 4 has no step past the warm-up complete (step 4's end event is still on
    its way to the device); the one after step 9 judges steps 4-8, one of them slowed (6% of the
    step a step, under the 8% bound); the one after step 14 judges 9-13, all slowed, and flags
    rank 3 alone: 6 steps after the onset."""
    w = run(case())
    assert w["material"] and w["flags"] == [[14, 3, "data"]]
    assert w["latency_steps"] == 14 - ONSET_STEP


def test_the_watch_flags_a_slower_gpu_in_backward_by_its_work_before_its_last_gradient() -> None:
    """Rank 3's backward kernels take 30% of the step longer from step 8: every rank's backward
    ends at the same all-reduce, but rank 3's last gradient is ready that much later than its
    peers' (phases_own_device_ms), flagged by the same exchange as the data sleep above."""
    w = run(case(kind="compute", phase="backward"))
    assert w["material"] and w["flags"] == [[14, 3, "backward"]]


def test_a_clean_job_is_not_flagged() -> None:
    w = run(case(kind="clean", slow=(), phase=None, size=0.0))
    assert w["flags"] == [] and not w["false_alarm"] and w["truth"]["kind"] == "clean"


@pytest.mark.parametrize(("kind", "phase"), [("compute", "forward"), ("compute", "backward"), ("sleep", "forward")])
def test_under_fsdp_the_watch_flags_a_rank_slow_in_a_phase_of_all_gathers_by_nccl_s_durations(
    kind: str, phase: str
) -> None:
    """The same job under FSDP (FSDP2's streams, detect/sim.py): rank 3 computes or sleeps (host
    time between two layers) 30% of the step longer in forward or backward from step 8. Every
    rank's phase lasts as long (the others wait at the all-gathers), and no event splits work
    from waiting; the ranks' arrivals at the collectives, read from NCCL's durations, show it.
    A 13 ms step: NCCL's watchdog times a collective up to 100 ms after its end, ~8 steps, so
    the exchange after step 9 judges nothing (timed to step 3), the one after 14 steps 4-7, the
    one after 19 steps 8-12 (the tables hold the latest 20 steps where NCCL's timing holds steps
    back: `table_rows`): flagged there, in its phase, 11 steps after the onset."""
    w = run(case(parallel="fsdp", kind=kind, phase=phase))
    assert w["material"] and w["flags"] == [[19, 3, phase]]


def test_a_clean_fsdp_job_is_not_flagged() -> None:
    w = run(case(parallel="fsdp", kind="clean", slow=(), phase=None, size=0.0))
    assert w["flags"] == [] and not w["false_alarm"]


def test_fsdp_step_records_carry_their_phases_spans_and_no_own_work() -> None:
    """Under FSDP the gradients are not hooked (no phases_own_device_ms); each record spans its
    phases on the host's clock, which places the collectives the host issued in them."""
    c = case(parallel="fsdp", kind="clean", slow=(), phase=None, size=0.0, ranks=2)
    sim, _, _ = gen.simulate_with_truth(c, 11, c.steps)
    [(_, first), *_] = step_records(sim.truth()[0], COMPUTE_STREAM, sim.launch_latency_us, "fsdp")
    assert "phases_own_device_ms" not in first
    spans = first["phases_span_ns"]
    assert [p for p in spans] == ["data", "forward", "backward", "optimizer"]
    assert all(a <= b for a, b in spans.values())


@pytest.mark.parametrize("parallel", ["tp", "hsdp", "ep"])
@pytest.mark.parametrize(("kind", "phase"), [("compute", "forward"), ("compute", "backward"), ("sleep", "forward")])
def test_over_two_groups_the_watch_flags_the_slow_rank_not_peers_it_held(parallel: str, kind: str, phase: str) -> None:
    """16 ranks on two hosts (detect/sim.py's TP: a host's ranks one tensor-parallel group, the
    ranks at one place on both hosts a data-parallel one; HSDP: a host's ranks one shard group,
    the ranks at one place a replicate group; EP: a host's ranks one expert-parallel group, its
    all-to-alls dispatching and combining each layer's tokens), judged as FSDP is (collectives in forward and
    backward). Rank 3 computes or sleeps 30% of the step longer in forward or backward from
    step 8: its host's ranks wait for it at their group's collectives and then reach the
    cross-host all-reduces late, by its delay. Those all-reduces, whose ranks come from
    different groups' collectives, are left out (arrivals._apart), so rank 3 alone is flagged,
    by the same exchange as under FSDP (NCCL's timing holds the steps back: 11 steps after the
    onset)."""
    c = case(parallel=parallel, ranks=16, kind=kind, phase=phase)
    hosts = {r: f"node{r // 8:03d}" for r in range(c.ranks)}
    w = watch_case(c, 11, gen.simulate_with_truth, hosts, COMPUTE_STREAM)
    assert w["material"] and w["flags"] == [[19, 3, phase]]
    assert w["innocent_flagged"] == []


@pytest.mark.parametrize("parallel", ["tp", "hsdp", "ep"])
def test_a_clean_job_of_two_groups_is_not_flagged(parallel: str) -> None:
    w = run(case(parallel=parallel, ranks=16, kind="clean", slow=(), phase=None, size=0.0))
    assert w["flags"] == [] and not w["false_alarm"]


@pytest.mark.parametrize(
    ("slow", "kind", "phase"), [(3, "sleep", "forward"), (11, "compute", "forward"), (3, "compute", "backward")]
)
def test_in_a_pipeline_the_watch_flags_the_slow_stage_not_the_stages_it_held(slow: int, kind: str, phase: str) -> None:
    """16 ranks in two pipeline stages (ranks 0-7 and 8-15, rank r + 8 receiving rank r's
    activations; 1F1B over four micro-batches, detect/sim.py): a rank of either stage sleeps or
    computes 30% of the step longer in forward or backward from step 8. Its pipeline peer waits
    for it at its receives, which each rank's records hold per phase (the stream's stall after
    each receive, `receives`) and the watch takes out; forward and backward hold no collective
    (the stage's all-reduce comes after backward), so they are judged as own work, each rank
    against its own stage's. The slow rank alone is flagged, in its phase."""
    c = case(parallel="pp", ranks=16, kind=kind, slow=(slow,), phase=phase)
    w = run(c)
    assert w["material"] and {(rank, p) for _, rank, p in w["flags"]} == {(slow, phase)}, w["flags"]
    assert w["innocent_flagged"] == []


def test_a_clean_pipeline_is_not_flagged_and_its_records_say_whom_each_stage_receives_from() -> None:
    c = case(parallel="pp", ranks=16, kind="clean", slow=(), phase=None, size=0.0)
    assert run(c)["flags"] == []
    sim, _, _ = gen.simulate_with_truth(c, 11, c.steps)
    truths = sim.truth()
    [(_, first), *_] = step_records(truths[11], COMPUTE_STREAM, sim.launch_latency_us, "fsdp")
    assert first["phases_recv_from"] == {"forward": [3]}  # stage 1: activations from stage 0
    assert first["first_recv_from"] == 3  # ... which begin its step
    [(_, first), *_] = step_records(truths[3], COMPUTE_STREAM, sim.launch_latency_us, "fsdp")
    assert first["phases_recv_from"] == {"backward": [11]}  # stage 0: gradients from stage 1
    assert "first_recv_from" not in first  # stage 0 sends first
    assert first["phases_p2p_ms"]["backward"] > 0.0
