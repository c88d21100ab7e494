"""Each rank's arrival at each collective, for the live watch's phases that hold collectives.

Inside such a phase (DDP's backward, FSDP's forward and backward) every rank's wall time ends at
the same collective, and a rank that sleeps or blocks there does not spend CPU time: by phase
times it looks like the peers waiting for it. Its arrivals do not: it reaches each collective
later than they do. torch's Flight Recorder (on in the lab, `harness.enable_flight_recorder` in
a user's job) stamps every collective a rank issues with `time_created_ns`, on the host's epoch
clock, gloo included; the step clock stamps each phase on the same clock (timing.py,
`phases_span_ns`), which places each collective in a step and phase.

On CPU an issue is an arrival: gloo runs the collective as it is issued. On GPU it is not: the
host enqueues ahead of its device. There the arrival is read from NCCL's timing of the
collective (`duration_ms`, recorded when collectives are timed: TORCH_NCCL_ENABLE_TIMING, which
`flight.enable` sets). ProcessGroupNCCL makes its stream wait for the issuing stream, then
records a start event, then launches the kernel, then an end event. The start event fires once
this rank's device has done the work the collective waits for (and its stream's earlier
collectives); the kernel ends on every rank together, when the last rank has joined and the
transfer is done. So a rank's start is the common end less its duration: the shorter its
duration, the later it arrived, and -duration is its arrival on a scale every rank shares, with
no clock compared. The watchdog fills `duration_ms` in when it sees the collective complete
(every ~100 ms): the newest collectives may lack it and are left out.

`held_lateness_ms` is pure; `recorder_entries` and `my_arrivals` read this process's recorder.
"""

from __future__ import annotations

import bisect
import pickle
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.flight_entry import process_group
from harness.run.timing import span_pairs
from harness.traces.analyse.stragglers import punctual_index

# One arrival: (step, phase, process group, collective sequence id, issued_ns, arrived_ns):
# issued_ns is time_created_ns (the host's epoch clock), arrived_ns the same on CPU and -duration
# on GPU (the module docstring). A collective is the same one on every rank by its group and
# sequence number: a group's ranks issue its collectives in one order. The group is its name
# (`group_name`), which every rank gives it alike; the recorder's pg_id is not: it numbers only
# the groups the rank is in (with groups [0, 1] and [2, 3], pg_id 1 is the first on rank 0 and
# the second on rank 2).
Arrival = tuple[int, str, str, int, int, int]


def group_name(entry: Mapping[str, Any]) -> str:
    """A recorder entry's process group name (its `process_group` is (name, description)), or
    its pg_id where an older recorder has no name."""
    named = process_group(entry)
    return named[0] if named else str(entry.get("pg_id", ""))


@dataclass(kw_only=True)
class HeldArrivals:
    """Every rank's arrivals and phase spans, as the watch's exchange gathers them (index = rank)."""

    spans_ns: list[dict[int, dict[str, list[int]]]]  # step -> phase -> [start_ns, end_ns, ...] (a pair per occurrence)
    arrivals: list[list[Arrival]]
    offsets_ns: list[float]  # each rank's clock less the reference host's (0 on one host)
    device: bool = False  # arrivals from NCCL's durations (GPU), not from issue times
    timed_through: int | None = None  # GPU: the last step judged now (`untimed_steps`); None: no limit


def recorder_entries(backend: str | None = None) -> list[dict[str, Any]] | None:
    """This process's Flight Recorder entries without stack traces (NCCL's recorder for `backend`
    "nccl", which keeps its own), or None where it is off or cannot be read (a torch without
    it). Its cost: bench/RESULTS.md, "Flight Recorder's cost"."""
    try:
        from torch._C import _distributed_c10d as c10d

        dump = getattr(c10d, "_dump_nccl_trace", None) if backend == "nccl" else None
        raw = (dump or c10d._dump_fr_trace)(True, False, False)  # type: ignore[attr-defined]  # private, not in the stub
        entries = pickle.loads(raw).get("entries")  # our own process's dump
    except Exception:  # noqa: BLE001 - no recorder: the watch reads CPU time instead
        return None
    return entries or None


