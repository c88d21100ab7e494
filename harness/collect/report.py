"""Turn an `Analysis` into the report's tables and files: report.json, report.md, steps.csv.

`build_report` is pure (Analysis -> dict, the report.json document); the writers only format
it. Schema of report.json (version 1), every duration in ms unless its name says `_us`:

- `inputs`: the paths as given; `input_dirs`: the absolute folders the traces were read from.
- `verdict`: "straggler" or "balanced"; `headline`: the verdict in one sentence.
- `run`: {run_id, world_size, ranks_present, ranks_missing, complete, ending (how a job that did
  not finish ended, rank by rank: run_state.py), hosts, device, steps_source,
  steps}.
- `stragglers`: [{rank, host, phase, phase_excess_ms, blame_ms, wait_ms, last_fraction,
  whatif_step_ms, mean_step_ms}], most blamed first; empty when balanced.
- `diagnosis`: [{rank, host, bottleneck, reason, evidence, advice}], one per rank (see
  advisor.py): bottleneck is one of straggler, data-bound, sync-bound, launch-bound,
  comm-exposed, kernel-bound, healthy; evidence holds the numbers the rules read.
  `diagnosis_summary`: e.g. "launch-bound (ranks 0, 1)".
- `ranks`: [{rank, host, steps, mean_step_ms, compute_ms, comm_ms, overlapped_comm_ms,
  exposed_comm_ms, idle_ms, wait_ms, blame_ms, last_fraction, clock_offset_ms, clock_spread_ms,
  clock_samples}]; compute..idle are summed over the analysed steps.
- `hosts`: [{host, ranks, blame_ms, wait_ms, stragglers}].
- `steps`: [{rank, step, step_ms, wait_ms, lag_ms, exposed_comm_ms, compute_ms, comm_ms, idle_ms,
  last_arriver}]; wait_ms: this rank waited for others; lag_ms: the others waited for it.
- `gaps`: [{rank, step, start_us, dur_us, kind, collective}], longest first (at most
  `MAX_GAPS`; `gaps_total` counts all). start_us is on the aligned clock of merged.pt.trace.json.gz.
- `collectives`: {matched, by_name: {name: count}}; `clock`: {aligned, reference_rank};
  `thresholds`: the straggler thresholds used, `threshold_ms` the per-step blame bound applied;
  `warnings`: what was missing or doubtful.
"""

from __future__ import annotations

import csv
import json
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness import text_table
from harness.atomic import write_text_atomic
from harness.collect.advisor import as_rows, diagnose, summary
from harness.collect.analysis import Analysis
from harness.paths import REPORT_JSON

SCHEMA_VERSION = 1
MAX_GAPS = 200
ADVICE = {
    "data": "its input pipeline is slow: more DataLoader workers (--num-workers), persistent workers, "
            "pinned memory, or move preprocessing offline; check its disk/network for input files",
    "h2d": "its host-to-device copies are slow: pin memory and copy with non_blocking=True; check the PCIe/NUMA placement of that GPU",
    "forward": "its forward pass is slow: compare its hardware (clocks, thermals, other tenants), and its input sizes if they vary",
    "loss": "its loss computation is slow: look for host syncs or data-dependent work in the loss",
    "backward": "its backward pass is slow: compare its hardware (clocks, thermals, other tenants), and activation checkpointing settings",
    "optimizer": "its optimizer step is slow: use a fused/foreach optimizer; check for per-parameter host work",
}


# Table columns as (key, title, format), shared by report.md and the HTML view.
Column = tuple[str, str, str]
STRAGGLER_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"), ("host", "host", "{}"), ("phase", "late in", "{}"),
    ("phase_excess_ms", "excess ms/step", "{:.2f}"), ("blame_ms", "others waited ms", "{:.2f}"),
    ("last_fraction", "last in steps", "{:.0%}"), ("mean_step_ms", "step ms", "{:.2f}"),
    ("whatif_step_ms", "step ms if fixed", "{:.2f}")]
RANK_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"), ("host", "host", "{}"), ("steps", "steps", "{}"), ("mean_step_ms", "step ms", "{:.2f}"),
    ("compute_ms", "compute ms", "{:.2f}"), ("comm_ms", "comm ms", "{:.2f}"),
    ("overlapped_comm_ms", "overlapped ms", "{:.2f}"), ("exposed_comm_ms", "exposed ms", "{:.2f}"),
    ("idle_ms", "idle ms", "{:.2f}"), ("wait_ms", "waited ms", "{:.2f}"), ("blame_ms", "blamed ms", "{:.2f}"),
    ("last_fraction", "last", "{:.0%}")]
