"""Read back what a job logged to W&B (offline) and MLflow (a local file store), for the tests of
the callbacks' tracker logging (test_integrations.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

# A W&B run file (`run-<id>.wandb`, wandb 0.16+): a 7-byte header (":W&B", magic, version), then
# LevelDB's log format: 32 KiB blocks of chunks, each a 7-byte header (CRC, length, type: 1 full,
# 2 first, 3 middle, 4 last) and its bytes; a record is one full chunk or first..last.
HEADER = b":W&B"
BLOCK = 32768
CHUNK = 7


def wandb_records(path: Path) -> list[bytes]:
    raw = path.read_bytes()
    assert raw[:4] == HEADER, f"{path}: not a W&B run file"
    pos, records, part = CHUNK, [], b""
    while pos + CHUNK <= len(raw):
        if BLOCK - pos % BLOCK < CHUNK:  # a block's tail too short for a chunk header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + CHUNK])
        pos += CHUNK
        part += raw[pos : pos + length]
        pos += length
        if kind in (1, 4):
            records.append(part)
            part = b""
    return records


def wandb_offline_summary(wandb_dir: Path) -> dict[str, Any]:
    """The summary of the one offline run under `wandb_dir` (WANDB_DIR), from its run file."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    summary: dict[str, Any] = {}
    for data in wandb_records(path):
        rec = pb.Record()
        rec.ParseFromString(data)
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def mlflow_runs(tracking_uri: str) -> list[Any]:
    """Every run of every experiment in a local MLflow store (MLFLOW_ALLOW_FILE_STORE=true)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    return list(client.search_runs(ids))
