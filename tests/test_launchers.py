"""`accelerate launch` with the shipped configs starts the harness on CPU, DDP and FSDP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import QUICK, REPO, free_port

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("config", ["ddp", "fsdp"])
def test_accelerate_configs(config: str, log_dir: Path) -> None:
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    cmd = [accelerate, "launch", "--config_file", f"configs/accelerate/{config}.yaml", "--main_process_port",
           str(free_port()), "-m", "harness.train", "--mode", "baseline", "--hidden", "64", *QUICK,
           "--log-dir", str(log_dir), "--run-name", config]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads((log_dir / config / "run.json").read_text())
    assert (info["parallel"], info["world_size"], info["backend"]) == (config, 2, "gloo")
