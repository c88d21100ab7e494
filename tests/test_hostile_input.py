"""Hostile and odd trace files: the reader's time is linear in the bytes and its memory bounded
by its limits whatever a file holds (runs of whitespace, no event boundary for megabytes, one
giant string, deep nesting, a decompression bomb), a file beyond a limit gets one line saying
which limit and how to raise it, and every valid layout (top-level fields in any order,
pretty-printed or one line, gzip or not) is streamed, not decoded whole.

Memory is measured with tracemalloc (every bytes object the reader holds is a Python
allocation), so the bounds are exact, not timing- or machine-dependent."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from harness.traces.read import decode
from harness.traces.read.decode import Limits, TraceError, decode_trace, open_trace

from jobs import REAL_TRACES, REPO

MB = 2**20
SOURCE = REAL_TRACES / "hta_trace_filter_2of128" / "sampled_rank-0.json.gz"


def source_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(gzip.decompress(SOURCE.read_bytes()))
    return doc


def event_bytes() -> bytes:
    return json.dumps(
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}
    ).encode()


def decoded_with_peak(path: Path, block_bytes: int | None = None) -> tuple[decode.Trace | str, int]:
    """The decode (or its error line) and the peak of Python memory it took, in bytes."""
    tracemalloc.start()
    try:
        result: decode.Trace | str = decode_trace(path, block_bytes)
    except TraceError as exc:
        result = str(exc)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, peak


def bomb(path: Path, inflated_gb: float = 2.0) -> Path:
    """A ~2 MB gzip that inflates to `inflated_gb` GB of whitespace inside `{"traceEvents": [ ... ]}`:
    one member of 64 MB of spaces repeated (gzip readers join members), so it is made in a second."""
    spaces = gzip.compress(b" " * (64 * MB), compresslevel=9)
    with path.open("wb") as fh:
        fh.write(gzip.compress(b'{"traceEvents": ['))
        for _ in range(int(inflated_gb * 1024 / 64)):
            fh.write(spaces)
        fh.write(gzip.compress(b"]}"))
    return path


def test_decompression_bomb_is_refused_in_one_line(tmp_path: Path) -> None:
    path = bomb(tmp_path / "rank0.1.pt.trace.json.gz")
    assert path.stat().st_size < 3 * MB
    result, peak = decoded_with_peak(path)
    assert isinstance(result, str), result
    assert "decompression bomb" in result and "HARNESS_MAX_INFLATE_RATIO" in result and "\n" not in result
    assert peak < 8 * MB  # judged after 64 MB inflated, a block at a time


# In the serial tier: beside another process (an xdist worker's test) the collector read 543 MB
# resident on this bomb and under 400 MB alone; not yet explained.
@pytest.mark.slow
def test_decompression_bomb_through_the_command(tmp_path: Path) -> None:
    """The bomb of the issue as a user meets it: `python -m harness.collect DIR` says one line
    and exits 2, in bounded memory (it was killed at 1.45 GB resident after 120 s)."""
    run = tmp_path / "run"
    run.mkdir()
    bomb(run / "rank0.1.pt.trace.json.gz")
    # The command runs under a fresh parent whose only child it is: that parent's RUSAGE_CHILDREN
    # peak is the command's own (this worker's counts every child it ever reaped, other tests' too)
    parent = (
        "import resource, subprocess, sys; "
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120); "
        "sys.stderr.write(p.stderr); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            parent,
            sys.executable,
            "-m",
            "harness.collect",
            str(run),
            "-q",
            "--no-merged",
            "-j",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=REPO,
    )
    peak_kb = int(proc.stdout.split()[-1])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "decompression bomb" in proc.stderr and "HARNESS_MAX_INFLATE_RATIO" in proc.stderr
    assert peak_kb < 400 * 1024, f"{peak_kb} KB resident"


def test_genuine_high_ratio_file_is_read_when_the_limit_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = bomb(tmp_path / "rank0.1.pt.trace.json.gz", inflated_gb=0.125)
    assert isinstance(decoded_with_peak(path)[0], str)
    monkeypatch.setenv("HARNESS_MAX_INFLATE_RATIO", "2000")
    trace, peak = decoded_with_peak(path)
    assert isinstance(trace, decode.Trace) and trace.count == 0 and trace.note == ""
    assert peak < 8 * MB


def test_whitespace_between_and_around_events_costs_no_memory(tmp_path: Path) -> None:
    """100 MB of newlines after the array's `[`, after an event's comma and before its `]`: both
    events read, the file streamed, the memory a few blocks."""
    ev = event_bytes()
    path = tmp_path / "rank0.pt.trace.json"
    run = b"\n" * (100 * MB)
    path.write_bytes(b'{"traceEvents": [' + run + ev + b"," + run + ev + run + b"]}")
    trace, peak = decoded_with_peak(path)
    assert isinstance(trace, decode.Trace), trace
    assert trace.count == 2 and len(trace.ops) == 2 and trace.note == ""
    assert peak < 8 * MB


def test_one_event_past_the_limit_is_refused(tmp_path: Path) -> None:
    """A 20 MB string full of `}, {` (cut look-alikes) in one event: past the 16 MB event limit,
    refused in one line naming the variable that raises it, holding little more than the limit."""
    ev = event_bytes()
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(b'{"traceEvents": [' + ev + b', {"ph": "X", "name": "' + b"a}, {" * (4 * MB) + b'"}]}')
    result, peak = decoded_with_peak(path)
    assert isinstance(result, str) and "HARNESS_MAX_EVENT_MB" in result and "16 MB" in result, result
    assert peak < 4 * Limits().event_bytes


def test_a_long_event_is_decoded_a_logarithmic_number_of_times(tmp_path: Path) -> None:
    """An 8 MB string full of cut look-alikes, read in 64 KB blocks: each failed cut doubles the
    next read, so the held bytes are decoded ~log2(8 MB / 64 KB) times, not once per block
    (128), and the events around it come out intact."""
    ev = event_bytes()
    path = tmp_path / "rank0.pt.trace.json"
    name = "a}, {" * (8 * MB // 5)
    path.write_bytes(
        b'{"traceEvents": ['
        + ev
        + b', {"ph": "X", "cat": "cpu_op", "name": "'
        + name.encode()
        + b'", "ts": 20, "dur": 1}, '
        + ev
        + b"]}"
    )
    calls = []

    class Counting:
        def decode(self, data: bytes) -> Any:
            calls.append(len(data))
            return decode._EVENT_LIST.decode(data)

    with open_trace(path) as fh:
        got: list[Any] = []
        decode.stream_events(fh, 64 * 1024, lambda events, loose: got.extend(events), items=Counting())
    assert [e.name for e in got] == ["aten::mm", name, "aten::mm"]
    assert len(calls) <= 12, len(calls)


def test_deep_nesting_is_one_line(tmp_path: Path) -> None:
    ev = event_bytes()
    path = tmp_path / "rank0.pt.trace.json"
    depth = 200_000
    path.write_bytes(b'{"traceEvents": [' + ev + b', {"args": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}]}")
    result, _ = decoded_with_peak(path)
    assert isinstance(result, str) and "nested too deep" in result and "\n" not in result, result


def test_a_bad_limit_variable_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(b'{"traceEvents": [' + event_bytes() + b"]}")
    monkeypatch.setenv("HARNESS_MAX_EVENT_MB", "lots")
    with pytest.raises(TraceError, match="HARNESS_MAX_EVENT_MB='lots' is not a positive number"):
        decode_trace(path)


LAYOUTS = {
    "kineto": lambda d: d,
    "events first": lambda d: {"traceEvents": d["traceEvents"], **{k: v for k, v in d.items() if k != "traceEvents"}},
    "events in the middle": lambda d: {
        "schemaVersion": d.get("schemaVersion"),
        "traceEvents": d["traceEvents"],
        "deviceProperties": [{"id": 0, "name": "A100"}, {"id": 1, "name": "A100"}],
        **{k: v for k, v in d.items() if k not in ("traceEvents", "schemaVersion")},
    },
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("style", ["one line", "pretty", "gzip"])
@pytest.mark.parametrize("block_bytes", [4096, MB])
def test_every_layout_is_streamed_to_the_same_events(
    layout: str, style: str, block_bytes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Top-level fields in any order (a `json.dump` of a dict that put traceEvents first, device
    properties after it with `}, {` between their entries), one line or indented, plain or gzip:
    streamed (blocks recorded, no whole-decode note), with the events and fields of the whole
    decode, native tabler on or off."""
    doc = LAYOUTS[layout](source_doc())
    if layout == "events in the middle":
        doc["traceEvents"] = doc["traceEvents"] + [{"ph": "X", "name": "x}, {y", "cat": "cpu_op", "ts": 1, "dur": 1}]
    text = json.dumps(doc, indent=2 if style == "pretty" else None).encode()
    path = tmp_path / ("rank0.pt.trace.json" + (".gz" if style == "gzip" else ""))
    path.write_bytes(gzip.compress(text) if style == "gzip" else text)
    whole = decode._decode_whole(path)
    for native in ("1", "0"):
        monkeypatch.setenv("HARNESS_NATIVE_SCAN", native)
        trace = decode_trace(path, block_bytes)
        assert trace.note == "" and trace.blocks, (layout, style)
        assert trace == whole
        assert trace.json_bytes == len(text)
        assert trace.distributed_info == doc.get("distributedInfo")
    if layout == "events in the middle":
        assert trace.gpus == 2


