"""`python -m harness.selfcheck` (and `make selfcheck`): does the profiler see what it should on
this machine? Each check runs a real part of the harness (checks.py); the result is a pass/fail
table and `selfcheck.json`. Without CUDA the CPU subset runs and the GPU checks are counted as
skipped, with the reason.

Exit codes: 0 no check failed; 1 a check failed; 2 bad options."""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.atomic import write_text_atomic
from harness.oneline_argparse import OneLineArgumentParser, fail
from harness.selfcheck.checks import CHECKS, Check, CheckFailed, Context

PROG = "harness.selfcheck"
EXIT_FAILED = 1
SELFCHECK_JSON = "selfcheck.json"


def machine() -> dict[str, Any]:
    """What this machine has, as the checks need to know it."""
    import torch

    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    return {
        "host": platform.node(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "gpus": gpus,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "nsys": shutil.which("nsys"),
    }


def missing(check: Check, have: dict[str, Any]) -> str | None:
    """Why `check` cannot run here, or None."""
    if check.needs == "cuda" and not have["gpus"]:
        return "no CUDA device"
    if check.needs == "2 gpus" and have["gpus"] < 2:
        return f"needs 2 GPUs, this machine has {have['gpus']}"
    if check.needs == "nsys" and not have["nsys"]:
        return "nsys not installed"
    return None


def run_checks(checks: list[Check], ctx: Context, have: dict[str, Any], say: Any = print) -> list[dict[str, Any]]:
    """Each check in turn: skipped (and why), passed (its evidence) or failed (why), timed."""
    rows = []
    for check in checks:
        why = missing(check, have)
        started = time.monotonic()
        if why:
            result, detail = "skipped", why
        else:
            say(f"{PROG}: {check.name} ...", flush=True)
            try:
                result, detail = "passed", check.run(ctx)
            except CheckFailed as exc:
                result, detail = "failed", str(exc)
            except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, said in one line
                result, detail = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        seconds = round(time.monotonic() - started, 1)
        if not why:  # as it ends: a run cut short by its time limit keeps what it found
            say(f"{PROG}: {check.name}: {result} in {seconds} s: {detail}", flush=True)
        rows.append(
            {
                "check": check.name,
                "needs": check.needs,
                "what": check.what,
                "result": result,
                "seconds": seconds,
                "detail": detail,
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    width = max(len(r["check"]) for r in rows)
    lines = [f"{'check':<{width}}  {'result':<7}  {'s':>6}  evidence / reason"]
    for r in rows:
        lines.append(f"{r['check']:<{width}}  {r['result']:<7}  {r['seconds']:>6.1f}  {r['detail']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    p.add_argument("-o", "--out", type=Path, help="work and result folder (default: profiler_logs/selfcheck-<time>/)")
    p.add_argument("--only", help="comma-separated check names (see --list)")
    p.add_argument("--quick", action="store_true", help="leave out the lab modes check (the longest)")
    p.add_argument("--list", action="store_true", help="list the checks and what each needs, then exit")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.list:
        for c in CHECKS:
            print(f"{c.name:34} needs {c.needs:7} {c.what}")
        return
    checks = list(CHECKS)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in {c.name for c in CHECKS}]
        if unknown:
            fail(PROG, f"no check named {', '.join(map(repr, unknown))}; see --list")
        checks = [c for c in CHECKS if c.name in wanted]
    if args.quick:
        checks = [c for c in checks if c.name != "lab modes"]
    out = args.out or Path("profiler_logs") / f"selfcheck-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(PROG, f"cannot make {out}: {exc.strerror or exc}; pass --out DIR")
    have = machine()
    gpus = f"{have['gpus']} GPU(s): {', '.join(have['gpu_names'])}" if have["gpus"] else "no CUDA"
    print(f"{PROG}: torch {have['torch']}, {gpus}; working in {out}", flush=True)
    ctx = Context(work=out, cuda=bool(have["gpus"]), gpus=have["gpus"])
    rows = run_checks(checks, ctx, have)
    counts = {k: sum(r["result"] == k for r in rows) for k in ("passed", "failed", "skipped")}
    gpu_skipped = sum(r["result"] == "skipped" and r["needs"] in ("cuda", "2 gpus") for r in rows)
    doc = {"schema_version": 1, "machine": have, "checks": rows, **counts, "gpu_checks_skipped": gpu_skipped}
    write_text_atomic(out / SELFCHECK_JSON, json.dumps(doc, indent=1) + "\n")
    print(table(rows))
    note = f" ({gpu_skipped} GPU check(s) skipped: {gpus})" if gpu_skipped else ""
    passed, failed, skipped = counts["passed"], counts["failed"], counts["skipped"]
    print(f"{passed} passed, {failed} failed, {skipped} skipped{note}; {out / SELFCHECK_JSON}")
    if counts["failed"]:
        raise SystemExit(EXIT_FAILED)
