"""The lab: `python -m harness.train` runs workloads that each force one bottleneck, on
harness.Run (harness/run/) like any loop.

config.py and cli.py (the lab's tables beside the run's settings, and the flags made from them)
-> main.py (one rank's run: process group, workload, harness.Run) -> trainer.py (the step loop
and its phases) with workloads.py (the lab models and data), parallel.py (DDP/FSDP2), faults.py
and memory_leak.py (a slowed rank, a hang, an injected leak).

Importing this package imports no torch; `main` loads the run.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """`harness-train` / `python -m harness.train`: see harness/train/main.py."""
    from harness.train.main import main as run

    run(argv)
