"""Each CPU rank's arrival at each collective, for the live watch's phases that hold collectives.

Inside such a phase (DDP's backward, FSDP's forward and backward) every rank's wall time ends at
the same collective, and a rank that sleeps or blocks there does not spend CPU time: by phase
times it looks like the peers waiting for it. Its arrivals do not: it issues each collective
later than they do. torch's Flight Recorder (on in the lab, `harness.enable_flight_recorder` in
a user's job) stamps every collective a rank issues with `time_created_ns`, on the host's epoch
clock, gloo included; the step clock stamps each phase on the same clock (timing.py,
`phases_span_ns`). On CPU an issue is an arrival (gloo runs the collective as it is issued); on
GPU it is not (the host enqueues ahead of its device), so this is read on CPU only.

`held_lateness_ms` is pure; `recorder_entries` and `my_arrivals` read this process's recorder.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.collect.analyse.stragglers import punctual_index

# One arrival: (step, phase, process group id, collective sequence id, time_created_ns). A
# collective is the same one on every rank by its group and sequence number: ranks create their
# groups in one order and issue a group's collectives in one order.
Arrival = tuple[int, str, int, int, int]


@dataclass(kw_only=True)
class HeldArrivals:
    """Every rank's arrivals and phase spans, as the watch's exchange gathers them (index = rank)."""

    spans_ns: list[dict[int, dict[str, list[int]]]]  # step -> phase -> [start_ns, end_ns]
    arrivals: list[list[Arrival]]
    offsets_ns: list[float]  # each rank's clock less the reference host's (0 on one host)


def recorder_entries() -> list[dict[str, Any]] | None:
    """This process's Flight Recorder entries without stack traces, or None where it is off or
    cannot be read (a torch without it). ~10 us an entry (a 2000-entry buffer: ~20 ms)."""
    try:
        from torch._C import _distributed_c10d as c10d

        raw = c10d._dump_fr_trace(True, False, False)  # type: ignore[attr-defined]  # private, not in the stub
        entries = pickle.loads(raw).get("entries")  # our own process's dump
    except Exception:  # noqa: BLE001 - no recorder: the watch reads CPU time instead
        return None
    return entries or None


def my_arrivals(
    entries: Sequence[Mapping[str, Any]], spans_ns: Mapping[int, Mapping[str, Sequence[int]]], phases: Sequence[str]
) -> list[Arrival]:
    """The collectives (not point-to-point) this rank issued inside `phases` of the steps in
    `spans_ns` (step -> phase -> [start_ns, end_ns], the step clock's), as `Arrival`s."""
    found: list[Arrival] = []
    windows = [(s, p, a, b) for s, by_phase in spans_ns.items() for p, (a, b) in by_phase.items() if p in phases]
    for e in entries:
        if e.get("is_p2p"):
            continue
        t = e.get("time_created_ns")
        if not t:
            continue
        for step, phase, a, b in windows:
            if a <= t <= b:
                found.append((step, phase, int(e["pg_id"]), int(e["collective_seq_id"]), int(t)))
                break
    return found


def held_lateness_ms(
    spans_ns: Sequence[Mapping[int, Mapping[str, Sequence[float]]]],
    arrivals: Sequence[Sequence[Arrival]],
    steps: Sequence[int],
    held_phases: Sequence[str],
    offsets_ns: Sequence[float] | None = None,
) -> torch.Tensor | None:
    """Per rank, step and phase that holds collectives: how much later than the punctual ranks it
    arrived because of what it did inside the phase ([ranks, steps, phases], ms), or None where a
    rank lacks a span of one of `steps`' held phases.

    1. every time on one clock: a rank's less its host's offset (`offsets_ns`; 0 on one host);
    2. per step and phase: the collectives every rank issued in it (by group and sequence number),
       in the order of their punctual arrival (the lower-quartile arrival, as the collector
       marks punctual ranks: `punctual_index`);
    3. per rank: the lateness it entered the phase with, e = its phase start - the punctual
       start (at least 0: what it did before is the other phases' account), and its lateness at
       each collective, l_k = its arrival - the punctual one (at least 0);
    4. its lateness in the phase = the sum of its positive increases, l_1 - e, l_2 - l_1, ...:
       ranks stay apart over asynchronous collectives (DDP's buckets: a delay before the first
       shows at every bucket, once as an increase; one spread over the buckets adds at each),
       and leave a blocking one together (FSDP's all-gathers: a delay shows at the next one,
       then every rank is back in step). The recorder does not say when a rank left a
       collective, so after a blocking one the next increase is counted from the lateness
       before it: one delay is counted whole either way, a slowness spread between blocking
       collectives as at least its largest stretch (the watch takes the rank's CPU time there
       when that says more). A phase without collectives adds nothing."""
    n = len(spans_ns)
    offsets = list(offsets_ns) if offsets_ns is not None else [0.0] * n
    out = torch.zeros((n, len(steps), len(held_phases)), dtype=torch.float64)
    by_rank: list[dict[tuple[int, str], dict[tuple[int, int], float]]] = []
    for r, mine in enumerate(arrivals):
        table: dict[tuple[int, str], dict[tuple[int, int], float]] = {}
        for step, phase, pg, seq, t in mine:
            table.setdefault((step, phase), {})[(pg, seq)] = t - offsets[r]
        by_rank.append(table)
    mark = punctual_index(n)
    for i, step in enumerate(steps):
        for j, phase in enumerate(held_phases):
            starts = []
            for r in range(n):
                span = spans_ns[r].get(step, {}).get(phase)
                if span is None:
                    return None
                starts.append(span[0] - offsets[r])
            start_mark = sorted(starts)[mark]
            lateness = [max(s - start_mark, 0.0) for s in starts]
            tables = [t.get((step, phase), {}) for t in by_rank]
            shared = set(tables[0]).intersection(*tables[1:])
            marks = {k: sorted(t[k] for t in tables)[mark] for k in shared}
            for k in sorted(shared, key=lambda key: (marks[key], key)):
                for r in range(n):
                    late = max(tables[r][k] - marks[k], 0.0)
                    out[r, i, j] += max(late - lateness[r], 0.0) / 1e6
                    lateness[r] = late
    return out
