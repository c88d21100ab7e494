"""The native merged-trace rewriter (harness/traces/native/_rewrite.c) against the Python loop it
accelerates (merged._Mover.events): every block gives the same events (compared as parsed JSON:
numbers may be spelled differently, never valued differently), the same new thread numbers and
the same count, on the real traces in tests/data/traces and on generated events of every odd
shape; what it declines leaves no trace of having been tried; the collector's merged trace is
the same with it and without it."""

from __future__ import annotations

import gzip
import json
import math
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_native_scan import NUMBER, ODD, REAL, TEXT

from harness.collect.command import main as collect_main
from harness.report import merged
from harness.traces.analyse.overlap import union
from harness.traces.native import ALL_ENV, extension
from harness.traces.read.decode import decode_trace, open_trace

from jobs import REAL_TRACES

built = pytest.mark.skipif(extension is None, reason="the native code is not built (no C compiler)")


def _movers(spans: list[tuple[float, float]] | None, shift: float, rank: int = 3) -> tuple[merged._Mover, ...]:
    job = merged._RankJob(rank=rank, paths=[], blocks={}, shift_us=shift, spans_us=spans)
    python, native = merged._Mover(job), merged._Mover(job)
    python.native, native.native = False, True
    return python, native


def _events(out: bytes) -> list[Any]:
    assert out == b"" or out.startswith(b",\n")
    return json.loads(b"[" + out[2:] + b"]") if out else []


def _rewrite(mover: merged._Mover, block: bytes) -> Any:
    """The native rewriter's own answer for a block (None: declined), on the mover's state."""
    return extension.rewrite(
        block,
        0,
        len(block),
        mover.rank,
        mover.shift,
        mover.starts,
        mover.ends,
        mover.tids,
        lambda key: merged._ENCODE(mover._new_thread(key)),
    )


def _same(
    blocks: list[bytes], spans: list[tuple[float, float]] | None, shift: float, labels: tuple[dict, dict] = ({}, {})
) -> list[bool]:
    """Both ways over the blocks in order; asserts the same output, threads and count; returns
    which blocks the native rewriter accepted."""
    python, native = _movers(spans, shift)
    python.procs, python.threads = native.procs, native.threads = labels
    accepted = []
    for block in blocks:
        before = dict(native.tids)
        got = _rewrite(native, block)
        accepted.append(got is not None)
        if got is None:  # declined: nothing of the attempt is left, and the block goes through Python
            assert native.tids == before
            native.events(merged._decode_block(block))
        else:
            native.kept += got[1]
        expected = python.events(merged._decode_block(block))
        if got is not None:
            assert _events(got[0]) == _events(expected)
        assert native.tids == python.tids and native.kept == python.kept
    return accepted


def _blocks(path: Path) -> list[bytes]:
    trace = decode_trace(path)
    with open_trace(path) as fh:
        return [merged._read(fh, b) for b in trace.blocks]


def _window(path: Path) -> list[tuple[float, float]]:
    """Two spans inside the trace's time: its second fifth and its fourth."""
    trace = decode_trace(path)
    lo, span = trace.first_ts, trace.last_end - trace.first_ts
    return [(lo + span * 0.2, lo + span * 0.4), (lo + span * 0.6, lo + span * 0.8)]


@built
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:40])
def test_real_traces_rewrite_the_same(path: Path):
    blocks = _blocks(path)
    for spans, shift in ((None, 0.0), (_window(path), 1234.5678901), (_window(path), -0.25)):
        accepted = _same(blocks, spans, shift)
        assert all(accepted), "a clean real trace is rewritten natively, block after block"


PHASES = ["X", "X", "X", "i", "I", "C", "s", "t", "f", "b", "e", "n", "M", "B", "E", "P"]
CLEAN = {
    "ph": st.sampled_from(PHASES),
    "cat": st.sampled_from(["cpu_op", "kernel", "ac2g"]),
    "name": st.sampled_from(["aten::mm", "ProfilerStep#3", "ncclKernel_AllReduce"]),
    "ts": st.one_of(
        st.integers(0, 2000), st.floats(0, 2000), st.integers(1_690_000_000_000_000, 1_700_000_000_000_000)
    ),
    "dur": st.one_of(st.integers(0, 500), st.floats(0, 500)),
    "pid": st.one_of(st.integers(-3, 3), st.just("Spans")),
    "tid": st.one_of(st.integers(0, 2**40), st.just("stream 7")),
    "id": st.one_of(st.integers(-5, 10**6), st.just("0x1f")),
    "args": st.dictionaries(st.just("External id"), st.integers(0, 9)),
    "bp": st.just("e"),
    "tts": st.integers(0, 9),
    "s": st.just("t"),
    "cname": st.just("good"),
    "unknown": st.one_of(st.integers(), TEXT),
}
ODD_FIELD = {
    "ph": st.one_of(ODD, st.sampled_from(["X\u00e9", "XX", "bc", "x", ""])),
    "ts": st.one_of(ODD, NUMBER, st.just("12.5")),
    "dur": st.one_of(ODD, NUMBER),
    "pid": st.one_of(st.integers(0, 2**70), ODD, st.just(1.0)),
    "tid": st.one_of(ODD, st.just(2.5)),
    "id": st.one_of(ODD, st.just(1.5), st.integers(2**64, 2**70)),
}
FIELD = {k: st.one_of(*[v] * 7, ODD_FIELD.get(k, v)) for k, v in CLEAN.items()}
REQUIRED = ("ph", "pid", "tid")  # (a missing pid or tid is declined: no real event lacks them)
EVENT = st.one_of(
    st.fixed_dictionaries(
        {k: FIELD[k] for k in REQUIRED}, optional={k: v for k, v in FIELD.items() if k not in REQUIRED}
    ),
    st.fixed_dictionaries({}, optional=FIELD),
)


