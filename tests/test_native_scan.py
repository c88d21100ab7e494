"""The native event tabler (harness/traces/native/_scan.c) against the Python decode it accelerates:
every trace decodes to the same `Trace` with it and without it (HARNESS_NATIVE_SCAN=0), on the
real traces in tests/data/traces, on generated events of every odd shape (escapes, raw UTF-8,
string times, string pids, duplicate keys, collective args), and on corrupted files, where both
give the same error. Garbage handed to the scanner itself never crashes it."""

from __future__ import annotations

import json
import math
import shutil
import sysconfig
from array import array
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.traces.native import ALL_ENV, extension
from harness.traces.read import decode
from harness.traces.read.decode import TraceError, decode_trace

from jobs import REAL_TRACES

built = pytest.mark.skipif(extension is None, reason="the native tabler is not built (no C compiler)")


def _compiler() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


@pytest.mark.skipif(_compiler() is None, reason="no C compiler: the collector decodes in Python")
def test_native_tabler_is_built_where_a_compiler_is():
    assert extension is not None, "harness/traces/native/_scan.c was not compiled: run `make setup` (pip install -e .)"


def both(path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int | None = None) -> tuple[Any, Any]:
    """The file decoded without and with the native tabler: each (Trace, its block index) or
    the error text."""
    out: list[Any] = []
    for flag in ("0", "1"):
        monkeypatch.setenv(ALL_ENV, flag)
        try:
            trace = decode_trace(path, block_bytes)
            out.append((trace, trace.blocks))
        except TraceError as exc:
            out.append(f"TraceError: {exc}")
    return out[0], out[1]


def _write(tmp_path: Path, events: list[Any]) -> Path:
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, ensure_ascii=False), encoding="utf-8")
    return path


