"""Always-on metrics: every rank's step, phases, memory, watch verdict and tracing state as
Prometheus metrics while the job runs (`--metrics-port`, `--metrics-file`; off by default).

Where they are served, and why: each rank serves its own endpoint on `port + local_rank`
(`http://<host>:<port+local_rank>/metrics`). A single endpoint per node would need every local
rank to ship its values to one process each step (IPC on the training's critical path), and a
rank that dies would leave stale values in it; per-rank endpoints are independent, and a dead
rank's target goes `up == 0`, itself an alert. `--metrics-file PATH` writes the node
exporter's textfile format instead (or as well): one file per rank (`{rank}`/`{local_rank}` in
PATH, else `.rank<R>` before the suffix when there is more than one rank), rewritten atomically
(a temporary file renamed) at most once a second (FILE_INTERVAL_S) and at the end.

What is updated, and when (`step`): from the step record the step clock hands over once the
step's device work is done (CUDA events, no host-device synchronisation), so a step costs a few
gauge updates (`bench/overhead.py`, variant P). Every series carries the labels run, rank,
local_rank and host; docs/metrics.md says what each one means.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary, start_http_server, write_to_textfile

from harness.write_faults import FaultLog

FILE_INTERVAL_S = 1.0  # the textfile is rewritten at most this often (a write is ~0.2 ms)
LABELS = ("run", "rank", "local_rank", "host")


@dataclass(frozen=True)
class MetricsTarget:
    """Where this rank's metrics go: an HTTP port (None: none), an address to bind, a file (None: none)."""

    port: int | None
    addr: str
    file: Path | None


def rank_file(template: str, rank: int, local_rank: int, world_size: int) -> Path:
    """This rank's textfile: `{rank}`/`{local_rank}` in the template filled in; without them, one
    rank writes the path as given and more insert `.rank<R>` before its suffix (the textfile
    collector reads every `*.prom` in its folder)."""
    if "{rank}" in template or "{local_rank}" in template:
        return Path(template.format(rank=rank, local_rank=local_rank))
    path = Path(template)
    if world_size == 1:
        return path
    return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


