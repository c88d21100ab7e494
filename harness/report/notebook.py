"""A report in a notebook: `harness.load(path)`.

    import harness
    report = harness.load("profiler_logs/mine")      # a run folder, a report folder or report.json
    report.verdict, report.stragglers[0].phase       # typed records (report/records.py)
    report.ranks, report.steps, report.collectives   # pandas DataFrames, one row per record
    report.timeline_figure()                         # plotly: each rank's steps and phases in time
    report.breakdown_figure()                        # plotly: where each step's time went

It reads what the collector wrote (report.json, collectives.csv, timeline.json) and imports no
torch. pandas is an optional dependency (the `notebook` extra); plotly is a dependency already.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from harness.paths import COLLECTIVES_CSV, TIMELINE_JSON
from harness.report.records import NoiseFloorRecord, RankRecord, RunRecord, StepRecord, StragglerRecord
from harness.report.summary import SummaryError, read_report

if TYPE_CHECKING:
    import pandas as pd
    from plotly.graph_objects import Figure

R = TypeVar("R")
# The parts of a step's time, in the order the breakdown stacks them (StepRecord's fields: they
# add up to the step on every rank, tests/identities.py).
STEP_PARTS = ("compute_ms", "exposed_wait_ms", "exposed_transfer_ms", "memcpy_ms", "idle_ms")


class LoadError(ValueError):
    """A path that holds no report; the message says what to run."""


def _record(cls: type[R], row: dict[str, Any]) -> R:
    """`row` as a `cls` record: keys the record does not know (a newer report) are left out, and
    fields the row lacks (an older one) are None."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{name: row.get(name) for name in names})


