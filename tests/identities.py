"""The accounting identities every analysis must hold, whatever the trace: checked by
tests/test_identities.py over every trace at hand and by the real-run tests on their reports.

1. each step row: compute + exposed communication + copies + idle = its span (steps.csv step_ms),
   exposed = exposed waiting + exposed transfer, and no part is negative;
2. a rank's spans follow one another without overlapping, and add up to its device's time
   (the first span's start to the last's end);
3. a rank's lateness, cost and waiting per step are at most the step;
4. each diagnosis' shares of the device's time (compute, DDP's reducer, exposed transfer,
   copies, idle) add up to 1;
5. each straggler's what-if, and all of them fixed, is no slower than the replay with nothing
   fixed.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.traces.run_analysis import Analysis

ROUNDING_MS = 1e-5  # report.json rounds times to the ns (6 decimals of ms): a sum of four is within this
SHARES = ("compute_share", "reducer_share", "exposed_transfer_share", "memcpy_share", "idle_share")


def check_report(doc: dict[str, Any]) -> None:
    """Identities 1, 3, 4 and 5 on a report.json document."""
    for row in doc["steps"]:
        parts = (row["compute_ms"], row["exposed_comm_ms"], row["memcpy_ms"], row["idle_ms"])
        assert all(p >= -ROUNDING_MS for p in parts), row
        assert sum(parts) == pytest.approx(row["step_ms"], abs=4 * ROUNDING_MS), row
        assert row["exposed_wait_ms"] + row["exposed_transfer_ms"] == pytest.approx(
            row["exposed_comm_ms"], abs=2 * ROUNDING_MS
        ), row
    # at most the step: its span on the device's timeline (step_ms; on CPU the ProfilerStep), which a
    # host running ahead of its GPU exceeds by far in its ProfilerStep (host_step_ms)
    spans: dict[int, list[float]] = {}
    for row in doc["steps"]:
        spans.setdefault(row["rank"], []).append(row["step_ms"])
        assert row["wait_ms"] <= row["step_ms"] + ROUNDING_MS, row
    for r in doc["ranks"]:
        if spans.get(r["rank"]):
            mean_ms = sum(spans[r["rank"]]) / len(spans[r["rank"]])
            assert r["late_ms"] <= mean_ms + ROUNDING_MS and r["cost_ms"] <= mean_ms + ROUNDING_MS, r
    for d in doc["diagnosis"]:
        ev = d["evidence"]
        if any(ev[k] for k in SHARES):
            assert sum(ev[k] for k in SHARES) == pytest.approx(1.0, abs=5e-4), (d["rank"], {k: ev[k] for k in SHARES})
    replayed = doc["run"].get("replayed_step_ms")
    if replayed is not None:
        for s in doc["stragglers"]:
            assert s["whatif_step_ms"] <= replayed + ROUNDING_MS, s
        fixed = doc["run"].get("whatif_all_fixed_step_ms")
        if fixed is not None:
            assert fixed <= replayed + ROUNDING_MS


def check_spans(a: Analysis) -> None:
    """Identity 2, and 3 per step, on an analysis (its ranks' step covers, before release)."""
    for t in a.traces:
        spans = [
            (s.cover.lo_us, s.cover.hi_us) for s in sorted(t.steps, key=lambda s: s.start_us) if s.cover is not None
        ]
        assert all(lo <= hi for lo, hi in spans)
        assert all(x[1] <= y[0] for x, y in zip(spans, spans[1:])), (t.rank, spans)
        if t.device == "gpu" and spans:
            rows = [o for o in a.overlap if o.rank == t.rank]
            assert sum(o.window_us for o in rows) == pytest.approx(spans[-1][1] - spans[0][0], rel=1e-9, abs=1e-3)
    res = a.stragglers
    # at most the step: its span on the device's timeline (a host running ahead only launches in its ProfilerStep)
    step_us = {
        (t.rank, s.number): s.cover.window_us if s.cover is not None else s.dur_us for t in a.traces for s in t.steps
    }
    for table in (res.step_late, res.step_cost, res.step_wait):
        for step, per_rank in table.items():
            for rank, v in per_rank.items():
                cap = step_us.get((rank, step))
                if cap is not None:
                    assert v <= cap + 1e-6, (step, rank, v, cap)
