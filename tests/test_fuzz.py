"""Property-based fuzzing of the collector on mutated real traces: whatever a mutation does
(events dropped, bytes truncated, fields swapped or re-typed, top-level keys broken), parsing
either succeeds and the whole analysis and report run, or it fails with `TraceError` (the
documented one-line error). Bounded: 60 derandomized examples in the suite (about 10 s);
`FUZZ_EXAMPLES=400 FUZZ_RANDOM=1 pytest tests/test_fuzz.py` searches further."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from harness.report.document import build_report
from harness.report.records import as_document
from harness.traces.read import decode
from harness.traces.read.discover import InputError, group_ranks
from harness.traces.read.parse import TraceError, parse_trace
from harness.traces.run_analysis import analyze

from jobs import REAL_TRACES

SOURCES = [
    REAL_TRACES / "dlrm_8rank_v100" / "worker0_step_12.1694128201545.pt.trace.json.gz",
    REAL_TRACES / "hta_trace_filter_2of128" / "sampled_rank-0.json.gz",
]
FIELDS = ("ph", "name", "cat", "ts", "dur", "pid", "tid", "args")
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.just([]),
    st.just({}),
    st.just({"correlation": "x"}),
)


_loaded: dict[Path, dict[str, Any]] = {}


def source(i: int) -> dict[str, Any]:
    path = SOURCES[i]
    if path not in _loaded:
        _loaded[path] = json.loads(gzip.decompress(path.read_bytes()))
    return copy.deepcopy(_loaded[path])


mutation = st.one_of(
    st.tuples(st.just("drop"), st.floats(0, 1), st.floats(0, 1)),
    st.tuples(st.just("retype"), st.floats(0, 1), st.sampled_from(FIELDS), ODD_VALUES),
    st.tuples(st.just("swap"), st.floats(0, 1), st.sampled_from(FIELDS), st.sampled_from(FIELDS)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.sampled_from(FIELDS)),
    st.tuples(st.just("top"), st.sampled_from(["distributedInfo", "traceEvents", "baseTimeNanoseconds"]), ODD_VALUES),
    st.tuples(st.just("shuffle"), st.randoms(use_true_random=False)),
)


def mutate(doc: dict[str, Any], m: tuple) -> None:
    events = doc.get("traceEvents")
    kind = m[0]
    if kind == "top":
        doc[m[1]] = m[2]
        return
    if not isinstance(events, list) or not events:
        return
    if kind == "shuffle":
        m[1].shuffle(events)
        return
    i = int(m[1] * (len(events) - 1))
    e = events[i]
    if kind == "drop":
        j = i + int(m[2] * (len(events) - i))
        del events[i:j]
    elif not isinstance(e, dict):
        return
    elif kind == "retype":
        e[m[2]] = m[3]
    elif kind == "swap":
        e[m[2]], e[m[3]] = e.get(m[3]), e.get(m[2])
    elif kind == "delete":
        e.pop(m[2], None)


@settings(
    max_examples=int(__import__("os").environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=__import__("os").environ.get("FUZZ_RANDOM") is None,
)
@example(which=0, mutations=[("retype", 0.0, "pid", [])], truncate=None, gz=False, block=1 << 20)  # found by it
@given(
    which=st.integers(0, len(SOURCES) - 1),
    mutations=st.lists(mutation, min_size=1, max_size=5),
    truncate=st.one_of(st.none(), st.floats(0, 1)),
    gz=st.booleans(),
    block=st.sampled_from([256, 4096, 1 << 20]),
)
def test_mutated_traces_parse_or_fail_cleanly(
    tmp_path_factory: pytest.TempPathFactory,
    which: int,
    mutations: list[tuple],
    truncate: float | None,
    gz: bool,
    block: int,
) -> None:
    doc = source(which)
    for m in mutations:
        mutate(doc, m)
    data = json.dumps(doc).encode()
    if gz:
        data = gzip.compress(data)
    if truncate is not None:
        data = data[: int(truncate * len(data))]
    path = tmp_path_factory.mktemp("fuzz") / ("rank0.pt.trace.json" + (".gz" if gz else ""))
    path.write_bytes(data)
    saved, decode.BLOCK_BYTES = decode.BLOCK_BYTES, block  # streamed in blocks of every size
    try:
        trace = parse_trace(path)
    except TraceError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)
        return
    finally:
        decode.BLOCK_BYTES = saved
    try:
        analysis = analyze(group_ranks([trace]))
    except InputError:
        return  # documented: e.g. world size / rank combinations that cannot be one run
    json.dumps(as_document(build_report(analysis, [str(path)])), allow_nan=False)
