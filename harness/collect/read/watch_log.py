"""The live watch's record of a run as the collector reads it (run.json `watch`, written by
harness/train/watch.py), and its one-line summary, shared by the training printout and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.paths import run_file


def read_watch(dirs: list[Path]) -> dict[str, Any] | None:
    """run.json's `watch` ({every, intervals, judged_steps, flags, captures}) from the first input
    folder that has one (rank 0's node writes run.json), or None: no run.json (third-party traces,
    a run that did not finish) or the watch was off. `judged_steps`: [first, last] step its
    judged intervals held, None where it judged none (or a run.json older than the field)."""
    for d in dirs:
        try:
            watch = json.loads(run_file(d).read_text()).get("watch")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(watch, dict) and isinstance(watch.get("every"), int) and watch["every"] > 0:
            return {
                "every": watch["every"],
                "intervals": watch.get("intervals", 0),
                "judged_steps": _step_range(watch.get("judged_steps")),
                "flags": [f for f in watch.get("flags", []) if _has_ints(f, "rank", "step")],
                "captures": [
                    c
                    for c in watch.get("captures", [])
                    if _has_ints(c, "first", "last", "watch_step") and isinstance(c.get("ranks"), list)
                ],
            }
    return None


def _step_range(value: Any) -> list[int] | None:
    """[first, last] steps, or None for anything else (a hand-edited file may hold anything)."""
    ok = isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) for v in value)
    return value if ok and value[0] <= value[1] else None


def _has_ints(entry: Any, *keys: str) -> bool:
    """An entry of run.json's watch (a hand-edited file may hold anything) with these int fields."""
    return isinstance(entry, dict) and all(isinstance(entry.get(k), int) for k in keys)


def watch_line(watch: dict[str, Any]) -> str:
    """`Watch.summary()` in one line (the training printout): its interval, what it flagged, what it
    captured."""
    text = f"every {watch['every']} steps, {watch['intervals']} interval(s) judged"
    if not watch["flags"]:
        return text + ", no straggler"
    flags = ", ".join(
        f"rank {f['rank']} at step {f['step']}" + (f" ({f['phase']})" if f.get("phase") else "") for f in watch["flags"]
    )
    caps = ", ".join(f"steps {c['first']}-{c['last']}" for c in watch["captures"])
    return f"{text}; straggler(s): {flags}" + (f"; traced {caps}" if caps else "")
