"""The figures of a run in one flat record for experiment trackers (W&B, MLflow): the keys that
`harness.summary(report)` (from the collector's report: report/summary.py) and `Run.summary()`
(from what the job measured itself: run/run.py) share. Stable: a new key may be added, none is
renamed or dropped."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class SummaryRecord:
    """One report in figures; per-step figures are means over the analysed steps."""

    verdict: str
    """straggler, balanced, inconclusive (or hang: the report's verdict)"""
    stragglers: int
    """how many ranks the report names as stragglers"""
    straggler_rank: int | None
    """the latest straggler's rank"""
    straggler_host: str | None
    """its machine"""
    straggler_phase: str | None
    """the phase it is slow in"""
    straggler_late_ms: float | None
    """how late it arrives at collectives, ms per step"""
    step_ms_p50: float | None
    """the median step: per step the median over the ranks of their step, then the median over steps"""
    step_ms_p90: float | None
    """the 90th percentile of the same (linear between the steps' values)"""
    exposed_comm_share: float | None
    """communication not hidden behind compute, as a share of the ranks' step time (all ranks, all steps)"""
    data_share: float | None
    """the input pipeline's share of the step (the mean over ranks of the diagnosis' data_share)"""
    peak_gpu_allocated_bytes: float | None
    """the most GPU memory any rank had allocated (step logs; None on CPU)"""
    peak_rss_bytes: float | None
    """the most host memory any rank held (step logs)"""
    noise_bound_ms: float | None
    """how late a rank must be, ms per step, to be named a straggler in this run"""
    ranks: int
    """the ranks analysed"""


def flat(record: SummaryRecord, numbers_only: bool = False) -> dict[str, Any]:
    """`record` as a dict, keys in field order; with `numbers_only`, only its numbers (what
    MLflow's log_metrics takes: no strings, no None)."""
    out = asdict(record)
    if numbers_only:
        return {k: v for k, v in out.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    return out
