"""Which runs under a TensorBoard logdir the distributed view can show. Torch-free, no web code.

A run is either
- a folder with a collector report: `<run>/report/report.json` (run = `<run>`), or any other
  folder holding `report.json` (a report written with `-o`; run = that folder);
- a folder of per-rank traces (or their in-job summaries) with no report yet (a folder whose
  traces a report read, listed in its `input_dirs`, belongs to that report's run: the other
  nodes of a multi-node run); node folders of a multi-node run
  (`<run>/<node>/*.pt.trace.json.gz`, nothing directly in `<run>`, `<run>` not the logdir
  itself) count as one run, `<run>`.

Run names are paths relative to the logdir, '/'-separated. Files are only ever read through
`RunEntry` paths found by walking the logdir, never built from a name a client sent, and a path
that resolves outside the logdir (a symlink) is ignored.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.paths import (
    MERGED_TRACE,
    REPORT_DIR,
    REPORT_JSON,
    SCALARS_DIR,
    STEPS_DIR,
    TIMELINE_JSON,
    TRACE_PATTERN,
    is_summary,
)
from harness.report.records import SCHEMA_VERSION, Report, load_report

T = TypeVar("T")

SKIPPED_DIRS = {SCALARS_DIR, STEPS_DIR}


@dataclass(frozen=True)
class RunEntry:
    name: str
    run_dir: Path
    report_dir: Path | None  # None: traces but no report yet
    traces: int  # per-rank trace files found for it
    root: Path  # the resolved logdir it was found under: nothing outside it is ever read

    def report_file(self, name: str) -> Path:
        """`name` in the run's report folder; ValueError when it is a link leading outside the
        logdir (report.json itself is checked when the run is found, the others here)."""
        assert self.report_dir is not None
        path = self.report_dir / name
        if path.is_symlink() and not _inside(path, self.root):
            raise ValueError(f"{name} links outside the TensorBoard logdir; it is not read")
        return path


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
    except (ValueError, OSError):
        return False
    return True


def _name(path: Path, root: Path) -> str:
    rel = path.resolve().relative_to(root).as_posix()
    return root.name if rel == "." else rel


def find_runs(logdir: str | os.PathLike[str] | None) -> dict[str, RunEntry]:
    """1. walk the logdir (symlinked folders not followed; tb/, steps/ and hidden folders
    skipped); 2. a folder with report.json is a report, its run the parent when the folder is
    named `report`; 3. a folder with per-rank traces is a trace folder; 4. trace folders of one
    parent below the logdir that has no traces of its own, 2 or more of them, are one
    multi-node run (directly under the logdir, each folder is a run of its own);
    5. trace folders inside a reported run, or read by its report (`input_dirs`), are that
    run's."""
    if not logdir or not Path(logdir).is_dir():
        return {}
    root = Path(logdir).resolve()
    reports: dict[Path, Path] = {}  # run_dir -> report_dir
    traces: dict[Path, int] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith("."))
        here = Path(dirpath)
        if REPORT_JSON in filenames and _inside(here / REPORT_JSON, root):
            reports[here.parent if here.name == REPORT_DIR and here != root else here] = here
            continue
        n = sum(
            1
            for f in filenames
            if f != MERGED_TRACE and (TRACE_PATTERN.match(f) or is_summary(here / f)) and _inside(here / f, root)
        )
        if n:
            traces[here] = n
    by_parent: dict[Path, list[Path]] = {}
    for d in traces:
        if d.parent != root and d != root:
            by_parent.setdefault(d.parent, []).append(d)
    for parent, children in by_parent.items():
        if parent not in traces and len(children) > 1:
            traces[parent] = sum(traces.pop(c) for c in children)
    covered: dict[Path, set[Path]] = {r: _input_dirs(rep / REPORT_JSON) for r, rep in reports.items()}

    def owner(d: Path) -> Path | None:
        return next((r for r in reports if d == r or r in d.parents or d in covered[r]), None)

    runs: dict[str, RunEntry] = {}
    counts: dict[Path, int] = dict.fromkeys(reports, 0)
    for d, n in traces.items():
        r = owner(d)
        if r is None:
            runs[_name(d, root)] = RunEntry(_name(d, root), d, None, n, root)
        else:
            counts[r] += n
    for run_dir, report_dir in reports.items():
        runs[_name(run_dir, root)] = RunEntry(_name(run_dir, root), run_dir, report_dir, counts[run_dir], root)
    return dict(sorted(runs.items()))


_INPUTS_CACHE: dict[Path, tuple[tuple[int, int], set[Path]]] = {}
# Every run lookup of every request reads this cache: one reader parses a new report, the others
# wait for its answer instead of each parsing the same large file at once.
_INPUTS_LOCK = threading.Lock()


def _input_dirs(report_json: Path) -> set[Path]:
    """The report's `input_dirs`, cached by the file's mtime and size (reports can be large and
    the run list is asked for often); empty when unreadable."""
    with _INPUTS_LOCK:
        try:
            st = report_json.stat()
            key = (st.st_mtime_ns, st.st_size)
            hit = _INPUTS_CACHE.get(report_json)
            if hit and hit[0] == key:
                return hit[1]
            dirs = {Path(p) for p in (read_json(report_json) or {}).get("input_dirs", []) if isinstance(p, str)}
        except (OSError, ValueError):
            return set()
        _INPUTS_CACHE[report_json] = (key, dirs)
        return dirs


def unless_missing(look: Callable[[], T], path: Path) -> T | None:
    """`look()` at a report folder's file: None when the file is missing, ValueError naming it
    when it cannot be read (the page shows that line)."""
    try:
        return look()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"cannot read {path.name}: {exc.strerror}") from None


# The largest report-folder file the view reads into TensorBoard's memory. The collector's
# report.json and timeline.json are a few MB even at 1024 ranks; a larger one was not written by
# it, and reading it would cost every run's pages the memory it takes.
MAX_VIEW_FILE_BYTES = 256 * 2**20


def read_report_file(path: Path) -> bytes:
    """A report folder's file, whole; ValueError past MAX_VIEW_FILE_BYTES (OSError as open raises it)."""
    size = path.stat().st_size
    if size > MAX_VIEW_FILE_BYTES:
        raise ValueError(
            f"{path.name} is {size / 2**20:.0f} MB, more than the {MAX_VIEW_FILE_BYTES // 2**20} MB the view reads "
            "(harness.collect writes a few MB); re-run the collector"
        )
    return path.read_bytes()


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a report folder, or None when missing (raises ValueError when unreadable)."""
    data = unless_missing(lambda: read_report_file(path), path)
    return None if data is None else parse_json_object(data, path.name)


def parse_json_object(data: bytes, name: str) -> dict[str, Any]:
    """The JSON object in `data` (UTF-8), the contents of file `name`; ValueError saying why not."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{name} is not valid JSON (not UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{name} is not a JSON object")
    return doc


def load_view_data(entry: RunEntry) -> tuple[Report, dict[str, Any] | None]:
    """(report, timeline) of a run with a report; ValueError when the report is unusable."""
    assert entry.report_dir is not None
    doc = read_json(entry.report_file(REPORT_JSON))
    if doc is None:
        raise ValueError("report.json disappeared; re-run the collector")
    if doc.get("schema_version") != SCHEMA_VERSION or "verdict" not in doc:
        raise ValueError(
            f"report.json was not written by harness.collect (schema_version {SCHEMA_VERSION}); re-run the collector"
        )
    return load_report(doc), read_json(entry.report_file(TIMELINE_JSON))