def _block(events: list[Any], style: int) -> bytes:
    """The events as a block's bytes (comma-separated, no brackets): compact, indented, with
    \\u escapes, or with an escaped key."""
    if style == 0:
        text = json.dumps(events, separators=(",", ":"), ensure_ascii=False)
    elif style == 1:
        text = json.dumps(events, indent=1)
    else:
        text = json.dumps(events)
        if style == 3:
            text = text.replace('"ts"', '"\\u0074s"', 1)
    return text.strip()[1:-1].encode()


@built
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(st.lists(EVENT, max_size=8), min_size=1, max_size=6),
    style=st.integers(0, 3),
    spans=st.one_of(st.none(), st.lists(st.tuples(st.floats(0, 2000), st.floats(0, 300)), max_size=4)),
    shift=st.one_of(st.floats(-1e6, 1e6), st.sampled_from([0.0, 0.125, -3.0])),
)
def test_generated_blocks_rewrite_the_same(chunks: list[list[Any]], style: int, spans: Any, shift: float):
    window = union([(a, a + d) for a, d in spans]) if spans is not None else None
    window = [(a, b) for a, b in window if b > a] if window is not None else None
    _same([_block(c, style) for c in chunks if c], window, shift, ({1: "proc"}, {(1, 2): "thread"}))


def _x(**fields: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10.0, "dur": 5, **fields}


@built
def test_rules_exactly():
    """One block through the native rewriter, every rule of its docstring checked by value."""
    events = [
        _x(ts=10, args={"a": [1, {"b": None}]}, extra="dropped"),  # inside the first span: kept
        _x(ts=2, dur=3),  # before every span, ends before it: dropped
        _x(ts=2, dur=30),  # before, reaching into the first span: kept
        {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 55},  # between spans: dropped (an instant)
        {"ph": "s", "id": 7, "pid": "Spans", "tid": 9, "ts": 101, "cat": "ac2g", "name": "flow", "bp": "e"},
        {"ph": "f", "id": "0x2", "pid": 1, "tid": 2, "ts": 102.5},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "x"}},  # not copied
        {"ph": "X", "pid": 1, "tid": 2, "ts": "15", "dur": 1},  # a string time: no window can hold it
        {"ph": 5, "pid": 1, "tid": 2, "ts": 12},  # a numeric ph: not copied
        {"ph": "XX", "pid": 1, "tid": 2, "ts": 12},  # nor a phase of two letters
    ]
    _, native = _movers([(5.0, 40.0), (100.0, 200.0)], shift=0.5, rank=3)
    native.procs, native.threads = {1: "python"}, {(1, 2): "main"}
    out, kept = _rewrite(native, _block(events, 0))
    t1, t2 = 3 * merged.TIDS_PER_RANK + 1, 3 * merged.TIDS_PER_RANK + 2
    assert _events(out) == [
        {"ph": "M", "name": "thread_name", "pid": 3, "tid": t1, "args": {"name": "python / main"}},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 3,
            "tid": t1,
            "ts": 10.5,
            "dur": 5,
            "args": {"a": [1, {"b": None}]},
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 3, "tid": t1, "ts": 2.5, "dur": 30},
        {"ph": "M", "name": "thread_name", "pid": 3, "tid": t2, "args": {"name": "pid Spans / tid 9"}},
        {"ph": "s", "cat": "ac2g", "name": "flow", "pid": 3, "tid": t2, "ts": 101.5, "id": "r3-7", "bp": "e"},
        {"ph": "f", "pid": 3, "tid": t1, "ts": 103.0, "id": "r3-0x2"},
    ]
    assert kept == 6 and native.tids == {(1, 2): t1, ("Spans", 9): t2}
    assert list(json.loads(b"[" + out[2:] + b"]")[1]) == ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"]


