"""The comparison as words: the headline, the console's lines and compare.md."""

from __future__ import annotations

from html import escape
from typing import Any

from harness import text_table as table


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def headline(doc: dict[str, Any]) -> str:
    """One line: the verdict on the step time, with the medians and the interval."""
    s = doc["step"]
    lo, hi = s["ci"]
    medians = f"median step {s['base_median_ms']:.2f} -> {s['new_median_ms']:.2f} ms"
    ci = f"{s['confidence']:.0%} CI {_pct(lo)} to {_pct(hi)}"
    if s["verdict"] == "none":
        return f"no significant difference: {medians} ({_pct(s['relative'])}, {ci}; noise floor {s['noise'] * 100:g}%)"
    return (
        f"NEW is {abs(s['relative']) * 100:.1f}% {s['verdict']}: {medians} ({ci}), beyond the "
        f"{s['noise'] * 100:g}% noise floor"
    )


def gate_line(doc: dict[str, Any]) -> str | None:
    gate = doc.get("gate")
    if not gate:
        return None
    pct, lo = gate["fail_if_slower_pct"], doc["step"]["ci"][0]
    if gate["failed"]:
        confidence = doc["step"]["confidence"]
        return f"gate: FAILED: slower by more than {pct:g}% with {confidence:.0%} confidence (at least {_pct(lo)})"
    return f"gate: passed: not shown slower by more than {pct:g}% (at least {_pct(lo)})"


PHASE_COLUMNS = [
    ("phase", "phase", "{}"),
    ("base_ms", "BASE ms", "{:.2f}"),
    ("new_ms", "NEW ms", "{:.2f}"),
    ("diff_ms", "diff ms", "{:+.2f}"),
    ("rank_most", "rank most changed", "{}"),
    ("rank_most_diff_ms", "its diff ms", "{:+.2f}"),
]
RANK_COLUMNS = [
    ("rank", "rank", "{}"),
    ("base_step_ms", "BASE median step ms", "{:.2f}"),
    ("new_step_ms", "NEW median step ms", "{:.2f}"),
    ("diff_ms", "diff ms", "{:+.2f}"),
]
FAMILY_COLUMNS = [
    ("name", "compute family", "{}"),
    ("base_ms", "BASE ms/step", "{:.2f}"),
    ("new_ms", "NEW ms/step", "{:.2f}"),
]


