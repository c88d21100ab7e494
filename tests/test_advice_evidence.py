"""Advice that checks its own evidence, and the 2026 trace format, on simulated GPU jobs
(tests/devicesim.py) and hand-built traces: a busy device is never launch-bound, a CUDA-graph step
is not either, advice never prescribes what the trace shows the job already does, compiled graphs'
phases are named by what every rank shares, and CUDA's sync rows are no device work."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.traces.analyse.advisor import ADVICE, REMEDIES, Diagnosis, advice_for, diagnose, judged_with_peers
from harness.traces.read.discover import group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.read.phases import step_phases
from harness.traces.read.practices import practices_in
from harness.traces.run_analysis import Analysis, analyze

from devicesim import Sim, write_all
from tracebuild import GpuRank, document, step, write, x

GEMM = "ampere_sgemm_128x64_nn"


def analysed(tmp_path: Path, docs: list[dict]) -> Analysis:
    return analyze(group_ranks([parse_trace(p) for p in write_all(docs, tmp_path)]))


def test_a_busy_device_with_many_ops_is_not_launch_bound(tmp_path: Path) -> None:
    # 1200 host ops of 2 us a step, each launching a 12 us GEMM: the host issues a step in
    # 1200 x (2 + 5) = 8.4 ms, the device runs 14.4 ms of work back to back behind it (busy
    # ~100%). The ops take ~12 us of step time each, under the 20 us an eager op's dispatch costs:
    # read on the op count alone, that was launch-bound.
    sim = Sim(world_size=1)
    h = sim.rank(0)
    for n in range(1, 5):
        with h.step(n):
            for _ in range(1200):
                h.cpu(2.0, "aten::mm")
                h.launch(GEMM, 12.0)
    h.sync(kind="device")
    [d] = diagnose(analysed(tmp_path, sim.run()))
    ev = d.evidence
    assert ev["host_ops_per_step"] >= 1000 and ev["us_per_op"] < 20
    assert ev["idle_share"] < 0.01
    assert d.bottleneck == "healthy", d.reason
    assert "GPU-bound: the device is busy 100% of its time" in d.reason


def graph_job() -> Sim:
    """One rank, 4 steps: each copies its inputs (20 us of host work), replays a CUDA graph of 300
    compiled kernels of 30 us (9 ms of device work, one launch), and syncs its stream at the end,
    with CUDA's "Stream Sync" rows on the stream's sync thread (2026)."""
    sim = Sim(world_size=1, sync_rows=True)
    h = sim.rank(0)
    for n in range(1, 5):
        with h.step(n):
            h.cpu(20.0, "aten::copy_")
            h.graph([("triton_poi_fused_add_mul_0", 30.0)] * 300)
            h.sync()
    return sim


def test_a_cuda_graph_step_is_not_launch_bound_and_no_advice_repeats_it(tmp_path: Path) -> None:
    sim = graph_job()
    docs = sim.run()
    assert sum(e.get("cat") == "cuda_sync" for e in docs[0]["traceEvents"]) == 4
    a = analysed(tmp_path, docs)
    [trace] = a.traces
    assert trace.practices == ["torch.compile", "CUDA graphs"]
    [d] = diagnose(a)
    assert d.bottleneck != "launch-bound", d.reason
    assert d.evidence["launches_per_step"] == 1.0
    # the sync rows are host waits, not device work: each step's compute is its 300 x 30 us
    truth = sim.truth()[0]
    assert all(op.start_us is not None for op in truth.ops) and len(truth.ops) == 1200
    for o in a.overlap:
        assert o.compute_us == pytest.approx(9000.0)
    text = advice_for("launch-bound", d.evidence)
    assert "torch.compile (fusion)" not in text and "CUDA graphs, a larger batch" not in text
    assert "it already runs torch.compile" in text and "it already replays CUDA graphs" in text


def test_a_stall_every_rank_shares_is_no_noise_on_a_gpu_job(tmp_path: Path) -> None:
    """4 ranks, 6 steps of a GEMM then an all-reduce, the GEMM 0, 4, 1, 230, 3 and 0 ms longer in
    steps 1-6 on every rank alike (step 4: a stall they share), rank 3's host 3 ms late into each
    step's forward. Each rank's own work alone swings by a MAD of ~2 ms (a bound of ~6 ms that
    called rank 3 balanced); each step's shared part out, nothing swings: rank 3 is named, and
    step 4 is said to be a stall all ranks shared."""
    common = [0.0, 4000.0, 1000.0, 230_000.0, 3000.0, 0.0]
    sim = Sim(world_size=4)
    for r in range(4):
        h = sim.rank(r)
        for n in range(1, 7):
            with h.step(n):
                with h.range("## forward ##"):
                    if r == 3:
                        h.sleep(3000.0)
                    g = h.launch(GEMM, 10_000.0 + common[n - 1])
                h.collective("allreduce", 200.0, after=g)
                h.sync()
    a = analysed(tmp_path, sim.run())
    assert [s.rank for s in a.stragglers.stragglers] == [3]
    assert a.stragglers.bounds_ms["jitter"] == pytest.approx(0.0, abs=1e-6)
    [stall] = [w for w in a.warnings if "a stall they all shared" in w]
    assert stall.startswith("step 4 was ")


def test_advice_leaves_out_what_the_job_already_does() -> None:
    ev = {"practices": ["torch.compile", "fused optimizer"]}
    text = advice_for("launch-bound", ev)  # type: ignore[arg-type]
    assert "torch.compile (fusion)" not in text and "fused optimizers" not in text
    assert "CUDA graphs" in text and "graph breaks" in text
    text = advice_for("kernel-bound", {"practices": ["torch.compile", "bf16"]})  # type: ignore[arg-type]
    assert "fuse them" not in text and "bf16" not in text and "graph breaks" in text
    # with nothing in use, each is the advice as it always read
    for kind in REMEDIES:
        assert advice_for(kind, {"practices": []}) == ADVICE[kind]  # type: ignore[arg-type]


def test_practices_are_read_from_names() -> None:
    assert practices_in(["aten::mm", "ampere_sgemm_128x64_nn"]) == []
    assert practices_in(["## Call CompiledFxGraph fksa2i3a ##", "aten::_fused_adamw_", "ampere_bf16_s16816gemm"]) == [
        "torch.compile",
        "fused optimizer",
        "bf16",
    ]
    assert practices_in(["aten::_foreach_add_", "cudaGraphLaunch"]) == ["CUDA graphs", "foreach optimizer"]


def test_compiled_graphs_are_named_by_their_place_in_the_step() -> None:
    ranges = [
        (0.0, 10.0, "## Call CompiledFxGraph fksa2i3a ##"),
        (10.0, 20.0, "## backward ##"),
        (12.0, 14.0, "## Call CompiledFxGraph zz9 ##"),  # inside backward: backward is the phase
        (20.0, 30.0, "## Call CompiledFxGraph q7x ##"),
    ]
    assert step_phases(ranges) == [
        (0.0, 10.0, "compiled graph 1"),
        (10.0, 20.0, "## backward ##"),
        (20.0, 30.0, "compiled graph 2"),
    ]


def test_a_slow_compiled_graph_is_a_phase_its_peers_have(tmp_path: Path) -> None:
    # 2 ranks, 4 steps: two compiled graphs (hashes differ by rank), then an all-reduce; rank 1's
    # second graph runs 3 ms longer: it is late in `compiled graph 2`, a phase rank 0 has too
    docs = []
    for rank in (0, 1):
        g, events = GpuRank(), []
        for n in range(1, 5):
            t = (n - 1) * 20_000.0
            events.append(step(n, t, 20_000.0))
            slow = 3000.0 if rank == 1 else 0.0
            events.append(x(f"## Call CompiledFxGraph a{rank}b ##", "user_annotation", t + 1, 4000))
            g.kernel(GEMM, t + 2, t + 10, 4000)
            events.append(x(f"## Call CompiledFxGraph c{rank}d ##", "user_annotation", t + 4002, 4000 + slow))
            g.kernel(GEMM, t + 4003, t + 4010, 4000 + slow)
            g.allreduce(t + 8100 + slow, t + 8010 + slow, 12_000 - 8010 - slow + 3000 + 500)
        docs.append(document(events + g.events, rank))
    paths = [write(tmp_path / f"rank{r}.pt.trace.json.gz", d) for r, d in enumerate(docs)]
    a = analyze(group_ranks([parse_trace(p) for p in paths]))
    for t in a.traces:
        assert sorted(t.steps[0].phases_us) == ["compiled graph 1", "compiled graph 2"]
    [s] = a.stragglers.stragglers
    assert (s.rank, s.phase) == (1, "compiled graph 2")


def _diagnosis(rank: int, kind: str, ratio: float, idle: float = 0.3) -> Diagnosis:
    ev = {"op_cost_ratio": ratio, "idle_share": idle, "host_ops_per_step": 2000.0, "step_ms": 10.0, "practices": []}
    return Diagnosis(rank=rank, host="h", bottleneck=kind, reason="r", evidence=ev, advice="a", waits_for=[])  # type: ignore[arg-type]


def test_no_verdict_flips_on_a_threshold_between_ranks_whose_figures_agree() -> None:
    # three ranks just under the launch-bound op cost (39x a bare op), one just over it: its
    # figures are within the ranks' spread (41 against 34-37), so it is judged as they are
    out = judged_with_peers(
        [_diagnosis(0, "launch-bound", 34), _diagnosis(1, "launch-bound", 36), _diagnosis(2, "launch-bound", 37)]
        + [_diagnosis(3, "healthy", 41)]
    )
    assert [d.bottleneck for d in out] == ["launch-bound"] * 4
    assert (
        out[3].reason.startswith("judged as most ranks (launch-bound)")
        and "on its own figures alone: healthy" in out[3].reason
    )
    assert out[3].advice == ADVICE["launch-bound"]
    # a rank whose figures stand out keeps its own verdict; so do two ranks alone, and no majority
    out = judged_with_peers([_diagnosis(r, "launch-bound", 35 + r) for r in range(3)] + [_diagnosis(3, "healthy", 140)])
    assert out[3].bottleneck == "healthy"
    assert (
        judged_with_peers([_diagnosis(0, "launch-bound", 37), _diagnosis(1, "healthy", 41)])[1].bottleneck == "healthy"
    )
    split = [_diagnosis(0, "launch-bound", 37), _diagnosis(1, "healthy", 41), _diagnosis(2, "host-bound", 39)]
    assert [d.bottleneck for d in judged_with_peers(split)] == ["launch-bound", "healthy", "host-bound"]
