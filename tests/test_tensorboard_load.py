"""The Distributed view under load: 50 requests at once for a large run's page, report.json and
timeline.json get every byte right while the server's memory stays bounded, because each file is
read, checked and compressed once per version (files.BodyCache), not once per request."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from tensorboard.plugins import base_plugin
from werkzeug.test import Client

from harness.report.files import view_title
from harness.report.page import render_page
from harness.report.records import SCHEMA_VERSION, load_report
from harness.view.cache import BodyCache
from harness.view.tb_plugin import DistributedViewPlugin

from jobs import REPO, free_port
from tracebuild import ring_docs, write

PLUGIN = "/data/plugin/harness_distributed"
BURST = 50
REPORT_MB = 4
TIMELINE_MB = 20
ROUTES = ("view", "report.json", "timeline.json")


def collected_report(folder: Path) -> Path:
    """A real 2-rank collector report (hand-built traces with known answers) in `folder`/report."""
    for rank, doc in enumerate(ring_docs(lambda r, s: 300.0 + 100.0 * r, n_ranks=2, n_steps=4)):
        write(folder / f"rank{rank}.pt.trace.json.gz", doc)
    subprocess.run(
        [sys.executable, "-m", "harness.collect", str(folder), "-q", "--no-merged"],
        check=True,
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    return folder / "report"


def inflate(report_dir: Path, report_mb: float, timeline_mb: float) -> None:
    """The report's per-step rows and the timeline's lanes repeated over more steps, as a long
    run would have them, until the files are about the sizes asked; written as the collector
    writes them."""
    report = json.loads((report_dir / "report.json").read_text())
    row = report["steps"][0]
    n = int(report_mb * 1e6 / len(json.dumps({"steps": [row]}, indent=1)))
    report["steps"] = [dict(row, rank=i % 2, step=i // 2) for i in range(n)]
    (report_dir / "report.json").write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    timeline = json.loads((report_dir / "timeline.json").read_text())
    per_step = 100  # bytes of one step's row, phase and collective in compact JSON, roughly
    steps = int(timeline_mb * 1e6 / per_step / len(timeline["ranks"]))
    for lane in timeline["ranks"]:
        lane["steps"] = [[s, s * 1.0, s + 0.9] for s in range(steps)]
        lane["phases"] = [["forward", s, s * 1.0, s + 0.4] for s in range(steps)]
        lane["collectives"] = [["allreduce", s, s + 0.4, s + 0.9, 0.1, 1] for s in range(steps)]
    timeline["steps_shown"] = timeline["steps_total"] = steps
    (report_dir / "timeline.json").write_text(json.dumps(timeline, separators=(",", ":"), allow_nan=False) + "\n")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run `big` with a ~4 MB report.json and a ~20 MB timeline.json; `z-linked`, whose
    timeline.json links outside the logdir; `z-broken`, whose report.json is cut short."""
    root = tmp_path_factory.mktemp("tbload") / "profiler_logs"
    big = collected_report(root / "big")
    inflate(big, REPORT_MB, TIMELINE_MB)
    secret = root.parent / "secret.json"
    secret.write_text('{"secret": "outside the logdir"}')
    linked = collected_report(root / "z-linked")
    (linked / "timeline.json").unlink()
    (linked / "timeline.json").symlink_to(secret)
    broken = collected_report(root / "z-broken")
    (broken / "report.json").write_text((broken / "report.json").read_text()[:300])
    return root


@dataclass
class Server:
    base: str
    proc: subprocess.Popen

    @property
    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss


@pytest.fixture(scope="module")
def server(logdir: Path) -> Iterator[Server]:
    """`tensorboard --logdir <logdir>` as a user starts it (bound to localhost)."""
    port = free_port()
    log = (logdir.parent / "tensorboard.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("tensorboard")), "--logdir", str(logdir), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=logdir.parent,
    )
    base = f"http://localhost:{port}"
    try:
        deadline = time.monotonic() + 90
        while b"harness_distributed" not in fetch(base + "/data/plugins_listing")[1]:
            if proc.poll() is not None or time.monotonic() > deadline:
                log_tail = (logdir.parent / "tensorboard.log").read_text()[-3000:]
                raise AssertionError("tensorboard did not start: " + log_tail)
            time.sleep(0.5)
        yield Server(base, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError):
        return 0, b""


