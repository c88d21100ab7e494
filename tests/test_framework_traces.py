"""Traces written by the frameworks' own profilers, read as they are: accelerate's ProfileKwargs
(`profile_<process index>.json`), Lightning's PyTorchProfiler
(`<stage>-<filename>-<local rank>-<action>.<time>.pt.trace.json`, `[pl][profile]...` ranges),
torchtune's (`iteration_<N>/r<rank>-<date>.<time>.pt.trace.json`) and composer's
(`rank<rank>.<batch>.pt.trace.json`): rank, steps and phases right."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs import FINISHED, REPO, collect_report, job_env
from tracebuild import GLOO, document, step, write, x

pytestmark = pytest.mark.timing


def cpu_rank(rank: int, late_us: float, distributed: bool) -> dict:
    """Three 10 ms steps: data, forward, backward (a gloo all-reduce), optimizer; `late_us` more
    data on this rank (a straggler on CPU is late by 35% of the step)."""
    ev = []
    for n in (1, 2, 3):
        t = n * 10_000.0
        ev += [
            step(n, t, 10_000.0),
            x("data", "user_annotation", t, 1000 + late_us),
            x("forward", "user_annotation", t + 1000 + late_us, 2000),
            x("aten::mm", "cpu_op", t + 1100 + late_us, 1500),
            x("gloo:all_reduce", "user_annotation", t + 3000 + late_us, 6000 - late_us, GLOO),
            x("Optimizer.step#SGD.step", "user_annotation", t + 9100, 500),
        ]
    return document(ev, rank if distributed else None, base_ns=None)


@pytest.mark.parametrize(
    ("names", "distributed"),
    [
        (["profile_0.json", "profile_1.json"], False),  # accelerate, even without distributedInfo
        (["profile_0.json", "profile_1.json"], True),
        (
            [
                "iteration_5/r0-2026-11-24-10-00.1732442400000.pt.trace.json",
                "iteration_5/r1-2026-11-24-10-00.1732442400000.pt.trace.json",
            ],
            False,
        ),  # torchtune
        (["rank0.12.pt.trace.json", "rank1.12.pt.trace.json"], False),  # composer
    ],
)
def test_framework_file_names_give_the_ranks(names: list[str], distributed: bool, tmp_path: Path) -> None:
    for r, name in enumerate(names):
        write(tmp_path / name, cpu_rank(r, 5000.0 if r == 1 else 0.0, distributed))
    doc = collect_report(tmp_path)
    assert doc["run"]["ranks_present"] == [0, 1] and doc["run"]["steps"] == [1, 2, 3]
    assert [(s["rank"], s["phase"]) for s in doc["stragglers"]] == [(1, "data")]


@pytest.mark.slow
@pytest.mark.parametrize("job", ["accelerate_job.py", "lightning_profiler_job.py"])
def test_traces_written_by_the_frameworks_own_profilers(job: str, tmp_path: Path) -> None:
    pytest.importorskip("accelerate" if job.startswith("accelerate") else "lightning")
    out = tmp_path / "traces"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "tests" / job),
        str(out),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=job_env(), cwd=REPO)
    if run.returncode != 0:
        # A rank of a finished job sometimes aborts in a C++ destructor at interpreter exit
        # ("terminate called without an active exception": gloo, Kineto); what is tested is the
        # traces it wrote before, so a job whose every rank got to its end counts.
        ended = {line.split()[-1] for line in run.stdout.splitlines() if line.startswith(FINISHED)}
        assert ended == {"0", "1"}, run.stderr[-3000:]
        print(f"the job exited {run.returncode} after every rank finished: {run.stderr[-1500:]}")
    doc = collect_report(out)
    assert doc["run"]["ranks_present"] == [0, 1] and len(doc["run"]["steps"]) >= 3
    assert [(s["rank"], s["phase"]) for s in doc["stragglers"]] == [(1, "data")]
