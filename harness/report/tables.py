"""The report's tables: columns as (key, title, format) and the rows made from report.json,
shared by report.md (markdown.py), the HTML view (page.py) and the console."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from harness import text_table
from harness.report.document import bytes_to_mb
from harness.report.floor import floor_line
from harness.report.records import Report, WatchStragglerRecord

# Table columns as (key, title, format), shared by report.md and the HTML view. Every figure's title
# says what it is over: "(mean)" or "/step" per step, "(total)" summed over the window's steps.
Column = tuple[str, str, str]
STRAGGLER_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"),
    ("host", "host", "{}"),
    ("phase", "late in", "{}"),
    ("late_ms", "late ms/step", "{:.2f}"),
    ("beyond_peers_ms", "beyond peers ms/step", "{:.2f}"),
    ("cost_ms", "costs ms/step", "{:.2f}"),
    ("phase_excess_ms", "excess ms/step", "{:.2f}"),
    ("pattern", "pattern", "{}"),
    ("steps_late_text", "late in steps", "{}"),
    ("late_fraction", "late at collectives", "{:.0%}"),
    ("blame_ms", "others waited ms (total)", "{:.2f}"),
    ("mean_step_ms", "step ms (mean)", "{:.2f}"),
    ("whatif_step_ms", "step ms if fixed (mean)", "{:.2f}"),
]
RANK_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"),
    ("host", "host", "{}"),
    ("steps", "steps", "{}"),
    ("mean_step_ms", "step ms (mean)", "{:.2f}"),
    ("compute_ms", "compute ms (total)", "{:.2f}"),
    ("comm_ms", "comm ms (total)", "{:.2f}"),
    ("overlapped_comm_ms", "overlapped ms (total)", "{:.2f}"),
    ("exposed_wait_ms", "exposed waiting ms (total)", "{:.2f}"),
    ("exposed_transfer_ms", "exposed transfer ms (total)", "{:.2f}"),
    ("idle_ms", "idle ms (total)", "{:.2f}"),
    ("wait_ms", "waited ms (total)", "{:.2f}"),
    ("blame_ms", "blamed ms (total)", "{:.2f}"),
    ("late_ms", "late ms/step", "{:.2f}"),
    ("beyond_peers_ms", "beyond peers ms/step", "{:.2f}"),
    ("core_wait_ms", "waited for a core ms/step", "{:.2f}"),
    ("cost_ms", "costs ms/step", "{:.2f}"),
]
GAP_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"),
    ("step", "step", "{}"),
    ("kind", "kind", "{}"),
    ("dur_ms", "ms", "{:.3f}"),
    ("collective", "collective", "{}"),
]
DIAGNOSIS_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"),
    ("host", "host", "{}"),
    ("bottleneck", "bottleneck", "{}"),
    ("reason", "evidence", "{}"),
    ("advice", "next step", "{}"),
]
HOST_COLUMNS: list[Column] = [
    ("host", "host", "{}"),
    ("ranks", "ranks", "{}"),
    ("blame_ms", "others waited ms (total)", "{:.2f}"),
    ("wait_ms", "waited ms (total)", "{:.2f}"),
    ("stragglers", "stragglers", "{}"),
]
CLOCK_COLUMNS: list[Column] = [
    ("host", "host", "{}"),
    ("ranks_text", "ranks", "{}"),
    ("offset_ms", "offset ms", "{:.3f}"),
    ("spread_ms", "spread ms", "{:.3f}"),
    ("samples", "collectives", "{}"),
    ("via", "aligned against", "{}"),
]
PG_COLUMNS: list[Column] = [
    ("pg", "process group", "{}"),
    ("ranks_text", "ranks", "{}"),
    ("collectives", "collectives", "{}"),
    ("comm_ms", "comm ms (total)", "{:.2f}"),
    ("exposed_wait_ms", "exposed waiting ms (total)", "{:.2f}"),
    ("exposed_transfer_ms", "exposed transfer ms (total)", "{:.2f}"),
    ("wait_ms", "waited ms (total)", "{:.2f}"),
    ("transfer_ms", "transfer ms (total)", "{:.2f}"),
]
COLLECTIVE_STAT_COLUMNS: list[Column] = [
    ("name", "collective", "{}"),
    ("pg", "group", "{}"),
    ("ranks", "ranks", "{}"),
    ("bytes", "bytes", "{:,}"),
    ("count", "count", "{}"),
    ("transfer_ms", "transfer ms (total)", "{:.3f}"),
    ("mean_transfer_ms", "transfer ms (mean)", "{:.4f}"),
    ("wait_ms", "waited ms (total)", "{:.3f}"),
    ("algbw_gbps", "algbw GB/s", "{:.2f}"),
    ("busbw_gbps", "busbw GB/s", "{:.2f}"),
]


def cell(row: dict[str, Any], key: str, fmt: str) -> str:
    """One table cell as text: '-' for a missing value."""
    return "-" if row.get(key) is None else fmt.format(row[key])


def rows(records: Sequence[object]) -> list[dict[str, Any]]:
    """Records as the tables' rows: their fields by name."""
    out: list[dict[str, Any]] = msgspec.to_builtins(records)
    return out


