"""Decode a Kineto/Chrome trace file into typed events, keeping only what the collector reads.

Parsing is most of the collector's cost, and most of a trace's bytes are `args` the analysis
never reads. msgspec decodes straight into `Event` structs and skips every other field without
building Python objects for it: on the 54 MB real trace in tests/data/traces, json.loads into
dicts took 0.63 s and msgspec into these structs about 0.15 s.

The events array is streamed (`_stream`: 1 MB blocks cut between events, gzip decompressed as
it is read; the top-level fields in any order), in time linear in the bytes and memory bounded
by `Limits` whatever the file holds (docs/failures.md, "What the collector refuses"), and each
block's events go straight into `Columns`: parallel arrays of start, duration, name and thread
per kind of event the analysis reads (cpu ops, kernel launches, kernels), names and threads as
indices into one table each. An event then costs 24-36 bytes instead of a Python object's ~200,
so a 2 GB trace fits in a few hundred MB (bench/RESULTS.md, "Many ranks and large traces"). Only
the few annotations (steps, harness phases, gloo ranges) stay objects.

Where the install compiled it (setup.py; a C compiler is all it needs), the native tabler
`_scan.c` fills the same columns straight from each block's bytes, no Python object per event
(faster: bench/RESULTS.md, "The collector against HTA 0.5.0 and traceinsight 0.6.1"); a block it
declines (an escaped name, a string time, malformed JSON: anything outside the narrow shape it
reads) is decoded as above, so the result is the same either way (tests/test_native_scan.py).
HARNESS_NATIVE_SCAN=0 switches it off.

A trace whose events do not fit the structs (an event that is not an object, `args` that is not
an object) is decoded whole and generically, then converted event by event; what still does not
fit is dropped and counted, never fatal.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, cast

import msgspec
import numpy as np

from harness.paths import TRACE_METADATA_KEY
from harness.traces import native
from harness.traces.model import Block


class TraceError(ValueError):
    """A file that cannot be read as a profiler trace; the message says which and why."""


class Args(msgspec.Struct, gc=False):
    """The event args the analysis reads (kernel launch correlation, NCCL collective identity,
    on NCCL kernels and on the host's `record_param_comms` ops)."""

    correlation: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    process_group: Any = msgspec.field(default=None, name="Process Group Name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    dtype: Any = None
    seq: Any = msgspec.field(default=None, name="Seq")


NO_ARGS = Args()


class Event(msgspec.Struct, gc=False):
    """One trace event. Raw fields are loosely typed so odd producers (string timestamps,
    numeric names) decode; `_Tables.add` turns the usable ones into clean values.
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
    deviceProperties: Any = None


class _LooseDoc(_Doc):
    """The same document with events of any shape, converted one by one."""

    traceEvents: list[Any]


@dataclass(eq=True)
class Trace:
    """The decoded document: the events the parser reads, in start order, plus the top-level
    fields it reads."""

    ops: Columns  # cpu_op
    launches: Columns  # host calls that launch kernels or synchronise (LAUNCH_CATS)
    kernels: Columns
    copies: Columns  # gpu_memcpy and gpu_memset
    marks: list[Mark]  # user annotations and ProfilerStep#N, by start
    names: list[str]
    threads: list[tuple[Any, Any]]  # (pid, tid)
    args: list[Args]  # collective args of kernels and cpu ops (Columns.extra indexes them)
    count: int  # complete events of any kind
    first_ts: float  # earliest start over all of them (inf when none)
    last_end: float  # latest end (-inf when none)
    distributed_info: dict[str, Any] | None
    meta: dict[str, Any]  # the harness's own top-level key, {} when absent
    host_name: Any
    base_time_ns: Any
    gpus: int = 0  # entries of the top-level deviceProperties (the GPUs the profiler saw)
    dropped: int = 0  # events that could not be decoded at all
    json_bytes: int = field(default=0, compare=False)  # the (uncompressed) JSON document's size
    # Where each streamed block of events lies in the (uncompressed) file, for the merged
    # trace's writer to read only the blocks it copies; empty when the file was decoded whole.
    blocks: list[Block] = field(default_factory=list, compare=False)
    note: str = field(default="", compare=False)  # one line when the file was decoded whole, and why


_DECODER = msgspec.json.Decoder(_Doc)
_LOOSE = msgspec.json.Decoder(_LooseDoc)


def read_bytes(path: Path, limits: Limits | None = None) -> bytes:
    """The file's JSON bytes, for a whole-file decode; gzip is recognised by its magic bytes, not
    the file name. Refused past Limits.whole_bytes, or when it inflates like a decompression bomb."""
    limits = limits or Limits.from_env()
    parts, size = [], 0
    try:
        with open_trace(path) as fh:
            reader = _Reader(fh, limits)
            while chunk := reader.read(BLOCK_BYTES):
                size += len(chunk)
                if size > limits.whole_bytes:
                    raise TraceError(
                        f"{path}: cannot be streamed and is larger than the {limits.whole_bytes / 2**20:g} MB a "
                        "whole-file decode may take; re-export it with traceEvents at the top level, or raise "
                        "HARNESS_MAX_WHOLE_MB"
                    )
                parts.append(chunk)
    except TooLarge as exc:
        raise TraceError(f"{path}: {exc}") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: corrupt or truncated gzip ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not size:
        raise TraceError(f"{path}: empty file")
    return b"".join(parts)


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
        fixed = {
            k: None
            for k in ("ts", "dur")
            if isinstance(item.get(k), bool) or not isinstance(item.get(k), (int, float, str, type(None)))
        }
        if not isinstance(item.get("args"), (dict, type(None))):
            fixed["args"] = None
        try:
            out.append(msgspec.convert({**item, **fixed} if fixed else item, Event))
        except msgspec.ValidationError:
            dropped += 1
    return out, dropped


# Host calls that launch kernels (their args carry the correlation id kernels are matched by).
LAUNCH_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime"})
COPY_CATS = frozenset({"gpu_memcpy", "gpu_memset"})
# Each category's column group (_Tables.columns): cpu ops, kernel launches, kernels, copies.
OPS, LAUNCHES, KERNELS, COPIES = range(4)
GROUP_OF = {
    "cpu_op": OPS,
    **dict.fromkeys(sorted(LAUNCH_CATS), LAUNCHES),
    "kernel": KERNELS,
    **dict.fromkeys(sorted(COPY_CATS), COPIES),
}
MARK_CAT = "user_annotation"  # annotations (record_function, NVTX through the profiler) become Marks
STEP_PREFIX = "ProfilerStep#"  # and so do steps, whatever their category


def thread_key(v: Any) -> int | str | float | None:
    """A pid/tid usable as a key: numbers and null as they are, anything else (a list, an
    object) as its JSON text."""
    if v is None or isinstance(v, (int, float, str)):
        return v
    return msgspec.json.encode(v).decode()


def _correlation(v: Any) -> int:
    """A correlation id as an int64 (-1: none or unusable)."""
    n = number(v)
    if n is None or n != n or not -(2**63) < n < 2**63:
        return -1
    return int(n)


def as_numpy(column: array) -> np.ndarray:
    """A column as a numpy array sharing its memory."""
    return np.frombuffer(column, dtype=column.typecode)


def is_sorted(seq: array) -> bool:
    """Whether the numeric array never decreases (NaN anywhere: not sorted)."""
    if len(seq) < 2:
        return True
    values = as_numpy(seq)
    return bool(np.all(values[:-1] <= values[1:]))


class Columns:
    """Events of one kind as parallel arrays, in start order once `sort` has run.

    ts/dur in microseconds as in the file; name and thread index `Trace.names` and
    `Trace.threads`; corr is the correlation id (-1: none); extra indexes `Trace.args` (-1: the
    event's args are not kept)."""

    __slots__ = ("ts", "dur", "name", "thread", "corr", "extra")

    def __init__(self) -> None:
        self.ts, self.dur = array("d"), array("d")
        self.name, self.thread, self.extra = array("i"), array("i"), array("i")
        self.corr = array("q")

    def __len__(self) -> int:
        return len(self.ts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Columns) and all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __repr__(self) -> str:
        return f"Columns({len(self)} events)"

    def sort(self) -> Columns:
        """In start order (stable: events starting together keep their file order); kernels
        often come by stream, not by start. NaN starts sort last."""
        if is_sorted(self.ts):
            return self
        order = np.argsort(as_numpy(self.ts), kind="stable")
        out = Columns()
        for k in self.__slots__:
            col = getattr(self, k)
            getattr(out, k).frombytes(as_numpy(col)[order].tobytes())
        return out


class Mark(NamedTuple):
    """A user annotation (steps, harness phases, gloo ranges) or a `ProfilerStep#N` of any kind."""

    ts: float
    dur: float
    name: str
    cat: str
    thread: int  # index into Trace.threads


class _Tables:
    """Accumulates clean events batch by batch into columns (see `add`)."""

    def __init__(self) -> None:
        self.ops, self.launches, self.kernels, self.copies = Columns(), Columns(), Columns(), Columns()
        self.marks: list[Mark] = []
        self.names: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], int] = {}
        self.args: list[Args] = []
        self.count = 0
        self.first_ts = float("inf")
        self.last_end = -float("inf")
        self.blocks: list[Block] = []
        self.json_bytes = 0
        self.dropped = 0  # events that fit no struct (loose blocks)
        self.loose = False  # some block held events of odd shape
        self._batch = (float("inf"), -float("inf"), False)  # the last batch's extent and metadata flag

    def columns(self) -> tuple[Columns, Columns, Columns, Columns]:
        """The column groups in GROUP_OF's numbering."""
        return self.ops, self.launches, self.kernels, self.copies

    def block(self, start: int, end: int) -> None:
        """The last batch handed to `add` came from bytes [start, end) of the file."""
        first, last, meta = self._batch
        self.blocks.append(
            Block(start, end, first, last, meta) if first <= last else Block(start, end, None, None, meta)
        )

    def add_native(self, buf: bytes, start: int, end: int) -> bool:
        """`add` for the events in buf[start:end] without decoding them into objects: the native
        tabler (`_scan.c`, the same rules) does it; False when it declines the block (anything
        outside the shape it reads), and the caller decodes the block for `add` instead."""
        got = native.extension.scan(buf, start, end, self.names, self.threads, len(self.args))
        if got is None:
            return False
        count, first, last, meta, groups, marks, arg_spans = got
        for c, group in zip(self.columns(), groups):
            for k, raw in zip(Columns.__slots__, group):
                getattr(c, k).frombytes(raw)
        self.marks.extend(map(Mark._make, marks))
        # the tabler hands over the spans of kept args only: none is None
        self.args.extend(cast(Args, _ONE_EVENT.decode(buf[a:b]).args) for a, b in arg_spans)
        self.count += count
        self.first_ts, self.last_end = min(self.first_ts, first), max(self.last_end, last)
        self._batch = (first, last, meta)
        return True

    def add(self, events: list[Event]) -> None:  # noqa: C901
        """Keep the `ph: X` events with numeric ts and a non-negative dur (others cannot be
        placed in time): cpu ops, launches and kernels as columns, annotations as `Mark`s,
        everything else only in the count and the time extent. Args are kept (in `args`) only
        when they name a collective: a kernel's, and a cpu op's (`record_param_comms`)."""
        # The hot loop of the collector: locals and bound methods only.
        names, threads, marks = self.names, self.threads, self.marks
        cols = self.columns()
        groups = {
            cat: (
                cols[g].ts.append,
                cols[g].dur.append,
                cols[g].name.append,
                cols[g].thread.append,
                cols[g].corr.append,
                cols[g].extra.append,
            )
            for cat, g in GROUP_OF.items()
        }
        kernel_extra, op_extra = groups["kernel"][5], groups["cpu_op"][5]  # compared by identity below
        count, first_ts, last_end = self.count, self.first_ts, self.last_end
        batch_first, batch_last, meta = float("inf"), -float("inf"), False
        last_key, last_thread = None, -1
        for e in events:
            if e.ph != "X":
                if e.ph == "M":
                    meta = True
                continue
            ts, dur = e.ts, e.dur
            if type(ts) is not float or type(dur) is not float:  # the typed fields made JSON numbers floats
                ts, dur = number(ts), number(dur)
                if ts is None or dur is None:
                    continue
            if dur < 0:
                continue
            name, cat = e.name, e.cat
            if type(name) is not str:
                name = "" if name is None else str(name)
            if type(cat) is not str:
                cat = "" if cat is None else str(cat)
            count += 1
            if ts < batch_first:
                batch_first = ts
            if ts + dur > batch_last:
                batch_last = ts + dur
            group = groups.get(cat)
            is_mark = cat == MARK_CAT or name.startswith(STEP_PREFIX)
            if group is None and not is_mark:
                continue
            pid, tid = e.pid, e.tid
            if type(pid) is not int and type(pid) is not str:
                pid = thread_key(pid)
            if type(tid) is not int and type(tid) is not str:
                tid = thread_key(tid)
            key = (pid, tid)
            if key != last_key:
                last_key, last_thread = key, threads.setdefault(key, len(threads))
            if is_mark:
                marks.append(Mark(ts, dur, name, cat, last_thread))
            if group is None:
                continue
            ts_add, dur_add, name_add, thread_add, corr_add, extra_add = group
            ts_add(ts)
            dur_add(dur)
            n = names.get(name)
            if n is None:
                n = names[name] = len(names)
            name_add(n)
            thread_add(last_thread)
            args = e.args
            if args is None:
                corr_add(-1)
                extra_add(-1)
                continue
            corr = args.correlation
            corr_add(
                -1 if corr is None else corr if type(corr) is int and -(2**63) < corr < 2**63 else _correlation(corr)
            )
            if (
                extra_add is kernel_extra
                and (
                    args.collective is not None
                    or args.process_group is not None
                    or args.in_nelems is not None
                    or args.dtype is not None
                )
            ) or (extra_add is op_extra and args.collective is not None):
                extra_add(len(self.args))
                self.args.append(args)
            else:
                extra_add(-1)
        self.count, self.first_ts, self.last_end = count, min(first_ts, batch_first), max(last_end, batch_last)
        self._batch = (batch_first, batch_last, meta)


# Streaming: the traceEvents array is decoded a block at a time, cut between two events, so
# neither the file's bytes nor the events that are not kept (flows, instants, metadata) are
# ever all in memory at once.
# Measured on an 87 MB trace: 1 MB blocks decode as fast as the whole file (0.52 vs 0.50 s);
# 16 MB blocks were 30% slower (cache).
BLOCK_BYTES = 2**20
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_BYTE = re.compile(r"\(byte (\d+)\)")
_EVENT_LIST = msgspec.json.Decoder(list[Event])
_ANY_LIST = msgspec.json.Decoder(list[Any])
_ONE_EVENT = msgspec.json.Decoder(Event)
_SPACES = b" \t\r\n"
# What decoding a candidate block can raise: msgspec's errors (ValidationError among them), a
# string that is not UTF-8, nesting past the decoder's recursion limit; `_json_fault` reads each.
_DECODE_FAILURES = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
ENDS_EARLY = "not valid JSON: the file ends early (truncated: written by a job that was killed, or copied short)"
TOO_DEEP = "values nested too deep to read"


@dataclass(frozen=True)
class Limits:
    """What one trace file may cost the reader, whatever it holds (docs/failures.md). Each is
    far beyond any real trace and is raised with its environment variable.

    - event_bytes: the most bytes read without an event boundary: one event, or a run of
      whitespace inside or between events (a real event is under a few KB: its args);
    - head_bytes, tail_bytes: the most bytes before `"traceEvents": [` and after its `]` (device
      properties and metadata: KBs in real traces);
    - inflate_ratio: inflated over compressed bytes of a gzip file, judged once `ratio_after_bytes`
      have been inflated. Real traces inflate 13-19x (tests/data/traces), since every event's times
      and ids carry digits that do not repeat; deflate's ceiling is ~1032x, which a decompression bomb of
      whitespace or one repeated event reaches;
    - whole_bytes: the largest file decoded whole when it cannot be streamed (a whole decode holds
      every event as an object: ~2x the file's size)."""

    event_bytes: int = 16 * 2**20
    head_bytes: int = 64 * 2**20
    tail_bytes: int = 64 * 2**20
    inflate_ratio: float = 200.0
    ratio_after_bytes: int = 64 * 2**20
    whole_bytes: int = 2**30

    @staticmethod
    def from_env() -> Limits:
        """The defaults, each raised (or lowered) by its variable: HARNESS_MAX_EVENT_MB,
        HARNESS_MAX_INFLATE_RATIO, HARNESS_MAX_WHOLE_MB. Past head_bytes or tail_bytes the file is
        decoded whole instead, so whole_bytes bounds them."""
        return Limits(
            event_bytes=int(_env_number("HARNESS_MAX_EVENT_MB", 16.0) * 2**20),
            inflate_ratio=_env_number("HARNESS_MAX_INFLATE_RATIO", 200.0),
            whole_bytes=int(_env_number("HARNESS_MAX_WHOLE_MB", 1024.0) * 2**20),
        )


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise TraceError(f"{name}={text!r} is not a positive number; unset it or give one (e.g. {name}={default:g})")
    return value


class TooLarge(Exception):
    """A limit of `Limits` was reached; the message says which and how to raise it (no path)."""


class Malformed(Exception):
    """JSON broken inside the events (the message says where; no path)."""


TraceStream = BinaryIO | gzip.GzipFile  # a trace file as read: plain, or gunzipped on the fly


class NotStreamable(Exception):
    """The file does not have the layout the streaming decoder reads: decode it whole. The
    message says why, for the one line the collector prints."""


def open_trace(path: Path) -> TraceStream:
    """The file as a binary stream, gunzipped when it starts with gzip's magic bytes."""
    fh = path.open("rb")
    if fh.read(2) == b"\x1f\x8b":
        fh.close()
        return gzip.open(path, "rb")
    fh.seek(0)
    return fh


class _Reader:
    """Reads a trace stream and stops a decompression bomb: the gzip file's inflated bytes
    against the compressed bytes consumed (`Limits.inflate_ratio`)."""

    def __init__(self, fh: TraceStream, limits: Limits) -> None:
        self.fh, self.limits, self.inflated = fh, limits, 0
        self.raw = getattr(fh, "fileobj", None)  # a GzipFile's compressed file

    def read(self, n: int) -> bytes:
        data = self.fh.read(n)
        self.inflated += len(data)
        if self.raw is not None and self.inflated >= self.limits.ratio_after_bytes:
            compressed = max(1, self.raw.tell())
            if self.inflated / compressed > self.limits.inflate_ratio:
                raise TooLarge(
                    f"gzip inflates {self.inflated / compressed:.0f}x ({compressed / 2**20:.1f} MB to more than "
                    f"{self.inflated / 2**20:.0f} MB), beyond the {self.limits.inflate_ratio:g}x limit; real traces "
                    "inflate under 20x (a decompression bomb?). If the file is genuine, raise "
                    "HARNESS_MAX_INFLATE_RATIO"
                )
        return data


class _Cut(NamedTuple):
    """Where two events of the array meet: `buf[start]` is the `}` closing the first one,
    `buf[end - 1]` the `{` opening the next."""

    start: int
    end: int


def _last_nonspace(buf: bytes, end: int) -> int:
    """The index of the last byte before `end` that is not JSON whitespace (-1: none), read
    backwards in growing slices so a long run costs its length once, not a Python step per byte."""
    step = 64
    while end > 0:
        lo = max(0, end - step)
        kept = buf[lo:end].rstrip(_SPACES)
        if kept:
            return lo + len(kept) - 1
        end, step = lo, step * 2
    return -1


def _last_boundary(buf: bytes, lo: int) -> _Cut | None:
    """The last `}`, `,`, `{` (whitespace between them allowed) in `buf` whose `{` lies at or
    after `lo` (the bytes before were searched by an earlier call): searched backwards from
    each `{`, so only the new bytes are looked at. A `}` and `,` that end `buf` (whitespace
    after them allowed) are the last boundary too, its `{` not read yet (end = len(buf) + 1): so
    a run of whitespace after an event's comma is dropped as it comes, not held."""
    k = _last_nonspace(buf, len(buf))
    if k >= 0 and buf[k] == 0x2C:  # ','
        k = _last_nonspace(buf, k)
        if k >= 0 and buf[k] == 0x7D:  # '}'
            return _Cut(k, len(buf) + 1)
    pos = len(buf)
    while True:
        j = buf.rfind(b"{", lo, pos)
        if j < 0:
            return None
        k = _last_nonspace(buf, j)
        if k >= 0 and buf[k] == 0x2C:
            k = _last_nonspace(buf, k)
            if k >= 0 and buf[k] == 0x7D:
                return _Cut(k, j + 1)
        pos = j


def _decode_list(candidate: bytes, items: msgspec.json.Decoder) -> tuple[list[Any], bool]:
    """`candidate` (a JSON array) as events: (events, loose). Events of a shape the typed
    decoder refuses (an event that is not an object, args that are not one) come back as plain
    values (loose=True), for `_loose_events`. msgspec's DecodeError passes through."""
    try:
        return items.decode(candidate), False
    except msgspec.ValidationError:
        return _ANY_LIST.decode(candidate), True


def _json_fault(exc: Exception, offset: int) -> Malformed | None:
    """A decode failure of a candidate block as what it says about the file: None when the
    block was cut inside a string or a nested value (msgspec: truncated), which more bytes
    resolve; else the file's JSON is broken at about `offset` plus msgspec's byte."""
    if isinstance(exc, msgspec.DecodeError) and "truncated" in str(exc):
        return None
    if isinstance(exc, msgspec.ValidationError):  # a value no reader can hold (e.g. a number out of range)
        what = str(exc).split(" - at ", 1)[0].lower()
        return Malformed(f"{what} in an event near byte {offset}; not readable as a trace: fix or re-export it")
    if isinstance(exc, UnicodeDecodeError):
        return Malformed(f"not valid JSON near byte {offset}: a string holds bytes that are not UTF-8")
    if isinstance(exc, RecursionError):
        return Malformed(f"near byte {offset}: {TOO_DEEP}")
    found = _BYTE.search(str(exc))
    where = offset + max(0, int(found[1]) - 1) if found else offset
    return Malformed(f"not valid JSON at byte {where} ({str(exc).split(' (byte')[0]})")


def stream_events(  # noqa: C901
    fh: TraceStream,
    block_bytes: int,
    sink: Callable[[list[Any], bool], None],
    items: msgspec.json.Decoder = _EVENT_LIST,
    on_block: Callable[[int, int], None] | None = None,
    native: Callable[[bytes, int, int], bool] | None = None,
    limits: Limits | None = None,
) -> tuple[bytes, int]:
    """Decode `{..., "traceEvents": [e, e, ...], ...}` a block at a time, handing each block's
    events (decoded by `items`; loose=True when some did not fit it) to `sink`, then the
    block's byte range in the stream to `on_block`; returns the document without its events
    (`{head ] tail}`) and the stream's length. `native`, when given, is offered each block's
    bytes first (`_Tables.add_native`); what it declines is decoded. The work is linear in the
    file's bytes and the memory bounded by `limits`, whatever the file holds.

    1. find `"traceEvents": [` (within Limits.head_bytes, the buffer doubled while it is not
       there, so the search is linear); what precedes it is the document's head;
    2. read a block and cut after the last `}` that is followed by `,` and `{`, looking only at
       the bytes no earlier search saw; decode `[` + the elements before the cut + `]`:
       - it decodes: hand the events over, keep the bytes after the cut;
       - msgspec says truncated: the cut lay inside a string or a nested value; read as many
         bytes again as are held (so a long event is re-decoded a logarithmic number of times);
       - msgspec says trailing characters: the array closed before the cut (fields after the
         events, any key order): the events end at that `]`, the rest is the document's tail;
       - anything else: the JSON is broken there (Malformed);
    3. leading whitespace of the held bytes is dropped as it comes (a run of it between events
       costs no memory); more than Limits.event_bytes held without a cut is TooLarge;
    4. at the end of the file the held bytes are the last events, `]` and the tail: decoded as a
       list, which ends where msgspec reports trailing characters;
    5. the tail (at most Limits.tail_bytes) is read to the end; head + tail decode as the
       document's other fields."""
    limits = limits or Limits()
    reader = _Reader(fh, limits)
    buf = reader.read(block_bytes)
    m = _EVENTS_KEY.search(buf)
    while m is None:
        if len(buf) >= limits.head_bytes:
            raise NotStreamable(f"no traceEvents array in its first {len(buf) / 2**20:.0f} MB")
        more = reader.read(max(block_bytes, len(buf)))
        if not more:
            raise NotStreamable("no traceEvents array")
        buf += more
        m = _EVENTS_KEY.search(buf)
    head, buf = buf[: m.end()], buf[m.end() :]
    offset = m.end()  # of buf[0] in the stream
    searched = 0  # buf[:searched] holds no `{` of a cut not yet tried
    want, eof = block_bytes, False

    def hand_over(candidate: bytes, end: int) -> None:
        """Decode `candidate` ([events]) and hand them over; they lie in buf[:end]."""
        if candidate.strip(_SPACES) != b"[]":
            events, loose = _decode_list(candidate, items)
            sink(events, loose)
        if on_block and end > 0:
            on_block(offset, offset + end)

    pending = False  # events were handed over up to a `}` that ended the held bytes: `,` or `]` comes next
    tried = -1  # the `}` at buf[tried] was tried as the end of the held events
    while True:
        if not eof:
            more = reader.read(want)
            eof = not more
            buf += more
        while True:
            kept = buf.lstrip(_SPACES) if buf[:1] in (b" ", b"\t", b"\r", b"\n") else buf
            offset += len(buf) - len(kept)
            searched = max(0, searched - (len(buf) - len(kept)))
            buf = kept
            if not pending or buf[:1] != b",":
                break
            buf, offset, searched, pending = buf[1:], offset + 1, 0, False
        if pending:
            if buf[:1] == b"]":
                return head + _read_tail(reader, buf, eof, block_bytes, limits), reader.inflated
            if buf or eof:
                raise Malformed(
                    f"not valid JSON at byte {offset} (expected ',' or ']' after an event)" if buf else ENDS_EARLY
                )
            continue
        cut = _last_boundary(buf, searched)
        searched = len(buf)
        closed: int | None = None  # index in buf of the events array's `]`, once found
        if cut is not None:
            if native is not None and native(buf, 0, cut.start + 1):
                if on_block:
                    on_block(offset, offset + cut.start + 1)
            else:
                candidate = _bracketed(buf, cut.start + 1)
                try:
                    hand_over(candidate, cut.start + 1)
                except _DECODE_FAILURES as exc:
                    closed = _closed_at(exc, candidate)
                    if closed is None:
                        fault = _json_fault(exc, offset)
                        if fault is not None:
                            raise fault from None
                        # the cut lay inside a value: read as much again (never past the event limit)
                        want = max(block_bytes, min(len(buf), limits.event_bytes - len(buf)))
                    cut = None
        if cut is not None:
            offset += cut.end - 1
            buf = buf[cut.end - 1 :]
            searched, want, tried = len(buf), block_bytes, -1
        elif closed is None and not eof:
            # No cut, and the held bytes end in a `}` and at least a block of whitespace: a run of
            # it after the last event before its `,` or `]`. Hand the events over and drop the run.
            k = _last_nonspace(buf, len(buf))
            if k >= 0 and k != tried and buf[k] == 0x7D and len(buf) - 1 - k >= block_bytes:
                tried = k
                candidate = _bracketed(buf, k + 1)
                try:
                    hand_over(candidate, k + 1)
                except _DECODE_FAILURES as exc:
                    fault = None if _closed_at(exc, candidate) is not None else _json_fault(exc, offset)
                    if fault is not None:
                        raise fault from None
                else:
                    offset, buf, searched, want, tried, pending = offset + len(buf), b"", 0, block_bytes, -1, True
                    continue
        if closed is None and (eof or len(buf) > limits.event_bytes):
            closed = _close(buf, offset, eof, limits)
        if closed is not None:
            try:
                hand_over(_bracketed(buf, closed), _last_nonspace(buf, closed) + 1)
            except _DECODE_FAILURES as exc:
                raise _json_fault(exc, offset) or _malformed(offset) from None
            return head + _read_tail(reader, buf[closed:], eof, block_bytes, limits), reader.inflated


def _bracketed(buf: bytes, end: int) -> bytes:
    """`[` + buf[:end] + `]`, copying the held bytes once (a slice would copy them twice)."""
    return b"".join((b"[", memoryview(buf)[:end], b"]"))


def _malformed(offset: int) -> Malformed:
    return Malformed(f"not valid JSON near byte {offset}")


def _closed_at(exc: Exception, candidate: bytes) -> int | None:
    """Where the events array's `]` lies in the bytes after candidate's leading `[` (`buf`),
    when decoding the candidate list stopped at trailing characters: the list closed there."""
    found = _TRAILING.search(str(exc)) if isinstance(exc, msgspec.DecodeError) else None
    if found is None:
        return None
    return candidate.rfind(b"]", 0, int(found[1]) - 1) - 1  # msgspec's byte is the trailing one's, 1-based


def _close(buf: bytes, offset: int, eof: bool, limits: Limits) -> int:
    """Where in `buf` (the bytes after the last cut) the events array closes, read as the list
    `[` + buf. At the end of the file it must close (else the file ends early); past the event
    limit it may (fields after the events with no cut in them), else the one event held is too
    large."""
    candidate = b"[" + buf
    try:
        _ANY_LIST.decode(candidate)
    except msgspec.DecodeError as exc:
        closed = _closed_at(exc, candidate)
        if closed is not None:
            return closed
        if "truncated" not in str(exc):
            raise _json_fault(exc, offset) or _malformed(offset) from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise _json_fault(exc, offset) or _malformed(offset) from None
    else:  # the list closes at the very end: the document's own `}` is missing
        return candidate.rstrip(_SPACES).rfind(b"]") - 1
    if eof:
        raise Malformed(ENDS_EARLY)
    raise TooLarge(
        f"more than {limits.event_bytes / 2**20:g} MB from byte {offset} on without a break between events: one event "
        "(or a run of whitespace) larger than the limit; if the file is genuine, raise HARNESS_MAX_EVENT_MB"
    )


def _read_tail(reader: _Reader, tail: bytes, eof: bool, block_bytes: int, limits: Limits) -> bytes:
    """The document after the events' `]`, read to the end of the file (at most tail_bytes)."""
    parts, size = [tail], len(tail)
    while True:
        if size > limits.tail_bytes:
            raise NotStreamable(f"more than {limits.tail_bytes / 2**20:g} MB after its events")
        if eof:
            break
        more = reader.read(block_bytes)
        eof = not more
        size += len(more)
        parts.append(more)
    return b"".join(parts)


def native_scan() -> bool:
    """Whether blocks go through the native tabler: built, and not switched off (native.py)."""
    return native.function("scan") is not None


if native.extension is not None:
    native.extension.configure(
        tuple((cat.encode(), g) for cat, g in GROUP_OF.items()), OPS, KERNELS, MARK_CAT.encode(), STEP_PREFIX.encode()
    )


def _stream(fh: TraceStream, block_bytes: int, limits: Limits | None = None) -> tuple[_Doc, _Tables]:
    """The trace's events into `_Tables`, block by block, and its other fields."""
    tables = _Tables()

    def sink(events: list[Any], loose: bool) -> None:
        if loose:  # events of odd shape: converted one by one, what does not fit dropped
            events, dropped = _loose_events(events)
            tables.dropped += dropped
            tables.loose = True
        tables.add(events)

    rest, tables.json_bytes = stream_events(
        fh,
        block_bytes,
        sink,
        on_block=tables.block,
        native=tables.add_native if native_scan() else None,
        limits=limits,
    )
    if tables.loose:
        tables.blocks = []  # the merged trace's writer reads such a file whole, as it reads any odd one
    try:
        return _DECODER.decode(rest), tables
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise NotStreamable("its fields around traceEvents are not a trace's") from None


def decode_trace(path: Path, block_bytes: int | None = None) -> Trace:
    """Read and decode one trace file (see the module docstring): streamed, whatever the order
    of its top-level fields; whole only when it cannot be (no traceEvents array at the top, or
    more after the events than Limits.tail_bytes), which the Trace's `note` says. A file beyond
    a limit or with broken JSON raises TraceError with one line saying where and what to do."""
    limits = Limits.from_env()
    try:
        with open_trace(path) as fh:
            doc, tables = _stream(fh, block_bytes or BLOCK_BYTES, limits)
        return _trace(doc, tables)
    except NotStreamable as exc:
        note = f"{path.name}: not streamable ({exc}); decoded whole"
    except TooLarge as exc:
        raise TraceError(f"{path}: {exc}") from None
    except Malformed as exc:
        raise TraceError(f"{path}: {exc}; not a trace as written by torch.profiler") from None
    except (OSError, EOFError, zlib.error):
        note = ""  # unreadable or corrupt: the whole-file path says which
    trace = _decode_whole(path, limits)
    trace.note = note
    return trace


def _trace(doc: _Doc | _LooseDoc, t: _Tables) -> Trace:
    t.marks.sort(key=lambda m: m.ts)
    return Trace(
        ops=t.ops.sort(),
        launches=t.launches.sort(),
        kernels=t.kernels.sort(),
        copies=t.copies.sort(),
        marks=t.marks,
        names=list(t.names),
        threads=list(t.threads),
        args=t.args,
        count=t.count,
        first_ts=t.first_ts,
        last_end=t.last_end,
        distributed_info=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
        meta=doc.harness if isinstance(doc.harness, dict) else {},
        host_name=doc.host_name,
        base_time_ns=doc.baseTimeNanoseconds,
        gpus=len(doc.deviceProperties) if isinstance(doc.deviceProperties, list) else 0,
        dropped=t.dropped,
        json_bytes=t.json_bytes,
        blocks=t.blocks,
    )


def _json_error(path: Path, exc: msgspec.DecodeError | UnicodeDecodeError) -> str:
    """Malformed JSON, said as what it most likely is: a file that ends early (the job killed
    while writing it, a copy cut short), a string that is not UTF-8, or JSON broken somewhere."""
    if isinstance(exc, UnicodeDecodeError):
        return (
            f"{path}: not valid JSON: a string holds bytes that are not UTF-8; not a trace as written by torch.profiler"
        )
    if "truncated" in str(exc):
        return f"{path}: {ENDS_EARLY}"
    return f"{path}: not valid JSON ({exc}); not a trace as written by torch.profiler"


def _shape_error(path: Path, exc: msgspec.ValidationError) -> str:
    """Why a JSON document is not a trace we can read: no traceEvents list (another kind of
    JSON), or a value no reader can hold (msgspec's words and where, e.g. a number out of range)."""
    text = str(exc)
    if "`traceEvents`" in text or text.endswith("at `$`"):
        return f"{path}: JSON without a traceEvents list; not a PyTorch profiler trace"
    where = text.split(" - at ", 1)
    at = f" at {where[1].replace('[...]', '')}" if len(where) > 1 else ""
    return f"{path}: {where[0].lower()}{at}; not readable as a trace: fix or re-export it"


def _decode_whole(path: Path, limits: Limits | None = None) -> Trace:
    raw = read_bytes(path, limits)
    size = len(raw)
    tables = _Tables()
    try:
        doc: _Doc | _LooseDoc = _DECODER.decode(raw)
    except msgspec.ValidationError:
        try:
            doc = _LOOSE.decode(raw)
        except msgspec.ValidationError as exc:
            raise TraceError(_shape_error(path, exc)) from None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise TraceError(_json_error(path, exc)) from None
        except RecursionError:
            raise TraceError(
                f"{path}: values nested too deep to read; not a trace as written by torch.profiler"
            ) from None
        events, tables.dropped = _loose_events(doc.traceEvents)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # msgspec says bad UTF-8 in a string as the latter
        raise TraceError(_json_error(path, exc)) from None
    except RecursionError:
        raise TraceError(f"{path}: {TOO_DEEP}; not a trace as written by torch.profiler") from None
    else:
        del raw  # the bytes are as large as the file: free them before the events are tabled
        events = doc.traceEvents
    tables.add(events)
    tables.json_bytes = size
    return _trace(doc, tables)
