"""bench/eager_overhead.py's measurement (the unit of the launch-bound bound,
advisor.Rules.launch_op_ratio) on a hand-built trace with an exact answer."""

from __future__ import annotations

import sys
from pathlib import Path

from jobs import REPO
from tracebuild import document, write, x

sys.path.insert(0, str(REPO / "bench"))
from eager_overhead import eager_cost  # noqa: E402


def test_an_eager_op_costs_its_host_time_per_aten_op_held_in_bare_ops(tmp_path: Path) -> None:
    """Three as_strided of 0.5 us (the bare op); aten::linear [10, 14] holds aten::addmm [11, 13]
    and one launch (2 us per aten op); aten::add [20, 21.5] holds one launch (1.5 us); aten::cat
    [30, 33] holds two launches (not one kernel's op). Median of 2 and 1.5 = 1.75 us = 3.5 bare
    ops."""
    events = [x("aten::as_strided", "cpu_op", 1.0 + i, 0.5) for i in range(3)]
    events += [
        x("aten::linear", "cpu_op", 10, 4),
        x("aten::addmm", "cpu_op", 11, 2),
        x("cudaLaunchKernel", "cuda_runtime", 12, 0.5),
        x("aten::add", "cpu_op", 20, 1.5),
        x("cudaLaunchKernel", "cuda_runtime", 20.5, 0.5),
        x("aten::cat", "cpu_op", 30, 3),
        x("cudaLaunchKernel", "cuda_runtime", 30.5, 0.5),
        x("cudaLaunchKernel", "cuda_runtime", 31.5, 0.5),
    ]
    cost = eager_cost(write(tmp_path / "rank0.pt.trace.json", document(events, 0)))
    assert (cost.bare_op_us, cost.eager_ops, cost.eager_op_us, cost.coarse) == (0.5, 2, 1.75, False)
    assert cost.eager_bare_ops == 3.5
