"""The collector's console table: one line per rank, the stragglers marked."""

from __future__ import annotations

from typing import Any

from harness import text_table


def console_table(doc: dict[str, Any]) -> str:
    """One line per rank: "(mean)" and "/step" figures are per step, "(total)" summed over the window."""
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
    if any(r.get("core_wait_ms") is not None for r in doc["ranks"]):  # CPU-only traces with step logs
        cols.insert(-1, ("core_wait_ms", "waited for a core ms/step", "{:.2f}"))
    straggling = {s["rank"]: "  <- straggler" for s in doc["stragglers"]}
    straggling |= {s["rank"]: "  <- straggler (live watch)" for s in doc.get("watch_stragglers", [])}
    straggling |= {s["rank"]: "  <- window only (live watch: no)" for s in doc.get("unconfirmed_stragglers", [])}
    table = text_table.render(doc["ranks"], cols, lambda r: straggling.get(r["rank"], ""))
    memory = [f"memory: rank {f['rank']} {f['kind']}: {f['reason']}" for f in doc.get("memory_findings", [])]
    return "\n".join([table, *memory])
