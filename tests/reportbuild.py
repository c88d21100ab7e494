"""Reports built by hand for tests of what reads them (the verdict's words, the watch's verdict,
the console): every record field set, those a test does not name to a plain default."""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.report.records import (
    SCHEMA_VERSION,
    ClockRecord,
    CollectivesRecord,
    NextStepRecord,
    NoiseFloorRecord,
    RankRecord,
    Report,
    RunRecord,
    StragglerRecord,
)
from harness.traces.analyse.advisor import Diagnosis, Evidence
from harness.traces.read.watch_log import WatchFlagRecord, WatchRecord
from harness.traces.read.windows import WindowRecord


def run_record(**fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "run_id": None,
        "world_size": None,
        "ranks_present": [],
        "ranks_missing": [],
        "complete": True,
        "ending": [],
        "skipped_windows": [],
        "hosts": [],
        "device": "cpu",
        "steps_source": [],
        "steps": [],
        "median_step_ms": None,
        "replayed_step_ms": None,
        "measured_step_ms": None,
        "replay_faithful": False,
        "whatif_all_fixed_step_ms": None,
    }
    return RunRecord(**(base | fields))


def straggler_record(rank: int, **fields: Any) -> StragglerRecord:
    base: dict[str, Any] = {
        "rank": rank,
        "host": "a",
        "phase": None,
        "phase_excess_ms": None,
        "late_ms": 1.0,
        "beyond_peers_ms": 1.0,
        "core_wait_ms": None,
        "cost_ms": 1.0,
        "blame_ms": 1.0,
        "wait_ms": 0.0,
        "late_fraction": 1.0,
        "steps_late": 10,
        "steps": 10,
        "pattern": "persistent",
        "last_fraction": 1.0,
        "whatif_step_ms": None,
        "mean_step_ms": None,
        "syncs": {},
        "gpu": None,
    }
    return StragglerRecord(**(base | fields))


def noise_floor(**fields: Any) -> NoiseFloorRecord:
    base: dict[str, Any] = {
        "bound_ms": 0.6,
        "clean_step_ms": 3.0,
        "share": 0.2,
        "set_by": "jitter",
        "noise_limited": True,
        "jitter_measured": True,
        "noise_model": "shared CPU cores",
        "latest_rank": 1,
        "latest_beyond_ms": 0.3,
    }
    return NoiseFloorRecord(**(base | fields))


def next_step(about: str, ranks: list[int], text: str) -> NextStepRecord:
    return NextStepRecord(about=about, ranks=ranks, text=text)


def flag(step: int, rank: int, phase: str | None = "forward", host: str = "a") -> WatchFlagRecord:
    return WatchFlagRecord(step=step, rank=rank, host=host, phase=phase)


def watch_of(*flags: WatchFlagRecord, intervals: int = 5) -> WatchRecord:
    return WatchRecord(every=5, intervals=intervals, judged_steps=None, flags=list(flags), captures=[])


def window_of(first: int, last: int) -> WindowRecord:
    return WindowRecord(window=None, windows=[], steps=[first, last], captured=None)


def report_of(**fields: Any) -> Report:
    """A Report with `fields` set and every other field empty: a balanced verdict over no rank."""
    base: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "inputs": ["x"],
        "input_dirs": [],
        "verdict": "balanced",
        "verdict_reason": None,
        "headline": "balanced: ...",
        "run": run_record(),
        "stragglers": [],
        "diagnosis": [],
        "diagnosis_summary": "",
        "ranks": [],
        "hosts": [],
        "steps": [],
        "gaps": [],
        "gaps_total": 0,
        "process_groups": [],
        "collective_stats": [],
        "collectives": CollectivesRecord(matched=0, by_name={}),
        "clock": ClockRecord(aligned=False, reference_rank=None, reference_host=None, hosts=[]),
        "threshold_ms": 0.6,
        "bounds_ms": {},
        "noise_floor": None,
        "warnings": [],
        "next_steps": [],
    }
    return Report(**(base | fields))


def rank_record(rank: int, **fields: Any) -> RankRecord:
    """A RankRecord with `fields` set and every other figure None."""
    base: dict[str, Any] = {f.name: None for f in dataclasses.fields(RankRecord)}
    return RankRecord(**(base | {"rank": rank, "host": "h", "waits_for": []} | fields))


def diagnosis_of(rank: int, bottleneck: str, reason: str) -> Diagnosis:
    return Diagnosis(
        rank=rank, host="h", bottleneck=bottleneck, reason=reason, evidence=Evidence(), advice="", waits_for=[]
    )
