"""`tensorboard --logdir profiler_logs` over real 2-rank runs: our plugin's routes, the scalars,
torch-tb-profiler's routes, and the view in a real headless Chromium with no internet."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.view.runs import MAX_VIEW_FILE_BYTES

from jobs import REAL_TRACES, REPO, free_port, run_harness

pytestmark = pytest.mark.slow

PLUGIN = "/data/plugin/harness_distributed"
PROFILER = "/data/plugin/pytorch_profiler"
# Rank 1 sleeps 100 ms in its data phase every step: rank 0 waits for it at every allreduce. Ten
# times the clean step: named with other jobs busy beside this one (not a `timing` test).
STRAGGLER = [
    "--mode",
    "torch",
    "--parallel",
    "ddp",
    "--steps",
    "12",
    "--warmup-steps",
    "2",
    "--wait",
    "2",
    "--warmup",
    "1",
    "--active",
    "6",
    "--slow-rank",
    "1",
    "--slow-ms",
    "100",
    "--slow-phase",
    "data",
]
FSDP = [
    "--mode",
    "baseline",
    "--parallel",
    "fsdp",
    "--steps",
    "8",
    "--warmup-steps",
    "2",
    "--wait",
    "2",
    "--warmup",
    "1",
    "--active",
    "3",
    "--batch-size",
    "16",
]
ARTIFACTS = Path(os.environ.get("HARNESS_TEST_ARTIFACTS", REPO / "tests" / "artifacts"))


def collect(run_dir: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "harness.collect", str(run_dir), "-q"],
        check=True,
        cwd=REPO,
        capture_output=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tb") / "profiler_logs"
    ddp = run_harness(STRAGGLER, root, run_name="ddp")
    collect(ddp.dir)
    run_harness(FSDP, root, run_name="fsdp")
    pending = root / "pending"  # traces and no report: the view offers to make one
    pending.mkdir()
    for p in ddp.traces():
        shutil.copy(p, pending / p.name)
    # A report cut short (a full disk, a copy interrupted): the page says so instead of going blank.
    broken = root / "z-broken" / "report"
    broken.mkdir(parents=True)
    (broken / "report.json").write_text((ddp.dir / "report" / "report.json").read_text()[:500])
    # A report whose timeline.json links to a file outside the logdir: it is never served.
    secret = root.parent / "secret.json"
    secret.write_text('{"secret": "outside the logdir"}')
    linked = root / "z-linked" / "report"
    shutil.copytree(ddp.dir / "report", linked)
    (linked / "timeline.json").unlink()
    (linked / "timeline.json").symlink_to(secret)
    # Hostile files: a decompression bomb as a rank's trace (its "Analyse now" fails in one line),
    # and a report.json far larger than any the collector writes (its page says so; never read).
    bomb = root / "z-bomb"
    bomb.mkdir()
    spaces = gzip.compress(b" " * (64 * 2**20), compresslevel=9)
    with (bomb / "rank0.1.pt.trace.json.gz").open("wb") as fh:
        fh.write(gzip.compress(b'{"traceEvents": [') + spaces * 16 + gzip.compress(b"]}"))
    huge = root / "z-huge" / "report"
    huge.mkdir(parents=True)
    with (huge / "report.json").open("wb") as fh:
        fh.truncate(MAX_VIEW_FILE_BYTES + 1)  # sparse: takes no disk
    return root


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[str]:
    """`tensorboard --logdir <logdir>` exactly as a user starts it (it binds to localhost)."""
    port = free_port()
    exe = Path(sys.executable).with_name("tensorboard")
    log = (logdir.parent / "tensorboard.log").open("w")
    proc = subprocess.Popen(
        [str(exe), "--logdir", str(logdir), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=logdir.parent,
    )
    base = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if "harness_distributed" in get_json(base, "/data/plugins_listing"):
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "tensorboard did not start: " + (logdir.parent / "tensorboard.log").read_text()[-3000:]
                )
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def get(base: str, path: str, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(base: str, path: str) -> Any:
    status, body = get(base, path)
    assert status == 200, (path, status, body[:500])
    return json.loads(body)


def q(run: str) -> str:
    return urllib.parse.quote(run, safe="")


# -- our plugin ------------------------------------------------------------------------------


def test_plugin_lists_runs_and_serves_the_view(server: str, logdir: Path) -> None:
    runs = {r["run"]: r for r in get_json(server, f"{PLUGIN}/runs")}
    assert {"ddp", "fsdp", "pending"} <= set(runs)
    assert runs["ddp"]["has_report"] and runs["ddp"]["traces"] == 2
    assert not runs["fsdp"]["has_report"] and "harness.collect" in runs["fsdp"]["collect_command"]
    status, page = get(server, f"{PLUGIN}/view?run=ddp")
    assert status == 200 and b"straggler: rank 1 on" in page and b'<script src="plotly.min.js">' in page
    report = get_json(server, f"{PLUGIN}/report.json?run=ddp")
    assert report == json.loads((logdir / "ddp" / "report" / "report.json").read_text())
    timeline = get_json(server, f"{PLUGIN}/timeline.json?run=ddp")
    assert [lane["rank"] for lane in timeline["ranks"]] == [0, 1]
    for asset, size in (("plotly.min.js", 1_000_000), ("view.js", 1000), ("view.css", 100), ("index.js", 1000)):
        status, body = get(server, f"{PLUGIN}/{asset}")
        assert status == 200 and len(body) > size, asset
    status, page = get(server, f"{PLUGIN}/view?run=fsdp")
    assert status == 200 and b"no collector report yet" in page and b"python -m harness.collect" in page


@pytest.mark.parametrize(
    "path",
    [
        "/view?run=nope",
        "/view?run=",
        "/view",
        "/view?run=..",
        "/view?run=ddp%2F..%2F..",
        "/view?run=%2Fetc%2Fpasswd",
        "/view?run=..%2F..%2F..%2Fetc%2Fpasswd",
        "/report.json?run=fsdp",
        "/report.json?run=..%2Fddp",
        "/timeline.json?run=ddp%2Freport",
        "/nope.js",
        "/static/view.js",
    ],
)
def test_plugin_refuses_unknown_runs_and_paths(server: str, path: str) -> None:
    status, body = get(server, PLUGIN + path)
    assert status == 404, (path, status, body[:300])


@pytest.mark.parametrize(
    "raw",
    [
        "/../../../../etc/passwd",
        "/..%2F..%2F..%2Fetc%2Fpasswd",
        "/view.js/../../../setup.py",
        "/%2e%2e/%2e%2e/pyproject.toml",
    ],
)
def test_plugin_traversal_in_the_raw_path(server: str, raw: str) -> None:
    # http.client sends the path as written (urllib would not normalise it either, but be explicit)
    host, port = urllib.parse.urlsplit(server).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", PLUGIN + raw)
    resp = conn.getresponse()
    body = resp.read()
    assert resp.status in (400, 404), (raw, resp.status)
    assert b"root:" not in body and b"[project]" not in body and b"setuptools" not in body


def test_plugin_explains_a_malformed_report_and_never_follows_links_out(server: str) -> None:
    status, page = get(server, f"{PLUGIN}/view?run=z-broken")
    assert status == 500 and b"cannot be shown: report.json is not valid JSON" in page
    assert b"python -m harness.collect" in page  # and how to make it again
    status, body = get(server, f"{PLUGIN}/report.json?run=z-broken")
    assert status == 500 and b"not valid JSON" in body
    for path in ("/timeline.json?run=z-linked", "/view?run=z-linked"):
        status, body = get(server, PLUGIN + path)
        assert status == 500 and b"links outside the TensorBoard logdir" in body, path
        assert b'"secret"' not in body, path
    assert get_json(server, f"{PLUGIN}/report.json?run=z-linked")["verdict"] == "straggler"


def collect_job(server: str, run: str) -> dict:
    """POST collect, then poll collect_status until the job ends; returns its last state."""
    status, body = get(server, f"{PLUGIN}/collect?run={run}", method="POST")
    assert status == 202 and json.loads(body)["ok"], body
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        job = get_json(server, f"{PLUGIN}/collect_status?run={run}")
        if job["state"] != "running":
            return job
        time.sleep(0.2)
    raise AssertionError(f"collector on {run} still running after 300 s")


def test_plugin_collects_a_run_without_report(server: str, logdir: Path) -> None:
    assert get(server, f"{PLUGIN}/collect?run=pending")[0] == 405  # GET does nothing
    assert get_json(server, f"{PLUGIN}/collect_status?run=pending")["state"] == "none"
    job = collect_job(server, "pending")
    assert job["state"] == "done" and job["message"].startswith("verdict: straggler"), job
    assert (logdir / "pending" / "report" / "report.html").is_file()
    runs = {r["run"]: r for r in get_json(server, f"{PLUGIN}/runs")}
    assert runs["pending"]["has_report"]
    assert get(server, f"{PLUGIN}/collect?run=..%2Fpending", method="POST")[0] == 404
    assert get(server, f"{PLUGIN}/collect_status?run=..%2Fpending")[0] == 404


def test_hostile_files_cost_their_own_run_a_line(server: str) -> None:
    """A decompression bomb's "Analyse now" fails with the collector's one line (and the
    warning naming the bomb) while other runs are served; a report.json larger than any the
    collector writes is refused on its page without being read."""
    status, _ = get(server, f"{PLUGIN}/collect?run=z-bomb", method="POST")
    assert status == 202
    view_status, page = get(server, f"{PLUGIN}/view?run=ddp")
    assert view_status == 200 and b"straggler" in page
    deadline = time.monotonic() + 120
    while (job := get_json(server, f"{PLUGIN}/collect_status?run=z-bomb"))["state"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    assert job["state"] == "failed" and "none of the 1 file(s) is a readable profiler trace" in job["message"], job
    status, page = get(server, f"{PLUGIN}/view?run=z-huge")
    assert status == 500 and b"more than the 256 MB the view reads" in page
    status, body = get(server, f"{PLUGIN}/report.json?run=z-huge")
    assert status == 500 and b"more than the 256 MB the view reads" in body


def test_the_comparison_page_picks_two_runs_and_compares_them(server: str) -> None:
    """`compare` without runs: the form, listing the logdir's runs; with two: the comparison
    (harness.compare's headline and phase table); a trace-only folder says why it cannot be
    compared; an unknown run is a 404."""
    status, page = get(server, f"{PLUGIN}/compare")
    assert status == 200 and b'<select name="base">' in page and b'<option value="ddp">' in page
    status, page = get(server, f"{PLUGIN}/compare?base=ddp&new=fsdp")
    assert status == 200 and b"median step" in page and b"<th>phase</th>" in page, page[:2000]
    status, page = get(server, f"{PLUGIN}/compare?base=ddp&new=pending")
    assert status == 200 and b"cannot be compared" in page
    assert get(server, f"{PLUGIN}/compare?base=ddp&new=nope")[0] == 404
    assert get(server, f"{PLUGIN}/compare?base=..%2Fddp&new=ddp")[0] == 404


def test_analyse_now_is_killed_with_its_parsers_past_its_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The time limit holds whether or not anyone polls: a timer kills the collector's whole
    process group (its parser processes too) and the state says it ran past the limit. A killed
    process is gone only once it has exited, which takes a parser holding a trace's memory a
    moment after the main process is reaped (a CI run saw one there at once): the group must be
    empty within 10 s, which a group left running never is."""
    from harness.view import tb_plugin

    run = tmp_path / "run"
    shutil.copytree(REAL_TRACES / "dlrm_8rank_v100", run)
    monkeypatch.setattr(tb_plugin, "COLLECT_TIMEOUT_S", 0.3)
    job = tb_plugin.CollectJob.start("run", run)
    try:
        job.proc.wait(timeout=60)
        state = job.state()
        assert job.timed_out and state["state"] == "failed" and "ran past 0.3 s" in state["message"], state
        deadline = time.monotonic() + 10.0
        while pids := [p.pid for p in psutil.process_iter(["pid"]) if _in_group(p, job.proc.pid)]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert pids == []
    finally:
        job.close()


def _in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.Error):
        return False


