"""Which process group each of a CPU rank's gloo collectives ran on, from the Flight Recorder.

gloo's trace ranges (`gloo:all_reduce` on a worker thread) carry no process group, so in a job
of several groups (tensor parallelism inside a host, data parallelism across) a collective of
one group cannot be told from one of another by the trace alone. The Flight Recorder names the
group of every collective it records, with the time the collective was issued
(`time_created_ns`, the system clock's), but not the thread it ran on. The training job writes
the recorder's entries of each trace window beside the trace (`<trace>.groups.json`,
harness/run/profiling.py); this module joins the two. Two facts about ProcessGroupGloo carry
the join:

- every process group runs its collectives on worker threads of its own, so all the ranges of
  one worker thread belong to one group;
- a group's work queue is first in, first out: its collectives start in the order they were
  issued, each after it was issued.

The trace's times are the system clock's too once its `baseTimeNanoseconds` is added back
(measured on torch 2.13: a gloo range starts ~0.2 ms after its recorder entry was made).
"""

from __future__ import annotations

import bisect
import json
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.flight_entry import process_group
from harness.paths import WATCH_GROUP_DESC
from harness.traces.read.comm_kernels import canonical_collective

FORMAT = "harness collective groups"
VERSION = 1


def unnamed_groups(info: dict[str, Any] | None, world_size: Any) -> list[list[int]]:
    """The process groups of fewer ranks than the world that this rank is in (distributedInfo's
    pg_config; the harness's own group left out), as sorted rank lists: where a trace's
    collectives carry no group (gloo's ranges and c10d ops on CPU), a collective of one of them
    cannot be told from one of another, and matching them by position across ranks pairs
    different groups' collectives (groups [0, 1] and [2, 3]: rank 0's first with rank 2's)."""
    if not info or not isinstance(world_size, int):
        return []
    out = []
    for g in info.get("pg_config") or []:
        if not isinstance(g, dict) or g.get("pg_desc") == WATCH_GROUP_DESC:
            continue
        ranks = g.get("ranks")
        if isinstance(ranks, list) and 1 < len(ranks) < world_size and all(isinstance(r, int) for r in ranks):
            out.append(sorted(ranks))
    return sorted(out)


@dataclass(frozen=True)
class Issued:
    """One Flight Recorder entry, on the trace's clock: `name` is its collective as the
    collector names them (`allreduce` for the profiling name `gloo:all_reduce`, which its range
    bears too), `group` the process group's name, `desc` its description."""

    created_us: float
    name: str
    group: str
    desc: str


@dataclass(frozen=True)
class Ran:
    """One gloo range of the trace: its worker thread, start and collective (`allreduce`)."""

    thread: Hashable
    start_us: float
    name: str


@dataclass(frozen=True)
class Sidecar:
    """A window's recorder entries as the training job wrote them: `from_ns` is where they are
    complete from (system clock); entries of collectives issued earlier may be missing."""

    from_ns: int
    entries: list[tuple[int, str, str, str]]  # (time_created_ns, profiling name, group name, group desc)

    def issued(self, base_ns: float) -> list[Issued]:
        """The entries on a trace's clock (`base_ns`: its baseTimeNanoseconds), by creation."""
        return sorted(
            (Issued((t - base_ns) / 1e3, collective(name), group, desc) for t, name, group, desc in self.entries),
            key=lambda e: e.created_us,
        )


def collective(profiling_name: str) -> str:
    """`gloo:all_reduce` -> `allreduce`: the backend's prefix dropped, then named as a range's
    collective is (`canonical_collective`)."""
    return canonical_collective(profiling_name.rpartition(":")[2])


