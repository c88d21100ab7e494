"""The collector's bad-input matrix, through the command a user types: each case gets its
documented exit code (2: nothing to analyse; 0: a report, partial where something is missing)
and one line saying what is wrong, or a warning in the report; never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobs import REPO
from tracebuild import document, gpu_docs, write, x

Doc = dict[str, Any]


def two_ranks(folder: Path, change: Callable[[Doc, int], Doc] = lambda d, r: d) -> Path:
    folder.mkdir()
    for rank, doc in enumerate(gpu_docs()):
        write(folder / f"rank{rank}.pt.trace.json", change(doc, rank))
    return folder


def events(change: Callable[[list[Any]], list[Any]]) -> Callable[[Doc, int], Doc]:
    return lambda doc, rank: {**doc, "traceEvents": change(doc["traceEvents"])}


def truncate(folder: Path) -> None:
    p = folder / "rank1.pt.trace.json"
    p.write_bytes(p.read_bytes()[:500])


def corrupt_gzip(folder: Path) -> None:
    (folder / "rank1.pt.trace.json").unlink()
    (folder / "rank1.pt.trace.json.gz").write_bytes(b"\x1f\x8b" + b"garbage" * 10)


# (case, build(folder) -> path to collect, exit code, text expected in stderr / report warnings / headline);
# the two ranks of gpu_docs(): rank 1 arrives 0.2 ms late in 1 ms steps, a straggler however the file is shaped
LATE = "straggler: rank 1"
CASES: list[tuple[str, Callable[[Path], Path], int, str]] = [
    ("no such path", lambda d: d / "nope", 2, "no such file or folder"),
    ("empty folder", lambda d: (d.mkdir(), d)[1], 2, "no trace files"),
    (
        "non-trace JSON",
        lambda d: (d.mkdir(), (d / "rank0.pt.trace.json").write_text('{"a": 1}'), d)[2],
        2,
        "not a PyTorch profiler trace",
    ),
    (
        "number out of range",
        lambda d: (
            d.mkdir(),
            (d / "rank0.pt.trace.json").write_text(
                '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", '
                '"pid": 1, "tid": 1, "ts": 1e400, "dur": 5}]}'
            ),
            d,
        )[2],
        2,
        "number out of range in an event near byte 17; not readable as a trace",
    ),
    ("truncated JSON", lambda d: (two_ranks(d), truncate(d), d)[2], 0, "not valid JSON: the file ends early"),
    ("corrupt gzip", lambda d: (two_ranks(d), corrupt_gzip(d), d)[2], 0, "corrupt or truncated gzip"),
    ("empty file", lambda d: (two_ranks(d), (d / "rank1.pt.trace.json").write_bytes(b""), d)[2], 0, "empty file"),
    (
        "duplicate ranks",
        lambda d: (two_ranks(d), shutil.copy(d / "rank1.pt.trace.json", d / "rank1b.pt.trace.json"), d)[2],
        0,
        "duplicates",
    ),
    ("missing rank", lambda d: (two_ranks(d), (d / "rank1.pt.trace.json").unlink(), d)[2], 0, "rank(s) 1 missing"),
    (
        "two runs mixed",
        lambda d: two_ranks(d, lambda doc, r: {**doc, "harness": {"run_id": f"run{r}", "rank": r}}),
        2,
        "2 different runs are mixed",
    ),
    (
        "no ProfilerStep",
        lambda d: two_ranks(d, events(lambda ev: [e for e in ev if "ProfilerStep" not in e["name"]])),
        0,
        "no ProfilerStep#N markers",
    ),
    (
        "no distributedInfo",
        lambda d: two_ranks(d, lambda doc, r: {k: v for k, v in doc.items() if k != "distributedInfo"}),
        0,
        "taken from the file name",
    ),
    (
        "string stream ids",
        lambda d: two_ranks(d, events(lambda ev: [dict(e, tid=f"stream {e['tid']}") for e in ev])),
        0,
        LATE,
    ),
    (
        "nanosecond float timestamps",
        lambda d: two_ranks(d, events(lambda ev: [dict(e, ts=e["ts"] + 0.123) for e in ev])),
        0,
        LATE,
    ),
    (
        "zero and negative durations",
        lambda d: two_ranks(d, events(lambda ev: ev + [x("aten::z", "cpu_op", 50, 0), x("aten::n", "cpu_op", 60, -5)])),
        0,
        LATE,
    ),
    ("events out of order", lambda d: two_ranks(d, events(lambda ev: ev[::-1])), 0, LATE),
    (
        "unicode and very long names",
        lambda d: two_ranks(d, events(lambda ev: ev + [x("aten::ünïcødé_✓" + "x" * 100_000, "cpu_op", 70, 5)])),
        0,
        LATE,
    ),
    (
        "0-event trace",
        lambda d: (d.mkdir(), write(d / "rank0.pt.trace.json", document([], 0, world_size=1)), d)[2],
        0,
        "no timed events",
    ),
]


@pytest.mark.parametrize(("build", "code", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(build: Callable[[Path], Path], code: int, expected: str, tmp_path: Path) -> None:
    target = build(tmp_path / "in")
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(target), "-q", "--no-merged", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    if code == 2:
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 or all(line.startswith("harness.collect: warning:") for line in lines[:-1]), proc.stderr
        assert lines[-1].startswith("harness.collect: error: ") and expected in proc.stderr, proc.stderr
        assert not out.exists()
    else:
        doc = json.loads((out / "report.json").read_text())
        said = proc.stderr + proc.stdout + json.dumps(doc["warnings"], ensure_ascii=False) + doc["headline"]
        assert expected in said, said[-2000:]
