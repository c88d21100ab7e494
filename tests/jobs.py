"""What the tests share: run real harness jobs (torchrun or single process) on CPU, and where the
real third-party traces are (tests/data/traces, with their provenance and licence)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.paths import list_traces, run_file, steps_path

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = REPO / "tests" / "data" / "traces"
# What a test job script (accelerate_job.py, ...) prints with its rank once its work is written.
FINISHED = "test job finished, rank"
# Small and quick on 2 cores; tests that need other sizes pass their own flags after these.
# The lab's workloads at their default sizes (each forces its bottleneck), 16 steps with an 8-step
# window from step 5, the window the README advises on CPU; the data mode's samples cost a tenth
# of the default (the data phase still most of the step), the baseline's and kernel mode's batch
# is four times the default, so that each one's evidence stays clear of its rule's bound with
# another CPU-bound process beside it (bench/RESULTS.md, "The lab's workloads on two CPU cores").
# The torch mode keeps its default: at a smaller batch its ~13 ms steps let one time slice lost
# in a data phase of ~0.1 ms read as a tenth of the window. conftest.lab_run shares one run a mode.
LAB = ["--steps", "16", "--warmup-steps", "2", "--wait", "4", "--warmup", "1", "--active", "8"]
LAB_SIZE = {
    "data": ["--sample-cost", "4"],
    "baseline": ["--batch-size", "256"],
    "kernel": ["--batch-size", "256"],
}
QUICK = ["--steps", "8", "--warmup-steps", "2", "--wait", "2", "--warmup", "1", "--active", "2", "--batch-size", "16"]


@dataclass
class Run:
    proc: subprocess.CompletedProcess
    dir: Path

    @property
    def run_json(self) -> dict[str, Any]:
        return json.loads(run_file(self.dir).read_text())

    def traces(self) -> list[Path]:
        return list_traces(self.dir)

    def steps(self, rank: int) -> list[dict[str, Any]]:
        return [json.loads(line) for line in steps_path(self.dir, rank).read_text().splitlines()]


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def harness_cmd(
    args: list[str],
    log_dir: Path,
    *,
    nproc: int | None = 2,
    run_name: str = "run",
    extra_torchrun: list[str] | None = None,
) -> list[str]:
    """The command of a harness.train run: under torchrun with `nproc` ranks, or one process."""
    harness_args = ["--log-dir", str(log_dir), "--run-name", run_name, *args]
    if nproc is None:
        return [sys.executable, "-m", "harness.train", *harness_args]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [*torchrun, *(extra_torchrun or []), "-m", "harness.train", *harness_args]


def run_harness(
    args: list[str],
    log_dir: Path,
    *,
    nproc: int | None = 2,
    run_name: str = "run",
    timeout: float = 300,
    check: bool = True,
    extra_torchrun: list[str] | None = None,
) -> Run:
    """Run harness.train: under torchrun with `nproc` ranks, or as one process if nproc is None."""
    cmd = harness_cmd(args, log_dir, nproc=nproc, run_name=run_name, extra_torchrun=extra_torchrun)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=job_env(), cwd=REPO)
    if check and proc.returncode != 0 and fresh_run_owed("run_harness", proc.stderr, log_dir / run_name):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=job_env(), cwd=REPO)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"
            f"{first_failure(proc.stderr)}"
        )
    return Run(proc=proc, dir=log_dir / run_name)


def first_failure(stderr: str) -> str:
    """The lines of the rank torchrun names as the first to fail ("Root Cause"), which the
    stderr's tail often cuts off: its peers' "connection closed" errors come after."""
    m = re.search(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", stderr, re.S)
    if not m:
        return ""
    mine = [line for line in stderr.splitlines() if line.startswith(f"[rank{m[1]}]:")]
    return f"\nfirst failure, rank {m[1]}:\n" + "\n".join(mine[-60:]) if mine else ""


NATIVE_CRASH = (
    "malloc(): ",
    "free(): ",
    "double free or corruption",
    "corrupted size vs. prev_size",
    "Segmentation fault",
    "Fatal Python error: Segmentation",
)


def native_crash(stderr: str) -> str | None:
    """The heap-corruption or segfault line a rank printed as it died, if any."""
    return next((line.strip() for line in stderr.splitlines() if any(m in line for m in NATIVE_CRASH)), None)


def fresh_run_owed(who: str, output: str, run_dir: Path) -> bool:
    """Whether a failed job's `output` shows a rank that died in native code; if so, says so and
    removes its run folder for the one fresh run it gets. torch.profiler's native side (Kineto)
    crashes now and then in a short CPU job (seen once in ~300 runs here: "malloc(): unsorted
    double linked list corrupted" as a window was exported; upstream reports the same class of
    intermittent crash). That is not what these tests test."""
    crash = native_crash(output)
    if crash is None:
        return False
    print(f"{who}: a rank died in native code ({crash}); running the job once more")
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def free_port() -> int:
    """A loopback TCP port free right now (for rendezvous endpoints)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def collect_quietly(folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`python -m harness.collect FOLDER -q --no-merged [FLAGS]`, as a user runs it (asserted to
    succeed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(folder), "-q", "--no-merged", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def collect_report(folder: Path) -> dict[str, Any]:
    """`collect_quietly`'s report.json."""
    collect_quietly(folder)
    return json.loads((folder / "report" / "report.json").read_text())


def said(stdout: str, label: str) -> list[str]:
    """The texts the collector's console printed under `label` ("verdict", "next", ...), each
    with its wrapped continuation lines joined back (report/console.py)."""
    from harness.report.console import labelled_texts

    return labelled_texts(stdout, label)
