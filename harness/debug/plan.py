"""Where a capture asked for through the debug server starts: a pure rule over every rank's state.

A capture is armed on every rank by one request each, after its plan is in the job's c10d store
(`frontend.py`). So its first step must lie far enough ahead that every rank holds the plan before
it gets there, outside the steps the profiler's schedule or another capture traces, and inside the
run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# The most steps one capture may trace (a definition of "the next few steps": a window of the
# lab's default schedule is 3; each traced step adds its trace to the rank's disk and the
# profiler's memory, so a request for hundreds is a mistake, refused with this figure).
MAX_CAPTURE_STEPS = 20
# A capture starts at least this long after the request (the arming round: one store write, then
# one request to every rank's worker, ms on a LAN; fetch retries and a busy host can take a second:
# twice that), ...
ARM_LEAD_S = 2.0
# ... and at least this many steps after every rank's current one (a rank answers while its step
# runs: the step after it may already be decided by the profiler).
MIN_LEAD_STEPS = 2
# Without a known end of the run, a free start is looked for this many steps ahead at most.
SEARCH_STEPS = 10_000
# A rank needs this much free disk beyond the capture's estimated traces (the recorder's own floor
# after a full disk, profiling.RESUME_MIN_FREE_BYTES), and twice the estimate (a step's trace size
# varies with what it runs).
FREE_FLOOR_BYTES = 64 * 2**20


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """torch.profiler's wait/warmup/active/repeat schedule of a rank (repeat 0: until the end)."""

    wait: int
    warmup: int
    active: int
    repeat: int

    def traces(self, step: int) -> bool:
        """Whether the schedule warms up or records `step` (torch.profiler.schedule, steps from 0)."""
        cycle = self.wait + self.warmup + self.active
        if step < 0 or cycle <= 0:
            return False
        if self.repeat > 0 and step // cycle >= self.repeat:
            return False
        return step % cycle >= self.wait


@dataclass(frozen=True, kw_only=True)
class RankState:
    """What a rank's worker answers (`worker.LiveState.snapshot`)."""

    rank: int
    host: str
    step: int  # the step open or last closed (-1 before the first)
    last_step: int | None  # the run's last step, where its length is known
    step_ms: float | None  # median of its recent steps
    profiler: str  # what the profiler does now: off, wait, warmup or record
    schedule: Schedule | None  # None where the profiler is off
    booked: tuple[tuple[int, int], ...]  # triggered windows not finished yet: (start, last)
    debug_captures: int  # captures the debug server armed on this rank
    free_bytes: int | None  # free disk under the run folder
    trace_bytes_per_step: float | None  # the largest window written so far, per recorded step

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> RankState:
        sched = doc.get("schedule")
        return cls(
            rank=int(doc["rank"]),
            host=str(doc["host"]),
            step=int(doc["step"]),
            last_step=None if doc.get("last_step") is None else int(doc["last_step"]),
            step_ms=None if doc.get("step_ms") is None else float(doc["step_ms"]),
            profiler=str(doc["profiler"]),
            schedule=Schedule(**sched) if sched else None,
            booked=tuple((int(a), int(b)) for a, b in doc.get("booked", [])),
            debug_captures=int(doc.get("debug_captures", 0)),
            free_bytes=None if doc.get("free_bytes") is None else int(doc["free_bytes"]),
            trace_bytes_per_step=doc.get("trace_bytes_per_step"),
        )


