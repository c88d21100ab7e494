"""One side of a comparison, read from what a run left: its step logs (every step of every rank,
the statistics' samples), its collector report (stragglers, communication, host ops, memory,
verdict) and run.json (what ran). A run folder, a report folder or a report.json will do."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.paths import REPORT_DIR, REPORT_JSON, RUN_FILE, STEPS_DIR, STEPS_PATTERN

# report.json versions whose fields this reads: 2 renamed steps[].lag_ms to blame_ms, which a
# comparison does not read
READABLE_VERSIONS = (1, 2)


class CompareError(ValueError):
    """Input that cannot be compared; the message says which and what to do (exit 2)."""


@dataclass
class Side:
    """A run as the comparison reads it. `steps`: per rank, its measured steps (warm-up left
    out) as {step: (step_ms, phases_ms)}; `report`: the collector's report.json, when there is
    one; `run`: run.json, when there is one."""

    label: str
    path: Path
    run_dir: Path | None
    steps: dict[int, dict[int, tuple[float, dict[str, float]]]] = field(default_factory=dict)
    report: dict[str, Any] | None = None
    run: dict[str, Any] | None = None
    source: str = ""  # where the step times came from: "step logs" or "the report's traced steps"
    skipped_lines: int = 0

    def step_series(self) -> list[float]:
        """The run's step time per step, in step order: the mean over the ranks that logged it,
        over the steps every rank logged (a step the job took is as long as its ranks' mean;
        a rank that stopped early leaves its last steps out rather than bias them)."""
        if not self.steps:
            return []
        common = set.intersection(*(set(s) for s in self.steps.values()))
        if not common:
            common = set().union(*(set(s) for s in self.steps.values()))
        out = []
        for n in sorted(common):
            times = [s[n][0] for s in self.steps.values() if n in s]
            out.append(sum(times) / len(times))
        return out

    def phase_medians(self) -> dict[int, dict[str, float]]:
        """Per rank, per phase, its median time per step (ms)."""
        out: dict[int, dict[str, float]] = {}
        for rank, steps in self.steps.items():
            by_phase: dict[str, list[float]] = {}
            for _, phases in steps.values():
                for name, ms in phases.items():
                    by_phase.setdefault(name, []).append(ms)
            out[rank] = {name: statistics.median(v) for name, v in by_phase.items()}
        return out

    def workload(self) -> dict[str, Any]:
        """What ran (run.json's workload section, or nothing)."""
        config = (self.run or {}).get("config") or {}
        return dict(config.get("workload") or {})

    def world_size(self) -> int | None:
        if self.run and isinstance(self.run.get("world_size"), int):
            return int(self.run["world_size"])
        if self.report:
            return (self.report.get("run") or {}).get("world_size")
        return len(self.steps) or None


def _json_object(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise CompareError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: not valid JSON ({exc}); re-run what wrote it") from None
    if not isinstance(doc, dict):
        raise CompareError(f"{path}: not a JSON object")
    return doc


def _report(path: Path) -> dict[str, Any]:
    doc = _json_object(path)
    if doc.get("schema_version") not in READABLE_VERSIONS or "verdict" not in doc:
        raise CompareError(
            f"{path}: not a report of harness.collect (schema_version {' or '.join(map(str, READABLE_VERSIONS))}); "
            "re-run the collector"
        )
    return doc


def _read_steps(run_dir: Path, side: Side) -> None:
    folder = run_dir / STEPS_DIR
    for path in sorted(folder.glob("rank*.jsonl")) if folder.is_dir() else []:
        m = STEPS_PATTERN.match(path.name)
        if not m:
            continue
        steps: dict[int, tuple[float, dict[str, float]]] = {}
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as exc:
            raise CompareError(f"{path}: cannot read ({exc.strerror})") from None
        for line in lines:
            try:
                rec = json.loads(line)
                if rec.get("warmup"):
                    continue
                step, ms = int(rec["step"]), float(rec["step_ms"])
                phases = {str(k): float(v) for k, v in (rec.get("phases_ms") or {}).items()}
            except (ValueError, TypeError, KeyError, AttributeError):
                side.skipped_lines += 1  # a line cut short by a kill, or not ours
                continue
            steps[step] = (ms, phases)
        if steps:
            side.steps[int(m["rank"])] = steps
    if side.steps:
        side.source = "step logs"


def _steps_from_report(report: dict[str, Any], side: Side) -> None:
    for row in report.get("steps") or []:
        try:
            rank, step, ms = int(row["rank"]), int(row["step"]), float(row["step_ms"])
        except (ValueError, TypeError, KeyError):
            continue
        side.steps.setdefault(rank, {})[step] = (ms, {})
    if side.steps:
        side.source = "the report's traced steps"


def load_side(text: str) -> Side:  # noqa: C901
    """The side at `text`: a run folder (steps/, run.json; its report/ read too), a report
    folder (report.json; its run's step logs read too, from the report's input folders), or a
    report.json. CompareError when it is none of those or holds no step time."""
    path = Path(text)
    if not path.exists():
        raise CompareError(f"{path}: no such file or folder")
    report_file = None
    run_dir = None
    if path.is_file():
        report_file = path
    elif (path / REPORT_JSON).is_file():
        report_file = path / REPORT_JSON
    elif (path / STEPS_DIR).is_dir() or (path / RUN_FILE).is_file():
        run_dir = path
        if (path / REPORT_DIR / REPORT_JSON).is_file():
            report_file = path / REPORT_DIR / REPORT_JSON
    else:
        raise CompareError(
            f"{path}: neither a run folder (steps/, run.json) nor a collector report (report.json); "
            "give the folder harness.train wrote, or its report/"
        )
    report = _report(report_file) if report_file is not None else None
    if run_dir is None and report is not None:
        for d in report.get("input_dirs") or []:
            if isinstance(d, str) and ((Path(d) / STEPS_DIR).is_dir() or (Path(d) / RUN_FILE).is_file()):
                run_dir = Path(d)
                break
        if run_dir is None and report_file is not None and report_file.parent.name == REPORT_DIR:
            parent = report_file.parent.parent
            if (parent / STEPS_DIR).is_dir():
                run_dir = parent
    label = (run_dir or path).name if (run_dir or path).name != REPORT_DIR else (run_dir or path).parent.name
    side = Side(label=label, path=path, run_dir=run_dir, report=report)
    if run_dir is not None:
        _read_steps(run_dir, side)
        if (run_dir / RUN_FILE).is_file():
            try:
                side.run = _json_object(run_dir / RUN_FILE)
            except CompareError:
                side.run = None  # run.json only names the workload: compare without it
    if not side.steps and report is not None:
        _steps_from_report(report, side)
    if not side.steps:
        raise CompareError(
            f"{path}: no step times (no steps/rank<R>.jsonl with measured steps, no report with steps); "
            "run longer than --warmup-steps, or collect its traces"
        )
    return side