def my_arrivals(
    entries: Sequence[Mapping[str, Any]],
    spans_ns: Mapping[int, Mapping[str, Sequence[int]]],
    phases: Sequence[str],
    device: bool = False,
) -> list[Arrival]:
    """The collectives (not point-to-point) this rank issued inside `phases` of the steps in
    `spans_ns` (step -> phase -> [start_ns, end_ns, ...], a pair per occurrence: the step
    clock's), as `Arrival`s: arrived at when issued (CPU) or, with `device`, at -duration (GPU:
    the module docstring; a collective not yet timed is left out)."""
    found: list[Arrival] = []
    windows = _PhaseWindows(spans_ns, phases)
    for e in entries:
        if e.get("is_p2p"):
            continue
        t = e.get("time_created_ns")
        if not t:
            continue
        if device:
            duration_ms = _duration_ms(e)
            if duration_ms is None or duration_ms < 0:
                continue
            arrived = -round(duration_ms * 1e6)
        else:
            arrived = int(t)
        where = windows.find(t)
        if where is not None:
            found.append((where[0], where[1], group_name(e), int(e["collective_seq_id"]), int(t), arrived))
    return found


class _PhaseWindows:
    """The [start, end] windows of `phases` in `spans_ns` (step -> phase -> [start_ns, end_ns,
    ...], a pair per occurrence; none overlapping), sorted by start: `find(t)` is the (step,
    phase) holding t, at a boundary the one that ends there."""

    def __init__(self, spans_ns: Mapping[int, Mapping[str, Sequence[int]]], phases: Sequence[str]) -> None:
        self.windows = sorted(
            (a, b, s, p)
            for s, by_phase in spans_ns.items()
            for p, span in by_phase.items()
            if p in phases
            for a, b in span_pairs(span)
        )
        self.starts = [w[0] for w in self.windows]

    def find(self, t: float) -> tuple[int, str] | None:
        i = bisect.bisect_right(self.starts, t) - 1
        for w in self.windows[max(i - 1, 0) : i + 1]:
            if w[1] >= t:
                return w[2], w[3]
        return None


def _duration_ms(entry: Mapping[str, Any]) -> float | None:
    """A recorder entry's `duration_ms`, or None where NCCL has not timed it."""
    d = entry.get("duration_ms")
    return float(d) if isinstance(d, (int, float)) else None


# How long the watch waits for NCCL's first duration in a process group before it takes the
# group for one that is not timed (created before TORCH_NCCL_ENABLE_TIMING was set, say): ten
# times the watchdog's poll (kWatchdogThreadSleepMillis, 100 ms), which times a collective within
# one poll of its end, and every step the watch holds has ended.
TIMING_PATIENCE_NS = 1_000_000_000


class TimingPatience:
    """One rank's process groups whose first NCCL duration is still awaited (`untimed_steps`'
    `expected`): each from when the watch first saw one of its collectives, for
    TIMING_PATIENCE_NS."""

    def __init__(self) -> None:
        self.first_seen_ns: dict[int, int] = {}

    def expected(self, entries: Sequence[Mapping[str, Any]], now_ns: int) -> set[int]:
        for e in entries:
            if not e.get("is_p2p"):
                self.first_seen_ns.setdefault(int(e["pg_id"]), now_ns)
        return {pg for pg, t in self.first_seen_ns.items() if now_ns - t < TIMING_PATIENCE_NS}


def untimed_steps(
    entries: Sequence[Mapping[str, Any]],
    spans_ns: Mapping[int, Mapping[str, Sequence[int]]],
    phases: Sequence[str],
    expected: Collection[int] = (),
) -> list[int]:
    """The steps of `spans_ns` with a collective in `phases` that NCCL has not timed yet (GPU),
    sorted: one whose `duration_ms` is missing while its process group has timed an earlier
    one and no later one, or has timed none yet and is `expected` to (the watch's groups first
    seen less than TIMING_PATIENCE_NS ago: at a job's start the watchdog's first durations come
    ~100 ms after the first collectives end, several short steps later). The watchdog times a
    group's collectives in order as it sees them complete (every ~100 ms), so such a step's
    arrivals are incomplete for now: the watch judges it at the next interval. A missing
    duration after a timed one of its group, or in a group with none timed that is not expected
    to, will not come (timing off for that group) and holds nothing back."""
    timed: dict[int, int] = {}
    for e in entries:
        if not e.get("is_p2p") and _duration_ms(e) is not None:
            pg, seq = int(e["pg_id"]), int(e["collective_seq_id"])
            timed[pg] = max(timed.get(pg, seq), seq)
    windows = _PhaseWindows(spans_ns, phases)
    waiting: set[int] = set()
    for e in entries:
        if e.get("is_p2p") or _duration_ms(e) is not None:
            continue
        pg, t = int(e["pg_id"]), e.get("time_created_ns")
        if not t:
            continue
        if pg in timed:
            if int(e["collective_seq_id"]) < timed[pg]:
                continue
        elif pg not in expected:
            continue
        where = windows.find(t)
        if where is not None:
            waiting.add(where[0])
    return sorted(waiting)


