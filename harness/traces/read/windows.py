"""Which profiler window the collector analyses (`--window`): a run's windows can be far apart
in time (the scheduled one at step 11, one the live watch captured at step 53 when a rank turned
slow), and analysed together a straggler in one is diluted by the healthy steps of the other."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harness.paths import (
    TRACE_PATTERN,
    WINDOW_MAX_DIGITS,
    WORKER_RANK_PATTERN,
    is_summary,
    run_file,
    trace_of_summary,
)
from harness.traces.read.discover import InputError, RunSet
from harness.traces.read.watch_log import CaptureRecord, WatchRecord


def harness_name(path: Path) -> tuple[int, int] | None:
    """(rank, window) of a trace (or its summary) the harness wrote, from its name
    (rank00002-host.0003.pt.trace.json.gz -> (2, 3)); None for a name the harness did not write
    (torch's tensorboard_trace_handler puts a timestamp where the window number goes)."""
    m = TRACE_PATTERN.match((trace_of_summary(path) if is_summary(path) else path).name)
    if m is None or m["span"] is None or len(m["span"]) > WINDOW_MAX_DIGITS:
        return None
    w = WORKER_RANK_PATTERN.match(m["worker"])
    return (int(w["rank"]), int(m["span"])) if w else None


def trace_window(path: Path) -> int | None:
    """The harness profiler window a trace (or its summary) holds (`harness_name`), else None."""
    named = harness_name(path)
    return named[1] if named else None


@dataclass(frozen=True)
class WindowPick:
    """Which profiler window is analysed: `window` of `windows` (every window number present);
    window None: all of them (or traces without window numbers)."""

    window: int | None = None
    windows: tuple[int, ...] = ()
    note: str | None = None  # why the latest window was not taken


def pick_window(files: list[Path], choice: str) -> tuple[list[Path], WindowPick]:
    """The trace files of one profiler window (`choice`: a window number, "latest" or "all").

    1. each file's window from its name (`trace_window`);
    2. "all", or files without window numbers (third-party names): every file;
    3. "latest": the highest window number that every rank with traces holds (a rank that
       could not write a later window, e.g. on a full disk, would otherwise go missing from the
       analysis, and it may be the straggler; the note says so), else the highest present; a
       number: that window, refused when no file holds it.
    """
    named = {f: harness_name(f) for f in files}
    numbered = {f: n[1] if n else None for f, n in named.items()}
    windows = tuple(sorted({w for w in numbered.values() if w is not None}))
    if choice not in ("all", "latest") and not windows:
        raise InputError(
            f"--window {choice}: these traces carry no harness window number (names such as "
            "rank00000-host.0002.pt.trace.json.gz); use --window all"
        )
    if choice == "all" or not windows:
        return files, WindowPick(windows=windows)
    note = None
    if choice == "latest":
        held: dict[int, set[int]] = {}
        for n in named.values():
            if n is not None:
                held.setdefault(n[1], set()).add(n[0])
        ranks = set().union(*held.values())
        complete = [w for w in windows if held[w] == ranks]
        window = complete[-1] if complete else windows[-1]
        if window != windows[-1]:
            lacking = ", ".join(map(str, sorted(ranks - held[windows[-1]])))
            note = (
                f"window {windows[-1]} lacks rank(s) {lacking}; "
                f"analysing window {window}, the latest every rank wrote (--window {windows[-1]} for that one)"
            )
    else:
        window = int(choice)
    if window not in windows:
        raise InputError(f"--window {window}: no trace of that window; windows present: {', '.join(map(str, windows))}")
    return [f for f in files if numbered[f] == window], WindowPick(window=window, windows=windows, note=note)


@dataclass(kw_only=True)
class WindowRecord:
    """`window`: the profiler window analysed (--window); null for traces without harness window
    numbers."""

    window: int | None
    """the window analysed (null: all of them)"""
    windows: list[int]
    """every window the traces hold"""
    steps: list[int] | None
    """[first, last] step analysed"""
    captured: CaptureRecord | None
    """the capture that recorded those steps (the live watch's or one asked for through the debug
    server), else null"""


def window_entry(
    pick: WindowPick, runset: RunSet, watch: WatchRecord | None, requested: list[CaptureRecord] | None = None
) -> WindowRecord | None:
    """report.json `window`; None when the traces carry no window numbers. Its capture is the
    live watch's (from `watch`: run.json's record, `watch_log.read_watch`) or one asked for through
    the debug server (from `requested`: `read_requested`) whose steps hold those analysed."""
    if not pick.windows:
        return None
    steps = [s.number for t in runset.ranks for s in t.steps if s.number is not None]
    span = [min(steps), max(steps)] if steps else None
    captured = None
    if span:
        for capture in [*(watch.captures if watch else []), *(requested or [])]:
            if capture.first <= span[0] and span[1] <= capture.last:
                captured = capture
    return WindowRecord(window=pick.window, windows=list(pick.windows), steps=span, captured=captured)


def read_requested(dirs: list[Path]) -> list[CaptureRecord]:
    """run.json's `debug_server.captures` (the captures asked for through the debug server) from
    the first input folder that has them; [] for none, or where a field is not a step number."""
    for d in dirs:
        try:
            record = json.loads(run_file(d).read_text()).get("debug_server")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("captures"), list):
            keys = ("first", "last", "requested_at_step")
            found = [c for c in record["captures"] if isinstance(c, dict)]
            return [CaptureRecord.from_doc(c) for c in found if all(isinstance(c.get(k), int) for k in keys)]
    return []


def window_line(entry: WindowRecord) -> str:
    """The console's `window:` line."""
    which = "all windows" if entry.window is None else f"window {entry.window}"
    text = f"{which} of {', '.join(map(str, entry.windows))}"
    if entry.steps:
        text += f" (steps {entry.steps[0]}-{entry.steps[1]})"
    c = entry.captured
    if c and c.ranks is not None:
        text += f", traced when the live watch flagged rank(s) {', '.join(map(str, c.ranks))} at step {c.watch_step}"
    elif c:
        text += f", traced when asked through the debug server at step {c.requested_at_step}"
    if len(entry.windows) > 1:
        text += "; --window N or all for others"
    return text
