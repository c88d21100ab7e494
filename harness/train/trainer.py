"""The training loop: one `train_step` per step, each phase inside its named range."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from harness.scalars import ScalarWriter, step_scalars
from harness.train.config import TrainConfig
from harness.train.faults import HangInjector, StragglerInjector
from harness.train.flight import Progress
from harness.train.memory_leak import LeakInjector
from harness.train.parallel import AMP_DTYPES
from harness.train.profiling import TraceRecorder
from harness.train.ranges import phase_range
from harness.train.stats import StepLog, SystemSampler
from harness.train.timing import StepClock
from harness.train.watch import Watch
from harness.train.workloads import Workload


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
    return DataLoader(workload.dataset, **kwargs)


def _endless(loader: DataLoader) -> Iterator[Any]:
    """Batches forever; a new epoch restarts the iterator (and, without persistent workers,
    the worker processes: that start-up cost is part of what the data lab shows)."""
    while True:
        yield from loader


@dataclass
class Trainer:
    cfg: TrainConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    workload: Workload
    loader: DataLoader
    device: torch.device
    rank: int
    host: str
    scalars: ScalarWriter | None = None

    def __post_init__(self) -> None:
        speed = self.cfg.speed
        self.amp_dtype = AMP_DTYPES.get(speed.amp)
        self.scaler = torch.amp.GradScaler(self.device.type) if speed.amp == "fp16" else None
        self.nvtx = self.device.type == "cuda"
        self.clock = StepClock(cuda=self.device.type == "cuda")
        self.straggler = StragglerInjector(self.cfg.straggler, self.rank, self.device)
        self.hang = HangInjector(self.cfg.hang, self.rank)
        self.progress = Progress()  # read by the Flight Recorder dump when the rank ends badly
        self.loss_sum = torch.zeros((), device=self.device)
        self.loss_steps = 0
        self.last_loss: float | None = None
        self.sampler = SystemSampler(self.device)
        self.leak = LeakInjector(self.cfg.leak, self.rank, self.device)

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        nb = self.cfg.speed.non_blocking
        x = x.to(self.device, non_blocking=nb)
        y = y.to(self.device, non_blocking=nb)
        if self.cfg.speed.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    def train_step(self, batches: Iterator[Any], step: int, profiler_state: str = "off") -> None:
        clock, strag = self.clock, self.straggler
        annotate = profiler_state == "record"

        def rng(phase: str):
            self.progress.phase = phase
            return phase_range(phase, annotate=annotate, nvtx=self.nvtx)

        def delay(phase: str) -> None:
            strag.maybe_delay(phase, step)
            self.hang.maybe_hang(phase, step)

        self.progress.step = step
        clock.start(step)
        with rng("data"):
            batch = next(batches)
            delay("data")
        clock.mark("data")
        with rng("h2d"):
            x, y = self._to_device(batch)
        clock.mark("h2d")
        autocast = torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype else nullcontext()
        with autocast:
            with rng("forward"):
                delay("forward")
                logits = self.model(x)
            clock.mark("forward")
            with rng("loss"):
                loss = self.workload.loss(logits, y)
                self.leak.keep()
            clock.mark("loss")
        with rng("backward"):
            delay("backward")
            (self.scaler.scale(loss) if self.scaler else loss).backward()
        clock.mark("backward")
        with rng("optimizer"):
            delay("optimizer")
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        clock.mark("optimizer")
        extra: dict[str, Any] = {"profiler": profiler_state}
        if self.cfg.speed.sync_loss:
            # note: a host-device sync point every step (the anti-pattern --sync-loss reproduces)
            extra["loss"] = loss.item()
        else:
            self.loss_sum += loss.detach().float()
            self.loss_steps += 1
        clock.finish(**extra, **self.sampler.sample())

    def run(self, recorder: TraceRecorder, log: StepLog, watch: Watch | None = None) -> None:
        batches = _endless(self.loader)
        # cudaProfilerStart/Stop around the measured steps, for Nsight tools told to wait for it.
        api_range = self.cfg.profiler.cuda_profiler_api and self.device.type == "cuda"
        for step in range(self.cfg.workload.steps):
            if api_range and step == self.cfg.workload.warmup_steps:
                torch.cuda.profiler.start()
            self.train_step(batches, step, recorder.state)
            recorder.step()
            for rec in self.clock.poll():
                self._log(log, rec)
                if watch:
                    watch.add(rec)
            if watch and watch.due(step):
                self.progress.phase = "watch exchange"  # a hung peer leaves this rank waiting here
                watch.after_step(step)
        if api_range:
            torch.cuda.profiler.stop()
        for rec in self.clock.drain():
            self._log(log, rec)
        if self.loss_steps:
            # note: the one host sync for the loss, at the end of the run
            self.last_loss = (self.loss_sum / self.loss_steps).item()

    def _log(self, log: StepLog, rec: dict[str, Any]) -> None:
        rec.update(rank=self.rank, host=self.host, samples=self.cfg.workload.batch_size,
                   warmup=rec["step"] < self.cfg.workload.warmup_steps)
        log.write(rec)
        if self.scalars:
            self.scalars.add(rec["step"], step_scalars(rec))
