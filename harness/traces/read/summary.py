"""In-job summaries: one rank's trace condensed to what the collector's analyses read.

A summary is the parsed `RankTrace` (steps with their phases, per-name compute and cover, each
collective with its run-up) as JSON, written next to the trace as
`<trace name>.summary.json`. The training job writes it when the profiler hands a window over
(`--trace-summary alongside|only`), so the parsing is spread over the job's own nodes; the
collector then reads summaries instead of traces (a few hundred kB instead of hundreds of MB)
and its report is the same as from the traces.

`python -m harness.traces.read.summary TRACE|FOLDER ...` condenses traces already on disk (e.g. on
the cluster, before copying only the summaries to a laptop).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from harness.atomic import write_bytes_atomic
from harness.oneline_argparse import OneLineArgumentParser, fail
from harness.paths import summary_path, trace_of_summary
from harness.traces.model import RankTrace
from harness.traces.read.compact import as_plain
from harness.traces.read.decode import Limits, TraceError
from harness.traces.read.parse import parse_trace

FORMAT = "harness rank summary"
# Bump whenever parse.py's output changes meaning: an older summary is then refused (with the
# advice to collect from the trace) instead of silently giving a different report, unless
# read_summary can bring it up to date (READABLE).
VERSION = 9  # 2: steps' syncs by caller, host ops of every model thread, copies per step; 3: events per
# step, the trace's size and block index (the merged trace's window); 4: compute and copies folded into
# each step's cover instead of kept as intervals, the main thread's top-level op times (read by nothing)
# dropped; 5: covers over the device's step spans (overlap.device_spans), not over windows of each
# step's own work (those overlapped), syncs' costs, any loop's phases, every communication kernel
# family, stub steps left out: what older summaries lack cannot be made from them; 6: a bare op's
# cost on the machine (RankTrace.op_floor_us), which the launch-bound rule is relative to; 7: a GPU
# collective's run-up by the phase that launched its kernels (runup.set_run_ups, 4), step bounds over
# the device's step spans; 8: run-ups from the last collective that is not a point-to-point op, and
# their waiting at those (CommOp.p2p_wait_us); 9: collectives' own sequence numbers (`Seq`) and whether
# their launch is in the trace (CommOp.coll_seq, CommOp.launched)


class _File(msgspec.Struct):
    format: str
    version: int
    rank_trace: RankTrace


_DECODER = msgspec.json.Decoder(_File)
READABLE = (VERSION,)
_ENCODER = msgspec.json.Encoder(enc_hook=as_plain)  # a compacted rank's arrays as the JSON they stand for


def write_summary(trace: RankTrace, path: Path) -> Path:
    """Write `trace` to `path` (via a temporary name, so a reader never sees half a file)."""
    write_bytes_atomic(path, _ENCODER.encode(_File(format=FORMAT, version=VERSION, rank_trace=trace)))
    return path


def summarize(trace_file: Path, *, drop_trace: bool = False, seen: Callable[[RankTrace], None] | None = None) -> Path:
    """Parse `trace_file`, write its summary next to it; with `drop_trace`, then delete the
    trace (only once the summary is safely on disk). `seen` is handed the parsed rank (the
    live metrics read its syncs per step)."""
    parsed = parse_trace(trace_file)
    if seen is not None:
        seen(parsed)
    out = write_summary(parsed, summary_path(trace_file))
    if drop_trace:
        trace_file.unlink()
    return out


def read_summary(path: Path) -> RankTrace:
    """The `RankTrace` a summary holds, its `path` pointing at the trace it was made from
    (which need not exist any more). Bad files raise TraceError with one line saying why."""
    try:
        size = path.stat().st_size
        if size > (limit := Limits.from_env().whole_bytes):
            raise TraceError(
                f"{path}: {size / 2**20:.0f} MB, larger than any summary and than the {limit / 2**20:g} MB a "
                "whole-file read may take (HARNESS_MAX_WHOLE_MB); collect from its trace instead (--from-traces)"
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        doc = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise TraceError(
            f"{path}: damaged or not a harness summary ({exc}); collect from its trace instead (--from-traces)"
        ) from None
    if doc.format != FORMAT:
        raise TraceError(f"{path}: not a harness summary (format {doc.format!r})")
    if doc.version not in READABLE:
        raise TraceError(
            f"{path}: summary version {doc.version}, this collector reads versions "
            f"{', '.join(map(str, READABLE))}; collect from its trace instead (--from-traces)"
        )
    doc.rank_trace.paths = [str(trace_of_summary(path))]
    return doc.rank_trace


def main(argv: list[str] | None = None) -> None:
    p = OneLineArgumentParser(
        prog="harness.traces.read.summary",
        description="Condense profiler traces into summaries the collector reads instead.",
    )
    p.add_argument("inputs", nargs="+", help="trace files or folders (searched like the collector's inputs)")
    p.add_argument("--drop-traces", action="store_true", help="delete each trace once its summary is written")
    args = p.parse_args(argv)
    from harness.traces.read.discover import InputError, find_trace_files

    try:
        files = [f for f in find_trace_files(args.inputs, summaries=False)]
    except InputError as exc:
        fail(p.prog, str(exc))
    failed = 0
    for f in files:
        try:
            print(summarize(f, drop_trace=args.drop_traces))
        except TraceError as exc:
            failed += 1
            print(f"{p.prog}: warning: skipped {exc}", file=sys.stderr)
    if failed == len(files):
        fail(p.prog, f"none of the {len(files)} file(s) could be condensed")


if __name__ == "__main__":
    main()
