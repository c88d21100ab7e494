"""One field of a torch Flight Recorder entry that several readers take alike: the training
job's watch (watch/arrivals.py) and its trace windows' groups files (traces/read/gloo_groups.py),
and the collector's hang report (traces/analyse/flight.py). Imports nothing, so the training job
loads none of the collector with it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def process_group(entry: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, description) of the entry's process group, or None where the entry has none (an
    older recorder). `process_group` holds both: a list in JSON dumps, a tuple in pickles. The
    name is the same on every rank of the group; the entry's `pg_id` is not (each rank numbers
    only the groups it is in)."""
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) == 2:
        return str(pg[0]), str(pg[1])
    return None
