"""Per-step and per-phase timing that tells the truth on CPU and on GPU.

On CPU the host clock is the device clock: phases are `perf_counter` differences.

On GPU the host only enqueues work, so host time per phase says little. Each phase boundary also
records a CUDA event on the current stream, and a step's numbers are resolved only once its last
event has completed on the device. That costs no per-step synchronisation: the host keeps
enqueuing the next step while the previous one is resolved (`poll`), and `drain` synchronises
once, at the end of the run.

A phase may come back within a step (gradient accumulation: forward and backward once per
micro-batch; a pipeline's 1F1B schedule): each per-phase figure below is the sum over its
occurrences, so the phases still add up to the step, and its span is one [start, end] pair per
occurrence, in order.

Algorithm for one step on GPU:
1. `data_ms` is host time blocked in the DataLoader (host-side by nature).
2. every other phase is the device-stream time between consecutive events; `phases_device_ms`
   holds every phase so, data included (the time the device waited for the loader, or spent
   on work launched in the data phase), which the live watch judges.
3. `phases_own_device_ms`: in a phase where `mark_own_end` was called (a DDP rank's backward,
   when its last gradient is ready: grads_ready.py), the device-stream time from the phase's
   start to that event: the rank's own work there, before it waits for its peers' all-reduce;
4. `step_ms` is the device-stream time from this step's start event to its end event. The start
   event completes when the previous step's work has drained, so steps never overlap in it.
5. `outside_step_ms` is host time between the previous step's end and this step's start (the
   profiler's step bookkeeping and trace export land there, not inside any step).
On CPU the same quantities come from the host clock; with `thread_time` on (the live watch), also
`phases_cpu_ms`: the calling thread's CPU time in each phase. Waiting in a gloo collective blocks
the thread off its core, so in a phase that holds collectives this is the rank's own work there,
which the phase's wall time, ending with every rank's at the same collective, is not. With it,
or with `spans` on (the watch reading arrivals, on either device), `phases_span_ns`: each phase's
[start, end] on the host's epoch clock (a pair per occurrence), the Flight Recorder's, which
places the collectives the rank issued in its phases (arrivals.py). On CPU (where Linux keeps
schedstat), in the steps opened with `start(..., runq=True)` (Run asks it of the steps the
profiler traces: the collector reads it beside a traced step's lateness, nothing else reads it):
`runq_ms`, the calling thread's time runnable but waiting for a core since the previous step's
end (schedstat.py, read once a step, at its end; a step after one not read, from its start): the
step and the loop's time before it, which together bring the rank to its next collective; what
other work on its cores cost it. In a distributed run, from comm_wait.py's timer: per phase the
time waiting at point-to-point ops (`phases_p2p_ms`) and at collectives waited on from Python
(`phases_collective_wait_ms`), the ranks received from (`phases_recv_from`), and where the
step's first point-to-point op was a receive, its source (`first_recv_from`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.run.schedstat import RunQueueClock


@dataclass(slots=True)
class _PendingStep:
    step: int
    extra: dict[str, Any]
    host_marks: list[tuple[str, float]] = field(default_factory=list)
    cpu_marks: list[float] = field(default_factory=list)
    epoch_marks: list[int] = field(default_factory=list)
    runq_marks: list[float | None] = field(default_factory=list)
    events: list[tuple[str, Any]] = field(default_factory=list)
    device: int | None = None  # the CUDA device its events are recorded on (GPU)
    own_end: Any = None  # the open phase's latest `mark_own_end` event
    own_events: list[tuple[str, Any, Any]] = field(default_factory=list)  # (phase, its start, own end) per occurrence
    # the open phase's waits on communication: (its ms or CUDA event pair, at a point-to-point op)
    waits_open: list[tuple[Any, bool]] = field(default_factory=list)
    waits: list[tuple[str, list[tuple[Any, bool]]]] = field(default_factory=list)  # (phase, its waits) per occurrence
    sources_open: set[int] = field(default_factory=set)  # the open phase's receives' sources (global ranks)
    sources: dict[str, set[int]] = field(default_factory=dict)  # phase -> its receives' sources
    first_p2p: int | None = None  # the step's first point-to-point op: its source (a receive) or -1 (a send)


class StepClock:
    """Marks phase boundaries; hands back finished step timings in order."""

    def __init__(self, cuda: bool, thread_time: bool = False, spans: bool = False) -> None:
        self.cuda = cuda
        # each mark also reads the thread's CPU time (~1 us: a system call, not a vDSO read)
        self.thread_time = thread_time and not cuda
        self.spans = spans  # each mark also reads the epoch clock (phases_span_ns), on either device
        self._runq = None if cuda else RunQueueClock()
        self._current: _PendingStep | None = None
        self._pending: deque[_PendingStep] = deque()
        self._last_end_host: float | None = None
        self._runq_end: float | None = None  # the run-queue total at the last step's end, if read there
        self._runq_step = False  # whether the open step reads the run queue

    def start(self, step: int, runq: bool = True) -> None:
        """Open step `step`; `runq`: read its wait for a core (CPU only; ~15 us a step)."""
        self._current = _PendingStep(step=step, extra={}, device=torch.cuda.current_device() if self.cuda else None)
        self._runq_step = runq and self._runq is not None
        self.mark("start")

    def mark(self, label: str) -> None:
        """Boundary after phase `label` ("start" opens the step)."""
        cur = self._current
        assert cur is not None, "start() first"
        cur.host_marks.append((label, time.perf_counter()))
        if self.thread_time:
            cur.cpu_marks.append(time.thread_time())
        if self.spans or self.thread_time:
            cur.epoch_marks.append(time.time_ns())
        if self._runq_step:
            # the period's wait for a core, not its phases': one read a step (~15 us right after
            # its kernels: bench/RESULTS.md, "Harness and profiler overhead", (i)'s parts)
            assert self._runq is not None
            if label == "start" and self._runq_end is None:
                self._runq_end = self._runq.read_ms()  # the step before it not read: from its start
            elif label == "end":
                reading = self._runq.read_ms()
                cur.runq_marks = [self._runq_end, reading]
                self._runq_end = reading
        elif label == "end":
            self._runq_end = None
        if cur.waits_open or cur.sources_open:
            if label not in ("start", "end"):
                cur.waits.append((label, cur.waits_open))
                cur.sources.setdefault(label, set()).update(cur.sources_open)
            cur.waits_open, cur.sources_open = [], set()
        if self.cuda:
            if cur.own_end is not None and label != "end":  # never set before the step's start mark
                cur.own_events.append((label, cur.events[-1][1], cur.own_end))
            cur.own_end = None  # a phase's own: never the next phase's, nor outside any phase
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            cur.events.append((label, event))

    def mark_own_end(self) -> None:
        """Where the open phase's own work ends on the device (GPU; nothing on CPU, where the
        watch reads CPU time, nor outside a step): an event on the current stream, the last one
        before the phase's end counting. Called from autograd's thread (grads_ready.py) while
        the loop's thread waits in backward, whose current device is the gradient's: on another
        device than the step's events (a model not on the loop's current device) it records
        nothing, as two devices' events have no time between them."""
        cur = self._current
        if not self.cuda or cur is None or torch.cuda.current_device() != cur.device:
            return
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        cur.own_end = event

    def add_comm_wait(self, wait: float | tuple[Any, Any], p2p: bool) -> None:
        """A wait on communication (comm_wait.py) in the open phase: its ms (CPU) or the CUDA
        events before and after it on the current stream (GPU), at a point-to-point op or a
        collective; nothing outside a step."""
        if self._current is not None:
            self._current.waits_open.append((wait, p2p))

    def add_p2p_op(self, source: int | None) -> None:
        """A send (None) or a receive from global rank `source` (-1: not known) in the open phase
        (comm_wait.py)."""
        cur = self._current
        if cur is None:
            return
        if cur.first_p2p is None:
            cur.first_p2p = -1 if source is None else source
        if source is not None and source >= 0:
            cur.sources_open.add(source)

    def finish(self, sample: Callable[[], dict[str, Any]] | None = None, **extra: Any) -> None:
        """Close the step; `extra` fields, and those `sample` returns, are passed through to its
        record. `sample` is called after the step's end is marked: the harness's own reading of
        the process is not the training step's time."""
        cur = self._current
        assert cur is not None
        self.mark("end")
        cur.extra = {**extra, **sample()} if sample is not None else extra
        self._pending.append(cur)
        self._current = None

    def discard(self) -> None:
        """Drop the open step (started, never finished): no record of it."""
        self._current = None

    def poll(self) -> list[dict[str, Any]]:
        """Finished steps whose device work is complete (all of them on CPU)."""
        done = []
        while self._pending and self._complete(self._pending[0]):
            done.append(self._resolve(self._pending.popleft()))
        return done

    def drain(self) -> list[dict[str, Any]]:
        if self.cuda and self._pending:
            torch.cuda.synchronize()  # once, at the end of the run
        return self.poll()

    def _complete(self, p: _PendingStep) -> bool:
        return not self.cuda or p.events[-1][1].query()

    def _resolve(self, p: _PendingStep) -> dict[str, Any]:  # noqa: C901
        host = p.host_marks
        labels = [label for label, _ in host[1:]]  # the phase each mark closes ("end": none)
        host_ms = _per_phase(labels, [(b - a) * 1e3 for (_, a), (_, b) in zip(host[:-1], host[1:])])
        if self.cuda:
            ev = p.events
            phases_ms = _per_phase(labels, [a.elapsed_time(b) for (_, a), (_, b) in zip(ev[:-1], ev[1:])])
            step_ms = ev[0][1].elapsed_time(ev[-1][1])
        else:
            phases_ms = dict(host_ms)
            step_ms = (host[-1][1] - host[0][1]) * 1e3
        outside_ms = 0.0 if self._last_end_host is None else (host[0][1] - self._last_end_host) * 1e3
        self._last_end_host = host[-1][1]
        extra = dict(p.extra)
        if self.cuda:
            # what the device spent in each phase, data included: the time its stream idled for
            # the loader (none when it was still busy with earlier steps: a host running ahead)
            extra["phases_device_ms"] = dict(phases_ms)
            own: dict[str, float] = {}
            for label, a, b in p.own_events:
                try:
                    own[label] = own.get(label, 0.0) + a.elapsed_time(b)
                except RuntimeError:  # events CUDA cannot compare: no own work, the step timed all the same
                    continue
            if own:
                extra["phases_own_device_ms"] = own
        waited: dict[bool, dict[str, float]] = {True: {}, False: {}}  # point-to-point or not -> phase -> ms
        for label, waits in p.waits:
            for w, p2p in waits:
                try:
                    ms = w[0].elapsed_time(w[1]) if isinstance(w, tuple) else w
                except RuntimeError:  # events CUDA cannot compare (another device's): not counted
                    continue
                waited[p2p][label] = waited[p2p].get(label, 0.0) + ms
        if waited[True]:
            extra["phases_p2p_ms"] = waited[True]
        if waited[False]:
            extra["phases_collective_wait_ms"] = waited[False]
        if any(p.sources.values()):
            extra["phases_recv_from"] = {label: sorted(ranks) for label, ranks in p.sources.items() if ranks}
        if p.first_p2p is not None and p.first_p2p >= 0:
            extra["first_recv_from"] = p.first_p2p  # the step began its point-to-point ops with this receive
        # Data wait is host time blocked on the loader, on either device.
        data_ms = host_ms.get("data", 0.0)
        phases_ms["data"] = data_ms
        cpu = p.cpu_marks
        if len(cpu) == len(host):
            extra["phases_cpu_ms"] = _per_phase(labels, [(b - a) * 1e3 for a, b in zip(cpu[:-1], cpu[1:])])
        epoch = p.epoch_marks
        if len(epoch) == len(host):
            spans: dict[str, list[int]] = {}
            for a, b, label in zip(epoch[:-1], epoch[1:], labels):
                if label != "end":
                    spans.setdefault(label, []).extend((a, b))
            extra["phases_span_ns"] = spans
        runq = [m for m in p.runq_marks if m is not None]
        if len(runq) == 2:
            extra["runq_ms"] = runq[-1] - runq[0]
        return {
            "step": p.step,
            "step_ms": step_ms,
            "data_ms": data_ms,
            "outside_step_ms": outside_ms,
            "phases_ms": phases_ms,
            **extra,
        }


def _per_phase(labels: list[str], durations: list[float]) -> dict[str, float]:
    """Each phase's total over its occurrences (`labels[i]` closed the interval of
    `durations[i]`; "end" closes the step's tail after its last phase, in no phase)."""
    out: dict[str, float] = {}
    for label, d in zip(labels, durations):
        if label != "end":
            out[label] = out.get(label, 0.0) + d
    return out


def span_pairs(span: Sequence[int]) -> list[tuple[int, int]]:
    """A phase's `phases_span_ns` entry as its [start, end] pairs, one per occurrence."""
    return list(zip(span[::2], span[1::2]))