def _frame(rows: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
    try:
        import pandas as pd
    except ImportError:
        raise LoadError(
            "pandas is not installed: pip install 'torch-dist-profiler-harness[notebook]' (or pip install pandas)"
        ) from None
    return pd.DataFrame(rows, columns=columns)


@dataclass
class Report:
    """A collected report as typed records and tables.

    `doc` is report.json as written; `folder` the report folder (None where a dict was given).
    The records: `run`, `stragglers`, `noise_floor` (None where no straggler analysis ran). The
    DataFrames (built on first use): `ranks`, `steps`, `collectives` (one row per collective
    instance and rank, from collectives.csv; the per-collective table where that file is
    missing), `collective_stats`, `gaps`, `straggler_table`, `diagnosis`."""

    doc: dict[str, Any]
    folder: Path | None
    run: RunRecord = field(init=False)
    stragglers: list[StragglerRecord] = field(init=False)
    noise_floor: NoiseFloorRecord | None = field(init=False)

    def __post_init__(self) -> None:
        self.run = _record(RunRecord, self.doc.get("run") or {})
        self.stragglers = [_record(StragglerRecord, s) for s in self.doc.get("stragglers") or []]
        floor = self.doc.get("noise_floor")
        self.noise_floor = _record(NoiseFloorRecord, floor) if floor else None

    @property
    def verdict(self) -> str:
        return str(self.doc["verdict"])

    @property
    def headline(self) -> str:
        return str(self.doc.get("headline") or self.verdict)

    @property
    def rank_records(self) -> list[RankRecord]:
        return [_record(RankRecord, r) for r in self.doc.get("ranks") or []]

    @property
    def step_records(self) -> list[StepRecord]:
        return [_record(StepRecord, s) for s in self.doc.get("steps") or []]

    @property
    def ranks(self) -> pd.DataFrame:
        return _frame(self.doc.get("ranks") or [], [f.name for f in dataclasses.fields(RankRecord)])

    @property
    def steps(self) -> pd.DataFrame:
        return _frame(self.doc.get("steps") or [], [f.name for f in dataclasses.fields(StepRecord)])

    @property
    def straggler_table(self) -> pd.DataFrame:
        return _frame(self.doc.get("stragglers") or [], [f.name for f in dataclasses.fields(StragglerRecord)])

    @property
    def gaps(self) -> pd.DataFrame:
        return _frame(self.doc.get("gaps") or [], ["rank", "step", "start_us", "dur_us", "kind", "collective"])

    @property
    def diagnosis(self) -> pd.DataFrame:
        rows = [
            {k: d.get(k) for k in ("rank", "host", "bottleneck", "reason", "advice")} for d in self.doc["diagnosis"]
        ]
        return _frame(rows, ["rank", "host", "bottleneck", "reason", "advice"])

    @property
    def collective_stats(self) -> pd.DataFrame:
        return _frame(self.doc.get("collective_stats") or [])

    @property
    def collectives(self) -> pd.DataFrame:
        path = self.folder / COLLECTIVES_CSV if self.folder else None
        if path is None or not path.is_file():
            return self.collective_stats
        with path.open(newline="") as f:
            rows: list[dict[str, Any]] = list(csv.DictReader(f))
        frame = _frame(rows)
        for name in frame.columns:
            if name not in ("name", "pg"):
                frame[name] = frame[name].apply(_number)
        return frame

    def timeline(self) -> dict[str, Any] | None:
        """timeline.json (the view's per-rank spans), None where the folder has none."""
        path = self.folder / TIMELINE_JSON if self.folder else None
        if path is None or not path.is_file():
            return None
        doc = json.loads(path.read_text())
        return doc if isinstance(doc, dict) else None

    def timeline_figure(self) -> Figure:
        """Each rank's steps and phases on the aligned clock (timeline.json): one row per rank,
        one bar per phase, the stragglers' rows named as such."""
        import plotly.graph_objects as go

        doc = self.timeline()
        if doc is None:
            raise LoadError("no timeline.json beside this report: collect the run again to draw its timeline")
        late = {s.rank for s in self.stragglers}
        fig = go.Figure()
        by_phase: dict[str, dict[str, list[Any]]] = {}
        for r in doc["ranks"]:
            label = f"rank {r['rank']}" + (" (straggler)" if r["rank"] in late else "")
            for phase, step, start, end in r.get("phases") or []:
                bars = by_phase.setdefault(phase, {"y": [], "x": [], "base": [], "text": []})
                bars["y"].append(label)
                bars["x"].append(end - start)
                bars["base"].append(start)
                bars["text"].append(f"step {step}")
            if not r.get("phases"):
                for step, start, end in r.get("steps") or []:
                    bars = by_phase.setdefault("step", {"y": [], "x": [], "base": [], "text": []})
                    bars["y"].append(label)
                    bars["x"].append(end - start)
                    bars["base"].append(start)
                    bars["text"].append(f"step {step}")
        for phase, bars in by_phase.items():
            fig.add_trace(
                go.Bar(
                    name=phase,
                    orientation="h",
                    y=bars["y"],
                    x=bars["x"],
                    base=bars["base"],
                    hovertext=bars["text"],
                )
            )
        fig.update_layout(
            barmode="overlay",
            title=self.headline,
            xaxis_title=f"time since the first step ({doc.get('unit', 'ms')}, aligned clocks)",
            yaxis={"autorange": "reversed"},
        )
        return fig

    def breakdown_figure(self) -> Figure:
        """Where each step's time went (report.json's steps), stacked per rank and step:
        compute, exposed waiting for later peers, exposed transfer, copies and idle."""
        import plotly.graph_objects as go

        steps = self.step_records
        x = [[f"step {s.step}" for s in steps], [f"rank {s.rank}" for s in steps]]
        fig = go.Figure()
        for part in STEP_PARTS:
            name = part.removesuffix("_ms").replace("_", " ")
            fig.add_trace(go.Bar(name=name, x=x, y=[getattr(s, part) or 0.0 for s in steps]))
        fig.update_layout(barmode="stack", title="Where each step's time went", yaxis_title="ms")
        return fig


def _number(text: str) -> Any:
    if text in ("", None):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def load(path: str | Path) -> Report:
    """The report at `path`: a run folder (its report/), a report folder, or a report.json."""
    where = Path(path)
    try:
        doc, json_path = read_report(where)
    except SummaryError as exc:
        raise LoadError(str(exc)) from None
    return Report(doc=doc, folder=json_path.parent)
