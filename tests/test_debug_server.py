"""The debug server on a real 2-rank torchrun job (gloo): its page, its state, a capture every rank
traces at the same step, the requests it refuses, and the client command (harness/debug/)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.paths import list_traces

from jobs import REPO, collect_report, free_port, harness_cmd, job_env, load_trace

STEPS = 120
# every rank waits for rank 0's 60 ms a step: steps of 60 ms and more, however busy the machine,
# so the capture's 2 s lead is at most 34 steps. The sleep is ~12x the clean step here (~5 ms),
# so the watch names rank 0 with other jobs beside this one (not a `timing` test).
JOB = [
    "--mode",
    "baseline",
    "--hidden",
    "64",
    "--batch-size",
    "16",
    "--steps",
    str(STEPS),
    "--warmup-steps",
    "2",
    "--watch-every",
    "20",
    "--slow-rank",
    "0",
    "--slow-ms",
    "60",
]


def get(base: str, path: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(base + path)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if resp.headers.get_content_type() == "application/json" else body
    except urllib.error.HTTPError as err:
        body = err.read()
        try:
            return err.code, json.loads(body)
        except ValueError:
            return err.code, body


def wait_for(base: str, ok: Any, proc: subprocess.Popen, what: str, deadline_s: float = 120) -> dict[str, Any]:
    """Poll the state route until `ok(state)`: the job is a real one that starts and runs at its own pace."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"the job ended while waiting for {what}: {proc.communicate()[0][-3000:]}"
        try:
            status, doc = get(base, "/harness/state")
        except OSError:
            status, doc = 0, None
        if status == 200 and len(doc["ranks"]) == 2 and ok(doc):
            return doc
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {deadline_s} s")


def left_ms(rank: dict[str, Any]) -> float:
    """The time a rank has left: its steps to go at its recent median step."""
    return (STEPS - 1 - rank["step"]) * (rank["step_ms"] or 1e9)


