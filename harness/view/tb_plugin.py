"""TensorBoard plugin "harness_distributed": the distributed view inside TensorBoard, offline.

Registered through the `tensorboard_plugins` entry point, so `tensorboard --logdir profiler_logs`
loads it. Routes, under /data/plugin/harness_distributed/:

- `index.js`: the tab's ES module (run picker + the view in an iframe);
- `runs`: JSON [{run, has_report, traces, collect_command}];
- `view?run=R`: the view page (same renderer as report.html, scripts linked, not inlined);
- `report.json?run=R`, `timeline.json?run=R`: the run's collector output;
- `plotly.min.js` (from the installed plotly package), `view.js`, `view.css`;
- `collect?run=R` (POST): run the collector on a run that has traces and no report.

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
import shlex
import subprocess
import sys
import threading
from typing import Any

from tensorboard.backend import http_util
from tensorboard.plugins import base_plugin
from werkzeug import wrappers

from harness.paths import REPORT_JSON, TIMELINE_JSON
from harness.view.files import Body, BodyCache, file_key, json_file_body, static_file_body, view_title
from harness.view.render import STATIC_FILES, plotly_js_path, render_message, render_page, static_text
from harness.view.runs import RunEntry, find_runs, load_view_data

PLUGIN_NAME = "harness_distributed"
COLLECT_TIMEOUT_S = 600
_JSON = "application/json"
_HTML = "text/html"


def collect_command(entry: RunEntry) -> str:
    return f"python -m harness.collect {shlex.quote(str(entry.run_dir))}"


class DistributedViewPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self.logdir = context.logdir
        self.cache = BodyCache()
        self._collect_lock = threading.Lock()

    def get_plugin_apps(self) -> dict[str, Any]:
        apps = {
            "/runs": self._serve_runs,
            "/view": self._serve_view,
            "/report.json": self._serve_report,
            "/timeline.json": self._serve_timeline,
            "/plotly.min.js": self._serve_plotly,
            "/collect": self._serve_collect,
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
        return http_util.Respond(request, body.gzipped, body.content_type, code=body.code, content_encoding="gzip",
                                 expires=expires)

    @staticmethod
    def _unusable(entry: RunEntry, exc: ValueError) -> tuple[int, str, bytes]:
        msg = (f"<p>The report of run <b>{html.escape(entry.name)}</b> cannot be shown: {html.escape(str(exc))}.</p>"
               f"<p><code>{html.escape(collect_command(entry))}</code></p>")
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
        body = [{"run": e.name, "has_report": e.report_dir is not None, "traces": e.traces,
                 "collect_command": collect_command(e)} for e in find_runs(self.logdir).values()]
        return http_util.Respond(request, json.dumps(body), _JSON)

    @wrappers.Request.application
    def _serve_view(self, request: wrappers.Request) -> wrappers.Response:
        entry = self._entry(request)
        if entry is None:
            return self._not_found(request, "no such run")
        if entry.report_dir is None:
            msg = (f"<p>Run <b>{html.escape(entry.name)}</b> has {entry.traces} trace file(s) but no collector report "
                   f"yet. Make one with</p><p><code>{html.escape(collect_command(entry))}</code></p>"
                   "<p>or press <b>Analyse now</b> above, then reload.</p>")
            return http_util.Respond(request, render_message(view_title(entry.name), msg), _HTML)
        try:
            key = ("view", entry.name, file_key(entry.report_file(REPORT_JSON)),
                   file_key(entry.report_file(TIMELINE_JSON)))
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
        if not self._collect_lock.acquire(blocking=False):
            return http_util.Respond(request, json.dumps({"ok": False, "message": "a collection is already running"}),
                                     _JSON, code=409)
        try:
            # The collector is torch-free; a child process keeps a crash or a huge run from
            # taking TensorBoard down, and the timeout bounds how long the request can hang.
            proc = subprocess.run([sys.executable, "-m", "harness.collect", str(entry.run_dir), "-q"],
                                  capture_output=True, text=True, timeout=COLLECT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            body, code = {"ok": False, "message": f"the collector ran past {COLLECT_TIMEOUT_S} s; run it by hand: "
                                                  f"{collect_command(entry)}"}, 504
        else:
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            body = {"ok": proc.returncode == 0, "message": lines[-1] if lines else ""}
            code = 200 if proc.returncode == 0 else 500
        finally:
            self._collect_lock.release()
        return http_util.Respond(request, json.dumps(body), _JSON, code=code)