def scope_line(report: Report) -> str:
    """What the report covers, in one sentence."""
    run = report.run
    steps = f"{run.steps[0]}..{run.steps[-1]}" if run.steps else "-..-"
    return (
        f"{len(run.ranks_present)} rank(s) on {len(run.hosts)} host(s), device {run.device}, "
        f"steps {steps} "
        f"({', '.join(run.steps_source)}); {report.collectives.matched} collective instance(s) matched."
    )


def host_rows(report: Report) -> list[dict[str, Any]]:
    return [
        {**h, "ranks": ", ".join(map(str, h["ranks"])), "stragglers": ", ".join(map(str, h["stragglers"])) or None}
        for h in rows(report.hosts)
    ]


def straggler_rows(report: Report) -> list[dict[str, Any]]:
    return [{**s, "steps_late_text": f"{s['steps_late']} of {s['steps']}"} for s in rows(report.stragglers)]


def clock_rows(report: Report) -> list[dict[str, Any]]:
    return [{**h, "ranks_text": ", ".join(map(str, h["ranks"]))} for h in rows(report.clock.hosts)]


def pg_rows(report: Report) -> list[dict[str, Any]]:
    return [{**g, "ranks_text": ", ".join(map(str, g["ranks"]))} for g in rows(report.process_groups)]


def gap_rows(report: Report, n: int) -> list[dict[str, Any]]:
    """The n longest gaps, with their duration in ms."""
    return [{**g, "dur_ms": g["dur_us"] / 1e3} for g in rows(report.gaps[:n])]


MEMORY_FINDING_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"),
    ("kind", "finding", "{}"),
    ("reason", "evidence", "{}"),
    ("advice", "next step", "{}"),
]
MEMORY_RANK_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"),
    ("peak_rss_mb", "peak RSS MB", "{:.1f}"),
    ("rss_growth_mb", "RSS MB/step", "{:.3f}"),
    ("peak_gpu_allocated_mb", "peak GPU allocated MB", "{:.1f}"),
    ("peak_gpu_reserved_mb", "peak GPU reserved MB", "{:.1f}"),
    ("gpu_growth_mb", "GPU MB/step", "{:.3f}"),
]


def memory_rank_rows(report: Report) -> list[dict[str, Any]]:
    """ranks[]' memory columns in MB, for the tables."""
    keys = {
        "peak_rss_mb": "peak_rss_bytes",
        "rss_growth_mb": "rss_growth_bytes_per_step",
        "peak_gpu_allocated_mb": "peak_gpu_allocated_bytes",
        "peak_gpu_reserved_mb": "peak_gpu_reserved_bytes",
        "gpu_growth_mb": "gpu_growth_bytes_per_step",
    }
    return [{"rank": r.rank, **{k: bytes_to_mb(getattr(r, b)) for k, b in keys.items()}} for r in report.ranks]


def memory_note(report: Report) -> str:
    """What the memory findings rest on, in one sentence."""
    if not report.memory_steps:
        return "No step logs (steps/rank<R>.jsonl) next to the traces: no memory findings."
    if not report.memory_findings:
        return (
            "No memory finding: no steady growth, no rank far above its peers, no unused allocator cache, "
            "no peak near the limit (step logs, warm-up left out)."
        )
    return "From the step logs (steps/rank<R>.jsonl), warm-up steps left out."


def memory_lines(report: Report) -> list[str]:
    lines = [memory_note(report)]
    if report.memory_findings:
        lines += [""] + text_table.markdown(rows(report.memory_findings), MEMORY_FINDING_COLUMNS)
    if report.memory_steps:
        lines += [""] + text_table.markdown(memory_rank_rows(report), MEMORY_RANK_COLUMNS)
    if report.memory_timelines:
        lines += ["", "Memory timelines (torch's, per profiler window; --profile-memory):", ""]
        lines += [f"- rank {t.rank} window {t.window}: `{t.path}`" for t in report.memory_timelines]
    return lines


def no_straggler_text(report: Report) -> str:
    """Why the window names no straggler (its own verdict: a hang or the watch may lead the report's)."""
    if (report.trace_verdict or report.verdict) == "inconclusive":
        return f"Not analysed: {report.verdict_reason}."
    if report.threshold_ms is None:
        return "Not analysed: no profiler trace, only Flight Recorder dumps."
    floor = report.noise_floor
    if not floor:
        return f"None: no rank arrives later than its peers by more than {report.threshold_ms:.2f} ms per step."
    return f"None: {floor_line(floor)}."


def _rank_words(s: WatchStragglerRecord) -> str:
    """'rank 1 on node1 (forward)' for a watch straggler."""
    host = f" on {s.host}" if s.host else ""
    return f"rank {s.rank}{host}" + (f" ({s.phase})" if s.phase else "")


def watch_straggler_text(report: Report) -> str | None:
    """The ranks the live watch flagged and the window did not name (watch_verdict.py), in one
    sentence; None when there are none."""
    found = report.watch_stragglers
    if not found:
        return None
    named = "; ".join(
        _rank_words(s) + f" at step{'s' if len(s.steps) > 1 else ''} {', '.join(map(str, s.steps))}" for s in found
    )
    return f"Flagged by the live watch over the whole run, not named in the traced window: {named}."
