"""Fault injection: a memory leak on one rank (`--leak-rank R --leak-mb X`)."""

from __future__ import annotations

import torch

from harness.train.config import LeakConfig

MB = 10**6


class LeakInjector:
    """Keeps about `mb` MB alive per step on the configured rank, the way an undetached loss
    history does.

    The classic leak is `losses.append(loss)` in the training loop: without `.item()` or
    `.detach()` every step's loss keeps its autograd graph (activations, saved tensors) referenced
    by a list that is never cleared. A graph's size depends on the model, so this keeps a plain
    tensor of exactly `mb` MB instead, in a list that is never cleared: the same growth, at a rate
    the collector's measured slope can be checked against. The tensor is filled (`torch.ones`), so
    its pages are touched and on CPU the process RSS grows by that much, not only its address
    space; on CUDA the caching allocator's allocated bytes grow.
    """

    def __init__(self, cfg: LeakConfig, rank: int, device: torch.device) -> None:
        self.active = cfg.rank == rank and cfg.mb > 0
        self.numel = int(cfg.mb * MB) // 4  # float32 elements
        self.device = device
        self.kept: list[torch.Tensor] = []

    def keep(self) -> None:
        """Add one step's worth to what is kept alive."""
        if self.active:
            self.kept.append(torch.ones(self.numel, dtype=torch.float32, device=self.device))
