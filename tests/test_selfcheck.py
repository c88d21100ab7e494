"""`python -m harness.selfcheck` on this machine (no CUDA): the CPU checks run for real and pass,
every GPU check is skipped with its reason and counted, selfcheck.json holds it all; a bad
check name is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jobs import REPO, job_env


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's view; tests/test_gpu.py runs the GPU checks")
def test_the_cpu_subset_passes_and_the_gpu_checks_are_skipped(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.selfcheck", "--quick", "--out", str(tmp_path / "sc")],
        capture_output=True,
        text=True,
        timeout=600,
        env=job_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "sc" / "selfcheck.json").read_text())
    results = {c["check"]: c["result"] for c in doc["checks"]}
    assert results["traced step"] == results["step timing"] == results["two ranks over gloo"] == "passed", results
    assert "lab modes" not in results  # --quick
    gpu = [c for c in doc["checks"] if c["needs"] in ("cuda", "2 gpus")]
    assert gpu and all(c["result"] == "skipped" for c in gpu) and doc["gpu_checks_skipped"] == len(gpu)
    assert doc["failed"] == 0 and doc["machine"]["gpus"] == 0
    assert f"{len(gpu)} GPU check(s) skipped: no CUDA" in proc.stdout


def test_an_unknown_check_is_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.selfcheck", "--only", "warp drive"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "harness.selfcheck: error: no check named 'warp drive'; see --list"
    )
