"""Decode a Kineto/Chrome trace file into typed events, keeping only what the collector reads.

Parsing is most of the collector's cost, and most of a trace's bytes are `args` the analysis
never reads. msgspec decodes straight into `Event` structs and skips every other field without
building Python objects for it. Measured on the 54 MB real trace in ../shared/traces (see
bench/RESULTS.md): json.loads into dicts 0.63 s, msgspec into these structs about 0.15 s.

The events array is streamed (`_stream`: 1 MB blocks cut between events, gzip decompressed as
it is read), and repeated names, categories, pids and tids share one object each, so memory
follows the kept events, not the file (figures in bench/RESULTS.md).

A trace whose events do not fit the structs (an event that is not an object, `args` that is not
an object) is decoded whole and generically, then converted event by event; what still does not
fit is dropped and counted, never fatal.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO

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


class _LooseDoc(_Doc):
    """The same document with events of any shape, converted one by one."""

    traceEvents: list[Any]


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


# Host calls that launch kernels (their args carry the correlation id kernels are matched by).
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime"})
ARGS_CATS = LAUNCH_CATS | {"kernel"}  # the only events whose args are read


def _thread_id(v: Any) -> int | str | float | None:
    """A pid/tid usable as a key: numbers and null as they are, anything else (a list, an
    object) as its JSON text."""
    if v is None or isinstance(v, (int, float, str)):
        return v
    return msgspec.json.encode(v).decode()


def clean_events(events: list[Event], shared: dict[Any, Any] | None = None) -> list[Event]:
    """The `ph: X` events with numeric ts and a non-negative dur (others cannot be placed in
    time); name and cat as strings, args never None. Order kept.

    Memory: names, categories, pids and tids repeat across thousands of events, so each is
    replaced by the one copy held in `shared` (pass the same dict for every batch of one
    trace); args are dropped (NO_ARGS) for every category whose args are not read."""
    shared = {} if shared is None else shared
    keep = shared.setdefault
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
        name, cat = e.name, e.cat
        if type(name) is not str:
            name = "" if name is None else str(name)
        if type(cat) is not str:
            cat = "" if cat is None else str(cat)
        pid, tid = e.pid, e.tid
        if type(pid) is not int and type(pid) is not str:
            pid = _thread_id(pid)
        if type(tid) is not int and type(tid) is not str:
            tid = _thread_id(tid)
        e.name, e.cat, e.pid, e.tid, e.ph = keep(name, name), keep(cat, cat), keep(pid, pid), keep(tid, tid), "X"
        if e.args is None or cat not in ARGS_CATS:
            e.args = NO_ARGS
        out.append(e)
    return out


def complete_events(events: list[Event]) -> list[Event]:
    """`clean_events`, sorted by start."""
    out = clean_events(events)
    out.sort(key=_start)
    return out


def _start(e: Event) -> float:
    return e.ts


# Streaming: the traceEvents array is decoded a block at a time, cut between two events, so
# neither the file's bytes nor the events that are not kept (flows, instants, metadata) are
# ever all in memory at once.
# Measured on an 87 MB trace: 1 MB blocks decode as fast as the whole file (0.52 vs 0.50 s);
# 16 MB blocks were 30% slower (cache).
BLOCK_BYTES = 2**20
HEAD_LIMIT_BYTES = 64 * 2**20  # where "traceEvents" must start for the file to be streamed
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")  # between two objects of the array (or inside one: checked by decoding)
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_EVENT_LIST = msgspec.json.Decoder(list[Event])
_ONE_EVENT = msgspec.json.Decoder(Event)


class _NotStreamable(Exception):
    """The file does not have the layout the streaming decoder relies on: decode it whole."""


def _open(path: Path) -> BinaryIO:
    fh = path.open("rb")
    if fh.read(2) == b"\x1f\x8b":
        fh.close()
        return gzip.open(path, "rb")
    fh.seek(0)
    return fh


def _last_boundary(buf: bytes) -> re.Match[bytes] | None:
    last = None
    for start in (max(0, len(buf) - 2**20), 0):  # the tail first; the whole block if it has none
        for last in _BOUNDARY.finditer(buf, start):
            pass
        if last is not None or start == 0:
            return last
    return last


def _last_event(rest: bytes) -> tuple[Event, bytes]:
    """The event that starts `rest` (`{...} ] tail`) and what follows it: msgspec decodes the
    first value and names the byte where trailing characters begin."""
    try:
        _ONE_EVENT.decode(rest)
    except msgspec.DecodeError as exc:
        found = _TRAILING.search(str(exc))
        end = rest.rfind(b"}", 0, int(found[1])) if found else -1  # the byte after the first trailing one
        if end >= 0:
            try:
                return _ONE_EVENT.decode(rest[:end + 1]), rest[end + 1:].lstrip()
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
    except msgspec.ValidationError:
        pass
    raise _NotStreamable  # no `]` after it, or not an event


def _stream(fh: BinaryIO, block_bytes: int) -> tuple[_Doc, list[Event]]:
    """Decode `{..., "traceEvents": [e, e, ...], ...}` a block at a time.

    1. find `"traceEvents": [` in the first blocks (within HEAD_LIMIT_BYTES); what precedes it
       is the document's head;
    2. read a block, cut after the last `}` that is followed by `,` and `{`, decode the
       elements before the cut as a list of events and keep the clean ones; a cut inside a
       string or a nested array fails to decode and waits for the next block;
    3. at the end of the file the remainder is one last event, `]` and the document's tail:
       the event ends where msgspec reports trailing characters;
    4. the head, `]` and the tail decode as the document's other fields."""
    buf = fh.read(block_bytes)
    m = _EVENTS_KEY.search(buf)
    while m is None and len(buf) < HEAD_LIMIT_BYTES:  # device properties etc. come first
        more = fh.read(block_bytes)
        if not more:
            break
        buf += more
        m = _EVENTS_KEY.search(buf)
    if m is None:
        raise _NotStreamable
    head, buf = buf[:m.end()], buf[m.end():]
    events: list[Event] = []
    shared: dict[Any, Any] = {}
    eof = False
    while True:
        if not eof:
            more = fh.read(block_bytes)
            eof = not more
            buf += more
        cut = _last_boundary(buf)
        if cut is not None:
            try:
                events += clean_events(_EVENT_LIST.decode(b"[" + buf[:cut.start() + 1] + b"]"), shared)
            except msgspec.ValidationError:
                raise _NotStreamable from None  # events of odd shape: the whole-file path handles them
            except msgspec.DecodeError:
                if eof:
                    raise _NotStreamable from None
                continue
            buf = buf[cut.end() - 1:]
        if eof:
            break
    rest = buf.lstrip()
    if not rest.startswith(b"]"):
        last, rest = _last_event(rest)
        events += clean_events([last], shared)
    if not rest.startswith(b"]"):
        raise _NotStreamable
    try:
        doc = _DECODER.decode(head + rest)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise _NotStreamable from None
    return doc, events


def decode_trace(path: Path, block_bytes: int | None = None) -> Trace:
    """Read and decode one trace file (see the module docstring): streamed when its layout
    allows, else whole."""
    try:
        with _open(path) as fh:
            doc, events = _stream(fh, block_bytes or BLOCK_BYTES)
        events.sort(key=_start)
        return _trace(doc, events, dropped=0)
    except (_NotStreamable, OSError, EOFError, zlib.error):
        pass  # odd layout, unreadable or corrupt: the whole-file path decodes it or says why
    return _decode_whole(path)


def _trace(doc: _Doc | _LooseDoc, events: list[Event], dropped: int) -> Trace:
    return Trace(events=events,
                 distributed_info=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
                 meta=doc.harness if isinstance(doc.harness, dict) else {},
                 host_name=doc.host_name, base_time_ns=doc.baseTimeNanoseconds, dropped=dropped)


def _decode_whole(path: Path) -> Trace:
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
    return _trace(doc, complete_events(events), dropped)
