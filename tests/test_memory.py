"""Memory triage from the step logs (issue: growth, imbalance, cache and headroom across ranks):
exact answers on hand-built step logs, then real 2-rank CPU runs with and without an injected leak."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.collect import command as collect_cli
from harness.paths import MEMORY_TIMELINE_PATTERN, PARTIAL_SUFFIX, steps_path
from harness.report.console import console_table
from harness.report.document import build_report
from harness.report.markdown import render_markdown
from harness.report.page import render_page
from harness.report.records import as_document
from harness.run.heap import HeapStats
from harness.run.settings import ConfigError, LaunchEnv
from harness.traces.analyse.memory import (
    GiB,
    MemoryFinding,
    MemoryStep,
    MemoryTimeline,
    MiB,
    analyze_memory,
    memory_from_dirs,
    read_step_logs,
    t_quantile,
    trend,
)
from harness.train.config import build_config, resolve_environment

from jobs import collect_report, run_harness, said
from tracebuild import ring_docs, run_analysis

WARMUP = 5
STEADY = range(WARMUP, WARMUP + 20)  # 20 steady steps: 5..24


def rec(
    step: int,
    rss: float | None = None,
    alloc: float | None = None,
    reserved: float | None = None,
    host: str = "h",
    **extra: Any,
) -> dict[str, Any]:
    r: dict[str, Any] = {"step": step, "rank": 0, "host": host, "step_ms": 1.0, "warmup": step < WARMUP, **extra}
    for key, v in (("rss_bytes", rss), ("gpu_peak_allocated_bytes", alloc), ("gpu_peak_reserved_bytes", reserved)):
        if v is not None:
            r[key] = v
    return r


def write_log(run: Path, rank: int, records: list[dict[str, Any]], tail: str = "") -> Path:
    path = steps_path(run, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def flat_host(run: Path, rank: int, rss: float = 400e6, **extra: Any) -> None:
    # warm-up steps far off: they must not count
    write_log(run, rank, [rec(s, rss=rss if s >= WARMUP else 10 * rss, **extra) for s in range(WARMUP + 20)])


def kinds(findings: list[MemoryFinding] | list[dict]) -> list[tuple[int, str]]:
    return [(f["rank"], f["kind"]) if isinstance(f, dict) else (f.rank, f.kind) for f in findings]


# --- growth -------------------------------------------------------------------------------------


def test_host_growth_exact_slope_and_projection(tmp_path: Path) -> None:
    limit = 4_000_000_000
    flat_host(tmp_path, 0, host_mem_total_bytes=limit)
    # rank 1: 500 MB + 3 MiB per step, exactly; warm-up steps at 9 GB are left out
    write_log(
        tmp_path,
        1,
        [
            rec(s, rss=(500e6 + 3 * MiB * s) if s >= WARMUP else 9e9, host_mem_total_bytes=limit)
            for s in range(WARMUP + 20)
        ],
    )
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(1, "growth")]
    ev = mem.findings[0].evidence
    assert ev["memory"] == "host" and ev["steps"] == 20
    assert ev["bytes_per_step"] == pytest.approx(3 * MiB) and ev["stderr_bytes_per_step"] == pytest.approx(0, abs=1e-3)
    assert ev["rise_mb"] == pytest.approx(19 * 3 * MiB / 1e6, abs=1e-3)
    # free = limit - (rank 0's 400 MB + rank 1's last RSS), over rank 1's growth (the host's only)
    last1 = 500e6 + 3 * MiB * 24
    assert ev["steps_to_limit"] == int((limit - 400e6 - last1) // (3 * MiB))
    assert mem.ranks[1]["rss_growth_bytes_per_step"] == pytest.approx(3 * MiB)
    assert mem.ranks[0]["rss_growth_bytes_per_step"] == 0 and mem.ranks[0]["peak_rss_bytes"] == 400e6
    assert mem.ranks[1]["peak_rss_bytes"] == last1
    assert "3.15 MB per step over 20 steps" in mem.findings[0].reason
    assert "losses.append(loss)" in mem.findings[0].advice


def test_gpu_growth_projects_to_the_device_and_no_limit_says_why(tmp_path: Path) -> None:
    total = 80 * GiB
    write_log(
        tmp_path,
        0,
        [
            rec(
                s, rss=400e6, alloc=10 * GiB + 64 * MiB * s, reserved=12 * GiB + 64 * MiB * s, gpu_mem_total_bytes=total
            )
            for s in range(WARMUP + 20)
        ],
    )
    [f] = memory_from_dirs([tmp_path]).findings
    assert (f.kind, f.evidence["memory"]) == ("growth", "gpu")
    assert f.evidence["bytes_per_step"] == pytest.approx(64 * MiB)
    assert f.evidence["steps_to_limit"] == (total - (10 * GiB + 64 * MiB * 24)) // (64 * MiB)
    # the same without the host limit field: host growth would have no projection, and says why
    write_log(tmp_path, 0, [rec(s, rss=400e6 + 4 * MiB * s) for s in range(WARMUP + 20)])
    [f] = memory_from_dirs([tmp_path]).findings
    assert f.evidence["steps_to_limit"] is None and "no host_mem_total_bytes" in f.evidence["projection"]


def test_two_growing_ranks_share_their_host(tmp_path: Path) -> None:
    # ranks 0 and 1 on one host grow 2 and 6 MiB a step: the host runs out at their summed rate
    limit = 2_000_000_000
    for r, rate in ((0, 2 * MiB), (1, 6 * MiB)):
        write_log(tmp_path, r, [rec(s, rss=300e6 + rate * s, host_mem_total_bytes=limit) for s in STEADY])
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(0, "growth"), (1, "growth")]
    free = limit - (300e6 + 2 * MiB * 24) - (300e6 + 6 * MiB * 24)
    assert [f.evidence["steps_to_limit"] for f in mem.findings] == [int(free // (8 * MiB))] * 2


@pytest.mark.parametrize(
    "series,why",
    [
        # RSS churning +-4 MiB around a flat line: no trend
        ([400e6 + (4 * MiB if s % 2 else -4 * MiB) for s in STEADY], "noise"),
        # one jump of 100 MB mid-window, flat on both sides: the second half does not rise
        ([400e6 + (100e6 if s >= 15 else 0) for s in STEADY], "one-off jump"),
        # a perfect line, but 0.5 MiB x 19 steps = 9.5 MiB: below 16 MiB, not material
        ([400e6 + 0.5 * MiB * s for s in STEADY], "too small"),
        # warming up: 4 MiB a step for 10 steps, then 0.3: still rising in its second half, at
        # under half the whole window's rate (allocators filling up, not a leak)
        (
            [400e6 + 4 * MiB * min(i, 10) + 0.3 * MiB * max(i - 10, 0) for i, _ in enumerate(STEADY)],
            "levelling off",
        ),
    ],
)
def test_no_growth_finding(tmp_path: Path, series: list[float], why: str) -> None:
    write_log(tmp_path, 0, [rec(s, rss=v) for s, v in zip(STEADY, series)])
    mem = memory_from_dirs([tmp_path])
    assert mem.findings == [], why


def swing(s: int) -> float:
    """The free heap a rank holds, swinging as communication buffers come back and pages are
    trimmed: a pseudo-random 0-60 MiB a step (an LCG, so the numbers are fixed)."""
    return float((s * 1103515245 + 12345) % 61) * MiB


def test_host_growth_is_judged_net_of_mallocs_free_bytes(tmp_path: Path) -> None:
    # rank 0 leaks 2 MiB a step into heap its allocator held free: RSS = live + free, where the
    # live part grows by the leak and the free part swings; rank 1 holds more and more free heap
    # (an allocator caching) with its live bytes flat. No heap_in_use_bytes: the net series alone
    leak = [rec(s, rss=400e6 + 2 * MiB * s + swing(s), heap_free_bytes=swing(s)) for s in STEADY]
    caching = [rec(s, rss=400e6 + 3 * MiB * s, heap_free_bytes=10e6 + 3 * MiB * s) for s in STEADY]
    write_log(tmp_path, 0, leak)
    write_log(tmp_path, 1, caching)
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(0, "growth")]
    ev = mem.findings[0].evidence
    assert ev["series"] == "rss_less_heap_free" and ev["bytes_per_step"] == pytest.approx(2 * MiB)
    assert ev["stderr_bytes_per_step"] == pytest.approx(0, abs=1e-3)
    assert mem.findings[0].reason.startswith("host RSS less malloc's free bytes rises 2.10 MB per step")
    # the ranks' columns keep RSS's own slope; the projection the RSS the host holds
    assert mem.ranks[1]["rss_growth_bytes_per_step"] == pytest.approx(3 * MiB)
    assert ev["steps_to_limit"] is None
    # the same RSS without the heap fields (another allocator): judged on RSS, rank 0's leak
    # drowns in the swing and rank 1's caching reads as growth
    for r, log in ((0, leak), (1, caching)):
        write_log(tmp_path, r, [{k: v for k, v in x.items() if not k.startswith("heap_")} for x in log])
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(1, "growth")] and mem.findings[0].evidence["series"] == "rss"
    assert mem.findings[0].reason.startswith("host RSS rises")
    # short steps log them every k-th step: the net series is those steps, never a mix of the two
    write_log(tmp_path, 0, [x if x["step"] % 2 else {**x, "heap_free_bytes": None} for x in leak])
    [f] = [f for f in memory_from_dirs([tmp_path]).findings if f.rank == 0]
    assert f.evidence["steps"] == 10 and f.evidence["bytes_per_step"] == pytest.approx(2 * MiB)
    # every third: 7 points, too few for a slope (min_steps 10): judged on RSS, nothing found
    write_log(tmp_path, 0, [x if x["step"] % 3 == 0 else {**x, "heap_free_bytes": None} for x in leak])
    assert (0, "growth") not in kinds(memory_from_dirs([tmp_path]).findings)


def test_host_growth_is_judged_on_the_heap_in_use(tmp_path: Path) -> None:
    # rank 0 leaks 2 MiB of tensors a step: malloc's bytes in use rise by exactly that, while the
    # memory outside malloc swings 0-60 MiB; rank 1's memory outside malloc drifts up 1.5 MiB a
    # step with its heap in use flat (as on a healthy comm/fsdp/2 rank here); rank 2 is flat
    def log(s: int, in_use: float, outside: float) -> dict[str, Any]:
        return rec(s, rss=in_use + outside + 10e6, heap_free_bytes=10e6, heap_in_use_bytes=in_use)

    tensors = [log(s, 150e6 + 2 * MiB * s, 250e6 + swing(s)) for s in STEADY]
    drift = [log(s, 150e6, 250e6 + 1.5 * MiB * s) for s in STEADY]
    write_log(tmp_path, 0, tensors)
    write_log(tmp_path, 1, drift)
    write_log(tmp_path, 2, [log(s, 150e6, 250e6) for s in STEADY])
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(0, "growth")]
    ev = mem.findings[0].evidence
    assert ev["series"] == "heap_in_use" and ev["bytes_per_step"] == pytest.approx(2 * MiB)
    assert ev["stderr_bytes_per_step"] == pytest.approx(0, abs=1e-3) and ev["steps"] == 20
    assert mem.findings[0].reason.startswith("malloc's bytes in use rises 2.10 MB per step over 20 steps")
    # without the heap in use, RSS less the free heap is judged: rank 0's leak drowns in the
    # swing and rank 1's drift reads as a leak
    write_log(tmp_path, 0, [{k: v for k, v in x.items() if k != "heap_in_use_bytes"} for x in tensors])
    write_log(tmp_path, 1, [{k: v for k, v in x.items() if k != "heap_in_use_bytes"} for x in drift])
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(1, "growth")] and mem.findings[0].evidence["series"] == "rss_less_heap_free"
    # fewer than 10 steps with it (read every 3rd step in short steps): the same
    write_log(tmp_path, 0, [x if x["step"] % 3 == 0 else {**x, "heap_in_use_bytes": None} for x in tensors])
    assert kinds(memory_from_dirs([tmp_path]).findings) == [(1, "growth")]


def test_growth_needs_ten_steady_steps(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [rec(s, rss=400e6 + 50 * MiB * s) for s in range(WARMUP, WARMUP + 9)])
    mem = memory_from_dirs([tmp_path])
    assert mem.findings == [] and mem.ranks[0]["rss_growth_bytes_per_step"] == pytest.approx(50 * MiB)
    write_log(tmp_path, 0, [rec(s, rss=400e6 + 50 * MiB * s) for s in range(WARMUP, WARMUP + 10)])
    assert kinds(memory_from_dirs([tmp_path]).findings) == [(0, "growth")]


def test_t_quantile() -> None:
    # Student's t at 0.99 (tables): 8, 16, 30 and 100 degrees of freedom
    for df, t in ((8, 2.896), (16, 2.583), (30, 2.457), (100, 2.364)):
        assert t_quantile(0.99, df) == pytest.approx(t, abs=1e-3)


# --- imbalance, cache, headroom -----------------------------------------------------------------


def gpu_rank(run: Path, rank: int, alloc: float, reserved: float | None = None, total: float | None = None) -> None:
    extra = {"gpu_mem_total_bytes": total} if total else {}
    write_log(run, rank, [rec(s, rss=1e9, alloc=alloc, reserved=reserved or alloc, **extra) for s in STEADY])


def test_imbalance_against_the_other_ranks_median(tmp_path: Path) -> None:
    for r, gib in enumerate((10, 10, 10.5, 12)):
        gpu_rank(tmp_path, r, gib * GiB)
    mem = memory_from_dirs([tmp_path])
    # rank 3: 12 GiB against the others' median 10 GiB = 1.2x, 2 GiB more (beyond the material
    # 10%); rank 2: 1.05x
    assert kinds(mem.findings) == [(3, "imbalance")]
    ev = mem.findings[0].evidence
    assert (ev["memory"], ev["peak_bytes"], ev["others_median_bytes"], ev["ratio"]) == ("gpu", 12 * GiB, 10 * GiB, 1.2)


def test_imbalance_needs_a_material_excess(tmp_path: Path) -> None:
    # host RSS 300 MB against 100 MB: 3x, but 200 MB < 256 MiB
    flat_host(tmp_path, 0, rss=100e6)
    flat_host(tmp_path, 1, rss=300e6)
    assert memory_from_dirs([tmp_path]).findings == []
    flat_host(tmp_path, 1, rss=400e6)  # 300 MB > 256 MiB
    [f] = memory_from_dirs([tmp_path]).findings
    assert (f.rank, f.kind, f.evidence["memory"], f.evidence["ratio"]) == (1, "imbalance", "host", 4.0)


def test_cache_unused_reserved_memory(tmp_path: Path) -> None:
    # an 80 GB device: unused cache is a finding from 5% of it (headroom_fraction), 4 GB
    gpu_rank(tmp_path, 0, 6 * GiB, reserved=12 * GiB, total=80e9)  # 6 GiB unused
    gpu_rank(tmp_path, 1, 6 * GiB, reserved=8 * GiB, total=80e9)  # 2 GiB unused: under the margin
    mem = memory_from_dirs([tmp_path])
    assert kinds(mem.findings) == [(0, "cache")]
    ev = mem.findings[0].evidence
    assert (ev["unused_bytes"], ev["ratio"], ev["limit_bytes"]) == (6 * GiB, 2.0, 80e9)
    assert "expandable_segments" in mem.findings[0].advice
    assert mem.findings[0].reason.endswith("6.00 GiB held unused, 8.1% of the device")
    # the same 2 GiB on a 16 GB device is 13% of it; 600 MiB never is (under 1 GiB)
    gpu_rank(tmp_path / "16gb", 0, 6 * GiB, reserved=8 * GiB, total=16e9)
    assert kinds(memory_from_dirs([tmp_path / "16gb"]).findings) == [(0, "cache")]
    gpu_rank(tmp_path / "small", 0, 300 * MiB, reserved=900 * MiB, total=16e9)
    assert memory_from_dirs([tmp_path / "small"]).findings == []
    # without the device's total in the log the unused bytes cannot be weighed
    gpu_rank(tmp_path / "no_total", 0, 6 * GiB, reserved=12 * GiB)
    assert memory_from_dirs([tmp_path / "no_total"]).findings == []


def test_headroom_gpu_and_host(tmp_path: Path) -> None:
    gpu_rank(tmp_path / "a", 0, 77e9, total=80e9)  # 3.75% free
    gpu_rank(tmp_path / "a", 1, 75e9, total=80e9)  # 6.25% free
    mem = memory_from_dirs([tmp_path / "a"])
    assert kinds(mem.findings) == [(0, "headroom")]
    assert mem.findings[0].evidence["free_fraction"] == 0.0375
    # host: two ranks of 1.0 and 1.1 GB on one host with 2.2 GB: 4.5% free; found on the larger
    flat_host(tmp_path / "b", 0, rss=1.0e9, host_mem_total_bytes=2.2e9)
    flat_host(tmp_path / "b", 1, rss=1.1e9, host_mem_total_bytes=2.2e9)
    [f] = memory_from_dirs([tmp_path / "b"]).findings
    assert (f.rank, f.kind, f.evidence["ranks"], f.evidence["peak_bytes"]) == (1, "headroom", [0, 1], 2.1e9)
    # the same ranks on two hosts: each host has room
    flat_host(tmp_path / "c", 0, rss=1.0e9, host_mem_total_bytes=2.2e9)
    write_log(tmp_path / "c", 1, [rec(s, rss=1.1e9, host="other", host_mem_total_bytes=2.2e9) for s in STEADY])
    assert memory_from_dirs([tmp_path / "c"]).findings == []


def test_flat_ranks_have_no_finding(tmp_path: Path) -> None:
    for r in range(3):
        write_log(
            tmp_path,
            r,
            [
                rec(
                    s,
                    rss=400e6,
                    alloc=5 * GiB,
                    reserved=6 * GiB,
                    gpu_mem_total_bytes=80 * GiB,
                    host_mem_total_bytes=64e9,
                )
                for s in range(WARMUP + 20)
            ],
        )
    mem = memory_from_dirs([tmp_path])
    assert mem.findings == [] and mem.warnings == []
    assert mem.ranks[2] == {
        "memory_steps": 20,
        "peak_rss_bytes": 400e6,
        "rss_growth_bytes_per_step": 0.0,
        "peak_gpu_allocated_bytes": 5 * GiB,
        "peak_gpu_reserved_bytes": 6 * GiB,
        "gpu_growth_bytes_per_step": 0.0,
    }
    assert len(mem.steps) == 60 and mem.steps[0] == MemoryStep(rank=0, step=5, rss_mb=400.0, gpu_allocated_mb=5368.709)


# --- damaged, partial, missing step logs --------------------------------------------------------


def test_damaged_and_partial_lines_are_skipped_with_a_warning(tmp_path: Path) -> None:
    good = [rec(s, rss=500e6 + 3 * MiB * s) for s in STEADY]
    lines = [json.dumps(r) for r in good]
    lines[3] = "{not json"
    lines[6] = "[1, 2]"
    lines[9] = json.dumps({"rss_bytes": 5})  # no step
    lines[12] = json.dumps({**good[12], "step": True})  # a bool is not a step
    lines[15] = json.dumps({**good[15], "rss_bytes": "a lot"})  # step kept, the value ignored
    path = steps_path(tmp_path, 1)
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n" + '{"step": 25, "rss_by')  # a killed rank's half line
    (tmp_path / "steps" / "rank2.jsonl").mkdir()  # not a file: ignored
    (tmp_path / "steps" / "notes.txt").write_text("x")
    logs = read_step_logs([tmp_path, tmp_path / "missing"])
    assert sorted(logs.ranks) == [1] and len(logs.ranks[1].steps) == 16
    [w] = logs.warnings
    assert "5 damaged line(s) skipped (line 4, 7, 10, 13, 21)" in w and "cut short" in w
    mem = analyze_memory(logs)
    # 15 good points of the exact line remain: the slope is still exact
    assert kinds(mem.findings) == [(1, "growth")]
    assert (
        mem.findings[0].evidence["bytes_per_step"] == pytest.approx(3 * MiB) and mem.findings[0].evidence["steps"] == 15
    )
    assert mem.warnings == logs.warnings


def test_no_step_logs_and_warmup_only(tmp_path: Path) -> None:
    assert memory_from_dirs([tmp_path]).ranks == {}
    write_log(tmp_path, 0, [rec(s, rss=1e9) for s in range(WARMUP)])  # warm-up only
    mem = memory_from_dirs([tmp_path])
    assert mem.findings == [] and mem.ranks[0]["peak_rss_bytes"] is None
    assert mem.warnings == ["memory: rank 0 logged no steady step: no memory findings for it"]


def test_heatmap_rows_are_thinned_beyond_the_limit(tmp_path: Path) -> None:
    write_log(tmp_path, 0, [rec(s, rss=1e6) for s in range(WARMUP, WARMUP + 2500)])
    steps = [r.step for r in memory_from_dirs([tmp_path]).steps]
    assert len(steps) == 834 and steps[:3] == [5, 8, 11]  # every 3rd of 2500 steps


# --- the report, the view, the console and the CLI ----------------------------------------------


def test_report_markdown_view_and_console(tmp_path: Path) -> None:
    run = tmp_path / "run"
    a = run_analysis(run, ring_docs(lambda r, s: 300.0, 2, 3))  # steps 1..3 traced
    flat_host(run, 0)
    write_log(run, 1, [rec(s, rss=500e6 + 3 * MiB * s if s >= 2 else 500e6) for s in range(WARMUP + 20)])
    report = build_report(a, ["x"], memory_from_dirs([run]), [MemoryTimeline(rank=1, window=1, path="/r/t.json.gz")])
    doc = as_document(report)
    assert kinds(doc["memory_findings"]) == [(1, "growth")]
    by = {r["rank"]: r for r in doc["ranks"]}
    assert by[1]["rss_growth_bytes_per_step"] == pytest.approx(3 * MiB) and by[0]["peak_gpu_allocated_bytes"] is None
    # traced steps 1..3 are warm-up in the step log: no memory there
    assert {(r["rank"], r["step"], r["rss_mb"]) for r in doc["steps"]} == {
        (r, s, None) for r in (0, 1) for s in (1, 2, 3)
    }
    # (each rank's GPU computes 300 us of a 1 ms step and idles 600: host-bound, not healthy)
    assert [n["about"] for n in doc["next_steps"]] == ["memory", "host-bound"]
    assert doc["next_steps"][0]["ranks"] == [1] and doc["next_steps"][0]["text"].startswith("Rank 1 memory growth")
    md = render_markdown(report)
    assert "## Memory" in md and "| 1 | growth | host RSS rises 3.15 MB per step" in md
    assert "- rank 1 window 1: `/r/t.json.gz`" in md
    assert said(console_table(report), "memory")[0].startswith("rank 1 growth: host RSS rises 3.15 MB per step")
    page = render_page(report, None, title="t", assets="linked")
    assert 'id="memory-findings"' in page and 'id="heatmap-memory"' in page and 'id="memory-timelines"' in page
    assert len(doc["memory_steps"]) == 40
    json.dumps(doc, allow_nan=False)
    # without step logs: the schema is the same, and says there is nothing
    bare = build_report(a, ["x"])
    assert bare.memory_findings == [] and bare.memory_steps == [] and bare.ranks[0].peak_rss_bytes is None
    assert "No step logs" in render_markdown(bare)


def test_collector_without_traces_still_prints_memory_findings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # a --no-profile run: step logs, no trace
    flat_host(tmp_path, 0)
    write_log(tmp_path, 1, [rec(s, rss=500e6 + 3 * MiB * s) for s in range(WARMUP + 20)])
    with pytest.raises(SystemExit) as exc:
        collect_cli.main([str(tmp_path), "-q"])
    assert exc.value.code == 2
    out = capsys.readouterr()
    assert "error:" in out.err
    assert (
        "memory: rank 1 growth: host RSS rises 3.15 MB per step" in out.out and "next: Rank 1 memory growth" in out.out
    )


# --- injection config ---------------------------------------------------------------------------


def test_leak_config_is_validated() -> None:
    cfg = build_config([{"leak": {"rank": 1, "mb": 2}}])
    assert (cfg.leak.rank, cfg.leak.mb) == (1, 2.0)
    with pytest.raises(ConfigError, match="leak.rank.*needs --leak-rank"):
        build_config([{"leak": {"mb": 2.0}}])
    with pytest.raises(ConfigError, match="leak.mb"):
        build_config([{"leak": {"rank": 0, "mb": -1.0}}])
    env = LaunchEnv(rank=0, local_rank=0, world_size=2, distributed=True, cuda=False, accelerate_fsdp=False)
    with pytest.raises(ConfigError, match="leak.rank.*world size"):
        resolve_environment(build_config([{"leak": {"rank": 2, "mb": 1.0}}]), env)


def test_leak_injector_keeps_what_it_allocates() -> None:
    import torch

    from harness.train.config import LeakConfig
    from harness.train.memory_leak import LeakInjector

    leak = LeakInjector(LeakConfig(rank=1, mb=2.0), 1, torch.device("cpu"))
    for _ in range(3):
        leak.keep()
    assert [t.numel() * t.element_size() for t in leak.kept] == [2_000_000] * 3 and float(leak.kept[0].sum()) == 500_000
    other = LeakInjector(LeakConfig(rank=1, mb=2.0), 0, torch.device("cpu"))
    other.keep()
    assert other.kept == []


# --- real runs ----------------------------------------------------------------------------------

# 150 steps, 5 of warm-up: RSS and the heap are read within their time budget (heap.py), every
# 5th to 10th of these ~8 ms steps, and a finding needs 10 readings. The profiler window (steps 2-3,
# with --profile-memory) ends inside the warm-up, so its buffers do not move the steady steps' RSS.
REAL = [
    "--mode",
    "baseline",
    "--hidden",
    "64",
    "--steps",
    "150",
    "--warmup-steps",
    "5",
    "--batch-size",
    "16",
    "--wait",
    "1",
    "--warmup",
    "1",
    "--active",
    "2",
]


def test_real_leak_is_found_on_its_rank_only(log_dir: Path) -> None:
    run = run_harness([*REAL, "--leak-rank", "1", "--leak-mb", "2", "--profile-memory"], log_dir, run_name="leak")
    doc = collect_report(run.dir)
    growth = [f for f in doc["memory_findings"] if f["kind"] == "growth"]
    assert [(f["rank"], f["evidence"]["memory"]) for f in growth] == [(1, "host")], doc["memory_findings"]
    ev = growth[0]["evidence"]
    slope = ev["bytes_per_step"]
    print(f"measured {slope:.0f} bytes/step against 2000000 injected, {ev['series']} over {ev['steps']} steps")
    assert slope == pytest.approx(2e6, rel=0.3)
    # RSS less malloc's free bytes (RSS alone without glibc) over the steady steps that read them:
    # every k-th of these short steps (heap.py's time budget)
    assert ev["series"] in ("rss", "heap_in_use", "rss_less_heap_free") and 10 <= ev["steps"] <= 145
    assert ev["steps_to_limit"] > 0
    if HeapStats().available:
        # the leaking rank's live heap grows by what it keeps, a 2 MB tensor a step; its peer's not
        for rank, rate in ((1, 2e6), (0, 0.0)):
            live = [(r["step"], r["heap_in_use_bytes"]) for r in run.steps(rank) if "heap_in_use_bytes" in r]
            fit = trend(live[len(live) // 4 :], 0.99)
            assert fit is not None and fit.slope == pytest.approx(rate, abs=0.05e6), (rank, live)
    assert any(n["about"] == "memory" and n["ranks"] == [1] for n in doc["next_steps"])
    # --profile-memory: one memory timeline per rank and window, linked from the report
    timelines = sorted((run.dir).glob("*.memory_timeline.json.gz"))
    assert [int(MEMORY_TIMELINE_PATTERN.match(p.name)["rank"]) for p in timelines] == [0, 1]
    assert [(t["rank"], t["window"]) for t in doc["memory_timelines"]] == [(0, 1), (1, 1)]
    assert not list(run.dir.glob(f"*{PARTIAL_SUFFIX}*"))
    assert all(r["host_mem_total_bytes"] > 0 for r in run.steps(1))


def test_real_clean_run_has_no_finding(log_dir: Path) -> None:
    run = run_harness(REAL, log_dir, run_name="clean")
    doc = collect_report(run.dir)
    assert doc["memory_findings"] == [], doc["memory_findings"]
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and all(r["peak_rss_bytes"] > 0 for r in doc["ranks"])
    assert len(doc["memory_steps"]) == 2 * 145


def test_profiler_buffers_are_not_a_host_leak(tmp_path: Path) -> None:
    # RSS rises 3 MiB a step while torch.profiler warms up and records (steps 14-21) and stays
    # up after it (its buffers stay mapped): the profiler's memory, not a leak (the demo's shape:
    # a window late in a short run). The same rise with no window is a leak.
    def rss(s: int) -> float:
        return 400e6 + 3 * MiB * (min(max(s, 14), 22) - 14)

    def state(s: int) -> str:
        return "warmup" if s in (14, 15) else "record" if 16 <= s <= 21 else "wait"

    write_log(tmp_path, 0, [rec(s, rss=rss(s), profiler=state(s)) for s in range(WARMUP + 20)])
    write_log(tmp_path, 1, [rec(s, rss=rss(s), profiler="off") for s in range(WARMUP + 20)])
    result = analyze_memory(read_step_logs([tmp_path]))
    assert kinds(result.findings) == [(1, "growth")]
    # a long stretch after the window is judged on its own: a leak there is found
    write_log(
        tmp_path,
        0,
        [
            rec(s, rss=400e6 + (3 * MiB * s if s > 8 else 0), profiler="record" if s in (6, 7, 8) else "wait")
            for s in range(WARMUP + 30)
        ],
    )
    assert (0, "growth") in kinds(analyze_memory(read_step_logs([tmp_path])).findings)
