"""`merged.pt.trace.json.gz`: every rank's events in one Chrome trace, on aligned clocks.

Each rank becomes one process (pid = rank, named "rank R (host)"); each of its original
threads and GPU streams becomes one thread of it. A `collective waits` thread per rank shows,
for each matched collective, how long that rank waited for the last arriver, and flow arrows
link the same collective instance across ranks. Opens in Perfetto UI and chrome://tracing.

Written event by event into a gzip stream; each trace is streamed twice in 1 MB blocks (thread
and process names first, which Kineto writes last, then the events), so memory does not grow
with the traces' size. A trace the streaming decoder cannot cut is read whole.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable

import msgspec

from harness.collect.analysis import Analysis
from harness.collect.decode import BLOCK_BYTES, NotStreamable, open_trace, stream_events, thread_key
from harness.collect.parse import load_json

# Thread ids are unique across ranks (rank * TIDS_PER_RANK + n): torch-tb-profiler builds its op
# tree per tid regardless of pid, so equal tids on two ranks would be nested into each other.
TIDS_PER_RANK = 100_000
WAIT_TID = 0  # + rank * TIDS_PER_RANK: the synthetic "collective waits" thread of each rank
COPIED_PHASES = {"X", "i", "I", "C", "s", "t", "f", "b", "e", "n"}


_ANY_LIST = msgspec.json.Decoder(list)
_ANY = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder().encode  # NaN and infinities become null: the output stays JSON


class _Writer:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.first = True

    def event(self, e: dict[str, Any]) -> None:
        if not self.first:
            self.fh.write(b",\n")
        self.fh.write(_ENCODE(e))
        self.first = False


def _each_block(path: Path, sink: Callable[[list[Any]], None], stream: bool = True) -> bool:
    """Hand the trace's events to `sink` block by block (streamed: returns True), or all at
    once when `stream` is False or the file cannot be cut (returns False)."""
    if stream:
        try:
            with open_trace(path) as fh:
                stream_events(fh, BLOCK_BYTES, sink, _ANY_LIST, _ANY)
            return True
        except (NotStreamable, OSError, EOFError, zlib.error):
            pass  # the labels pass may see blocks twice (harmless); the copy pass streams only if it did
    sink(load_json(path)["traceEvents"])
    return False


class _Labels:
    """Process and thread names from the trace's `ph: M` events."""

    def __init__(self) -> None:
        self.procs: dict[Any, str] = {}
        self.threads: dict[tuple[Any, Any], str] = {}

    def __call__(self, events: list[Any]) -> None:
        for e in events:
            if isinstance(e, dict) and e.get("ph") == "M":
                name = (e.get("args") or {}).get("name") if isinstance(e.get("args"), dict) else None
                key = thread_key(e.get("pid")), thread_key(e.get("tid"))
                if e.get("name") == "process_name" and name:
                    self.procs[key[0]] = str(name)
                elif e.get("name") == "thread_name" and name:
                    self.threads[key] = str(name)



def _tid(rank: int, n: int) -> int:
    return rank * TIDS_PER_RANK + n


class _Copier:
    """Copies one rank's events into the merged trace: its pid becomes the rank, each of its
    (pid, tid) a thread of that rank, times shifted onto the aligned clock, flow ids made
    unique per rank."""

    def __init__(self, w: _Writer, rank: int, shift_us: float, mapping: dict[tuple[Any, Any], int],
                 labels: _Labels) -> None:
        self.w, self.rank, self.shift_us, self.mapping, self.labels = w, rank, shift_us, mapping, labels

    def __call__(self, events: list[Any]) -> None:
        rank, mapping, w = self.rank, self.mapping, self.w
        for e in events:
            if not isinstance(e, dict) or e.get("ph") not in COPIED_PHASES:
                continue
            key = (thread_key(e.get("pid")), thread_key(e.get("tid")))
            if key not in mapping:
                mapping[key] = _tid(rank, len(mapping) + 1)
                label = f"{self.labels.procs.get(key[0], f'pid {key[0]}')} / {self.labels.threads.get(key, f'tid {key[1]}')}"
                w.event({"ph": "M", "name": "thread_name", "pid": rank, "tid": mapping[key], "args": {"name": label}})
            e["pid"], e["tid"] = rank, mapping[key]
            ts = e.get("ts")
            if isinstance(ts, (int, float)) and not isinstance(ts, bool):
                e["ts"] = ts + self.shift_us
            if "id" in e and e.get("ph") in ("s", "t", "f", "b", "e", "n"):
                e["id"] = f"r{rank}-{e['id']}"
            w.event(e)


def write_merged(a: Analysis, out: Path) -> Path:
    """Write the merged trace next to the report; returns its path."""
    path = out / "merged.pt.trace.json.gz"
    tmp = path.with_name(path.name + ".partial")
    base = min(t.base_us for t in a.runset.ranks)
    tids: dict[int, dict[tuple[Any, Any], int]] = {}
    with gzip.open(tmp, "wb", compresslevel=3) as fh:
        fh.write(b'{"schemaVersion":1,"displayTimeUnit":"ms","traceName":"merged by harness.collect","traceEvents":[\n')
        writer = _Writer(fh)
        for trace in a.runset.ranks:
            rank = trace.rank
            shift = (trace.base_us - base) - a.offsets[rank].offset_us
            writer.event({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} ({trace.host})"}})
            writer.event({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
            writer.event({"ph": "M", "name": "thread_name", "pid": rank, "tid": _tid(rank, WAIT_TID), "args": {"name": "collective waits"}})
            mapping = tids.setdefault(rank, {})
            for part in trace.path.split(", "):
                labels = _Labels()
                streamed = _each_block(Path(part), labels)
                _each_block(Path(part), _Copier(writer, rank, shift, mapping, labels), stream=streamed)
        for w in a.waits:
            last_rank, last = w.last_rank, w.last_arrival_us
            for r, t in w.arrival_us.items():
                if last - t > 0:
                    w_ev = {"ph": "X", "cat": "collective_wait", "name": f"wait {w.name} (rank {last_rank} last)",
                            "pid": r, "tid": _tid(r, WAIT_TID), "ts": t, "dur": last - t,
                            "args": {"collective": w.name, "step": w.step, "last_rank": last_rank}}
                    writer.event(w_ev)
            order = sorted(w.arrival_us, key=lambda r: (w.arrival_us[r], r))
            for i, r in enumerate(order):
                op = w.instance.ops[r]
                tid = tids.get(r, {}).get(op.thread)
                if tid is None:
                    continue
                ph = "s" if i == 0 else ("f" if i == len(order) - 1 else "t")
                writer.event({"ph": ph, "cat": "collective", "name": w.name, "id": f"coll-{w.index}", "pid": r,
                              "tid": tid, "ts": w.arrival_us[r] + 0.001, "bp": "e"})
        fh.write(b"\n]}\n")
    tmp.replace(path)
    return path
