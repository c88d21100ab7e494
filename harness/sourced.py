"""Decision thresholds with their sources.

Every cut-off that decides what the collector, the advisor or the live watch reports is a field
of a dataclass, declared with `threshold()`, which records the kind of its source and the
source itself beside the value (as `knob()` records a setting's flag and help). The page
docs/thresholds.md is generated from those fields (`python -m harness.sourced >
docs/thresholds.md`), and tests/test_thresholds.py keeps it current and checks that no module
of the analysis holds a numeric cut-off outside such a field.

A threshold's kind says where its value comes from:
- `definition`: it follows from what the figure means (a majority is more than half);
- `statistic`: a statistical convention (three median absolute deviations);
- `measurement`: a figure measured, named where it is recorded (bench/RESULTS.md, a spec, a
  library's constant);
- `cap`: a bound on work or output size, which decides how much is said, not what is judged.
A value set on this project's own runs, with no source of these kinds, is no threshold: it is
sourced or the rule goes.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any

KINDS = {
    "definition": "follows from what the figure means",
    "statistic": "a statistical convention",
    "measurement": "a figure measured, named where it is recorded",
    "cap": "a bound on work or output size: how much is said, not what is judged",
}


def threshold(default: Any = MISSING, *, kind: str, source: str) -> Any:
    """A dataclass field that decides a finding, with the kind of its source (`KINDS`) and the
    source in one or two sentences."""
    if kind not in KINDS:
        raise ValueError(f"threshold kind {kind!r} is not one of {', '.join(KINDS)}")
    if not source.strip():
        raise ValueError("a threshold needs its source")
    return field(default=default, metadata={"kind": kind, "source": source})


@dataclass(frozen=True)
class Entry:
    """One threshold as the page lists it."""

    owner: str  # the dataclass (or instance) that holds it, as code names it
    name: str
    value: str
    kind: str
    source: str


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def entries(owner: str, obj: Any) -> Iterator[Entry]:
    """The thresholds of a dataclass (its defaults) or of an instance (its values)."""
    for f in dataclasses.fields(obj):
        if "kind" not in f.metadata:
            continue
        if isinstance(obj, type):
            value = f.default if f.default is not MISSING else "(per instance)"
        else:
            value = getattr(obj, f.name)
        yield Entry(
            owner=owner,
            name=f.name,
            value=value if isinstance(value, str) else _value(value),
            kind=f.metadata["kind"],
            source=f.metadata["source"],
        )


def registry() -> list[tuple[str, str, Any]]:
    """(section title, owner as code names it, dataclass or instance) of every threshold holder."""
    from harness.traces.analyse import advisor, gpu_health, memory, noise, stragglers

    return [
        ("The straggler rule (collector and watch)", "stragglers.Thresholds", stragglers.Thresholds),
        ("Noise model: GPU devices", "noise.GPU", noise.GPU),
        ("Noise model: shared CPU cores", "noise.SHARED_CPU", noise.SHARED_CPU),
        ("The bottleneck advisor", "advisor.Rules", advisor.Rules),
        ("Memory findings", "memory.MemoryThresholds", memory.MemoryThresholds),
        ("A straggler's GPU against its peers'", "gpu_health.GpuThresholds", gpu_health.GpuThresholds),
    ]


# The modules whose module-level numbers tests/test_thresholds.py reads (harness/...).
ANALYSIS_MODULES = ("traces/analyse/*.py", "watch/rule.py", "watch/exchange.py", "watch/arrivals.py")
# Module-level numbers there that decide no finding: units and how much a report shows.
NOT_THRESHOLDS = (
    "flight.MAX_MISMATCHES",
    "memory.MB",
    "memory.MAX_HEATMAP_STEPS",
    "overlap.LONGEST_GAPS",
    "rank_list.SPELLED",
    "rank_list.RUNS_SHOWN",
)
# Module-level thresholds not yet declared as `threshold()` fields: the page lists them, and
# this list can only shrink (a new one is a field with its source).
UNDECLARED = (
    "advisor.PEER_MADS",
    "advisor.PEER_SHARE",
    "advisor.PEER_POINT",
    "overlap.MIN_GAP_US",
    "replay.REPLAY_FIDELITY",
    "runq.MATCH_SHARE",
    "runq.MATCH_FLOOR_MS",
    "stragglers.PERSISTENT_SHARE",
    "stragglers.MAX_CAUSES",
    "stragglers.MIN_JITTER_STEPS",
    "stragglers.SYNC_CAUSE_SHARE",
    "stragglers.SYNC_CALLER_SHARE",
    "rule.MAX_PHASED",
    "exchange.MAX_NAMED",
    "arrivals.TIMING_PATIENCE_NS",
)


def analysis_modules() -> dict[str, str]:
    """The modules of ANALYSIS_MODULES, by file stem (the names NOT_THRESHOLDS and UNDECLARED
    use): stem -> dotted module name."""
    root = Path(__file__).parent
    return {
        path.stem: "harness." + ".".join(path.relative_to(root).with_suffix("").parts)
        for pattern in ANALYSIS_MODULES
        for path in sorted(root.glob(pattern))
    }


def _undeclared_value(name: str, modules: dict[str, str]) -> str:
    module, constant = name.split(".")
    return _value(getattr(importlib.import_module(modules[module]), constant))


def all_entries() -> list[Entry]:
    return [e for _, owner, obj in registry() for e in entries(owner, obj)]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def thresholds_markdown() -> str:
    """docs/thresholds.md: the kinds, then a table per holder, then their counts."""
    lines = [
        "# Decision thresholds",
        "",
        "Generated from the `threshold()` fields (`harness/sourced.py`): "
        "`python -m harness.sourced > docs/thresholds.md`. A new rule or threshold needs a source and a "
        "before/after on cases it was not tuned on (CONTRIBUTING.md).",
        "",
        "| kind | means |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in KINDS.items()),
    ]
    listed: list[Entry] = []
    for title, owner, obj in registry():
        rows = list(entries(owner, obj))
        if not rows:
            continue
        listed += rows
        lines += ["", f"## {title}", "", f"`{owner}`", "", "| name | value | kind | source |", "|---|---|---|---|"]
        lines += [f"| `{e.name}` | {_cell(e.value)} | {e.kind} | {_cell(e.source)} |" for e in rows]
    counts = {k: sum(1 for e in listed if e.kind == k) for k in KINDS}
    lines += ["", "## Counts", "", ", ".join(f"{k}: {n}" for k, n in counts.items())]
    modules = analysis_modules()
    lines += [
        "",
        "## Not yet declared as fields",
        "",
        "Module constants whose source is in a comment beside them, not in a field; the list only shrinks.",
        "",
        *(f"- `{name}` = {_undeclared_value(name, modules)}" for name in UNDECLARED),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.write(thresholds_markdown())


if __name__ == "__main__":
    main()
