"""`harness.load(path)`: a collected report as typed records, DataFrames and plotly figures, with
exact answers on a hand-built job; and examples/straggler_notebook.ipynb executed from a run
folder to the straggler (nbclient), so the example never rots."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import harness
from harness.collect import command
from harness.paths import trace_path
from harness.report.notebook import STEP_PARTS, LoadError

from jobs import REPO
from tracebuild import cpu_ring_docs, write

NOTEBOOK = REPO / "examples" / "straggler_notebook.ipynb"
STEPS = 6
SLEEP_US = 3000.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two CPU ranks, 6 steps; rank 1 sleeps 3 ms before every all-reduce: collected."""
    folder = tmp_path_factory.mktemp("notebook") / "run"
    docs = cpu_ring_docs(2, STEPS, sleep_us=lambda r, s: SLEEP_US if r == 1 else 0.0, forward_range=True)
    for r, doc in enumerate(docs):
        write(trace_path(folder, r, "vm", 1), doc)
    command.main([str(folder), "-q", "--no-merged", "-j", "1"])
    return folder


def test_a_run_folder_loads_as_records_and_tables(run: Path) -> None:
    report = harness.load(run)
    assert report.verdict == "straggler" and report.headline.startswith("straggler: rank 1")
    assert [(s.rank, s.steps_late, s.steps) for s in report.stragglers] == [(1, STEPS, STEPS)]
    assert report.stragglers[0].late_ms == pytest.approx(SLEEP_US / 1e3)
    assert report.run.world_size == 2 and report.run.steps == list(range(1, STEPS + 1))
    assert report.noise_floor is not None and report.noise_floor.latest_rank == 1
    ranks = report.ranks.set_index("rank")
    assert list(ranks.index) == [0, 1]
    assert ranks.loc[0, "wait_ms"] == pytest.approx(STEPS * SLEEP_US / 1e3)  # rank 0 waits for it every step
    steps = report.steps
    assert len(steps) == 2 * STEPS
    assert (steps[list(STEP_PARTS)].sum(axis=1) - steps["step_ms"]).abs().max() < 1e-3  # the parts add up
    collectives = report.collectives
    assert len(collectives) == 2 * STEPS and set(collectives["rank"]) == {0, 1}
    assert collectives.loc[collectives["rank"] == 0, "wait_us"].tolist() == pytest.approx([SLEEP_US] * STEPS)
    assert set(report.gaps.columns) >= {"rank", "step", "kind", "dur_us"}
    assert report.diagnosis.set_index("rank").loc[1, "bottleneck"] == "straggler"
    assert report.straggler_table["rank"].tolist() == [1]


def test_the_figures_draw_the_phases_and_the_parts_of_each_step(run: Path) -> None:
    report = harness.load(run / "report")
    timeline = report.timeline_figure()
    assert "forward" in {t.name for t in timeline.data}
    assert any("(straggler)" in y for t in timeline.data for y in t.y)
    breakdown = report.breakdown_figure()
    assert [t.name for t in breakdown.data] == [p.removesuffix("_ms").replace("_", " ") for p in STEP_PARTS]
    assert all(len(t.y) == 2 * STEPS for t in breakdown.data)


def test_load_reads_report_json_itself_and_refuses_a_folder_without_one(run: Path, tmp_path: Path) -> None:
    assert harness.load(run / "report" / "report.json").verdict == "straggler"
    with pytest.raises(LoadError, match="python -m harness.collect"):
        harness.load(tmp_path)
    (tmp_path / "report.json").write_text("[1]")
    with pytest.raises(LoadError, match="not the collector's report.json"):
        harness.load(tmp_path)


def test_the_example_notebook_goes_from_the_run_folder_to_the_straggler(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    monkeypatch.setenv("HARNESS_RUN", str(run))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    text = json.dumps([o for c in nb.cells if c.cell_type == "code" for o in c.outputs])
    assert "straggler: rank 1 in outside its ranges, 3.00 ms per step late" in text
    assert "application/vnd.plotly.v1+json" in text  # both figures rendered
