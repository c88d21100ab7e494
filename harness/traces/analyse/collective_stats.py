"""The collective table and the per-process-group roll-up. Pure functions.

Bus bandwidth follows NCCL-tests' conventions (doc/PERFORMANCE.md there): algorithm bandwidth =
bytes / time; bus bandwidth = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
reduce-scatter and all-to-all, 1 for broadcast, reduce and point-to-point, so it can be held
against the link's peak whatever the number of ranks.
"""

from __future__ import annotations

from typing import Any

from harness.traces.align.waits import InstanceWaits
from harness.traces.analyse.overlap import StepOverlap

# Element sizes of the dtype names Kineto writes in the collectives' args ("Float", "c10::BFloat16", ...)
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "long": 8,
    "int64": 8,
    "int": 4,
    "int32": 4,
    "short": 2,
    "int16": 2,
    "char": 1,
    "int8": 1,
    "byte": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def bus_factor(name: str, n: int) -> float:
    """busbw / algbw for a collective over n ranks (NCCL-tests)."""
    if n < 2:
        return 1.0
    if name == "allreduce":
        return 2 * (n - 1) / n
    if name in ("allgather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def message_bytes(name: str, nelems: int | None, dtype: str | None, n: int) -> int | None:
    """The size NCCL-tests times: the input for all-reduce, reduce-scatter, all-to-all,
    broadcast and reduce; the whole output (input x n) for all-gather. None when the trace
    does not say (gloo's ranges carry no sizes)."""
    if nelems is None or dtype is None:
        return None
    size = DTYPE_BYTES.get(dtype.lower().removeprefix("c10::"))
    if size is None:
        return None
    return nelems * size * (n if name == "allgather" else 1)


def collective_stats(waits: list[InstanceWaits]) -> list[dict[str, Any]]:
    """One row per (collective, process group, message size):
    1. count of matched instances, ranks taking part (n), bytes per instance;
    2. transfer_ms = the sum of the instances' transfer times (the shortest of their ranks'
       durations after the last arrival); wait_ms = the sum of every rank's wait;
    3. algbw = bytes x count / transfer time, busbw = algbw x bus_factor(name, n), in GB/s
       (1e9 bytes); None without sizes or transfer time.
    Rows by transfer time, longest first."""
    rows: dict[tuple, dict[str, Any]] = {}
    for w in waits:
        inst = w.instance
        any_op = next(iter(inst.ops.values()))
        n = len(inst.ops)
        nbytes = message_bytes(inst.name, any_op.nelems, any_op.dtype, n)
        key = (inst.name, inst.pg, nbytes, n)
        row = rows.setdefault(
            key,
            {
                "name": inst.name,
                "pg": inst.pg,
                "ranks": n,
                "bytes": nbytes,
                "count": 0,
                "transfer_ms": 0.0,
                "wait_ms": 0.0,
            },
        )
        row["count"] += 1
        row["transfer_ms"] += w.transfer_us / 1e3
        row["wait_ms"] += sum(w.wait_us.values()) / 1e3
    out = []
    for row in rows.values():
        t_s = row["transfer_ms"] / 1e3
        alg = row["bytes"] * row["count"] / t_s / 1e9 if row["bytes"] is not None and t_s > 0 else None
        out.append(
            {
                **row,
                "transfer_ms": round(row["transfer_ms"], 6),
                "wait_ms": round(row["wait_ms"], 6),
                "mean_transfer_ms": round(row["transfer_ms"] / row["count"], 6),
                "algbw_gbps": None if alg is None else round(alg, 4),
                "busbw_gbps": None if alg is None else round(alg * bus_factor(row["name"], row["ranks"]), 4),
            }
        )
    return sorted(out, key=lambda r: (-r["transfer_ms"], r["name"], r["pg"]))


def process_groups(waits: list[InstanceWaits], overlap: list[StepOverlap]) -> list[dict[str, Any]]:
    """Per process group: its ranks (those seen in its matched collectives), matched
    collectives, and summed over ranks and analysed steps: communication time, exposed waiting
    and exposed transfer (overlap.rank_overlap, step 5: each group's ops alone, so groups that
    run at the same time each count the time), every rank's wait and the instances' transfer."""
    groups: dict[str, dict[str, Any]] = {}

    def group(pg: str) -> dict[str, Any]:
        return groups.setdefault(
            pg,
            {
                "pg": pg,
                "ranks": set(),
                "collectives": 0,
                "comm_ms": 0.0,
                "exposed_wait_ms": 0.0,
                "exposed_transfer_ms": 0.0,
                "wait_ms": 0.0,
                "transfer_ms": 0.0,
            },
        )

    for w in waits:
        g = group(w.instance.pg)
        g["ranks"].update(w.instance.ops)
        g["collectives"] += 1
        g["wait_ms"] += sum(w.wait_us.values()) / 1e3
        g["transfer_ms"] += w.transfer_us / 1e3
    for row in overlap:
        for pg, v in row.by_pg.items():
            g = group(pg)
            g["ranks"].add(row.rank)
            g["comm_ms"] += v["comm_us"] / 1e3
            g["exposed_wait_ms"] += v["exposed_wait_us"] / 1e3
            g["exposed_transfer_ms"] += v["exposed_transfer_us"] / 1e3
    out = []
    for g in sorted(groups.values(), key=lambda g: g["pg"]):
        out.append(
            {k: (sorted(v) if k == "ranks" else round(v, 6) if isinstance(v, float) else v) for k, v in g.items()}
        )
    return out
