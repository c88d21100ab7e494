"""TensorBoard plugin "harness_distributed": the distributed view inside TensorBoard, offline.

Registered through the `tensorboard_plugins` entry point, so `tensorboard --logdir profiler_logs`
loads it. Routes, under /data/plugin/harness_distributed/:

- `index.js`: the tab's ES module (run picker + the view in an iframe);
- `runs`: JSON [{run, has_report, traces, collect_command}];
- `view?run=R`: the view page (same renderer as report.html, scripts linked, not inlined);
- `report.json?run=R`, `timeline.json?run=R`: the run's collector output;
- `plotly.min.js` (from the installed plotly package), `view.js`, `view.css`;
- `collect?run=R` (POST): start the collector on the run in its own process (202; one at a time);
- `collect_status?run=R`: {state: none|running|done|failed, stage, done, total, elapsed_s, message}.

A run name is looked up among the runs found by walking the logdir; anything else, including
path-traversal attempts, is a 404. No route builds a file path from client input.

The view page, the report's JSON files and Plotly are made once per version of their files (path,
mtime, size) into a small cache of gzip-compressed bodies (`files.BodyCache`), one at a time: many
requests at once for a large run share one copy, and a client that does not take gzip gets the
body decompressed as it is sent, a block at a time.
"""

from __future__ import annotations

import html
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

import psutil
from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from harness.compare.diff import compare_sides
from harness.compare.load import CompareError, load_side
from harness.compare.render import html as compare_html
from harness.paths import REPORT_JSON, TIMELINE_JSON
from harness.report.console import labelled_texts
from harness.report.files import view_title
from harness.report.page import STATIC_FILES as PAGE_FILES
from harness.report.page import plotly_js_path, render_message, render_page
from harness.report.page import static_text as page_text
from harness.view.cache import Body, BodyCache, file_key, json_file_body, static_file_body
from harness.view.runs import RunEntry, find_runs, load_view_data

# What the plugin serves of its own: the page's assets, and the TensorBoard tab's entry module.
STATIC_FILES = {**PAGE_FILES, "index.js": "text/javascript"}


def static_text(name: str) -> str:
    if name == "index.js":
        return resources.files("harness.view").joinpath("static", name).read_text(encoding="utf-8")
    return page_text(name)


