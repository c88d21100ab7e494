"""The launchers: `accelerate launch` with the shipped configs starts the harness on CPU, DDP and
FSDP (slow); launch/*.sh build the command lines Nsight and torchrun document (fake executables
on PATH record their arguments, one per line)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import QUICK, REPO, free_port

# A fake executable: writes its arguments, one per line, to $FAKE_LOG/<its name>.args.
RECORD = '#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$FAKE_LOG/$(basename "$0").args"\n'
# A fake torchrun: records, then runs what follows --no-python as rank $FAKE_RANK would.
TORCHRUN = RECORD + (
    'while [ $# -gt 0 ] && [ "$1" != --no-python ]; do shift; done\nshift\nRANK=${FAKE_RANK:-0} exec "$@"\n'
)


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    """A folder of fake executables; the launchers run with it first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "nsys": RECORD,
        "ncu": RECORD,
        "python": RECORD,
        "torchrun": TORCHRUN,
        "nvidia-smi": '#!/usr/bin/env bash\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 (UUID: GPU-$i)"; done\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def launch(
    script: str, args: list[str], fakes: Path, **env: str
) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """Run launch/<script> with the fakes; returns the process and each fake's recorded arguments."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCU_", "NSYS_", "CUDA_VISIBLE", "NPROC_PER"))}
    full_env = {
        **base,
        "PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}",
        "FAKE_LOG": str(fakes),
        "NCU_OUT": str(fakes / "ncu-out"),
        "NSYS_OUT": str(fakes / "nsys-out"),
        **env,
    }
    for old in fakes.glob("*.args"):
        old.unlink()
    proc = subprocess.run(
        ["bash", f"launch/{script}", *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=60
    )
    recorded = {p.stem: p.read_text().splitlines() for p in fakes.glob("*.args")}
    return proc, recorded


def value_of(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_nsys_traces_without_nccl_and_turns_torch_profiler_off(fakes: Path) -> None:
    proc, got = launch("nsys.sh", ["--nproc_per_node", "2", "--", "--mode", "comm"], fakes)
    assert proc.returncode == 0, proc.stderr
    assert got["torchrun"][:4] == ["--nproc_per_node", "2", "--no-python", "nsys"]
    nsys = got["nsys"]
    assert nsys[0] == "profile" and value_of(nsys, "--trace") == "cuda,nvtx,osrt"
    assert value_of(nsys, "--output") == f"{fakes}/nsys-out/rank%q{{RANK}}"
    assert nsys[nsys.index("python") :] == ["python", "-m", "harness.train", "--no-profile", "--mode", "comm"]
    proc, got = launch("nsys.sh", ["--", "--mode", "comm", "--no-profile"], fakes)
    assert proc.returncode == 0, proc.stderr
    assert got["nsys"].count("--no-profile") == 1


def test_ncu_skips_nccl_and_warm_up_with_a_quoted_filter(fakes: Path) -> None:
    user = "gemm|elementwise kernel"
    proc, got = launch(
        "ncu.sh",
        ["--nproc_per_node", "2", "--", "--mode", "kernel"],
        fakes,
        NCU_KERNELS=user,
        NCU_SKIP="7",
        NCU_COUNT="5",
    )
    assert proc.returncode == 0, proc.stderr
    ncu = got["ncu"]
    assert value_of(ncu, "--profile-from-start") == "off"
    assert (value_of(ncu, "--launch-skip"), value_of(ncu, "--launch-count")) == ("7", "5")
    assert value_of(ncu, "--kernel-name-base") == "function"
    pattern = value_of(ncu, "--kernel-name")
    assert pattern.startswith("regex:") and user in pattern  # one argument, space and | intact
    regex = re.compile(pattern.removeprefix("regex:"))
    for name in ("ncclDevKernel_Generic", "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_AllGather_RING_LL"):
        assert not regex.search(name), name
    for name in ("ampere_sgemm_128x64_nn", "elementwise kernel"):
        assert regex.search(name), name
    assert not regex.search("vectorized_elementwise_kernel")
    assert ncu[ncu.index("python") :] == [
        "python",
        "-m",
        "harness.train",
        "--no-profile",
        "--cuda-profiler-api",
        "--mode",
        "kernel",
    ]
    assert "python" not in got  # rank 0 runs under ncu only


def test_ncu_defaults_and_the_other_ranks(fakes: Path) -> None:
    proc, got = launch("ncu.sh", ["--", "--no-profile"], fakes)
    assert proc.returncode == 0, proc.stderr
    regex = re.compile(value_of(got["ncu"], "--kernel-name").removeprefix("regex:"))
    assert regex.search("void at::native::vectorized_elementwise_kernel<4>") and not regex.search(
        "ncclDevKernel_Generic"
    )
    assert value_of(got["ncu"], "--launch-skip") == "0" and got["ncu"].count("--no-profile") == 1
    proc, got = launch("ncu.sh", ["--", "--mode", "kernel"], fakes, FAKE_RANK="1")
    assert proc.returncode == 0, proc.stderr
    assert "ncu" not in got
    assert got["python"] == ["-m", "harness.train", "--no-profile", "--cuda-profiler-api", "--mode", "kernel"]
    proc, got = launch("ncu.sh", ["--"], fakes, NCU_NCCL="1")
    assert "--kernel-name" not in got["ncu"]
    proc, got = launch("ncu.sh", ["--"], fakes, NCU_SKIP="ten")
    assert proc.returncode == 2 and proc.stderr.strip() == "ncu.sh: NCU_SKIP=ten must be a whole number"
    assert not got


@pytest.mark.parametrize(
    ("env", "nproc"),
    [
        ({}, "4"),  # every GPU nvidia-smi lists
        ({"CUDA_VISIBLE_DEVICES": "1,3"}, "2"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"}, "3"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "1"),  # CUDA sees no GPU
        ({"CUDA_VISIBLE_DEVICES": "0,1", "NPROC_PER_NODE": "3"}, "3"),
    ],
)
def test_multinode_counts_the_gpus_cuda_sees(fakes: Path, env: dict[str, str], nproc: str) -> None:
    proc, got = launch(
        "multinode.sh", ["--mode", "comm"], fakes, TORCHRUN=str(fakes / "torchrun"), FAKE_RANK="0", **env
    )
    assert value_of(got["torchrun"], "--nproc-per-node") == nproc, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("config", ["ddp", "fsdp"])
def test_accelerate_configs(config: str, log_dir: Path) -> None:
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    cmd = [
        accelerate,
        "launch",
        "--config_file",
        f"configs/accelerate/{config}.yaml",
        "--main_process_port",
        str(free_port()),
        "-m",
        "harness.train",
        "--mode",
        "baseline",
        "--hidden",
        "64",
        *QUICK,
        "--log-dir",
        str(log_dir),
        "--run-name",
        config,
    ]
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads((log_dir / config / "run.json").read_text())
    assert (info["parallel"], info["world_size"], info["backend"]) == (config, 2, "gloo")


def test_gpu_check_runs_each_stage_within_its_budget(fakes: Path, tmp_path: Path) -> None:
    """launch/gpu_check.sh with a fake python that logs each call: the native build, then the
    self-check, the overhead bench on the GPU, the lab sweep and the lab-modes check in that
    order, each with its exit in summary.log, and the runs' archive; with too little budget
    left every stage is skipped and said so."""
    calls = tmp_path / "calls"
    fake = fakes / "pyall"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    out = tmp_path / "out"
    proc, _ = launch("gpu_check.sh", [], fakes, PYTHON=str(fake), OUT=str(out), BUDGET_S="540")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in calls.read_text().splitlines() if not line.startswith("-m pip")]  # .whl/ here
    assert any(line.startswith("setup.py -q build_ext --inplace") for line in lines), lines
    staged = [line for line in lines if not line.startswith(("-c", "setup.py"))]
    assert [line.split()[0] for line in staged] == ["-m", "bench/overhead.py", "-m", "-m"], lines
    assert "--device cuda" in staged[1]
    assert [line.split()[1] for line in staged if line.startswith("-m")] == [
        "harness.selfcheck",
        "harness.lab",
        "harness.selfcheck",
    ]
    summary = (out / "summary.log").read_text().splitlines()
    assert [s.split(":")[0] for s in summary] == ["selfcheck", "overhead", "lab", "lab_modes"]
    assert all(": exit 0 in " in s for s in summary), summary
    assert "NVIDIA H100" in (out / "device.txt").read_text()
    assert (out / "runs.tar.gz").is_file()
    calls.unlink()
    short = tmp_path / "short"
    proc, _ = launch("gpu_check.sh", [], fakes, PYTHON=str(fake), OUT=str(short), BUDGET_S="35")
    assert proc.returncode == 0, proc.stderr
    assert all("skipped" in s for s in (short / "summary.log").read_text().splitlines())
    left = [line for line in calls.read_text().splitlines() if not line.startswith(("-c", "setup.py", "-m pip"))]
    assert left == []
