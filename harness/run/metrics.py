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
step's device work is done (CUDA events, no host-device synchronisation); a step only keeps its
record and adds to a few sums, and the families are built when read (bench/RESULTS.md,
"Harness and profiler overhead"). Every series carries the labels run, rank, local_rank and
host; docs/metrics.md says what each one means.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.core import Metric

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


# (record key, metric name, help, scale to the metric's unit): the last step record's gauges
_LAST_STEP = (
    ("step_ms", "harness_step_last_seconds", "the last recorded step's time", 1e-3),
    ("data_ms", "harness_data_wait_seconds", "the last step's host time blocked on the data loader", 1e-3),
    ("outside_step_ms", "harness_outside_step_seconds", "host time between the last two steps, in no step", 1e-3),
    ("rss_bytes", "harness_host_rss_bytes", "resident memory of this rank's process", 1.0),
    ("heap_in_use_bytes", "harness_heap_in_use_bytes", "bytes malloc has handed out and not taken back (glibc)", 1.0),
    ("heap_free_bytes", "harness_heap_free_bytes", "free bytes malloc holds for reuse, part of the RSS (glibc)", 1.0),
    ("gpu_peak_allocated_bytes", "harness_gpu_peak_allocated_bytes", "peak GPU memory allocated in the last step", 1.0),
    ("gpu_peak_reserved_bytes", "harness_gpu_peak_reserved_bytes", "peak GPU memory reserved in the last step", 1.0),
    ("host_cpu_util_pct", "harness_host_cpu_percent", "the host's CPU use (all cores, %)", 1.0),
    ("proc_cpu_pct", "harness_process_cpu_percent", "this process's CPU use (% of one core)", 1.0),
    # NVML's latest reading of the rank's GPU (gpu_health.py; GPU runs with nvidia-ml-py)
    ("gpu_sm_clock_mhz", "harness_gpu_sm_clock_hertz", "the GPU's SM clock, latest reading", 1e6),
    ("gpu_power_w", "harness_gpu_power_watts", "the GPU's power draw, latest reading", 1.0),
    ("gpu_temp_c", "harness_gpu_temperature_celsius", "the GPU's temperature, latest reading", 1.0),
    ("gpu_util_pct", "harness_gpu_utilization_percent", "the GPU's utilisation (% of the last sample period)", 1.0),
    ("gpu_throttled", "harness_gpu_throttled", "1 when a throttle reason slows the GPU (power, temperature...)", 1.0),
    ("gpu_ecc_uncorrected", "harness_gpu_ecc_uncorrected_errors", "the GPU's uncorrected ECC errors", 1.0),
)
# (attribute, metric name, help): gauges of the watch, the tracing state and the last traced window
_STATE = (
    ("late_s", "harness_watch_late_seconds", "the watch's lateness of this rank per step, last interval"),
    ("threshold_s", "harness_watch_threshold_seconds", "the watch's straggler bound, last interval"),
    ("straggler", "harness_watch_straggler", "1 when the watch flags this rank as a straggler, else 0"),
    ("syncs", "harness_trace_syncs_per_step", "blocking host-device syncs per step, last traced window"),
    ("sync_cost_s", "harness_trace_sync_cost_seconds", "device idle the syncs caused per step, last traced window"),
    ("launches", "harness_trace_launches_per_step", "kernel launches per step, last traced window"),
)
# (position in `tracing_source()`'s tuple, metric name, help): read when the metrics are read
_TRACING = (
    (0, "harness_tracing_windows_written", "trace windows written"),
    (1, "harness_tracing_windows_skipped", "trace windows skipped (a write failed)"),
    (2, "harness_write_failures", "profiler-side writes that failed (training went on)"),
)