@dataclass(frozen=True, kw_only=True)
class CapturePlan:
    """A capture every rank books: profiler warm-up from `start`, steps `first`..`last` recorded."""

    id: str
    start: int
    first: int
    last: int
    requested_at_step: int  # the latest rank's step when it was planned

    def to_doc(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "start": self.start,
            "first": self.first,
            "last": self.last,
            "requested_at_step": self.requested_at_step,
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> CapturePlan:
        return cls(
            id=str(doc["id"]),
            start=int(doc["start"]),
            first=int(doc["first"]),
            last=int(doc["last"]),
            requested_at_step=int(doc["requested_at_step"]),
        )


@dataclass(frozen=True)
class Refusal:
    """Why a capture is not started: said to the person who asked, with what to do."""

    reason: str
    status: int = 409  # HTTP: 409 the job's state forbids it now; 503 a rank did not answer
    details: list[str] = field(default_factory=list)


def first_free_start(
    earliest: int, span: int, traced: Callable[[int], bool], last_step: int | None, search: int = SEARCH_STEPS
) -> int | None:
    """The first step from `earliest` that starts `span` steps none of which is `traced`, all
    ending by `last_step` (None: unknown, then `search` steps ahead at most); None where none fits."""
    horizon = last_step if last_step is not None else earliest + search + span - 1
    start = earliest
    while start + span - 1 <= horizon:
        busy = next((s for s in range(start, start + span) if traced(s)), None)
        if busy is None:
            return start
        start = busy + 1
    return None


def lead_steps(step_ms: float) -> int:
    """Steps between the request and the capture's start: `ARM_LEAD_S` of the slowest rank's
    steps, at least `MIN_LEAD_STEPS`."""
    if step_ms <= 0:
        return MIN_LEAD_STEPS
    return max(MIN_LEAD_STEPS, math.ceil(ARM_LEAD_S * 1e3 / step_ms))


def plan_capture(
    states: Sequence[RankState], steps: int, *, warmup: int, max_captures: int, plan_id: str
) -> CapturePlan | Refusal:
    """The capture of `steps` recorded steps every rank can book, or why there is none:

    1. every rank's profiler is on (a capture is a window of it);
    2. no triggered window is booked or running on any rank (one capture at a time);
    3. fewer than `max_captures` captures were armed;
    4. every rank has finished a step (its step time sets the lead);
    5. the start is the first step from the latest rank's step + `lead_steps` of the slowest rank
       whose `warmup` + `steps` steps no rank's schedule or booked window traces, ending by the
       run's last step (`first_free_start`);
    6. every rank has `FREE_FLOOR_BYTES` free plus twice its traces' estimate for `steps` steps.
    """
    off = [s.rank for s in states if s.schedule is None or s.profiler == "off"]
    if off:
        return Refusal(
            f"the profiler is off on rank(s) {_ranks(off)}: a capture is a profiler window; "
            "start the job without --no-profile"
        )
    busy = sorted({b for s in states for b in s.booked if b[1] >= s.step})
    if busy:
        a, b = busy[0]
        return Refusal(f"a capture is booked or running on every rank: steps {a}-{b}; ask again after step {b}")
    done = max(s.debug_captures for s in states)
    if done >= max_captures:
        return Refusal(f"this run's cap of {max_captures} capture(s) is reached (--max-debug-captures)")
    idle = [s.rank for s in states if s.step < 0 or s.step_ms is None]
    if idle:
        return Refusal(f"rank(s) {_ranks(idle)} have not finished a step yet; ask again once training runs")
    latest = max(s.step for s in states)
    earliest = latest + lead_steps(max(s.step_ms or 0.0 for s in states))
    ends = [s.last_step for s in states if s.last_step is not None]
    last_step = min(ends) if ends else None

    def traced(step: int) -> bool:
        return any(
            (s.schedule is not None and s.schedule.traces(step)) or any(a <= step <= b for a, b in s.booked)
            for s in states
        )

    span = warmup + steps
    start = first_free_start(earliest, span, traced, last_step)
    if start is None:
        where = f"the run ends at step {last_step}" if last_step is not None else "the profiler's schedule traces"
        return Refusal(f"no room for {span} steps ({warmup} warm-up + {steps} recorded) from step {earliest}: {where}")
    short = []
    for s in states:
        need = FREE_FLOOR_BYTES + 2 * (s.trace_bytes_per_step or 0.0) * span
        if s.free_bytes is not None and s.free_bytes < need:
            short.append(f"rank {s.rank}: {s.free_bytes // 2**20} MiB free, {math.ceil(need / 2**20)} MiB needed")
    if short:
        return Refusal("too little free disk for the capture's traces", details=short)
    return CapturePlan(id=plan_id, start=start, first=start + warmup, last=start + span - 1, requested_at_step=latest)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
