"""Lab sweeps: the rows each sweep builds on a given machine, the figures read back from run
folders (hand-built, exact numbers), bad input, and real sweeps end to end through
`python -m harness.lab`."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.lab.results import FAILED, OK, SKIPPED, RowResult, csv_text, derive, measure, ratio_lines, summary_markdown
from harness.lab.sweeps import SWEEPS, Host, Row
from harness.paths import LAB_DIR, LAB_SUMMARY, LAB_TIMINGS, run_file, steps_path

from jobs import REPO, job_env

CPU2 = Host(cores=2, gpus=0)


def rows(sweep: str, host: Host = CPU2, nproc: int = 2) -> dict[str, Row]:
    return {r.key: r for r in SWEEPS[sweep].build(host, nproc)}


# -- rows per machine ----------------------------------------------------------------------------


def test_data_workers_are_capped_by_the_cores() -> None:
    got = rows("data")
    assert [got[k].skip is None for k in ("workers-0", "workers-2", "workers-4")] == [True, True, False]
    assert "4 cores" in got["workers-4"].skip
    assert all(r.skip is None for r in rows("data", Host(cores=8, gpus=0)).values())


def test_ladder_is_cumulative_and_skips_cuda_rungs_on_cpu() -> None:
    got = rows("ladder")
    assert got["baseline"].args[-1] == "--sync-loss"
    assert "--sync-loss" not in got["no-sync"].args  # the one flag the next rung takes away
    assert "CUDA" in got["pinned"].skip and "CUDA" in got["cudnn"].skip
    last = got["channels-last"].args
    for flag in ("--compile", "max-autotune", "bf16", "--channels-last"):
        assert flag in last
    assert "--pin-memory" not in last and "--cudnn-benchmark" not in last  # skipped rungs add nothing
    gpu = rows("ladder", Host(cores=16, gpus=2))
    assert all(r.skip is None for r in gpu.values())
    assert "--pin-memory" in gpu["channels-last"].args and "--cudnn-benchmark" in gpu["channels-last"].args
    # one GPU cannot hold two ranks: every row says so instead of sharing the device
    assert all("2 GPUs" in r.skip for r in rows("ladder", Host(cores=16, gpus=1)).values())


def test_scaling_world_sizes_follow_the_devices() -> None:
    got = rows("scaling")
    assert got["ddp-ws4"].skip and got["fsdp-ws4"].skip and got["ddp-ws2"].skip is None
    assert got["ddp-ws2-bucket1mb"].nproc == 2 and "1" in got["ddp-ws2-bucket1mb"].args
    assert rows("scaling", Host(cores=4, gpus=0))["ddp-ws4-bucket100mb"].skip is None
    assert "2+ ranks" in rows("scaling", Host(cores=1, gpus=0))["ddp-ws1-bucket1mb"].skip


# -- figures from hand-built run folders --------------------------------------------------------


def fake_run(
    path: Path,
    step_ms: list[list[float]],
    throughput: list[float],
    rss: list[int],
    gpu: list[int] | None = None,
    warmup: int = 1,
) -> Path:
    """A run folder with `len(step_ms)` ranks; the first `warmup` steps of each are warm-up."""
    ranks = []
    for rank, times in enumerate(step_ms):
        p = steps_path(path, rank)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(
            "".join(json.dumps({"step": i, "step_ms": t, "warmup": i < warmup}) + "\n" for i, t in enumerate(times))
        )
        ranks.append(
            {
                "rank": rank,
                "throughput_samples_s": throughput[rank],
                "peak_rss_bytes": rss[rank],
                "peak_gpu_allocated_bytes": gpu[rank] if gpu else None,
            }
        )
    run_file(path).write_text(
        json.dumps({"world_size": len(step_ms), "parallel": "ddp", "device": "cpu", "ranks": ranks})
    )
    return path


def test_measure_takes_the_slowest_rank_per_step(tmp_path: Path) -> None:
    # steady steps 1..4: rank0 10, 20, 30, 40; rank1 12, 18, 30, 44 -> job 12, 20, 30, 44
    run = fake_run(tmp_path / "r", [[99, 10, 20, 30, 40], [99, 12, 18, 30, 44]], [100.0, 110.0], [5, 7])
    fig, times = measure(run)
    assert times == [12, 20, 30, 44]
    assert fig["mean_step_ms"] == 26.5
    assert fig["p50_step_ms"] == 25.0
    assert fig["p99_step_ms"] == pytest.approx(30 + 14 * 0.97)
    assert fig["std_step_ms"] == pytest.approx(((14.5**2 + 6.5**2 + 3.5**2 + 17.5**2) / 4) ** 0.5)
    assert fig["throughput_samples_s"] == 210.0
    assert (fig["peak_mem_bytes"], fig["peak_mem_kind"]) == (7, "host_rss")
    gpu = fake_run(tmp_path / "g", [[1, 2]], [1.0], [5], gpu=[300])
    assert measure(gpu)[0]["peak_mem_kind"] == "gpu_allocated" and measure(gpu)[0]["peak_mem_bytes"] == 300


def result(row: Row, thr: float, ws: int = 2, mean: float = 10.0, mem: int = 100) -> RowResult:
    return RowResult(
        row,
        OK,
        figures={
            "world_size": ws,
            "mean_step_ms": mean,
            "p50_step_ms": mean,
            "p99_step_ms": mean,
            "std_step_ms": 0.0,
            "throughput_samples_s": thr,
            "peak_mem_bytes": mem,
            "peak_mem_kind": "host_rss",
            "parallel": "ddp",
            "device": "cpu",
            "steps": 5,
        },
    )


def test_ratios_speedups_and_scaling_efficiency() -> None:
    r = rows("scaling")
    results = [
        result(r["ddp-ws1"], 100.0, ws=1),
        result(r["ddp-ws2"], 150.0),
        RowResult(r["ddp-ws4"], SKIPPED, note=r["ddp-ws4"].skip),
        result(r["ddp-ws2-bucket1mb"], 120.0),
    ]
    derive(results)
    assert [x.speedup for x in results] == [1.0, 1.5, None, 1.2]
    assert results[1].vs_previous == 1.5 and results[3].vs_previous == 0.8
    assert results[1].efficiency == 0.75 and results[0].efficiency == 1.0
    lines = ratio_lines(SWEEPS["scaling"], results)
    assert "DDP x2: scaling efficiency 75%" in lines
    assert "DDP x2, bucket 1 MB: throughput x0.80 of the default 25 MB bucket at the same world size" in lines
    table = list(csv.DictReader(csv_text(SWEEPS["scaling"], results).splitlines()))
    assert [t["status"] for t in table] == ["ok", "ok", "skipped", "ok"]
    assert table[1]["efficiency"] == "0.75" and "4 cores" in table[2]["note"]


def test_reading_rules_of_torch_and_three_run() -> None:
    t = rows("torch")
    res = [result(t["batch-256"], 100.0, mean=10.0), result(t["batch-1024"], 130.0, mean=30.0)]
    derive(res)
    lines = ratio_lines(SWEEPS["torch"], res)
    assert lines[0] == "batch 1024 vs 256: step time x3.00, throughput x1.30"
    assert "opposite directions" in lines[1]
    three = rows("three-run")
    res = [
        result(three["fp32"], 100.0, mem=200),
        result(three["bf16"], 105.0, mem=150),
        result(three["bf16-compile"], 210.0),
    ]
    derive(res)
    lines = ratio_lines(SWEEPS["three-run"], res)
    assert lines[0] == "fp32 -> bf16: throughput x1.05, peak memory x0.75"
    assert "not precision" in lines[1]
    assert lines[2].startswith("bf16 -> bf16 + torch.compile: throughput x2.00 (fusion pays")
    md = summary_markdown(SWEEPS["three-run"], res, {"machine": "test"}, ["throughput.png", "throughput.svg"])
    assert "| bf16 autocast | ok | 2 | cpu | 10.00 | 10.00 | 10.00 | 105.0 | 0 | 1.05x |" in md
    assert "![throughput](throughput.png) ([SVG](throughput.svg))" in md


def test_ladder_names_regressions() -> None:
    lad = rows("ladder")
    res = [result(lad["baseline"], 100.0), result(lad["no-sync"], 120.0), result(lad["compile"], 90.0)]
    derive(res)
    lines = ratio_lines(SWEEPS["ladder"], res)
    assert "+ torch.compile: x0.75 over the previous rung, x0.90 over baseline" in lines
    assert lines[-1] == "Regressions on this machine (slower than the rung before, beyond noise): + torch.compile"


# -- the command --------------------------------------------------------------------------------


def lab(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.lab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=job_env(),
        cwd=REPO,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuch"], "invalid choice"),
        (["torch", "--only", "batch-7"], "rows: batch-256, batch-1024"),
        (["torch", "--nproc", "0"], "--nproc 0 must be >= 1"),
        (["torch", "--", "--steps", "-1"], "workload.steps"),
        (["torch", "--", "--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_and_runs_nothing(args: list[str], needle: str, tmp_path: Path) -> None:
    proc = lab(
        [*args, "--log-dir", str(tmp_path)]
        if "--" not in args
        else [*args[: args.index("--")], "--log-dir", str(tmp_path), *args[args.index("--") :]]
    )
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / LAB_DIR).exists()


def sweep_dir(log_dir: Path, name: str) -> Path:
    (found,) = (log_dir / LAB_DIR).glob(f"{name}-*")
    return found


def timings(log_dir: Path, name: str) -> list[dict[str, str]]:
    return list(csv.DictReader((sweep_dir(log_dir, name) / LAB_TIMINGS).read_text().splitlines()))


@pytest.mark.slow
def test_a_failing_row_is_reported_and_the_exit_code_says_so(tmp_path: Path) -> None:
    proc = lab(
        [
            "torch",
            "--only",
            "batch-256",
            "--log-dir",
            str(tmp_path),
            "--",
            "--backend",
            "nccl",
            "--steps",
            "4",
            "--warmup-steps",
            "1",
        ]
    )
    assert proc.returncode == 1, proc.stderr
    (row,) = timings(tmp_path, "torch")
    assert row["status"] == FAILED and "nccl needs CUDA" in row["note"]
    summary = (sweep_dir(tmp_path, "torch") / LAB_SUMMARY).read_text()
    assert "batch 256: failed, harness.train: invalid config: parallel.backend: nccl needs CUDA" in summary


def check_charts(folder: Path, names: tuple[str, ...]) -> None:
    for name in names:
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert ET.parse(folder / f"{name}.svg").getroot().tag.endswith("svg")


@pytest.mark.slow
def test_torch_sweep_end_to_end(tmp_path: Path) -> None:
    proc = lab(["torch", "--log-dir", str(tmp_path), "--", "--steps", "8", "--warmup-steps", "2", "--micro-ops", "20"])
    assert proc.returncode == 0, proc.stderr
    table = timings(tmp_path, "torch")
    assert [(r["key"], r["status"], r["world_size"]) for r in table] == [
        ("batch-256", OK, "2"),
        ("batch-1024", OK, "2"),
    ]
    for r in table:
        assert float(r["mean_step_ms"]) > 0 and float(r["throughput_samples_s"]) > 0 and int(r["peak_mem_bytes"]) > 0
        assert r["steps"] == "6" and "--micro-ops 20" in r["args"]
        assert run_file(Path(r["run_dir"])).exists()
    folder = sweep_dir(tmp_path, "torch")
    check_charts(folder, ("throughput", "step_ms"))
    summary = (folder / LAB_SUMMARY).read_text()
    assert "batch 1024 vs 256: step time x" in summary and "| batch 1024 | ok | 2 | cpu |" in summary
    assert "timings: " in proc.stdout


@pytest.mark.slow
def test_data_sweep_charts_jitter(tmp_path: Path) -> None:
    proc = lab(["data", "--log-dir", str(tmp_path), "--", "--steps", "8", "--warmup-steps", "2", "--sample-cost", "5"])
    assert proc.returncode == 0, proc.stderr
    status = {r["key"]: r["status"] for r in timings(tmp_path, "data")}
    cores = len(os.sched_getaffinity(0))
    assert status == {
        "workers-0": OK,
        "workers-2": OK if cores >= 2 else SKIPPED,
        "workers-4": OK if cores >= 4 else SKIPPED,
    }
    folder = sweep_dir(tmp_path, "data")
    check_charts(folder, ("throughput", "step_ms", "jitter"))
    assert "mean / p50 = " in (folder / LAB_SUMMARY).read_text()


@pytest.mark.slow
def test_scaling_sweep_efficiency(tmp_path: Path) -> None:
    proc = lab(
        [
            "scaling",
            "--only",
            "ddp-ws1,ddp-ws2",
            "--log-dir",
            str(tmp_path),
            "--",
            "--steps",
            "8",
            "--warmup-steps",
            "2",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    table = {r["key"]: r for r in timings(tmp_path, "scaling")}
    assert table["ddp-ws1"]["world_size"] == "1" and float(table["ddp-ws1"]["efficiency"]) == 1.0
    assert 0 < float(table["ddp-ws2"]["efficiency"]) < 2
    check_charts(sweep_dir(tmp_path, "scaling"), ("scaling",))


def test_failure_line_prefers_the_harness_error_then_the_rank_exception() -> None:
    from harness.lab.runner import failure_line

    wrapped = (
        "[rank1]: Traceback (most recent call last):\n[rank1]: RuntimeError: boom\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    )
    assert failure_line(wrapped, 1) == "RuntimeError: boom"
    assert failure_line("harness.train: invalid config: x\n" + wrapped, 2) == "harness.train: invalid config: x"
    assert failure_line("harness.train: run r finished (2 rank(s))\n", 3) == "exit code 3"


def test_within_noise_is_two_standard_errors_of_the_ratio() -> None:
    from harness.lab.results import within_noise

    lad = rows("ladder")
    a, b, c = result(lad["baseline"], 100.0), result(lad["no-sync"], 128.0), result(lad["compile"], 129.0)
    for r in (a, b, c):
        r.figures.update(std_step_ms=2.0, steps=4)  # relative error per row 0.2 / 2 = 0.1; of the ratio 0.1414
    assert within_noise(b, a) and not within_noise(c, a)
    res = [a, b]
    derive(res)
    assert ratio_lines(SWEEPS["ladder"], res) == [
        "no per-step sync: x1.28 over the previous rung, x1.28 over baseline (within step-time noise)"
    ]
