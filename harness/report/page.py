"""One renderer for the distributed view page: the collector's `report.html` and the TensorBoard plugin's.

The page is plain HTML (verdict, tables) plus charts drawn in the browser by `static/view.js`
with Plotly from the installed `plotly` package, from the report and timeline embedded as JSON.
Two ways to load the scripts:
- `inline`: Plotly, view.js and view.css inside the page: one file that opens from disk with no
  server and no network;
- `linked`: `<script src>` relative to the page, for the plugin, whose responses carry a
  Content-Security-Policy that forbids inline scripts (a JSON data block is not a script).
Nothing is ever fetched from the internet.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from harness.report.hang_report import hang_html
from harness.report.records import Report, as_document
from harness.report.tables import (
    CLOCK_COLUMNS,
    COLLECTIVE_STAT_COLUMNS,
    DIAGNOSIS_COLUMNS,
    GAP_COLUMNS,
    HOST_COLUMNS,
    MEMORY_FINDING_COLUMNS,
    MEMORY_RANK_COLUMNS,
    PG_COLUMNS,
    RANK_COLUMNS,
    STRAGGLER_COLUMNS,
    Column,
    cell,
    clock_rows,
    gap_rows,
    host_rows,
    memory_note,
    memory_rank_rows,
    no_straggler_text,
    pg_rows,
    rows,
    scope_line,
    straggler_rows,
    watch_straggler_text,
)

GAPS_SHOWN = 20
# The page's own assets, inlined into report.html and served by the TensorBoard plugin.
STATIC_FILES = {"view.js": "text/javascript", "view.css": "text/css"}


def static_text(name: str) -> str:
    """One of the page's own assets (`STATIC_FILES`), from the installed package."""
    if name not in STATIC_FILES:
        raise KeyError(name)
    return resources.files("harness.report").joinpath("static", name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def plotly_js_path() -> Path:
    """plotly.min.js as shipped inside the `plotly` wheel (package_data), never a CDN."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: reinstall the plotly package (pip install --force-reinstall plotly)"
        )
    return path


def _json_block(data: Any) -> str:
    # '<', '>' and '&' escaped so no value can close the <script> element it sits in.
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


JSON_BATCH = 256  # list elements per part in _json_parts


def _json_parts(data: Any) -> Iterator[str]:
    """`_json_block(data)` in parts, for a writer to write one at a time: a dict with string keys
    member by member, a long list member JSON_BATCH elements at a time, each part encoded by the
    json module's C encoder and escaped alone (the escapes are of single characters, so escaping
    the parts is escaping the whole); joined, the parts are `_json_block(data)`'s text."""
    if not (isinstance(data, dict) and all(isinstance(k, str) for k in data)):
        yield _json_block(data)
        return
    yield "{"
    for i, (key, value) in enumerate(data.items()):
        yield ("," if i else "") + _json_block(key) + ":"
        if isinstance(value, list) and len(value) > JSON_BATCH:
            yield "["
            for j in range(0, len(value), JSON_BATCH):
                yield ("," if j else "") + _json_block(value[j : j + JSON_BATCH])[1:-1]
            yield "]"
        else:
            yield _json_block(value)
    yield "}"


# "</script" in any case (HTML ends a script element on "</SCRIPT" too), and the bytes a match spans
SCRIPT_END, SCRIPT_LEN = re.compile(rb"</(script)", re.IGNORECASE), len(b"</script")
CHUNK_BYTES = 1 << 20  # what _inline_script holds of a script file at a time


def _escape_script_end(js: bytes) -> bytes:
    """Every "</script", in any case, as "<\\/script" (the same letters): JavaScript reads the
    same string, HTML no longer sees an end tag."""
    return SCRIPT_END.sub(rb"<\\/\1", js)


