"""Flight Recorder on the training side: turn it on, point NCCL's own dumps at the run, and
write each rank's record of the collectives it issued when the job goes wrong.

PyTorch's Flight Recorder keeps, per process, a ring buffer of the last N collectives each
process group issued (sequence number, name, sizes, state, time). When one rank stops
entering collectives, the others block inside one until the process group's timeout; the
dumps then say which rank never entered which collective (harness/traces/analyse/flight.py).

Cost: one small record per collective (a few hundred bytes, strings shared), so with the
default 2000 entries at most ~1 MB per process, a fixed buffer; recording is a mutex and a
copy of the sizes, microseconds against a collective's tens of microseconds or more. No extra
synchronisation, no extra collective.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.atomic import write_text_atomic
from harness.paths import NCCL_DUMP_PREFIX, flight_dir, flight_path
from harness.write_faults import FaultLog

BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # the first is read first by torch
NCCL_DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# gloo: "Timed out waiting 20000ms for recv operation"; NCCL: "Watchdog caught collective
# operation timeout"; torch: "... timed out after ...".
TIMEOUT_PATTERN = re.compile(r"timed? ?out|timeout", re.IGNORECASE)


@dataclass
class Progress:
    """Where the training loop is: updated by the trainer at each phase, read when dumping."""

    step: int | None = None
    phase: str | None = None


def enable(entries: int, backend: str, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Turn the recorder on before the process group exists; returns the variables set.

    1. TORCH_FR_BUFFER_SIZE = `entries`, unless the user set it (or its older NCCL name): the
       recorder reads it when the first process group is created, so this must run before;
    2. NCCL only: TORCH_NCCL_DUMP_ON_TIMEOUT=1 (read by the process group's constructor), so
       its watchdog dumps every rank's recorder when a collective times out, unless set;
    3. NCCL only: TORCH_NCCL_ENABLE_TIMING=1 (read by the constructor too), unless set: each
       collective also records a CUDA start event, and the recorder keeps its `duration_ms`,
       from which the live watch reads when a GPU rank arrived at it (arrivals.py). One more
       event record per collective, on the NCCL stream, which already records the end one.
    """
    env = os.environ if environ is None else environ
    set_now: list[str] = []
    if entries > 0 and not any(v in env for v in BUFFER_VARS):
        env["TORCH_FR_BUFFER_SIZE"] = str(entries)
        set_now.append("TORCH_FR_BUFFER_SIZE")
    if backend == "nccl" and entries > 0 and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env:
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
        set_now.append("TORCH_NCCL_DUMP_ON_TIMEOUT")
    if backend == "nccl" and entries > 0 and "TORCH_NCCL_ENABLE_TIMING" not in env:
        env["TORCH_NCCL_ENABLE_TIMING"] = "1"
        set_now.append("TORCH_NCCL_ENABLE_TIMING")
    return set_now


def point_nccl_dumps(run_dir: Path, backend: str, environ: MutableMapping[str, str] | None = None) -> str | None:
    """NCCL: the watchdog's dump file prefix -> `<run>/flight/nccl_trace_rank_` (torch appends the
    rank), unless the user set one. torch reads it when it writes its first dump, so setting it
    once the run folder is known (after the process group exists) is in time. Returns the prefix set."""
    env = os.environ if environ is None else environ
    if backend != "nccl" or any(v in env for v in NCCL_DUMP_VARS):
        return None
    flight_dir(run_dir).mkdir(parents=True, exist_ok=True)
    prefix = str(flight_dir(run_dir) / NCCL_DUMP_PREFIX)
    env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = prefix
    return prefix


def is_timeout(exc: BaseException) -> bool:
    """Whether `exc` is a collective that timed out (gloo's or NCCL's wording)."""
    return isinstance(exc, RuntimeError) and bool(TIMEOUT_PATTERN.search(str(exc)))


def recorder_json(backend: str) -> dict[str, Any]:
    """This process's Flight Recorder as torch dumps it (JSON), parsed."""
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_nccl_trace_json", None) if backend == "nccl" else None
    raw = (dump or c10d._dump_fr_trace_json)()  # type: ignore[attr-defined]  # private, not in the stub
    return json.loads(raw)


def write_dump(
    run_dir: Path,
    *,
    rank: int,
    world_size: int,
    backend: str,
    reason: str,
    progress: Progress,
    host: str,
    faults: FaultLog,
) -> Path | None:
    """Write this rank's recorder to `<run>/flight/rank<R>.json`, whole or not at all.

    1. torch's JSON dump as it is (so torch's own tools and other readers take it), plus a
       `harness` key: {rank, world_size, host, pid, backend, reason, step, phase, dumped_ns}:
       where this rank was (the step and phase it was in) and why it dumped;
    2. any failure (no recorder, a full disk) is one warning; the rank's ending goes on.
    """
    path = flight_path(run_dir, rank)
    try:
        doc = recorder_json(backend)
        doc["harness"] = {
            "rank": rank,
            "world_size": world_size,
            "host": host,
            "pid": os.getpid(),
            "backend": backend,
            "reason": reason,
            "step": progress.step,
            "phase": progress.phase,
            "dumped_ns": time.time_ns(),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(doc))
    except Exception as exc:  # noqa: BLE001 - a dump that fails must not hide why the rank stops
        faults.report("flight recorder dump", exc, "no dump from this rank", path)
        return None
    return path
