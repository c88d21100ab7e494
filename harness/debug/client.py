"""`python -m harness.capture HOST:PORT --steps 3`: ask a running job's debug server to trace the
next steps on every rank (the page's action, from a shell).

Exit 0 when every rank booked the capture, 1 when the job refused it (the reason is printed), 2 for
a usage error, a server that cannot be reached or a request it rejects.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from typing import Any

from harness.debug.plan import MAX_CAPTURE_STEPS
from harness.debug.routes import CAPTURE, TOKEN_VARIABLE
from harness.oneline_argparse import EXIT_USAGE, OneLineArgumentParser, fail

PROG = "python -m harness.capture"
EXIT_REFUSED = 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("server", metavar="HOST:PORT", help="the job's debug server (rank 0's host, --debug-port)")
    p.add_argument("--steps", type=int, default=3, help=f"steps recorded on every rank (1-{MAX_CAPTURE_STEPS})")
    p.add_argument(
        "--token", default=None, help=f"the server's token where it is not on loopback (default: ${TOKEN_VARIABLE})"
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the answer")
    args = p.parse_args(argv)
    if not 1 <= args.steps <= MAX_CAPTURE_STEPS:
        p.error(f"--steps {args.steps}: ask for 1 to {MAX_CAPTURE_STEPS} steps")
    if ":" not in args.server:
        p.error(f"{args.server!r} is not HOST:PORT")
    return args


def request_capture(server: str, steps: int, token: str | None, timeout_s: float) -> tuple[int, dict[str, Any]]:
    """GET the capture route: (HTTP status, the JSON answer). Raises OSError where the server
    cannot be reached."""
    req = urllib.request.Request(f"http://{server}{CAPTURE}?steps={steps}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body)
        except ValueError:
            return err.code, {"error": body.decode(errors="replace").strip()[:300] or err.reason}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    token = args.token or os.environ.get(TOKEN_VARIABLE)
    try:
        status, doc = request_capture(args.server, args.steps, token, args.timeout)
    except OSError as exc:
        fail(PROG, f"cannot reach a debug server at {args.server} ({exc}); is the job running with --debug-server?")
    if status == 200:
        print(doc.get("message", json.dumps(doc)))
        return
    details = "".join(f"\n  {d}" for d in doc.get("details") or [])
    if status in (409, 503):
        fail(PROG, f"{doc.get('error', status)}{details}", label="refused", code=EXIT_REFUSED)
    fail(PROG, f"the server answered {status}: {doc.get('error', '')}{details}", code=EXIT_USAGE)