def sidecar_doc(from_ns: int, entries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The JSON the training job writes for a window: the recorder's entries issued since
    `from_ns` (as `_dump_fr_trace` gives them), reduced to what the join reads."""
    kept = []
    for e in entries:
        t, pg = e.get("time_created_ns"), process_group(e)
        if isinstance(t, int) and t >= from_ns and pg is not None:
            kept.append([t, str(e.get("profiling_name") or ""), *pg])
    return {"format": FORMAT, "version": VERSION, "from_ns": from_ns, "entries": kept}


def read_sidecar(path: Path) -> Sidecar | str:
    """The sidecar at `path`, or a one-line reason it cannot be used."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path.name}: unreadable ({exc})"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return f"{path.name}: not a version-{VERSION} collective-groups file"
    try:
        entries = [(int(t), str(n), str(g), str(d)) for t, n, g, d in doc["entries"]]
        return Sidecar(from_ns=int(doc["from_ns"]), entries=entries)
    except (KeyError, TypeError, ValueError):
        return f"{path.name}: damaged collective-groups file"


def thread_groups(ranges: Sequence[Ran], issued: Sequence[Issued]) -> dict[Hashable, Issued] | str:
    """Each worker thread's process group (as one of its entries: group and desc), or the
    reason the ranges cannot be given groups.

    1. each range votes for the group of the latest entry of its collective issued at or
       before its start (the one that started it, unless another group's was issued between
       that one and its start: a group whose threads were busy);
    2. a thread's group is the one most of its ranges voted for; a thread with no vote, or a
       tie, is a failure;
    3. check the mapping against first in, first out: a collective issued after the trace's
       first range starts in the trace after it was issued, so for every time t from that
       first range on, a group's entries of a collective issued at or after t cannot outnumber
       its ranges of that collective starting at or after t. A mapping that breaks it (a
       thread given another group's ranges leaves that group's entries without ranges) is a
       failure rather than a guess. Counting from the end, entries the recorder's ring dropped
       early in a long window, and collectives issued before the window, change nothing.
    """
    by_name: dict[str, list[Issued]] = defaultdict(list)
    for e in issued:
        by_name[e.name].append(e)
    times = {name: [e.created_us for e in es] for name, es in by_name.items()}
    votes: dict[Hashable, Counter[str]] = defaultdict(Counter)
    example: dict[str, Issued] = {}
    for r in ranges:
        votes[r.thread]  # every thread is counted, voted for or not
        i = _last_at_or_before(times.get(r.name, []), r.start_us)
        if i >= 0:
            e = by_name[r.name][i]
            votes[r.thread][e.group] += 1
            example.setdefault(e.group, e)
    found: dict[Hashable, Issued] = {}
    for thread, counter in votes.items():
        ranked = counter.most_common(2)
        if not ranked:
            return f"no Flight Recorder entry precedes the gloo ranges of thread {thread}"
        if len(ranked) == 2 and ranked[0][1] == ranked[1][1]:
            a, b = ranked[0][0], ranked[1][0]
            return f"the gloo ranges of thread {thread} are as near to group {a}'s entries as to group {b}'s"
        found[thread] = example[ranked[0][0]]
    broken = _fifo_broken(ranges, issued, found)
    return broken if broken else found


def _fifo_broken(ranges: Sequence[Ran], issued: Sequence[Issued], found: dict[Hashable, Issued]) -> str | None:
    if not ranges:
        return None
    first_us = min(r.start_us for r in ranges)
    # (time, 0 = a range, which counts before an entry issued at the same time, group, collective)
    events = [(r.start_us, 0, found[r.thread].group, r.name) for r in ranges]
    events += [(e.created_us, 1, e.group, e.name) for e in issued if e.created_us >= first_us]
    balance: Counter[tuple[str, str]] = Counter()
    for t, kind, group, name in sorted(events, key=lambda ev: (-ev[0], ev[1])):
        balance[group, name] += 1 if kind == 0 else -1
        if balance[group, name] < 0:
            return f"group {group}'s {name} issued at {t:.0f} us has no range left to have run as"
    return None


def _last_at_or_before(times: list[float], t: float) -> int:
    """Index of the last of the sorted `times` at or before `t`, -1 if none."""
    return bisect.bisect_right(times, t) - 1
