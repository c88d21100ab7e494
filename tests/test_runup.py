"""Run-ups and per-step merged compute over numpy columns (runup.py) against the plain loops they
replaced, kept here as the oracle: the same numbers to the last bit, the same name order, on
generated intervals (nested, overlapping, touching, outside every step, zero-length)."""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.collect.model import CommOp
from harness.collect.overlap import length, merge
from harness.collect.runup import IDLE, OP_PREFIX, Spans, merged_by_step, merged_pieces, set_run_ups

NAMES = ["aten::mm", "aten::add", "k1", "k2"]
TIME = st.one_of(st.integers(0, 400).map(float), st.floats(0, 400, allow_nan=False))
SPAN = st.tuples(TIME, st.one_of(st.just(0.0), TIME), st.one_of(st.none(), st.integers(0, 3)),
                 st.integers(0, len(NAMES) - 1))


def _spans(rows: list[tuple[float, float, int | None, int]]) -> Spans:
    spans = Spans(NAMES)
    for start, d, step, name in rows:
        spans.add(start, start + d, step, name)
    return spans


def _run_ups_by_loop(comms: list[tuple[float, float]], rows: list, first: float | None) -> list[tuple[float, dict]]:
    """The loop runup.set_run_ups replaced (spans as (start, end, step, name) tuples)."""
    ends = sorted(b for _, b in comms)
    spans = sorted(((a, a + d, st, NAMES[n]) for a, d, st, n in rows), key=lambda s: (s[0], s[1]))
    starts = [s[0] for s in spans]
    longest = max((b - a for a, b, _, _ in spans), default=0.0)
    out = []
    for hi, _ in comms:
        i = bisect.bisect_right(ends, hi) - 1
        lo = ends[i] if i >= 0 else (first if first is not None else hi)
        by_name: dict[str, float] = defaultdict(float)
        pieces = []
        for j in range(bisect.bisect_left(starts, lo - longest), bisect.bisect_left(starts, hi)):
            a, b, _, name = spans[j]
            if b > lo:
                x, y = max(a, lo), min(b, hi)
                by_name[OP_PREFIX + name] += y - x
                pieces.append((x, y))
        by_name[IDLE] = (hi - lo) - length(merge(pieces))
        out.append((lo, dict(by_name)))
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=st.lists(SPAN, max_size=40), comms=st.lists(st.tuples(TIME, TIME), max_size=6),
       first=st.one_of(st.none(), TIME))
@example(rows=[(0.0, 10.0, 0, 0)], comms=[(5.0, 5.0), (20.0, 1.0)], first=None)  # a span ending where a window opens
def test_run_ups_match_the_loop(rows: list, comms: list, first: float | None):
    ops = [CommOp(name="allreduce", pg="0", start_us=a, end_us=a + d) for a, d in comms]
    set_run_ups(ops, _spans(rows), first)
    expected = _run_ups_by_loop([(a, a + d) for a, d in comms], rows, first)
    assert [(op.run_up_start_us, op.run_up_us) for op in ops] == expected
    assert [list(op.run_up_us) for op in ops] == [list(e) for _, e in expected]  # same name order


@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=st.lists(SPAN, max_size=40))
def test_merged_by_step_matches_the_loop(rows: list):
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for a, d, step, _ in rows:
        if step is not None:
            by_step[step].append((a, a + d))
    expected = sorted(((a, b, st) for st, iv in by_step.items() for a, b in merge(iv)), key=lambda x: (x[0], x[1]))
    assert merged_by_step(_spans(rows)) == expected


@settings(max_examples=300, deadline=None, derandomize=True)
@given(intervals=st.lists(st.tuples(TIME, TIME), max_size=30))
def test_merged_pieces_is_the_union(intervals: list):
    ordered = sorted((a, a + d) for a, d in intervals)
    x, y = np.array([a for a, _ in ordered]), np.array([b for _, b in ordered])
    starts, ends = merged_pieces(x, y)
    assert list(zip(starts.tolist(), ends.tolist())) == merge(ordered)