def _native_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What the native tabler answered, block by block, from now on."""
    answers: list[bool] = []
    real = decode._Tables.add_native

    def spy(self: decode._Tables, buf: bytes, start: int, end: int) -> bool:
        answers.append(real(self, buf, start, end))
        return answers[-1]

    monkeypatch.setattr(decode._Tables, "add_native", spy)
    return answers


REAL = sorted(p for p in REAL_TRACES.rglob("*.json*"))


@built
@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name[:40])
def test_real_traces_decode_the_same(path: Path, monkeypatch: pytest.MonkeyPatch):
    python, native = both(path, monkeypatch)
    assert native == python


@built
def test_native_path_is_taken_on_clean_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Not a vacuous comparison: a clean trace goes through the scanner, block after block, and a
    block it declines (an escaped name) is decoded by msgspec with the same result."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i % 7}",
            "pid": 1,
            "tid": 2,
            "ts": 10.0 * i,
            "dur": 5,
            "args": {"External id": i},
        }
        for i in range(200)
    ]
    events[150]["name"] = 'say "hi"'
    path = _write(tmp_path, events)
    answers = _native_calls(monkeypatch)
    python, native = both(path, monkeypatch, block_bytes=2048)
    assert native == python and len(native[0].ops) == 200
    assert answers.count(True) >= 5 and answers.count(False) == 1


def _x(**fields: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 2.0, **fields}


# One rule of _Tables.add each: (events, what the native tabler must answer, the expected Trace facts).
RULES = {
    "negative dur is dropped": ([_x(dur=-1), _x()], True, {"count": 1}),
    "step prefix makes a mark in any category": (
        [_x(cat="gpu_user_annotation", name="ProfilerStep#5"), _x(cat="Trace", name="ProfilerStep#6")],
        True,
        {"marks": 2, "ops": 0},
    ),
    "annotation is a mark, not a column": (
        [_x(cat="user_annotation", name="harness/forward")],
        True,
        {"marks": 1, "ops": 0, "names": 0},
    ),
    "null collective fields keep no args": (
        [_x(cat="kernel", args={"Collective name": None, "dtype": None, "correlation": 4})],
        True,
        {"args": 0, "corr": [4]},
    ),
    "kernel collective fields keep args": (
        [_x(cat="kernel", args={"dtype": "Float"}), _x(cat="kernel")],
        True,
        {"args": 1},
    ),
    "cpu op keeps args only for a collective name": (
        [_x(args={"dtype": "Float", "In msg nelems": 3}), _x(args={"Collective name": "allreduce"})],
        True,
        {"args": 1},
    ),
    "correlation null, negative, large": (
        [
            _x(cat="kernel", args={"correlation": None}),
            _x(cat="kernel", args={"correlation": -3}),
            _x(cat="kernel", args={"correlation": 2**59}),
        ],
        True,
        {"corr": [-1, -3, 2**59]},
    ),
    "metadata event flags the block": (
        [{"ph": "M", "name": "thread_name", "pid": "Spans", "tid": "x"}, _x()],
        True,
        {"meta": True},
    ),
    "string pid on an event nobody reads": (
        [_x(cat="Trace", pid="Spans", tid="PyTorch Profiler"), _x()],
        True,
        {"threads": 1, "count": 2},
    ),
    "numeric ph is neither X nor M": ([{**_x(), "ph": 5}, _x()], True, {"count": 1}),
    "missing ts is not counted": ([{k: v for k, v in _x().items() if k != "ts"}, _x()], True, {"count": 1}),
    "string pid on a cpu op": ([_x(pid="main"), _x()], False, {"threads": 2}),
    "float correlation": ([_x(cat="kernel", args={"correlation": 3.0})], False, {"corr": [3]}),
    "escaped ph": ([_x(), _x()], False, {"count": 2}),  # written with \u0058 below
    "name with a quote": ([_x(name='a "b"')], False, {"names": 1}),
}


@built
@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_exactly(rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    events, accepted, facts = RULES[rule]
    # the file's last event is always decoded by msgspec (where the array ends): an instant, read by no rule
    path = _write(tmp_path, events + [{"ph": "i", "name": "end", "ts": 0}])
    if rule == "escaped ph":
        path.write_text(path.read_text().replace('"ph": "X"', '"ph": "\\u0058"', 1))
    answers = _native_calls(monkeypatch)
    python, native = both(path, monkeypatch, block_bytes=1 << 20)
    assert native == python
    assert answers == [accepted]
    trace = native[0]
    got = {
        "count": trace.count,
        "marks": len(trace.marks),
        "ops": len(trace.ops),
        "names": len(trace.names),
        "args": len(trace.args),
        "threads": len(trace.threads),
        "meta": trace.blocks[0].meta if trace.blocks else None,
        "corr": list(trace.kernels.corr) or list(trace.ops.corr),
    }
    assert {k: got[k] for k in facts} == facts


KEYS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args")
TEXT = st.text(alphabet=st.sampled_from(list('abc #:"\\/\n\t\u00e9\u4e2d\U0001f600\x01')), max_size=8)
NUMBER = st.one_of(
    st.integers(-10, 10**6), st.floats(-1e3, 1e16, allow_nan=False, allow_infinity=False), st.integers(-(2**70), 2**70)
)
ODD = st.one_of(st.none(), st.booleans(), TEXT, st.just([1, {"a": [None]}]), st.just({}))
CATS = st.sampled_from(sorted(decode.GROUP_OF) + [decode.MARK_CAT, "Trace", "ac2g", "gpu_user_annotation"])
NAMES = st.one_of(
    st.sampled_from(
        [
            "aten::mm",
            "ProfilerStep#3",
            "ncclKernel_AllReduce",
            "record_param_comms",
            "cudaLaunchKernel",
            "harness/forward",
        ]
    ),
    TEXT,
)
ARG_VALUES = st.one_of(st.none(), st.integers(-5, 10**5), TEXT, st.just("allreduce"), st.floats(0, 10))
ARGS = st.one_of(
    st.none(),
    ODD,
    st.dictionaries(
        st.sampled_from(
            [
                "correlation",
                "Collective name",
                "Process Group Name",
                "In msg nelems",
                "dtype",
                "External id",
                "grid",
                "c\u00f6rrelation",
            ]
        ),
        st.one_of(ARG_VALUES, st.integers(-(2**70), 2**70), st.just([1, 2, [3]])),
        max_size=4,
    ),
)
CLEAN = {
    "ph": st.sampled_from(["X", "X", "X", "X", "M", "i", "s", "f"]),
    "cat": CATS,
    "name": NAMES,
    "ts": NUMBER,
    "dur": NUMBER,
    "pid": st.integers(-3, 3),
    "tid": st.one_of(st.integers(-3, 3), st.integers(0, 2**40)),
    "args": st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["correlation", "External id", "Collective name"]), st.integers(-5, 10**5), max_size=2
        ),
    ),
}
ODD_FIELD = {  # each field's odd values: what msgspec and the Python loop handle, the scanner declines or skips
    "ph": ODD,
    "cat": ODD,
    "name": ODD,
    "ts": st.one_of(ODD, st.just("12.5")),
    "dur": ODD,
    "pid": st.one_of(st.integers(0, 2**70), ODD, st.just(1.0)),
    "tid": st.one_of(st.integers(0, 2**70), ODD),
    "args": st.one_of(ODD, ARGS),
}
# Mostly clean, complete events (so most blocks take the native path), each field odd one time in
# eight; one event in four has any subset of the fields.
FIELD = {k: st.one_of(*[CLEAN[k]] * 7, ODD_FIELD[k]) for k in KEYS}
EVENT = st.one_of(*[st.fixed_dictionaries(FIELD)] * 3, st.fixed_dictionaries({}, optional=FIELD))


def _text(doc: Any, style: int) -> str:
    """JSON in one of several layouts: compact, Kineto-like indented, raw UTF-8 or \\u escapes,
    and one with a duplicated key (the later value wins, in msgspec and in the scanner)."""
    if style == 0:
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(doc, indent=2)
    if style == 2:
        return json.dumps(doc, ensure_ascii=False, indent=1)
    events = ",\n".join(
        (
            json.dumps(e, ensure_ascii=False)[:-1] + ', "ph": "X", "ts": 1.0}'
            if isinstance(e, dict) and e
            else json.dumps(e, ensure_ascii=False)
        )
        for e in doc["traceEvents"]
    )
    return '{"schemaVersion": 1, "traceEvents": [' + events + "]}"


@built
@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    items=st.lists(EVENT, max_size=40),
    junk=st.sampled_from([None] * 9 + [[], 3]),
    at=st.floats(0, 1),
    style=st.integers(0, 3),
    block=st.sampled_from([64, 300, 4096]),
)
def test_generated_events_decode_the_same(
    items: list[Any], junk: Any, at: float, style: int, block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    if junk is not None:  # an element that is not an event: the whole-file path, both ways
        items.insert(int(at * len(items)), junk)
    path = tmp_path / "gen.json"
    path.write_text(_text({"traceEvents": items}, style), encoding="utf-8")
    python, native = both(path, monkeypatch, block_bytes=block)
    assert native == python


@built
@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0, 1), flip=st.floats(0, 1), byte=st.integers(0, 255), truncate=st.booleans())
def test_corrupted_files_give_the_same_outcome(
    cut: float, flip: float, byte: int, truncate: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    events = [
        {
            "ph": "X",
            "cat": c,
            "name": n,
            "pid": 1,
            "tid": t,
            "ts": 100.0 * i,
            "dur": 50,
            "args": {"correlation": i, "Collective name": "allreduce"} if c == "kernel" else {"External id": i},
        }
        for i, (c, n, t) in enumerate(
            [
                ("cpu_op", "aten::mm", 1),
                ("cuda_runtime", "cudaLaunchKernel", 1),
                ("kernel", "ncclKernel_AllReduce", 7),
                ("user_annotation", "ProfilerStep#1", 1),
            ]
            * 8
        )
    ]
    raw = bytearray(json.dumps({"traceEvents": events}, indent=1).encode())
    at = int(flip * (len(raw) - 1))
    if truncate:
        raw = raw[: int(cut * len(raw))]
    elif at < len(raw):
        raw[at] = byte
    path = tmp_path / "bad.json"
    path.write_bytes(bytes(raw))
    python, native = both(path, monkeypatch, block_bytes=256)
    assert native == python


MALFORMED = {
    "array closed by a brace": b'{"ph": "X", "args": {"a": [1, 2}}',
    "object closed by a bracket": b'{"ph": "X", "args": {"a": 1]}',
    "event closed by a bracket": b'{"ph": "X", "ts": 1]',
    "missing comma": b'{"ph": "X" "cat": "x"}',
    "trailing comma in an object": b'{"ph": "X",}',
    "missing colon": b'{"ph" "X"}',
    "bad literal": b'{"ph": "X", "args": {"a": tru}}',
    "leading zero": b'{"ph": "X", "args": {"a": 01}}',
    "bare point": b'{"ph": "X", "args": {"a": 1.}}',
    "control character": b'{"ph": "X", "args": {"a": "\x01"}}',
    "unknown escape": b'{"ph": "X", "args": {"a": "\\q"}}',
    "short unicode escape": b'{"ph": "X", "args": {"a": "\\u12"}}',
    "invalid UTF-8": b'{"ph": "X", "args": {"a": "\xff"}}',
    "overlong UTF-8": b'{"ph": "X", "args": {"a": "\xc0\xaf"}}',
    "unclosed string": b'{"ph": "X", "name": "abc}',
    "trailing comma between events": b'{"ph": "X"},',
    "nesting deeper than the scanner walks": b'{"ph": "X", "args": {"a": ' + b"[" * 70 + b"]" * 70 + b"}}",
}


@built
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_scanner_declines_what_it_cannot_vouch_for(case: str):
    """At least as strict as msgspec: malformed JSON (and nesting past its depth) is declined,
    never read, so such a block always takes the msgspec path and its errors."""
    block = MALFORMED[case]
    assert extension.scan(block, 0, len(block), {}, {}, 0) is None
    # stricter than msgspec: it skips bad UTF-8 inside args values, and walks deeper
    if case not in ("invalid UTF-8", "overlong UTF-8", "nesting deeper than the scanner walks"):
        with pytest.raises((msgspec.DecodeError, UnicodeDecodeError)):
            decode._EVENT_LIST.decode(b"[" + block + b"]")


@built
@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    text=st.one_of(
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.decimals(allow_nan=False, allow_infinity=False, places=3).map(str),
        st.from_regex(r"-?(0|[1-9][0-9]{0,19})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True),
    )
)
def test_times_parse_to_the_same_double_as_python(text: str):
    """The scanner's number parsing (a fast exact path, else CPython's) against float()."""
    block = ('{"ph": "X", "cat": "cpu_op", "name": "n", "pid": 1, "tid": 1, "ts": ' + text + ', "dur": 0}').encode()
    expected = float(text)
    got = extension.scan(block, 0, len(block), {}, {}, 0)
    if not math.isfinite(expected):
        assert got is None  # out of range: msgspec rejects it too, the block takes another path
        return
    ts = array("d")
    ts.frombytes(got[4][decode.OPS][0])
    assert ts[0] == expected and math.copysign(1, ts[0]) == math.copysign(1, expected)


@built
@settings(max_examples=200, deadline=None, derandomize=True)
@given(data=st.binary(max_size=200))
def test_scanner_survives_garbage(data: bytes):
    got = extension.scan(data, 0, len(data), {}, {}, 0)
    assert got is None or len(got) == 7
    for bad in ((-1, 0), (0, len(data) + 1), (1, 0)):
        if bad[0] <= bad[1] <= len(data) and bad[0] >= 0:
            continue
        with pytest.raises(ValueError):
            extension.scan(data, bad[0], bad[1], {}, {}, 0)


# tests/fuzz_native.py's seeds; regress-*.bin among them are the exact inputs of its findings (launch/sanitize.sh)
FUZZ_SEEDS = Path(__file__).parent / "data" / "fuzz"


@built
def test_scanner_raises_on_a_dict_number_outside_int():
    """Fuzz finding: a `threads` or `names` dict already holding a negative number made scan return
    NULL without an exception set (a SystemError), and one beyond INT_MAX was cut to a C int in
    the columns. Only a caller's own dicts can hold such numbers: a ValueError now."""
    block = (FUZZ_SEEDS / "regress-scan-negative-thread.bin").read_bytes()
    for threads in ({(1, 1): -5}, {(1, 1): -1}, {(1, 1): 2**31}):
        with pytest.raises(ValueError, match="0..INT_MAX"):
            extension.scan(block, 0, len(block), {"ProfilerStep#1": 0, "aten::mm": 1}, threads, 1)
    op = b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    for number in (-1, 2**31):
        with pytest.raises(ValueError, match="0..INT_MAX"):
            extension.scan(op, 0, len(op), {"aten::mm": number}, {}, 0)
    got = extension.scan(op, 0, len(op), {"aten::mm": 2**31 - 1}, {(1, 1): 2**31 - 1}, 0)
    assert array("i", got[4][decode.OPS][2]).tolist() == [2**31 - 1]