GAP_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"), ("step", "step", "{}"), ("kind", "kind", "{}"), ("dur_ms", "ms", "{:.3f}"),
    ("collective", "collective", "{}")]
DIAGNOSIS_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"), ("host", "host", "{}"), ("bottleneck", "bottleneck", "{}"), ("reason", "evidence", "{}"),
    ("advice", "next step", "{}")]
HOST_COLUMNS: list[Column] = [
    ("host", "host", "{}"), ("ranks", "ranks", "{}"), ("blame_ms", "others waited ms", "{:.2f}"),
    ("wait_ms", "waited ms", "{:.2f}"), ("stragglers", "stragglers", "{}")]
CLOCK_COLUMNS: list[Column] = [
    ("rank", "rank", "{}"), ("host", "host", "{}"), ("clock_offset_ms", "offset ms", "{:.3f}"),
    ("clock_spread_ms", "spread ms", "{:.3f}"), ("clock_samples", "collectives", "{}")]


def cell(row: dict[str, Any], key: str, fmt: str) -> str:
    """One table cell as text: '-' for a missing value."""
    return "-" if row.get(key) is None else fmt.format(row[key])


def _ms(us: float) -> float:
    return round(us / 1e3, 6)


def build_report(a: Analysis, inputs: list[str]) -> dict[str, Any]:
    res = a.stragglers
    by_rank = {t.rank: t for t in a.traces}
    agg: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in a.overlap:
        for k in ("compute_us", "comm_us", "overlapped_comm_us", "exposed_comm_us", "idle_us"):
            agg[row.rank][k] += getattr(row, k)
    blames = {r.rank: r for r in res.ranks}
    ranks = []
    for t in a.traces:
        o, b, g = a.offsets[t.rank], blames[t.rank], agg[t.rank]
        ranks.append({
            "rank": t.rank, "host": t.host, "steps": len(t.steps), "mean_step_ms": b.mean_step_ms,
            "compute_ms": _ms(g["compute_us"]), "comm_ms": _ms(g["comm_us"]),
            "overlapped_comm_ms": _ms(g["overlapped_comm_us"]), "exposed_comm_ms": _ms(g["exposed_comm_us"]),
            "idle_ms": _ms(g["idle_us"]), "wait_ms": b.wait_ms, "blame_ms": b.blame_ms,
            "last_fraction": b.last_fraction, "clock_offset_ms": _ms(o.offset_us),
            "clock_spread_ms": _ms(o.spread_us), "clock_samples": o.samples,
        })
    stragglers = [{
        "rank": s.rank, "host": s.host, "phase": s.phase, "phase_excess_ms": s.phase_excess_ms,
        "blame_ms": s.blame_ms, "wait_ms": s.wait_ms, "last_fraction": s.last_fraction,
        "whatif_step_ms": s.whatif_step_ms, "mean_step_ms": s.mean_step_ms,
    } for s in res.stragglers]
    hosts: dict[str, dict[str, Any]] = {}
    for r in res.ranks:
        h = hosts.setdefault(r.host, {"host": r.host, "ranks": [], "blame_ms": 0.0, "wait_ms": 0.0, "stragglers": []})
        h["ranks"].append(r.rank)
        h["blame_ms"] += r.blame_ms
        h["wait_ms"] += r.wait_ms
        if r.straggler:
            h["stragglers"].append(r.rank)
    step_rows = []
    step_dur = {(t.rank, s.number): s.dur_us for t in a.traces for s in t.steps}
    for row in sorted(a.overlap, key=lambda r: (r.rank, r.step)):
        step_rows.append({
            "rank": row.rank, "step": row.step, "step_ms": _ms(step_dur.get((row.rank, row.step), row.window_us)),
            "wait_ms": _ms(res.per_step.get(row.step, {}).get(row.rank, 0.0)),
            "lag_ms": _ms(res.step_blame.get(row.step, {}).get(row.rank, 0.0)),
            "exposed_comm_ms": _ms(row.exposed_comm_us), "compute_ms": _ms(row.compute_us),
            "comm_ms": _ms(row.comm_us), "idle_ms": _ms(row.idle_us),
            "last_arriver": res.step_last.get(row.step) == row.rank,
        })
    gaps = sorted(a.gaps, key=lambda g: -g.dur_us)
    present = sorted(by_rank)
    diagnoses = diagnose(a)
    all_steps = sorted({s.number for t in a.traces for s in t.steps})
    doc = {
        "schema_version": SCHEMA_VERSION,
        "inputs": inputs,
        "input_dirs": sorted({str(Path(p).parent.resolve()) for t in a.runset.ranks for p in t.path.split(", ")}),
        "verdict": res.verdict,
        "headline": headline(res.verdict, stragglers, a.runset.missing, a.runset.ending),
        "run": {
            "run_id": a.runset.run_id, "world_size": a.runset.world_size, "ranks_present": present,
            "ranks_missing": a.runset.missing, "complete": not a.runset.missing and not a.runset.ending,
            "ending": a.runset.ending,
            "hosts": sorted(hosts), "device": "gpu" if any(t.device == "gpu" for t in a.traces) else "cpu",
            "steps_source": sorted({t.steps_source for t in a.traces}), "steps": all_steps,
        },
        "stragglers": stragglers,
        "diagnosis": as_rows(diagnoses),
        "diagnosis_summary": summary(diagnoses),
        "ranks": ranks,
        "hosts": list(hosts.values()),
        "steps": step_rows,
        "gaps": [asdict(g) for g in gaps[:MAX_GAPS]],
        "gaps_total": len(gaps),
        "collectives": {"matched": len(a.instances), "by_name": dict(Counter(i.name for i in a.instances))},
        "clock": {"aligned": a.aligned, "reference_rank": min(present) if present else None},
        "threshold_ms": res.threshold_ms,
        "warnings": a.warnings,
    }
    return doc


