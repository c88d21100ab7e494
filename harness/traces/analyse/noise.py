"""The timing noise of the devices a job's ranks run on: what the straggler rule, the collector's
(stragglers.py) and the live watch's (harness/watch/rule.py), must not take for a straggler.

One rule for every device: the bounds of `stragglers.straggler_bounds`. A device enters it only
through the ways its timing can err, each a property of how that device runs work, never a
threshold set from a campaign. Where a run's noise is larger than a small straggler, the bounds
measure it (the run's own jitter, the clocks' scatter, the peers' lateness) and the report states
the bound (report/floor.py); no device has a rule of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from harness.sourced import threshold


@dataclass(frozen=True, kw_only=True)
class NoiseModel:
    """How one kind of device makes healthy ranks look late.

    - `name`: how the report says it.
    - `wakeup_noise`: each rank's arrivals carry its thread's wake-up delay after the previous
      collective. A gloo collective ends on each rank when the kernel schedules its thread again,
      and its next run-up starts there, so the collectives' end scatter is timing noise on every
      rank, also on one clock. A collective's device kernels end together on every GPU: there
      the scatter is the error of comparing two clocks, counted only across clocks. The clock
      check (align/clocks.py) reads a waiter's end there against other waiters' only, or in
      both roles.
    - `min_late_steps`: the fewest steps (all of them in a shorter window) in which a straggler
      is late beyond the bound. Where ranks time-share cores the scheduler can hold a healthy
      rank off its core for a whole step (a time slice is milliseconds long, a small step too),
      while a straggler's cause recurs; so one late step is not a straggler there. A GPU's
      kernels do not time-share with another rank's, and a host running ahead of its GPU can
      fold a delay into a single step, so one step is enough there.
    """

    name: str
    wakeup_noise: bool = threshold(
        kind="definition",
        source="where a collective ends on each rank when its thread is scheduled again, the ends' scatter is "
        "timing noise on one clock too; where device kernels end together, only across clocks",
    )
    min_late_steps: int = threshold(
        kind="definition",
        source="where ranks time-share cores the scheduler can hold a healthy rank off its core for a whole step "
        "(a time slice is milliseconds long), so one late step is no straggler; a GPU's kernels do not time-share "
        "and a host running ahead can fold a delay into one step",
    )

    def __post_init__(self) -> None:
        if self.min_late_steps < 1:
            raise ValueError(f"min_late_steps must be at least 1, got {self.min_late_steps}")


GPU = NoiseModel(name="GPU devices", wakeup_noise=False, min_late_steps=1)
SHARED_CPU = NoiseModel(name="shared CPU cores", wakeup_noise=True, min_late_steps=2)


def noise_model(devices: Iterable[str]) -> NoiseModel:
    """The noise model of a job whose ranks ran on `devices` ("cpu", "cuda", ...): SHARED_CPU
    where every rank ran on CPU (CPU ranks of one host share its cores and its scheduler), else
    GPU (a rank's work on its device does not time-share with another rank's)."""
    kinds = list(devices)
    return SHARED_CPU if kinds and all(d == "cpu" for d in kinds) else GPU