def _inline_script(js: bytes | Path) -> Iterator[str | bytes]:
    """`<script>js</script>`, js as UTF-8 bytes (written as they are) or the file holding them,
    any "</script" in it (in any case) escaped so it cannot close the element early. A file is read
    CHUNK_BYTES at a time (Plotly's 4.8 MB, read whole and escaped, would be the collector's peak):
    each chunk is escaped up to where no "</script" can straddle its end and no UTF-8 character
    is cut (every part decodes alone), the rest carried into the next one."""
    yield "<script>"
    if isinstance(js, bytes):
        yield _escape_script_end(js)
    else:
        carry = b""
        with js.open("rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                buf = carry + chunk
                cut = max(len(buf) - (SCRIPT_LEN - 1), 0)
                # a match starting in the last bytes kept whole: it cannot overlap another
                found = SCRIPT_END.search(buf, max(cut - SCRIPT_LEN + 1, 0))
                if found and found.start() < cut:
                    cut = found.end()
                # back off a cut inside a character (onto its lead byte: never part of a match)
                back = 0
                while 0 < cut < len(buf) and back < 3 and buf[cut] & 0xC0 == 0x80:
                    cut, back = cut - 1, back + 1
                yield _escape_script_end(buf[:cut])
                carry = buf[cut:]
        yield _escape_script_end(carry)
    yield "</script>"


def html_table(rows: list[dict[str, Any]], cols: list[Column], table_id: str, row_class: Any = None) -> str:
    """rows as an HTML table; numeric columns right-aligned; `row_class(row)` may name a CSS class."""
    head = "".join(f'<th class="{"num" if f != "{}" else ""}">{html.escape(t)}</th>' for _, t, f in cols)
    body = []
    for r in rows:
        cls = row_class(r) if row_class else None
        tds = "".join(
            f'<td class="{"num" if f != "{}" else ""}" data-key="{k}">{html.escape(cell(r, k, f))}</td>'
            for k, _, f in cols
        )
        body.append(f'<tr{f" class={cls!r}" if cls else ""} data-rank="{r.get("rank", "")}">{tds}</tr>')
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _section(title: str, body: str, section_id: str) -> str:
    return f'<section id="{section_id}"><h2>{html.escape(title)}</h2>{body}</section>'


def _body(report: Report, title: str) -> str:
    straggling = {s.rank for s in report.stragglers}
    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p id="verdict" class="verdict {html.escape(report.verdict)}">{html.escape(report.headline)}</p>',
        f'<p class="scope">{html.escape(scope_line(report))}</p>',
        hang_html(report),
    ]
    parts.append(
        _section(
            "What to do next",
            "<ul>"
            + "".join(f'<li data-about="{html.escape(n.about)}">{html.escape(n.text)}</li>' for n in report.next_steps)
            + "</ul>",
            "sec-advice",
        )
    )
    if report.stragglers:
        stragglers = html_table(straggler_rows(report), STRAGGLER_COLUMNS, "stragglers")
    else:
        stragglers = f'<p id="stragglers">{html.escape(no_straggler_text(report))}</p>'
    watched = watch_straggler_text(report)
    if watched:
        stragglers += f'<p id="watch-stragglers">{html.escape(watched)}</p>'
    parts.append(_section("Stragglers", stragglers, "sec-stragglers"))
    if report.diagnosis:
        parts.append(
            _section(
                f"Diagnosis: {report.diagnosis_summary}",
                html_table(rows(report.diagnosis), DIAGNOSIS_COLUMNS, "diagnosis"),
                "sec-diagnosis",
            )
        )
    parts.append(_section("Memory", _memory(report), "sec-memory"))
    parts.append(
        _section(
            "Per rank",
            html_table(
                rows(report.ranks), RANK_COLUMNS, "ranks", lambda r: "straggler" if r["rank"] in straggling else None
            )
            + '<div id="bars" class="chart"></div>',
            "sec-ranks",
        )
    )
    if len(report.hosts) > 1:
        parts.append(_section("Per host", html_table(host_rows(report), HOST_COLUMNS, "hosts"), "sec-hosts"))
    if report.process_groups:
        parts.append(
            _section("Per process group", html_table(pg_rows(report), PG_COLUMNS, "process-groups"), "sec-pgs")
        )
    if report.collective_stats:
        parts.append(
            _section(
                "Collectives",
                '<p class="note">Bus bandwidth by NCCL-tests\' conventions, '
                "to hold against the link's speed; - where the trace gives no sizes.</p>"
                + html_table(rows(report.collective_stats), COLLECTIVE_STAT_COLUMNS, "collective-stats"),
                "sec-collectives",
            )
        )
    parts.append(
        _section(
            "Rank × step",
            '<div id="heatmap-step" class="chart"></div>'
            '<div id="heatmap-wait" class="chart"></div>'
            '<div id="heatmap-memory" class="chart"></div>',
            "sec-heatmap",
        )
    )
    timeline_note = (
        '<p class="note">One lane per rank on aligned clocks: each step\'s phases above, its collectives '
        "below with the wait for the last arriver in red. Drag to zoom, double-click to reset. "
        "Kernel-level detail: <code>merged.pt.trace.json.gz</code> in Perfetto UI.</p>"
    )
    parts.append(
        _section(
            "Timeline",
            timeline_note + '<p id="timeline-cut" class="note"></p><div id="timeline" class="chart tall"></div>',
            "sec-timeline",
        )
    )
    if report.gaps:
        gaps = html_table(gap_rows(report, GAPS_SHOWN), GAP_COLUMNS, "gaps")
        gaps += f'<p class="note">{report.gaps_total} gap(s) in all; report.json lists the longest.</p>'
    else:
        gaps = '<p id="gaps">No gap of exposed communication or idle device time.</p>'
    parts.append(_section("Biggest overlap gaps", gaps, "sec-gaps"))
    if report.clock.aligned:
        clock = (
            f'<p class="note">One offset per host, estimated from the end times of matched collectives, '
            f"relative to host {html.escape(str(report.clock.reference_host))}.</p>"
            + html_table(clock_rows(report), CLOCK_COLUMNS, "clock")
        )
    else:
        clock = '<p id="clock">Clocks not aligned (--no-align, or no collective matched across ranks).</p>'
    parts.append(_section("Clock offsets", clock, "sec-clock"))
    if report.warnings:
        parts.append(
            _section(
                "Warnings",
                "<ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in report.warnings) + "</ul>",
                "sec-warnings",
            )
        )
    return "\n".join(parts)


