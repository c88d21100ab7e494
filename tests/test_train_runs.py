"""Real torchrun jobs on CPU/gloo: traces, ranges, collectives and statistics of every mode."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.paths import RANGE_PREFIX, STEP_PHASES, TRACE_METADATA_KEY, TRACE_PATTERN, WORKER_RANK_PATTERN
from harness.run.heap import HeapStats
from harness.run.stats import step_statistics

from jobs import QUICK, Run, load_trace, run_harness

pytestmark = pytest.mark.slow

# Keep each job a few seconds on 2 cores.
SMALL = {
    "baseline": ["--hidden", "128"],
    "data": ["--sample-cost", "4"],
    "torch": ["--micro-ops", "10"],
    "kernel": ["--hidden", "256", "--pointwise-depth", "3"],
    "comm": ["--table-rows", "4000", "--batch-size", "8"],
}
COLLECTIVE = re.compile(r"^(gloo:|c10d::|nccl:)")


def check_run(run: Run, world_size: int, windows: int = 1) -> list[dict]:
    """Assertions every run must pass; returns the loaded traces in rank order."""
    traces = run.traces()
    assert len(traces) == world_size * windows, [p.name for p in traces]
    loaded = []
    run_ids = set()
    for i, path in enumerate(traces):
        rank, window = divmod(i, windows)
        m = TRACE_PATTERN.match(path.name)
        assert m and int(m["span"]) == window + 1
        wm = WORKER_RANK_PATTERN.match(m["worker"])
        assert wm and int(wm["rank"]) == rank
        doc = load_trace(path)
        meta = doc[TRACE_METADATA_KEY]
        assert meta["rank"] == rank and meta["world_size"] == world_size and meta["window"] == window + 1
        run_ids.add(meta["run_id"])
        if world_size > 1:
            info = doc["distributedInfo"]
            assert (info["rank"], info["world_size"]) == (rank, world_size)
        names = {e.get("name") for e in doc["traceEvents"]}
        assert {RANGE_PREFIX + p for p in STEP_PHASES} <= names, "a phase range is missing"
        assert any(n and n.startswith("ProfilerStep#") for n in names)
        if world_size > 1:
            assert any(n and COLLECTIVE.match(n) for n in names), "no collective in the trace"
        loaded.append(doc)
    assert len(run_ids) == 1, "ranks disagree on the run id"

    info = run.run_json
    assert info["world_size"] == world_size
    assert [r["rank"] for r in info["ranks"]] == list(range(world_size))
    for row in info["ranks"]:
        records = run.steps(row["rank"])
        cfg = info["config"]["workload"]
        assert [r["step"] for r in records] == list(range(cfg["steps"]))
        assert all(r["rank"] == row["rank"] and r["step_ms"] > 0 and r["data_ms"] >= 0 for r in records)
        assert all("host_cpu_util_pct" in r for r in records)
        # memory within its time budget (stats.SystemSampler): the first step's, then RSS and the
        # heap of one moment, in the same records
        read = [r for r in records if "rss_bytes" in r]
        assert read[0] is records[0] and all(r["rss_bytes"] > 0 for r in read)
        if HeapStats().available:
            assert [r for r in records if "heap_free_bytes" in r] == read
        expected = step_statistics(records)
        assert row["steps"] == cfg["steps"] - cfg["warmup_steps"]
        for key in ("mean_step_ms", "p50_step_ms", "p99_step_ms", "max_step_ms", "throughput_samples_s"):
            assert math.isclose(row[key], expected[key]), key
        assert row["traces"] == [p.name for p in traces if f"rank{row['rank']:05d}-" in p.name]
        # The steps the profiler recorded are exactly the ProfilerStep#N of that rank's traces.
        recorded = {r["step"] for r in records if r["profiler"] == "record"}
        traced = {
            int(e["name"].split("#")[1])
            for d in loaded[row["rank"] * windows : (row["rank"] + 1) * windows]
            for e in d["traceEvents"]
            if e.get("name", "").startswith("ProfilerStep#") and e.get("ph") == "X"
        }
        assert recorded == traced
    return loaded


@pytest.mark.parametrize("mode", ["baseline", "data", "torch", "kernel", "comm"])
def test_every_mode_runs_under_ddp(mode: str, lab_run: Callable[[str], Run]) -> None:
    """Each mode's shared run (conftest.lab_run, the one test_advisor.py diagnoses)."""
    run = lab_run(mode)
    check_run(run, world_size=2)
    assert run.run_json["parallel"] == "ddp"
    assert run.run_json["backend"] == "gloo"
    assert "<- longest steps" in run.proc.stdout  # rank 0's per-rank table
    assert "python -m harness.collect" in run.proc.stdout


@pytest.mark.parametrize("mode", ["data", "kernel"])
def test_fsdp_wraps_the_modes_with_and_without_an_input_pipeline(mode: str, log_dir: Path) -> None:
    run = run_harness(["--mode", mode, "--parallel", "fsdp", *QUICK, *SMALL[mode]], log_dir)
    check_run(run, world_size=2)
    assert run.run_json["parallel"] == "fsdp"


