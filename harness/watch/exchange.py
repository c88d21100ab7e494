"""The live straggler watch: every `--watch-every` steps the ranks exchange their latest step
timings in one all-gather, and each applies the collector's straggler rule to them
(`watch_rule.judge_interval`). With --capture-on-straggler, rank 0 then broadcasts whether and
where a triggered trace window starts, so that every rank books the same steps.

Rank 0 prints a line when a rank becomes a straggler and when it stops being one, and appends one
line per judged interval to `<run>/watch.jsonl`; every rank writes its own `watch/*` scalars.

The exchange runs on a gloo group of its own ("harness_watch"), with CPU tensors: no device
synchronisation, and none of the training's collectives is touched. It happens after a step's end
mark and the profiler's step, so its time counts in the next step's `outside_step_ms`, in no phase
(in a recorded window: inside the next ProfilerStep, as a gloo all-gather).
"""

from __future__ import annotations

import datetime
import json
import statistics
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import record_function

from harness.paths import WATCH_GROUP_DESC, WATCH_RANGE, watch_path
from harness.run.metrics import Metrics
from harness.run.profiling import TraceRecorder
from harness.run.settings import WatchConfig
from harness.scalars import ScalarWriter
from harness.traces.analyse.noise import GPU, SHARED_CPU
from harness.watch.arrivals import HeldArrivals, TimingPatience, my_arrivals, recorder_entries, untimed_steps
from harness.watch.rule import (
    COLLECTIVE_PHASES,
    IntervalVerdict,
    Judgement,
    WatchJudge,
    own_work_phases,
    pack_rows,
    step_row,
    table_rows,
    watch_thresholds,
)
from harness.write_faults import AppendOnlyFile, FaultLog

# A triggered window's metadata names at most this many of the newly flagged ranks (the size of
# the broadcast; 16 = two 8-GPU nodes' worth, like the collector's MAX_CAUSES).
MAX_NAMED = 16


