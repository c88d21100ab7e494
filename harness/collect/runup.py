"""Each collective's run-up on its own rank: what the rank did between its previous collective
and this one. Computed once per trace at parse time (then the per-kernel intervals can be
dropped, and an in-job summary carries the same figures); read by the straggler phase
attribution. Pure functions."""

from __future__ import annotations

import bisect
from collections import defaultdict

from harness.collect.model import CommOp, Interval
from harness.collect.overlap import length, merge

IDLE = "idle (waiting on the host)"
OP_PREFIX = "op:"

Span = tuple[float, float, "int | None", str]  # (start_us, end_us, step, kernel/op name)


def set_run_ups(comms: list[CommOp], spans: list[Span], first_step_start_us: float | None) -> None:
    """Set every op's `run_up_start_us` and `run_up_us`.

    1. run-up window = [lo, hi]: hi = the op's start; lo = the latest end among the rank's
       collectives that ended by then, else the first step's start, else the op's start;
    2. run_up_us["op:<name>"] = the time compute spans of that name overlap the window;
    3. run_up_us[IDLE] = window length - the union of all compute spans inside it (the device,
       or on CPU the main thread, neither computing nor in a collective's run-up work).
    `spans` are the trace's compute intervals by kernel (GPU) or aten op (CPU) name."""
    ends = sorted(c.end_us for c in comms)
    spans = sorted(spans, key=lambda s: (s[0], s[1]))
    starts = [s[0] for s in spans]
    # Spans that overlap [lo, hi] start in [lo - longest span, hi): only those are visited.
    longest_us = max((b - a for a, b, _, _ in spans), default=0.0)
    for op in comms:
        hi = op.start_us
        i = bisect.bisect_right(ends, hi) - 1
        lo = ends[i] if i >= 0 else (first_step_start_us if first_step_start_us is not None else hi)
        by_name: dict[str, float] = defaultdict(float)
        pieces: list[Interval] = []
        for j in range(bisect.bisect_left(starts, lo - longest_us), bisect.bisect_left(starts, hi)):
            a, b, _, name = spans[j]
            if b > lo:
                x, y = max(a, lo), min(b, hi)
                by_name[OP_PREFIX + name] += y - x
                pieces.append((x, y))
        by_name[IDLE] = (hi - lo) - length(merge(pieces))
        op.run_up_start_us = lo
        op.run_up_us = dict(by_name)


def merged_by_step(spans: list[Span]) -> list[tuple[float, float, int]]:
    """The compute intervals each step owns, merged per step (what overlap reads), by start;
    intervals that belong to no step are left out."""
    by_step: dict[int, list[Interval]] = defaultdict(list)
    for a, b, st, _ in spans:
        if st is not None:
            by_step[st].append((a, b))
    out = [(a, b, st) for st, iv in by_step.items() for a, b in merge(iv)]
    out.sort(key=lambda x: (x[0], x[1]))
    return out