def test_straggler_in_data_phase_shows_in_its_data_ms(log_dir: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "baseline",
            *QUICK,
            *SMALL["baseline"],
            "--slow-rank",
            "1",
            "--slow-ms",
            "40",
            "--slow-phase",
            "data",
        ],
        log_dir,
    )
    rows = {r["rank"]: r for r in run.run_json["ranks"]}
    # its data phase holds the 40 ms sleep, rank 0's does not: with another process busy beside
    # the job, rank 0's data phase read 13 ms (its loads waiting for a core), never near 40
    assert rows[1]["mean_data_ms"] >= 40.0 > rows[0]["mean_data_ms"], rows
    # The others wait for it inside their collectives, so every rank's step slows down.
    assert rows[0]["mean_step_ms"] > 30


def test_straggler_every_other_step_in_backward(log_dir: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "baseline",
            *QUICK,
            *SMALL["baseline"],
            "--slow-rank",
            "0",
            "--slow-ms",
            "200",
            "--slow-phase",
            "backward",
            "--slow-every",
            "2",
        ],
        log_dir,
    )
    backward = {r["step"]: r["phases_ms"]["backward"] for r in run.steps(0)}
    # a slowed backward holds the 200 ms sleep; a clean one takes ~10 ms here, and a stall on 2
    # shared cores has reached 40 ms
    slow = [s for s, ms in backward.items() if ms >= 200]
    assert slow == [s for s in backward if s % 2 == 0]


def test_several_windows_give_one_trace_per_rank_per_window(log_dir: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "torch",
            *SMALL["torch"],
            "--steps",
            "10",
            "--warmup-steps",
            "1",
            "--wait",
            "1",
            "--warmup",
            "1",
            "--active",
            "2",
            "--repeat",
            "2",
            "--batch-size",
            "16",
        ],
        log_dir,
    )
    check_run(run, world_size=2, windows=2)


def test_single_process_run(log_dir: Path) -> None:
    run = run_harness(["--mode", "torch", *QUICK, *SMALL["torch"]], log_dir, nproc=None)
    check_run(run, world_size=1)
    assert run.run_json["parallel"] == "none"
    assert run.run_json["backend"] is None


def test_no_profile_writes_no_trace(log_dir: Path) -> None:
    run = run_harness(["--mode", "baseline", *QUICK, *SMALL["baseline"], "--no-profile"], log_dir)
    assert run.traces() == []
    assert all(r["profiler"] == "off" for r in run.steps(0))
    assert [r["traces"] for r in run.run_json["ranks"]] == [[], []]


def test_four_ranks_fsdp_with_bf16(log_dir: Path) -> None:
    run = run_harness(
        ["--mode", "kernel", "--parallel", "fsdp", "--amp", "bf16", *QUICK, *SMALL["kernel"]], log_dir, nproc=4
    )
    check_run(run, world_size=4)


def test_existing_run_name_is_refused_not_overwritten(log_dir: Path) -> None:
    run_harness(["--mode", "torch", *QUICK, *SMALL["torch"], "--no-profile"], log_dir, nproc=None)
    again = run_harness(["--mode", "torch", *QUICK], log_dir, nproc=None, check=False)
    assert again.proc.returncode == 2
    assert "already holds a run" in again.proc.stderr


def test_speed_knobs_run_and_sync_loss_logs_every_loss(log_dir: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "baseline",
            "--arch",
            "cnn",
            "--channels-last",
            "--amp",
            "bf16",
            "--fused-optimizer",
            "--sync-loss",
            "--non-blocking",
            "--cudnn-benchmark",
            "--static-graph",
            "--gradient-as-bucket-view",
            "--bucket-cap-mb",
            "1",
            *QUICK,
        ],
        log_dir,
    )
    check_run(run, world_size=2)
    assert all(isinstance(r["loss"], float) for r in run.steps(0))
    assert run.run_json["config"]["speed"]["amp"] == "bf16"


def test_fp16_grad_scaler_and_data_workers(log_dir: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "data",
            "--amp",
            "fp16",
            "--num-workers",
            "2",
            "--persistent-workers",
            "--prefetch-factor",
            "2",
            "--pin-memory",
            *QUICK,
            *SMALL["data"],
        ],
        log_dir,
        nproc=None,
    )
    check_run(run, world_size=1)
    assert run.run_json["ranks"][0]["final_loss"] > 0


def test_compile(log_dir: Path) -> None:
    run = run_harness(["--mode", "baseline", "--compile", *QUICK, "--hidden", "32"], log_dir, nproc=None, timeout=600)
    check_run(run, world_size=1)
    steps = run.steps(0)
    assert steps[0]["step_ms"] > steps[-1]["step_ms"]  # the first step pays for compilation