class Metrics:
    """One rank's metrics (module docstring). `start` serves and/or files them; `step`, `watch`
    and `tracing` update them; `close` writes the file a last time and stops serving."""

    def __init__(self, labels: dict[str, str], target: MetricsTarget, faults: FaultLog) -> None:
        self.target, self.faults = target, faults
        self.registry = r = CollectorRegistry(auto_describe=True)
        names = list(LABELS)

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*names, *extra], registry=r)

        self._steps = Counter("harness_steps", "steps recorded by this rank", names, registry=r).labels(**labels)
        self._step = Summary("harness_step_seconds", "step time (device time on GPU)", names, registry=r).labels(
            **labels
        )
        self._last_step = gauge("harness_step_last_seconds", "the last recorded step's time").labels(**labels)
        self._phase_last = gauge("harness_phase_last_seconds", "the last step's time in each phase", ("phase",))
        self._phase_total = Counter(
            "harness_phase_seconds",
            "time in each phase over the run (its rate: the phases stacked)",
            [*names, "phase"],
            registry=r,
        )
        self._data_wait = gauge("harness_data_wait_seconds", "the last step's host time blocked on the data loader")
        self._outside = gauge("harness_outside_step_seconds", "host time between the last two steps, in no step")
        self._throughput = gauge("harness_throughput_samples_per_second", "samples per second in the last step")
        self._rss = gauge("harness_host_rss_bytes", "resident memory of this rank's process")
        self._gpu_alloc = gauge("harness_gpu_peak_allocated_bytes", "peak GPU memory allocated in the last step")
        self._gpu_reserved = gauge("harness_gpu_peak_reserved_bytes", "peak GPU memory reserved in the last step")
        self._host_cpu = gauge("harness_host_cpu_percent", "the host's CPU use (all cores, %)")
        self._proc_cpu = gauge("harness_process_cpu_percent", "this process's CPU use (% of one core)")
        self._late = gauge("harness_watch_late_seconds", "the watch's lateness of this rank per step, last interval")
        self._threshold = gauge("harness_watch_threshold_seconds", "the watch's straggler bound, last interval")
        self._straggler = gauge("harness_watch_straggler", "1 when the watch flags this rank as a straggler, else 0")
        self._intervals = Counter("harness_watch_intervals", "intervals the watch judged", names, registry=r)
        self._recording = gauge("harness_tracing_recording", "1 while the profiler records this rank's steps")
        self._windows = gauge("harness_tracing_windows_written", "trace windows written")
        self._skipped = gauge("harness_tracing_windows_skipped", "trace windows skipped (a write failed)")
        self._failures = gauge("harness_write_failures", "profiler-side writes that failed (training went on)")
        self._syncs = gauge("harness_trace_syncs_per_step", "blocking host-device syncs per step, last traced window")
        self._sync_cost = gauge(
            "harness_trace_sync_cost_seconds", "device idle the syncs caused per step, last traced window"
        )
        self._launches = gauge("harness_trace_launches_per_step", "kernel launches per step, last traced window")
        self.labels = labels
        self._children: dict[tuple[Gauge | Counter, str], Any] = {}
        self._bound = {
            g: g.labels(**labels)
            for g in (
                self._data_wait,
                self._outside,
                self._throughput,
                self._rss,
                self._gpu_alloc,
                self._gpu_reserved,
                self._host_cpu,
                self._proc_cpu,
                self._late,
                self._threshold,
                self._straggler,
                self._recording,
                self._windows,
                self._skipped,
                self._failures,
                self._syncs,
                self._sync_cost,
                self._launches,
            )
        }
        self._intervals_bound = self._intervals.labels(**labels)
        self._straggler.labels(**labels).set(0)
        self.server: Any = None
        self._written_at = 0.0

    @classmethod
    def start(cls, labels: dict[str, str], target: MetricsTarget, faults: FaultLog) -> Metrics:
        """The rank's metrics, served on `target.port` when given: a port that cannot be bound
        (in use, not allowed) is said in one line and the job goes on without the endpoint."""
        m = cls(labels, target, faults)
        if target.port is not None:
            try:
                m.server, _ = start_http_server(target.port, addr=target.addr, registry=m.registry)
            except OSError as exc:
                faults.note(
                    f"metrics: cannot serve on {target.addr or '*'}:{target.port} ({exc.strerror or exc}); "
                    "the job goes on without this rank's endpoint (pick another --metrics-port)"
                )
        m._write_file(force=True)
        return m

    def _child(self, metric: Gauge | Counter, phase: str) -> Any:
        key = (metric, phase)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(**self.labels, phase=phase)
        return child

    def step(self, rec: dict[str, Any]) -> None:
        """A step record (timing.StepClock's, with the system sample): the step's metrics."""
        step_s = rec["step_ms"] / 1e3
        self._steps.inc()
        self._step.observe(step_s)
        self._last_step.set(step_s)
        for phase, ms in (rec.get("phases_ms") or {}).items():
            self._child(self._phase_last, phase).set(ms / 1e3)
            self._child(self._phase_total, phase).inc(max(ms, 0.0) / 1e3)
        b = self._bound
        b[self._data_wait].set(rec.get("data_ms", 0.0) / 1e3)
        b[self._outside].set(rec.get("outside_step_ms", 0.0) / 1e3)
        samples = rec.get("samples")
        if samples and step_s > 0:
            b[self._throughput].set(samples / step_s)
        for key, metric in (
            ("rss_bytes", self._rss),
            ("gpu_peak_allocated_bytes", self._gpu_alloc),
            ("gpu_peak_reserved_bytes", self._gpu_reserved),
            ("host_cpu_util_pct", self._host_cpu),
            ("proc_cpu_pct", self._proc_cpu),
        ):
            value = rec.get(key)
            if isinstance(value, (int, float)):
                b[metric].set(value)
        b[self._recording].set(1.0 if rec.get("profiler") == "record" else 0.0)
        self._write_file()

    def watch(self, late_ms: float, straggler: bool, threshold_ms: float) -> None:
        """The watch's verdict on this rank for the interval it just judged."""
        b = self._bound
        b[self._late].set(late_ms / 1e3)
        b[self._threshold].set(threshold_ms / 1e3)
        b[self._straggler].set(1.0 if straggler else 0.0)
        self._intervals_bound.inc()

    def tracing(self, written: int, skipped: int, failures: int) -> None:
        b = self._bound
        b[self._windows].set(written)
        b[self._skipped].set(skipped)
        b[self._failures].set(failures)

    def window(self, trace: Any) -> None:
        """A traced window as its in-job summary parsed it (a `RankTrace`, with --trace-summary):
        its syncs, their device cost and its launches, per step."""
        steps = trace.steps
        if not steps:
            return
        b = self._bound
        b[self._syncs].set(sum(s.syncs for s in steps) / len(steps))
        b[self._sync_cost].set(sum(s.sync_cost_us for s in steps) / len(steps) / 1e6)
        b[self._launches].set(sum(s.launches for s in steps) / len(steps))

    def _write_file(self, force: bool = False) -> None:
        path = self.target.file
        if path is None:
            return
        now = time.monotonic()
        if not force and now - self._written_at < FILE_INTERVAL_S:
            return
        self._written_at = now
        try:
            write_to_textfile(str(path), self.registry)  # a temporary file renamed over it
        except OSError as exc:
            self.faults.report("metrics file", exc, "metrics go on being served where a port is set", path)

    def close(self) -> None:
        """The file's last rewrite; the endpoint stops."""
        self._write_file(force=True)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def metrics_target(port: int | None, addr: str, file: str | None, rank: int, local_rank: int, world: int) -> Any:
    """This rank's MetricsTarget, or None when metrics are off (neither a port nor a file)."""
    if port is None and file is None:
        return None
    return MetricsTarget(
        port=None if port is None else port + local_rank,
        addr=addr,
        file=None if file is None else rank_file(os.path.expanduser(file), rank, local_rank, world),
    )
