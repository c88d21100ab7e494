"""Config validation: bad values exit 2 with one line naming the field, before any process group."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from harness.run.settings import ConfigError, LaunchEnv
from harness.train.cli import parse_config
from harness.train.config import resolve_environment
from harness.train.main import configure

from jobs import REPO

CONFIGS = sorted((REPO / "configs").glob("*.toml"))


def env(world_size: int = 1, distributed: bool = False, cuda: bool = False, **more: int) -> LaunchEnv:
    return LaunchEnv(
        rank=0, local_rank=0, world_size=world_size, distributed=distributed, cuda=cuda, accelerate_fsdp=False, **more
    )


def test_defaults_resolve_to_none_single_process_and_ddp_under_torchrun() -> None:
    cfg = parse_config([])
    assert resolve_environment(cfg, env()).parallel.parallel == "none"
    resolved = resolve_environment(cfg, env(world_size=2, distributed=True))
    assert resolved.parallel.parallel == "ddp"
    assert resolved.parallel.backend == "gloo"
    assert resolve_environment(cfg, env(world_size=2, distributed=True, cuda=True)).parallel.backend == "nccl"


def test_cli_overrides_preset_and_only_what_was_typed(tmp_path: Path) -> None:
    preset = tmp_path / "p.toml"
    preset.write_text('[workload]\nmode = "data"\nsteps = 50\n[data]\nnum_workers = 2\n')
    cfg = parse_config(["--config", str(preset), "--steps", "19"])
    assert (cfg.workload.mode, cfg.workload.steps, cfg.data.num_workers) == ("data", 19, 2)
    assert cfg.workload.hidden == 256  # the data mode's default width


def test_optimizer_defaults_per_mode_and_builds() -> None:
    from torch import nn

    from harness.train.parallel import build_optimizer

    assert parse_config(["--mode", "comm"]).workload.optimizer == "sgd"
    assert parse_config(["--mode", "baseline"]).workload.optimizer == "adamw"
    cfg = parse_config(["--mode", "comm", "--optimizer", "adamw"])
    assert cfg.workload.optimizer == "adamw"
    model = nn.Linear(2, 2)
    assert type(build_optimizer(model, "sgd", cfg.speed)).__name__ == "SGD"
    assert type(build_optimizer(model, "adamw", cfg.speed)).__name__ == "AdamW"


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--steps", "-1"], "workload.steps"),
        (["--steps", "5", "--warmup-steps", "5"], "workload.warmup_steps"),
        (["--prefetch-factor", "2"], "data.prefetch_factor"),
        (["--slow-ms", "50"], "slow.rank"),
        (["--active", "0"], "profiler.active"),
        (["--bucket-cap-mb", "0"], "parallel.bucket_cap_mb"),
        (["--run-name", "../x"], "output.run_name"),
        (["--slow-rank", "1,x"], "slow.rank"),
        (["--slow-rank", "1,,2"], "slow.rank"),
        (["--slow-rank", "-1"], "slow.rank"),
        (["--slow-rank", "0,-1"], "slow.rank"),
        (["--slow-rank", "1,2,1"], "slow.rank"),
        (["--slow-from", "-1"], "slow.from_step"),
        (
            ["--slow-rank", "0", "--slow-ms", "5", "--steps", "10", "--slow-from", "10"],
            "slow.from_step",
        ),
    ],
)
def test_invalid_values_name_the_field(argv: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(argv)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("argv", "environment", "field"),
    [
        (["--parallel", "fsdp"], env(), "parallel.parallel"),
        (["--slow-rank", "2", "--slow-ms", "5"], env(world_size=2, distributed=True), "slow.rank"),
        (["--backend", "nccl"], env(world_size=2, distributed=True), "parallel.backend"),
        (["--slow-rank", "0,2", "--slow-ms", "5"], env(world_size=2, distributed=True), "slow.rank"),
        (
            ["--parallel", "fsdp", "--optimizer", "sgd", "--fused-optimizer"],
            env(world_size=2, distributed=True),
            "speed.fused_optimizer",
        ),
        (
            ["--mode", "comm", "--parallel", "fsdp", "--fused-optimizer"],
            env(world_size=2, distributed=True),
            "speed.fused_optimizer",
        ),  # comm mode's default optimizer is SGD
        (
            [],
            env(world_size=4, distributed=True, cuda=True, local_world_size=4, device_count=2),
            "launch.nproc_per_node",
        ),
        ([], env(cuda=True, local_world_size=1, device_count=0), "launch.nproc_per_node"),
    ],
)
def test_invalid_for_the_launch(argv: list[str], environment: LaunchEnv, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_environment(parse_config(argv), environment)
    assert err.value.field == field


def test_straggler_ranks_from_the_command_line_and_toml(tmp_path: Path) -> None:
    assert parse_config(["--slow-rank", "1,3", "--slow-ms", "5"]).slow.rank == (1, 3)
    assert parse_config(["--slow-rank", "2"]).slow.rank == (2,)
    assert parse_config([]).slow.rank is None
    preset = tmp_path / "s.toml"
    preset.write_text('[slow]\nrank = [0, 3]\nms = 5\nkind = "compute"\nfrom_step = 4\n')
    strag = parse_config(["--config", str(preset)]).slow
    assert (strag.rank, strag.kind, strag.from_step) == ((0, 3), "compute", 4)
    preset.write_text("[slow]\nrank = 1\n")
    assert parse_config(["--config", str(preset)]).slow.rank == (1,)
    assert parse_config(["--config", str(preset), "--slow-rank", "0,2"]).slow.rank == (0, 2)
    for bad in ('rank = [1, "x"]', "rank = []", "rank = true", "rank = [1, 1]", "rank = 1.5", 'kind = "nap"'):
        preset.write_text(f"[slow]\n{bad}\n")
        with pytest.raises(ConfigError) as err:
            parse_config(["--config", str(preset)])
        assert err.value.field in ("slow.rank", "slow.kind"), bad


def test_every_straggler_rank_must_exist_and_survives_resolution() -> None:
    cfg = parse_config(["--slow-rank", "0,1", "--slow-ms", "5", "--slow-kind", "compute"])
    resolved = resolve_environment(cfg, env(world_size=2, distributed=True))
    assert resolved.slow.rank == (0, 1) and resolved.to_dict()["slow"]["kind"] == "compute"


def test_fused_optimizers_allowed_where_they_run() -> None:
    two = env(world_size=2, distributed=True)
    resolve_environment(parse_config(["--parallel", "fsdp", "--optimizer", "adamw", "--fused-optimizer"]), two)
    resolve_environment(parse_config(["--parallel", "ddp", "--optimizer", "sgd", "--fused-optimizer"]), two)
    resolve_environment(parse_config(["--parallel", "fsdp", "--optimizer", "sgd"]), two)


def test_one_gpu_per_local_rank() -> None:
    cfg = parse_config([])
    resolve_environment(cfg, env(world_size=2, distributed=True, cuda=True, local_world_size=2, device_count=2))
    resolve_environment(cfg, env(cuda=True))  # GPU count unknown: nothing to check
    launched = LaunchEnv.from_environ(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, cuda=True, device_count=1
    )
    assert (launched.local_world_size, launched.device_count) == (2, 1)
    with pytest.raises(ConfigError, match=r"launch\.nproc_per_node: 2 processes on this node but 1 GPU\(s\) visible"):
        resolve_environment(cfg, launched)
    assert LaunchEnv.from_environ({}, cuda=False, device_count=3).device_count is None
    # over gloo, ranks may share a GPU (NCCL refuses it): round-robin over the visible ones
    resolve_environment(parse_config(["--backend", "gloo"]), launched)
    with pytest.raises(ConfigError):
        resolve_environment(parse_config(["--backend", "nccl"]), launched)
    from harness.train.parallel import device_index

    assert device_index(launched) == 0
    assert [device_index(dataclasses.replace(launched, local_rank=r, device_count=2)) for r in range(4)] == [0, 1, 0, 1]


def test_default_profiler_window_starts_after_ddp_runtime_logging() -> None:
    # DDP's logger syncs on its timing events in iterations 1-10; the window must start later
    # and still end inside the default run.
    for argv in ([], *(["--config", str(p)] for p in CONFIGS)):
        cfg = parse_config(argv)
        first = cfg.profiler.wait + cfg.profiler.warmup
        assert first >= 11, argv
        assert first + cfg.profiler.active <= cfg.workload.steps, argv


def test_toml_errors_name_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[workload]\nmdoe = "data"\n')
    with pytest.raises(ConfigError, match=r"workload\.mdoe: unknown key"):
        parse_config(["--config", str(bad)])
    bad.write_text('[workload]\nsteps = "ten"\n')
    with pytest.raises(ConfigError, match=r"workload\.steps: 'ten' is not a int"):
        parse_config(["--config", str(bad)])


@pytest.mark.parametrize("preset", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_presets_are_valid(preset: Path) -> None:
    cfg = parse_config(["--config", str(preset)])
    if preset.stem in ("baseline", "data", "torch", "kernel", "comm"):
        assert cfg.workload.mode == preset.stem


def test_every_mode_has_a_preset() -> None:
    assert {p.stem for p in CONFIGS} >= {"baseline", "data", "torch", "kernel", "comm"}


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--mode", "nope"], "invalid choice: 'nope'"),
        (["--parallel", "fsdp"], "parallel.parallel: fsdp needs a process group"),
        (["--steps", "0"], "workload.steps: 0 must be >= 1"),
        (["--config", "/no/such.toml"], "config: file /no/such.toml does not exist"),
        (["--slow-rank", "0,x"], "slow.rank: '0,x' is not a comma-separated list of integers"),
        # a run that ends inside the profiler window (or before it) is refused before it starts
        (
            ["--steps", "12"],
            "profiler.active: the profiler records steps 11-13 in its window (after --wait 9 and "
            "--warmup 2; steps count from 0), but --steps 12 ends at step 11: use --steps 14 or more",
        ),
        (
            ["--steps", "10", "--wait", "1", "--warmup", "1", "--active", "2", "--repeat", "3"],
            "records steps 10-11 in window 3 of 3",
        ),
    ],
)
def test_command_line_errors_exit_2_with_one_line(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # in-process: the command's own check of its settings (one run of the command itself below)
    with pytest.raises(SystemExit) as exited:
        configure(["--log-dir", str(tmp_path), *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert needle in lines[0]


def test_the_command_a_user_types_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.train", "--log-dir", str(tmp_path), "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "workload.steps: 0 must be >= 1" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_unwritable_log_dir_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.train", "--log-dir", str(blocker / "logs")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "output.log_dir: cannot write to" in proc.stderr
