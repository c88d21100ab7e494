"""`python -m harness.train` / `torchrun ... -m harness.train`: run one lab workload.

Parse and validate the config (exit 2 before any process group on a bad value), build the
workload, wrap it, train under the profiler, then write run.json and print the per-rank table.
"""

from __future__ import annotations

import os
import sys

import torch

from harness.run import flight
from harness.run.run import Run
from harness.run.run_config import RunConfig
from harness.run.run_info import check_output
from harness.run.run_status import raise_on_sigterm
from harness.run.settings import ConfigError, LaunchEnv
from harness.train.cli import fail_config, parse_config
from harness.train.config import TrainConfig, resolve_environment
from harness.train.parallel import build_optimizer, destroy_process_group, init_process_group, pick_device, wrap_model
from harness.train.trainer import Trainer, build_loader
from harness.train.workloads import build_workload

PROG = "harness.train"


def configure(argv: list[str] | None) -> tuple[TrainConfig, LaunchEnv]:
    try:
        env = LaunchEnv.from_environ()
        cfg = resolve_environment(parse_config(argv, PROG), env)
        check_output(cfg.output)
    except ConfigError as exc:
        fail_config(PROG, exc)
    return cfg, env


def train(cfg: TrainConfig, env: LaunchEnv) -> None:
    """One rank's lab run: process group, workload and model, then the loop on `harness.Run`
    (which owns every output: traces, step logs, status, scalars, the watch, run.json)."""
    device = pick_device(env)
    if cfg.speed.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    recorder_on = env.distributed and cfg.parallel.flight_recorder > 0
    if recorder_on:
        flight.enable(cfg.parallel.flight_recorder, cfg.parallel.backend)
    init_process_group(cfg.parallel, env, device)
    workload = build_workload(cfg.workload, cfg.data, env.rank)
    model = wrap_model(workload.model, cfg.parallel, cfg.speed, device)
    assert cfg.workload.optimizer is not None  # the config fills in the mode's default
    trainer = Trainer(
        cfg=cfg,
        model=model,
        optimizer=build_optimizer(model, cfg.workload.optimizer, cfg.speed),
        workload=workload,
        loader=build_loader(workload, cfg, device),
        device=device,
        rank=env.rank,
    )
    with Run(
        settings=RunConfig.from_lab(cfg), device=device, record=cfg.to_dict(), flight_recorder=recorder_on, prog=PROG
    ) as run:
        run.watch_gradients(model)
        trainer.run(run)


def main(argv: list[str] | None = None) -> None:
    cfg, env = configure(argv)
    raise_on_sigterm()
    clean = False
    try:
        train(cfg, env)
        clean = True
    finally:
        destroy_process_group(clean_exit=clean)
    if clean and env.distributed:
        # Every output is written and closed by now. Interpreter teardown of a gloo/Kineto
        # process sometimes aborts in a C++ destructor ("terminate called without an active
        # exception"), turning a successful run into a torchrun failure; so a clean distributed
        # run leaves without running those destructors.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
