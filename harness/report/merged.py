"""`merged.pt.trace.json.gz`: every rank's events in one Chrome trace, on aligned clocks.

Each rank becomes one process (pid = rank, named "rank R (host)"); each of its original
threads and GPU streams becomes one thread of it. A `collective waits` thread per rank shows,
for each matched collective, how long that rank waited for the last arriver, and flow arrows
link the same collective instance across ranks. Opens in Perfetto UI and chrome://tracing.

What is written (`--merged`): by default a window of consecutive steps that fits
MERGED_BUDGET_BYTES of JSON (`choose_window`), `all`, a step list, or nothing. The report and
the file's `harness_merged` key say which steps it holds.

How: one job per rank, in parallel processes. A job reads only the blocks of its trace that the
parse recorded as overlapping the window (`model.Block`) or holding thread names, moves each
event to the rank's pid, a rank-unique tid and the aligned clock (`_Mover`), and compresses
what it keeps into a raw deflate piece; the pieces become one gzip file (`gzip_pieces`). The
moving is done on the block's bytes by the native rewriter where it is built (`_rewrite.c`:
the rewritten fields are patched, the rest copied, no event becomes an object), else by
decoding each event into `_Copy` (the few fields it rewrites; `args`, names and the rest stay
raw bytes). A trace without a block index (decoded whole: odd layout) is read whole.
"""

from __future__ import annotations

import bisect
from array import array
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msgspec
from msgspec import UNSET, Raw, UnsetType

from harness.atomic import atomic_file
from harness.paths import MERGED_TRACE
from harness.report.gzip_pieces import Piece, PieceWriter, write_gzip
from harness.report.records import MergedRecord
from harness.traces import native
from harness.traces.align.clocks import ClockOffset
from harness.traces.align.waits import InstanceWaits
from harness.traces.analyse.overlap import union
from harness.traces.model import Block, RankTrace
from harness.traces.read.decode import open_trace, thread_key
from harness.traces.read.discover import number_ranges
from harness.traces.read.parse import load_json

# Perfetto UI holds about 2 GB in the browser, at 2-4x the JSON's size once parsed: a JSON of
# ~250 MB is the largest that opens reliably (chrome://tracing gives up earlier, ~300 MB).
MERGED_BUDGET_BYTES = 250_000_000
COMPRESS_LEVEL = 3  # zlib level 3: ~400 MB/s per core on trace JSON, 10% smaller output than level 1

# Thread ids are unique across ranks (rank * TIDS_PER_RANK + n): torch-tb-profiler builds its op
# tree per tid regardless of pid, so equal tids on two ranks would be nested into each other.
TIDS_PER_RANK = 100_000
WAIT_TID = 0  # + rank * TIDS_PER_RANK: the synthetic "collective waits" thread of each rank
COPIED_PHASES = frozenset({"X", "i", "I", "C", "s", "t", "f", "b", "e", "n"})
FLOW_PHASES = frozenset({"s", "t", "f", "b", "e", "n"})


class _Copy(msgspec.Struct, gc=False):
    """An event as copied: the fields rewritten or filtered on are decoded, the others pass
    through as raw JSON; fields outside this list are dropped (no viewer draws them)."""

    ph: Any = UNSET
    cat: Raw | UnsetType = UNSET
    name: Raw | UnsetType = UNSET
    pid: Any = UNSET
    tid: Any = UNSET
    ts: Any = UNSET
    dur: Any = UNSET
    tts: Raw | UnsetType = UNSET
    id: Any = UNSET
    bp: Raw | UnsetType = UNSET
    s: Raw | UnsetType = UNSET
    cname: Raw | UnsetType = UNSET
    args: Raw | UnsetType = UNSET


class _CopyDoc(msgspec.Struct):
    traceEvents: list[_Copy]


_COPY_LIST = msgspec.json.Decoder(list[_Copy])
_COPY_DOC = msgspec.json.Decoder(_CopyDoc)
_ENCODE = msgspec.json.Encoder().encode  # NaN and infinities become null: the output stays JSON


@dataclass(frozen=True)
class MergedChoice:
    """What to write: "auto" (a window within the budget), "all", "none", or the given steps."""

    mode: str = "auto"
    steps: frozenset[int] = frozenset()
    budget_bytes: int = MERGED_BUDGET_BYTES


