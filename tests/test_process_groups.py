"""Stragglers in jobs of several process groups (tensor parallelism inside a host, data
parallelism across hosts; HSDP's shard and replicate groups have the same shape), on simulated
GPU jobs (tests/devicesim.py) with exact answers worked out by hand in the comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.traces.read.discover import group_ranks
from harness.traces.read.gloo_groups import unnamed_groups
from harness.traces.read.parse import parse_trace
from harness.traces.run_analysis import Analysis, analyze

from devicesim import COMM_STREAM, Sim, write_all

GEMM = "ampere_sgemm_128x64_nn"
ADAM = "void at::native::multi_tensor_apply_kernel"
TP = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}  # a host's two ranks
DP = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}  # one rank of each host


def tp_dp_job(slow_rank: int, phase: str, extra_us: float, steps: int = 6) -> Sim:
    """Four ranks on two hosts (two ranks each), every step on each rank: forward, a 1000 us GEMM
    and an all-reduce over its host's ranks (tensor parallelism, 100 us transfer, process group
    1 + host), which backward's 1000 us GEMM waits for; its own tensor-parallel all-reduce, then
    the gradients' all-reduce over the ranks at its place on both hosts (data parallelism, 200
    us, process group 3 + place, on its own stream), which the optimizer's 500 us kernel waits
    for. `slow_rank`'s GEMM in `phase` runs `extra_us` longer every step. The loss is read at
    each step's end, so the hosts wait for their devices: every step starts together."""
    sim = Sim(world_size=4)
    for r in range(4):
        h = sim.rank(r)
        host, place = divmod(r, 2)
        for n in range(1, steps + 1):
            with h.step(n):
                reduced = None
                for name in ("forward", "backward"):
                    with h.range(name):
                        us = 1000.0 + (extra_us if r == slow_rank and name == phase else 0.0)
                        last = h.launch(GEMM, us, after=reduced)
                        reduced = h.collective("allreduce", 100.0, pg=str(1 + host), ranks=TP[r], after=last)
                reduced = h.collective(
                    "allreduce", 200.0, pg=str(3 + place), ranks=DP[r], after=reduced, stream=COMM_STREAM + 1
                )
                with h.range("optimizer"):
                    h.launch(ADAM, 500.0, after=reduced)
                h.item()
        h.sync(kind="device")
    return sim


def analysed(tmp_path: Path, sim: Sim) -> Analysis:
    paths = write_all(sim.run(), tmp_path)
    return analyze(group_ranks([parse_trace(p) for p in paths]))


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_a_slow_rank_is_named_and_not_its_tensor_parallel_peer_it_held(tmp_path: Path, phase: str) -> None:
    """Rank 1's GEMM in `phase` runs 600 us longer (the clean step is 2900 us of device work:
    21%). It reaches its host's all-reduce after it 600 us after rank 0, which waits for it;
    rank 0 then reaches its data-parallel all-reduce (with rank 2) 600 us after rank 2, as rank
    1 does with rank 3. Rank 0's lateness there is the hold, not its own: both left their
    tensor-parallel all-reduces at its end, and their run-ups from there to the data-parallel
    one (the hand-over alone) are alike. So rank 1 alone is late, by 600 us a step, in
    `phase`; counted against the data-parallel peers' arrivals, rank 0 was as late as rank 1."""
    a = analysed(tmp_path, tp_dp_job(1, phase, 600.0))
    s = a.stragglers
    assert s.verdict == "straggler"
    assert [(x.rank, x.phase) for x in s.stragglers] == [(1, phase)]
    late = {x.rank: x.late_ms for x in s.ranks}
    assert late[1] == pytest.approx(0.6, abs=0.005)
    assert late[0] == pytest.approx(0.0, abs=0.005) and late[2] == late[3] == pytest.approx(0.0, abs=0.005)


def test_a_clean_job_of_two_process_groups_is_balanced(tmp_path: Path) -> None:
    s = analysed(tmp_path, tp_dp_job(1, "forward", 0.0)).stragglers
    assert s.verdict == "balanced"
    assert max(x.late_ms for x in s.ranks) == pytest.approx(0.0, abs=0.005)


