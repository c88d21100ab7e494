"""`python -m harness.collect RUN_DIR [MORE ...]` (also `harness-collect`).

Exit codes: 0 report written (a partial one too, with warnings saying what is missing);
2 nothing could be analysed (no such path, no traces, every trace unreadable, runs mixed)
or a bad option.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from harness.collect.analysis import NoStepsError, analyze
from harness.collect.discover import InputError, RunSet, find_trace_files, group_ranks
from harness.collect.model import RankTrace
from harness.collect.parse import TraceError, parse_trace
from harness.collect.report import build_report, collective_rows, console_summary, write_report
from harness.collect.run_state import choose_attempt, ending_notes, skipped_note, skipped_windows
from harness.collect.stragglers import Thresholds
from harness.collect.summary import read_summary
from harness.collect.tb_scalars import write_scalars
from harness.collect.timeline import build_timeline
from harness.view.files import write_view
from harness.oneline_argparse import EXIT_USAGE, OneLineArgumentParser
from harness.paths import is_summary, trace_of_summary

PROG = "harness.collect"
EXIT_INPUT = EXIT_USAGE


def parse_steps(spec: str) -> set[int]:
    """'3-7', '5,6,9' or a mix ('1-3,8') -> a set of step numbers."""
    out: set[int] = set()
    try:
        for part in spec.split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError
                out.update(range(int(lo), int(hi) + 1))
            else:
                out.add(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid step list {spec!r}; use e.g. 3-7 or 5,6,9") from None
    return out


def build_parser() -> argparse.ArgumentParser:
    th = Thresholds()
    p = OneLineArgumentParser(prog=PROG, description="Merge per-rank PyTorch profiler traces, align their clocks, find "
                                              "stragglers and communication/computation overlap gaps.")
    p.add_argument("inputs", nargs="+", help="run folders, trace files or globs (several folders: one per node)")
    p.add_argument("-o", "--output", type=Path, help="report folder (default: <first input folder>/report)")
    p.add_argument("--steps", type=parse_steps, help="steps to analyse, e.g. 3-7 or 5,6,9 (default: all)")
    p.add_argument("--no-align", action="store_true", help="do not align rank clocks")
    p.add_argument("--no-merged", action="store_true", help="skip merged.pt.trace.json.gz (large for big traces)")
    p.add_argument("--attempt", type=int, help="after torchrun restarts (--max-restarts), the attempt to analyse: "
                   "0 = the first, N = <run>/restart-N (default: the latest)")
    p.add_argument("--from-traces", action="store_true",
                   help="parse the traces even where an in-job summary (<trace>.summary.json) is next to them")
    p.add_argument("--min-lag-ms", type=float, default=th.min_lag_ms,
                   help="straggler: least cost per step, ms (default: no absolute floor)")
    p.add_argument("--rel-lag", type=float, default=th.rel_lag,
                   help="straggler: least cost per step as a share of the median step (GPU traces)")
    p.add_argument("--rel-lag-cpu", type=float, default=th.rel_lag_cpu,
                   help="the same for CPU-only traces, where ranks share cores and drift more")
    p.add_argument("-j", "--jobs", type=int, default=0, help="parallel parsers (default: one per core)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no table")
    return p


def _parse_one(path: Path) -> RankTrace | str:
    """The file's RankTrace (from its summary, if it is one), or the one-line reason it has none.
    An unreadable summary whose trace is still there falls back to the trace, with a warning."""
    try:
        if not is_summary(path):
            return parse_trace(path)
        try:
            return read_summary(path)
        except TraceError as exc:
            trace_file = trace_of_summary(path)
            if not trace_file.is_file():
                raise
            parsed = parse_trace(trace_file)
            parsed.warnings.append(f"{exc}: parsed {trace_file.name} instead")
            return parsed
    except TraceError as exc:
        return str(exc)


def parse_all(files: list[Path], jobs: int, progress: bool) -> tuple[list[RankTrace], list[str]]:
    """Parse the traces, in parallel processes when there are several; bad files become warnings."""
    jobs = min(jobs or os.cpu_count() or 1, len(files))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), desc="parsing traces", unit="rank", file=sys.stderr, disable=None)
    results: list[RankTrace | str] = []
    if jobs <= 1:
        for f in files:
            results.append(_parse_one(f))
            bar and bar.update()
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for r in pool.map(_parse_one, files):
                results.append(r)
                bar and bar.update()
    if bar:
        bar.close()
    traces = [r for r in results if isinstance(r, RankTrace)]
    errors = [r for r in results if isinstance(r, str)]
    return traces, errors


def default_output(inputs: list[str], files: list[Path]) -> Path:
    first = Path(inputs[0])
    return (first if first.is_dir() else files[0].parent) / "report"


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        try:
            inputs, attempt_notes = choose_attempt(args.inputs, args.attempt)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        files = find_trace_files(inputs, summaries=not args.from_traces)
        traces, errors = parse_all(files, args.jobs, progress=not args.quiet and len(files) > 1)
        for e in errors:
            print(f"{PROG}: warning: skipped {e}", file=sys.stderr)
        if not traces:
            raise InputError(f"none of the {len(files)} file(s) is a readable profiler trace (see the warnings above)")
        runset = group_ranks(traces)
    except InputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT) from None
    runset.ending = [n for d in inputs if Path(d).is_dir() for n in ending_notes(Path(d))]
    runset.skipped_windows = [w for d in inputs if Path(d).is_dir() for w in skipped_windows(Path(d))]
    runset.warnings[:0] = (attempt_notes + runset.ending + [skipped_note(w) for w in runset.skipped_windows]
                           + [f"skipped {e}" for e in errors])
    thresholds = Thresholds(min_lag_ms=args.min_lag_ms, rel_lag=args.rel_lag, rel_lag_cpu=args.rel_lag_cpu)
    try:
        analysis = analyze(runset, align=not args.no_align, thresholds=thresholds, steps=args.steps)
    except NoStepsError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_INPUT) from None
    doc = build_report(analysis, inputs)
    out = args.output or default_output(inputs, files)
    write_report(doc, out, collective_rows(analysis))
    write_view(doc, build_timeline(analysis), out)
    write_scalars(doc, out)
    merged = not args.no_merged and _traces_present(runset)
    if merged:
        from harness.collect.merged import write_merged

        write_merged(analysis, out)

    if not args.quiet:
        print(console_summary(doc))
        for w in analysis.warnings:
            print(f"warning: {w}")
    print(f"\nverdict: {doc['headline']}")
    print(f"diagnosis: {doc['diagnosis_summary']}")
    for n in doc["next_steps"]:
        print(f"next: {n['text']}")
    print(f"report:  {out}/report.md (also report.html, report.json, timeline.json, steps.csv, collectives.csv"
          f"{', merged.pt.trace.json.gz' if merged else ''}; TensorBoard scalars in {out}/tb/)")
    if not merged and not args.no_merged:
        print("no merged.pt.trace.json.gz: only the in-job summaries, not the traces, are here")


def _traces_present(runset: RunSet) -> bool:
    return all(Path(p).is_file() for t in runset.ranks for p in t.path.split(", "))
