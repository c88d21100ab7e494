"""The collector's console: a verdict block that fits a terminal, then a narrow per-rank table.

The first screen is read at a terminal's width (`WIDTH` columns): the verdict, why in one
sentence with its figures, the next steps, the noise bound and the diagnosis, each wrapped under
its label; then one line per rank with the few columns that carry the verdict. Every column of
the per-rank table is in `wide_table` (`--wide`) and in report.md.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from harness import text_table
from harness.report.records import Report
from harness.report.tables import rows

# A terminal's width: 100 columns, the narrowest that programmers' editors and terminals default
# to beside a second pane; lines longer than it wrap and break the table's columns.
WIDTH = 100
# Every label of the verdict block is padded to one width, so the texts start in one column.
LABEL_WIDTH = len("diagnosis: ")
# The narrow table lists at most this many ranks: a screen's height less the verdict block. The
# stragglers and the ranks that wait or are late the most are kept; --wide lists every rank.
NARROW_RANKS = 16


# What a line never breaks inside: a figure and its unit ("64.54 ms"), and a what-if with the
# figures it is held against ("instead of ~63.24 ms (both replayed; measured 62.84 ms)"), so each
# reads, and is found by a search of the console's text, on one line.
UNBROKEN = re.compile(r"instead of ~?[0-9.]+ ms \([^)]*\)|~?-?[0-9][0-9.,]* ?(?:ms|us|s|MB|GB|GiB|MiB|%)\b(?:/step)?")
GLUE = "\x00"  # a space inside an UNBROKEN span while the text is wrapped


def labelled(label: str, text: str, width: int = WIDTH) -> str:
    """`text` wrapped at `width` columns under `label` (padded to LABEL_WIDTH), its continuation
    lines indented to the text's column; a word longer than a line (a path) is not broken, nor
    is an UNBROKEN span."""
    head = f"{label}:".ljust(LABEL_WIDTH)
    glued = UNBROKEN.sub(lambda m: m.group(0).replace(" ", GLUE), text)
    wrapped = textwrap.fill(
        glued,
        width=width,
        initial_indent=head,
        subsequent_indent=" " * LABEL_WIDTH,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapped.replace(GLUE, " ")


def labelled_texts(text: str, label: str) -> list[str]:
    """The texts printed under `label` ("verdict", "next", ...) in `text` (what `labelled` wrote),
    each with its wrapped continuation lines joined back into one line."""
    texts: list[str] = []
    current: list[str] | None = None
    head = f"{label}:"
    for line in text.splitlines():
        if current is not None and line.startswith(" " * LABEL_WIDTH) and line.strip():
            current.append(line.strip())
            continue
        if current is not None:
            texts.append(" ".join(current))
            current = None
        if line.startswith(head) and line[:LABEL_WIDTH].rstrip() == head:
            current = [line[LABEL_WIDTH:].strip()]
    if current is not None:
        texts.append(" ".join(current))
    return texts


def why_text(report: Report) -> str | None:
    """The verdict's reason in one sentence with its figures:

    1. a straggler verdict: the first straggler's diagnosis (its lateness, how often, its phase);
    2. an inconclusive one: the reason the rule could not judge;
    3. otherwise the bottleneck most ranks share, with the reason of its lowest rank."""
    by_rank = {d.rank: d for d in report.diagnosis}
    first_late = [s.rank for s in report.stragglers] or [s.rank for s in report.watch_stragglers]
    if first_late and first_late[0] in by_rank:
        d = by_rank[first_late[0]]
        return f"rank {d.rank} {d.reason}"
    if report.verdict_reason:
        return report.verdict_reason
    if not by_rank:
        return None
    counts: dict[str, list[int]] = {}
    for d in by_rank.values():
        counts.setdefault(d.bottleneck, []).append(d.rank)
    kind, ranks = max(counts.items(), key=lambda kv: (len(kv[1]), -min(kv[1])))
    first = by_rank[min(ranks)]
    who = f"rank {first.rank}" if len(ranks) == 1 else f"{len(ranks)} of {len(by_rank)} ranks, rank {first.rank}"
    return f"{who} {kind}: {first.reason}"


def _marks(report: Report) -> dict[int, str]:
    marks = {s.rank: "  <- straggler" for s in report.stragglers}
    marks |= {s.rank: "  <- straggler (live watch)" for s in report.watch_stragglers}
    return marks


def short_host(host: str, room: int) -> str:
    """A host name in `room` characters: its first label where the whole does not fit (the name
    people use for a node), cut at `room` with '~' where that does not fit either."""
    if len(host) <= room:
        return host
    first = host.split(".")[0]
    return first if len(first) <= room else first[: max(room - 1, 1)] + "~"


def _per_step(total: float, steps: int) -> float | None:
    return total / steps if steps > 0 else None


def narrow_table(report: Report, limit: int = NARROW_RANKS) -> str:
    """One line per rank, the columns that carry the verdict: its step, its lateness, its waiting
    for later peers (both per step) and its bottleneck. Past `limit` ranks: the marked ones and
    those late or waiting the most, in rank order, and a line saying how many more there are."""
    marks = _marks(report)
    bottleneck = {d.rank: d.bottleneck for d in report.diagnosis}
    table: list[dict[str, Any]] = [
        {
            "rank": r.rank,
            "host": r.host,
            "mean_step_ms": r.mean_step_ms,
            "late_ms": r.late_ms,
            "wait_ms_per_step": _per_step(r.wait_ms, r.steps),
            "bottleneck": bottleneck.get(r.rank, "-"),
        }
        for r in report.ranks
    ]
    shown = table
    if len(table) > limit:
        first = sorted(
            table,
            key=lambda r: (r["rank"] not in marks, -max(r["late_ms"] or 0.0, r["wait_ms_per_step"] or 0.0), r["rank"]),
        )
        keep = {r["rank"] for r in first[:limit]}
        shown = [r for r in table if r["rank"] in keep]
    cols = [
        ("rank", "rank", "{}"),
        ("host", "host", "{}"),
        ("mean_step_ms", "step ms", "{:.2f}"),
        ("late_ms", "late ms/step", "{:.2f}"),
        ("wait_ms_per_step", "waited ms/step", "{:.2f}"),
        ("bottleneck", "bottleneck", "{}"),
    ]
    # the host column gets what the other columns and the longest mark leave of WIDTH
    others = [render_width(shown, cols, skip="host"), max((len(m) for m in marks.values()), default=0)]
    room = max(WIDTH - sum(others) - 2, len("host"))
    for r in shown:
        r["host"] = short_host(str(r["host"]), room)
    lines = [text_table.render(shown, cols, lambda r: marks.get(r["rank"], ""))]
    if len(shown) < len(table):
        lines.append(f"({len(table) - len(shown)} more ranks: --wide lists every rank, as report.md does)")
    return "\n".join(lines)


def render_width(rows: list[dict[str, Any]], cols: list[text_table.Column], skip: str) -> int:
    """The width text_table.render gives `rows` without the column `skip` (its separators kept)."""
    width = 0
    for key, title, fmt in cols:
        if key == skip:
            continue
        cells = ["-" if r.get(key) is None else fmt.format(r[key]) for r in rows]
        width += max([len(title), *map(len, cells)]) + 2
    return width


def wide_table(report: Report) -> str:
    """Every rank with every column: "(mean)" and "/step" figures are per step, "(total)" summed
    over the window."""
    cols = [
        ("rank", "rank", "{}"),
        ("host", "host", "{}"),
        ("mean_step_ms", "step ms (mean)", "{:.2f}"),
        ("exposed_wait_ms", "exp. waiting ms (total)", "{:.2f}"),
        ("exposed_transfer_ms", "exp. transfer ms (total)", "{:.2f}"),
        ("idle_ms", "idle ms (total)", "{:.2f}"),
        ("wait_ms", "waited ms (total)", "{:.2f}"),
        ("late_ms", "late ms/step", "{:.2f}"),
        ("beyond_peers_ms", "beyond peers ms/step", "{:.2f}"),
        ("clock_offset_ms", "offset ms", "{:.3f}"),
    ]
    if any(r.core_wait_ms is not None for r in report.ranks):  # CPU-only traces with step logs
        cols.insert(-1, ("core_wait_ms", "waited for a core ms/step", "{:.2f}"))
    marks = _marks(report)
    return text_table.render(rows(report.ranks), cols, lambda r: marks.get(r["rank"], ""))


def memory_lines(report: Report) -> list[str]:
    return [labelled("memory", f"rank {f.rank} {f.kind}: {f.reason}") for f in report.memory_findings]


def console_table(report: Report, wide: bool = False) -> str:
    """The per-rank table (narrow, or every column with `wide`) and the memory findings."""
    table = wide_table(report) if wide else narrow_table(report)
    return "\n".join([table, *memory_lines(report)])
