"""`merged.pt.trace.json.gz`: every rank's events in one Chrome trace, on aligned clocks.

Each rank becomes one process (pid = rank, named "rank R (host)"); each of its original
threads and GPU streams becomes one thread of it. A `collective waits` thread per rank shows,
for each matched collective, how long that rank waited for the last arriver, and flow arrows
link the same collective instance across ranks. Opens in Perfetto UI and chrome://tracing.

Written event by event into a gzip stream, one rank's raw trace in memory at a time.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, TextIO

from harness.collect.analysis import Analysis
from harness.collect.parse import load_json

# Thread ids are unique across ranks (rank * TIDS_PER_RANK + n): torch-tb-profiler builds its op
# tree per tid regardless of pid, so equal tids on two ranks would be nested into each other.
TIDS_PER_RANK = 100_000
WAIT_TID = 0  # + rank * TIDS_PER_RANK: the synthetic "collective waits" thread of each rank
COPIED_PHASES = {"X", "i", "I", "C", "s", "t", "f", "b", "e", "n"}


class _Writer:
    def __init__(self, fh: TextIO) -> None:
        self.fh = fh
        self.first = True

    def event(self, e: dict[str, Any]) -> None:
        self.fh.write(("" if self.first else ",\n") + json.dumps(e, separators=(",", ":")))
        self.first = False


def _labels(events: list[Any]) -> tuple[dict[Any, str], dict[tuple[Any, Any], str]]:
    procs: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name" and name:
                procs[e.get("pid")] = str(name)
            elif e.get("name") == "thread_name" and name:
                threads[(e.get("pid"), e.get("tid"))] = str(name)
    return procs, threads


def _tid(rank: int, n: int) -> int:
    return rank * TIDS_PER_RANK + n


def write_merged(a: Analysis, out: Path) -> Path:
    """Write the merged trace next to the report; returns its path."""
    path = out / "merged.pt.trace.json.gz"
    tmp = path.with_name(path.name + ".partial")
    base = min(t.base_us for t in a.runset.ranks)
    tids: dict[int, dict[tuple[Any, Any], int]] = {}
    with gzip.open(tmp, "wt", compresslevel=3) as fh:
        fh.write('{"schemaVersion":1,"displayTimeUnit":"ms","traceName":"merged by harness.collect","traceEvents":[\n')
        w = _Writer(fh)
        for trace in a.runset.ranks:
            rank = trace.rank
            shift = (trace.base_us - base) - a.offsets[rank].offset_us
            w.event({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} ({trace.host})"}})
            w.event({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
            w.event({"ph": "M", "name": "thread_name", "pid": rank, "tid": _tid(rank, WAIT_TID), "args": {"name": "collective waits"}})
            mapping = tids.setdefault(rank, {})
            for part in trace.path.split(", "):
                doc = load_json(Path(part))
                events = doc["traceEvents"]
                procs, threads = _labels(events)
                for e in events:
                    if not isinstance(e, dict) or e.get("ph") not in COPIED_PHASES:
                        continue
                    key = (e.get("pid"), e.get("tid"))
                    if key not in mapping:
                        mapping[key] = _tid(rank, len(mapping) + 1)
                        label = f"{procs.get(key[0], f'pid {key[0]}')} / {threads.get(key, f'tid {key[1]}')}"
                        w.event({"ph": "M", "name": "thread_name", "pid": rank, "tid": mapping[key], "args": {"name": label}})
                    e = dict(e, pid=rank, tid=mapping[key])
                    if isinstance(e.get("ts"), (int, float)):
                        e["ts"] = e["ts"] + shift
                    if "id" in e and e.get("ph") in ("s", "t", "f", "b", "e", "n"):
                        e["id"] = f"r{rank}-{e['id']}"
                    w.event(e)
                del doc, events
        for n, inst in enumerate(a.instances):
            arrival = {r: op.start_us - a.offsets[r].offset_us for r, op in inst.ops.items()}
            last_rank = max(arrival, key=arrival.get)
            last = arrival[last_rank]
            for r, t in arrival.items():
                if last - t > 0:
                    w.event({"ph": "X", "cat": "collective_wait", "name": f"wait {inst.name} (rank {last_rank} last)",
                             "pid": r, "tid": _tid(r, WAIT_TID), "ts": t, "dur": last - t,
                             "args": {"collective": inst.name, "step": inst.step, "last_rank": last_rank}})
            order = sorted(inst.ops, key=lambda r: arrival[r])
            for i, r in enumerate(order):
                op = inst.ops[r]
                tid = tids.get(r, {}).get(op.thread)
                if tid is None:
                    continue
                ph = "s" if i == 0 else ("f" if i == len(order) - 1 else "t")
                w.event({"ph": ph, "cat": "collective", "name": inst.name, "id": f"coll-{n}", "pid": r, "tid": tid,
                         "ts": op.start_us - a.offsets[r].offset_us + 0.001, "bp": "e"})
        fh.write("\n]}\n")
    tmp.replace(path)
    return path
