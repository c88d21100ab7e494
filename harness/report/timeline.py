"""`timeline.json`: the merged multi-rank timeline at phase and collective level.

What the HTML view draws as one lane per rank; kernel-level detail stays in
`merged.pt.trace.json.gz`. Schema (version 1), times in ms from `origin_us`, which is a point
on the aligned clock of merged.pt.trace.json.gz (so t_merged_us = origin_us + t_ms * 1e3):

- `ranks`: [{rank, host, steps: [[step, start_ms, end_ms]], phases: [[phase, step, start_ms,
  end_ms]], collectives: [[name, step, start_ms, end_ms, wait_ms, last_rank]]}]; wait_ms and
  last_rank are null for an op not matched on another rank.
- `steps_shown` / `steps_total`: long runs are cut to the first steps that fit `MAX_ITEMS`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.traces.run_analysis import Analysis

SCHEMA_VERSION = 1
MAX_ITEMS = 60_000  # bars in the browser: beyond this Plotly's drawing and zooming get slow


def _kept_steps(a: Analysis) -> tuple[set[int], int]:
    """The earliest steps whose phases and collectives, over all ranks, fit MAX_ITEMS."""
    items: Counter[int] = Counter()
    for t in a.traces:
        for s in t.steps:
            items[s.number] += 1 + len(s.phase_spans)
        for c in t.comms:
            if c.step is not None:
                items[c.step] += 1
    kept: set[int] = set()
    total = 0
    for step in sorted(items):
        total += items[step]
        if total > MAX_ITEMS and kept:
            break
        kept.add(step)
    return kept, len(items)


def build_timeline(a: Analysis) -> dict[str, Any]:
    """1. keep the earliest steps that fit MAX_ITEMS; 2. origin = the earliest kept step start
    over all ranks (aligned clocks); 3. per rank, its steps and harness phase spans from the
    aligned traces; 4. per matched collective instance and rank (waits.py): its interval on the
    aligned clock, wait = last arrival - own arrival, and the last arriver; 5. the rank's comms that
    matched no other rank, with no wait."""
    kept, total = _kept_steps(a)
    starts = [s.start_us for t in a.traces for s in t.steps if s.number in kept]
    origin = min(starts) if starts else min((c.start_us for t in a.traces for c in t.comms), default=0.0)

    def ms(us: float) -> float:
        return round((us - origin) / 1e3, 4)

    matched: dict[int, list[list[Any]]] = {t.rank: [] for t in a.traces}
    seen: set[tuple[int, str, int]] = set()
    for w in a.waits:
        if w.step is not None and w.step not in kept:
            continue
        for r, op in w.instance.ops.items():
            seen.add((r, op.pg, op.seq))
            matched[r].append(
                [w.name, w.step, ms(w.arrival_us[r]), ms(w.end_us[r]), round(w.wait_us[r] / 1e3, 4), w.last_rank]
            )
    lanes = []
    for t in sorted(a.traces, key=lambda t: t.rank):
        steps = [s for s in t.steps if s.number in kept]
        colls = matched[t.rank] + [
            [c.name, c.step, ms(c.start_us), ms(c.end_us), None, None]
            for c in t.comms
            if (t.rank, c.pg, c.seq) not in seen and (c.step is None or c.step in kept)
        ]
        lanes.append(
            {
                "rank": t.rank,
                "host": t.host,
                "steps": [[s.number, ms(s.start_us), ms(s.end_us)] for s in steps],
                "phases": [[p, s.number, ms(lo), ms(hi)] for s in steps for p, lo, hi in s.phase_spans],
                "collectives": sorted(colls, key=lambda c: c[2]),
            }
        )
    return {
        "schema_version": SCHEMA_VERSION,
        "origin_us": origin,
        "unit": "ms",
        "ranks": lanes,
        "steps_shown": len(kept),
        "steps_total": total,
    }
