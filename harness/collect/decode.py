"""Decode a Kineto/Chrome trace file into typed events, keeping only what the collector reads.

Parsing is most of the collector's cost, and most of a trace's bytes are `args` the analysis
never reads. msgspec decodes straight into `Event` structs and skips every other field without
building Python objects for it. Measured on the 54 MB real trace in ../shared/traces (see
bench/RESULTS.md): json.loads into dicts 0.63 s, msgspec into these structs about 0.15 s.

A trace whose events do not fit the structs (an event that is not an object, `args` that is not
an object) is decoded generically and converted event by event; what still does not fit is
dropped and counted, never fatal.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Any

import msgspec

from harness.paths import TRACE_METADATA_KEY


class TraceError(ValueError):
    """A file that cannot be read as a profiler trace; the message says which and why."""


class Args(msgspec.Struct, gc=False):
    """The event args the analysis reads (kernel launch correlation, NCCL collective identity)."""

    correlation: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    process_group: Any = msgspec.field(default=None, name="Process Group Name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    dtype: Any = None


NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One trace event. Raw fields are loosely typed so odd producers (string timestamps,
    numeric names) decode; `complete_events` turns the usable ones into clean values.
    gc=False: events hold no reference cycles, so the garbage collector need not track them
    (16 bytes less each, and no collector passes over millions of them)."""

    ph: Any = None
    name: Any = ""
    cat: Any = ""
    # float first: msgspec then decodes every JSON number (ints too) straight into a float
    ts: float | str | None = None
    dur: float | str | None = None
    pid: Any = None
    tid: Any = None
    args: Args | None = None


class _Doc(msgspec.Struct):
    traceEvents: list[Event]
    distributedInfo: Any = None
    harness: Any = msgspec.field(default=None, name=TRACE_METADATA_KEY)
    host_name: Any = None
    baseTimeNanoseconds: Any = None


class _LooseDoc(msgspec.Struct):
    traceEvents: list[Any]
    distributedInfo: Any = None
    harness: Any = msgspec.field(default=None, name=TRACE_METADATA_KEY)
    host_name: Any = None
    baseTimeNanoseconds: Any = None


class Trace(msgspec.Struct):
    """The decoded document: complete events plus the top-level fields the parser reads."""

    events: list[Event]
    distributed_info: dict[str, Any] | None
    meta: dict[str, Any]  # the harness's own top-level key, {} when absent
    host_name: Any
    base_time_ns: Any
    dropped: int = 0  # events that could not be decoded at all


_DECODER = msgspec.json.Decoder(_Doc)
_LOOSE = msgspec.json.Decoder(_LooseDoc)


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes; gzip is recognised by its magic bytes, not the file name."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    if not raw:
        raise TraceError(f"{path}: empty file")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{path}: corrupt or truncated gzip ({exc})") from None
    return raw


def number(v: Any) -> float | None:
    """A JSON number or numeric string as float; anything else (bools too) None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _loose_events(items: list[Any]) -> tuple[list[Event], int]:
    out, dropped = [], 0
    for item in items:
        if not isinstance(item, dict):
            dropped += 1
            continue
        fixed = {k: None for k in ("ts", "dur") if isinstance(item.get(k), bool) or
                 not isinstance(item.get(k), (int, float, str, type(None)))}
        if not isinstance(item.get("args"), (dict, type(None))):
            fixed["args"] = None
        try:
            out.append(msgspec.convert({**item, **fixed} if fixed else item, Event))
        except msgspec.ValidationError:
            dropped += 1
    return out, dropped


def complete_events(events: list[Event]) -> list[Event]:
    """`ph: X` events with numeric ts and a non-negative dur (others cannot be placed in time),
    sorted by start; name and cat as strings, args never None."""
    out = []
    for e in events:
        if e.ph != "X":
            continue
        ts, dur = e.ts, e.dur
        if type(ts) is not float or type(dur) is not float:  # the typed fields made JSON numbers floats
            ts, dur = number(ts), number(dur)
            if ts is None or dur is None:
                continue
            e.ts, e.dur = ts, dur
        if dur < 0:
            continue
        if type(e.name) is not str:
            e.name = "" if e.name is None else str(e.name)
        if type(e.cat) is not str:
            e.cat = "" if e.cat is None else str(e.cat)
        if e.args is None:
            e.args = NO_ARGS
        out.append(e)
    out.sort(key=_start)
    return out


def _start(e: Event) -> float:
    return e.ts


def decode_trace(path: Path) -> Trace:
    """Read and decode one trace file (see the module docstring)."""
    raw = read_bytes(path)
    dropped = 0
    try:
        doc: _Doc | _LooseDoc = _DECODER.decode(raw)
        del raw  # the bytes are as large as the file: free them before the events are sorted
        events = doc.traceEvents
    except msgspec.ValidationError:
        try:
            doc = _LOOSE.decode(raw)
        except msgspec.ValidationError:
            raise TraceError(f"{path}: JSON without a traceEvents list; not a PyTorch profiler trace") from None
        except msgspec.DecodeError as exc:
            raise TraceError(f"{path}: not valid JSON ({exc}); truncated file?") from None
        events, dropped = _loose_events(doc.traceEvents)
    except msgspec.DecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc}); truncated file?") from None
    return Trace(events=complete_events(events),
                 distributed_info=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
                 meta=doc.harness if isinstance(doc.harness, dict) else {},
                 host_name=doc.host_name, base_time_ns=doc.baseTimeNanoseconds, dropped=dropped)