def headline(verdict: str, stragglers: list[dict[str, Any]], missing: list[int], ending: list[str] | None = None) -> str:
    tail = f" (incomplete: rank(s) {', '.join(map(str, missing))} missing)" if missing else ""
    if ending:
        tail += f" (the run did not finish: {ending[1] if len(ending) > 1 else ending[0]})"
    if verdict == "balanced":
        return "balanced: no rank keeps the others waiting beyond the noise" + tail
    s = stragglers[0]
    p = s["phase"] or ""
    if p.startswith("op:"):
        phase = f": it spends longer in {p[3:]}"
    elif p.startswith("idle"):
        phase = ": its device sits idle waiting on its host"
    else:
        phase = f" in its {p} phase" if p else ""
    others = "; ".join(f"rank {x['rank']}" for x in stragglers[1:])
    more = f"; also {others}" if others else ""
    return f"straggler: rank {s['rank']} on {s['host']} is late{phase}{more}" + tail


def advice(doc: dict[str, Any]) -> list[str]:
    """What to do next, one sentence each, from the report's stragglers and overlap."""
    out = []
    for s in doc["stragglers"]:
        phase = s["phase"] or ""
        if phase in ADVICE:
            out.append(f"Rank {s['rank']}: {ADVICE[phase]}.")
        elif phase.startswith("idle"):
            out.append(f"Rank {s['rank']}: its device idles before collectives while its host is busy: look at that "
                       "rank's host side (input pipeline, Python overhead, CPU contention, syncs).")
        elif phase:
            out.append(f"Rank {s['rank']}: it spends longer in `{phase[3:] if phase.startswith('op:') else phase}` than "
                       "its peers: check its inputs (uneven shapes/load) and its hardware.")
        if s["whatif_step_ms"] is not None and s["mean_step_ms"]:
            out.append(f"Fixing rank {s['rank']} would bring the step from ~{s['mean_step_ms']:.2f} ms to "
                       f"~{s['whatif_step_ms']:.2f} ms (median rank's speed).")
    exposed = sum(r["exposed_comm_ms"] for r in doc["ranks"])
    total = sum(r["compute_ms"] + r["exposed_comm_ms"] + r["idle_ms"] for r in doc["ranks"])
    if total and exposed / total > 0.2:
        out.append(f"Communication is exposed for {100 * exposed / total:.0f}% of device time: overlap it with compute "
                   "(DDP bucket size, FSDP prefetch), shrink what is sent (bf16 gradients), or raise compute per step.")
    if not out:
        out.append("No rank holds the others back. Look at per-rank overlap for exposed communication and idle time.")
    return out


def scope_line(doc: dict[str, Any]) -> str:
    """What the report covers, in one sentence."""
    run = doc["run"]
    steps = f"{run['steps'][0]}..{run['steps'][-1]}" if run["steps"] else "-..-"
    return (f"{len(run['ranks_present'])} rank(s) on {len(run['hosts'])} host(s), device {run['device']}, steps {steps} "
            f"({', '.join(run['steps_source'])}); {doc['collectives']['matched']} collective instance(s) matched.")


def host_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{**h, "ranks": ", ".join(map(str, h["ranks"])), "stragglers": ", ".join(map(str, h["stragglers"])) or None}
            for h in doc["hosts"]]


