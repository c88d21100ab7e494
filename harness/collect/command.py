"""`python -m harness.collect RUN_DIR [MORE ...]` (also `harness-collect`): the collector's
command. Options into `CollectOptions`, the pipeline (collect/pipeline.py), its result printed.

Exit codes: 0 report written (a partial one too, with warnings saying what is missing);
2 nothing could be analysed (no such path, no traces, every trace unreadable, runs mixed)
or a bad option.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from harness.collect.each_window import collect_each
from harness.collect.pipeline import Collected, CollectError, CollectOptions, collect
from harness.oneline_argparse import EXIT_USAGE, OneLineArgumentParser, fail
from harness.paths import (
    COLLECTIVES_CSV,
    MERGED_TRACE,
    REPORT_HTML,
    REPORT_JSON,
    REPORT_MD,
    STEPS_CSV,
    TIMELINE_JSON,
    WINDOW_REPORT_TEMPLATE,
    WINDOWS_JSON,
)
from harness.report.across_windows import summary_lines
from harness.report.console import console_table, labelled, why_text
from harness.report.floor import floor_line
from harness.report.merged import MERGED_BUDGET_BYTES, MergedChoice
from harness.traces.analyse.stragglers import Thresholds
from harness.traces.progress import Progress
from harness.traces.read.windows import window_line

PROG = "harness.collect"
EXIT_INPUT = EXIT_USAGE
EXIT_MEMORY = 3  # past --memory-limit-mb


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


def parse_merged(spec: str) -> MergedChoice:
    """'auto', 'all', 'none' or a step list (see parse_steps)."""
    if spec in ("auto", "all", "none"):
        return MergedChoice(mode=spec)
    try:
        return MergedChoice(mode="steps", steps=frozenset(parse_steps(spec)))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"invalid --merged {spec!r}; use auto, all, none or steps such as 5-8"
        ) from None


def parse_window(spec: str) -> str:
    """'latest', 'all', 'each' or a window number (1, 2, ...)."""
    if spec in ("latest", "all", "each") or (spec.isdigit() and int(spec) >= 1):
        return spec
    raise argparse.ArgumentTypeError(f"invalid --window {spec!r}; use latest, all, each or a window number such as 2")


def build_parser() -> argparse.ArgumentParser:
    th = Thresholds()
    p = OneLineArgumentParser(
        prog=PROG,
        description="Merge per-rank PyTorch profiler traces, align their clocks, find "
        "stragglers and communication/computation overlap gaps.",
    )
    p.add_argument("inputs", nargs="+", help="run folders, trace files or globs (several folders: one per node)")
    p.add_argument("-o", "--output", type=Path, help="report folder (default: <first input folder>/report)")
    p.add_argument("--steps", type=parse_steps, help="steps to analyse, e.g. 3-7 or 5,6,9 (default: all)")
    p.add_argument("--no-align", action="store_true", help="do not align rank clocks")
    p.add_argument(
        "--merged",
        type=parse_merged,
        default=MergedChoice(),
        help=f"what {MERGED_TRACE} holds: auto (default: the consecutive steps around a typical step "
        f"that fit {MERGED_BUDGET_BYTES // 10**6} MB of JSON, what a browser viewer opens), all, "
        "none, or steps such as 5-8",
    )
    p.add_argument(
        "--no-merged",
        dest="merged",
        action="store_const",
        const=MergedChoice(mode="none"),
        help="the same as --merged none",
    )
    p.add_argument(
        "--window",
        type=parse_window,
        default="latest",
        help="profiler window to analyse: latest (default), all, or its number (the N in "
        "<trace>.000N.pt.trace.json.gz): a run's windows, the scheduled ones and those the live watch "
        "captured, are analysed one at a time; each: every window into its own folder "
        f"({WINDOW_REPORT_TEMPLATE.format(window='N')}/), compared in {WINDOWS_JSON} (a straggler is one in "
        "most windows, in one phase; noise moves from rank to rank)",
    )
    p.add_argument(
        "--attempt",
        type=int,
        help="after torchrun restarts (--max-restarts), the attempt to analyse: "
        "0 = the first, N = <run>/restart-N (default: the latest)",
    )
    p.add_argument(
        "--run",
        type=int,
        metavar="N",
        help="where the inputs hold several runs of one job (the same ranks written by other processes, "
        "e.g. a folder a job wrote to twice), the run to analyse: 1 = the oldest (default: refuse and list them)",
    )
    p.add_argument(
        "--comm-kernel",
        type=_regex,
        metavar="REGEX",
        help="GPU kernels whose names match REGEX (Python re.search) are communication too, beside the "
        "built-in families (NCCL/RCCL, DeepEP, NVSHMEM, MSCCL++, custom all-reduce: "
        "docs/collector.md); its first group, if any, names the collective; read from traces, not "
        "in-job summaries",
    )
    p.add_argument(
        "--from-traces",
        action="store_true",
        help="parse the traces even where an in-job summary (<trace>.summary.json) is next to them",
    )
    p.add_argument(
        "--min-late-ms",
        type=float,
        default=th.min_late_ms,
        help="straggler: least lateness beyond its peers per step, ms (default: no absolute floor)",
    )
    p.add_argument(
        "--rel-late",
        type=float,
        default=th.rel_late,
        help="straggler: least lateness per step as a share of the clean step (the punctual ranks' own work)",
    )
    # the older spellings, still read for the scripts that pass them
    p.add_argument("--min-lag-ms", dest="min_late_ms", type=float, help=argparse.SUPPRESS)
    p.add_argument("--rel-lag", dest="rel_late", type=float, help=argparse.SUPPRESS)
    p.add_argument("-j", "--jobs", type=int, default=0, help="parallel parsers (default: one per core)")
    p.add_argument(
        "--unpickle-nccl-dumps",
        action="store_true",
        help="read NCCL watchdog dumps (pickles) among the Flight Recorder dumps; only for files you trust "
        "(no class is loaded even then)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no table")
    p.add_argument(
        "--wide", action="store_true", help="the per-rank table with every column and every rank (wider than 100)"
    )
    p.add_argument(
        "--progress-file", type=Path, help="keep a JSON of the stage reached here (harness/traces/progress.py)"
    )
    p.add_argument(
        "--memory-limit-mb",
        type=_positive_mb,
        help="the most memory each collector process may take (its data segment; the parsers each too): past it, "
        "one line and exit 3 instead of the machine's out-of-memory killer (TensorBoard's Analyse now sets it)",
    )
    return p


def _positive_mb(text: str) -> int:
    try:
        mb = int(text)
    except ValueError:
        mb = 0
    if mb <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of MB")
    return mb


def limit_memory(mb: int) -> None:
    """Cap this process's data segment (heap and private writable mappings, which is where a
    trace's events live; not the address space, which shared libraries and thread stacks inflate)
    at `mb` MB; the parser processes forked after inherit it."""
    limit = mb * 2**20
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    resource.setrlimit(resource.RLIMIT_DATA, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def _regex(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({exc})") from None


def options_from(args: argparse.Namespace) -> CollectOptions:
    return CollectOptions(
        inputs=args.inputs,
        output=args.output,
        steps=args.steps,
        align=not args.no_align,
        merged=args.merged,
        window=args.window,
        attempt=args.attempt,
        run=args.run,
        comm_kernel=args.comm_kernel,
        from_traces=args.from_traces,
        thresholds=Thresholds(min_late_ms=args.min_late_ms, rel_late=args.rel_late),
        unpickle_nccl_dumps=args.unpickle_nccl_dumps,
        progress=not args.quiet,
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    jobs = args.jobs or os.cpu_count() or 1
    if args.memory_limit_mb:
        limit_memory(args.memory_limit_mb)
    # One pool for parsing and for the merged trace, started while this process is still small
    # (workers are forked: they would otherwise each map the parent's analysis).
    pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None
    reporter = Progress(args.progress_file)
    ok, message = False, "stopped"
    try:
        try:
            if args.window == "each":
                across, base = collect_each(options_from(args), pool, reporter)
                for line in summary_lines(across):
                    print(line)
                print(f"compared in {base / WINDOWS_JSON}")
                message = f"across windows: {across.verdict}"
                ok = True
                return
            result = collect(options_from(args), pool, reporter)
        except CollectError as exc:
            for line in exc.memory_lines:  # on stdout: what the step logs still tell
                print(line)
            message = f"exit {EXIT_INPUT}: see the collector's error"
            fail(PROG, str(exc), code=EXIT_INPUT)
        except (MemoryError, BrokenProcessPool):
            if not args.memory_limit_mb:
                raise
            message = f"exit {EXIT_MEMORY}: out of memory"
            fail(
                PROG,
                f"ran out of the {args.memory_limit_mb} MB each collector process may take (--memory-limit-mb); "
                "run it by hand with more, or look for an oversized file in the run's folder",
                code=EXIT_MEMORY,
            )
        message = print_result(result, args)
        ok = True
    finally:
        reporter.finish(ok, message)
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def print_result(result: Collected, args: argparse.Namespace) -> str:
    """The console's account of a report (console.py), fitting console.WIDTH columns: the verdict
    block first (verdict, why, next steps, noise bound, diagnosis), then the per-rank table
    (every column with --wide), warnings and where the files are. Returns the verdict's line."""
    report, out = result.report, result.out
    if result.flight_only:
        print(labelled("verdict", report.headline))
        if not args.quiet:
            for w in result.warnings:
                print(labelled("warning", w))
        for n in report.next_steps:
            print(labelled("next", n.text))
        print(
            labelled(
                "report", f"{out}/{REPORT_MD} (also {REPORT_HTML}, {REPORT_JSON}; from Flight Recorder dumps only)"
            )
        )
        return "report from the Flight Recorder dumps alone"
    print(labelled("verdict", report.headline))
    why = why_text(report)
    if why and why not in report.headline:
        print(labelled("why", why))
    for n in report.next_steps:
        print(labelled("next", n.text))
    if report.noise_floor:
        print(labelled("noise", floor_line(report.noise_floor)))
    print(labelled("diagnosis", report.diagnosis_summary))
    if not args.quiet:
        print()
        print(console_table(report, wide=args.wide))
        for w in result.warnings:
            print(labelled("warning", w))
    if report.window and (len(report.window.windows) > 1 or not args.quiet):
        print(labelled("window", window_line(report.window)))
    print(
        labelled(
            "report",
            f"{out}/{REPORT_MD} (also {REPORT_HTML}, {REPORT_JSON}, {TIMELINE_JSON}, {STEPS_CSV}, "
            f"{COLLECTIVES_CSV}; TensorBoard scalars in {out}/tb/)",
        )
    )
    merged = result.merged
    if merged:
        print(
            labelled(
                "merged",
                f"{merged.path} ({merged.gz_bytes / 1e6:.1f} MB, {merged.json_bytes / 1e6:.0f} MB of JSON): "
                f"{merged.window.note}",
            )
        )
    elif args.merged.mode != "none":
        print(labelled("merged", f"no {MERGED_TRACE}: only the in-job summaries, not the traces, are here"))
    return f"verdict: {report.headline}"
