"""Parsed, per-rank view of a trace: what every analysis reads. No torch, no I/O.

Times are microseconds on the rank's own clock, already shifted so that every rank of a run
shares one epoch (see `parse.py`); clock alignment between hosts is applied later.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from harness.traces.read.compact import Named, Pieces

Interval = tuple[float, float]  # (start_us, end_us)
Busy = tuple[float, float, "int | None"]  # (start_us, end_us, step that launched it or None): merged per step


class Block(NamedTuple):
    """A run of whole events in a trace file: bytes [start, end) of the uncompressed JSON, the
    earliest start and latest end of its `ph: X` events (None: it has none), and whether it
    holds metadata (`ph: M`: process and thread names)."""

    start: int
    end: int
    first_ts: float | None
    last_end: float | None
    meta: bool


def number_by_group(comms: list[CommOp]) -> None:
    """Set each op's `seq`: its position among its process group's ops (comms sorted by time)."""
    counters: dict[str, int] = {}
    for c in comms:
        c.seq = counters.get(c.pg, 0)
        counters[c.pg] = c.seq + 1


@dataclass
class Shared:
    """What the ranks of one collection hold once between them (`compact`): each name's first
    copy, and each tuple (of names, or a thread's ids) first seen."""

    names: dict[str, str] = field(default_factory=dict)
    tuples: dict[tuple, tuple] = field(default_factory=dict)


V = TypeVar("V")


def compact(trace: RankTrace, shared: Shared) -> RankTrace:
    """Make `trace` hold what it shares with the ranks already read (`shared`) once, and its
    per-name times and covers' intervals as arrays (`compact.py`). Every rank parsed apart (in
    another process, or from its own summary) arrives with its own copies of the same kernel and
    op names, often hundreds of bytes each (C++ template signatures), in the same order from rank
    to rank, and its times as float objects:
    1. every name (collective, process group, host, phase, kernel or op) -> its first copy;
    2. each collective's run-up and each step's compute by name -> a `Named` whose tuple of names
       is the first tuple of the same names; each collective's thread ids -> their first tuple;
    3. each step's cover's intervals (compute under communication, idle) -> `Pieces`.
    The values are untouched. Sharing the names took a parsed rank of the 128-rank DLRM set of
    summaries from 119 to 45 KB; the times as arrays are 8 bytes a time instead of ~75."""
    names, tuples = shared.names, shared.tuples

    def keyed(d: Mapping[str, V]) -> dict[str, V]:
        return {names.setdefault(k, k): v for k, v in d.items()}

    for c in trace.comms:
        c.name, c.pg = names.setdefault(c.name, c.name), names.setdefault(c.pg, c.pg)
        c.thread = tuples.setdefault(c.thread, c.thread)
        c.run_up_us = Named.of(c.run_up_us, tuples, names)
    for st in trace.steps:
        st.phases_us = keyed(st.phases_us)
        st.syncs_by_caller = keyed(st.syncs_by_caller)
        st.sync_us_by_caller = keyed(st.sync_us_by_caller)
        st.sync_cost_us_by_caller = keyed(st.sync_cost_us_by_caller)
        st.compute_by_name_us = Named.of(st.compute_by_name_us, tuples, names)
        st.phase_spans = [(names.setdefault(p, p), a, b) for p, a, b in st.phase_spans]
        if st.cover is not None:
            st.cover.compute_in_comm = Pieces.of(st.cover.compute_in_comm)
            st.cover.idle = Pieces.of(st.cover.idle)
    trace.host = names.setdefault(trace.host, trace.host)
    return trace


@dataclass(kw_only=True, slots=True)  # slots: a large job holds ~1e5 of them
class CommOp:
    """One collective as seen by one rank: its communication interval on the device/worker."""

    name: str  # normalised collective name: allreduce, allgather, reduce_scatter, ...
    pg: str  # process group name ("default" when the trace does not say)
    start_us: float
    end_us: float
    nelems: int | None = None
    dtype: str | None = None
    step: int | None = None
    seq: int = -1  # index within its process group on this rank, set by parse
    coll_seq: int | None = None  # the trace's own sequence number in its group (Kineto's `Seq`), where it has one
    launched: bool = True  # False: a kernel whose launch is not in the trace (launched before its window opened)
    thread: tuple = ()  # the raw (pid, tid) it ran on, to place it in the merged trace
    # Its run-up on this rank (see runup.py): from run_up_start_us to start_us, the compute
    # time by "op:<kernel or op name>" and the idle time in it.
    run_up_start_us: float | None = None
    run_up_us: Mapping[str, float] = field(default_factory=dict)  # a Named once compacted (compact)
    # The part of that run-up it spent waiting at point-to-point ops for their peers (runup.py,
    # `p2p_wait_us`): a pipeline stage waiting for its neighbour's activations is not late itself.
    p2p_wait_us: float = 0.0

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(kw_only=True, slots=True)
class StepCover:
    """A step's device compute and copies folded into what the overlap analysis reads
    (overlap.cover_steps), so that a rank's intervals need not be kept once it is parsed. On
    the rank's clock; lengths in us. C = the step's compute, K = its copies, M = its
    communication, all clipped to the window [lo_us, hi_us]."""

    lo_us: float
    hi_us: float
    window_us: float  # hi - lo, measured before any shift (the lengths below are too)
    compute_us: float  # |C|
    memcpy_us: float  # |K|
    overlapped_us: float  # |C ∩ M|
    busy_us: float  # |C ∪ M ∪ K|
    # (lists from the parse, `Pieces` once compacted: model.compact)
    compute_in_comm: Sequence[Interval] = field(default_factory=list)  # C ∩ M, disjoint, by start
    idle: Sequence[Interval] = field(default_factory=list)  # window - (C ∪ M ∪ K), pieces >= overlap.MIN_GAP_US
    work_end_us: float | None = None  # the latest end of the step's compute and copies, unclipped

    def shifted(self, offset_us: float) -> StepCover:
        from dataclasses import replace

        return replace(
            self,
            lo_us=self.lo_us - offset_us,
            hi_us=self.hi_us - offset_us,
            compute_in_comm=Pieces.of((a - offset_us, b - offset_us) for a, b in self.compute_in_comm),
            idle=Pieces.of((a - offset_us, b - offset_us) for a, b in self.idle),
            work_end_us=None if self.work_end_us is None else self.work_end_us - offset_us,
        )


@dataclass(kw_only=True, slots=True)  # slots: ranks x steps of them
class Step:
    number: int
    start_us: float
    end_us: float
    phases_us: dict[str, float] = field(default_factory=dict)  # harness:<phase> durations
    phase_spans: list[tuple[str, float, float]] = field(default_factory=list)  # (phase, start_us, end_us)
    # What the advisor reads (see parse.py, host_ops.py): host ops outside the data phase (every
    # model thread's), kernel launches, blocking host-device syncs and their time (in all and by
    # caller: host.caller_of), and the model's compute time (forward/loss/backward, the
    # whole step without harness ranges) by kernel (GPU) or op self time (CPU) by name.
    host_ops: int = 0
    launches: int = 0
    syncs: int = 0
    sync_us: float = 0.0
    syncs_by_caller: dict[str, int] = field(default_factory=dict)
    sync_us_by_caller: dict[str, float] = field(default_factory=dict)
    # What the syncs cost the device (host_ops.sync_costs: its idle time they caused), in all and by caller
    sync_cost_us: float = 0.0
    sync_cost_us_by_caller: dict[str, float] = field(default_factory=dict)
    compute_by_name_us: Mapping[str, float] = field(default_factory=dict)  # a Named once compacted
    # Events of the step's time in the trace file (cpu ops, launches, kernels, copies,
    # annotations that start in it): its share of the file's bytes, for the merged trace.
    events: int = 0
    # Its compute and copies as the overlap analysis reads them; None: no device work or
    # communication to measure (a GPU step that launched nothing)
    cover: StepCover | None = None

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(kw_only=True)
class RankTrace:
    rank: int
    world_size: int | None
    host: str
    # the trace file(s), one per profiler window merged into this rank (a default only so that an
    # older summary still decodes and is refused for its version, not called damaged)
    paths: list[str] = field(default_factory=list)
    run_id: str | None
    device: str  # "gpu" when the trace has GPU kernels, else "cpu"
    steps: list[Step]
    comms: list[CommOp]
    base_us: float = 0.0  # the trace's time origin (baseTimeNanoseconds / 1e3, else 0)
    warnings: list[str] = field(default_factory=list)
    steps_source: str = "ProfilerStep"  # or "harness ranges" or "whole trace"
    rank_source: str = "distributedInfo"  # or "file name"
    # The trace file(s): their JSON size and the events counted like Step.events over the whole
    # file; per file, where its blocks of events lie (decode.Block), for the merged trace.
    json_bytes: int = 0
    events: int = 0
    blocks: dict[str, list[Block]] = field(default_factory=dict)
    # what one bare op costs on this machine under the profiler (host_ops.op_floor_us), us; None:
    # not measurable here
    op_floor_us: float | None = None
    # groups of fewer ranks than the world this rank is in, where its collectives carry no group
    # (gloo on CPU): its collectives are not matched across ranks (parse.unnamed_groups)
    unnamed_groups: list[list[int]] = field(default_factory=list)
    # which process wrote it and when its first event was, wall clock (ns since the epoch): the
    # run it belongs to, where a folder holds several (discover.split_runs); None: not in the trace
    pid: int | None = None
    started_ns: float | None = None
    # what the trace shows the job already does (practices.py: torch.compile, CUDA graphs, ...)
    practices: list[str] = field(default_factory=list)

    def without_intervals(self) -> RankTrace:
        """A copy without its collectives and its steps' covers (what only the analysis on
        aligned clocks reads); identity, paths, steps and block index stay."""
        from dataclasses import replace

        return replace(self, comms=[], steps=[replace(s, cover=None) for s in self.steps])

    def shifted(self, offset_us: float) -> RankTrace:
        """A copy with every timestamp moved by -offset_us (clock alignment)."""
        from dataclasses import replace

        return replace(
            self,
            steps=[
                replace(
                    s,
                    start_us=s.start_us - offset_us,
                    end_us=s.end_us - offset_us,
                    phase_spans=[(p, a - offset_us, b - offset_us) for p, a, b in s.phase_spans],
                    cover=None if s.cover is None else s.cover.shifted(offset_us),
                )
                for s in self.steps
            ],
            comms=[
                replace(
                    c,
                    start_us=c.start_us - offset_us,
                    end_us=c.end_us - offset_us,
                    run_up_start_us=None if c.run_up_start_us is None else c.run_up_start_us - offset_us,
                )
                for c in self.comms
            ],
        )
