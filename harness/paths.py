"""File-name templates shared by every writer and reader of `profiler_logs/<run>/`.

One source of truth: the training job writes with these, the collector and the tests read with
them. The trace name must match torch-tb-profiler's worker pattern
`^(.*?)(\\.\\d+)?\\.pt\\.trace\\.json(?:\\.gz)?$` (group 1 = worker, group 2 = span).
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_LOG_DIR = "profiler_logs"

# Worker part starts with the zero-padded rank so a plain sort is rank order, then the host.
WORKER_TEMPLATE = "rank{rank:05d}-{host}"
# The span is the 1-based profiler window, zero-padded because torch-tb-profiler sorts spans as
# strings before turning them into indices.
TRACE_TEMPLATE = "{worker}.{window:04d}.pt.trace.json.gz"
# A span longer than this is not a harness window (4 digits, more past window 9999), e.g. the
# 13-digit millisecond timestamp torch's tensorboard_trace_handler writes there.
WINDOW_MAX_DIGITS = 6
# Written first, renamed to the final name when complete: never matches TRACE_PATTERN.
PARTIAL_SUFFIX = ".partial"
# A trace's condensed summary (harness/traces/read/summary.py) sits next to it: the trace's own name
# plus this suffix, so any trace name maps to one summary and back, and no trace pattern
# (ours or torch-tb-profiler's) matches it.
SUMMARY_SUFFIX = ".summary.json"
# With --profile-memory, each window's torch memory timeline ([times, sizes by category], gzip
# JSON) sits next to its trace under the trace's worker and window; no trace pattern matches it.
MEMORY_TIMELINE_TEMPLATE = "{worker}.{window:04d}.memory_timeline.json.gz"
MEMORY_TIMELINE_PATTERN = re.compile(r"^rank(?P<rank>\d+)-.*\.(?P<window>\d+)\.memory_timeline\.json\.gz$")

TRACE_PATTERN = re.compile(r"^(?P<worker>.*?)(?:\.(?P<span>\d+))?\.pt\.trace\.json(?:\.gz)?$")
WORKER_RANK_PATTERN = re.compile(r"^rank(?P<rank>\d+)-(?P<host>.+)$")

# Names inside the traces, written by the training loop and read by the collector.
TRACE_METADATA_KEY = "harness"  # top-level trace key with run id, rank, host, mode, window
RANGE_PREFIX = "harness:"  # record_function / NVTX range = RANGE_PREFIX + phase
STEP_PHASES = ("data", "h2d", "forward", "loss", "backward", "optimizer")
# The live watch's exchange between steps, a range on the main thread: its collectives (on the
# watch's own group's gloo threads) are the harness's, not the job's communication.
WATCH_RANGE = RANGE_PREFIX + "watch"
# The watch's own process group's description (distributedInfo's pg_config in every trace): all of
# the world's ranks, never one of the job's groups.
WATCH_GROUP_DESC = "harness_watch"
DEFAULT_GROUP_DESC = "default_pg"  # torch's description of the world's default group
# Beside a trace window of a gloo job with the Flight Recorder on: the recorder's entries issued
# in the window (harness/traces/read/gloo_groups.py), which name each collective's process group
# where gloo's trace ranges name none. The trace's own name plus this suffix, like a summary's.
GROUPS_SUFFIX = ".groups.json"

STEPS_DIR = "steps"
STEPS_TEMPLATE = "rank{rank}.jsonl"
STEPS_PATTERN = re.compile(r"^rank(?P<rank>\d+)\.jsonl$")
RUN_FILE = "run.json"
# The live straggler watch (harness/watch/exchange.py): one JSON line per judged interval, by rank 0.
WATCH_FILE = "watch.jsonl"
# Each rank's state (running / finished / failed / terminated), rewritten as it changes: a rank
# still "running" in a run that is over was killed without a word (SIGKILL, OOM, node lost).
STATUS_DIR = "status"
STATUS_TEMPLATE = "rank{rank}.json"
STATUS_PATTERN = re.compile(r"^rank(?P<rank>\d+)\.json$")
# Flight Recorder dumps (harness/run/flight.py writes, harness/traces/analyse/flight.py reads): one JSON file
# per rank, written when a collective times out or fails, on SIGTERM/SIGINT, or when the rank
# ends with an error; NCCL's own watchdog dumps (a pickle) land in the same folder under
# NCCL_DUMP_PREFIX + rank.
FLIGHT_DIR = "flight"
FLIGHT_TEMPLATE = "rank{rank}.json"
FLIGHT_PATTERN = re.compile(r"^rank(?P<rank>\d+)\.json$")
NCCL_DUMP_PREFIX = "nccl_trace_rank_"
# torchrun --max-restarts: attempt 0 writes into the run folder, attempt N >= 1 (the workers'
# TORCHELASTIC_RESTART_COUNT) into <run>/restart-N/, with the same layout; ELASTIC_FILE in the
# run folder holds torchrun's run id, so a restarted attempt finds its run's folder.
ATTEMPT_TEMPLATE = "restart-{attempt}"
ATTEMPT_PATTERN = re.compile(r"^restart-(?P<attempt>\d+)$")
ELASTIC_FILE = "elastic.json"

# TensorBoard scalars: one TensorBoard run per rank, so the Scalars dashboard draws every rank
# of a tag on one chart. The training job writes <run>/tb/rank00000/, the collector
# <report>/tb/rank00000/.
SCALARS_DIR = "tb"
SCALARS_RANK_TEMPLATE = "rank{rank:05d}"

# The collector's output folder inside a run folder, and the files the TensorBoard plugin reads.
REPORT_DIR = "report"
# python -m harness.compare BASE NEW: its output folder (in NEW's run folder unless -o) and files
COMPARE_DIR = "compare"
COMPARE_JSON = "compare.json"
COMPARE_MD = "compare.md"
REPORT_JSON = "report.json"
TIMELINE_JSON = "timeline.json"
MERGED_TRACE = "merged.pt.trace.json.gz"
REPORT_HTML = "report.html"
REPORT_MD = "report.md"
STEPS_CSV = "steps.csv"
COLLECTIVES_CSV = "collectives.csv"
# --window each: each window's report folder inside the report folder, and their comparison
WINDOW_REPORT_TEMPLATE = "window-{window}"
WINDOWS_JSON = "windows.json"

# Lab sweeps: <log-dir>/lab/<sweep>-<time>/ holds timings.csv, summary.md, the charts, and one
# harness run folder (plus its torchrun log) per row under runs/.
LAB_DIR = "lab"
LAB_RUNS_DIR = "runs"
LAB_TIMINGS = "timings.csv"
LAB_SUMMARY = "summary.md"

_HOST_UNSAFE = re.compile(r"[^A-Za-z0-9-]+")


def safe_host(host: str) -> str:
    """Host name reduced to letters, digits and '-', so it cannot break the trace pattern."""
    cleaned = _HOST_UNSAFE.sub("-", host).strip("-")
    return cleaned or "host"


def worker_name(rank: int, host: str) -> str:
    return WORKER_TEMPLATE.format(rank=rank, host=safe_host(host))


def trace_path(run_dir: Path, rank: int, host: str, window: int) -> Path:
    return run_dir / TRACE_TEMPLATE.format(worker=worker_name(rank, host), window=window)


def memory_timeline_path(run_dir: Path, rank: int, host: str, window: int) -> Path:
    return run_dir / MEMORY_TIMELINE_TEMPLATE.format(worker=worker_name(rank, host), window=window)


def partial_path(final: Path) -> Path:
    """Temporary name a trace is written under; still gzip, never matched as a trace."""
    return final.with_name(final.name.removesuffix(".gz") + PARTIAL_SUFFIX + ".gz")


def summary_path(trace: Path) -> Path:
    return trace.with_name(trace.name + SUMMARY_SUFFIX)


def groups_path(trace: Path) -> Path:
    return trace.with_name(trace.name + GROUPS_SUFFIX)


def is_groups(path: Path) -> bool:
    return path.name.endswith(GROUPS_SUFFIX)


def is_summary(path: Path) -> bool:
    return path.name.endswith(SUMMARY_SUFFIX)


def trace_of_summary(summary: Path) -> Path:
    return summary.with_name(summary.name.removesuffix(SUMMARY_SUFFIX))


def steps_path(run_dir: Path, rank: int) -> Path:
    return run_dir / STEPS_DIR / STEPS_TEMPLATE.format(rank=rank)


def scalars_dir(parent: Path, rank: int) -> Path:
    """Event-file folder of one rank under a run folder or a report folder."""
    return parent / SCALARS_DIR / SCALARS_RANK_TEMPLATE.format(rank=rank)


def lab_dir(log_dir: Path, sweep: str, stamp: str) -> Path:
    return log_dir / LAB_DIR / f"{sweep}-{stamp}"


def status_path(run_dir: Path, rank: int) -> Path:
    return run_dir / STATUS_DIR / STATUS_TEMPLATE.format(rank=rank)


def flight_dir(run_dir: Path) -> Path:
    return run_dir / FLIGHT_DIR


def flight_path(run_dir: Path, rank: int) -> Path:
    return flight_dir(run_dir) / FLIGHT_TEMPLATE.format(rank=rank)


def attempt_dir(run_dir: Path, attempt: int) -> Path:
    return run_dir if attempt == 0 else run_dir / ATTEMPT_TEMPLATE.format(attempt=attempt)


def run_file(run_dir: Path) -> Path:
    return run_dir / RUN_FILE


def watch_path(run_dir: Path) -> Path:
    return run_dir / WATCH_FILE


def list_traces(run_dir: Path) -> list[Path]:
    """Complete trace files directly inside `run_dir`, in rank-then-window order."""
    return sorted(p for p in run_dir.iterdir() if p.is_file() and TRACE_PATTERN.match(p.name))
