"""`python -m harness.collect RUN --window each`: every profiler window of a run collected apart,
each into its own report folder (<report>/window-<N>/, as `--window N` writes it), then compared
(`across_windows.py`) into <report>/windows.json."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import Executor
from pathlib import Path

from harness.atomic import write_text_atomic
from harness.collect.pipeline import CollectError, CollectOptions, collect, report_folder
from harness.paths import WINDOW_REPORT_TEMPLATE, WINDOWS_JSON
from harness.report.across_windows import AcrossWindows, WindowVerdict, across_windows, window_verdict
from harness.traces.analyse.flight import find_dumps
from harness.traces.progress import Progress
from harness.traces.read.discover import InputError, find_trace_files
from harness.traces.read.run_state import choose_attempt
from harness.traces.read.windows import pick_window


def window_numbers(options: CollectOptions) -> tuple[list[int], Path]:
    """The profiler windows the traces under the inputs hold, and the default report folder."""
    try:
        inputs, _ = choose_attempt(options.inputs, options.attempt)
        dumps = set(find_dumps(inputs))
        files = [f for f in find_trace_files(inputs, summaries=not options.from_traces) if f not in dumps]
    except (ValueError, InputError) as exc:
        raise CollectError(str(exc)) from None
    if not files:
        raise CollectError(f"no trace files under {', '.join(inputs)}")
    _, pick = pick_window(files, "all")
    return list(pick.windows), report_folder(inputs, files[0])


def collect_each(
    options: CollectOptions,
    pool: Executor | None = None,
    reporter: Progress | None = None,
) -> tuple[AcrossWindows, Path]:
    """Each window collected with `options` (its own folder under the report folder); a window
    that cannot be analysed counts as inconclusive, with why in place of its folder. Returns the
    comparison and the folder windows.json went to. Raises CollectError with fewer than 2
    windows."""
    windows, default_out = window_numbers(options)
    if not windows:
        raise CollectError(
            "--window each: these traces carry no harness window number (names such as "
            "rank00000-host.0002.pt.trace.json.gz); collect them without --window each"
        )
    if len(windows) < 2:
        raise CollectError(
            f"--window each compares profiler windows, and {len(windows)} profiler window(s) are under "
            f"{', '.join(options.inputs)}: record several (the lab's --repeat 3, or repeat=N in a "
            "torch.profiler schedule), or collect this one without --window each"
        )
    base = options.output or default_out
    verdicts = []
    watch = None  # the run's, in every window's report alike
    for w in windows:
        one = dataclasses.replace(options, window=str(w), output=base / WINDOW_REPORT_TEMPLATE.format(window=w))
        try:
            got = collect(one, pool, reporter)
        except CollectError as exc:
            verdicts.append(
                WindowVerdict(window=w, verdict="inconclusive", steps=None, stragglers={}, report=f"none ({exc})")
            )
            continue
        verdicts.append(window_verdict(w, got.report, str(got.out)))
        watch = got.report.watch or watch
    result = across_windows(verdicts, watch)
    base.mkdir(parents=True, exist_ok=True)
    write_text_atomic(base / WINDOWS_JSON, json.dumps(result.to_dict(), indent=1) + "\n")
    return result, base