def url(route: str, run: str = "big") -> str:
    return f"{PLUGIN}/{route}?run={run}"


@dataclass
class Answer:
    route: str
    status: int
    digest: str  # sha256 of the body as sent, decompressed when it came gzip-compressed
    gzip: bool


def get_digest(base: str, route: str, accept_gzip: bool, start: threading.Barrier) -> Answer:
    """One GET, read in 1 MB blocks into a digest (50 bodies of 20 MB are not held at once)."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=180)
    start.wait(timeout=60)
    conn.request("GET", url(route), headers={"Accept-Encoding": "gzip"} if accept_gzip else {})
    resp = conn.getresponse()
    gzipped = resp.getheader("Content-Encoding") == "gzip"
    unzip = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    digest = hashlib.sha256()
    while block := resp.read(1 << 20):
        digest.update(unzip.decompress(block) if unzip else block)
    if unzip:
        digest.update(unzip.flush())
    conn.close()
    return Answer(route, resp.status, digest.hexdigest(), gzipped)


class PeakRss:
    """The largest RSS of a process, sampled every 10 ms while in the `with` block."""

    def __init__(self, server: Server) -> None:
        self.server, self.peak, self._stop = server, server.rss, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.server.rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def expected_digests(logdir: Path) -> dict[str, str]:
    report_dir = logdir / "big" / "report"
    report, timeline = (report_dir / "report.json").read_bytes(), (report_dir / "timeline.json").read_bytes()
    records = load_report(json.loads(report))
    page = render_page(records, json.loads(timeline), title=view_title("big"), assets="linked").encode()
    return {
        route: hashlib.sha256(body).hexdigest()
        for route, body in (("view", page), ("report.json", report), ("timeline.json", timeline))
    }


def burst(server: Server, want: dict[str, str]) -> int:
    """BURST requests at once over the three routes, half of them taking gzip; every answer must
    be 200 and the expected bytes. Returns how much the server's RSS grew at its peak."""
    start = threading.Barrier(BURST)
    baseline = server.rss
    with PeakRss(server) as rss, ThreadPoolExecutor(BURST) as pool:
        futures = [pool.submit(get_digest, server.base, ROUTES[i % 3], i % 2 == 1, start) for i in range(BURST)]
        answers = [f.result(timeout=300) for f in futures]
    bad = [(a.route, a.status, a.gzip) for a in answers if a.status != 200 or a.digest != want[a.route]]
    assert not bad, f"{len(bad)} of {BURST} answers wrong: {bad[:6]}"
    assert {a.gzip for a in answers} == {True, False}  # both ways of sending were exercised
    print(f"server RSS {baseline / 1e6:.0f} MB before the burst, {rss.peak / 1e6:.0f} MB at its peak")
    return rss.peak - baseline


@pytest.mark.slow
def test_fifty_requests_at_once_get_every_byte_with_bounded_memory(server: Server, logdir: Path) -> None:
    want = expected_digests(logdir)
    report_dir = logdir / "big" / "report"
    sizes = sum((report_dir / f).stat().st_size for f in ("report.json", "timeline.json"))
    assert sizes > (REPORT_MB + TIMELINE_MB) * 0.9e6
    # First contact: the page is made from both files parsed (~10x their size, for a moment),
    # once, not once for every request in flight (~17 per route).
    cold = burst(server, want)
    assert cold < 20 * sizes, f"first burst: server RSS grew {cold / 1e6:.0f} MB (bound {20 * sizes / 1e6:.0f} MB)"
    # Then every request is served from the cache: nothing is parsed again.
    warm = burst(server, want)
    assert warm < 5 * sizes, f"second burst: server RSS grew {warm / 1e6:.0f} MB (bound {5 * sizes / 1e6:.0f} MB)"


