"""The live watch on pipeline-parallel jobs (watch_rule.stages, point_to_point_phases and the
waiting at point-to-point ops taken out): exact tables of two pipelines of two stages, ranks 0
and 1 stage 0, ranks 2 and 3 stage 1 (rank r + 2 receives rank r's activations), each stage's
ranks all-reducing their gradients at backward's end on a group of their own. The real gloo runs
are in tests/test_api.py."""

from __future__ import annotations

import torch

from harness.traces.analyse.noise import SHARED_CPU
from harness.watch.arrivals import HeldArrivals
from harness.watch.rule import (
    COLLECTIVE_PHASES,
    judge_interval,
    own_work_phases,
    pack_rows,
    stages,
    step_row,
    watch_thresholds,
)

MS = 1_000_000  # ns
STEPS = range(10, 16)
STAGE_GROUP = {0: "s0", 1: "s0", 2: "s1", 3: "s1"}


def job(
    forward_ms: list[float],
    backward_ms: list[float],
    forward_p2p_ms: list[float],
    backward_p2p_ms: list[float],
    sources: bool = True,
) -> tuple[torch.Tensor, HeldArrivals]:
    """Every step alike: data 1 ms, forward and backward as given per rank (wall time, of it
    the waits given at point-to-point ops; CPU time 10 ms in each: the sleeps and waits are off
    the core), optimizer 2 ms; each rank issues its stage's
    all-reduce 1 ms before backward's end. Steps start 1 s apart on one clock."""
    rows, spans, arrived = [], [], []
    for r in range(4):
        mine_rows, mine_spans, mine_arrivals = [], {}, []
        for step in STEPS:
            t0 = step * 1000.0
            fwd_end = t0 + 1 + forward_ms[r]
            bwd_end = fwd_end + backward_ms[r]
            record = {
                "step": step,
                "step_ms": 1 + forward_ms[r] + backward_ms[r] + 2,
                "phases_ms": {"data": 1.0, "forward": forward_ms[r], "backward": backward_ms[r], "optimizer": 2.0},
                "phases_cpu_ms": {"data": 1.0, "forward": 10.0, "backward": 10.0, "optimizer": 2.0},
                "phases_p2p_ms": {"forward": forward_p2p_ms[r], "backward": backward_p2p_ms[r]},
            }
            if r >= 2 and sources:  # stage 1 begins each step receiving stage 0's activations
                record["first_recv_from"] = r - 2
            mine_rows.append(step_row(record))
            mine_spans[step] = {
                "forward": [int((t0 + 1) * MS), int(fwd_end * MS)],
                "backward": [int(fwd_end * MS), int(bwd_end * MS)],
            }
            issued = int((bwd_end - 1) * MS)
            mine_arrivals.append((step, "backward", STAGE_GROUP[r], step, issued, issued))
        rows.append(pack_rows(mine_rows, len(STEPS)))
        spans.append(mine_spans)
        arrived.append(mine_arrivals)
    arrivals = HeldArrivals(spans_ns=spans, arrivals=arrived, offsets_ns=[0.0] * 4)
    return torch.stack(rows), arrivals


def judge(tables: torch.Tensor, arrivals: HeldArrivals | None):
    return judge_interval(
        tables,
        {},
        own_work_phases("fsdp"),
        noise=SHARED_CPU,
        th=watch_thresholds(),
        held_phases=COLLECTIVE_PHASES["fsdp"],
        arrivals=arrivals,
    )


def test_a_rank_s_place_in_the_pipeline_follows_where_its_activations_come_from() -> None:
    nan = float("nan")
    assert stages(torch.tensor([[nan, nan], [nan, nan], [0.0, 0.0], [nan, 1.0]])) == [0, 0, 1, 1]
    assert stages(torch.tensor([[nan], [0.0], [1.0], [2.0]])) == [0, 1, 2, 3]  # four stages
    assert stages(torch.tensor([[nan], [nan]])) == [0, 0]  # no pipeline: one group
    # interleaved: the last stage feeds the first's next chunk, a cycle; a source not in the job
    assert stages(torch.tensor([[1.0], [0.0], [7.0], [nan]])) == [-1, -1, -1, 0]