@built
def test_scanner_refuses_args_numbers_beyond_int():
    """Fuzz finding: an args_base near 2**63 overflowed the next args number (signed overflow:
    undefined behaviour, UBSan's report), and numbers beyond INT_MAX were cut to C ints in the
    extra column (the Python loop's array('i') refuses them too). A ValueError now."""
    block = (FUZZ_SEEDS / "regress-scan-args-base.bin").read_bytes()
    for base in (2**63 - 1, 2**31, -1):
        with pytest.raises(ValueError, match="args_base"):
            extension.scan(block, 0, len(block), {}, {}, base)
    assert extension.scan(block, 0, len(block), {}, {}, 2**31 - 1) is None  # declined at its malformed end
    kernel = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": '
    two = b", ".join([kernel + b'{"Collective name": "allreduce"}}'] * 2)
    got = extension.scan(two, 0, len(two), {}, {}, 2**31 - 2)
    assert array("i", got[4][decode.KERNELS][5]).tolist() == [2**31 - 2, 2**31 - 1]
    with pytest.raises(ValueError, match="beyond INT_MAX"):
        extension.scan(two, 0, len(two), {}, {}, 2**31 - 1)


@built
def test_each_native_function_switches_off_on_its_own(monkeypatch: pytest.MonkeyPatch):
    """native.function reads the switches at each call: HARNESS_NATIVE_OFF names the ones off,
    HARNESS_NATIVE_SCAN=0 turns every one off."""
    from harness.traces import native

    monkeypatch.delenv(native.ALL_ENV, raising=False)
    monkeypatch.delenv(native.OFF_ENV, raising=False)
    assert all(native.function(n) is not None for n in native.FUNCTIONS)
    monkeypatch.setenv(native.OFF_ENV, "rewrite, nest")
    assert [native.function(n) is not None for n in native.FUNCTIONS] == [True, False, False]
    assert decode.native_scan()
    monkeypatch.setenv(native.OFF_ENV, "scan")
    assert not decode.native_scan()
    monkeypatch.delenv(native.OFF_ENV)
    monkeypatch.setenv(native.ALL_ENV, "0")
    assert all(native.function(n) is None for n in native.FUNCTIONS)
    with pytest.raises(ValueError, match="no native function 'tabler'"):
        native.function("tabler")
