"""The lab's training loop: one `train_step` per step, each phase inside its named range, on `harness.Run`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from harness.run.run import Run
from harness.train.config import TrainConfig
from harness.train.faults import HangInjector, SlowInjector
from harness.train.memory_leak import LeakInjector
from harness.train.parallel import AMP_DTYPES
from harness.train.workloads import InMemoryTensors, Workload


def build_loader(workload: Workload, cfg: TrainConfig, device: torch.device) -> DataLoader:
    data = cfg.data
    kwargs: dict[str, Any] = {
        "batch_size": cfg.workload.batch_size,
        "shuffle": True,
        "drop_last": True,
        "num_workers": data.num_workers,
        "pin_memory": data.pin_memory and device.type == "cuda",  # pinning needs a GPU
        "persistent_workers": data.persistent_workers,
        "generator": torch.Generator().manual_seed(cfg.workload.seed),
    }
    if data.prefetch_factor is not None:
        kwargs["prefetch_factor"] = data.prefetch_factor
    if isinstance(workload.dataset, InMemoryTensors):  # gathered a batch at a time: nothing to stack
        kwargs["collate_fn"] = InMemoryTensors.as_batch
    return DataLoader(workload.dataset, **kwargs)


def _endless(loader: DataLoader) -> Iterator[Any]:
    """Batches forever; a new epoch restarts the iterator (and, without persistent workers,
    the worker processes: that start-up cost is part of what the data lab shows)."""
    while True:
        yield from loader


@dataclass
class Trainer:
    """The lab's loop, a user of `harness.Run` like any other: each phase in `run.phase`, each
    step in `run.begin_step`/`run.end_step`, with the lab's injected faults inside the phases."""

    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    workload: Workload
    loader: DataLoader
    device: torch.device
    rank: int

    def __post_init__(self) -> None:
        speed = self.cfg.speed
        self.amp_dtype = AMP_DTYPES.get(speed.amp)
        self.scaler = torch.amp.GradScaler(self.device.type) if speed.amp == "fp16" else None
        self.slow = SlowInjector(self.cfg.slow, self.rank, self.device)
        self.hang = HangInjector(self.cfg.hang, self.rank)
        self.loss_sum = torch.zeros((), device=self.device)
        self.loss_steps = 0
        self.last_loss: float | None = None
        self.leak = LeakInjector(self.cfg.leak, self.rank, self.device)

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        nb = self.cfg.speed.non_blocking
        x = x.to(self.device, non_blocking=nb)
        y = y.to(self.device, non_blocking=nb)
        if self.cfg.speed.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    def train_step(self, run: Run, batches: Iterator[Any]) -> None:
        step = run.begin_step()
        strag = self.slow

        def delay(phase: str) -> None:
            strag.maybe_delay(phase, step)
            self.hang.maybe_hang(phase, step)

        with run.phase("data"):
            batch = next(batches)
            delay("data")
        with run.phase("h2d"):
            x, y = self._to_device(batch)
        autocast = torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype else nullcontext()
        with autocast:
            with run.phase("forward"):
                delay("forward")
                logits = self.model(x)
            with run.phase("loss"):
                loss = self.workload.loss(logits, y)
                self.leak.keep()
        with run.phase("backward"):
            delay("backward")
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        with run.phase("optimizer"):
            delay("optimizer")
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        extra: dict[str, Any] = {}
        if self.cfg.speed.sync_loss:
            # note: a host-device sync point every step (the anti-pattern --sync-loss reproduces)
            extra["loss"] = loss.item()
        else:
            self.loss_sum += loss.detach().float()
            self.loss_steps += 1
        run.end_step(**extra)

    def run(self, run: Run) -> None:
        batches = _endless(self.loader)
        for _ in range(self.cfg.workload.steps):
            self.train_step(run, batches)
        if self.loss_steps:
            # note: the one host sync for the loss, at the end of the run
            self.last_loss = (self.loss_sum / self.loss_steps).item()
        run.note(final_loss=self.last_loss)
