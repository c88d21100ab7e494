"""Every script under bench/ runs through its command line at toy size, so a changed signature
or report field breaks CI instead of the next person's benchmark. No figure is checked: only
exit 0 and that each table the script prints is there."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs import REPO
from tracebuild import ring_docs, write

BENCH = REPO / "bench"
# A stand-in for HolisticTraceAnalysis (not a harness dependency): the same call, fixed answers.
HTA_STUB = """
class TraceAnalysis:
    def __init__(self, trace_dir):
        self.trace_dir = trace_dir

    def get_comm_comp_overlap(self, visualize=False):
        return {"rank": [0, 1], "comp_comm_overlap_pctg": [0.0, 0.0]}
"""
TINY_COLLECTOR = ["--ranks", "2", "--reps", "1", "--rank-mb", "0.05"]


@dataclass(frozen=True)
class Smoke:
    script: str
    args: list[str]
    prints: list[str]  # lines (or their beginnings) the run must print
    hta_stub: bool = False

    @property
    def id(self) -> str:
        return f"{self.script}-{'hta-stub' if self.hta_stub else len(self.args)}"


SMOKE = [
    Smoke(
        "overhead.py",
        [
            "--mode",
            "torch",
            "--steps",
            "3",
            "--warmup",
            "2",
            "--reps",
            "1",
            "--record-steps",
            "2",
            "--watch-every",
            "2",
        ],
        [
            "A minimal",
            "B harness off",
            "C outside window",
            "D inside window",
            "S no scalars",
            "W watch on",
            "P metrics on",
            "H marked by hand",
            "Q found by hooks",
            "V debug server on",
            "(a) harness off / minimal loop",
            "(d) harness off / same, no scalars",
            "(e) watch on / harness off",
            "(f) the watch's own time",
            "(g) metrics on / harness off",
            "(h) the metrics' own time",
            "(i) the harness's own time",
            "(j) found by hooks / marked by hand",
            "(k) the harness's own time / the loop's, marked by hand",
            "(l) debug server on / harness off",
            "(m) the debug server's own time",
        ],
    ),
    Smoke(
        "collector_vs_hta.py",
        TINY_COLLECTOR
        + [
            "--no-compare",
            "--stream-mb",
            "0.05",
            "--summaries",
            "0.05",
            "--scale",
            "2",
            "--scale-mb",
            "0.05",
            "--summary-ranks",
            "16",
            "--summary-steps",
            "2",
            "--profile",
            "--layouts",
        ],
        [
            "layouts: ours only",
            "events first / kineto:",
            "one trace of",
            "in-job summaries",
            "report identical: True",
            "scale: ours only",
            "16 ranks of in-job summaries",
            "2 x the source's steps",
            "profile of src-2r-0.05mb",
            "parsing traces",
            "writing the merged trace",
            "start-up, finding traces",
        ],
    ),
    Smoke(
        "own_parts.py",
        ["--mode", "torch", "--steps", "4", "--warmup", "2"],
        ["mode=torch steps=", "Run.end_step", "StepLog.write"],
    ),
    Smoke(
        "grads_hook.py",
        ["--layers", "4", "--reps", "2", "--passes", "2"],
        ["4 layers, 8 parameters", "backward without hooks", "hooks:"],
    ),
    Smoke(
        "comm_wait.py",
        ["--reps", "1", "--waits", "100", "--calls", "10"],
        ["wait() on a completed Work", "blocking all_reduce of 16 floats"],
    ),
    Smoke(
        "detection.py",
        ["--smoke", "--seed", "4"],  # a 2-rank job (seed 2's took 14 s) and a generated material straggler
        ["real runs (1 cases", "generated (1 cases", "real: recall", "generated: false alarms"],
    ),
    Smoke(
        "collector_vs_hta.py",
        TINY_COLLECTOR,
        ["collector vs HTA", "src-2r-0.05mb", "faster anchor", "targets:"],
        hta_stub=True,
    ),
    Smoke("eager_overhead.py", [], ["| trace | bare op (us) |", "| rank0.pt.trace.json.gz |"]),
]


def test_every_bench_script_has_a_smoke_run() -> None:
    assert {p.name for p in BENCH.glob("*.py")} == {s.script for s in SMOKE}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank, 4-step GPU-shaped trace set (hand-built), standing in for tests/data/traces."""
    folder = tmp_path_factory.mktemp("bench") / "src"
    for rank, doc in enumerate(ring_docs(lambda r, s: 300.0 + 100.0 * r, n_ranks=2, n_steps=4)):
        write(folder / f"rank{rank}.pt.trace.json.gz", doc)
    return folder


def with_hta_stub(env: dict[str, str], root: Path) -> dict[str, str]:
    """`env` with a package `hta` on PYTHONPATH that answers HTA's one call with fixed figures."""
    (root / "hta").mkdir(parents=True)
    (root / "hta" / "__init__.py").write_text("")
    (root / "hta" / "trace_analysis.py").write_text(HTA_STUB)
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))}


def run_bench(smoke: Smoke, tmp_path: Path, source: Path) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if smoke.hta_stub:
        env = with_hta_stub(env, tmp_path / "stub")
    args = list(smoke.args)
    if smoke.script == "collector_vs_hta.py":
        args += ["--source", str(source), "--work", str(tmp_path / "work")]
    if smoke.script == "eager_overhead.py":
        args += [str(source / "rank0.pt.trace.json.gz")]
    proc = subprocess.run(
        [sys.executable, str(BENCH / smoke.script), *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, (
        f"{smoke.script} {args} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


@pytest.mark.parametrize("smoke", SMOKE, ids=lambda s: s.id)
def test_bench_script_runs_at_toy_size(smoke: Smoke, tmp_path: Path, source: Path) -> None:
    out = run_bench(smoke, tmp_path, source)
    missing = [line for line in smoke.prints if line not in out]
    assert not missing, f"{smoke.script} did not print {missing}:\n{out[-3000:]}"


def test_hta_comparison_without_hta_says_how(tmp_path: Path, source: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(BENCH / "collector_vs_hta.py"),
            *TINY_COLLECTOR,
            "--source",
            str(source),
            "--work",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=""),
    )
    if proc.returncode == 0:
        pytest.skip("HolisticTraceAnalysis is installed here")
    assert proc.returncode == 1 and "cannot import hta: pip install HolisticTraceAnalysis" in proc.stderr
    assert "--no-compare" in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing made before the check