@dataclass
class Window:
    """The steps the merged trace holds (None: every event of every trace) and why."""

    steps: list[int] | None
    estimated_bytes: int
    note: str


def step_bytes(traces: list[RankTrace]) -> dict[int, float]:
    """Estimated JSON bytes of each step over all ranks.

    1. a rank's bytes per counted event = its trace's JSON size / the events counted in it
       (cpu ops, launches, kernels, copies, annotations: Step.events);
    2. a step's bytes on a rank = its counted events x that rate (the events not counted,
       flows and Python functions, are assumed spread like the counted ones);
    3. summed over the ranks."""
    out: dict[int, float] = {}
    for t in traces:
        if not t.events:
            continue
        rate = t.json_bytes / t.events
        for s in t.steps:
            out[s.number] = out.get(s.number, 0.0) + s.events * rate
    return out


def choose_window(traces: list[RankTrace], budget_bytes: int) -> Window:
    """The consecutive steps around a typical step that fit `budget_bytes` (estimated by
    `step_bytes`).

    1. the steps every rank has, in order (several profiler windows leave gaps in the numbers:
       the steps on either side of a gap are still neighbours here);
    2. the centre: the one whose longest rank-duration is the median (the lower median, so the
       choice is one step of the run, not an outlier);
    3. grow the window one step at a time, after then before, alternately, while the next step
       still fits; a side stops growing at a step that does not fit;
    4. a centre step larger than the budget on its own is still written (one step is the least
       that shows anything) and the note says so."""
    sizes = step_bytes(traces)
    common = sorted(set.intersection(*(set(s.number for s in t.steps) for t in traces))) if traces else []
    if not common:
        return Window(
            steps=None,
            estimated_bytes=int(sum(t.json_bytes for t in traces)),
            note="no step on every rank: whole traces",
        )
    longest = {n: max(s.dur_us for t in traces for s in t.steps if s.number == n) for n in common}
    center = common.index(sorted(common, key=lambda n: (longest[n], n))[(len(common) - 1) // 2])
    lo = hi = center
    total = sizes.get(common[center], 0.0)
    growing = {"after": True, "before": True}
    while any(growing.values()):
        for side in ("after", "before"):
            if not growing[side]:
                continue
            nxt = hi + 1 if side == "after" else lo - 1
            if not 0 <= nxt < len(common) or total + sizes.get(common[nxt], 0.0) > budget_bytes:
                growing[side] = False
                continue
            total += sizes.get(common[nxt], 0.0)
            lo, hi = min(lo, nxt), max(hi, nxt)
    steps = common[lo : hi + 1]
    note = (
        f"step(s) {number_ranges(steps)} of {number_ranges(common)} (~{total / 1e6:.0f} MB of JSON, budget "
        f"{budget_bytes / 1e6:.0f} MB; --merged all|STEPS for others)"
    )
    if total > budget_bytes:
        note = (
            f"step {common[center]} alone is ~{total / 1e6:.0f} MB, over the {budget_bytes / 1e6:.0f} MB budget: "
            "it may not open in a browser"
        )
    return Window(steps=steps, estimated_bytes=int(total), note=note)


def window_for(choice: MergedChoice, traces: list[RankTrace]) -> Window | None:
    """The window `choice` asks for (None: write no merged trace)."""
    if choice.mode == "none":
        return None
    if choice.mode == "all":
        return Window(
            steps=None, estimated_bytes=int(sum(t.json_bytes for t in traces)), note="every event of every trace"
        )
    if choice.mode == "steps":
        sizes = step_bytes(traces)
        steps = sorted(n for n in choice.steps if n in sizes)
        note = (
            f"step(s) {number_ranges(steps)} of those asked for ({number_ranges(sorted(choice.steps))})"
            if steps
            else f"none of the steps asked for ({number_ranges(sorted(choice.steps))}) is in the traces"
        )
        return Window(steps=steps, estimated_bytes=int(sum(sizes[n] for n in steps)), note=note)
    return choose_window(traces, choice.budget_bytes)


@dataclass
class _RankJob:
    rank: int
    paths: list[str]
    blocks: dict[str, list[Block]]
    shift_us: float
    # disjoint [lo, hi) intervals on the trace's own clock, by start; None: everything
    spans_us: list[tuple[float, float]] | None
    level: int = COMPRESS_LEVEL


@dataclass
class _RankPiece:
    piece: Piece
    tids: dict[tuple[Any, Any], int] = field(default_factory=dict)
    events: int = 0


def _tid(rank: int, n: int) -> int:
    return rank * TIDS_PER_RANK + n


def _labels(events: list[_Copy], procs: dict[Any, str], threads: dict[tuple[Any, Any], str]) -> None:
    for e in events:
        if e.ph != "M" or e.name is UNSET or e.args is UNSET:
            continue
        try:
            kind, args = msgspec.json.decode(e.name), msgspec.json.decode(e.args)
        except msgspec.DecodeError:
            continue
        name = args.get("name") if isinstance(args, dict) else None
        if not name:
            continue
        if kind == "process_name":
            procs[thread_key(e.pid)] = str(name)
        elif kind == "thread_name":
            threads[(thread_key(e.pid), thread_key(e.tid))] = str(name)


def _read(fh: Any, b: Block) -> bytes:
    fh.seek(b.start)
    return fh.read(b.end - b.start)


def _decode_block(data: bytes) -> list[_Copy]:
    return _COPY_LIST.decode(b"[" + data + b"]")


def _whole(path: Path) -> list[_Copy]:
    """Every event of a file without a block index; odd events (not objects, odd field
    types) are converted one by one and dropped when they do not fit."""
    try:
        with open_trace(path) as fh:
            return _COPY_DOC.decode(fh.read()).traceEvents
    except (msgspec.DecodeError, msgspec.ValidationError):
        out = []
        for e in load_json(path).get("traceEvents") or []:
            if isinstance(e, dict):
                try:
                    out.append(msgspec.json.decode(_ENCODE(e), type=_Copy))
                except (msgspec.DecodeError, msgspec.ValidationError):
                    pass
        return out


class _Mover:
    """One rank's events moved onto the merged trace: the window filter, the rank's pid, a
    rank-unique tid per original (pid, tid), the aligned clock, rank-unique flow ids.

    `block` does it on a block's bytes with the native rewriter (`_rewrite.c`, the same rules)
    when it is built and the block is within its shape; else, and for `events`, the Python loop
    over decoded `_Copy` events. Either returns the kept events as JSON (b",\n" + events), b""
    when none."""

    def __init__(self, job: _RankJob) -> None:
        self.rank, self.shift = job.rank, job.shift_us
        spans = job.spans_us
        self.starts = array("d", [lo for lo, _ in spans]) if spans is not None else None
        self.ends = array("d", [hi for _, hi in spans]) if spans is not None else None
        self.tids: dict[tuple[Any, Any], int] = {}
        self.procs: dict[Any, str] = {}  # labels of the file being read
        self.threads: dict[tuple[Any, Any], str] = {}
        self.kept = 0
        self.rewrite = native.function("rewrite")

    def _new_thread(self, key: tuple[Any, Any]) -> _Copy:
        """Number a (pid, tid) key not seen yet; its thread-name event."""
        tid = self.tids[key] = _tid(self.rank, len(self.tids) + 1)
        label = f"{self.procs.get(key[0], f'pid {key[0]}')} / {self.threads.get(key, f'tid {key[1]}')}"
        return _Copy(ph="M", name=Raw(b'"thread_name"'), pid=self.rank, tid=tid, args=Raw(_ENCODE({"name": label})))

    def block(self, data: bytes) -> bytes:
        if self.rewrite is not None:
            got = self.rewrite(
                data,
                0,
                len(data),
                self.rank,
                self.shift,
                self.starts,
                self.ends,
                self.tids,
                lambda key: _ENCODE(self._new_thread(key)),
            )
            if got is not None:
                self.kept += got[1]
                return got[0]
        return self.events(_decode_block(data))

    def events(self, events: list[_Copy]) -> bytes:
        rank, shift, tids = self.rank, self.shift, self.tids
        starts, ends = self.starts, cast(array, self.ends)  # both set, or both None
        n_spans = len(starts) if starts is not None else 0
        keep: list[_Copy] = []
        for e in events:
            ph = e.ph
            if type(ph) is not str or ph not in COPIED_PHASES:
                continue
            ts = e.ts
            if type(ts) is not float and type(ts) is not int:
                ts = None
            if starts is not None:  # slices that overlap a span, instants inside one
                if ts is None:
                    continue
                i = bisect.bisect_right(starts, ts) - 1  # the last span starting by ts
                if i < 0 or ts >= ends[i]:
                    end = ts
                    if ph == "X":
                        d = e.dur
                        if type(d) is float or type(d) is int:
                            end = ts + d
                    if not (i + 1 < n_spans and end > starts[i + 1]):  # nor reaching into the next
                        continue
            key = (None if e.pid is UNSET else e.pid, None if e.tid is UNSET else e.tid)
            try:
                tid = tids.get(key)
            except TypeError:  # a list or object as pid/tid: keyed by its JSON text, as parse does
                key = (thread_key(key[0]), thread_key(key[1]))
                tid = tids.get(key)
            if tid is None:
                keep.append(self._new_thread(key))
                tid = tids[key]
            e.pid, e.tid = rank, tid
            if ts is not None:
                e.ts = ts + shift
            if ph in FLOW_PHASES and e.id is not UNSET:
                e.id = f"r{rank}-{e.id}"
            keep.append(e)
        self.kept += len(keep)
        return b",\n" + _ENCODE(keep)[1:-1] if keep else b""


def write_rank(job: _RankJob) -> _RankPiece:
    """One rank's events, moved and compressed (see the module docstring); runs in a worker."""
    out = PieceWriter(job.level)
    mover = _Mover(job)
    spans = job.spans_us
    for path in job.paths:
        blocks = job.blocks.get(path)
        mover.procs, mover.threads = {}, {}
        if not blocks:
            events = _whole(Path(path))
            _labels(events, mover.procs, mover.threads)
            out.write(mover.events(events))
            continue
        with open_trace(Path(path)) as fh:
            meta = {b.start: _read(fh, b) for b in blocks if b.meta}
            for data in meta.values():
                _labels(_decode_block(data), mover.procs, mover.threads)
            # a block without X events has no known times: read it
            for b in blocks:
                if (
                    spans is None
                    or b.first_ts is None
                    or b.last_end is None
                    or any(b.first_ts < hi and b.last_end >= lo for lo, hi in spans)
                ):
                    out.write(mover.block(meta.pop(b.start) if b.start in meta else _read(fh, b)))
    return _RankPiece(piece=out.finish(), tids=mover.tids, events=mover.kept)


def _head(ranks: list[tuple[int, str]], window: Window) -> Piece:
    meta = {"steps": window.steps, "note": window.note}
    w = PieceWriter(COMPRESS_LEVEL)
    w.write(
        b'{"schemaVersion":1,"displayTimeUnit":"ms","traceName":"merged by harness.collect","harness_merged":'
        + _ENCODE(meta)
        + b',"traceEvents":[\n'
    )
    first = True
    for r, host in ranks:
        for e in (
            {"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r} ({host})"}},
            {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}},
            {
                "ph": "M",
                "name": "thread_name",
                "pid": r,
                "tid": _tid(r, WAIT_TID),
                "args": {"name": "collective waits"},
            },
        ):
            w.write((b"" if first else b",\n") + _ENCODE(e))
            first = False
    return w.finish()


