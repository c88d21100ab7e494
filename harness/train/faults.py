"""Fault injection: a rank slowed in one phase, reproducibly (the lab's `--slow-*` flags), and a rank that hangs."""

from __future__ import annotations

import time

import torch

from harness.train.config import HangConfig, SlowConfig


class ComputeDelay:
    """About `ms` of extra matrix work on `device`, the way a slower GPU spends it.

    CPU: square matmuls until the wall clock has moved `ms`. CUDA: a number of matmuls enqueued
    without waiting, so the host runs on while the device stays busy longer (longer kernel time,
    not an idle device). How many is measured once, at the first use, with CUDA events.
    """

    CPU_SIZE = 128  # ~0.1-1 ms a matmul on one core: the loop overshoots by at most that
    CUDA_SIZE = 1024  # big enough that launches, not the GPU, are never the bottleneck
    CALIBRATION_CALLS = 20

    def __init__(self, device: torch.device) -> None:
        self.device = device
        n = self.CUDA_SIZE if device.type == "cuda" else self.CPU_SIZE
        # Constant operands: no draw from the global RNG, so training data and weights stay the same.
        self.a = torch.full((n, n), 1.0 / n, device=device)
        self.b = torch.full((n, n), 1.0 / n, device=device)
        self.out = torch.empty((n, n), device=device)
        self.ms_per_matmul: float | None = None  # CUDA only, set by the first call

    def _matmul(self) -> None:
        torch.mm(self.a, self.b, out=self.out)

    def spend(self, ms: float) -> None:
        # Full precision whatever autocast the phase runs under: the calibration stays valid.
        with torch.no_grad(), torch.autocast(self.device.type, enabled=False):
            if self.device.type == "cuda":
                if self.ms_per_matmul is None:
                    self.ms_per_matmul = self._calibrate()
                for _ in range(max(1, round(ms / self.ms_per_matmul))):
                    self._matmul()
            else:
                deadline = time.perf_counter() + ms / 1e3
                while time.perf_counter() < deadline:
                    self._matmul()

    def _calibrate(self) -> float:
        """Milliseconds one matmul takes on this GPU, measured with CUDA events."""
        for _ in range(3):  # cuBLAS handle and heuristics: not part of the measurement
            self._matmul()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.CALIBRATION_CALLS):
            self._matmul()
        end.record()
        # note: a host sync, once per run (the first delayed step); later calls never wait
        end.synchronize()
        return max(start.elapsed_time(end) / self.CALIBRATION_CALLS, 1e-3)


class SlowInjector:
    """Delays `phase` on the configured ranks by `ms`, on the steps `SlowConfig.slows` picks.

    kind `sleep`: a host-side sleep. On CPU it is the phase's own time; on GPU it delays everything
    the host would have enqueued next, which is how a slow host phase (input, Python) looks.
    kind `compute`: extra matmuls on the rank's device (`ComputeDelay`), which is how a slow
    GPU (thermal throttling, a weaker part) looks.
    """

    def __init__(self, cfg: SlowConfig, rank: int, device: torch.device | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.active = cfg.rank is not None and rank in cfg.rank and cfg.ms > 0
        self.compute = ComputeDelay(device or torch.device("cpu")) if self.active and cfg.kind == "compute" else None

    def maybe_delay(self, phase: str, step: int) -> None:
        if not (self.active and self.cfg.slows(self.rank, phase, step)):
            return
        if self.compute is not None:
            self.compute.spend(self.cfg.ms)
        else:
            time.sleep(self.cfg.ms / 1e3)


class HangInjector:
    """Stops one rank for good in one phase of one step (`HangConfig.stops`): it sleeps until it is
    killed and never enters the next collective, so its peers block in it until the process
    group's timeout (`--collective-timeout`). Sleeps in 1 s slices, so SIGTERM/SIGINT handlers run."""

    def __init__(self, cfg: HangConfig, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.active = cfg.rank == rank

    def maybe_hang(self, phase: str, step: int) -> None:
        if not (self.active and self.cfg.stops(self.rank, phase, step)):
            return
        while True:
            time.sleep(1.0)