PLUGIN_NAME = "harness_distributed"
# "Analyse now" runs the collector under limits, so a hostile or oversized file in a log folder
# costs its own run an error line, never TensorBoard's memory or the other runs' pages:
COLLECT_TIMEOUT_S = 600  # wall time, then its process group is killed
COLLECT_JOBS = 2  # parser processes beside the main one
# Each process's data segment: a quarter of the machine (so all three stay under ~3/4 of it,
# TensorBoard keeping the rest), at least 2 GB (a 2 GB trace streams in less: bench/RESULTS.md,
# "Many ranks and large traces").
COLLECT_MEMORY_MB = max(2048, psutil.virtual_memory().total // 2**20 // 4)
_JSON = "application/json"
_HTML = "text/html"


def compare_form(names: list[str], base: str, new: str) -> str:
    """Two run pickers and a button: the comparison page's form (a GET to itself)."""

    def select(field: str, chosen: str) -> str:
        options = "".join(
            f'<option value="{html.escape(n)}"{" selected" if n == chosen else ""}>{html.escape(n)}</option>'
            for n in names
        )
        return f'<select name="{field}">{options}</select>'

    return (
        f'<form method="get" action="compare">BASE {select("base", base)} NEW {select("new", new)} '
        '<button type="submit">Compare</button></form>'
    )


def collect_command(entry: RunEntry) -> str:
    return f"python -m harness.collect {shlex.quote(str(entry.run_dir))}"


class DistributedViewPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self.logdir = context.logdir
        self.cache = BodyCache()
        self._jobs: dict[str, CollectJob] = {}
        self._jobs_lock = threading.Lock()

    def get_plugin_apps(self) -> dict[str, Any]:
        apps = {
            "/runs": self._serve_runs,
            "/view": self._serve_view,
            "/" + REPORT_JSON: self._serve_report,
            "/" + TIMELINE_JSON: self._serve_timeline,
            "/plotly.min.js": self._serve_plotly,
            "/collect": self._serve_collect,
            "/collect_status": self._serve_collect_status,
            "/compare": self._serve_compare,
        }
        for name in STATIC_FILES:
            apps["/" + name] = self._serve_static
        return apps

    def is_active(self) -> bool:
        return bool(find_runs(self.logdir))

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="Distributed view")

    # -- helpers -----------------------------------------------------------------------------

    def _entry(self, request: wrappers.Request) -> RunEntry | None:
        return find_runs(self.logdir).get(request.args.get("run", ""))

    @staticmethod
    def _not_found(request: wrappers.Request, what: str) -> wrappers.Response:
        return http_util.Respond(request, f"Not found: {what}", "text/plain", code=404)

    @staticmethod
    def _respond(request: wrappers.Request, body: Body, expires: int = 0) -> wrappers.Response:
        # Respond sends the gzip as it is to clients that take it and streams it decompressed to the others.
        return http_util.Respond(
            request, body.gzipped, body.content_type, code=body.code, content_encoding="gzip", expires=expires
        )

    @staticmethod
    def _unusable(entry: RunEntry, exc: ValueError) -> tuple[int, str, bytes]:
        msg = (
            f"<p>The report of run <b>{html.escape(entry.name)}</b> cannot be shown: {html.escape(str(exc))}.</p>"
            f"<p><code>{html.escape(collect_command(entry))}</code></p>"
        )
        return 500, _HTML, render_message(view_title(entry.name), msg).encode()

    def _make_view(self, entry: RunEntry) -> tuple[int, str, bytes]:
        try:
            report, timeline = load_view_data(entry)
        except ValueError as exc:
            return self._unusable(entry, exc)
        return 200, _HTML, render_page(report, timeline, title=view_title(entry.name), assets="linked").encode()

    # -- routes ------------------------------------------------------------------------------

    @wrappers.Request.application
    def _serve_static(self, request: wrappers.Request) -> wrappers.Response:
        name = request.path.rsplit("/", 1)[-1]
        return http_util.Respond(request, static_text(name), STATIC_FILES[name])

    @wrappers.Request.application
    def _serve_plotly(self, request: wrappers.Request) -> wrappers.Response:
        return self._respond(request, static_file_body(self.cache, plotly_js_path(), "text/javascript"), expires=3600)

    @wrappers.Request.application
    def _serve_runs(self, request: wrappers.Request) -> wrappers.Response:
        body = [
            {
                "run": e.name,
                "has_report": e.report_dir is not None,
                "traces": e.traces,
                "collect_command": collect_command(e),
            }
            for e in find_runs(self.logdir).values()
        ]
        return http_util.Respond(request, json.dumps(body), _JSON)

    @wrappers.Request.application
    def _serve_view(self, request: wrappers.Request) -> wrappers.Response:
        entry = self._entry(request)
        if entry is None:
            return self._not_found(request, "no such run")
        if entry.report_dir is None:
            msg = (
                f"<p>Run <b>{html.escape(entry.name)}</b> has {entry.traces} trace file(s) but no collector report "
                f"yet. Make one with</p><p><code>{html.escape(collect_command(entry))}</code></p>"
                "<p>or press <b>Analyse now</b> above, then reload.</p>"
            )
            return http_util.Respond(request, render_message(view_title(entry.name), msg), _HTML)
        try:
            key = (
                "view",
                entry.name,
                file_key(entry.report_file(REPORT_JSON)),
                file_key(entry.report_file(TIMELINE_JSON)),
            )
        except ValueError as exc:
            code, content_type, page = self._unusable(entry, exc)
            return http_util.Respond(request, page, content_type, code=code)
        return self._respond(request, self.cache.get(key, lambda: self._make_view(entry)))

    def _serve_file(self, request: wrappers.Request, name: str) -> wrappers.Response:
        """report.json or timeline.json of the run, byte for byte as the collector wrote it."""
        entry = self._entry(request)
        if entry is None or entry.report_dir is None:
            return self._not_found(request, "no such run with a report")
        try:
            body = json_file_body(self.cache, entry.report_file(name), _JSON)
        except ValueError as exc:
            return http_util.Respond(request, str(exc), "text/plain", code=500)
        if body is None or body.code == 404:
            return self._not_found(request, f"{name} not in this run's report")
        return self._respond(request, body)

    @wrappers.Request.application
    def _serve_report(self, request: wrappers.Request) -> wrappers.Response:
        return self._serve_file(request, REPORT_JSON)

    @wrappers.Request.application
    def _serve_timeline(self, request: wrappers.Request) -> wrappers.Response:
        return self._serve_file(request, TIMELINE_JSON)

    @wrappers.Request.application
    def _serve_collect(self, request: wrappers.Request) -> wrappers.Response:
        if request.method != "POST":
            return http_util.Respond(request, "use POST", "text/plain", code=405)
        entry = self._entry(request)
        if entry is None:
            return self._not_found(request, "no such run")
        with self._jobs_lock:
            busy = next((j for j in self._jobs.values() if j.state()["state"] == "running"), None)
            if busy is not None:
                return http_util.Respond(
                    request,
                    json.dumps({"ok": False, "message": f"the collector is already running on run {busy.run}"}),
                    _JSON,
                    code=409,
                )
            old = self._jobs.pop(entry.name, None)
            if old is not None:
                old.close()
            # The collector runs in its own process (torch-free; a crash or a huge run cannot
            # take TensorBoard down); this request returns at once and the page polls
            # collect_status, so TensorBoard keeps serving everything else meanwhile.
            self._jobs[entry.name] = CollectJob.start(entry.name, entry.run_dir)
        return http_util.Respond(request, json.dumps({"ok": True, "message": "started"}), _JSON, code=202)

    @wrappers.Request.application
    def _serve_compare(self, request: wrappers.Request) -> wrappers.Response:
        """Two runs compared (`compare?base=RUN&new=RUN`, harness.compare): the page picks them,
        then shows the comparison; a run that cannot be compared says why on the page."""
        runs = find_runs(self.logdir)
        base, new = request.args.get("base", ""), request.args.get("new", "")
        if (base and base not in runs) or (new and new not in runs):
            return self._not_found(request, "no such run")
        form = compare_form(list(runs), base, new)
        body = ""
        if base and new:
            try:
                doc = compare_sides(load_side(str(runs[base].run_dir)), load_side(str(runs[new].run_dir)))
                body = compare_html(doc)
            except CompareError as exc:
                body = f"<p>These runs cannot be compared: {html.escape(str(exc))}</p>"
        page = render_message("Compare two runs", form + body)
        return http_util.Respond(request, page, _HTML)

    @wrappers.Request.application
    def _serve_collect_status(self, request: wrappers.Request) -> wrappers.Response:
        entry = self._entry(request)
        if entry is None:
            return self._not_found(request, "no such run")
        with self._jobs_lock:
            job = self._jobs.get(entry.name)
            body = job.state() if job is not None else {"state": "none", "message": "no collection started here"}
        return http_util.Respond(request, json.dumps(body), _JSON)


