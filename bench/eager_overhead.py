"""Benchmark (not a test): what one eager op costs the host on a GPU, in bare ops, on real traces.

The launch-bound rule (harness/traces/analyse/advisor.py, `Rules.launch_op_ratio`) holds the
step time each op accounts for against the cost of one bare op of the same trace
(`host_ops.op_floor_us`: the median `aten::as_strided`). Its bound needs what an op whose compute
is negligible costs, in bare ops. On a GPU trace the host's time in an `aten::` op that
launches one kernel is exactly that: the kernel runs on the device, after the op has returned.

Per trace file:
1. the bare op: the median duration of `aten::as_strided` (host_ops.FLOOR_OP);
2. the eager ops: outermost `aten::` cpu ops (in no other `aten::` op of their thread) holding
   exactly one kernel launch (a `cuda_runtime` or `cuda_driver` event named `*Launch*` on the
   same thread, inside the op); each one's cost per op = its duration / the `aten::` ops it
   holds, itself included (the launch-bound rule counts ops at any depth, host.count_host_ops);
3. eager_bare_ops = median(their cost per op) / the bare op. Where every as_strided duration is a
   whole microsecond the clock is coarser than the op: the figure is printed and marked coarse.

    python bench/eager_overhead.py ../shared/traces/hta_single_rank/*.json.gz
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLOOR_OP = "aten::as_strided"  # as harness/traces/read/host_ops.py reads it


@dataclass(frozen=True)
class EagerCost:
    path: str
    bare_op_us: float | None
    eager_ops: int
    eager_op_us: float | None
    coarse: bool

    @property
    def eager_bare_ops(self) -> float | None:
        if not self.bare_op_us or self.eager_op_us is None:
            return None
        return self.eager_op_us / self.bare_op_us


def _events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]


def eager_cost(path: Path) -> EagerCost:
    """Steps 1-3 of the module's docstring on one trace file."""
    events = _events(path)
    ops = [e for e in events if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("aten::")]
    floor = [float(e["dur"]) for e in ops if e["name"] == FLOOR_OP]
    launches: dict[Any, list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "Launch" in str(e.get("name", "")):
            launches[e["tid"]].append(float(e["ts"]))
    for ts in launches.values():
        ts.sort()
    one_launch = []
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_thread[e["tid"]].append(e)
    for tid, thread_ops in by_thread.items():
        ts = launches.get(tid, [])
        thread_ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        end = -1.0
        for i, e in enumerate(thread_ops):
            t0, t1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            if t0 < end:
                continue  # inside an earlier op: counted with it
            end = t1
            inner = 1
            while i + inner < len(thread_ops) and float(thread_ops[i + inner]["ts"]) < t1:
                inner += 1
            if bisect.bisect_right(ts, t1) - bisect.bisect_left(ts, t0) == 1:
                one_launch.append(float(e["dur"]) / inner)
    return EagerCost(
        path=str(path),
        bare_op_us=statistics.median(floor) if floor else None,
        eager_ops=len(one_launch),
        eager_op_us=statistics.median(one_launch) if one_launch else None,
        coarse=bool(floor) and all(d == int(d) for d in floor),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path, help="Kineto trace files (.json or .json.gz)")
    args = parser.parse_args(argv)
    print("| trace | bare op (us) | one-kernel aten ops | their median per op (us) | in bare ops | clock |")
    print("|---|---|---|---|---|---|")
    for path in args.traces:
        if not path.is_file():
            print(f"eager_overhead: no such trace file: {path}", file=sys.stderr)
            return 2
        c = eager_cost(path)
        ratio = c.eager_bare_ops
        print(
            f"| {path.name} | {c.bare_op_us if c.bare_op_us is not None else '-'} | {c.eager_ops} | "
            f"{c.eager_op_us if c.eager_op_us is not None else '-'} | "
            f"{f'{ratio:.1f}' if ratio is not None else '-'} | {'whole us' if c.coarse else 'sub-us'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