def _waits(waits: list[InstanceWaits], window: Window, tids: dict[int, dict[tuple[Any, Any], int]]) -> Piece:
    """The `collective waits` slices and the flow arrows joining each collective's ranks."""
    keep = None if window.steps is None else set(window.steps)
    w = PieceWriter(COMPRESS_LEVEL)
    events: list[dict[str, Any]] = []
    for wt in waits:
        if keep is not None and wt.step not in keep:
            continue
        last_rank, last = wt.last_rank, wt.last_arrival_us
        for r, t in wt.arrival_us.items():
            if last - t > 0:
                events.append(
                    {
                        "ph": "X",
                        "cat": "collective_wait",
                        "name": f"wait {wt.name} (rank {last_rank} last)",
                        "pid": r,
                        "tid": _tid(r, WAIT_TID),
                        "ts": t,
                        "dur": last - t,
                        "args": {"collective": wt.name, "step": wt.step, "last_rank": last_rank},
                    }
                )
        order = sorted(wt.arrival_us, key=lambda r: (wt.arrival_us[r], r))
        for i, r in enumerate(order):
            tid = tids.get(r, {}).get(wt.instance.ops[r].thread)
            if tid is None:
                continue
            ph = "s" if i == 0 else ("f" if i == len(order) - 1 else "t")
            events.append(
                {
                    "ph": ph,
                    "cat": "collective",
                    "name": wt.name,
                    "id": f"coll-{wt.index}",
                    "pid": r,
                    "tid": tid,
                    "ts": wt.arrival_us[r] + 0.001,
                    "bp": "e",
                }
            )
    if events:
        w.write(b",\n" + _ENCODE(events)[1:-1])
    w.write(b"\n]}\n")
    return w.finish()


