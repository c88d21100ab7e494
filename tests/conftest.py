"""The fixtures every test can ask for; the helpers the tests import are in jobs.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from jobs import LAB, LAB_SIZE, Run, run_harness


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "profiler_logs"


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """One 2-rank DDP run of each lab mode at its default size (jobs.LAB), started the first time a
    test asks for it and shared by every test after: the machinery checks (test_train_runs.py)
    and the diagnosis of each mode's bottleneck (test_advisor.py) read the same runs."""
    root = tmp_path_factory.mktemp("lab")
    runs: dict[str, Run] = {}

    def get(mode: str) -> Run:
        if mode not in runs:
            runs[mode] = run_harness(["--mode", mode, *LAB, *LAB_SIZE.get(mode, [])], root, run_name=mode)
        return runs[mode]

    return get
