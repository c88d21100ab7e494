"""Run-ups and per-step merged compute over numpy columns (runup.py), and CPU self times
(parse._self_times), against plain loops over every interval, kept here as the oracle: the same
numbers to the last bit, the same key order, on generated intervals (nested, overlapping,
touching, outside every step, zero-length)."""

from __future__ import annotations

import bisect
import os
from array import array
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.paths import STEP_PHASES
from harness.traces.analyse.overlap import length, union
from harness.traces.model import CommOp, Step
from harness.traces.read.parse import COMM_OP, DDP_REDUCER, REDUCER_PREFIX, _self_times, _StepIndex
from harness.traces.read.phases import is_model
from harness.traces.read.runup import IDLE, OP_PREFIX, Spans, merged_by_step, merged_pieces, set_run_ups

NAMES = ["aten::mm", "aten::add", "k1", "k2"]
TIME = st.one_of(st.integers(0, 400).map(float), st.floats(0, 400, allow_nan=False))
SPAN = st.tuples(
    TIME, st.one_of(st.just(0.0), TIME), st.one_of(st.none(), st.integers(0, 3)), st.integers(0, len(NAMES) - 1)
)


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
        by_name[IDLE] = (hi - lo) - length(union(pieces))
        out.append((lo, dict(by_name)))
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    rows=st.lists(SPAN, max_size=40),
    comms=st.lists(st.tuples(TIME, TIME), max_size=6),
    first=st.one_of(st.none(), TIME),
)
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
    by_step: dict[int | None, list[tuple[float, float]]] = defaultdict(list)
    for a, d, step, _ in rows:  # those of no step too: they keep the device busy in whatever span they fall
        by_step[step].append((a, a + d))
    expected = sorted(((a, b, st) for st, iv in by_step.items() for a, b in union(iv)), key=lambda x: (x[0], x[1]))
    assert merged_by_step(_spans(rows)) == expected


@settings(max_examples=300, deadline=None, derandomize=True)
@given(intervals=st.lists(st.tuples(TIME, TIME), max_size=30))
def test_merged_pieces_is_the_union(intervals: list):
    ordered = sorted((a, a + d) for a, d in intervals)
    x, y = np.array([a for a, _ in ordered]), np.array([b for _, b in ordered])
    starts, ends = merged_pieces(x, y)
    assert list(zip(starts.tolist(), ends.tolist())) == union(ordered)


def _self_times_by_loop(
    ts: list[float], dur: list[float], name: list[int], names: list[str], steps: list[Step]
) -> list[dict[str, float]]:
    """The stack walk parse._self_times replaced, kept as the oracle."""
    comm = [bool(COMM_OP.match(n)) for n in names]
    reducer = [n.startswith(REDUCER_PREFIX) for n in names]
    starts = [s.start_us for s in steps]
    outside = [[(a, b) for p, a, b in s.phase_spans if not is_model(p)] for s in steps]
    out: list[dict[str, float]] = [{} for _ in steps]
    order = sorted(range(len(ts)), key=lambda i: (ts[i], -dur[i]))
    k, stack = -1, []
    for i in order:
        t, d, n = ts[i], dur[i], name[i]
        while stack and stack[-1][0] <= t:
            stack.pop()
        inside = (stack and stack[-1][2] == DDP_REDUCER) or reducer[n]
        key = DDP_REDUCER if inside else names[n]
        while k + 1 < len(starts) and starts[k + 1] <= t:
            k += 1
        if k >= 0 and t <= steps[k].end_us and not any(a <= t <= b for a, b in outside[k]):
            by_name = out[k]
            if not comm[n]:
                by_name[key] = by_name.get(key, 0.0) + d
            if stack and not stack[-1][1]:
                by_name[stack[-1][2]] = by_name.get(stack[-1][2], 0.0) - d
        stack.append((t + d, comm[n], key))
    return out


