"""`python -m harness.compare BASE NEW` (also `harness-compare`): the comparison on the console,
in compare.md and compare.json, and a gate for CI (`--fail-if-slower PCT`).

Exit codes: 0 compared (and the gate, if any, passed); 1 the gate failed (NEW slower by more
than PCT with the test's confidence); 2 bad input or options, said in one line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from harness.atomic import write_text_atomic
from harness.compare.diff import compare_sides
from harness.compare.load import CompareError, load_side
from harness.compare.render import console, markdown
from harness.compare.stats import NOISE_FLOOR
from harness.oneline_argparse import OneLineArgumentParser, fail
from harness.paths import COMPARE_DIR, COMPARE_JSON, COMPARE_MD

PROG = "harness.compare"
EXIT_SLOWER = 1


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage (0 or more, e.g. 10)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("base", help="the reference: a run folder, its report/ folder, or a report.json")
    p.add_argument("new", help="the run to judge against it (same kinds)")
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        help=f"folder for {COMPARE_MD} and {COMPARE_JSON} (default: NEW's run folder/{COMPARE_DIR}/)",
    )
    p.add_argument(
        "--fail-if-slower",
        type=_percent,
        metavar="PCT",
        help="exit 1 when NEW's median step is slower by more than PCT%% with the test's confidence (its "
        "interval's lower bound past PCT); 0 otherwise",
    )
    p.add_argument(
        "--noise-pct",
        type=_percent,
        default=NOISE_FLOOR * 100,
        help="run-to-run spread of one configuration on these machines, %%: a change is called only beyond it "
        f"(default {NOISE_FLOOR * 100:g})",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print the headline (and the gate) only")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        base, new = load_side(args.base), load_side(args.new)
        doc = compare_sides(base, new, noise=args.noise_pct / 100, fail_if_slower_pct=args.fail_if_slower)
    except CompareError as exc:
        fail(PROG, str(exc))
    home = new.run_dir or (new.path if new.path.is_dir() else new.path.parent)  # NEW's run folder, else beside it
    out = args.output or home / COMPARE_DIR
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / COMPARE_JSON, json.dumps(doc, indent=1) + "\n")
        write_text_atomic(out / COMPARE_MD, markdown(doc))
    except OSError as exc:
        fail(PROG, f"cannot write {out}: {exc.strerror or exc}; pass -o DIR")
    text = console(doc)
    print(text.splitlines()[0] if args.quiet else text)
    if args.quiet and doc.get("gate"):
        print(text.splitlines()[-1])
    print(f"written: {out / COMPARE_MD} (also {COMPARE_JSON})")
    if doc.get("gate") and doc["gate"]["failed"]:
        raise SystemExit(EXIT_SLOWER)
