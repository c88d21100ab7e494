"""Where the harness's own time in the loop goes: figure (i)'s parts (bench/RESULTS.md).

Runs variant B of overhead.py (the lab's loop on harness.Run, profiler off) once to warm up and
once timed, every call listed in PARTS wrapped with a timer, and prints each part's mean
microseconds per step, calls per step and median microseconds per call. Nested parts overlap
(Run.end_step holds Run._write, which holds StepLog.write): read the rows as a tree, not as a
sum. Each wrapper adds ~0.5 us to its call.

    python bench/own_parts.py --mode torch --steps 400
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import overhead
import torch
import torch.distributed as dist

from harness.run.settings import LaunchEnv
from harness.train.cli import parse_config
from harness.train.config import resolve_environment

# (module, class, method): the harness's calls on the step path
PARTS = (
    ("harness.run.run", "Run", "begin_step"),
    ("harness.run.run", "Run", "end_step"),
    ("harness.run.run", "Run", "_open_phase"),
    ("harness.run.run", "Run", "end_phase"),
    ("harness.run.run", "Run", "_write"),
    ("harness.run.timing", "StepClock", "mark"),
    ("harness.run.timing", "StepClock", "_resolve"),
    ("harness.run.stats", "SystemSampler", "sample"),
    ("harness.run.stats", "ResidentBytes", "read"),
    ("harness.run.stats", "StepLog", "write"),
    ("harness.run.stats", "StepTotals", "add"),
    ("harness.run.heap", "HeapStats", "read"),
    ("harness.run.schedstat", "RunQueueClock", "read_ms"),
    ("harness.write_faults", "AppendOnlyFile", "extend"),
    ("harness.scalars", "ScalarWriter", "add"),
)


def _timed(call: Callable[..., Any], label: str, times: dict[str, list[float]]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            times[label].append(time.perf_counter() - start)

    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="torch")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=20)
    args, extra = ap.parse_known_args()
    torch.set_num_threads(1)
    env = LaunchEnv.from_environ({}, cuda=False, device_count=None)
    base = resolve_environment(parse_config(["--mode", args.mode, *extra]), env)
    times: dict[str, list[float]] = defaultdict(list)  # part -> each call's seconds
    for module, owner, name in PARTS:
        holder = getattr(importlib.import_module(module), owner)
        label = f"{owner}.{name}"
        setattr(holder, name, _timed(getattr(holder, name), label, times))
    overhead.init_one_rank()
    with tempfile.TemporaryDirectory() as tmp:
        overhead.time_harness(base, max(args.steps // 4, 1), args.warmup, "off", Path(tmp))  # warm-up run
        times.clear()
        wall_ms, _ = overhead.time_harness(base, args.steps, args.warmup, "off", Path(tmp))
    steps = len(times["Run.end_step"])
    print(f"mode={args.mode} steps={steps} (warm-up included) step {wall_ms:.3f} ms torch={torch.__version__}")
    print(f"{'part':<28}{'us/step':>10}{'calls/step':>12}{'median us/call':>16}")
    for label, each in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        line = f"{label:<28}{sum(each) / steps * 1e6:>10.1f}{len(each) / steps:>12.1f}"
        print(f"{line}{statistics.median(each) * 1e6:>16.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
