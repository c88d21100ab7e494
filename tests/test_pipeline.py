"""Stragglers in pipeline-parallel jobs: a stage's ranks wait at point-to-point ops for their
neighbours by design, and for a slow neighbour beyond that; the collector names the slow rank,
not the stages its pipeline held up. Simulated GPU jobs (tests/devicesim.py), numbers worked out
by hand in the comments; the run-ups' waiting (runup.p2p_wait) exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.traces.read.discover import group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.read.runup import P2POps, p2p_wait
from harness.traces.run_analysis import Analysis, analyze

from devicesim import Sim, write_all

GEMM = "ampere_sgemm_128x64_nn"
ADAM = "void at::native::multi_tensor_apply_kernel"
PIPE = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}  # a pipeline: stage 0's rank, stage 1's
DP = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}  # a stage's ranks
RECV_PREV, RECV_NEXT, SEND_NEXT, SEND_PREV = 21, 22, 23, 24  # a stream per peer and direction
HOSTS = {0: ("node0", 0.0), 1: ("node0", 0.0), 2: ("node1", 3000.0), 3: ("node2", -2000.0)}


def pipeline_job(slow_rank: int | None, extra_us: float, steps: int = 6, batched: bool = False) -> Sim:
    """Four ranks, two pipelines of two stages (ranks 0 and 2, ranks 1 and 3), two microbatches
    a step, all forwards then all backwards (GPipe). Stage 0 per microbatch: a 1000 us forward
    GEMM, then a send of its activations to stage 1 (100 us); then per microbatch a receive of
    the gradients from stage 1 and a 2000 us backward GEMM that waits for it. Stage 1 per
    microbatch: a receive of the activations, its forward GEMM (1000 us, waits for it), its
    backward GEMM (2000 us) and a send of the gradients back. Each stage's ranks then all-reduce
    their gradients (200 us, process group 5 + stage), which the optimizer (500 us) waits for,
    and read the loss. Every receive is posted as the host gets to it, ahead of its data.
    `slow_rank`'s forward GEMMs run `extra_us` longer. `batched`: each send and receive launched
    as `batch_isend_irecv` launches it (devicesim: no args on its kernel, no record_param_comms
    around its launch)."""
    sim = Sim(world_size=4)
    for r in range(4):
        h = sim.rank(r)
        stage = PIPE[r].index(r)
        peer = PIPE[r][1 - stage]
        pipe = {"pg": str(3 + PIPE[r][0]), "ranks": PIPE[r], "batched": batched}
        for n in range(1, steps + 1):
            with h.step(n):
                last = None
                if stage == 0:
                    with h.range("forward"):
                        for _ in range(2):
                            us = 1000.0 + (extra_us if r == slow_rank else 0.0)
                            last = h.launch(GEMM, us)
                            h.p2p("send", peer, 100.0, stream=SEND_NEXT, after=last, **pipe)
                    with h.range("backward"):
                        for _ in range(2):
                            got = h.p2p("recv", peer, 100.0, stream=RECV_NEXT, **pipe)
                            last = h.launch(GEMM, 2000.0, after=got)
                else:
                    for _ in range(2):
                        with h.range("forward"):
                            got = h.p2p("recv", peer, 100.0, stream=RECV_PREV, **pipe)
                            us = 1000.0 + (extra_us if r == slow_rank else 0.0)
                            h.launch(GEMM, us, after=got)
                        with h.range("backward"):
                            last = h.launch(GEMM, 2000.0)
                            h.p2p("send", peer, 100.0, stream=SEND_PREV, after=last, **pipe)
                reduced = h.collective("allreduce", 200.0, pg=str(5 + stage), ranks=DP[r], after=last)
                with h.range("optimizer"):
                    h.launch(ADAM, 500.0, after=reduced)
                h.item()
        h.sync(kind="device")
    return sim


def analysed(tmp_path: Path, sim: Sim) -> Analysis:
    """Each rank on its host (HOSTS: stage 1's two ranks on two hosts, their clocks 3 ms and
    -2 ms off stage 0's), written and collected."""
    docs = []
    for r, doc in enumerate(sim.run()):
        host, shift = HOSTS[r]
        events = [
            dict(e, ts=e["ts"] + shift) if isinstance(e.get("ts"), (int, float)) else e for e in doc["traceEvents"]
        ]
        docs.append({**doc, "traceEvents": events, "host_name": host})
    paths = write_all(docs, tmp_path)
    return analyze(group_ranks([parse_trace(p) for p in paths]))


def test_the_slow_stage_is_named_and_not_the_stage_it_held_up(tmp_path: Path) -> None:
    """Rank 0 (stage 0) runs each forward GEMM 600 us longer. Device times from a step's start,
    rank 0 (rank 1, its stage peer, in brackets): forwards end at 1600 and 3200 (1000, 2000);
    rank 2 (stage 1) receives the activations at 1700 and 3300 (rank 3: 1100, 2100) and, each
    microbatch's backward right after its forward, sends the gradients at 4700 and 7700 (4100,
    7100), and reaches its all-reduce at 7700 (7100): 600 us late, held up at its first receive
    for 600 us more than rank 3. Rank 0 receives the gradients at 4800 and 7800 (4200, 7200) and
    reaches its all-reduce at 9800 (9200): 600 us late as well, as it arrived.
    Their waiting at the point-to-point ops (a compute gap that ends where a receive ends, from
    the later of the gap's start and that receive's, which was posted at the step's start): rank
    2 waits 1700 before its first forward (rank 3: 1100); rank 0 waits 3200..4800 and 6800..7800,
    2600 (rank 1: 2000..4200 and 6200..7200, 3200). Net of it rank 2 arrives at 6000 as rank 3
    does, on time; rank 0 at 7200 against rank 1's 6000: 1200 us late, its two forwards' 600 us.
    So rank 0 alone is a straggler, in forward; rank 2 was late only by its wait for rank 0.
    (Stage 1's hosts share no collective with stage 0's: they are aligned with each other.)"""
    a = analysed(tmp_path, pipeline_job(0, 600.0))
    s = a.stragglers
    assert s.verdict == "straggler"
    assert [(x.rank, x.phase) for x in s.stragglers] == [(0, "forward")]
    by = {x.rank: x for x in s.ranks}
    assert by[0].late_ms == pytest.approx(0.6, abs=0.01) and by[2].late_ms == pytest.approx(0.6, abs=0.01)
    assert by[0].beyond_peers_ms == pytest.approx(1.2, abs=0.01)
    assert by[2].beyond_peers_ms == pytest.approx(0.0, abs=0.01)
    assert a.offsets[3].offset_us - a.offsets[2].offset_us == pytest.approx(-5000.0, abs=1.0)
    # rank 2 is its component's reference: no sample of the clocks' noise (its 0 is by definition)
    assert a.offsets[2].samples == 0 and a.offsets[3].samples == 6 and a.offsets[1].samples == 6
    assert any("node1" in w and "shares no collective with the reference host" in w for w in a.warnings)


def test_batched_sends_and_receives_are_point_to_point_too(tmp_path: Path) -> None:
    """The same job with every send and receive launched as batch_isend_irecv launches it: a
    SendRecv kernel with no args, outside every record_param_comms op, while the all-reduces
    carry theirs. Read as all-to-alls of the default group, they were matched across all four
    ranks by position; they are batches of point-to-point ops, left unmatched, and the waiting
    at them is taken out as before: rank 0 alone, in forward, 1.2 ms beyond its peers."""
    a = analysed(tmp_path, pipeline_job(0, 600.0, batched=True))
    s = a.stragglers
    assert [(x.rank, x.phase) for x in s.stragglers] == [(0, "forward")]
    by = {x.rank: x for x in s.ranks}
    assert by[0].beyond_peers_ms == pytest.approx(1.2, abs=0.01)
    assert by[2].beyond_peers_ms == pytest.approx(0.0, abs=0.01)
    assert {w.instance.name for w in s.waits} == {"allreduce"}
    assert any(w.startswith("96 point-to-point op(s)") for w in a.warnings)


def test_a_clean_pipeline_is_balanced(tmp_path: Path) -> None:
    """The same job without the slow rank: by design stage 0 waits for the gradients and stage 1
    for the activations, alike on both pipelines; stage 1's clocks, 5 ms apart, are aligned."""
    s = analysed(tmp_path, pipeline_job(None, 0.0)).stragglers
    assert s.verdict == "balanced"
    assert max(abs(x.beyond_peers_ms) for x in s.ranks) == pytest.approx(0.0, abs=0.01)


def test_gpu_waiting_is_a_gap_that_ends_as_a_receive_ends() -> None:
    """A run-up [0, 150] with compute at [0, 10], [40, 60] and [120, 150]. Point-to-point ops: a
    send [5, 20] and a receive queued behind it [20, 40] (one stream, one peer); a receive posted
    early, [0, 140], spinning through the host-bound gap [60, 120], which ends at a launch. The gap
    [10, 40] ends where the receive ends: waiting from the send's start, within the gap: 10..40."""
    ops = P2POps([(5.0, 20.0), (20.0, 40.0), (0.0, 140.0)])
    busy_lo, busy_hi = np.array([0.0, 40.0, 120.0]), np.array([10.0, 60.0, 150.0])
    assert p2p_wait(0.0, 150.0, busy_lo, busy_hi, ops, blocking=False) == [(10.0, 40.0)]
    # A gap that ends 50 us or less after a receive ends still waited for it; 51 us, a launch.
    late = P2POps([(0.0, 30.0)])
    lo, hi = np.array([0.0, 80.0]), np.array([10.0, 100.0])
    assert p2p_wait(0.0, 100.0, lo, hi, late, blocking=False) == [(10.0, 80.0)]
    assert p2p_wait(0.0, 200.0, np.array([0.0, 81.0]), np.array([10.0, 200.0]), late, blocking=False) == []


def test_cpu_waiting_is_the_idle_inside_a_blocking_send_or_receive() -> None:
    """On CPU a gloo send or receive holds its thread: the idle inside one is waiting, wherever
    the gap ends. Run-up [0, 100], aten ops at [0, 10] and [50, 100]; a receive [20, 70]."""
    ops = P2POps([(20.0, 70.0)])
    lo, hi = np.array([0.0, 50.0]), np.array([10.0, 100.0])
    assert p2p_wait(0.0, 100.0, lo, hi, ops, blocking=True) == [(20.0, 50.0)]


def test_a_stage_s_waiting_survives_its_in_job_summary(tmp_path: Path) -> None:
    """The run-ups' waiting is parsed once, at the rank: an in-job summary carries it
    (CommOp.p2p_wait_us), and the collector reads the same straggler from the summaries."""
    from harness.paths import summary_path
    from harness.traces.read.summary import read_summary, write_summary

    sim = pipeline_job(0, 600.0)
    paths = write_all(sim.run(), tmp_path)
    parsed = [parse_trace(p) for p in paths]
    assert any(c.p2p_wait_us > 0 for t in parsed for c in t.comms)
    back = [read_summary(write_summary(t, summary_path(p))) for t, p in zip(parsed, paths)]
    for b, t in zip(back, parsed):
        b.paths = t.paths
        assert b == t
    s = analyze(group_ranks(back)).stragglers
    assert [(x.rank, x.phase) for x in s.stragglers] == [(0, "forward")]
