"""Where a capture asked for through the debug server starts (harness/debug/plan.py): exact answers."""

from __future__ import annotations

import pytest
from torch.profiler import ProfilerAction, schedule

from harness.debug.plan import (
    FREE_FLOOR_BYTES,
    MIN_LEAD_STEPS,
    CapturePlan,
    RankState,
    Refusal,
    Schedule,
    first_free_start,
    lead_steps,
    plan_capture,
)

LAB = Schedule(wait=5, warmup=2, active=3, repeat=1)  # the lab's default: steps 5-9 traced


def state(rank: int, step: int, **kw: object) -> RankState:
    fields: dict[str, object] = {
        "rank": rank,
        "host": "vm",
        "step": step,
        "last_step": 999,
        "step_ms": 100.0,
        "profiler": "wait",
        "schedule": LAB,
        "booked": (),
        "debug_captures": 0,
        "free_bytes": 10 * 2**30,
        "trace_bytes_per_step": 2**20,
    }
    fields.update(kw)
    return RankState(**fields)  # type: ignore[arg-type]


def plan(states: list[RankState], steps: int = 3) -> CapturePlan | Refusal:
    return plan_capture(states, steps, warmup=2, max_captures=2, plan_id="p")


@pytest.mark.parametrize(
    "sched", [LAB, Schedule(wait=1, warmup=1, active=2, repeat=0), Schedule(wait=0, warmup=1, active=1, repeat=3)]
)
def test_schedule_is_torchs(sched: Schedule) -> None:
    torch_sched = schedule(wait=sched.wait, warmup=sched.warmup, active=sched.active, repeat=sched.repeat)
    assert [sched.traces(s) for s in range(40)] == [torch_sched(s) != ProfilerAction.NONE for s in range(40)]


def test_the_start_leaves_two_seconds_of_the_slowest_ranks_steps() -> None:
    # 100 ms and 250 ms steps: 2 s is 8 of the slower's; the latest rank is at step 40
    got = plan([state(0, 38), state(1, 40, step_ms=250.0)])
    assert got == CapturePlan(id="p", start=48, first=50, last=52, requested_at_step=40)
    assert lead_steps(2000.0) == MIN_LEAD_STEPS  # slow steps: two steps still


def test_the_start_skips_the_schedules_and_booked_windows() -> None:
    # earliest start 2 + 20 = 22 with 100 ms steps; a window booked at 20-26 pushes it past 26 ...
    booked = plan([state(0, 2, booked=((20, 26),)), state(1, 2)])
    assert isinstance(booked, Refusal) and "steps 20-26" in booked.reason  # ... but one capture at a time
    # the schedule traces 5-9 of a cycle of 10, every cycle (repeat 0): 5 free steps from 10 fit exactly
    every = Schedule(wait=5, warmup=2, active=3, repeat=0)
    got = plan([state(0, 2, schedule=every), state(1, 2, schedule=every)])
    assert isinstance(got, CapturePlan) and (got.start, got.last) == (30, 34)
    assert first_free_start(22, 5, every.traces, None) == 30
    assert first_free_start(22, 6, every.traces, None) is None  # 6 never fit in a gap of 5
    assert first_free_start(0, 3, lambda s: False, 1) is None  # the run ends first


def test_refusals_say_why() -> None:
    cases = {
        "profiler is off on rank(s) 1": [state(0, 5), state(1, 5, profiler="off", schedule=None)],
        "cap of 2": [state(0, 5, debug_captures=2), state(1, 5)],
        "rank(s) 0 have not finished a step": [state(0, -1, step_ms=None), state(1, 0)],
        "the run ends at step 30": [state(0, 25, last_step=30), state(1, 25, last_step=30)],
        "too little free disk": [state(0, 5), state(1, 5, free_bytes=FREE_FLOOR_BYTES)],
    }
    for words, states in cases.items():
        got = plan(states)
        assert isinstance(got, Refusal) and words in got.reason, (words, got)
    assert plan([state(0, 5), state(1, 5, free_bytes=FREE_FLOOR_BYTES)]).details == [  # type: ignore[union-attr]
        "rank 1: 64 MiB free, 74 MiB needed"
    ]


def test_a_finished_capture_does_not_block_the_next() -> None:
    got = plan([state(0, 40, booked=((20, 26),)), state(1, 40, booked=((20, 26),))])
    assert isinstance(got, CapturePlan) and got.start == 60


def test_a_state_reads_back_from_its_document() -> None:
    doc = {
        "rank": 1,
        "host": "n1",
        "step": 7,
        "last_step": None,
        "step_ms": 3.5,
        "profiler": "record",
        "schedule": {"wait": 5, "warmup": 2, "active": 3, "repeat": 1},
        "booked": [[20, 24]],
        "debug_captures": 1,
        "free_bytes": 5,
        "trace_bytes_per_step": None,
    }
    s = RankState.from_doc(doc)
    assert (s.rank, s.schedule, s.booked, s.last_step) == (1, LAB, ((20, 24),), None)
    assert CapturePlan.from_doc(CapturePlan(id="x", start=1, first=3, last=5, requested_at_step=0).to_doc()).last == 5