def gap_rows(doc: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The n longest gaps, with their duration in ms."""
    return [{**g, "dur_ms": g["dur_us"] / 1e3} for g in doc["gaps"][:n]]


def render_markdown(doc: dict[str, Any]) -> str:
    run = doc["run"]
    lines = ["# Straggler and overlap report", "", f"**Verdict: {doc['headline']}**", ""]
    lines.append(scope_line(doc))
    if run["ranks_missing"]:
        lines.append(f"\n**Incomplete run:** rank(s) {', '.join(map(str, run['ranks_missing']))} of "
                     f"{run['world_size']} have no trace; the analysis covers the ranks present.")
    for note in run.get("ending", []):
        lines.append(f"\n**Run ended badly:** {note}.")
    lines += ["", "## Stragglers", ""]
    if doc["stragglers"]:
        lines += text_table.markdown(doc["stragglers"], STRAGGLER_COLUMNS)
    else:
        lines.append(f"None: no rank's blame exceeds {doc['threshold_ms']:.2f} ms per step.")
    lines += ["", f"## Diagnosis: {doc['diagnosis_summary']}", ""]
    lines += text_table.markdown(doc["diagnosis"], DIAGNOSIS_COLUMNS)
    lines += ["", "## Per rank", ""]
    lines += text_table.markdown(doc["ranks"], RANK_COLUMNS)
    if len(doc["hosts"]) > 1:
        lines += ["", "## Per host", ""]
        lines += text_table.markdown(host_rows(doc), HOST_COLUMNS)
    lines += ["", "## Biggest gaps", ""]
    if doc["gaps"]:
        lines += text_table.markdown(gap_rows(doc, 10), GAP_COLUMNS)
        lines.append(f"\n{doc['gaps_total']} gap(s) in all; `report.json` lists the {min(doc['gaps_total'], MAX_GAPS)} longest.")
    else:
        lines.append("No gap of exposed communication or idle device time.")
    lines += ["", "## Clock offsets", ""]
    if doc["clock"]["aligned"]:
        lines.append(f"Estimated from the end times of matched collectives, relative to rank {doc['clock']['reference_rank']} "
                     "(subtracted from each rank's timestamps).")
        lines += [""] + text_table.markdown(doc["ranks"], CLOCK_COLUMNS)
    else:
        lines.append("Clocks not aligned (--no-align, or no collective matched across ranks).")
    lines += ["", "## What to do next", ""] + [f"- {a}" for a in advice(doc)]
    if doc["warnings"]:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in doc["warnings"]]
    return "\n".join(lines) + "\n"


COLLECTIVE_COLUMNS = ["instance", "name", "step", "rank", "arrival_us", "wait_us", "transfer_us", "last_rank"]


def collective_rows(a: Analysis) -> list[dict[str, Any]]:
    """One row per (collective instance, rank): arrival on the aligned clock, wait, transfer."""
    rows = []
    for n, (inst, row) in enumerate(zip(a.instances, a.stragglers.instance_rows)):
        for r, op in sorted(inst.ops.items()):
            rows.append({"instance": n, "name": inst.name, "step": inst.step, "rank": r,
                         "arrival_us": round(op.start_us - a.offsets[r].offset_us, 3),
                         "wait_us": round(row["wait_us"][r], 3), "transfer_us": round(row["transfer_us"], 3),
                         "last_rank": row["last_rank"]})
    return rows


STEP_COLUMNS = ["rank", "step", "step_ms", "wait_ms", "lag_ms", "exposed_comm_ms", "compute_ms", "comm_ms", "idle_ms", "last_arriver"]


def write_report(doc: dict[str, Any], out: Path, collectives: list[dict[str, Any]] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / REPORT_JSON, json.dumps(doc, indent=1, allow_nan=False) + "\n")
    write_text_atomic(out / "report.md", render_markdown(doc))
    with (out / "steps.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=STEP_COLUMNS)
        w.writeheader()
        w.writerows(doc["steps"])
    with (out / "collectives.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLLECTIVE_COLUMNS)
        w.writeheader()
        w.writerows(collectives or [])


def console_summary(doc: dict[str, Any]) -> str:
    cols = [("rank", "rank", "{}"), ("host", "host", "{}"), ("mean_step_ms", "step ms", "{:.2f}"),
            ("exposed_comm_ms", "exposed ms", "{:.2f}"), ("idle_ms", "idle ms", "{:.2f}"),
            ("wait_ms", "waited ms", "{:.2f}"), ("blame_ms", "blamed ms", "{:.2f}"), ("last_fraction", "last", "{:.0%}"),
            ("clock_offset_ms", "offset ms", "{:.3f}")]
    straggling = {s["rank"] for s in doc["stragglers"]}
    return text_table.render(doc["ranks"], cols, lambda r: "  <- straggler" if r["rank"] in straggling else "")