class CollectJob:
    """One collector process started by "Analyse now": its progress file and its output, in a
    temporary folder of its own; run with COLLECT_JOBS parsers under --memory-limit-mb
    COLLECT_MEMORY_MB in a session of its own, whose every process is killed once it runs past
    COLLECT_TIMEOUT_S (by a timer, whether or not anyone asks for its state)."""

    def __init__(self, run: str, proc: subprocess.Popen, folder: Path) -> None:
        self.run, self.proc, self.folder = run, proc, folder
        self.started = time.monotonic()
        self.timed_out = False
        self.timer = threading.Timer(COLLECT_TIMEOUT_S, self._time_out)
        self.timer.daemon = True
        self.timer.start()

    @classmethod
    def start(cls, run: str, run_dir: Path) -> CollectJob:
        folder = Path(tempfile.mkdtemp(prefix="harness-collect-"))
        with (folder / "output.txt").open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "harness.collect",
                    str(run_dir),
                    "-q",
                    "-j",
                    str(COLLECT_JOBS),
                    "--memory-limit-mb",
                    str(COLLECT_MEMORY_MB),
                    "--progress-file",
                    str(folder / "progress.json"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the parsers are killed with it
            )
        return cls(run, proc, folder)

    def _time_out(self) -> None:
        if self.proc.poll() is None:
            self.timed_out = True
            self._kill()

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def state(self) -> dict[str, Any]:
        """{state: running|done|failed, stage, done, total, elapsed_s, message}."""
        elapsed = time.monotonic() - self.started
        code = self.proc.poll()
        try:
            progress = json.loads((self.folder / "progress.json").read_text())
        except (OSError, ValueError):
            progress = {"stage": "starting", "done": 0, "total": 0}
        body = {
            "state": "running",
            "stage": progress.get("stage", ""),
            "done": progress.get("done", 0),
            "total": progress.get("total", 0),
            "elapsed_s": round(elapsed, 1),
            "message": "",
        }
        if code is not None:
            try:
                lines = (self.folder / "output.txt").read_text(errors="replace").strip().splitlines()
            except OSError:
                lines = []
            if self.timed_out:
                message = (
                    f"the collector ran past {COLLECT_TIMEOUT_S} s; run it by hand (python -m harness.collect RUN_DIR)"
                )
            else:
                verdicts = labelled_texts("\n".join(lines), "verdict")
                message = f"verdict: {verdicts[0]}" if verdicts else lines[-1] if lines else ""
            body.update(state="done" if code == 0 else "failed", message=message)
        return body

    def close(self) -> None:
        self.timer.cancel()
        if self.proc.poll() is None:
            self._kill()
        shutil.rmtree(self.folder, ignore_errors=True)
