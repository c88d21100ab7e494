"""The distributed view's pieces without a server: scalars, timeline, renderer, run discovery."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from harness.report.document import build_report
from harness.report.files import view_title, write_view
from harness.report.page import plotly_js_path, render_page
from harness.report.records import as_document
from harness.report.tb_scalars import write_scalars
from harness.report.timeline import build_timeline
from harness.scalars import ScalarWriter, step_scalars
from harness.view.runs import find_runs, load_view_data

from tracebuild import gpu_docs, run_analysis


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    ea = EventAccumulator(str(logdir))
    ea.Reload()
    return {tag: [(e.step, round(e.value, 4)) for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}


def test_step_scalars_have_units_and_throughput() -> None:
    rec = {
        "step": 3,
        "step_ms": 50.0,
        "data_ms": 10.0,
        "outside_step_ms": 0.5,
        "samples": 16,
        "rss_bytes": 1000,
        "host_cpu_util_pct": None,
        "phases_ms": {"data": 10.0, "forward": 20.0},
        "phases_p2p_ms": {"forward": 7.5},
        "phases_collective_wait_ms": {"optimizer": 2.5},
    }
    assert step_scalars(rec) == {
        "step/time_ms": 50.0,
        "step/data_wait_ms": 10.0,
        "step/outside_step_ms": 0.5,
        "memory/host_rss_bytes": 1000.0,
        "phase/forward_ms": 20.0,
        "p2p_wait/forward_ms": 7.5,
        "collective_wait/optimizer_ms": 2.5,
        "step/throughput_samples_per_s": 320.0,
    }


def test_scalar_writer_round_trip(tmp_path: Path) -> None:
    w = ScalarWriter(tmp_path / "tb" / "rank00000")
    for step in range(3):
        w.add(step, {"step/time_ms": 10.0 + step})
    w.close()
    assert scalars(tmp_path / "tb" / "rank00000") == {"step/time_ms": [(0, 10.0), (1, 11.0), (2, 12.0)]}


def test_event_file_checksums_match_tensorboards() -> None:
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    from harness.scalars import _masked_crc32c

    for data in (b"", b"abc", bytes(range(256)) * 3):
        assert _masked_crc32c(data) == masked_crc32c(data)


def test_timeline_exact(tmp_path: Path) -> None:
    # gpu_docs: rank 0 arrives at t+300 us, rank 1 at t+500, both end at t+700, steps of 1000 us
    tl = build_timeline(run_analysis(tmp_path, gpu_docs()))
    lanes = {lane["rank"]: lane for lane in tl["ranks"]}
    assert lanes[0]["steps"] == [[1, 0.0, 1.0], [2, 1.0, 2.0]]
    assert lanes[0]["collectives"] == [["allreduce", 1, 0.3, 0.7, 0.2, 1], ["allreduce", 2, 1.3, 1.7, 0.2, 1]]
    assert lanes[1]["collectives"] == [["allreduce", 1, 0.5, 0.7, 0.0, 1], ["allreduce", 2, 1.5, 1.7, 0.0, 1]]
    assert (tl["steps_shown"], tl["steps_total"]) == (2, 2)


def test_timeline_is_cut_to_the_drawing_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.report.timeline as timeline

    monkeypatch.setattr(timeline, "MAX_ITEMS", 5)  # one step = 2 ranks x (1 step + 1 collective) = 4 items
    tl = timeline.build_timeline(run_analysis(tmp_path, gpu_docs()))
    assert (tl["steps_shown"], tl["steps_total"]) == (1, 2)
    assert all(len(lane["steps"]) == 1 and len(lane["collectives"]) == 1 for lane in tl["ranks"])


def test_collector_scalars_are_rewritten_not_doubled(tmp_path: Path) -> None:
    a = run_analysis(tmp_path / "traces", gpu_docs())
    doc = build_report(a, ["x"])
    out = tmp_path / "report"
    write_scalars(doc, out)
    write_scalars(doc, out)  # a second collection replaces the first
    got = scalars(out / "tb" / "rank00001")
    assert got["collector/blame_ms"] == [(1, 0.2), (2, 0.2)]
    assert scalars(out / "tb" / "rank00000")["collector/wait_for_others_ms"] == [(1, 0.2), (2, 0.2)]
    assert got["collector_total/blame_ms"] == [(0, 0.4)]
    assert len(list((out / "tb" / "rank00001").iterdir())) == 1


def _data_block(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="harness-data">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m.group(1))


def test_render_page_escapes_and_embeds(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, gpu_docs(arrive1_us=2000.0, end_us=2200.0, period_us=3000.0))
    report = build_report(a, ["x"])
    evil = "</script><script>alert(1)</script>"
    for r in [*report.ranks, *report.stragglers]:
        r.host = evil
    tl = build_timeline(a)
    page = render_page(report, tl, title="Distributed view: t", assets="linked")
    assert "<script>alert(1)" not in page
    assert _data_block(page) == {"report": json.loads(json.dumps(as_document(report))), "timeline": tl}
    assert '<script src="plotly.min.js"></script>' in page and "Plotly.newPlot" not in page
    assert report.verdict == "straggler"
    row = re.search(r'<table id="stragglers">.*?<tbody><tr data-rank="1">(.*?)</tr>', page, re.S)
    # rank 1 arrives 1.7 ms late at both steps' allreduce: the others waited 2 x 1.7 ms for it
    assert row and 'data-key="blame_ms">3.40<' in row.group(1) and 'data-key="whatif_step_ms">1.20<' in row.group(1)
    inline = render_page(report, tl, title="t", assets="inline")
    assert "<script src=" not in inline and "Plotly" in inline and len(inline) > 1_000_000
    with pytest.raises(ValueError):
        render_page(report, tl, title="t", assets="cdn")


def test_write_view_files(tmp_path: Path) -> None:
    a = run_analysis(tmp_path, gpu_docs())
    report = build_report(a, ["x"])
    timeline = build_timeline(a)
    path = write_view(report, timeline, tmp_path / "report")
    assert path.name == "report.html"
    assert _data_block(path.read_text())["report"] == json.loads(json.dumps(as_document(report)))
    # written in parts, the page is the one render_page builds whole (the plugin serves that one)
    title = view_title(report.run.run_id or tmp_path.name)
    page = path.read_text(encoding="utf-8")
    assert page == render_page(report, timeline, title=title, assets="inline")
    # Plotly goes in as bytes: the file's text, any "</script" in it escaped, inside one <script>
    plotly = plotly_js_path().read_text(encoding="utf-8")
    assert "<script>" + plotly.replace("</script", "<\\/script") + "</script>" in page
    assert json.loads((tmp_path / "report" / "timeline.json").read_text())["ranks"][0]["rank"] == 0


def _trace(d: Path, name: str = "rank00000-h.0001.pt.trace.json.gz") -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(b"")


def test_find_runs(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    _trace(root / "done")
    (root / "done" / "report").mkdir()
    (root / "done" / "report" / "report.json").write_text("{}")
    _trace(root / "done" / "report", "merged.pt.trace.json.gz")
    _trace(root / "fresh")
    _trace(root / "fresh" / "tb")  # event folders are not searched
    _trace(root / "condensed", "rank00000-g.0001.pt.trace.json.gz.summary.json")  # in-job summaries only
    _trace(root / "group" / "mn" / "node0")
    _trace(root / "group" / "mn" / "node1", "rank00001-g.0001.pt.trace.json.gz")
    (root / "elsewhere").mkdir()
    (root / "elsewhere" / "report.json").write_text("{}")
    outside = tmp_path / "outside"
    _trace(outside)
    (root / "link").symlink_to(outside)
    # a multi-node run gathered as node folders, collected into the first one's report
    _trace(root / "gathered" / "n0" / "run")
    _trace(root / "gathered" / "n1" / "run", "rank00001-g.0001.pt.trace.json.gz")
    (root / "gathered" / "n0" / "run" / "report").mkdir()
    dirs = [str((root / "gathered" / n / "run").resolve()) for n in ("n0", "n1")]
    (root / "gathered" / "n0" / "run" / "report" / "report.json").write_text(json.dumps({"input_dirs": dirs}))
    runs = find_runs(root)
    assert sorted(runs) == ["condensed", "done", "elsewhere", "fresh", "gathered/n0/run", "group/mn"]
    assert runs["condensed"].traces == 1 and runs["condensed"].report_dir is None
    assert runs["gathered/n0/run"].traces == 2
    assert runs["done"].report_dir == (root / "done" / "report").resolve() and runs["done"].traces == 1
    assert runs["fresh"].report_dir is None and runs["fresh"].traces == 1
    assert runs["group/mn"].traces == 2 and runs["group/mn"].run_dir == (root / "group" / "mn").resolve()
    assert find_runs(tmp_path / "missing") == {} and find_runs(None) == {}


def test_load_view_data_refuses_foreign_or_broken_reports(tmp_path: Path) -> None:
    (tmp_path / "a" / "report").mkdir(parents=True)
    (tmp_path / "a" / "report" / "report.json").write_text('{"verdict": ')
    (tmp_path / "b" / "report").mkdir(parents=True)
    (tmp_path / "b" / "report" / "report.json").write_text('{"other": 1}')
    runs = find_runs(tmp_path)
    with pytest.raises(ValueError, match="not valid JSON"):
        load_view_data(runs["a"])
    with pytest.raises(ValueError, match="not written by harness.collect"):
        load_view_data(runs["b"])


_JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from('ab<>&/"\\é\n\u2028'), max_size=6),
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=12), st.dictionaries(st.text(alphabet="k<&é", max_size=3), inner, max_size=5)
    ),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    data=st.one_of(_JSON, st.dictionaries(st.text(alphabet="ab<", max_size=3), _JSON, max_size=6)),
    batch=st.integers(1, 4),
    part=st.integers(1, 40),
)
def test_json_written_in_parts_is_the_same_text(data, batch: int, part: int, tmp_path_factory) -> None:
    """report.json (write_json_in_parts) and the page's JSON (_json_parts), written a part at a
    time, are the bytes json.dumps gives for the whole, with long lists split between parts
    (batch and part sizes made tiny so every example crosses them)."""
    import harness.report.files as files
    import harness.report.page as page

    path = tmp_path_factory.mktemp("parts") / "report.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(page, "JSON_BATCH", batch)
        mp.setattr(files, "PART_CHARS", part)
        assert "".join(page._json_parts(data)) == page._json_block(data)
        files.write_json_in_parts(path, data, indent=1, allow_nan=False)
    assert path.read_bytes() == (json.dumps(data, indent=1, allow_nan=False) + "\n").encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(
    pieces=st.lists(
        st.sampled_from([b"</script", b"</scr", b"ipt", b"IPT", b"<", b"/", b"x", b"</SCRIPT", b"</ScRi", b"\xc3\xa9"]),
        max_size=30,
    ),
    chunk=st.integers(1, 12),
)
def test_a_script_file_inlined_in_chunks_is_escaped_as_a_whole(pieces: list, chunk: int, tmp_path_factory) -> None:
    """Plotly is inlined from its file a chunk at a time: the same bytes as escaping the whole,
    however a "</script" or a two-byte character falls across the chunks (chunk sizes made
    tiny), and each part a valid UTF-8 text (the page decodes them one by one)."""
    import harness.report.page as page

    js = b"".join(pieces)
    path = tmp_path_factory.mktemp("js") / "script.js"
    path.write_bytes(js)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(page, "CHUNK_BYTES", chunk)
        parts = list(page._inline_script(path))
        for p in parts:
            if isinstance(p, bytes):
                p.decode("utf-8")  # raises on a character cut in two
        chunked = b"".join(p.encode() if isinstance(p, str) else p for p in parts)
    whole = b"".join(p.encode() if isinstance(p, str) else p for p in page._inline_script(js))
    inner = whole[len(b"<script>") : -len(b"</script>")]
    assert chunked == whole and b"</script" not in inner.lower()  # no end tag in any case
    assert inner.replace(b"<\\/", b"</") == js  # the same letters otherwise