def step_spans(trace: RankTrace, keep: set[int]) -> list[tuple[float, float]]:
    """The time of the steps in `keep` on the trace's own clock, as disjoint intervals by start:
    each step from its start to its end or the end of the device work it launched, whichever is
    later (GPU work runs behind the host); overlapping or touching intervals joined (`union`)."""
    end_of = {s.number: s.end_us for s in trace.steps if s.number in keep}
    for s in trace.steps:
        b = s.cover.work_end_us if s.cover is not None else None
        if s.number in end_of and b is not None and b > end_of[s.number]:
            end_of[s.number] = b
    for c in trace.comms:
        if c.step in end_of and c.end_us > end_of[c.step]:
            end_of[c.step] = c.end_us
    return union([(s.start_us, end_of[s.number]) for s in trace.steps if s.number in keep])


def rank_jobs(ranks: list[RankTrace], offsets: dict[int, ClockOffset], window: Window) -> list[_RankJob]:
    """One job per rank of `ranks` (as parsed, on their own clocks): its files, block index, the
    shift onto the aligned clock (the common epoch of `align_ranks`, then the rank's clock offset)
    and the window on its own clock."""
    base = min(t.base_us for t in ranks)
    keep = None if window.steps is None else set(window.steps)
    jobs = []
    for trace in ranks:
        jobs.append(
            _RankJob(
                rank=trace.rank,
                paths=trace.paths,
                blocks=trace.blocks,
                shift_us=(trace.base_us - base) - offsets[trace.rank].offset_us,
                spans_us=None if keep is None else step_spans(trace, keep),
            )
        )
    return jobs