@pytest.mark.parametrize("parallel", ["tp", "hsdp", "ep", "pp"])
def test_a_generated_job_of_two_groups_names_the_slow_rank_alone(tmp_path: Path, parallel: str) -> None:
    """The detection campaign's TP, HSDP and EP jobs (bench/detect/sim.py: 16 ranks, tensor
    parallelism, FSDP's sharding or experts' all-to-alls inside each host of 8, data parallelism
    or replication across the two, 1% jitter, clock skew between hosts): rank 3 computes 30% of
    the step longer in forward. Its seven host peers wait for it at their group's collectives
    and reach the cross-host all-reduces late; the collector names rank 3 alone, in forward, and
    rank right and phase right score it so. The PP job (two stages, a host each, 1F1B over four
    microbatches, each stage's ranks all-reducing their gradients): rank 11, the second stage of
    rank 3's pipeline, waits for its activations and reaches its stage's all-reduce late; its
    waiting at the receives is taken out (tests/test_pipeline.py), and rank 3 alone is named."""
    from test_gpu_watch_sim import case, gen  # the watch's generated job; it puts bench/ on the path

    c = case(ranks=16, skew_ms=2.0, kind="compute", phase="forward", parallel=parallel)
    row = gen.run_case(c, 11, tmp_path)
    assert row["seen"]["stragglers"] == {"3": "forward"}
    assert row["outcome"]["found"] and row["outcome"]["rank_right"] and row["outcome"]["phase_right"]


def test_groups_a_trace_cannot_tell_apart_are_those_smaller_than_the_world_but_the_harness_s() -> None:
    """distributedInfo's pg_config as torch writes it on rank 0 of the tensor-parallel example:
    the world's default group and the harness's watch group hold every rank; the others do not."""
    info = {
        "pg_config": [
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
            {"pg_name": "3", "pg_desc": "undefined", "pg_size": 2, "ranks": [2, 0]},
            {"pg_name": "1", "pg_desc": "undefined", "pg_size": 2, "ranks": [0, 1]},
            {"pg_name": "5", "pg_desc": "harness_watch", "pg_size": 2, "ranks": [0, 1]},
        ]
    }
    assert unnamed_groups(info, 4) == [[0, 1], [0, 2]]
    assert unnamed_groups(info, None) == [] and unnamed_groups(None, 4) == []


def test_a_release_read_a_hair_after_the_next_start_is_still_the_release(tmp_path: Path) -> None:
    """A clean generated HSDP job (16 ranks, 2% jitter, hosts' clocks up to 5 ms apart; noise seed
    17): each replicate all-reduce starts where its rank's reduce-scatter ends, but on a shifted
    clock rank 14's end reads a float's rounding after that start. Taken as ended after it, rank
    14's release was the all-gather before, a layer's kernels earlier, and it was named in
    backward; within runup.HANDOVER_US it is the reduce-scatter, and the job is balanced."""
    from test_gpu_watch_sim import case, gen

    c = case(ranks=16, skew_ms=5.0, kind="clean", slow=(), phase=None, size=0.0, parallel="hsdp", jitter=0.02)
    row = gen.run_case(c, 17, tmp_path)
    assert row["seen"]["verdict"] == "balanced" and row["seen"]["stragglers"] == {}


