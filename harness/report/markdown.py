"""report.md: the report document as Markdown, verdict first."""

from __future__ import annotations

from harness import text_table
from harness.report.hang_report import hang_lines
from harness.report.records import Report
from harness.report.tables import (
    CLOCK_COLUMNS,
    COLLECTIVE_STAT_COLUMNS,
    DIAGNOSIS_COLUMNS,
    GAP_COLUMNS,
    HOST_COLUMNS,
    PG_COLUMNS,
    RANK_COLUMNS,
    STRAGGLER_COLUMNS,
    clock_rows,
    gap_rows,
    host_rows,
    memory_lines,
    no_straggler_text,
    pg_rows,
    rows,
    scope_line,
    straggler_rows,
    watch_straggler_text,
)
from harness.traces.read.watch_log import watch_line
from harness.traces.read.windows import window_line


def render_markdown(report: Report) -> str:
    run = report.run
    lines = ["# Straggler and overlap report", "", f"**Verdict: {report.headline}**", ""]
    lines.append(scope_line(report))
    if report.window:
        lines.append(f"\nProfiler {window_line(report.window)}.")
    if report.watch:
        lines.append(f"\nLive straggler watch during the run: {watch_line(report.watch)}.")
    if run.ranks_missing:
        lines.append(
            f"\n**Incomplete run:** rank(s) {', '.join(map(str, run.ranks_missing))} of "
            f"{run.world_size} have no trace; the analysis covers the ranks present."
        )
    for note in run.ending:
        lines.append(f"\n**Run ended badly:** {note}.")
    lines += hang_lines(report)
    lines += ["", "## What to do next", ""] + [f"- {n.text}" for n in report.next_steps]
    lines += ["", "## Stragglers", ""]
    if report.stragglers:
        lines += text_table.markdown(straggler_rows(report), STRAGGLER_COLUMNS)
        if run.replayed_step_ms is not None:
            lines.append(
                f"\n'Step ms if fixed' replays each step's collectives with that rank as fast as its peers; "
                f"the same replay with nothing changed gives {run.replayed_step_ms:.2f} ms against a "
                f"measured {run.measured_step_ms or run.median_step_ms:.2f} ms (from the last rank's "
                "step start to the last rank's step end, on the timeline the collectives are on)."
            )
    else:
        lines.append(no_straggler_text(report))
    watched = watch_straggler_text(report)
    if watched:
        lines.append(f"\n{watched}")
    lines += ["", f"## Diagnosis: {report.diagnosis_summary}", ""]
    lines += text_table.markdown(rows(report.diagnosis), DIAGNOSIS_COLUMNS)
    lines += ["", "## Memory", ""] + memory_lines(report)
    lines += ["", "## Per rank", ""]
    lines += text_table.markdown(rows(report.ranks), RANK_COLUMNS)
    if len(report.hosts) > 1:
        lines += ["", "## Per host", ""]
        lines += text_table.markdown(host_rows(report), HOST_COLUMNS)
    if report.process_groups:
        lines += ["", "## Per process group", ""]
        lines += text_table.markdown(pg_rows(report), PG_COLUMNS)
    if report.collective_stats:
        lines += [
            "",
            "## Collectives",
            "",
            "Bus bandwidth by NCCL-tests' conventions (all-reduce x 2(n-1)/n, all-gather "
            "and reduce-scatter x (n-1)/n), to hold against the link's speed; "
            "'-' where the trace gives no sizes.",
            "",
        ]
        lines += text_table.markdown(rows(report.collective_stats), COLLECTIVE_STAT_COLUMNS)
    lines += ["", "## Biggest gaps", ""]
    if report.gaps:
        lines += text_table.markdown(gap_rows(report, 10), GAP_COLUMNS)
        lines.append(f"\n{report.gaps_total} gap(s) in all; `report.json` lists the {len(report.gaps)} longest.")
    else:
        lines.append("No gap of exposed communication or idle device time.")
    lines += ["", "## Clock offsets", ""]
    if report.clock.aligned:
        lines.append(
            f"One offset per host, estimated from the end times of matched collectives, relative to host "
            f"{report.clock.reference_host} (subtracted from each rank's timestamps)."
        )
        lines += [""] + text_table.markdown(clock_rows(report), CLOCK_COLUMNS)
    else:
        lines.append("Clocks not aligned (--no-align, or no collective matched across ranks).")
    if report.warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in report.warnings]
    return "\n".join(lines) + "\n"
