"""The live watch's record of a run as the collector reads it (run.json `watch`, written by
harness/watch/exchange.py), and its one-line summary, shared by the training printout and the report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.paths import run_file


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _float_or_none(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


@dataclass(kw_only=True)
class CaptureRecord:
    """`window.captured` and `watch.captures[]`: a profiler window opened on request, by the live
    watch (watch_step and ranks set) or through the debug server (requested_at_step set)."""

    first: int
    """the first step traced"""
    last: int
    """the last step traced"""
    watch_step: int | None = None
    """the step at which the watch flagged ranks (null: asked through the debug server)"""
    ranks: list[int] | None = None
    """the ranks the watch flagged"""
    start: int | None = None
    """debug server: the step the capture was planned to start at"""
    id: str | None = None
    """debug server: the capture's id"""
    requested_at_step: int | None = None
    """debug server: the step at which it was asked for"""
    requested_by: str | None = None
    """debug server: who asked"""

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> CaptureRecord:
        """From run.json's entry, its first and last already checked to be ints (a hand-edited
        file may hold anything else: what is not of its type reads as null)."""
        ranks = doc.get("ranks")
        return cls(
            first=doc["first"],
            last=doc["last"],
            watch_step=_int_or_none(doc.get("watch_step")),
            ranks=[r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else None,
            start=_int_or_none(doc.get("start")),
            id=None if doc.get("id") is None else str(doc["id"]),
            requested_at_step=_int_or_none(doc.get("requested_at_step")),
            requested_by=_str_or_none(doc.get("requested_by")),
        )


@dataclass(kw_only=True)
class WatchFlagRecord:
    """`watch.flags[]`: a rank the live watch flagged at the end of an interval."""

    step: int
    """the last step of the interval it was judged on"""
    rank: int
    """the rank"""
    host: str | None = None
    """its host"""
    phase: str | None = None
    """the phase it was slow in"""
    late_ms: float | None = None
    """its lateness beyond its peers in that interval, per step"""
    gpu: str | None = None
    """its GPU against its peers' where it ran slower"""


@dataclass(kw_only=True)
class WatchRecord:
    """`watch`: the live straggler watch's record from run.json; null when it was off or there is
    no run.json."""

    every: int
    """its interval, in steps"""
    intervals: int
    """the intervals it judged"""
    judged_steps: list[int] | None
    """[first, last] step its judged intervals held (null: none judged, or a run.json older than the field)"""
    flags: list[WatchFlagRecord]
    """the ranks it flagged"""
    captures: list[CaptureRecord]
    """the profiler windows it opened"""


def watch_record(watch: Any) -> WatchRecord | None:
    """run.json's `watch` (`Watch.summary()`) as a record, None where the watch was off (a
    hand-edited file may hold anything: entries without their int fields are left out)."""
    if not (isinstance(watch, dict) and isinstance(watch.get("every"), int) and watch["every"] > 0):
        return None
    flags = [f for f in watch.get("flags", []) if _has_ints(f, "rank", "step")]
    captures = [
        c
        for c in watch.get("captures", [])
        if _has_ints(c, "first", "last", "watch_step") and isinstance(c.get("ranks"), list)
    ]
    return WatchRecord(
        every=watch["every"],
        intervals=_int_or_none(watch.get("intervals")) or 0,
        judged_steps=_step_range(watch.get("judged_steps")),
        flags=[
            WatchFlagRecord(
                step=f["step"],
                rank=f["rank"],
                host=_str_or_none(f.get("host")),
                phase=_str_or_none(f.get("phase")),
                late_ms=_float_or_none(f.get("late_ms")),
                gpu=_str_or_none(f.get("gpu")),
            )
            for f in flags
        ],
        captures=[CaptureRecord.from_doc(c) for c in captures],
    )


def read_watch(dirs: list[Path]) -> WatchRecord | None:
    """run.json's `watch` from the first input folder that has one (rank 0's node writes
    run.json), or None: no run.json (third-party traces, a run that did not finish) or the watch
    was off."""
    for d in dirs:
        try:
            watch = json.loads(run_file(d).read_text()).get("watch")
        except (OSError, ValueError, AttributeError):
            continue
        record = watch_record(watch)
        if record is not None:
            return record
    return None


def _step_range(value: Any) -> list[int] | None:
    """[first, last] steps, or None for anything else (a hand-edited file may hold anything)."""
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
    return value if ok and value[0] <= value[1] else None


def _has_ints(entry: Any, *keys: str) -> bool:
    """An entry of run.json's watch (a hand-edited file may hold anything) with these int fields."""
    return isinstance(entry, dict) and all(isinstance(entry.get(k), int) for k in keys)


def watch_line(watch: WatchRecord) -> str:
    """The watch's record in one line (the training printout, the report): its interval, what it
    flagged, what it captured."""
    text = f"every {watch.every} steps, {watch.intervals} interval(s) judged"
    if not watch.flags:
        return text + ", no straggler"
    flags = ", ".join(f"rank {f.rank} at step {f.step}" + (f" ({f.phase})" if f.phase else "") for f in watch.flags)
    caps = ", ".join(f"steps {c.first}-{c.last}" for c in watch.captures)
    return f"{text}; straggler(s): {flags}" + (f"; traced {caps}" if caps else "")