def held_lateness_ms(  # noqa: C901
    spans_ns: Sequence[Mapping[int, Mapping[str, Sequence[float]]]],
    arrivals: Sequence[Sequence[Arrival]],
    steps: Sequence[int],
    held_phases: Sequence[str],
    offsets_ns: Sequence[float] | None = None,
    device: bool = False,
    groups: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Per rank, step and phase that holds collectives: how much later than the punctual ranks it
    arrived because of what it did inside the phase ([ranks, steps, phases], ms), or None where
    some rank lacks a span of one of `steps`' held phases that others have (a phase no rank
    marked adds nothing).

    1. every host time on one clock: a rank's less its host's offset (`offsets_ns`; 0 on one
       host); arrivals from durations (`device`) need none;
    2. per step and phase: the collectives issued in it (by group and sequence number), each
       with the ranks that issued it (its group's: two or more), in the order of their punctual
       issue (the lower-quartile issue time over those ranks, as the collector marks punctual
       ranks: `punctual_index`);
    3. per rank, its lateness at each of its collectives, l_k = its arrival - the punctual one
       among the collective's ranks (at least 0), left out where the ranks come from different
       groups' collectives (`_apart`: data-parallel all-reduces after tensor-parallel ones,
       HSDP's replicate group after its shard group), but on CPU at a rank's first collective
       of the phase (HSDP's first all-gather of forward after the replicate all-reduces that
       ended the step before): there (4) counts from the lateness the rank entered the phase
       with, its phase start on the common clock, which came after every hold before it; and:
    4. on CPU: its lateness in the phase = the sum of its positive increases from the lateness it
       entered the phase with, e = its phase start - the punctual start (at least 0: what it did
       before is the other phases' account; the punctual start over its `groups` peers where
       given, a pipeline stage's ranks, whose phases start apart from other stages' by design):
       l_1 - e, l_2 - l_1, ... Ranks stay apart over
       asynchronous collectives (DDP's buckets: a delay before the first shows at every bucket,
       once as an increase; one spread over the buckets adds at each), and leave a blocking one
       together (FSDP's all-gathers: a delay shows at the next one, then every rank is back in
       step). The recorder does not say when a rank left a collective, so after a blocking one
       the next increase is counted from the lateness before it: one delay is counted whole
       either way, a slowness spread between blocking collectives as at least its largest
       stretch (the watch takes the rank's CPU time there when that says more);
    5. on GPU (`device`): the sum of l_k over the phase's collectives after its first. l_k is
       the time the punctual ranks' kernels waited for this rank at collective k, and a group's
       collectives run in order on one NCCL stream, so those waits are disjoint stretches of
       that stream's time and add up (a lateness carried over from collective k - 1 is absorbed
       where the punctual ranks' stream was still busy with it: their start at k is no earlier
       than its end). The lateness at the phase's first collective is what the rank entered the
       phase with: left out where a phase of own work comes before (on its device: its time is
       judged there), counted to the held phase it follows without a gap where there is one
       (backward after forward): the tail of that phase's work after its last collective, which
       nothing else judges. FSDP2 gathers one layer ahead, each all-gather waiting for the
       layer before's copy-out, which waits for the compute before it on its stream, so a
       forward layer's slowness shows at the all-gather two layers on and the last layers' in
       backward (a generated FSDP job slow in forward is over the bound only with it:
       bench/RESULTS.md, "Detection"). Counting
       increases, as on CPU, misses a rank slow all through FSDP's forward: its all-gathers
       hold the punctual ranks to its pace, so it is late by as much at each and its increases
       are nothing after the first (generated FSDP jobs side by side: more stragglers found this
       way, no false flag either way; bench/RESULTS.md, "Detection").
    A phase marked more than once in a step (gradient accumulation: a pass per micro-batch;
    timing.py keeps a span per pass) is taken pass by pass: a collective belongs to the pass its
    issue falls in, the pass's first is the rank's first in 3-5, and the lateness it enters the
    pass with (its pass start - the punctual one) is what the phases between brought, judged
    there (where ranks marked it a different number of times, as one pass from its first start).
    A phase without collectives adds nothing."""
    n = len(spans_ns)
    offsets = list(offsets_ns) if offsets_ns is not None else [0.0] * n
    out = torch.zeros((n, len(steps), len(held_phases)), dtype=torch.float64)
    by_rank: list[dict[tuple[int, str], dict[tuple[str, int], tuple[float, float]]]] = []
    for r, mine in enumerate(arrivals):
        table: dict[tuple[int, str], dict[tuple[str, int], tuple[float, float]]] = {}
        for step, phase, pg, seq, issued, arrived in mine:
            table.setdefault((step, phase), {})[(pg, seq)] = (
                issued - offsets[r],
                arrived if device else arrived - offsets[r],
            )
        by_rank.append(table)
    apart = _apart(arrivals)
    for i, step in enumerate(steps):
        by_phase = [[spans_ns[r].get(step, {}).get(phase) for r in range(n)] for phase in held_phases]
        # every rank's ends of each held phase (one per occurrence, timing.py): on GPU a phase
        # that starts where one ends follows it without a gap
        ends_at: dict[tuple[float, ...], int] = {}
        for j, spans in enumerate(by_phase if device else []):
            known = [sp for sp in spans if sp is not None]
            if len(known) == n:
                for end in range(1, min(len(sp) for sp in known), 2):
                    ends_at[tuple(sp[end] for sp in known)] = j
        for j, (phase, spans) in enumerate(zip(held_phases, by_phase)):
            if all(span is None for span in spans):
                continue  # a phase this loop does not mark
            marked = [span for span in spans if span is not None]
            if len(marked) < n:
                return None
            # a phase marked more than once in the step (gradient accumulation): each pass is
            # entered anew, with the lateness the phases between brought (theirs to account)
            passes = min(len(span) // 2 for span in marked)
            if any(len(span) // 2 != passes for span in marked):
                passes = 1  # ranks marking it a different number of times: taken as one pass
            starts = [[span[2 * o] - offsets[r] for o in range(passes)] for r, span in enumerate(marked)]
            entering, before = [], []
            for o in range(passes):
                at = torch.tensor([st[o] for st in starts], dtype=torch.float64)
                entering.append((at - punctual_of(at, groups)).clamp(min=0.0).tolist())
                follows = ends_at.get(tuple(span[2 * o] for span in marked))
                before.append(None if follows == j else follows)  # a phase of no length ends where it starts
            tables = [t.get((step, phase), {}) for t in by_rank]
            members: dict[tuple[str, int], list[int]] = {}
            for r, t in enumerate(tables):
                for k in t:
                    members.setdefault(k, []).append(r)
            held = {k: m for k, m in members.items() if len(m) > 1}
            order = {k: sorted(tables[r][k][0] for r in m)[punctual_index(len(m))] for k, m in held.items()}
            current = [-1] * n  # the pass each rank's last collective was in
            lateness = [0.0] * n
            for k in sorted(held, key=lambda key: (order[key], key)):
                m = held[k]
                punctual = sorted(tables[r][k][1] for r in m)[punctual_index(len(m))]
                for r in m:
                    o = max(bisect.bisect_right(starts[r], tables[r][k][0]) - 1, 0)
                    first = o != current[r]
                    if first:
                        current[r], lateness[r] = o, entering[o][r]
                    if k in apart and (device or not first):
                        continue
                    late = max(tables[r][k][1] - punctual, 0.0)
                    if not device:
                        out[r, i, j] += max(late - lateness[r], 0.0) / 1e6
                        lateness[r] = late
                    elif not first:
                        out[r, i, j] += late / 1e6
                    elif before[o] is not None:
                        out[r, i, before[o]] += late / 1e6
    return out


def punctual_of(x: torch.Tensor, groups: Sequence[int] | None) -> torch.Tensor:
    """Each rank's punctual mark of `x` ([ranks, ...]): the lower quartile (`punctual_index`)
    over the ranks of its group (watch_rule.stages: a pipeline's stage; every rank where
    `groups` is None or all one), along the ranks."""
    if groups is None or len(set(groups)) == 1:
        return x.sort(dim=0).values[punctual_index(x.shape[0])].expand_as(x)
    out = torch.empty_like(x)
    for g in set(groups):
        members = [r for r, h in enumerate(groups) if h == g]
        out[members] = x[members].sort(dim=0).values[punctual_index(len(members))]
    return out


def _apart(arrivals: Sequence[Sequence[Arrival]]) -> set[tuple[str, int]]:
    """The collectives (group, sequence number) whose ranks come from different process groups'
    collectives: each rank issued another before it, not all the same one, and some of another
    group. A group's ranks leave each of its collectives together, so their lateness at the
    next is what each did since; a rank held at its tensor-parallel all-reduce by a slow peer
    reaches the data-parallel all-reduce after it late by that hold, which is the peer's, and
    the recorder does not say when it was released (the collector, with the traces' clocks,
    measures run-ups there: harness/traces/analyse/stragglers.fresh_lateness)."""
    before: dict[tuple[str, int], list[tuple[str, int] | None]] = {}
    for mine in arrivals:
        previous = None
        for _, _, pg, seq, _, _ in sorted(mine, key=lambda a: a[4]):
            before.setdefault((pg, seq), []).append(previous)
            previous = (pg, seq)
    return {
        k
        for k, prev in before.items()
        if None not in prev and len(set(prev)) > 1 and any(p[0] != k[0] for p in prev if p is not None)
    }