OP_NAMES = ["aten::mm", "aten::add", "c10d::allreduce_", REDUCER_PREFIX + "copy_grad_to_bucket", "aten::mul"]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 60).map(float), st.integers(0, 30).map(float), st.integers(0, len(OP_NAMES) - 1)),
        max_size=40,
    ),
    phases=st.lists(
        st.tuples(
            st.sampled_from(["data", "optimizer", "forward"]),
            st.integers(0, 1),
            st.integers(0, 25).map(float),
            st.integers(0, 10).map(float),
        ),
        max_size=4,
    ),
)
def test_self_times_match_the_loop(ops: list, phases: list):
    """Nested, overlapping and equal ops; two steps with data/optimizer/forward phases."""
    ops.sort(key=lambda o: o[0])  # the main thread's columns come by start
    steps = [Step(number=7, start_us=0.0, end_us=30.0), Step(number=9, start_us=30.0, end_us=55.0)]
    for p, j, a, d in phases:
        steps[j].phase_spans.append(
            (STEP_PHASES[0] if p == "data" else p, steps[j].start_us + a, steps[j].start_us + a + d)
        )
    main = SimpleNamespace(
        ts=array("d", [o[0] for o in ops]), dur=array("d", [o[1] for o in ops]), name=array("i", [o[2] for o in ops])
    )
    expected = _self_times_by_loop(list(main.ts), list(main.dur), list(main.name), OP_NAMES, steps)
    _self_times(main, OP_NAMES, _StepIndex(steps), {s.number: s for s in steps})
    assert [s.compute_by_name_us for s in steps] == expected
    assert [list(s.compute_by_name_us) for s in steps] == [list(e) for e in expected]  # same key order


@contextmanager
def _native_env(value: str) -> Iterator[None]:
    """HARNESS_NATIVE_SCAN set to `value` for a block, then as it was (hypothesis runs many
    examples per test, so pytest's per-test monkeypatch does not fit)."""
    from harness.traces.native import ALL_ENV

    before = os.environ.get(ALL_ENV)
    os.environ[ALL_ENV] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[ALL_ENV]
        else:
            os.environ[ALL_ENV] = before


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 40).map(float), st.just(float("nan"))),
            st.one_of(st.integers(0, 20).map(float), st.just(float("nan"))),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_native_nest_matches_the_python_walk(rows: list):
    """host_ops.nest natively (_nest.c) and in Python: same parents and flags, NaN ends included."""

    from harness.traces import native
    from harness.traces.read.host_ops import nest

    if native.function("nest") is None:
        pytest.skip("the native extension is not built: nothing to compare")
    starts = np.array([r[0] for r in rows], dtype=np.float64)
    ends = starts + np.array([r[1] for r in rows], dtype=np.float64)
    own = np.array([r[2] for r in rows], dtype=bool)
    native = nest(starts, ends, own)
    with _native_env("0"):
        python = nest(starts, ends, own)
    assert native[0].tolist() == python[0].tolist()
    assert native[1].tolist() == python[1].tolist()


def test_native_nest_reads_and_writes_at_any_alignment():
    """Fuzz finding (launch/sanitize.sh): nest read its doubles and wrote its int64 parents through
    pointers into the caller's buffers, misaligned where those are memoryview slices (undefined
    behaviour, UBSan's report); it goes through memcpy now, with the same answers."""
    from harness.traces import native

    nest = native.function("nest")
    if nest is None:
        pytest.skip("the native extension is not built")
    data = (Path(__file__).parent / "data" / "fuzz" / "regress-nest-misaligned.bin").read_bytes()
    starts, ends, own = data[:24], data[24:48], data[48:]  # 3 intervals: [1, 2) three times; own 255, 0, 0

    def shifted(raw: bytes, by: int) -> memoryview:
        return memoryview(bytearray(by) + raw)[by:]

    parent, flag = bytearray(25), bytearray(3)  # the parents written from byte 1
    nest(np.frombuffer(starts), np.frombuffer(ends), np.frombuffer(own, dtype=np.uint8), memoryview(parent)[1:], flag)
    assert np.frombuffer(bytes(parent[1:]), dtype=np.int64).tolist() == [-1, 0, 1] and list(flag) == [1, 1, 1]
    parents, flags = np.empty(3, dtype=np.int64), np.empty(3, dtype=bool)
    nest(shifted(starts, 1), shifted(ends, 3), shifted(own, 1), parents, flags)
    assert parents.tolist() == [-1, 0, 1] and flags.tolist() == [True, True, True]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(times=st.lists(st.one_of(TIME, st.just(float("nan"))), max_size=30), nan_step=st.integers(0, 2))
