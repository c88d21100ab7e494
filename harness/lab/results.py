"""What a sweep measured: per-row figures read back from each run's files, the ratios between
rows, `timings.csv` and `summary.md`. Pure functions of the run folders (torch-free)."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import text_table
from harness.lab.sweeps import Row, Sweep
from harness.paths import run_file, steps_path
from harness.run.stats import percentile

OK, FAILED, SKIPPED = "ok", "failed", "skipped"
CSV_COLUMNS = [
    "sweep",
    "key",
    "label",
    "status",
    "note",
    "world_size",
    "parallel",
    "device",
    "steps",
    "mean_step_ms",
    "p50_step_ms",
    "p99_step_ms",
    "std_step_ms",
    "throughput_samples_s",
    "peak_mem_bytes",
    "peak_mem_kind",
    "speedup",
    "vs_previous",
    "efficiency",
    "run_dir",
    "args",
]


@dataclass
class RowResult:
    row: Row
    status: str
    note: str = ""  # why it was skipped, or the line that says why it failed
    run_dir: Path | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    step_ms: list[float] = field(default_factory=list)  # the job's steady-state step times, in order
    speedup: float | None = None  # throughput / the first measured row's
    vs_previous: float | None = None  # throughput / the previous measured row's
    efficiency: float | None = None  # scaling: throughput / (ranks x the 1-rank row's of its group)
    args: tuple[str, ...] = ()  # the harness.train flags it ran with (the user's extra ones included)


def job_step_times(run_dir: Path, world_size: int) -> list[float]:
    """The job's step times: for each steady-state step (warm-up left out) the longest of the
    ranks' step times, since a synchronous job moves at its slowest rank's pace. Steps some rank
    did not log are left out."""
    per_rank: list[dict[int, float]] = []
    for rank in range(world_size):
        times: dict[int, float] = {}
        path = steps_path(run_dir, rank)
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    if not rec.get("warmup"):
                        times[rec["step"]] = rec["step_ms"]
        per_rank.append(times)
    common = set.intersection(*(set(t) for t in per_rank)) if per_rank else set()
    return [max(t[s] for t in per_rank) for s in sorted(common)]


def measure(run_dir: Path) -> tuple[dict[str, Any], list[float]]:
    """One finished run's figures from `run.json` and the per-rank step logs:

    1. step times = `job_step_times`; mean, p50, p99 (linear interpolation) and the population
       standard deviation over them;
    2. throughput = the sum over ranks of each rank's samples / its summed steady step time
       (global samples per second);
    3. peak memory = the largest rank's peak GPU allocation when on CUDA, else its peak RSS;
    4. world size, parallel wrapper and device as the run recorded them."""
    doc = json.loads(run_file(run_dir).read_text())
    ranks = doc["ranks"]
    times = job_step_times(run_dir, doc["world_size"])
    gpu = [r.get("peak_gpu_allocated_bytes") for r in ranks if r.get("peak_gpu_allocated_bytes") is not None]
    rss = [r.get("peak_rss_bytes") for r in ranks if r.get("peak_rss_bytes") is not None]
    thr = [r["throughput_samples_s"] for r in ranks if r.get("throughput_samples_s") is not None]
    figures = {
        "world_size": doc["world_size"],
        "parallel": doc["parallel"],
        "device": doc["device"],
        "steps": len(times),
        "mean_step_ms": statistics.fmean(times) if times else None,
        "p50_step_ms": percentile(times, 50),
        "p99_step_ms": percentile(times, 99),
        "std_step_ms": statistics.pstdev(times) if times else None,
        "throughput_samples_s": sum(thr) if len(thr) == len(ranks) and thr else None,
        "peak_mem_bytes": max(gpu) if gpu else (max(rss) if rss else None),
        "peak_mem_kind": "gpu_allocated" if gpu else ("host_rss" if rss else None),
    }
    return figures, times


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def derive(results: list[RowResult]) -> None:
    """Fill the ratios: speed-up over the first measured row and over the previous measured row
    (by throughput); scaling efficiency within each group that has a 1-rank row."""
    done = [r for r in results if r.status == OK]
    for i, r in enumerate(done):
        thr = r.figures.get("throughput_samples_s")
        r.speedup = _ratio(thr, done[0].figures.get("throughput_samples_s"))
        r.vs_previous = _ratio(thr, done[i - 1].figures.get("throughput_samples_s")) if i else None
    for r in done:
        one = next(
            (o for o in done if o.row.group and o.row.group == r.row.group and o.figures["world_size"] == 1), None
        )
        if one is not None:
            r.efficiency = _ratio(
                r.figures.get("throughput_samples_s"),
                r.figures["world_size"] * (one.figures.get("throughput_samples_s") or 0),
            )


def _round(value: Any, digits: int) -> Any:
    return round(value, digits) if isinstance(value, float) else value


def csv_text(sweep: Sweep, results: list[RowResult]) -> str:
    """timings.csv: one row per configuration (skipped and failed ones too, with the reason)."""
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in results:
        w.writerow(
            {
                "sweep": sweep.name,
                "key": r.row.key,
                "label": r.row.label,
                "status": r.status,
                "note": r.note,
                "world_size": r.figures.get("world_size", r.row.nproc),
                **{
                    k: _round(r.figures.get(k), 3)
                    for k in (
                        "parallel",
                        "device",
                        "steps",
                        "mean_step_ms",
                        "p50_step_ms",
                        "p99_step_ms",
                        "std_step_ms",
                        "throughput_samples_s",
                        "peak_mem_bytes",
                        "peak_mem_kind",
                    )
                },
                "speedup": _round(r.speedup, 4),
                "vs_previous": _round(r.vs_previous, 4),
                "efficiency": _round(r.efficiency, 4),
                "run_dir": str(r.run_dir) if r.run_dir else "",
                "args": " ".join(r.args or r.row.args),
            }
        )
    return out.getvalue()


def _table_rows(results: list[RowResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        f = r.figures
        mem = f.get("peak_mem_bytes")
        rows.append(
            {
                "label": r.row.label,
                "status": r.status,
                "ranks": f.get("world_size", r.row.nproc),
                "device": f.get("device"),
                "mean": f.get("mean_step_ms"),
                "p50": f.get("p50_step_ms"),
                "p99": f.get("p99_step_ms"),
                "thr": f.get("throughput_samples_s"),
                "mem": mem / 2**20 if mem is not None else None,
                "speedup": r.speedup,
                "vs_previous": r.vs_previous,
                "efficiency": r.efficiency,
            }
        )
    return rows


def _cols(sweep: Sweep, results: list[RowResult]) -> list[text_table.Column]:
    kind = next((r.figures.get("peak_mem_kind") for r in results if r.figures.get("peak_mem_kind")), None)
    mem_title = "peak GPU MiB" if kind == "gpu_allocated" else "peak RSS MiB"
    cols: list[text_table.Column] = [
        ("label", "configuration", "{}"),
        ("status", "status", "{}"),
        ("ranks", "ranks", "{}"),
        ("device", "device", "{}"),
        ("mean", "mean ms", "{:.2f}"),
        ("p50", "p50 ms", "{:.2f}"),
        ("p99", "p99 ms", "{:.2f}"),
        ("thr", "samples/s", "{:.1f}"),
        ("mem", mem_title, "{:.0f}"),
        ("speedup", "speed-up", "{:.2f}x"),
    ]
    if sweep.name == "ladder":
        cols.append(("vs_previous", "vs previous rung", "{:.2f}x"))
    if sweep.name == "scaling":
        cols.append(("efficiency", "efficiency", "{:.0%}"))
    return cols


def _by_key(results: list[RowResult]) -> dict[str, RowResult]:
    return {r.row.key: r for r in results if r.status == OK}


def _thr(r: RowResult) -> float | None:
    return r.figures.get("throughput_samples_s")


def within_noise(a: RowResult, b: RowResult) -> bool:
    """Whether a's throughput ratio to b is within two standard errors of 1:

    1. per row, the relative standard error of its mean step = std / mean / sqrt(steps);
    2. the ratio's relative error = the root of the sum of both squares;
    3. within noise when |thr_a / thr_b - 1| < 2 x that (about 95% on normal step times)."""
    fa, fb = a.figures, b.figures
    try:
        rel = sum((f["std_step_ms"] / f["mean_step_ms"]) ** 2 / f["steps"] for f in (fa, fb)) ** 0.5
        return abs(fa["throughput_samples_s"] / fb["throughput_samples_s"] - 1) < 2 * rel
    except (TypeError, ZeroDivisionError, KeyError):
        return False


def _noise_note(a: RowResult, b: RowResult) -> str:
    return " (within step-time noise)" if within_noise(a, b) else ""


def ratio_lines(sweep: Sweep, results: list[RowResult]) -> list[str]:  # noqa: C901
    """The sweep's own comparisons, in words, from the measured rows only."""
    done = _by_key(results)
    lines: list[str] = []
    if sweep.name == "data":
        for r in done.values():
            f = r.figures
            if f["mean_step_ms"] is None:
                continue
            lines.append(
                f"{r.row.label}: mean / p50 = {_ratio(f['mean_step_ms'], f['p50_step_ms']) or 0:.2f}, "
                f"p99 / p50 = {_ratio(f['p99_step_ms'], f['p50_step_ms']) or 0:.2f}, "
                f"step-time std {f['std_step_ms']:.2f} ms"
            )
    elif sweep.name == "torch" and {"batch-256", "batch-1024"} <= done.keys():
        small, big = done["batch-256"], done["batch-1024"]
        step = _ratio(big.figures["mean_step_ms"], small.figures["mean_step_ms"]) or 0
        thr = _ratio(_thr(big), _thr(small)) or 0
        lines.append(f"batch 1024 vs 256: step time x{step:.2f}, throughput x{thr:.2f}")
        if step > 1 and thr > 1:
            lines.append(
                "Step time and throughput point in opposite directions: each step is slower, each sample "
                "cheaper. Compare configurations by samples/s."
            )
    elif sweep.name in ("kernel", "three-run") and {"fp32", "bf16"} <= done.keys():
        gain = _ratio(_thr(done["bf16"]), _thr(done["fp32"])) or 0
        mem = _ratio(done["bf16"].figures["peak_mem_bytes"], done["fp32"].figures["peak_mem_bytes"])
        lines.append(
            f"fp32 -> bf16: throughput x{gain:.2f}{_noise_note(done['bf16'], done['fp32'])}"
            + (f", peak memory x{mem:.2f}" if mem else "")
        )
        lines.append(
            "Reading: "
            + (
                "a small gain, so the bottleneck is not precision."
                if gain < 1.10
                else "precision matters here: bytes moved or math throughput bound the step."
            )
        )
        if "bf16-compile" in done:
            comp = _ratio(_thr(done["bf16-compile"]), _thr(done["bf16"])) or 0
            lines.append(
                f"bf16 -> bf16 + torch.compile: throughput x{comp:.2f}"
                + _noise_note(done["bf16-compile"], done["bf16"])
                + (
                    " (fusion pays: kernel count and memory traffic were the cost)"
                    if comp >= 1.10
                    else " (compile does not pay here)"
                    if comp >= 0.95
                    else " (a regression: compiled code is slower here)"
                )
            )
    elif sweep.name == "ladder":
        ran = list(done.values())
        worse = []
        for prev, r in zip(ran, ran[1:]):
            noise = within_noise(r, prev)
            lines.append(
                f"{r.row.label}: x{r.vs_previous:.2f} over the previous rung, x{r.speedup:.2f} over baseline"
                + (" (within step-time noise)" if noise else "")
            )
            if (r.vs_previous or 0) < 1 and not noise:
                worse.append(r.row.label)
        if worse:
            lines.append("Regressions on this machine (slower than the rung before, beyond noise): " + "; ".join(worse))
    elif sweep.name == "scaling":
        for r in done.values():
            if r.efficiency is not None and r.figures["world_size"] > 1:
                lines.append(f"{r.row.label}: scaling efficiency {r.efficiency:.0%}")
        for r in (r for r in done.values() if r.row.group == "bucket"):
            default = done.get(f"ddp-ws{r.figures['world_size']}")
            if default is not None:
                lines.append(
                    f"{r.row.label}: throughput x{_ratio(_thr(r), _thr(default)) or 0:.2f} of the default "
                    f"25 MB bucket at the same world size"
                )
    return lines


