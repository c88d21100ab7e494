"""Profiler windows that open a few collectives apart on different ranks (tests/devicesim.py): the
ranks that reach the window's first step early still have the step before's collectives queued
on their device, which the window holds without their launch. Matching must pair every
collective with itself, with or without the trace's own sequence numbers (`Seq`), and what it
leaves out is counted. Exact answers come from the simulator's truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.traces.align.matching import MAX_SHIFT, sequence_shift
from harness.traces.model import CommOp
from harness.traces.read.discover import InputError, group_ranks
from harness.traces.read.parse import parse_trace
from harness.traces.run_analysis import Analysis, analyze

from devicesim import Sim, open_window, write_all

GEMM = "ampere_sgemm_128x64_nn"
SLEEP_US = 5000.0  # rank 2's host, in forward, every step
FIRST, LAST = 3, 6  # the window's steps, of 1-7


def job(seq_args: bool = False, main_base: int = 1000, start_us: float = 0.0) -> Sim:
    """4 ranks, 7 steps. Per step: read the loss of the step before (a wait on its first
    all-reduce), forward (rank 2's host sleeps SLEEP_US first; a 2 ms GEMM, an all-reduce),
    backward (a 2 ms GEMM, an all-reduce, an all-to-all). The punctual ranks' hosts enter each step
    as soon as the step before's first all-reduce ends, with its backward collectives still
    queued behind rank 2: their windows hold those at the front, without their launch."""
    sim = Sim(world_size=4, seq_args=seq_args, main_base=main_base)
    for r in range(4):
        h = sim.rank(r, start_us=start_us)
        loss = None
        for n in range(1, 8):
            with h.step(n):
                if loss is not None:
                    h.sync(kind="event", on=loss)
                with h.range("## forward ##"):
                    if r == 2:
                        h.sleep(SLEEP_US)
                    loss = h.collective("allreduce", 100.0, after=h.launch(GEMM, 2000.0))
                with h.range("## backward ##"):
                    b = h.collective("allreduce", 100.0, nelems=4000, after=h.launch(GEMM, 2000.0))
                    h.collective("alltoall", 100.0, nelems=8000, after=b)
        h.sync(kind="device")
    return sim


def collected(tmp_path: Path, sim: Sim) -> Analysis:
    docs = [open_window(d, FIRST, LAST) for d in sim.run()]
    return analyze(group_ranks([parse_trace(p) for p in write_all(docs, tmp_path)]))


def truth_by_end(sim: Sim) -> dict[tuple[int, float], tuple[str, int]]:
    """(rank, kernel end) -> (process group, position in the group) of every collective."""
    return {(t.rank, op.end_us): (op.pg, op.seq) for t in sim.truth() for op in t.ops if op.seq is not None}


def before_window(sim: Sim, rank: int) -> int:
    """Collectives launched before rank's window opened that started inside it (by the truth)."""
    t = sim.truth()[rank]
    opened = next(s.start_us for s in t.steps if s.number == FIRST)
    return sum(1 for op in t.ops if op.seq is not None and op.launch_us < opened <= op.start_us)


@pytest.mark.parametrize("seq_args", [False, True])
def test_offset_windows_pair_every_collective_with_itself(tmp_path: Path, seq_args: bool) -> None:
    sim = job(seq_args=seq_args)
    a = collected(tmp_path, sim)
    held = [before_window(sim, r) for r in range(4)]
    # the scenario does what it is for: the punctual ranks' windows hold more of the step before
    assert held[0] == held[1] == held[3] > held[2]
    truth = truth_by_end(sim)
    # every instance is one collective of the truth on all four ranks, and every collective
    # launched in the window's steps is matched: 3 a step, steps 3-6
    assert len(a.instances) == 3 * (LAST - FIRST + 1)
    for inst in a.instances:
        assert len(inst.ops) == 4
        assert len({truth[(r, op.end_us)] for r, op in inst.ops.items()}) == 1
    assert all((inst.key[1] == "seq") == seq_args for inst in a.instances)
    # the waits are the truth's: each rank waits from its kernel's start to the latest start
    for w in a.waits:
        latest = max(w.arrival_us.values())
        for r, arrival in w.arrival_us.items():
            assert w.wait_us[r] == pytest.approx(latest - arrival)
    assert [s.rank for s in a.stragglers.stragglers] == [2]
    # what was left out is said, with the truth's counts
    said = next(w for w in a.warnings if "launched before the trace's window opened, or its record lost" in w)
    assert said.startswith("rank(s) 0, 1, 2, 3:" if held[2] else "rank(s) 0, 1, 3:")
    for r in range(4):
        lone = [c for t in a.traces if t.rank == r for c in t.comms if not c.launched]
        assert len(lone) == held[r]


def test_the_replay_reproduces_the_offset_windows_step(tmp_path: Path) -> None:
    a = collected(tmp_path, job())
    s = a.stragglers
    assert s.replay_faithful
    assert s.replayed_step_ms == pytest.approx(s.measured_step_ms, rel=0.10)


def op(name: str, end_us: float, step: int | None = 1, nelems: int | None = None) -> CommOp:
    return CommOp(name=name, pg="0", start_us=end_us - 10.0, end_us=end_us, step=step, nelems=nelems)


def test_sequence_shift_follows_the_ends_that_agree() -> None:
    # the same allreduce every ~1000 us (steps jitter by a few us); rank b's clock 40 us ahead, its
    # window two ops later: only the shift of 2 lines the jitter up
    jitter = [0.0, 7.0, 2.0, 11.0, 5.0, 1.0, 9.0, 4.0]
    ref = [op("allreduce", 1000.0 * k + jitter[k]) for k in range(8)]
    b = [op("allreduce", 1000.0 * k + 40.0 + jitter[k]) for k in range(2, 8)]
    assert sequence_shift(ref, b, by_steps=False) == -2
    assert sequence_shift(b, ref, by_steps=False) == 2
    # names that disagree at every shift but one decide alone
    ref = [op(n, 100.0 * k) for k, n in enumerate(["allreduce", "alltoall", "allgather", "allreduce"])]
    assert sequence_shift(ref, ref[1:], by_steps=False) == -1
    # steps that disagree rule a shift out
    ref = [op("allreduce", 100.0, step=1), op("allreduce", 200.0, step=2)]
    assert sequence_shift(ref, [op("allreduce", 205.0, step=2)], by_steps=True) == -1
    # no agreeing shift: 0 (and matching leaves the pairs that differ out)
    assert sequence_shift([op("allreduce", 1.0)], [op("alltoall", 1.0)], by_steps=False) == 0
    assert MAX_SHIFT >= 8  # the most seen on real jobs


def test_two_runs_of_one_job_are_refused_and_picked(tmp_path: Path) -> None:
    first = [parse_trace(p) for p in write_all(job().run(), tmp_path / "a")]
    second = [parse_trace(p) for p in write_all(job(main_base=5000, start_us=3e8).run(), tmp_path / "b")]
    with pytest.raises(InputError) as e:
        group_ranks(first + second)
    text = str(e.value)
    assert "2 runs of one job" in text and "pid(s) 1000-1003" in text and "pid(s) 5000-5003" in text
    assert "--run N" in text
    picked = group_ranks(first + second, run=2)
    assert {t.pid for t in picked.ranks} == {5000, 5001, 5002, 5003}
    assert any("analysing run 2" in w for w in picked.warnings)
    with pytest.raises(InputError, match="--run 3: the inputs hold 2 run"):
        group_ranks(first + second, run=3)
    # one run's windows (one process per rank) are one run, as before
    assert len(group_ranks(first).ranks) == 4


def test_numbers_as_strings_and_missing_keys_match_alike(tmp_path: Path) -> None:
    # the 2026 format writes numbers where strings were and drops keys; older traces the reverse:
    # rank 1's sizes and sequence numbers as strings, rank 0's dtype gone, the same collectives
    sim = job(seq_args=True)
    docs = [open_window(d, FIRST, LAST) for d in sim.run()]
    for e in docs[1]["traceEvents"]:
        args = e.get("args", {})
        for key in ("In msg nelems", "Out msg nelems", "Seq"):
            if key in args:
                args[key] = str(args[key])
    for e in docs[0]["traceEvents"]:
        e.get("args", {}).pop("dtype", None)
    a = analyze(group_ranks([parse_trace(p) for p in write_all(docs, tmp_path)]))
    assert len(a.instances) == 3 * (LAST - FIRST + 1)
    assert all(inst.key[1] == "seq" and len(inst.ops) == 4 for inst in a.instances)
