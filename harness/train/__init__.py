"""The training side: everything a rank runs under torchrun (`python -m harness.train`).

config.py and cli.py (validated config dataclasses and the flags made from them) -> main.py
(one rank's run: process group, workload, profiler, statistics, run.json) -> trainer.py (the
step loop and its phases) with workloads.py (the lab models and data), parallel.py (DDP/FSDP2),
profiling.py (trace windows), ranges.py and timing.py (NVTX/record_function ranges, step
clocks), stats.py (step logs, the final table), run_info.py / run_status.py (run.json, rank
status files), faults.py / flight.py / memory_leak.py (injected stragglers and hangs, Flight
Recorder, an injected leak).

Importing this package imports no torch (the collector imports `harness.scalars` and
`harness.write_faults`, shared with training, and never this package); `main` loads the run.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    """`harness-train` / `python -m harness.train`: see harness/train/main.py."""
    from harness.train.main import main as run

    run(argv)
