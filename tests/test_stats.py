"""Exact numbers for the step-statistics functions."""

from __future__ import annotations

import json

import numpy as np
import psutil
import pytest

from harness.run import stats
from harness.run.heap import BUDGET_SHARE
from harness.run.stats import ResidentBytes, format_rank_table, percentile, step_statistics


def test_percentile_interpolates_linearly() -> None:
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 100) == 4.0
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile([], 50) is None


def test_summary_skips_warmup_and_counts_throughput() -> None:
    records = [
        {
            "step": 0,
            "step_ms": 100.0,
            "data_ms": 50.0,
            "samples": 8,
            "warmup": True,
            "profiler": "wait",
            "rss_bytes": 900,
        },
        {
            "step": 1,
            "step_ms": 10.0,
            "data_ms": 1.0,
            "samples": 8,
            "warmup": False,
            "profiler": "wait",
            "rss_bytes": 700,
        },
        {
            "step": 2,
            "step_ms": 30.0,
            "data_ms": 3.0,
            "samples": 8,
            "warmup": False,
            "profiler": "record",
            "rss_bytes": 800,
        },
    ]
    s = step_statistics(records)
    assert s["steps"] == 2
    assert s["mean_step_ms"] == 20.0
    assert s["p50_step_ms"] == 20.0
    assert s["max_step_ms"] == 30.0
    assert s["mean_data_ms"] == 2.0
    assert s["unprofiled_mean_step_ms"] == 10.0
    assert s["throughput_samples_s"] == pytest.approx(16 / 0.040)
    assert s["peak_rss_bytes"] == 900  # the warm-up step's high-water mark counts
    assert s["peak_gpu_allocated_bytes"] is None


def test_summary_of_nothing_is_valid_json() -> None:
    s = step_statistics([{"step": 0, "step_ms": 1.0, "data_ms": 0.0, "samples": 1, "warmup": True}])
    assert s["mean_step_ms"] is None
    json.loads(json.dumps(s, allow_nan=False))
    row = {"rank": 0, "host": "h", **s}
    assert "-" in format_rank_table([row, {**row, "rank": 1}])


def test_table_marks_the_longest_steps() -> None:
    base = step_statistics([{"step": 0, "step_ms": 10.0, "data_ms": 0.0, "samples": 1, "warmup": False}])
    slow = step_statistics([{"step": 0, "step_ms": 30.0, "data_ms": 0.0, "samples": 1, "warmup": False}])
    table = format_rank_table([{"rank": 0, "host": "a", **base}, {"rank": 1, "host": "b", **slow}])
    lines = table.splitlines()
    assert lines[2].endswith("<- longest steps") and not lines[1].endswith("<- longest steps")


def test_resident_bytes_reads_what_psutil_reads_and_follows_growth() -> None:
    proc = psutil.Process()
    rss = ResidentBytes(proc)
    try:
        before, reference = rss.read(), proc.memory_info().rss
        assert before is not None and abs(before - reference) < 8 * 2**20
        held = b"\x01" * (64 * 2**20)  # every byte written: 64 MiB resident
        after = rss.read()
        assert after is not None and after - before >= 60 * 2**20, (before, after)
        del held
    finally:
        rss.close()
    # where the file cannot be read, psutil's reading
    broken = ResidentBytes(proc)
    broken._statm.broken = True
    assert broken.read() == pytest.approx(proc.memory_info().rss, abs=8 * 2**20)


def test_memory_is_read_within_its_time_budget_rss_and_heap_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading costing 20 us of CPU is followed by none until 20 us / BUDGET_SHARE (10 ms) have
    passed, however long it took on the wall clock (a descheduled reading is charged its CPU time
    only); RSS and the heap are read together: RSS less the heap's free bytes needs both of one
    moment."""
    import torch

    sampler = stats.SystemSampler(torch.device("cpu"))
    monkeypatch.setattr(sampler.heap, "read", lambda: {"heap_free_bytes": 1})
    monkeypatch.setattr(sampler.rss, "read", lambda: 5)
    seen = []
    # the wall clock at each sample; each reading's two CPU-clock calls 20 us apart
    for t in [0.0, 0.005, 0.0099, 0.0101, 0.012, 0.0202]:
        monkeypatch.setattr(stats.time, "perf_counter", lambda t=t: t)
        monkeypatch.setattr(stats.time, "thread_time", iter([1.0, 1.0 + 20e-6]).__next__)
        out = sampler.sample()
        assert ("rss_bytes" in out) == ("heap_free_bytes" in out), out
        seen.append("rss_bytes" in out)
    sampler.close()
    assert seen == [True, False, False, True, False, True]
    assert BUDGET_SHARE == 0.002


def test_a_long_run_keeps_its_percentiles_in_bins_not_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past EXACT_STEPS steady steps the percentiles come from log-spaced bins: within half a bin
    (BIN_RATIO) of the exact ones; what is kept stops growing with the steps."""
    monkeypatch.setattr(stats, "EXACT_STEPS", 100)
    rng = np.random.default_rng(7)
    times = list(rng.lognormal(np.log(20.0), 0.3, 5000))
    totals = stats.StepTotals()
    for i, ms in enumerate(times):
        totals.add({"step": i, "step_ms": ms, "data_ms": 1.0, "samples": 4, "warmup": False})
    assert len(totals.exact) == 100 and len(totals.bins) < 400
    got = totals.statistics()
    for q in (50, 90, 99):
        assert got[f"p{q}_step_ms"] == pytest.approx(percentile(times, q), rel=stats.BIN_RATIO - 1)
    assert got["max_step_ms"] == max(times) and got["mean_step_ms"] == pytest.approx(sum(times) / len(times))
    assert got["steps"] == 5000 and totals.last_step == 4999