@pytest.mark.slow
def test_a_capture_is_traced_by_every_rank_at_the_same_step(tmp_path: Path) -> None:
    port = free_port()
    cmd = harness_cmd([*JOB, "--debug-server", "--debug-port", str(port)], tmp_path, run_name="dbg")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env(), cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        state = wait_for(base, lambda d: all(r["step"] >= 3 for r in d["ranks"]), proc, "two ranks stepping")
        assert {r["rank"] for r in state["ranks"]} == {0, 1} and state["missing"] == []

        # malformed requests get a 4xx and change nothing
        assert get(base, "/harness/capture?steps=abc")[0] == 400
        assert get(base, "/harness/capture?steps=0")[0] == 400
        assert get(base, "/harness/capture?steps=500")[0] == 400
        assert get(base, "/harness/nothing")[0] == 404

        # two requests at once: one books the capture, the other is refused
        answers: list[tuple[int, Any]] = []
        pair = [threading.Thread(target=lambda: answers.append(get(base, "/harness/capture?steps=3"))) for _ in "ab"]
        for t in pair:
            t.start()
        for t in pair:
            t.join()
        assert sorted(a[0] for a in answers) == [200, 409], answers
        booked = next(doc for status, doc in answers if status == 200)
        first, last = booked["steps"]
        assert last - first == 2
        # a third, while it is booked or running: refused, with its steps
        status, doc = get(base, "/harness/capture?steps=3")
        assert status == 409 and f"-{last}" in doc["error"], doc

        # the page shows the watch's latest verdict: rank 0, 60 ms slower a step, is the straggler
        wait_for(base, lambda d: any(r["watch"] for r in d["ranks"]), proc, "a judged interval")
        status, page = get(base, "/harness")
        assert status == 200 and b"watch, steps" in page and b"straggler: rank 0" in page, page[:2000]

        # the client command, near the end of the run: refused (the run ends first), exit 1
        # (less than the 2 s lead left: no room for the capture, however fast or slow the steps run)
        wait_for(base, lambda d: all(left_ms(r) < 1500 for r in d["ranks"]), proc, "the last steps")
        client = subprocess.run(
            [sys.executable, "-m", "harness.capture", f"127.0.0.1:{port}", "--steps", "3"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert client.returncode == 1 and "refused" in client.stderr, client.stderr
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]

    # both ranks wrote the capture as their second window, recording the same steps
    run_dir = tmp_path / "dbg"
    windows = {}
    for path in list_traces(run_dir):
        meta = load_trace(path)["harness"]
        if "captured" in meta:
            windows[meta["rank"]] = (meta["window"], meta["captured"]["steps"], meta["captured"]["requested_by"])
    assert windows == {r: (2, [first, last], "debug server") for r in (0, 1)}
    run_json = json.loads((run_dir / "run.json").read_text())
    assert [(c["first"], c["last"]) for c in run_json["debug_server"]["captures"]] == [(first, last)]

    # the collector reads it as a window, and says where it came from
    report = collect_report(run_dir)
    assert report["window"]["windows"] == [1, 2]
    report2 = collect_report_window(run_dir, 2)
    assert report2["window"]["steps"] == [first, last]
    assert report2["window"]["captured"]["requested_by"] == "debug server"


def collect_report_window(run_dir: Path, window: int) -> dict[str, Any]:
    out = run_dir.parent / f"report{window}"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", str(run_dir), "-o", str(out), "--no-merged", "--window", str(window)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "asked through the debug server" in proc.stdout, proc.stdout
    return json.loads((out / "report.json").read_text())


def test_the_capture_command_says_what_is_wrong() -> None:
    port = free_port()  # nothing listens there
    proc = subprocess.run(
        [sys.executable, "-m", "harness.capture", f"127.0.0.1:{port}"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cannot reach a debug server" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "harness.capture", "nohost", "--steps", "99"], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 2 and "1 to 20 steps" in proc.stderr


@pytest.fixture
def guarded_frontend(monkeypatch: pytest.MonkeyPatch) -> Any:
    """torch's frontend server in this process, made as `frontend_main` makes it in the job's:
    returns a function (host, token) -> its base URL."""
    from torch.distributed.debug import _frontend
    from torch.distributed.debug._debug_handlers import IndexHandler

    from harness.debug.frontend import HarnessHandler, _server_class

    servers = []

    def make(host: str, token: str | None) -> str:
        harness = HarnessHandler(max_captures=1, warmup=2)
        monkeypatch.setattr(_frontend, "_IPv6HTTPServer", _server_class(host, token, harness))
        server = _frontend.FrontendServer(port=0, handlers=[harness, IndexHandler()])
        servers.append(server)
        assert server._server.server_address[0] == host
        return f"http://{'127.0.0.1' if host != '::1' else '[::1]'}:{server._server.server_port}"

    yield make
    for s in servers:
        s._server.shutdown()
        s._server.server_close()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_the_frontend_is_bound_where_asked_and_wants_its_token_elsewhere(host: str, guarded_frontend: Any) -> None:
    token = None if host == "127.0.0.1" else "s3cret"
    base = guarded_frontend(host, token)
    if token is None:  # loopback: no token asked; torch's own pages answer too
        assert get(base, "/")[0] == 200
        assert get(base, "/harness/capture?steps=x")[0] == 400
        return
    assert get(base, "/")[0] == 403  # torch's pages need it as well
    assert get(base, "/harness/capture?steps=3", token="wrong")[0] == 403
    assert get(base, "/?token=s3cret")[0] == 200
    status, doc = get(base, "/harness/capture?steps=x", token=token)
    assert status == 400 and "not a whole number" in doc["error"]


def test_a_non_loopback_address_gets_a_token_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.debug.frontend import TOKEN_VARIABLE, is_loopback, token_for

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("node-a")
    assert token_for("127.0.0.1", tmp_path, 0) == (None, None)
    monkeypatch.delenv(TOKEN_VARIABLE, raising=False)
    token, path = token_for("0.0.0.0", tmp_path, 0)
    assert token and path == tmp_path / "debug_token" and path.read_text().strip() == token
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(TOKEN_VARIABLE, "mine")
    assert token_for("0.0.0.0", tmp_path, 0) == ("mine", None)
