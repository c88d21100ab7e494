"""TensorBoard scalars, written with TensorBoard's own event-file writer (no torch needed).

Used by the training job (one writer per rank, under `<run>/tb/rank<R>/`) and by the collector
(under `<report>/tb/rank<R>/`). Tag names carry their unit.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

from harness.write_faults import AppendOnlyFile, FaultLog

# Step record key (from harness.run.timing / harness.run.stats) -> TensorBoard tag.
STEP_TAGS = {
    "step_ms": "step/time_ms",
    "data_ms": "step/data_wait_ms",
    "outside_step_ms": "step/outside_step_ms",
    "rss_bytes": "memory/host_rss_bytes",
    "heap_in_use_bytes": "memory/heap_in_use_bytes",
    "heap_free_bytes": "memory/heap_free_bytes",
    "gpu_peak_allocated_bytes": "memory/gpu_peak_allocated_bytes",
    "gpu_peak_reserved_bytes": "memory/gpu_peak_reserved_bytes",
    "host_cpu_util_pct": "system/host_cpu_util_pct",
    "proc_cpu_pct": "system/process_cpu_pct",
}
THROUGHPUT_TAG = "step/throughput_samples_per_s"
PHASE_TAG = "phase/{phase}_ms"
P2P_WAIT_TAG = "p2p_wait/{phase}_ms"  # the phase's waiting at point-to-point ops (comm_wait.py)
COLLECTIVE_WAIT_TAG = "collective_wait/{phase}_ms"  # ... and at collectives waited on from Python
_counter = itertools.count()


def step_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The scalars of one step record: every `STEP_TAGS` key present with a number, each
    phase's duration but data's, each phase's waiting at point-to-point ops and at collectives
    where it waited (comm_wait.py), and throughput = samples / step time."""
    out = {tag: float(record[key]) for key, tag in STEP_TAGS.items() if isinstance(record.get(key), (int, float))}
    for phase, ms in (record.get("phases_ms") or {}).items():
        if phase != "data":  # already step/data_wait_ms
            out[PHASE_TAG.format(phase=phase)] = float(ms)
    for phase, ms in (record.get("phases_p2p_ms") or {}).items():
        out[P2P_WAIT_TAG.format(phase=phase)] = float(ms)
    for phase, ms in (record.get("phases_collective_wait_ms") or {}).items():
        out[COLLECTIVE_WAIT_TAG.format(phase=phase)] = float(ms)
    step_ms, samples = record.get("step_ms"), record.get("samples")
    if isinstance(step_ms, (int, float)) and step_ms > 0 and isinstance(samples, (int, float)):
        out[THROUGHPUT_TAG] = samples / (step_ms / 1e3)
    return out


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`."""
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _load_crc32c() -> Any:
    try:
        import google_crc32c  # C implementation: ~1 us per event

        return google_crc32c.value
    except ImportError:  # TensorBoard's pure-Python one: ~50 us per event
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

        return lambda data: crc32c(data)


_crc32c = _load_crc32c()


def _record(payload: bytes) -> bytes:
    """One TFRecord: length, masked CRC of the length, payload, masked CRC of the payload."""
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", _masked_crc32c(header)) + payload + struct.pack("<I", _masked_crc32c(payload))


class ScalarWriter:
    """Scalar events in one new TensorBoard event file in `logdir`.

    `add` only keeps the values (a few microseconds); the events are encoded and written by the
    caller's thread every `flush_secs` and at `close`, so the training loop pays no background
    thread contending for the GIL and no per-step file write.
    """

    def __init__(self, logdir: Path, flush_secs: float = 5.0, faults: FaultLog | None = None) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event, self._summary = Event, Summary
        self.logdir = logdir
        self.flush_secs = flush_secs
        now = time.time()
        # TensorBoard reads files whose name contains "tfevents"; the suffix keeps two writers
        # of one process (or one pid reused) from sharing a file.
        self.path = logdir / f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.{next(_counter)}"
        self._header = _record(Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        # A disk that refuses the events does not stop training (write_faults.AppendOnlyFile); a
        # file re-created after its folder was removed starts with what it held, header first.
        self._file = AppendOnlyFile(self.path, faults or FaultLog(), "TensorBoard scalars")
        self._file.append(self._header)
        self._pending: list[tuple[int, float, dict[str, float]]] = []
        self._last_flush = time.monotonic()
        self._closed = False

    def add(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        self._pending.append((step, time.time() if wall_time is None else wall_time, values))
        if time.monotonic() - self._last_flush >= self.flush_secs:
            self.flush()

    def flush(self) -> bool:
        """Encode and write the points added since the last flush; False when the disk refused them
        (they wait in memory)."""
        Event, Summary = self._event, self._summary
        chunk = []
        for step, wall, values in self._pending:
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
            chunk.append(_record(Event(wall_time=wall, step=step, summary=summary).SerializeToString()))
        self._pending.clear()
        self._last_flush = time.monotonic()
        if chunk:
            self._file.append(b"".join(chunk))
        return self._file.flush()

    def close(self) -> bool:
        if self._closed:
            return True
        self._closed = True
        self.flush()
        return self._file.close()


def clear_event_files(logdir: Path) -> None:
    """Remove the event files a previous writer left in `logdir` (only those), so a rewrite
    does not draw every point twice."""
    if logdir.is_dir():
        for p in logdir.glob("events.out.tfevents.*"):
            p.unlink()