def test_tensorboard_serves_other_runs_while_the_collector_runs(server: str) -> None:
    """ "Analyse now" returns at once; while the job runs (its status says so before and after),
    another run's view and the run list are served, and a second job is refused, not queued."""
    for _ in range(5):  # a collection shorter than one round of requests proves nothing: again
        status, _ = get(server, f"{PLUGIN}/collect?run=pending", method="POST")
        assert status == 202
        before = get_json(server, f"{PLUGIN}/collect_status?run=pending")
        view_status, page = get(server, f"{PLUGIN}/view?run=ddp")
        busy_status, busy = get(server, f"{PLUGIN}/collect?run=ddp", method="POST")
        after = get_json(server, f"{PLUGIN}/collect_status?run=pending")
        assert view_status == 200 and b"straggler" in page
        if before["state"] == after["state"] == "running":
            assert before["stage"] and after["elapsed_s"] >= before["elapsed_s"]
            assert busy_status == 409 and b"already running on run pending" in busy
            break
        if busy_status == 202:  # pending had finished: that second job ran; let it end first
            while get_json(server, f"{PLUGIN}/collect_status?run=ddp")["state"] == "running":
                time.sleep(0.2)
        time.sleep(1)
    else:
        pytest.fail("the collector never ran long enough to overlap one view request")
    deadline = time.monotonic() + 300
    while get_json(server, f"{PLUGIN}/collect_status?run=pending")["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert get_json(server, f"{PLUGIN}/collect_status?run=pending")["state"] == "done"


# -- scalars ---------------------------------------------------------------------------------


def scalar_values(server: str, run: str, tag: str) -> dict[int, float]:
    rows = get_json(server, f"/data/plugin/scalars/scalars?run={q(run)}&tag={q(tag)}")
    return {step: value for _, step, value in rows}


def test_scalars_per_rank_from_training_and_collector(server: str) -> None:
    # TensorBoard reads the logdir in the background after it starts: wait until it has every run.
    runs = [f"ddp/tb/rank0000{r}" for r in (0, 1)] + [f"ddp/report/tb/rank0000{r}" for r in (0, 1)]
    deadline = time.monotonic() + 90
    while True:
        tags = get_json(server, "/data/plugin/scalars/tags")
        if (
            all(len(tags.get(run, {})) >= 5 for run in runs)
            and len(scalar_values(server, runs[1], "step/data_wait_ms")) == 12
            or time.monotonic() > deadline
        ):
            break
        time.sleep(1)
    for r in (0, 1):
        assert {"step/time_ms", "step/data_wait_ms", "step/throughput_samples_per_s", "memory/host_rss_bytes"} <= set(
            tags[f"ddp/tb/rank0000{r}"]
        )
        assert {"collector/wait_for_others_ms", "collector/blame_ms", "collector/exposed_comm_ms"} <= set(
            tags[f"ddp/report/tb/rank0000{r}"]
        )
    data1 = scalar_values(server, "ddp/tb/rank00001", "step/data_wait_ms")
    data0 = scalar_values(server, "ddp/tb/rank00000", "step/data_wait_ms")
    assert sorted(data1) == list(range(12)) and min(data1.values()) >= 30 > max(data0.values())
    lag1 = scalar_values(server, "ddp/report/tb/rank00001", "collector/blame_ms")
    wait0 = scalar_values(server, "ddp/report/tb/rank00000", "collector/wait_for_others_ms")
    assert len(lag1) == 6 and all(v > 15 for v in lag1.values()), lag1  # the others waited for rank 1
    assert all(v > 15 for v in wait0.values()), wait0


# -- torch-tb-profiler -----------------------------------------------------------------------


def profiler_runs(server: str) -> list[str]:
    deadline = time.monotonic() + 120
    while True:
        body = get_json(server, f"{PROFILER}/runs")
        if not body["loading"] and {"ddp", "fsdp"} <= set(body["runs"]) or time.monotonic() > deadline:
            return body["runs"]
        time.sleep(1)


@pytest.mark.parametrize("run", ["ddp", "fsdp"])
def test_torch_tb_profiler_routes_list_every_rank(server: str, run: str) -> None:
    assert run in profiler_runs(server)
    assert "Distributed" in get_json(server, f"{PROFILER}/views?run={run}")
    assert get_json(server, f"{PROFILER}/workers?run={run}&view=Distributed") == ["All"]
    workers = get_json(server, f"{PROFILER}/workers?run={run}&view=Overview")
    assert len(workers) == 2 and all(w.startswith(f"rank0000{r}-") for r, w in enumerate(sorted(workers)))
    spans = [get_json(server, f"{PROFILER}/spans?run={run}&worker={w}") for w in workers]
    assert spans[0] == spans[1] == ["1"]  # equal spans per rank
    overlap = get_json(server, f"{PROFILER}/distributed/overlap?run={run}&worker=All&span=1")
    assert sorted(overlap["data"]["all"]) == sorted(workers)
    commops = get_json(server, f"{PROFILER}/distributed/commops?run={run}&worker=All&span=1")
    assert sorted(commops["data"]) == sorted(workers)
    for w in workers:
        names = {row[0] for row in commops["data"][w]["rows"]}
        assert names and all(n.startswith("gloo:") for n in names), names


# -- a real browser --------------------------------------------------------------------------

LOOPBACK = ("http://localhost:", "http://127.0.0.1:", "data:", "blob:", "about:", "chrome-error:", "file://")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if os.environ.get("HARNESS_SKIP_BROWSER") == "1":
        pytest.skip("HARNESS_SKIP_BROWSER=1")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chrome = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver_exe = shutil.which("chromedriver")
    if not (chrome and driver_exe):
        pytest.skip(
            "no Chromium and ChromeDriver on PATH: `make test-tools` installs them on Debian; elsewhere install "
            "both to run the browser test"
        )
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1400,2200",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_exe))
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(driver: Any, script: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for: {script}")


VIEW_STATE = """
const v = window.harnessView;
if (!v || !v.ready) return null;
const d = (id) => document.getElementById(id).data;
return {charts: v.charts, memY: d('heatmap-memory')[0].y, memZ: d('heatmap-memory')[0].z,
        stepY: d('heatmap-step')[0].y, waitZ: d('heatmap-wait')[0].z, waitY: d('heatmap-wait')[0].y,
        bars: d('bars').map(t => [t.name, t.y, t.x]), timeline: d('timeline').map(t => [t.name, t.y.length]),
        stragglers: Array.from(document.querySelectorAll('#stragglers tbody tr')).map(
            tr => Object.fromEntries(Array.from(tr.cells).map(c => [c.dataset.key, c.textContent]))),
        svgs: document.querySelectorAll('.main-svg').length,
        verdict: document.getElementById('verdict').textContent};
"""


def check_view(state: dict[str, Any], report: dict[str, Any]) -> None:
    # the memory heatmap beside the step-time ones: the run's step logs are next to its traces
    assert (
        state["charts"] == ["heatmap-step", "heatmap-wait", "heatmap-memory", "bars", "timeline"] and state["svgs"] >= 5
    )
    # a cell is empty (null) at a step whose RSS the rank did not read: the reads keep within a
    # time budget, so on short steps not every step has one (run/stats.py, SystemSampler)
    assert state["memY"] == ["rank 0", "rank 1"], state["memY"]
    assert all(any(z is not None for z in row) for row in state["memZ"]), state["memZ"]
    assert all(z > 0 for row in state["memZ"] for z in row if z is not None), state["memZ"]
    assert state["verdict"] == report["headline"] and "rank 1" in state["verdict"]
    assert state["stepY"] == state["waitY"] == ["rank 0", "rank 1"]
    # rank 0 waits ~100 ms for rank 1 in every step; rank 1 waits for nobody (a quarter of that
    # for other work beside the job keeping rank 0 off its core)
    assert all(z > 50 for z in state["waitZ"][0]) and all(z < 25 for z in state["waitZ"][1]), state["waitZ"]
    bars = {name: dict(zip(y, x)) for name, y, x in state["bars"]}
    assert set(bars) == {
        "compute only",
        "overlapped communication",
        "exposed transfer",
        "exposed waiting for peers",
        "idle",
    }
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert bars["exposed transfer"]["rank 0"] == pytest.approx(by_rank[0]["exposed_transfer_ms"])
    assert bars["exposed waiting for peers"]["rank 0"] == pytest.approx(by_rank[0]["exposed_wait_ms"])
    # the victim's exposed communication is mostly waiting for rank 1
    assert by_rank[0]["exposed_wait_ms"] > by_rank[0]["exposed_transfer_ms"]
    assert bars["idle"]["rank 1"] == pytest.approx(by_rank[1]["idle_ms"])
    assert [s["rank"] for s in state["stragglers"]] == ["1"] and state["stragglers"][0]["phase"] == "data"
    lanes = dict(state["timeline"])
    assert lanes["step"] == 12 and lanes["wait for last arriver"] >= 6 and lanes["data"] == 12


def test_view_in_chromium_through_tensorboard(server: str, browser: Any, logdir: Path) -> None:
    from selenium.webdriver.common.by import By

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.get_log("performance")
    browser.get(server + "/#harness_distributed")
    plugin_frame = wait_for(browser, "return document.querySelector('iframe')")
    browser.switch_to.frame(plugin_frame)
    view_frame = wait_for(browser, "return document.getElementById('view')")
    # the bar and the frame are drawn before ./runs answers; the options come with the answer
    wait_for(browser, "return document.querySelectorAll('#run option').length")
    options = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#run option")]
    assert "ddp" in options and "fsdp (no report)" in options
    assert browser.find_element(By.ID, "run").get_attribute("value") == "ddp"
    browser.switch_to.frame(view_frame)
    state = wait_for(browser, VIEW_STATE)
    check_view(state, json.loads((logdir / "ddp" / "report" / "report.json").read_text()))
    browser.switch_to.default_content()
    browser.save_screenshot(str(ARTIFACTS / "tensorboard_distributed_view.png"))
    urls = requested_urls(browser)
    assert any(u.endswith("/plotly.min.js") for u in urls)
    assert [u for u in urls if not u.startswith(LOOPBACK)] == []
    assert console_errors(browser) == []


def test_compare_button_in_chromium(server: str, browser: Any) -> None:
    """The bar's Compare button: the selected run against the one picked beside it, shown in
    the view's frame (the plugin's comparison page)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server + "/#harness_distributed")
    browser.switch_to.frame(wait_for(browser, "return document.querySelector('iframe')"))
    wait_for(browser, "return document.querySelectorAll('#compare-with option').length")
    Select(browser.find_element(By.ID, "compare-with")).select_by_value("fsdp")
    browser.find_element(By.ID, "compare").click()
    browser.switch_to.frame(browser.find_element(By.ID, "view"))
    text = wait_for(
        browser,
        "const m = document.getElementById('message');"
        " return m && m.textContent.includes('median step') && m.textContent",
    )
    assert "BASE ddp" in text and "NEW fsdp" in text
    browser.switch_to.default_content()
    assert console_errors(browser) == []


def test_report_html_opens_from_disk_offline(browser: Any, logdir: Path) -> None:
    page = logdir / "ddp" / "report" / "report.html"
    browser.get_log("performance")
    browser.get(page.as_uri())
    state = wait_for(browser, VIEW_STATE)
    check_view(state, json.loads((logdir / "ddp" / "report" / "report.json").read_text()))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "report_html.png"))
    assert [
        u for u in requested_urls(browser) if not u.startswith("file://") and not u.startswith(("data:", "blob:"))
    ] == []
    assert console_errors(browser) == []