class Watch:
    """Collects this rank's step timings and, every `every` steps, exchanges and judges them."""

    def __init__(
        self,
        cfg: WatchConfig,
        *,
        steps: int | None,
        warmup_steps: int,
        parallel: str,
        collective_timeout_s: float,
        rank: int,
        world_size: int,
        host: str,
        cpu: bool,
        run_dir: Path,
        recorder: TraceRecorder,
        scalars: ScalarWriter | None,
        faults: FaultLog,
        metrics: Metrics | None = None,
        flight_on: bool = False,
        backend: str | None = None,
    ) -> None:
        """`steps`: the run's length (None: not known), `parallel` (ddp, fsdp, none): which
        phases hold collectives; `flight_on`: torch's Flight Recorder is on in this process
        (the watch reads the ranks' arrivals at collectives from it, arrivals.py: on CPU, and on
        GPU under FSDP where `backend`, the training's, is nccl, which times its collectives)."""
        self.cfg = cfg
        self.on = (
            cfg.every > 0
            and world_size > 1
            and (steps is None or steps >= cfg.every)
            and dist.is_available()
            and dist.is_initialized()
        )
        self.rank = rank
        self.world_size = world_size
        self.own_phases = own_work_phases(parallel)
        self.held_phases = COLLECTIVE_PHASES[parallel]
        self.cpu = cpu
        self.warmup_steps = warmup_steps
        self.last_step = None if steps is None else steps - 1
        self.recorder = recorder
        self.scalars = scalars
        self.faults = faults
        self.metrics = metrics
        self.th = watch_thresholds(cfg.min_late_ms)
        self._recent: deque[list[float]] = deque(maxlen=table_rows(cfg.every, False))
        self.judge = WatchJudge(
            own_phases=self.own_phases, held_phases=self.held_phases, noise=SHARED_CPU if cpu else GPU, th=self.th
        )
        self.intervals = 0
        self.bound_ms: float | None = None  # the latest interval's bound: how late a straggler must be
        self.judged_steps: list[int] | None = None  # [first, last]: the steps the judged intervals held
        self.flags: list[dict[str, Any]] = []  # every time a rank became a straggler
        # the latest judged interval (its watch.jsonl line, and every rank's lateness), for the debug server
        self.latest: dict[str, Any] | None = None
        self.captures: list[dict[str, Any]] = []
        self._log: AppendOnlyFile | None = None
        self.hosts: dict[int, str] = {}
        # step -> phase -> [start_ns, end_ns, ...] (a pair per occurrence) of the phases that
        # hold collectives, for `_arrivals`
        self._spans: dict[int, dict[str, list[int]]] = {}
        self.backend = backend
        self.read_arrivals = False  # every rank's arrivals are read (recorders on): `_connect`
        self._patience = TimingPatience()  # GPU: the groups whose first NCCL duration is awaited
        if not self.on:
            return
        # On GPU only under FSDP: DDP's backward is read from the gradients' event
        # (Run.watch_gradients), exact and at once, where NCCL's timing comes ~100 ms late.
        readable = flight_on and bool(self.held_phases) and (cpu or (backend == "nccl" and parallel == "fsdp"))
        self.hosts, self.read_arrivals = self._connect(host, readable, datetime.timedelta(seconds=collective_timeout_s))
        if self.read_arrivals and not cpu:
            self._recent = deque(maxlen=table_rows(cfg.every, True))
        if rank == 0:
            self._log = AppendOnlyFile(watch_path(run_dir), faults, "watch log")

    def _connect(self, host: str, arrivals: bool, timeout: datetime.timedelta) -> tuple[dict[int, str], bool]:
        """The watch's own gloo group (timing out like the training's collectives, so a rank that
        hangs leaves the others in this exchange no longer than in a training collective), every
        rank's host, and whether every rank can read its arrivals (`arrivals`): all or none
        exchange them."""
        self.group = dist.new_group(backend="gloo", timeout=timeout, group_desc=WATCH_GROUP_DESC)
        each: list[Any] = [None] * self.world_size
        dist.all_gather_object(each, (host, arrivals), group=self.group)
        return {r: h for r, (h, _) in enumerate(each)}, all(a for _, a in each)

    def add(self, record: dict[str, Any]) -> None:
        """A step record from the step clock (warm-up steps are not judged: first-step costs)."""
        if self.on and record["step"] >= self.warmup_steps:
            self._recent.append(step_row(record))
            if self.read_arrivals:
                spans = record.get("phases_span_ns") or {}
                self._spans[record["step"]] = {p: spans[p] for p in self.held_phases if p in spans}
                for old in [s for s in self._spans if s < record["step"] - (self._recent.maxlen or 1)]:
                    del self._spans[old]

    def due(self, step: int) -> bool:
        """Whether the ranks exchange after `step` (every `every` steps)."""
        return self.on and (step + 1) % self.cfg.every == 0

    def after_step(self, step: int) -> None:
        """Call after a step and its profiler step: exchanges and judges when `due`."""
        if not self.due(step):
            return
        # lands in the next step's trace window: the range says whose collectives these are
        with record_function(WATCH_RANGE):
            tables = torch.stack(self._all_gather(pack_rows(list(self._recent), self._recent.maxlen or 1)))
            arrivals = self._arrivals(time.time_ns()) if self.read_arrivals else None
            judged = self.judge.judge(tables, self.hosts, arrivals)
            if judged is None:
                return
            self.intervals += 1
            steps = judged.verdict.steps
            if steps:
                first = steps[0] if self.judged_steps is None else self.judged_steps[0]
                self.judged_steps = [first, steps[-1]]
            self._act(step, judged)

    def _arrivals(self, left_ns: int) -> HeldArrivals | None:
        """Every rank's arrivals at collectives in the held phases of its recent steps, gathered
        (a second all-gather on the watch's group, right after the tables'), or None where a rank's
        recorder could not be read. `left_ns`: when this rank left the tables' all-gather, which
        every rank leaves together: ranks on another host than rank 0's get their host's median
        difference as their clock's offset (one host, one clock: none). On GPU each rank also
        says which steps NCCL has not timed yet (`untimed_steps`): the steps from the earliest
        of them on wait for the next interval (`timed_through`)."""
        spans = {s: p for s, p in self._spans.items() if s > self.judge.judged_through}
        entries = recorder_entries(self.backend)
        device = not self.cpu
        mine = None
        if entries is not None:
            untimed = (
                untimed_steps(entries, spans, self.held_phases, self._patience.expected(entries, time.monotonic_ns()))
                if device
                else []
            )
            mine = (spans, my_arrivals(entries, spans, self.held_phases, device), left_ns, untimed)
        each: list[Any] = [None] * self.world_size
        self._all_gather_object(each, mine)
        if any(e is None for e in each):
            return None
        hosts = [self.hosts.get(r) for r in range(self.world_size)]
        left: dict[str | None, list[int]] = defaultdict(list)
        for h, e in zip(hosts, each):
            left[h].append(e[2])
        ref = statistics.median(left[hosts[0]])
        offsets = [0.0 if h == hosts[0] else statistics.median(left[h]) - ref for h in hosts]
        waiting = [e[3][0] for e in each if e[3]]
        return HeldArrivals(
            spans_ns=[e[0] for e in each],
            arrivals=[e[1] for e in each],
            offsets_ns=offsets,
            device=device,
            timed_through=min(waiting) - 1 if waiting else None,
        )

    def _all_gather_object(self, out: list[Any], obj: Any) -> None:
        dist.all_gather_object(out, obj, group=self.group)

    def _all_gather(self, rows: torch.Tensor) -> list[torch.Tensor]:
        gathered = [torch.empty_like(rows) for _ in range(self.world_size)]
        dist.all_gather(gathered, rows, group=self.group)
        return gathered

    def _agree_capture(self, step: int, new: list[int]) -> dict[str, Any] | None:
        """Rank 0 books a triggered window when it flagged a new straggler, and every rank books the
        same one: rank 0's decision is broadcast (each rank judges the same numbers, but ranks on
        different CPUs may round a borderline verdict differently, and one window must mean the
        same steps everywhere). [start step or -1, count, ranks...] on the watch's group."""
        message = torch.full((2 + MAX_NAMED,), -1, dtype=torch.int64)
        booked = None
        if self.rank == 0 and new:
            named = new[:MAX_NAMED]
            # step + 1's profiler action was fixed at this step's recorder.step(): the next free one
            booked = self.recorder.plan_capture(step + 2, self.last_step, {"watch_step": step, "ranks": named})
            if booked:
                message[0], message[1] = booked.start, len(named)
                message[2 : 2 + len(named)] = torch.tensor(named)
        self._broadcast(message)
        start, count = int(message[0]), int(message[1])
        if start < 0:
            return None
        why = {"watch_step": step, "ranks": message[2 : 2 + count].tolist()}
        if booked is None:  # the other ranks book the window rank 0 chose
            booked = self.recorder.book_capture(start, why)
        capture = {"first": booked.first, "last": booked.last, **why}
        self.captures.append(capture)
        return capture

    def _broadcast(self, message: torch.Tensor) -> None:
        dist.broadcast(message, src=0, group=self.group)

    def _act(self, step: int, judged: Judgement) -> None:
        verdict, new, gone = judged.verdict, judged.new, judged.gone
        self.bound_ms = verdict.threshold_ms
        for r in new:
            flag = {"step": step, "rank": r.rank, "host": r.host, "phase": r.phase, "late_ms": round(r.late_ms, 3)}
            if r.gpu:
                flag["gpu"] = r.gpu
            self.flags.append(flag)
        capture = None
        if self.cfg.capture_on_straggler and len(self.captures) < self.cfg.max_captures:
            capture = self._agree_capture(step, [r.rank for r in new])
        line = interval_line(step, verdict, capture)
        self.latest = {**line, "late_ms": {r.rank: round(r.late_ms, 3) for r in verdict.ranks}}
        mine = next((r for r in verdict.ranks if r.rank == self.rank), None)
        if mine and self.metrics:
            self.metrics.watch(mine.late_ms, mine.straggler, verdict.threshold_ms)
        if self.scalars:
            if mine:
                self.scalars.add(
                    step,
                    {
                        "watch/late_ms": mine.late_ms,
                        "watch/straggler": float(mine.straggler),
                        "watch/threshold_ms": verdict.threshold_ms,
                    },
                )
        if self.rank != 0:
            return
        for r in new:
            of = judged.verdict_of(r)
            bound = f"bound {of.threshold_ms:.1f} ms"
            untimed = ", by own work alone: NCCL has not timed their collectives yet" if of.own_work_only else ""
            _say(
                f"watch: step {step}: rank {r.rank} ({r.host}) is a straggler: {_where(r.phase, r.excess_ms)}, "
                f"{r.late_ms:.1f} ms/step late, {r.beyond_peers_ms:.1f} beyond its peers ({bound}), "
                f"late in {r.steps_late}/{len(of.steps)} steps {of.steps[0]}-{of.steps[-1]}{untimed}"
                + (f"; {r.gpu}" if r.gpu else "")
            )
        for rank in gone:
            _say(
                f"watch: step {step}: rank {rank} ({self.hosts.get(rank, '?')}) is no longer a straggler "
                f"(steps {verdict.steps[0]}-{verdict.steps[-1]})"
            )
        if new and self.cfg.capture_on_straggler:
            if capture:
                _say(
                    f"watch: step {step}: tracing steps {capture['first']}-{capture['last']} on every rank "
                    f"(capture {len(self.captures)} of at most {self.cfg.max_captures})"
                )
            elif len(self.captures) < self.cfg.max_captures:
                _say(
                    f"watch: step {step}: no trace captured: the run ends, or the profiler schedule traces, "
                    "before a window fits"
                )
        if judged.ahead is not None and judged.ahead is not verdict:
            line["ahead"] = {k: v for k, v in interval_line(step, judged.ahead, None).items() if k != "step"}
        if self._log:
            self._log.append((json.dumps(line) + "\n").encode())

    def summary(self) -> dict[str, Any]:
        """For run.json: the interval, what was flagged, which windows were captured."""
        return {
            "every": self.cfg.every if self.on else 0,
            "intervals": self.intervals,
            "judged_steps": self.judged_steps,
            "flags": self.flags,
            "captures": self.captures,
        }

    def close(self) -> None:
        if self._log and not self._log.close():
            self.faults.note(f"the watch log {self._log.path} could not all be written")


