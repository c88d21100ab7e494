"""report.md: the report document as Markdown, verdict first."""

from __future__ import annotations

from typing import Any

from harness import text_table
from harness.collect.read.watch_log import watch_line
from harness.collect.read.windows import window_line
from harness.report.hang_report import hang_lines
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
    scope_line,
    straggler_rows,
    watch_straggler_text,
)


def render_markdown(doc: dict[str, Any]) -> str:
    run = doc["run"]
    lines = ["# Straggler and overlap report", "", f"**Verdict: {doc['headline']}**", ""]
    lines.append(scope_line(doc))
    if doc.get("window"):
        lines.append(f"\nProfiler {window_line(doc['window'])}.")
    if doc.get("watch"):
        lines.append(f"\nLive straggler watch during the run: {watch_line(doc['watch'])}.")
    if run["ranks_missing"]:
        lines.append(
            f"\n**Incomplete run:** rank(s) {', '.join(map(str, run['ranks_missing']))} of "
            f"{run['world_size']} have no trace; the analysis covers the ranks present."
        )
    for note in run.get("ending", []):
        lines.append(f"\n**Run ended badly:** {note}.")
    lines += hang_lines(doc)
    lines += ["", "## What to do next", ""] + [f"- {n['text']}" for n in doc["next_steps"]]
    lines += ["", "## Stragglers", ""]
    if doc["stragglers"]:
        lines += text_table.markdown(straggler_rows(doc), STRAGGLER_COLUMNS)
        if run.get("replayed_step_ms") is not None:
            lines.append(
                f"\n'Step ms if fixed' replays each step's collectives with that rank as fast as its peers; "
                f"the same replay with nothing changed gives {run['replayed_step_ms']:.2f} ms against a "
                f"measured {run.get('measured_step_ms') or run['median_step_ms']:.2f} ms (from the last rank's "
                "step start to the last rank's step end, on the timeline the collectives are on)."
            )
    else:
        lines.append(no_straggler_text(doc))
    watched = watch_straggler_text(doc)
    if watched:
        lines.append(f"\n{watched}")
    lines += ["", f"## Diagnosis: {doc['diagnosis_summary']}", ""]
    lines += text_table.markdown(doc["diagnosis"], DIAGNOSIS_COLUMNS)
    lines += ["", "## Memory", ""] + memory_lines(doc)
    lines += ["", "## Per rank", ""]
    lines += text_table.markdown(doc["ranks"], RANK_COLUMNS)
    if len(doc["hosts"]) > 1:
        lines += ["", "## Per host", ""]
        lines += text_table.markdown(host_rows(doc), HOST_COLUMNS)
    if doc["process_groups"]:
        lines += ["", "## Per process group", ""]
        lines += text_table.markdown(pg_rows(doc), PG_COLUMNS)
    if doc["collective_stats"]:
        lines += [
            "",
            "## Collectives",
            "",
            "Bus bandwidth by NCCL-tests' conventions (all-reduce x 2(n-1)/n, all-gather "
            "and reduce-scatter x (n-1)/n), to hold against the link's speed; "
            "'-' where the trace gives no sizes.",
            "",
        ]
        lines += text_table.markdown(doc["collective_stats"], COLLECTIVE_STAT_COLUMNS)
    lines += ["", "## Biggest gaps", ""]
    if doc["gaps"]:
        lines += text_table.markdown(gap_rows(doc, 10), GAP_COLUMNS)
        lines.append(f"\n{doc['gaps_total']} gap(s) in all; `report.json` lists the {len(doc['gaps'])} longest.")
    else:
        lines.append("No gap of exposed communication or idle device time.")
    lines += ["", "## Clock offsets", ""]
    if doc["clock"]["aligned"]:
        lines.append(
            f"One offset per host, estimated from the end times of matched collectives, relative to host "
            f"{doc['clock']['reference_host']} (subtracted from each rank's timestamps)."
        )
        lines += [""] + text_table.markdown(clock_rows(doc), CLOCK_COLUMNS)
    else:
        lines.append("Clocks not aligned (--no-align, or no collective matched across ranks).")
    if doc["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in doc["warnings"]]
    return "\n".join(lines) + "\n"