def _memory(report: Report) -> str:
    """The memory findings, the per-rank memory table and links to torch's memory timelines."""
    out = f'<p id="memory-note" class="note">{html.escape(memory_note(report))}</p>'
    if report.memory_findings:
        out += html_table(rows(report.memory_findings), MEMORY_FINDING_COLUMNS, "memory-findings")
    if report.memory_steps:
        out += html_table(memory_rank_rows(report), MEMORY_RANK_COLUMNS, "memory-ranks")
    if report.memory_timelines:
        out += (
            '<p class="note">Memory timelines (torch\'s, per profiler window):</p><ul id="memory-timelines">'
            + "".join(
                f"<li>rank {t.rank} window {t.window}: <code>{html.escape(t.path)}</code></li>"
                for t in report.memory_timelines
            )
            + "</ul>"
        )
    return out


def render_page(report: Report, timeline: dict[str, Any] | None, *, title: str, assets: str = "inline") -> str:
    """The whole view as one HTML document (`page_parts` joined)."""
    return "".join(
        p if isinstance(p, str) else p.decode("utf-8") for p in page_parts(report, timeline, title=title, assets=assets)
    )


def page_parts(
    report: Report, timeline: dict[str, Any] | None, *, title: str, assets: str = "inline"
) -> Iterator[str | bytes]:
    """The view as one HTML document, in parts a writer can write one at a time (str, and the
    inlined Plotly as UTF-8 bytes; a 1024-rank report.html is ~11 MB: built whole, with its JSON
    and that JSON's escaped copies, it would be the collector's memory peak). `assets`: "inline"
    (self-contained file) or "linked" (scripts and style loaded from `plotly.min.js`, `view.js`,
    `view.css` next to the page)."""
    if assets == "inline":
        head = f"<style>{static_text('view.css')}</style>"
    elif assets == "linked":
        head = '<link rel="stylesheet" href="view.css">'
    else:
        raise ValueError(f"assets must be 'inline' or 'linked', not {assets!r}")
    yield (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>{head}</head><body>\n{_body(report, title)}\n"
        '<script type="application/json" id="harness-data">'
    )
    # {"report": report.json's document, "timeline": timeline} as one compact JSON object, a member at a time
    yield '{"report":'
    yield from _json_parts(as_document(report))
    yield ',"timeline":'
    yield from _json_parts(timeline)
    yield "}"
    yield "</script>\n"
    if assets == "inline":
        # Plotly's 4.8 MB as UTF-8 bytes from its file: decoded, its few non-ASCII characters
        # make it a str of 4 bytes a character (19 MB, and as much again escaped)
        yield from _inline_script(plotly_js_path())
        yield from _inline_script(static_text("view.js").encode("utf-8"))
    else:
        yield '<script src="plotly.min.js"></script><script src="view.js"></script>'
    yield "\n</body></html>\n"


def render_message(title: str, message_html: str, *, assets: str = "linked") -> str:
    """A page with only a message (no report yet, unreadable report): same look as the view."""
    head = (
        f"<style>{static_text('view.css')}</style>" if assets == "inline" else '<link rel="stylesheet" href="view.css">'
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>{head}</head><body><h1>{html.escape(title)}</h1>"
        f'<div id="message">{message_html}</div></body></html>\n'
    )
