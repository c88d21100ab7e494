"""TensorBoard scalars, written with TensorBoard's own event-file writer (no torch needed).

Used by the training job (one writer per rank, under `<run>/tb/rank<R>/`) and by the collector
(under `<report>/tb/rank<R>/`). Tag names carry their unit.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

# Step record key (from harness.timing / harness.stats) -> TensorBoard tag.
STEP_TAGS = {
    "step_ms": "step/time_ms",
    "data_ms": "step/data_wait_ms",
    "outside_step_ms": "step/outside_step_ms",
    "rss_bytes": "memory/host_rss_bytes",
    "gpu_peak_allocated_bytes": "memory/gpu_peak_allocated_bytes",
    "gpu_peak_reserved_bytes": "memory/gpu_peak_reserved_bytes",
    "host_cpu_util_pct": "system/host_cpu_util_pct",
    "proc_cpu_pct": "system/process_cpu_pct",
}
THROUGHPUT_TAG = "step/throughput_samples_per_s"
PHASE_TAG = "phase/{phase}_ms"


def step_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one step record: every `STEP_TAGS` key present with a number, each
    phase's duration but data's, and throughput = samples / step time."""
    out = {tag: float(record[key]) for key, tag in STEP_TAGS.items() if isinstance(record.get(key), (int, float))}
    for phase, ms in (record.get("phases_ms") or {}).items():
        if phase != "data":  # already step/data_wait_ms
            out[PHASE_TAG.format(phase=phase)] = float(ms)
    step_ms, samples = record.get("step_ms"), record.get("samples")
    if isinstance(step_ms, (int, float)) and step_ms > 0 and isinstance(samples, (int, float)):
        out[THROUGHPUT_TAG] = samples / (step_ms / 1e3)
    return out


class ScalarWriter:
    """Appends scalar events to one new event file in `logdir`.

    TensorBoard's writer queues events for a background thread and flushes every
    `flush_secs`, so `add` costs the training loop a protobuf build and a queue put.
    """

    def __init__(self, logdir: Path, flush_secs: float = 5.0) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        self._writer = EventFileWriter(str(logdir), max_queue_size=100, flush_secs=flush_secs)

    def add(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
        self._writer.add_event(Event(wall_time=time.time() if wall_time is None else wall_time, step=step,
                                     summary=summary))

    def close(self) -> None:
        self._writer.close()


def clear_event_files(logdir: Path) -> None:
    """Remove the event files a previous writer left in `logdir` (only those), so a rewrite
    does not draw every point twice."""
    if logdir.is_dir():
        for p in logdir.glob("events.out.tfevents.*"):
            p.unlink()