def test_a_stage_slow_in_forward_is_named_not_the_stage_it_holds_up() -> None:
    """Rank 0 sleeps 60 ms in forward. Rank 2 waits those 60 ms at its receive (62 ms of waits,
    2 ms its usual) and enters backward and its stage's all-reduce 60 ms after rank 3. Forward
    holds no collective: its wall time less the waits is own work there, 70 ms on rank 0 and 10
    on every other. Backward: each rank enters 60 ms late against its own stage's punctual rank
    (rank 0 after rank 1, rank 2 after rank 3) and adds nothing there."""
    tables, arrivals = job([70, 10, 72, 12], [20, 20, 20, 20], [0, 0, 62, 2], [0, 0, 0, 0])
    v = judge(tables, arrivals)
    assert [round(r.late_ms, 6) for r in v.ranks] == [60.0, 0.0, 0.0, 0.0]
    assert [(s.rank, s.phase) for s in v.stragglers] == [(0, "forward")]
    # without the arrivals no phase is known to hold no collective: forward is judged by CPU time
    assert judge(tables, None).stragglers == []


def test_a_stage_slow_in_backward_is_named_not_the_stage_waiting_for_its_gradients() -> None:
    """Rank 2 sleeps 60 ms in backward: it reaches its stage's all-reduce 60 ms after rank 3.
    Rank 0 waits those 60 ms at its receive of the gradients and reaches its own stage's
    all-reduce 60 ms after rank 1: its waiting beyond rank 1's is taken out."""
    tables, arrivals = job([10, 10, 10, 10], [80, 20, 80, 20], [0, 0, 0, 0], [60, 0, 0, 0])
    v = judge(tables, arrivals)
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 0.0, 60.0, 0.0]
    assert [(s.rank, s.phase) for s in v.stragglers] == [(2, "backward")]


def test_a_rank_held_off_its_core_in_backward_is_late_as_a_sleeping_one() -> None:
    """Ranks 1 and 2 each reach their stage's all-reduce 8 ms after their stage peer (one
    waiting for a core, one asleep: neither is CPU time): both are late by those 8 ms, as the
    collector judges them (a rank other work keeps off its cores is late)."""
    tables, arrivals = job([10, 10, 10, 10], [20, 28, 28, 20], [0, 0, 0, 0], [0, 0, 0, 0])
    v = judge(tables, arrivals)
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 8.0, 8.0, 0.0]


def test_a_heavier_stage_is_not_late_against_the_lighter_one() -> None:
    """Stage 1 computes its forward 10 ms longer (its loss and head): by design, not a
    straggler; against its own stage's ranks it is late by nothing. Judged as one group (no
    sources), ranks 2 and 3 are 10 ms late."""
    tables, arrivals = job([10, 10, 22, 22], [20, 20, 20, 20], [0, 0, 2, 2], [0, 0, 0, 0])
    assert [round(r.late_ms, 6) for r in judge(tables, arrivals).ranks] == [0.0, 0.0, 0.0, 0.0]
    tables, arrivals = job([10, 10, 22, 22], [20, 20, 20, 20], [0, 0, 2, 2], [0, 0, 0, 0], sources=False)
    assert [round(r.late_ms, 6) for r in judge(tables, arrivals).ranks] == [0.0, 0.0, 10.0, 10.0]


def test_the_wait_at_a_collective_in_a_phase_of_own_work_is_not_own_work() -> None:
    """No pipeline, DDP: rank 1 sleeps 30 ms in data; every rank all-reduces its loss in the
    optimizer phase (waited on from Python: phases_collective_wait_ms), where the other three
    wait those 30 ms for it. Rank 1 alone is late, in data; before the waits were taken out,
    the other three were as late, in optimizer, and no one stood out."""
    rows = []
    for r in range(4):
        mine = []
        for step in STEPS:
            record = {
                "step": step,
                "step_ms": 63.0,
                "phases_ms": {"data": 31.0 if r == 1 else 1.0, "forward": 10.0, "backward": 20.0},
                "phases_cpu_ms": {"data": 1.0, "forward": 10.0, "backward": 10.0, "optimizer": 2.0},
                "phases_collective_wait_ms": {"optimizer": 0.0 if r == 1 else 30.0},
            }
            record["phases_ms"]["optimizer"] = 2.0 + record["phases_collective_wait_ms"]["optimizer"]
            mine.append(step_row(record))
        rows.append(pack_rows(mine, len(STEPS)))
    v = judge_interval(
        torch.stack(rows),
        {},
        own_work_phases("ddp"),
        noise=SHARED_CPU,
        th=watch_thresholds(),
        held_phases=COLLECTIVE_PHASES["ddp"],
    )
    assert [round(r.late_ms, 6) for r in v.ranks] == [0.0, 30.0, 0.0, 0.0]
    assert [(s.rank, s.phase) for s in v.stragglers] == [(1, "data")]