@pytest.mark.slow
def test_the_cache_keeps_the_security_checks(server: Server) -> None:
    for route in ("view", "timeline.json"):
        status, body = fetch(server.base + url(route, "z-linked"))
        assert status == 500 and b"links outside the TensorBoard logdir" in body and b'"secret"' not in body, route
    assert json.loads(fetch(server.base + url("report.json", "z-linked"))[1])["schema_version"] == SCHEMA_VERSION
    status, body = fetch(server.base + url("report.json", "z-broken"))
    assert status == 500 and b"not valid JSON" in body
    status, page = fetch(server.base + url("view", "z-broken"))
    assert status == 500 and b"cannot be shown: report.json is not valid JSON" in page
    for path in (
        url("view", "nope"),
        url("report.json", "..%2Fbig"),
        url("timeline.json", "big%2Freport"),
        url("timeline.json", "..%2F..%2Fsecret.json"),
    ):
        assert fetch(server.base + path)[0] == 404, path


# -- in-process: what the cache did ------------------------------------------------------------


@pytest.fixture(scope="module")
def small_logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tbcache") / "profiler_logs"
    inflate(collected_report(root / "big"), 0.5, 1)
    return root


def plugin_client(logdir: Path) -> tuple[DistributedViewPlugin, dict[str, Any]]:
    plugin = DistributedViewPlugin(base_plugin.TBContext(logdir=str(logdir)))
    return plugin, plugin.get_plugin_apps()


def test_a_burst_reads_each_file_once(small_logdir: Path) -> None:
    plugin, apps = plugin_client(small_logdir)
    start = threading.Barrier(30)

    def one(i: int) -> tuple[int, bytes]:
        route = ROUTES[i % 3]
        client = Client(apps["/" + route])
        start.wait(timeout=60)
        resp = client.get("/" + route, query_string={"run": "big"})
        return resp.status_code, resp.get_data()

    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(one, range(30)))
    report_dir = small_logdir / "big" / "report"
    files = {r: (report_dir / r).read_bytes() for r in ROUTES[1:]}
    for i, (status, body) in enumerate(answers):
        assert status == 200
        if ROUTES[i % 3] in files:
            assert body == files[ROUTES[i % 3]]
    assert plugin.cache.made == 3 and plugin.cache.hits == 27  # one read of each file (and one page) for 30 requests


def test_a_new_version_of_a_file_is_read_again(small_logdir: Path) -> None:
    plugin, apps = plugin_client(small_logdir)
    path = small_logdir / "big" / "report" / "timeline.json"
    client = Client(apps["/timeline.json"])
    first = client.get("/timeline.json", query_string={"run": "big"}).get_data()
    doc = json.loads(first)
    doc["steps_total"] += 1
    path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns + 1_000_000))
    second = client.get("/timeline.json", query_string={"run": "big"}).get_data()
    assert second == path.read_bytes() != first and plugin.cache.made == 2


def body(n: int) -> tuple[int, str, bytes]:
    return 200, "text/plain", os.urandom(n)  # random: gzip keeps its size


def test_body_cache_drops_the_least_recently_used_within_its_caps() -> None:
    cache = BodyCache(max_entries=2, max_bytes=10_000)
    a = cache.get("a", lambda: body(1000))
    cache.get("b", lambda: body(1000))
    assert cache.get("a", lambda: body(1)) is a  # a hit, now the most recent
    cache.get("c", lambda: body(1000))  # three entries: b, the least recent, goes
    assert cache.get("a", lambda: body(1)) is a and cache.made == 3
    assert len(cache.get("b", lambda: body(1)).gzipped) < 100 and cache.made == 4
    cache.get("big", lambda: body(20_000))  # over the byte cap: made, not kept, nothing dropped
    assert cache.get("big", lambda: body(1)).code == 200 and cache.made == 6
    assert 0 < cache.stored_bytes <= 10_000


def test_body_cache_byte_cap_drops_old_entries() -> None:
    cache = BodyCache(max_entries=10, max_bytes=5_000)
    for key in "abc":  # 3 x ~2 kB: a, the oldest, goes
        cache.get(key, lambda: body(2_000))
    assert cache.stored_bytes <= 5_000
    cache.get("b", lambda: body(1))
    cache.get("c", lambda: body(1))
    assert cache.made == 3
    cache.get("a", lambda: body(1))
    assert cache.made == 4