def test_blocks_point_at_the_events_in_any_key_order(tmp_path: Path) -> None:
    """The merged trace's writer reads only the byte ranges the reader recorded: with the events
    first, each range still holds whole events and nothing of the fields after them."""
    doc = LAYOUTS["events first"](source_doc())
    text = json.dumps(doc).encode()
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(text)
    trace = decode_trace(path, 4096)
    events = [e for b in trace.blocks for e in json.loads(b"[" + text[b.start : b.end] + b"]")]
    assert len(events) == len(doc["traceEvents"])


def test_too_much_after_the_events_is_decoded_whole_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """More after the events than Limits.tail_bytes (here a 3 MB field, the limit lowered to 1 MB):
    decoded whole, within Limits.whole_bytes, and the warning line says why."""
    doc = {**LAYOUTS["events first"](source_doc()), "notes": "x" * (3 * MB)}
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(Limits, "from_env", staticmethod(lambda: Limits(tail_bytes=MB)))
    trace = decode_trace(path)
    assert trace.note == "rank0.pt.trace.json: not streamable (more than 1 MB after its events); decoded whole"
    assert trace == decode._decode_whole(path)


def test_whole_decode_is_bounded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that cannot be streamed (no traceEvents key at the top) is decoded whole only up to
    Limits.whole_bytes; past it, one line naming HARNESS_MAX_WHOLE_MB."""
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(b'{"events": [' + b"1, " * MB + b"1]}")
    monkeypatch.setenv("HARNESS_MAX_WHOLE_MB", "1")
    with pytest.raises(TraceError, match="HARNESS_MAX_WHOLE_MB"):
        decode_trace(path)
    monkeypatch.delenv("HARNESS_MAX_WHOLE_MB")
    with pytest.raises(TraceError, match="without a traceEvents list"):
        decode_trace(path)


def test_broken_json_mid_file_says_where(tmp_path: Path) -> None:
    """Broken JSON inside the events is said with its byte, from the stream, not by decoding
    the whole file again."""
    ev = event_bytes()
    body = b'{"traceEvents": [' + b", ".join([ev] * 2000) + b', {"ph": tru}, ' + ev + b"]}"
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(body)
    with pytest.raises(TraceError, match=r"not valid JSON at byte \d+ \(JSON is malformed: invalid character\)"):
        decode_trace(path, 4096)


def test_limits_match_what_they_guard() -> None:
    """The defaults are those docs/failures.md states."""
    text = (REPO / "docs" / "failures.md").read_text()
    limits = Limits()
    assert f"{limits.event_bytes // MB} MB" in text and f"{limits.inflate_ratio:g}x" in text
    assert f"{limits.whole_bytes // MB} MB" in text


def test_memory_limit_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """Under --memory-limit-mb (what TensorBoard's "Analyse now" passes) a collector that needs
    more stops with one line and exit 3, not the machine's out-of-memory killer. 60 MB is less
    than parsing this 54 MB trace takes on any machine; the limit applies after start-up."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank1.pt.trace.json.gz").write_bytes(
        (REAL_TRACES / "hta_single_rank" / "df_index_resolver_v100_rank1of2.json.gz").read_bytes()
    )
    for jobs in ("1", "2"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness.collect",
                str(run),
                "-q",
                "--no-merged",
                "-j",
                jobs,
                "--memory-limit-mb",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 3, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "harness.collect: error: ran out of the 60 MB each collector process may take (--memory-limit-mb); "
            "run it by hand with more, or look for an oversized file in the run's folder"
        ]