DECLINED = {
    "escaped key": b'{"ph": "X", "\\u0074s": 1, "pid": 1, "tid": 1}',
    "escaped ph": b'{"ph": "\\u0058", "ts": 1, "pid": 1, "tid": 1}',
    "float pid": b'{"ph": "X", "ts": 1, "pid": 1.0, "tid": 1}',
    "boolean tid": b'{"ph": "X", "ts": 1, "pid": 1, "tid": true}',
    "escaped string pid": b'{"ph": "X", "ts": 1, "pid": "a\\"b", "tid": 1}',
    "no pid": b'{"ph": "X", "ts": 1, "tid": 1}',
    "float flow id": b'{"ph": "s", "ts": 1, "pid": 1, "tid": 1, "id": 1.5}',
    "null flow id": b'{"ph": "t", "ts": 1, "pid": 1, "tid": 1, "id": null}',
    "repeated field": b'{"ph": "X", "ts": 1, "ts": 2, "pid": 1, "tid": 1}',
    "time beyond an exact double": b'{"ph": "X", "ts": 9007199254740993, "pid": 1, "tid": 1}',
    "trailing comma": b'{"ph": "X", "ts": 1, "pid": 1, "tid": 1},',
    "missing comma": b'{"ph": "X", "ts": 1, "pid": 1, "tid": 1} {"ph": "X"}',
    "not an object": b"[1, 2]",
    "malformed value": b'{"ph": "X", "ts": 1, "pid": 1, "tid": 1, "args": {"a": tru}}',
}


@built
@pytest.mark.parametrize("case", sorted(DECLINED))
def test_declined_blocks_leave_no_new_threads(case: str):
    """A block it cannot vouch for is declined whole, even after it numbered a new thread for an
    earlier event of the block: that number is taken back, so the Python loop that redoes the
    block writes the thread's name event itself."""
    block = b'{"ph": "X", "ts": 1, "pid": 5, "tid": 5}, ' + DECLINED[case]
    _, native = _movers(None, 0.0)
    native.tids[(0, 0)] = 7
    assert _rewrite(native, block) is None
    assert native.tids == {(0, 0): 7}


@built
@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    ts=st.one_of(
        st.floats(-1e15, 1e16, allow_nan=False),
        st.integers(-(2**53), 2**53),
        st.integers(1_600_000_000_000_000, 1_800_000_000_000_000).map(lambda n: n / 4),
    ),
    shift=st.one_of(st.floats(-1e9, 1e9), st.just(0.0), st.integers(-(10**6), 10**6).map(lambda n: n / 8)),
)
def test_times_read_back_as_the_shifted_double(ts: float, shift: float):
    """The written time is ts + shift exactly (its exact decimal, or Python's repr)."""
    block = json.dumps({"ph": "i", "pid": 1, "tid": 1, "ts": ts}).encode()
    _, native = _movers(None, shift)
    out, _ = _rewrite(native, block)
    got = _events(out)[-1]["ts"]
    assert got == ts + shift and math.copysign(1, got) == math.copysign(1, ts + shift) or got == 0 == ts + shift


@built
@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.binary(max_size=200))
def test_rewriter_survives_garbage(data: bytes):
    _, native = _movers([(0.0, 1.0)], 0.0)
    got = _rewrite(native, data)
    assert got is None or (isinstance(got[0], bytes) and got[1] >= 0)
    with pytest.raises(ValueError):
        extension.rewrite(data, 0, len(data) + 1, 0, 0.0, None, None, {}, lambda key: b"")
    with pytest.raises(ValueError):
        extension.rewrite(data, 0, 0, 0, 0.0, native.starts, array("d"), {}, lambda key: b"")


@built
def test_rewriter_reads_spans_at_any_alignment():
    """Fuzz finding: spans in a buffer not aligned to 8 bytes (a memoryview slice) were read through
    a misaligned double pointer (undefined behaviour, UBSan's report); they are read with memcpy
    now, with the same answer as from arrays."""
    block = (Path(__file__).parent / "data" / "fuzz" / "regress-rewrite-misaligned-spans.bin").read_bytes()
    starts, ends = array("d", [0.0, 2.0]), array("d", [1.0, 3.0])
    holder = bytearray(1) + starts.tobytes() + bytearray(1) + ends.tobytes()
    answers = []
    for spans in ((starts, ends), (memoryview(holder)[1:17], memoryview(holder)[18:])):
        tids: dict[Any, int] = {}

        def new_thread(key: Any, tids: dict[Any, int] = tids) -> bytes:
            tids[key] = len(tids) + 1
            return b'{"ph": "M", "name": "thread_name"}'

        answers.append(extension.rewrite(block, 0, len(block), 0, 0.0, *spans, tids, new_thread))
    assert answers[0] == answers[1] and answers[0][1] == 2  # the thread's name and the event inside [2, 3)


@built
@pytest.mark.parametrize("choice", ["all", "auto"])
def test_collector_writes_the_same_merged_trace(choice: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The user's command, with the native code and without it (HARNESS_NATIVE_SCAN=0)."""
    docs = []
    for flag in ("1", "0"):
        monkeypatch.setenv(ALL_ENV, flag)
        out = tmp_path / flag
        args = [str(REAL_TRACES / "dlrm_8rank_v100"), "-o", str(out), "-q", "-j", "1"]
        collect_main(args + ([] if choice == "auto" else ["--merged", choice]))
        docs.append(json.loads(gzip.decompress((out / merged.MERGED_TRACE).read_bytes())))
    assert docs[0] == docs[1]
    assert len(docs[0]["traceEvents"]) > 10_000