def console(doc: dict[str, Any]) -> str:
    """What the command prints: headline, sides, what explains it, the phase table, notes."""
    b, n = doc["base"], doc["new"]
    lines = [
        headline(doc),
        f"BASE: {b['label']} ({b['steps']} steps from {b['source']}; verdict {b['verdict'] or '-'})",
        f"NEW:  {n['label']} ({n['steps']} steps from {n['source']}; verdict {n['verdict'] or '-'})",
    ]
    label = "why: " if doc["step"]["verdict"] != "none" else "moved:"  # within the noise: what moved, not why
    for line in doc["explanation"]:
        lines.append(f"{label} {line}")
    if doc["phases"]:
        lines.append(table.render(doc["phases"], PHASE_COLUMNS))
    for note in doc["cannot_compare"]:
        lines.append(f"note: {note}")
    gate = gate_line(doc)
    if gate:
        lines.append(gate)
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    """compare.md: the same as the console, with the per-rank table and the reports' details."""
    b, n, s = doc["base"], doc["new"], doc["step"]
    out = [
        f"# {b['label']} vs {n['label']}",
        "",
        f"**{headline(doc)}**",
        "",
        f"- BASE: `{b['path']}`: {b['steps']} steps ({b['source']}), ranks {b['ranks']}, verdict {b['verdict'] or '-'}",
        f"- NEW: `{n['path']}`: {n['steps']} steps ({n['source']}), ranks {n['ranks']}, verdict {n['verdict'] or '-'}",
        f"- p90 step: {s['base_p90_ms']:.2f} -> {s['new_p90_ms']:.2f} ms",
    ]
    gate = gate_line(doc)
    if gate:
        out.append(f"- {gate}")
    out += ["", "## What explains it" if s["verdict"] != "none" else "## What moved (within the noise)", ""]
    out += [f"- {line}" for line in doc["explanation"]] or ["- nothing beyond the tables below"]
    if doc["phases"]:
        out += ["", "## Phases (median per step over the ranks)", "", *table.markdown(doc["phases"], PHASE_COLUMNS)]
    if doc["ranks"]:
        out += ["", "## Ranks", "", *table.markdown(doc["ranks"], RANK_COLUMNS)]
    report = doc.get("report")
    if report:
        out += ["", "## From the collector's reports", ""]
        out.append(f"- verdict: {report['verdict'][0]} -> {report['verdict'][1]}")
        for key, (bv, nv) in {**report["communication_ms"], **report["host_per_step"]}.items():
            if bv is not None and nv is not None:
                out.append(f"- {key}: {bv:.2f} -> {nv:.2f}")
        for key, (bv, nv) in report["memory_peak_bytes"].items():
            if bv is not None and nv is not None:
                out.append(f"- {key}: {bv / 2**20:.0f} -> {nv / 2**20:.0f} MiB")
        if report["compute_families_ms"]:
            out += ["", *table.markdown(report["compute_families_ms"], FAMILY_COLUMNS)]
    if doc["cannot_compare"]:
        out += ["", "## What this comparison cannot vouch for", ""]
        out += [f"- {note}" for note in doc["cannot_compare"]]
    return "\n".join(out) + "\n"


def _html_table(rows: list[dict[str, Any]], cols: list[table.Column]) -> str:
    head = "".join(f"<th>{escape(title)}</th>" for _, title, _ in cols)

    def cell(r: dict[str, Any], k: str, f: str) -> str:
        return f"<td>{escape('-' if r.get(k) is None else f.format(r[k]))}</td>"

    body = "".join("<tr>" + "".join(cell(r, k, f) for k, _, f in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html(doc: dict[str, Any]) -> str:
    """The comparison as an HTML fragment (TensorBoard's comparison page): headline, what
    explains it, the phase and rank tables, what cannot be compared."""
    b, n = doc["base"], doc["new"]
    parts = [f"<p><b>{escape(headline(doc))}</b></p>"]
    parts.append(
        f"<p>BASE <b>{escape(b['label'])}</b>: {b['steps']} steps ({escape(b['source'])}), verdict "
        f"{escape(str(b['verdict'] or '-'))}; NEW <b>{escape(n['label'])}</b>: {n['steps']} steps "
        f"({escape(n['source'])}), verdict {escape(str(n['verdict'] or '-'))}</p>"
    )
    title = "What explains it" if doc["step"]["verdict"] != "none" else "What moved (within the noise)"
    items = "".join(f"<li>{escape(line)}</li>" for line in doc["explanation"]) or "<li>nothing beyond the tables</li>"
    parts.append(f"<h2>{title}</h2><ul>{items}</ul>")
    if doc["phases"]:
        parts.append("<h2>Phases (median per step over the ranks)</h2>" + _html_table(doc["phases"], PHASE_COLUMNS))
    if doc["ranks"]:
        parts.append("<h2>Ranks</h2>" + _html_table(doc["ranks"], RANK_COLUMNS))
    report = doc.get("report")
    if report and report["compute_families_ms"]:
        parts.append("<h2>Compute by family</h2>" + _html_table(report["compute_families_ms"], FAMILY_COLUMNS))
    if doc["cannot_compare"]:
        notes = "".join(f"<li>{escape(note)}</li>" for note in doc["cannot_compare"])
        parts.append(f"<h2>What this comparison cannot vouch for</h2><ul>{notes}</ul>")
    return "\n".join(parts)