def interval_line(step: int, verdict: IntervalVerdict, capture: dict[str, Any] | None) -> dict[str, Any]:
    """One line of watch.jsonl."""
    line: dict[str, Any] = {
        "step": step,
        "steps": [verdict.steps[0], verdict.steps[-1]],
        "threshold_ms": round(verdict.threshold_ms, 3),
        "bounds_ms": {k: round(v, 3) for k, v in verdict.bounds_ms.items()},
        "stragglers": [
            {
                "rank": r.rank,
                "host": r.host,
                "phase": r.phase,
                "excess_ms": None if r.excess_ms is None else round(r.excess_ms, 3),
                "late_ms": round(r.late_ms, 3),
                "beyond_peers_ms": round(r.beyond_peers_ms, 3),
                "steps_late": r.steps_late,
                **({"gpu": r.gpu} if r.gpu else {}),
            }
            for r in verdict.stragglers
        ],
    }
    if verdict.own_work_only:
        line["own_work_only"] = True
    if capture:
        line["capture"] = capture
    return line


def _where(phase: str | None, excess_ms: float | None) -> str:
    if phase is None or excess_ms is None:
        return "no single phase stands out"
    return f"{phase} +{excess_ms:.1f} ms/step over the other ranks' median"


def _say(line: str) -> None:
    print(line, flush=True)
