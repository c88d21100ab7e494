"""The harness's part of torch's debug-server frontend (rank 0's process), and starting it.

`start` calls `torch.distributed.debug.start_debug_server` on every rank with torch's own handlers
and `HarnessHandler`: a page (`/harness`) with each rank's recent steps and phases, its tracing,
and the watch's latest verdict; `/harness/state` (the same as JSON) and `/harness/capture?steps=N`
(trace the next N steps on every rank).

Safe by default: torch's frontend listens on every interface; here it is bound to
`--debug-addr` (loopback unless the user says otherwise), and where that is not a loopback
address every request, torch's pages included, must carry the token (`?token=` or an
`Authorization: Bearer` header). Requests are answered by the frontend's own threads, in another
process than training: a malformed one gets a 4xx, a failing one a 5xx, and the loop never sees
either.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import json
import os
import secrets
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

try:  # torch's frontend module needs jinja2 (the `debug` extra): `start` says so where it is missing
    from torch.distributed.debug._frontend import DebugHandler, NavLink, Route
except ImportError:
    DebugHandler = object  # type: ignore[misc, assignment]

from harness.debug.plan import MAX_CAPTURE_STEPS, CapturePlan, RankState, Refusal, plan_capture
from harness.debug.routes import CAPTURE, PAGE, STATE, TOKEN_VARIABLE
from harness.debug.worker import ARM_HANDLER, PLAN_KEY, SECRET_KEY, STATE_HANDLER, STORE_PREFIX

# How long the frontend waits for a rank's worker (torch's default is 60 s: a rank mid-step
# answers from its worker's own thread, in ms; a rank that does not answer in 10 s is said missing).
FETCH_TIMEOUT_S = 10.0
TOKEN_FILE = "debug_token"  # in the run folder (owner-only), where a token was made up for the run

_PAGE_TEMPLATE = """
{% extends "base.html" %}
{% block header %}<h1>{% block title %}Harness{% endblock %}</h1>{% endblock %}
{% block content %}
  <p>{{ verdict }}</p>
  {% if missing %}<pre>{{ missing }}</pre>{% endif %}
  <table border="1" cellpadding="4">
    <tr><th>rank</th><th>host</th><th>step</th><th>step ms (median)</th><th>phases ms (last step)</th>
        <th>late ms/step</th><th>profiler</th><th>windows</th><th>captures</th></tr>
    {% for r in rows %}
    <tr><td>{{ r.rank }}</td><td>{{ r.host }}</td><td>{{ r.step }}</td><td>{{ r.step_ms }}</td>
        <td>{{ r.phases }}</td><td>{{ r.late }}</td><td>{{ r.profiler }}</td><td>{{ r.windows }}</td>
        <td>{{ r.captures }}</td></tr>
    {% endfor %}
  </table>
  <p>Trace the next steps on every rank: <code>{{ capture }}?steps=3</code>
     (or <code>python -m harness.capture HOST:PORT --steps 3</code>).</p>
{% endblock %}
"""


@dataclass(frozen=True)
class Reply:
    status: int
    doc: dict[str, Any]


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def job_store() -> Any:
    """The job's c10d store as torch's debug server reaches it (MASTER_ADDR, MASTER_PORT)."""
    from torch.distributed.debug._store import tcpstore_client

    return tcpstore_client(prefix=STORE_PREFIX)


class HarnessHandler(DebugHandler):
    """Answers the harness's routes in the frontend's process."""

    def __init__(self, *, max_captures: int, warmup: int) -> None:
        self.max_captures = max_captures
        self.warmup = warmup
        self.fetch_timeout = FETCH_TIMEOUT_S  # torch's frontend sets it from start_debug_server's
        self._lock: threading.Lock | None = None  # made in the frontend's process (not picklable)
        self._secret: str | None = None

    # -- torch's DebugHandler interface --

    def routes(self) -> list[Any]:
        # torch's frontend answers these with 200 and HTML only: `_guarded` answers them first
        return [Route(p, functools.partial(self._fallback, p)) for p in (PAGE, STATE, CAPTURE)]

    def nav_links(self) -> list[Any]:
        return [NavLink(PAGE, "Harness")]

    def templates(self) -> dict[str, str]:
        return {"harness.html": _PAGE_TEMPLATE}

    def dump(self) -> str | None:
        return None

    def dump_filename(self) -> str:
        return "harness"

    def _fallback(self, path: str, req: Any) -> bytes:
        return json.dumps(self.answer(path, req.get_query()).doc).encode()

    # -- the routes --

    def answer(self, path: str, query: dict[str, list[str]]) -> Reply:
        """The reply to a GET of `path` (one of the harness's routes) with `query`."""
        if path == STATE:
            states, missing = self._states()
            return Reply(200, {"ranks": states, "missing": missing})
        if path == CAPTURE:
            return self._capture(query)
        return Reply(404, {"error": f"no such page: {path}"})

    def page(self, render: Callable[..., bytes]) -> bytes:
        states, missing = self._states()
        rows = []
        late_by_rank: dict[int, float] = {}
        verdict = "the watch has not judged an interval yet"
        first = min((d["rank"] for d in states), default=None)
        for doc in states:
            watch = doc.get("watch")
            if watch and doc["rank"] == first:
                flagged = ", ".join(
                    f"rank {s['rank']} ({s.get('phase') or 'no single phase'}, {s['late_ms']:.1f} ms/step late)"
                    for s in watch.get("stragglers", [])
                )
                verdict = (
                    f"watch, steps {watch['steps'][0]}-{watch['steps'][1]}: "
                    f"{'straggler: ' + flagged if flagged else 'balanced'} (bound {watch['threshold_ms']:.1f} ms)"
                )
                late_by_rank = {int(k): v for k, v in (watch.get("late_ms") or {}).items()}
        for doc in states:
            last = doc["recent"][-1] if doc.get("recent") else {}
            rows.append(
                {
                    "rank": doc["rank"],
                    "host": doc["host"],
                    "step": doc["step"],
                    "step_ms": "-" if doc.get("step_ms") is None else f"{doc['step_ms']:.2f}",
                    "phases": ", ".join(f"{k} {v:.2f}" for k, v in (last.get("phases_ms") or {}).items()),
                    "late": f"{late_by_rank[doc['rank']]:.2f}" if doc["rank"] in late_by_rank else "-",
                    "profiler": doc["profiler"],
                    "windows": doc.get("windows_written", 0),
                    "captures": doc.get("debug_captures", 0),
                }
            )
        return render("harness.html", verdict=verdict, rows=rows, missing="\n".join(missing), capture=CAPTURE)

    def _fetch(self, endpoint: str, args: dict[str, str]) -> tuple[list[dict[str, Any] | None], list[str]]:
        """Ask every rank's worker: its answers (None where it failed) and a line per failure."""
        from torch.distributed.debug._frontend import fetch_all

        query = "&".join(f"{k}={v}" for k, v in {"secret": self._job_secret(), **args}.items())
        _, resps = fetch_all(endpoint, query, timeout=self.fetch_timeout)
        docs: list[dict[str, Any] | None] = []
        missing = []
        for rank, resp in enumerate(resps):
            try:
                doc = json.loads(resp.text)
            except ValueError:
                doc = {"error": resp.text[:200]}
            if resp.status_code == 200:
                docs.append(doc)
            else:
                docs.append(None)
                missing.append(f"rank {rank}: {resp.status_code} {doc.get('error', '')}".rstrip())
        return docs, missing

    def _states(self) -> tuple[list[dict[str, Any]], list[str]]:
        docs, missing = self._fetch(STATE_HANDLER, {})
        return [d for d in docs if d is not None], missing

    def _job_secret(self) -> str:
        if self._secret is None:
            self._secret = job_store().get(SECRET_KEY).decode()
        return self._secret

    def _capture(self, query: dict[str, list[str]]) -> Reply:
        raw = query.get("steps", ["3"])
        try:
            steps = int(raw[0])
        except ValueError:
            return Reply(400, {"error": f"steps={raw[0]!r} is not a whole number"})
        if not 1 <= steps <= MAX_CAPTURE_STEPS:
            return Reply(400, {"error": f"steps={steps}: ask for 1 to {MAX_CAPTURE_STEPS} steps"})
        if self._lock is None:
            self._lock = threading.Lock()
        if not self._lock.acquire(blocking=False):
            return Reply(409, {"error": "another capture request is being answered; ask again in a moment"})
        try:
            return self._arm(steps)
        finally:
            self._lock.release()

    def _arm(self, steps: int) -> Reply:
        docs, missing = self._fetch(STATE_HANDLER, {})
        if missing:
            return Reply(503, {"error": "not every rank answered; no capture", "details": missing})
        states = [RankState.from_doc(d) for d in docs if d is not None]
        planned = plan_capture(
            states, steps, warmup=self.warmup, max_captures=self.max_captures, plan_id=uuid.uuid4().hex[:12]
        )
        if isinstance(planned, Refusal):
            return Reply(planned.status, {"error": planned.reason, "details": planned.details})
        plan: CapturePlan = planned
        job_store().set(PLAN_KEY.format(id=plan.id), json.dumps(plan.to_doc()))
        armed, failed = self._fetch(ARM_HANDLER, {"id": plan.id})
        if failed:
            self._fetch(ARM_HANDLER, {"id": plan.id, "cancel": "1"})
            return Reply(409, {"error": "not every rank could book the capture; none traces it", "details": failed})
        return Reply(
            200,
            {
                "capture": plan.to_doc(),
                "steps": [plan.first, plan.last],
                "ranks": len(armed),
                "message": f"every rank traces steps {plan.first}-{plan.last} (warm-up from step {plan.start})",
            },
        )


def _authorized(headers: Any, query: dict[str, list[str]], token: str) -> bool:
    given = (query.get("token") or [""])[0]
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        given = auth[len("Bearer ") :]
    return hmac.compare_digest(given.encode(), token.encode())


def _guarded(request_class: type, harness: HarnessHandler, token: str | None) -> type:
    """torch's request handler class with the token checked first and the harness's routes
    answered with their own status and JSON."""

    class Guarded(request_class):
        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            if token is not None and not _authorized(self.headers, query, token):
                self.send_error(403, "this debug server needs its token (?token= or Authorization: Bearer)")
                return
            if url.path not in (PAGE, STATE, CAPTURE):
                super().do_GET()
                return
            try:
                if url.path == PAGE:
                    body, kind, status = harness.page(self.frontend.render_template), "text/html", 200
                else:
                    reply = harness.answer(url.path, query)
                    body, kind, status = json.dumps(reply.doc).encode(), "application/json", reply.status
            except Exception as exc:  # noqa: BLE001 - a request fails alone: the server and the job go on
                body = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
                kind, status = "application/json", 500
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Guarded


def _server_class(host: str, token: str | None, harness: HarnessHandler) -> type:
    """The frontend's HTTP server bound to `host` (torch's binds every interface)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Bound(ThreadingHTTPServer):
        address_family = family
        request_queue_size = 1024

        def __init__(self, address: tuple[str, int], request_class: type) -> None:
            super().__init__((host, address[1]), _guarded(request_class, harness, token))

    return Bound


_torch_main: Callable[..., None] | None = None  # torch's frontend main, while `start` stands in for it


def frontend_main(host: str, token: str | None, **kwargs: Any) -> None:
    """The frontend process's entry point: torch's, with its server bound to `host` and guarded."""
    from torch.distributed.debug import _frontend

    harness = next(h for h in kwargs["handlers"] if isinstance(h, HarnessHandler))
    setattr(_frontend, "_IPv6HTTPServer", _server_class(host, token, harness))  # noqa: B010 - torch binds every interface
    main = _torch_main if _torch_main is not None else _frontend.main
    main(**kwargs)


@dataclass(frozen=True)
class Server:
    rank: int
    port: int
    host: str
    token_file: Path | None


def token_for(host: str, run_dir: Path, rank: int) -> tuple[str | None, Path | None]:
    """The token requests must carry: none on loopback; else HARNESS_DEBUG_TOKEN, or one made up
    and written (owner-only) to the run folder by rank 0."""
    if is_loopback(host):
        return None, None
    token = os.environ.get(TOKEN_VARIABLE)
    if token:
        return token, None
    path = run_dir / TOKEN_FILE
    if rank == 0:
        token = secrets.token_urlsafe(24)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token, path
    return None, path  # only rank 0 runs the frontend


def start(
    *,
    port: int,
    host: str,
    run_dir: Path,
    rank: int,
    max_captures: int,
    warmup: int,
    fetch_timeout_s: float = FETCH_TIMEOUT_S,
) -> Server:
    """Start torch's debug server on this rank (the frontend on rank 0) with the harness's handler.
    Raises RuntimeError (one line) where it cannot: a missing dependency, a torch without it."""
    try:
        import torch.distributed.debug as debug
        from torch.distributed.debug import _frontend
        from torch.distributed.debug._debug_handlers import default_handlers
    except ImportError as exc:
        raise RuntimeError(
            f"needs {exc.name or 'a module'} (pip install 'torch-dist-profiler-harness[debug]')"
        ) from None
    if not hasattr(_frontend, "_IPv6HTTPServer") or not hasattr(_frontend, "main"):
        raise RuntimeError("this torch's debug server cannot be bound to one address; left off")
    token, token_file = token_for(host, run_dir, rank)
    harness = HarnessHandler(max_captures=max_captures, warmup=warmup)
    global _torch_main
    _torch_main = _frontend.main
    _frontend.main = functools.partial(frontend_main, host, token)
    try:
        debug.start_debug_server(port=port, handlers=[harness, *default_handlers()], fetch_timeout=fetch_timeout_s)
    finally:
        _frontend.main = _torch_main
    return Server(rank=rank, port=port, host=host, token_file=token_file)


def stop(rank: int) -> None:
    """Stop this rank's part of torch's debug server (never raises: the run is closing)."""
    try:
        import torch.distributed.debug as debug

        if rank == 0 or getattr(debug, "_DEBUG_SERVER_PROC", None) is not None:
            debug.stop_debug_server()
        else:
            worker_server = getattr(debug, "_WORKER_SERVER", None)
            if worker_server is not None:
                worker_server.shutdown()
                debug._WORKER_SERVER = None
    except Exception:  # noqa: BLE001, S110 - the process ends soon; its servers die with it
        pass


def job_secret(store: Any, rank: int) -> str:
    """The secret every rank's worker checks: made by rank 0 and put in the job's store."""
    if rank == 0:
        store.set(SECRET_KEY, secrets.token_hex(16))
    return store.get(SECRET_KEY).decode()