def test_a_ring_of_sends_and_receives_is_not_matched_as_a_collective(tmp_path: Path) -> None:
    """Three GPU ranks pass a block around a ring each step (context parallelism's shape): rank r
    receives from r - 1 and sends to r + 1, posting its receive 300 us x r into the step (its own
    schedule, no one late), then all-reduce together. Every rank's first op of the group is a
    receive, its second a send: matched by position, they were 'collectives' the ranks reached
    300 us apart, and rank 0 was named a straggler 0.6 ms late a step. Each goes to one peer:
    not matched (said in a warning), and the all-reduces, where everyone arrives together, say
    the job is balanced."""
    from tracebuild import GpuRank, document, run_analysis, step

    docs = []
    for r in range(3):
        g, events = GpuRank(), []
        for n in range(1, 7):
            t = (n - 1) * 3000.0
            events.append(step(n, t, 3000.0))
            args = {"Process Group Name": "0", "In msg nelems": 1000, "Out msg nelems": 1000, "Group size": 3}
            ring = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
            g.kernel(ring, t + 10, t + 100 + 300 * r, 200, **{"Collective name": "recv", **args})
            g.kernel(ring, t + 20, t + 400 + 300 * r, 200, **{"Collective name": "send", **args})
            g.kernel("volta_sgemm_128x64_nn", t + 30, t + 1200, 800)
            g.allreduce(t + 40, t + 2000, 300)
        docs.append(document(events + g.events, r, world_size=3))
    a = run_analysis(tmp_path, docs)
    assert a.stragglers.verdict == "balanced", [(x.rank, x.late_ms) for x in a.stragglers.ranks]
    assert {i.name for i in a.instances} == {"allreduce"}
    assert any(w.startswith("36 point-to-point op(s) (send, recv) not matched across ranks") for w in a.warnings)


def ddp_job(slow_rank: int, phase: str, extra_us: float, steps: int = 6) -> Sim:
    """Two ranks, one data-parallel group, every step on each rank: data (300 us of host work in
    a cpu op, then a blocking 100 us copy to the device), forward (a 1000 us GEMM), backward (a
    1000 us GEMM, then the gradients' all-reduce, 200 us, on the communication stream after it),
    optimizer (a 500 us kernel after the all-reduce); the loss is read at each step's end.
    `slow_rank`'s work in `phase` (the host's in data, the kernel's elsewhere) takes `extra_us`
    longer every step."""
    sim = Sim(world_size=2)
    for r in range(2):
        h = sim.rank(r)
        for n in range(1, steps + 1):

            def more(name: str, r: int = r) -> float:
                return extra_us if r == slow_rank and name == phase else 0.0

            with h.step(n):
                with h.range("data"):
                    h.cpu(300.0 + more("data"), "aten::index_select")
                    h.to_device(100.0)
                with h.range("forward"):
                    h.launch(GEMM, 1000.0 + more("forward"))
                with h.range("backward"):
                    grads = h.launch(GEMM, 1000.0 + more("backward"))
                    reduced = h.collective("allreduce", 200.0, after=grads)
                with h.range("optimizer"):
                    h.launch(ADAM, 500.0 + more("optimizer"), after=reduced)
                h.item()
        h.sync(kind="device")
    return sim


@pytest.mark.parametrize("phase", ["data", "forward", "backward", "optimizer"])
def test_a_ddp_rank_slow_in_each_phase_is_named_with_that_phase(tmp_path: Path, phase: str) -> None:
    """Rank 1 takes 800 us longer in `phase` every step (about a third of its 2.9 ms of work).
    The all-reduce of each step starts when rank 1's backward GEMM is done: in data, forward
    and backward that is 800 us after rank 0's, directly; the optimizer's longer kernel delays
    the loss read that ends its step, so its next step starts 800 us later and its next
    all-reduce too. So rank 1 is late 800 us a step at every all-reduce it reaches late, in
    `phase`, and rank 0 waits for it. (The mode x wrapper x phase matrix of real CPU runs this
    replaces kept one real run per phase: test_collect_runs.py.)"""
    a = analysed(tmp_path, ddp_job(1, phase, 800.0))
    s = a.stragglers
    assert s.verdict == "straggler"
    assert [(r.rank, r.phase) for r in s.stragglers] == [(1, phase)]
    late = s.stragglers[0]
    # the optimizer's delay shows from the next step on: 5 of the 6 steps, a mean of 5/6 x 800 us
    late_steps = 5 if phase == "optimizer" else 6
    assert late.steps_late == late_steps and late.late_ms == pytest.approx(0.8 * late_steps / 6, abs=1e-3)