def test_step_positions_give_at_s_answers(times: list, nan_step: int):
    """_StepIndex.at_each (numpy search) and at (bisection) agree, also when a step's start is
    NaN (a ProfilerStep with "ts": "nan"), where bisection and searchsorted part ways."""
    from harness.traces.read.runup import NO_STEP

    steps = [
        Step(number=1, start_us=0.0, end_us=100.0),
        Step(number=2, start_us=150.0, end_us=250.0),
        Step(number=3, start_us=260.0, end_us=400.0),
    ]
    for nan in (False, True):
        if nan:
            steps[nan_step] = Step(number=steps[nan_step].number, start_us=float("nan"), end_us=float("nan"))
        index = _StepIndex(steps)
        expected = [NO_STEP if (n := index.at(t)) is None else n for t in times]
        assert index.at_each(np.array(times, dtype=np.float64)).tolist() == expected


def _device_work_by_loop(kernels: list, launches: dict[int, float], steps: list[Step], names: list[str]):
    """The per-kernel loop parse._device_work replaced: (spans rows, compute_by_name_us per step)."""
    index = _StepIndex(steps)
    by_number = {s.number: s for s in steps}
    rows, by_step = [], [dict() for _ in steps]
    for t, d, n, corr in kernels:
        launched = launches.get(corr, t) if corr >= 0 else t
        step = index.at(launched)
        rows.append((t, t + d, -1 if step is None else step, n))
        if step is not None and not any(
            a <= launched <= b for p, a, b in by_number[step].phase_spans if not is_model(p)
        ):
            by_name = by_step[steps.index(by_number[step])]
            by_name[names[n]] = by_name.get(names[n], 0.0) + d
    return rows, by_step


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    kernels=st.lists(st.tuples(TIME, TIME, st.integers(0, 2), st.integers(-1, 12)), max_size=40),
    launch=st.lists(st.tuples(st.integers(-1, 12), TIME), max_size=12),
    phases=st.lists(
        st.tuples(
            st.sampled_from(["data", "optimizer", "forward"]),
            st.integers(0, 1),
            st.integers(0, 25).map(float),
            st.integers(0, 10).map(float),
        ),
        max_size=4,
    ),
)
def test_device_work_matches_the_loop(kernels: list, launch: list, phases: list):
    """Kernels launched in, between and outside two steps, by ids found, missing, negative and
    reused (the last launch of an id counts), with data/optimizer/forward phases."""
    from harness.traces.read.decode import Columns
    from harness.traces.read.parse import _device_work, _LaunchTimes

    names = ["k0", "k1", "k2"]
    kernels.sort(key=lambda k: k[0])
    steps = [Step(number=4, start_us=0.0, end_us=30.0), Step(number=5, start_us=30.0, end_us=55.0)]
    for p, j, a, d in phases:
        steps[j].phase_spans.append(
            (STEP_PHASES[0] if p == "data" else p, steps[j].start_us + a, steps[j].start_us + a + d)
        )
    launches = Columns()
    for corr, ts in launch:
        launches.corr.append(corr), launches.ts.append(ts), launches.dur.append(1.0)
        launches.name.append(0), launches.thread.append(0), launches.extra.append(-1)
    doc = SimpleNamespace(kernels=Columns(), names=names, args=[], threads=[(1, 1)])
    for t, d, n, corr in kernels:
        for col, v in zip(
            (
                doc.kernels.ts,
                doc.kernels.dur,
                doc.kernels.name,
                doc.kernels.corr,
                doc.kernels.thread,
                doc.kernels.extra,
            ),
            (t, d, n, corr, 0, -1),
        ):
            col.append(v)
    last = {corr: ts for corr, ts in launch if corr >= 0}  # the last launch of a reused id
    expected_rows, expected = _device_work_by_loop(kernels, last, steps, names)
    spans = Spans(names)
    assert (
        _device_work(
            doc, _StepIndex(steps), _LaunchTimes(launches), spans, None, [], "t", np.zeros(len(names), dtype=bool)
        )
        == []
    )
    assert list(zip(spans.start_us, spans.end_us, spans.step, spans.name)) == expected_rows
    assert [s.compute_by_name_us for s in steps] == expected
    assert [list(s.compute_by_name_us) for s in steps] == [list(e) for e in expected]
