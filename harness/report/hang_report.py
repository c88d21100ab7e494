"""The Flight Recorder's findings in the report: report.json's `hang`, `mismatches`, `flight`,
the verdict they lead with, and their section in report.md and the HTML view. No torch.

In report.json (records.py `Report`, the parts flight_records.py): `hang`, `other_hangs`,
`mismatches` and `flight`; with a hang or mismatch `verdict` becomes `hang` (or `mismatch`),
`headline` says it, and the trace verdict it overrides is kept in `trace_verdict`.
"""

from __future__ import annotations

import html
from pathlib import Path

from harness.report.records import SCHEMA_VERSION, ClockRecord, CollectivesRecord, NextStepRecord, Report, RunRecord
from harness.traces.analyse import flight
from harness.traces.analyse.flight_records import DumpRank, FlightResult, MissingAt


def attach(report: Report, result: FlightResult | None) -> Report:
    """Add the dumps' findings to a report; a hang or mismatch leads the verdict and the next
    steps. `result` None (no dumps) adds empty sections."""
    if result is None:
        return report
    report.hang, report.other_hangs = result.hang, result.other_hangs
    report.mismatches, report.flight = result.mismatches, result.flight
    line = flight.headline(result)
    if line:
        report.trace_verdict = report.verdict
        report.verdict = "hang" if result.hang else "mismatch"
        report.headline = line
        ranks = result.hang.missing_ranks if result.hang else sorted(int(r) for r in result.mismatches[0].ranks)
        step = NextStepRecord(about=report.verdict, ranks=ranks, text=flight.next_step(result) or "")
        report.next_steps = [step, *report.next_steps]
    return report


def flight_only(inputs: list[str], result: FlightResult, ending: list[str], warnings: list[str]) -> Report:
    """The report of a run with Flight Recorder dumps and no profiler trace: every trace section
    empty, the verdict from the dumps (else inconclusive, saying why)."""
    ranks = [r.rank for r in result.flight.ranks]
    ws = result.flight.world_size
    reason = "no profiler trace, only Flight Recorder dumps, and they show no hang or mismatch"
    report = Report(
        schema_version=SCHEMA_VERSION,
        inputs=inputs,
        input_dirs=sorted({str(Path(r.file).parent.resolve()) for r in result.flight.ranks}),
        verdict="inconclusive",
        verdict_reason=reason,
        headline=f"inconclusive: {reason}",
        run=RunRecord(
            run_id=None,
            world_size=ws,
            ranks_present=ranks,
            ranks_missing=[r for r in range(ws or 0) if r not in ranks],
            complete=False,
            ending=ending,
            skipped_windows=[],
            hosts=[],
            device="-",
            steps_source=["flight recorder"],
            steps=[],
            median_step_ms=None,
            replayed_step_ms=None,
            measured_step_ms=None,
            replay_faithful=False,
            whatif_all_fixed_step_ms=None,
        ),
        stragglers=[],
        diagnosis=[],
        diagnosis_summary="not analysed (no profiler trace)",
        ranks=[],
        hosts=[],
        steps=[],
        gaps=[],
        gaps_total=0,
        process_groups=[],
        collective_stats=[],
        collectives=CollectivesRecord(matched=0, by_name={}),
        clock=ClockRecord(aligned=False, reference_rank=None, reference_host=None, hosts=[]),
        threshold_ms=None,
        bounds_ms={},
        noise_floor=None,
        warnings=warnings,
        next_steps=[],
    )
    return attach(report, result)


def _where(w: MissingAt | DumpRank) -> str:
    if w.step is None:
        return "-"
    return f"step {w.step}" + (f", {w.phase}" if w.phase else "")


def hang_lines(report: Report) -> list[str]:
    """Markdown: the hung collective, the mismatches and each rank's last collectives."""
    if not report.flight:
        return []
    out = ["", "## Collectives in flight (Flight Recorder)", ""]
    h = report.hang
    if h:
        out += [
            f"- hung collective: #{h.seq} `{h.collective}` of process group {h.process_group}, sizes {h.input_sizes}",
            f"- issued in step {h.step if h.step is not None else '?'}"
            f"{' (' + h.step_source + ')' if h.step_source else ''}, phase {h.phase or '?'}",
            f"- entered by rank(s) {', '.join(map(str, h.entered_ranks))}"
            + (f", which waited {h.waited_s:.1f} s" if h.waited_s is not None else ""),
            f"- never entered by rank(s) {', '.join(map(str, h.missing_ranks))}: "
            + "; ".join(
                f"rank {r} last entered #{w.last_seq}, was at {_where(w)}, ended {w.state or '?'}"
                for r, w in h.missing_at.items()
            ),
        ]
    else:
        out.append("No hang: every rank that left a dump entered the same collectives.")
    for m in report.mismatches:
        sides = "; ".join(f"rank {r}: {e.collective} {e.input_sizes} {e.input_dtypes}" for r, e in m.ranks.items())
        out.append(f"- mismatch at #{m.seq} of process group {m.process_group}: {sides}")
    if report.flight.no_dump_ranks:
        out.append(
            f"- no dump from rank(s) {', '.join(map(str, report.flight.no_dump_ranks))} (killed before it "
            "could write one, or never started)"
        )
    out += ["", "| rank | dumped because | at | last entered | last completed |", "|---|---|---|---|---|"]
    for r in report.flight.ranks:
        entered = r.last_entered
        done = ", ".join(f"#{c.seq} {c.collective}" for c in r.last_completed) or "-"
        out.append(
            f"| {r.rank} | {r.reason or '-'} | {_where(r)} | "
            f"{'#' + str(entered.seq) + ' ' + entered.collective if entered else '-'} | {done} |"
        )
    return out


def hang_html(report: Report) -> str:
    """The same as `hang_lines`, as an HTML section (empty without dumps)."""
    lines = hang_lines(report)
    if not lines:
        return ""
    items = [ln[2:] for ln in lines if ln.startswith("- ")]
    plain = [ln for ln in lines[3:] if ln and not ln.startswith(("- ", "|"))]
    rows = "".join(
        f"<tr>{''.join(f'<td>{html.escape(c.strip())}</td>' for c in ln.strip('|').split('|'))}</tr>"
        for ln in lines
        if ln.startswith("| ") and not ln.startswith("| rank")
    )
    head = "".join(f"<th>{t}</th>" for t in ("rank", "dumped because", "at", "last entered", "last completed"))
    return (
        '<section id="sec-hang"><h2>Collectives in flight (Flight Recorder)</h2>'
        + "".join(f"<p>{html.escape(p)}</p>" for p in plain)
        + "<ul>"
        + "".join(f"<li>{html.escape(i)}</li>" for i in items)
        + "</ul>"
        + f'<table id="flight"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>'
    )