class Metrics:
    """One rank's metrics (module docstring). `start` serves and/or files them; `step`, `watch`
    and `window` update them, and `tracing_source` (when set) is asked for the tracing counts
    when they are read; `close` writes the file a last time and stops serving.

    A step only keeps its record and adds to a few sums; the metric families are built from them
    when they are read (a scrape, the textfile's rewrite), in `collect`: a registry's custom
    collector. The record is replaced whole, so a scrape in the server's thread reads one step's
    values, never a mix."""

    def __init__(self, labels: dict[str, str], target: MetricsTarget, faults: FaultLog) -> None:
        self.target, self.faults = target, faults
        self.label_names = list(LABELS)
        self.label_values = [labels[k] for k in LABELS]
        self.steps = 0
        self.step_sum_s = 0.0
        self.phase_sum_s: dict[str, float] = {}
        self.last: dict[str, Any] = {}
        self.intervals = 0
        self.state: dict[str, float] = {"straggler": 0.0}
        # (windows written, windows skipped, write failures): counts the run keeps anyway
        self.tracing_source: Callable[[], tuple[int, int, int]] | None = None
        # prometheus_client is imported by a rank that has metrics only: ~0.1 s of every rank's
        # start-up otherwise
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(self)
        self.server: Any = None
        self._written_at = 0.0

    @classmethod
    def start(cls, labels: dict[str, str], target: MetricsTarget, faults: FaultLog) -> Metrics:
        """The rank's metrics, served on `target.port` when given: a port that cannot be bound
        (in use, not allowed) is said in one line and the job goes on without the endpoint."""
        m = cls(labels, target, faults)
        if target.port is not None:
            from prometheus_client import start_http_server

            try:
                m.server, _ = start_http_server(target.port, addr=target.addr, registry=m.registry)
            except (OSError, OverflowError, ValueError) as exc:  # in use, not allowed; past 65535; a bad address
                reason = getattr(exc, "strerror", None) or exc
                faults.note(
                    f"metrics: cannot serve on {target.addr or '0.0.0.0'}:{target.port} ({reason}); "
                    "the job goes on without this rank's endpoint (pick another --metrics-port)"
                )
        m._write_file(force=True)
        return m

    def step(self, rec: dict[str, Any]) -> None:
        """A step record (timing.StepClock's, with the system sample)."""
        self.steps += 1
        self.step_sum_s += rec["step_ms"] / 1e3
        sums = self.phase_sum_s
        for phase, ms in (rec.get("phases_ms") or {}).items():
            sums[phase] = sums.get(phase, 0.0) + max(ms, 0.0) / 1e3
        # memory is read within a time budget, not every step (stats.SystemSampler): a gauge
        # keeps its latest reading
        self.last = {**self.last, **rec}
        if self.target.file is not None:
            self._write_file()

    def watch(self, late_ms: float, straggler: bool, threshold_ms: float) -> None:
        """The watch's verdict on this rank for the interval it just judged."""
        self.state = {
            **self.state,
            "late_s": late_ms / 1e3,
            "threshold_s": threshold_ms / 1e3,
            "straggler": float(straggler),
        }
        self.intervals += 1

    def window(self, trace: Any) -> None:
        """A traced window as its in-job summary parsed it (a `RankTrace`, with --trace-summary):
        its syncs, their device cost and its launches, per step."""
        steps = trace.steps
        if not steps:
            return
        n = len(steps)
        self.state = {
            **self.state,
            "syncs": sum(s.syncs for s in steps) / n,
            "sync_cost_s": sum(s.sync_cost_us for s in steps) / n / 1e6,
            "launches": sum(s.launches for s in steps) / n,
        }

    def collect(self) -> Iterator[Metric]:
        """The metric families, from the kept values (a registry calls this on each read)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

        names, values = self.label_names, self.label_values
        rec, state = self.last, self.state
        steps = CounterMetricFamily("harness_steps", "steps recorded by this rank", labels=names)
        steps.add_metric(values, self.steps)
        yield steps
        step = SummaryMetricFamily("harness_step_seconds", "step time (device time on GPU)", labels=names)
        step.add_metric(values, self.steps, self.step_sum_s)
        yield step
        for key, name, doc, scale in _LAST_STEP:
            value = rec.get(key)
            if isinstance(value, (int, float)):
                g = GaugeMetricFamily(name, doc, labels=names)
                g.add_metric(values, value * scale)
                yield g
        step_ms, samples = rec.get("step_ms"), rec.get("samples")
        if samples and step_ms:
            g = GaugeMetricFamily(
                "harness_throughput_samples_per_second", "samples per second, last step", labels=names
            )
            g.add_metric(values, samples / (step_ms / 1e3))
            yield g
        phases = rec.get("phases_ms") or {}
        last = GaugeMetricFamily(
            "harness_phase_last_seconds", "the last step's time in each phase", labels=[*names, "phase"]
        )
        for phase, ms in phases.items():
            last.add_metric([*values, phase], ms / 1e3)
        yield last
        total = CounterMetricFamily(
            "harness_phase_seconds",
            "time in each phase over the run (its rate: the phases stacked)",
            labels=[*names, "phase"],
        )
        for phase, secs in list(self.phase_sum_s.items()):
            total.add_metric([*values, phase], secs)
        yield total
        g = GaugeMetricFamily(
            "harness_tracing_recording", "1 while the profiler records this rank's steps", labels=names
        )
        g.add_metric(values, 1.0 if rec.get("profiler") == "record" else 0.0)
        yield g
        intervals = CounterMetricFamily("harness_watch_intervals", "intervals the watch judged", labels=names)
        intervals.add_metric(values, self.intervals)
        yield intervals
        for key, name, doc in _STATE:
            if key in state:
                g = GaugeMetricFamily(name, doc, labels=names)
                g.add_metric(values, state[key])
                yield g
        if self.tracing_source is not None:
            counts = self.tracing_source()
            for i, name, doc in _TRACING:
                g = GaugeMetricFamily(name, doc, labels=names)
                g.add_metric(values, counts[i])
                yield g

    def describe(self) -> list[Metric]:
        return []  # families appear as values come; a registry without descriptions calls collect

    def _write_file(self, force: bool = False) -> None:
        path = self.target.file
        if path is None:
            return
        now = time.monotonic()
        if not force and now - self._written_at < FILE_INTERVAL_S:
            return
        self._written_at = now
        from prometheus_client import write_to_textfile

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


def metrics_target(
    port: int | None, addr: str, file: str | None, rank: int, local_rank: int, world: int
) -> MetricsTarget | None:
    """This rank's MetricsTarget, or None when metrics are off (neither a port nor a file)."""
    if port is None and file is None:
        return None
    return MetricsTarget(
        port=None if port is None else port + local_rank,
        addr=addr,
        file=None if file is None else rank_file(os.path.expanduser(file), rank, local_rank, world),
    )
