"""Fault injection: a reproducible straggler that slows one phase on one rank."""

from __future__ import annotations

import time

from harness.config import StragglerConfig


class StragglerInjector:
    """Sleeps `ms` inside `phase` on `rank`, on every `every`-th step.

    A host-side sleep: on CPU it is the phase's own time; on GPU it delays everything the host
    would have enqueued next, which is how a slow host phase (input, Python overhead) looks.
    """

    def __init__(self, cfg: StragglerConfig, rank: int) -> None:
        self.active = cfg.rank == rank and cfg.ms > 0
        self.cfg = cfg

    def maybe_delay(self, phase: str, step: int) -> None:
        if self.active and phase == self.cfg.phase and step % self.cfg.every == 0:
            time.sleep(self.cfg.ms / 1e3)