def summary_markdown(sweep: Sweep, results: list[RowResult], context: dict[str, str], charts: list[str]) -> str:
    """summary.md: what ran where, the table, the ratios, the reading rule, what was skipped or
    failed and why, and the charts."""
    lines = [f"# Lab sweep `{sweep.name}`: {sweep.title}", ""]
    lines += [f"- {k}: {v}" for k, v in context.items()]
    lines += ["", *text_table.markdown(_table_rows(results), _cols(sweep, results)), ""]
    lines += [
        "Step times are the job's (per step, the slowest rank's), warm-up left out; samples/s is over "
        "all ranks; speed-up is throughput over the first measured row.",
        "",
    ]
    ratios = ratio_lines(sweep, results)
    if ratios:
        lines += ["## Ratios", "", *[f"- {x}" for x in ratios], ""]
    lines += ["## How to read it", "", sweep.reading, ""]
    skipped = [r for r in results if r.status == SKIPPED]
    failed = [r for r in results if r.status == FAILED]
    if skipped or failed:
        lines += ["## Not measured", ""]
        lines += [f"- {r.row.label}: skipped, {r.note}" for r in skipped]
        lines += [
            f"- {r.row.label}: failed, {r.note}" + (f" (log: {r.run_dir}.log)" if r.run_dir else "") for r in failed
        ]
        lines.append("")
    pngs = [c for c in charts if c.endswith(".png")]
    if pngs:
        lines += ["## Charts", ""]
        for png in pngs:
            svg = Path(png).with_suffix(".svg").name
            lines += [f"![{Path(png).stem}]({png})" + (f" ([SVG]({svg}))" if svg in charts else ""), ""]
    return "\n".join(lines)
