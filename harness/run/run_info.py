"""The run's identity (agreed by all ranks), its output folder, and `run.json`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from harness.atomic import write_text_atomic
from harness.paths import ELASTIC_FILE, STEPS_DIR, TRACE_PATTERN, attempt_dir, run_file
from harness.run.settings import ConfigError, LaunchEnv, OutputConfig

MIN_FREE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class RunIdentity:
    name: str
    run_id: str
    started_at: str
    dir: Path  # this attempt's folder: the run folder, or <run>/restart-N after N elastic restarts
    attempt: int = 0


def elastic_attempt() -> tuple[int, str | None]:
    """(torchrun's restart count of this worker, torchrun's run id) from the environment."""
    try:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    except ValueError:
        attempt = 0
    return attempt, os.environ.get("TORCHELASTIC_RUN_ID") or None


def _restarted_run(root: Path, elastic_id: str | None) -> str | None:
    """The run folder under `root` whose attempt 0 recorded torchrun's run id `elastic_id`."""
    if elastic_id is None:
        return None
    for marker in sorted(root.glob(f"*/{ELASTIC_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            if json.loads(marker.read_text()).get("elastic_run_id") == elastic_id:
                return marker.parent.name
        except (OSError, ValueError, AttributeError):
            continue
    return None


def host_name() -> str:
    return socket.gethostname()


def _holds_run(path: Path) -> bool:
    if not path.is_dir():
        return False
    if (path / STEPS_DIR).exists() or run_file(path).exists():
        return True
    return any(TRACE_PATTERN.match(p.name) for p in path.iterdir())


def check_output(out: OutputConfig) -> None:
    """Fail before training, not at step 500: the log folder must be writable with room left,
    and an explicit run name must not overwrite an earlier run."""
    root = Path(out.log_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            "output.log_dir", f"cannot write to {root} ({exc.strerror}); pass a writable --log-dir"
        ) from None
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(
            "output.log_dir", f"{root} has only {free // 2**20} MiB free; free space or pass another --log-dir"
        )
    if out.run_name is not None and _holds_run(root / out.run_name) and elastic_attempt()[0] == 0:
        raise ConfigError(
            "output.run_name", f"{root / out.run_name} already holds a run; pick another --run-name or remove it"
        )


def check_output_everywhere(out: OutputConfig) -> None:
    """`check_output` on every rank, and every rank raises the first rank's problem, before any
    rank writes: each rank's check is gathered, so none goes on to create the run folder (in
    `agree_identity`) while a slower one has yet to look at it and would take it for an earlier
    run; and a rank whose disk refuses does not leave the others waiting in a collective."""
    try:
        check_output(out)
        mine: tuple[str, str] | None = None
    except ConfigError as exc:
        mine = (exc.field, exc.message)
    first = next((p for p in gather(mine) if p is not None), None)
    if first is not None:
        raise ConfigError(*first)


def agree_identity(output: OutputConfig, job_name: str, env: LaunchEnv) -> RunIdentity:
    """Rank 0 picks the run name (`output.run_name`, else `<job_name>-ws<N>-<time>`) and id;
    every other rank receives them."""
    payload: list[Any] = [None]
    attempt, elastic_id = elastic_attempt()
    if env.rank == 0:
        root = Path(output.log_dir)
        started = time.strftime("%Y%m%d-%H%M%S")
        name = output.run_name
        if name is None and attempt > 0:
            name = _restarted_run(root, elastic_id)
        if name is None:
            base = f"{job_name}-ws{env.world_size}-{started}"
            name, n = base, 1
            while (root / name).exists():
                n += 1
                name = f"{base}-{n}"
        payload = [(name, uuid.uuid4().hex[:12], started)]
    if dist.is_initialized():
        dist.broadcast_object_list(payload, src=0)
    name, run_id, started = payload[0]
    run_dir = Path(output.log_dir) / name
    here = attempt_dir(run_dir, attempt)
    here.mkdir(parents=True, exist_ok=True)
    if env.rank == 0 and attempt == 0 and elastic_id is not None:
        (run_dir / ELASTIC_FILE).write_text(json.dumps({"elastic_run_id": elastic_id}))
    return RunIdentity(name=name, run_id=run_id, started_at=started, dir=here, attempt=attempt)


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (just `[obj]` without a process group)."""
    if not dist.is_initialized():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return "cpu"


def write_run_json(
    ident: RunIdentity,
    config: dict[str, Any],
    env: LaunchEnv,
    device: torch.device,
    ranks: list[dict[str, Any]],
    watch: dict[str, Any] | None = None,
    *,
    parallel: str,
    debug_server: dict[str, Any] | None = None,
) -> Path:
    """`run.json`: the run's identity, its `config` (the lab's, or a harness.Run's), launch,
    versions and every rank's row."""
    doc = {
        "run_name": ident.name,
        "run_id": ident.run_id,
        "attempt": ident.attempt,
        "started_at": ident.started_at,
        "finished_at": time.strftime("%Y%m%d-%H%M%S"),
        "config": config,
        "world_size": env.world_size,
        "hosts": sorted({r["host"] for r in ranks}),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "parallel": parallel,
        "device": device_description(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "ranks": ranks,
        "watch": watch,  # the live straggler watch (harness/watch/exchange.py): flags and captured windows
        # the debug server (harness/debug/), where it ran: its address and the captures it started
        "debug_server": debug_server,
    }
    path = run_file(ident.dir)
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n")
    return path
