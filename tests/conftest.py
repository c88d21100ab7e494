"""The fixtures every test can ask for; the helpers the tests import are in jobs.py."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "profiler_logs"