@dataclass
class MergedResult:
    path: Path
    window: Window
    json_bytes: int  # uncompressed
    gz_bytes: int
    events: int


@dataclass
class MergedWriting:
    """A merged trace under way: the rank jobs started on the pool (or run by `finish_merged`
    when there is none), while the caller goes on with the analysis; only the `collective
    waits` piece, written last, needs the analysis's result (its waits)."""

    ranks: list[tuple[int, str]]  # (rank, host) of each, for the process names
    window: Window
    jobs: list[_RankJob]
    futures: list[Future[_RankPiece]] | None


def start_merged(
    ranks: list[RankTrace], offsets: dict[int, ClockOffset], window: Window, pool: Executor | None = None
) -> MergedWriting:
    """Start writing the merged trace of `window`: one job per rank on `pool` when given (the
    jobs need only the parsed ranks and the clock offsets, so they run beside the rest of the
    analysis)."""
    jobs = rank_jobs(ranks, offsets, window)
    futures = [pool.submit(write_rank, j) for j in jobs] if pool is not None and len(jobs) > 1 else None
    return MergedWriting(ranks=[(t.rank, t.host) for t in ranks], window=window, jobs=jobs, futures=futures)


def finish_merged(writing: MergedWriting, waits: list[InstanceWaits], out: Path) -> MergedResult:
    """Wait for the rank pieces, then write the head, the pieces in rank order and the waits
    piece into `out`'s merged trace as one gzip file (`out` must exist)."""
    jobs, window = writing.jobs, writing.window
    results = [f.result() for f in writing.futures] if writing.futures is not None else [write_rank(j) for j in jobs]
    tids = {j.rank: r.tids for j, r in zip(jobs, results)}
    path = out / MERGED_TRACE
    with atomic_file(path) as fh:
        size = write_gzip(fh, [_head(writing.ranks, window), *(r.piece for r in results), _waits(waits, window, tids)])
    return MergedResult(
        path=path, window=window, json_bytes=size, gz_bytes=path.stat().st_size, events=sum(r.events for r in results)
    )


def merged_entry(result: MergedResult) -> MergedRecord:
    """The report's `merged` entry."""
    return MergedRecord(
        file=result.path.name,
        steps=result.window.steps,
        note=result.window.note,
        estimated_bytes=result.window.estimated_bytes,
        json_bytes=result.json_bytes,
        gz_bytes=result.gz_bytes,
        events=result.events,
    )
