"""Run one sweep row as a real torchrun job and read back what it measured."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from harness.lab.results import FAILED, OK, SKIPPED, RowResult, measure
from harness.lab.sweeps import Row
from harness.paths import run_file


def run_name(index: int, row: Row) -> str:
    return f"{index:02d}-{row.key}"


def train_args(row: Row, runs_dir: Path, name: str, extra: list[str]) -> list[str]:
    """The row's `harness.train` flags; `extra` (the user's, after `--`) comes last and wins."""
    return [*row.args, "--log-dir", str(runs_dir), "--run-name", name, *extra]


def torchrun_command(row: Row, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={row.nproc}",
        "-m",
        "harness.train",
        *args,
    ]


RANK_PREFIX = re.compile(r"^\[(?:default)?(?:rank)?\d+\]:\s*")  # torchrun's per-rank output prefix


def failure_line(log: str, returncode: int) -> str:
    """The line that says why a job failed: the harness's own one-line error if there is one,
    else the ranks' last exception line (not torchrun's ChildFailedError wrapper), else the
    exit code."""
    lines = [RANK_PREFIX.sub("", x.strip()) for x in log.splitlines() if x.strip()]
    mine = [x for x in lines if x.startswith("harness.train:") and " finished " not in x]
    if mine:
        return mine[-1][:300]
    errors = [x for x in lines if x.split(":", 1)[0].endswith(("Error", "Exception")) and "ChildFailedError" not in x]
    return errors[-1][:300] if errors else f"exit code {returncode}"


def run_row(row: Row, index: int, runs_dir: Path, extra: list[str], timeout_s: float) -> RowResult:
    """Run the row under torchrun (its output to `<runs>/<NN-key>.log`) and measure the run.

    A skipped row is not launched. A job that fails or outlives `timeout_s` (its whole process
    group killed) is a failed row with the reason; the sweep goes on."""
    if row.skip:
        return RowResult(row, SKIPPED, note=row.skip)
    name = run_name(index, row)
    used = (*row.args, *extra)
    run_dir = runs_dir / name
    log_path = runs_dir / f"{name}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            torchrun_command(row, train_args(row, runs_dir, name, extra)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return RowResult(
                row, FAILED, note=f"timed out after {timeout_s:.0f} s (--row-timeout-s)", run_dir=run_dir, args=used
            )
        except BaseException:  # Ctrl-C: take the job's ranks down with us
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    if code != 0:
        return RowResult(
            row, FAILED, note=failure_line(log_path.read_text(errors="replace"), code), run_dir=run_dir, args=used
        )
    if not run_file(run_dir).exists():
        return RowResult(row, FAILED, note="the job exited 0 but wrote no run.json", run_dir=run_dir, args=used)
    figures, times = measure(run_dir)
    return RowResult(row, OK, run_dir=run_dir, figures=figures, step_ms=times, args=used)
