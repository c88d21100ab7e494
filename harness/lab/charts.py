"""A sweep's charts, each saved as PNG and SVG (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: works on a headless node and never opens a window

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from harness.lab.results import OK, RowResult  # noqa: E402
from harness.lab.sweeps import Sweep  # noqa: E402

FORMATS = ("png", "svg")


def _save(fig: plt.Figure, out_dir: Path, name: str) -> list[str]:
    fig.tight_layout()
    names = []
    for fmt in FORMATS:
        path = out_dir / f"{name}.{fmt}"
        tmp = path.with_name(f".{path.name}.partial")
        fig.savefig(tmp, format=fmt, dpi=120)
        tmp.replace(path)
        names.append(path.name)
    plt.close(fig)
    return names


def _labels(done: list[RowResult]) -> list[str]:
    return [r.row.label.replace(": ", ":\n").replace(", ", ",\n") for r in done]


def throughput(sweep: Sweep, done: list[RowResult]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(done)), 4))
    values = [r.figures.get("throughput_samples_s") or 0.0 for r in done]
    bars = ax.bar(range(len(done)), values, color="#4c78a8")
    for bar, r in zip(bars, done):
        if r.speedup is not None:
            ax.annotate(
                f"{r.speedup:.2f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
    ax.set_xticks(range(len(done)), _labels(done), fontsize=8)
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_title(f"{sweep.name}: throughput")
    return fig


def step_ms(sweep: Sweep, done: list[RowResult]) -> plt.Figure:
    """Mean next to p50 (with p99 as a whisker): a mean well above the median is stalls."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(done)), 4))
    xs = range(len(done))
    mean = [r.figures.get("mean_step_ms") or 0.0 for r in done]
    p50 = [r.figures.get("p50_step_ms") or 0.0 for r in done]
    p99 = [r.figures.get("p99_step_ms") or 0.0 for r in done]
    w = 0.38
    ax.bar([x - w / 2 for x in xs], mean, w, label="mean", color="#4c78a8")
    ax.bar([x + w / 2 for x in xs], p50, w, label="p50", color="#72b7b2")
    ax.errorbar(
        [x + w / 2 for x in xs],
        p50,
        yerr=[[0.0] * len(done), [max(a - b, 0.0) for a, b in zip(p99, p50)]],
        fmt="none",
        ecolor="#333",
        capsize=3,
        label="p99",
    )
    ax.set_xticks(list(xs), _labels(done), fontsize=8)
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{sweep.name}: step time, mean vs p50 (whisker to p99)")
    ax.legend(fontsize=8)
    return fig


def jitter(sweep: Sweep, done: list[RowResult]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in done:
        ax.plot(range(1, len(r.step_ms) + 1), r.step_ms, marker=".", label=r.row.label)
    ax.set_xlabel("steady-state step")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"{sweep.name}: per-step jitter")
    ax.legend(fontsize=8)
    return fig


def memory(sweep: Sweep, done: list[RowResult]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(done)), 4))
    kind = next((r.figures.get("peak_mem_kind") for r in done if r.figures.get("peak_mem_kind")), None)
    ax.bar(range(len(done)), [(r.figures.get("peak_mem_bytes") or 0) / 2**20 for r in done], color="#f58518")
    ax.set_xticks(range(len(done)), _labels(done), fontsize=8)
    ax.set_ylabel("peak GPU allocated (MiB)" if kind == "gpu_allocated" else "peak host RSS (MiB)")
    ax.set_title(f"{sweep.name}: peak memory (largest rank)")
    return fig


def scaling(sweep: Sweep, done: list[RowResult]) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6, 4))
    groups = sorted({r.row.group for r in done if r.efficiency is not None})
    top = 1
    for g in groups:
        rows = sorted(
            (r for r in done if r.row.group == g and r.efficiency is not None), key=lambda r: r.figures["world_size"]
        )
        sizes = [r.figures["world_size"] for r in rows]
        top = max(top, *sizes)
        ax.plot(sizes, [r.efficiency or 0.0 for r in rows], marker="o", label=g.upper())  # None filtered above
    ax.axhline(1.0, color="#999", linestyle="--", linewidth=1, label="ideal")
    ax.set_xticks(range(1, top + 1))
    ax.set_xlabel("ranks")
    ax.set_ylabel("scaling efficiency")
    ax.set_ylim(0, 1.2)
    ax.set_title(f"{sweep.name}: efficiency vs 1 rank")
    ax.legend(fontsize=8)
    return fig


CHARTS = {"throughput": throughput, "step_ms": step_ms, "jitter": jitter, "memory": memory, "scaling": scaling}


def draw(sweep: Sweep, results: list[RowResult], out_dir: Path) -> list[str]:
    """Every chart the sweep names, over its measured rows; returns the file names written."""
    done = [r for r in results if r.status == OK]
    if not done:
        return []
    names: list[str] = []
    for chart in sweep.charts:
        names += _save(CHARTS[chart](sweep, done), out_dir, chart)
    return names
