"""In-job summaries: a rank's trace condensed to what the analyses read, written by the job and
read by the collector instead of the trace, giving the same report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import SUMMARY_SUFFIX, list_traces, summary_path
from harness.traces.model import CommOp, RankTrace, Shared, Step, compact
from harness.traces.read import summary
from harness.traces.read.decode import open_trace
from harness.traces.read.parse import TraceError, parse_trace
from harness.traces.read.summary import read_summary, summarize, write_summary

from jobs import REAL_TRACES, REPO, run_harness
from tracebuild import gpu_docs, write

A100_DDP = REAL_TRACES / "hta_single_rank" / "nccl_data_a100_rank0of2.json.gz"  # has copies

STEPS = ["--steps", "12", "--warmup-steps", "2", "--wait", "3", "--warmup", "1", "--active", "6", "--batch-size", "16"]


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.collect", *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def _traces(tmp_path: Path) -> list[Path]:
    built = [write(tmp_path / f"rank{r}.pt.trace.json", doc) for r, doc in enumerate(gpu_docs())]
    return built + sorted(REAL_TRACES.glob("*/*.json.gz"))


def test_a_summary_reads_back_as_the_parsed_trace(tmp_path: Path) -> None:
    """Every field of the parsed rank (steps, phases, covers, collectives with their run-ups,
    warnings) survives the summary exactly, on built and real GPU traces."""
    (tmp_path / "s").mkdir()
    for path in _traces(tmp_path):
        parsed = parse_trace(path)
        out = write_summary(parsed, tmp_path / "s" / summary_path(path).name)
        back = read_summary(out)
        assert back.paths == [str(tmp_path / "s" / path.name)]
        back.paths = parsed.paths
        assert back == parsed, path.name
        with open_trace(path) as fh:
            json_bytes = len(fh.read())
        if json_bytes > 1 << 20:  # real traces; measured 6-39x smaller
            assert out.stat().st_size < json_bytes / 4, path.name


def test_damaged_or_foreign_summaries_are_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = write(tmp_path / "rank0.pt.trace.json", gpu_docs()[0])
    good = summarize(trace)
    cases = {"damaged": good.read_bytes()[:100], "foreign": b'{"traceEvents": []}', "empty": b""}
    for name, data in cases.items():
        bad = tmp_path / f"{name}.pt.trace.json{SUMMARY_SUFFIX}"
        bad.write_bytes(data)
        with pytest.raises(TraceError, match=r"damaged or not a harness summary") as info:
            read_summary(bad)
        assert "\n" not in str(info.value) and bad.name in str(info.value)
    stale = json.loads(good.read_bytes())
    stale["version"] = 2
    (old := tmp_path / f"stale.pt.trace.json{SUMMARY_SUFFIX}").write_text(json.dumps(stale))
    readable = ", ".join(map(str, summary.READABLE))
    with pytest.raises(TraceError, match=rf"summary version 2, this collector reads versions {readable}; collect from"):
        read_summary(old)
    for version in (3, 4):  # intervals per step, covers over each step's own work: no device spans in them
        stale["version"] = version
        old.write_text(json.dumps(stale))
        with pytest.raises(TraceError, match=rf"summary version {version}, .*collect from its trace instead"):
            read_summary(old)


def test_collector_prefers_summaries_and_falls_back_to_the_trace(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    traces = [write(run / f"rank{r}.pt.trace.json", doc) for r, doc in enumerate(gpu_docs())]
    assert collect(str(run), "-o", str(tmp_path / "full"), "-q").returncode == 0
    for t in traces:
        summarize(t)
    proc = collect(str(run), "-o", str(tmp_path / "from-summaries"), "-q")
    assert proc.returncode == 0, proc.stderr
    full = json.loads((tmp_path / "full" / "report.json").read_text())
    assert json.loads((tmp_path / "from-summaries" / "report.json").read_text()) == full
    # A damaged summary: the trace next to it is parsed instead, and the report says so.
    summary_path(traces[1]).write_text("{")
    proc = collect(str(run), "-o", str(tmp_path / "fallback"), "-q", "--no-merged")
    doc = json.loads((tmp_path / "fallback" / "report.json").read_text())
    assert proc.returncode == 0 and doc["ranks"] == full["ranks"]
    assert any(
        "damaged or not a harness summary" in w and "parsed rank1.pt.trace.json instead" in w for w in doc["warnings"]
    )
    # Summaries without their traces: the report from the summaries alone, and no merged trace.
    summarize(traces[1])
    for t in traces:
        t.unlink()
    proc = collect(str(run), "-o", str(tmp_path / "only"), "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "only" / "report.json").read_text())["ranks"] == full["ranks"]
    assert not (tmp_path / "only" / "merged.pt.trace.json.gz").exists()
    assert "only the in-job summaries" in proc.stdout


@pytest.mark.slow
def test_in_job_summaries_give_the_report_of_the_full_traces(log_dir: Path, tmp_path: Path) -> None:
    # 100 ms a step, ~12x the clean step here (~8.6 ms): rank 1 is named first with other jobs
    # beside this one (not a `timing` test)
    run = run_harness(
        [
            "--mode",
            "baseline",
            *STEPS,
            "--trace-summary",
            "alongside",
            "--slow-rank",
            "1",
            "--slow-ms",
            "100",
            "--slow-phase",
            "forward",
        ],
        log_dir,
    )
    traces = run.traces()
    assert len(traces) == 2 and all(summary_path(t).is_file() for t in traces)
    assert [r["trace_summaries"] for r in run.run_json["ranks"]] == [[summary_path(t).name] for t in traces]
    assert "in-job trace summaries" in run.proc.stdout
    outs = {}
    for how, flags in {"summaries": [], "traces": ["--from-traces"]}.items():
        proc = collect(str(run.dir), "-o", str(tmp_path / how), *flags)
        assert proc.returncode == 0, proc.stderr
        outs[how] = {name: json.loads((tmp_path / how / name).read_text()) for name in ("report.json", "timeline.json")}
    assert outs["summaries"] == outs["traces"]
    report = outs["summaries"]["report.json"]
    assert (report["verdict"], report["stragglers"][0]["rank"], report["stragglers"][0]["phase"]) == (
        "straggler",
        1,
        "forward",
    )


@pytest.mark.slow
def test_summary_only_runs_keep_no_traces_and_still_collect(log_dir: Path) -> None:
    run = run_harness(["--mode", "baseline", *STEPS, "--trace-summary", "only"], log_dir)
    assert list_traces(run.dir) == []
    summaries = sorted(run.dir.glob(f"*{SUMMARY_SUFFIX}"))
    assert len(summaries) == 2
    assert all(r["traces"] == [] and len(r["trace_summaries"]) == 1 for r in run.run_json["ranks"])
    proc = collect(str(run.dir))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run.dir / "report" / "report.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["ranks"][0]["steps"] == 6


def test_ranks_read_apart_share_one_copy_of_each_name() -> None:
    def rank(r: int) -> RankTrace:
        kernel = "".join(["void gemm<float, 128>", "(int)"])  # built at run time: a new string each call
        return RankTrace(
            rank=r,
            world_size=2,
            host="".join(["node", "0"]),
            run_id=None,
            device="gpu",
            steps=[
                Step(
                    number=1,
                    start_us=0.0,
                    end_us=10.0,
                    compute_by_name_us={kernel: 4.0},
                    phase_spans=[("".join(["for", "ward"]), 0.0, 5.0)],
                )
            ],
            comms=[CommOp(name="allreduce", pg="0", start_us=5.0, end_us=9.0, run_up_us={"op:" + kernel: 4.0})],
        )

    shared = Shared()
    a, b = compact(rank(0), shared), compact(rank(1), shared)
    (ka,), (kb,) = a.steps[0].compute_by_name_us, b.steps[0].compute_by_name_us
    assert ka == kb and ka is kb
    assert a.comms[0].run_up_us.names is b.comms[0].run_up_us.names  # one tuple for the same names
    assert next(iter(a.comms[0].run_up_us)) is next(iter(b.comms[0].run_up_us))
    assert a.steps[0].phase_spans[0][0] is b.steps[0].phase_spans[0][0] and a.host is b.host
    assert b.steps[0].compute_by_name_us == {"void gemm<float, 128>(int)": 4.0}  # values untouched
    assert b.comms[0].run_up_us == {"op:void gemm<float, 128>(int)": 4.0}
