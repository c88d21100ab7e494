"""The collector end to end: real harness runs on CPU/gloo, the third-party GPU traces, bad input."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import list_traces

from identities import check_report
from jobs import QUICK, REAL_TRACES, REPO, run_harness, said
from tracebuild import shift_doc

# The tests that read a run's verdict are `timing` (run alone: tests/conftest.py); the rest read
# what the collector makes of a run's folders.
pytestmark = pytest.mark.slow

# 12 steps, 6 of them recorded: enough steps for persistence, small enough to stay quick.
STEPS = ["--steps", "12", "--warmup-steps", "2", "--wait", "3", "--warmup", "1", "--active", "6", "--batch-size", "16"]


def collect(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.collect", *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"collect {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def report_of(run_dir: Path) -> dict:
    """The report.json of `run_dir`'s report folder (or of `run_dir` itself when that is one)."""
    path = run_dir / "report.json" if (run_dir / "report.json").is_file() else run_dir / "report" / "report.json"
    doc = json.loads(path.read_text())
    check_report(doc)  # the accounting identities hold on every real run
    return doc


@pytest.mark.timing
@pytest.mark.parametrize(
    ("parallel", "nproc", "rank", "phase", "mode"),
    # each wrapper once, four ranks once: the phase rule itself is held to exact answers on
    # simulated jobs (test_phases.py, test_devicesim.py), and the data and optimizer phases are
    # named in real runs by test_api.py's phases found by themselves
    [
        ("ddp", 4, 2, "forward", "baseline"),
        ("fsdp", 2, 0, "backward", "kernel"),
    ],
)
def test_injected_straggler_is_named_with_its_phase(
    parallel: str, nproc: int, rank: int, phase: str, mode: str, log_dir: Path
) -> None:
    run = run_harness(
        [
            "--mode",
            mode,
            "--parallel",
            parallel,
            *STEPS,
            "--hidden",
            "512" if nproc == 4 else "128",
            "--micro-ops",
            "10",
            "--slow-rank",
            str(rank),
            "--slow-ms",
            "60",
            "--slow-phase",
            phase,
        ],
        log_dir,
        nproc=nproc,
    )
    proc = collect(str(run.dir))
    doc = report_of(run.dir)
    assert doc["verdict"] == "straggler", proc.stdout
    top = doc["stragglers"][0]
    assert (top["rank"], top["phase"]) == (rank, phase), proc.stdout
    # 4 ranks share 2 cores here: a peer kept off its core may be late too (its wait for a core
    # said beside it), but the injected 60 ms stands far above any such rank
    assert all(o["beyond_peers_ms"] < top["beyond_peers_ms"] / 4 for o in doc["stragglers"][1:]), proc.stdout
    assert top["last_fraction"] >= 0.5
    assert top["blame_ms"] > 60 * (nproc - 1)  # every other rank waited ~60 ms per recorded step
    assert top["whatif_step_ms"] < top["mean_step_ms"]
    assert f"rank {rank}" in proc.stdout.split("verdict:")[1]
    assert {r["rank"] for r in doc["ranks"]} == set(range(nproc))
    assert all(abs(r["clock_offset_ms"]) < 10 for r in doc["ranks"])  # one host: near 0


# The same 6-step window three times (each run is 2 + 3 x (3 + 1 + 6) steps).
THREE_WINDOWS = ["--steps", "32", *STEPS[2:], "--repeat", "3"]


@pytest.mark.timing
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_clean_runs_are_balanced(parallel: str, log_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No rank of a clean run is a straggler in every window. One window is not enough to say so
    on these shared cores: a healthy rank of this 2.5 ms-step DDP job is late beyond the bound in
    2 of a window's 6 steps now and then (23 of 180 windows here, fsdp 0 of 40), on whichever
    rank the noise hits, as the report's advice for a balanced verdict says (collect several
    windows: noise moves from rank to rank); a straggler is late in each (no rank of those 60 runs
    was flagged in two of its three windows)."""
    run = run_harness(["--mode", "baseline", "--parallel", parallel, *THREE_WINDOWS, "--hidden", "128"], log_dir)
    flagged = []
    for window in (1, 2, 3):
        out = run.dir / f"report{window}"
        collect(str(run.dir), "--window", str(window), "-o", str(out))
        doc = report_of(out)
        assert doc["verdict"] in ("balanced", "straggler") and doc["window"]["window"] == window
        flagged.append({s["rank"] for s in doc["stragglers"]})
    assert not set.intersection(*flagged), (flagged, json.dumps(doc["ranks"], indent=1))
    # the last window's report folder, checked below
    assert (out / "report.md").read_text().startswith("# Straggler and overlap report")
    rows = (out / "steps.csv").read_text().splitlines()
    assert rows[0].startswith("rank,step,step_ms,host_step_ms,wait_ms,blame_ms,exposed_comm_ms")
    assert len(rows) == 1 + 2 * 6
    coll = (out / "collectives.csv").read_text().splitlines()
    assert coll[0] == "instance,name,pg,step,rank,arrival_us,wait_us,transfer_us,delay_share_us,last_rank"
    assert len(coll) - 1 == 2 * doc["collectives"]["matched"] > 0
    merged = json.loads(gzip.decompress((out / "merged.pt.trace.json.gz").read_bytes()))
    names = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {f"rank {r} ({doc['ranks'][r]['host']})" for r in range(2)}
    flows = [e for e in merged["traceEvents"] if e.get("cat") == "collective"]
    assert flows and {e["ph"] for e in flows} == {"s", "f"}
    # torch-tb-profiler's own loader takes the merged trace without nesting one rank's ops into
    # another's (it groups by tid across processes). It also says "communication op not belong to
    # any step" for gloo ops at a window's edges, as it does for the raw per-rank traces.
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator

    data = RunProfileData.parse(
        worker="merged", span=None, path=str(out / "merged.pt.trace.json.gz"), cache_dir=str(log_dir / "tbcache")
    )
    data.process()
    data.analyze()
    views = [v.display_name for v in RunGenerator("merged", None, data).generate_run_profile().views]
    assert "Trace" in views
    assert not [r for r in caplog.records if "should not intersect" in r.getMessage()]


@pytest.mark.timing
def test_skew_injected_into_one_rank_is_recovered(log_dir: Path, tmp_path: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "baseline",
            *STEPS,
            "--hidden",
            "128",
            "--slow-rank",
            "1",
            "--slow-ms",
            "60",
            "--slow-phase",
            "data",
        ],
        log_dir,
    )
    collect(str(run.dir), "-q")
    before = report_of(run.dir)
    skewed = tmp_path / "skewed"
    shutil.copytree(run.dir, skewed, ignore=shutil.ignore_patterns("report"))
    trace = next(p for p in list_traces(skewed) if p.name.startswith("rank00001-"))
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    # rank 1 as if on another node whose clock runs 250 ms ahead (ranks on one host share a clock)
    doc["harness"]["host"] = "other-node"
    trace.write_bytes(gzip.compress(json.dumps(shift_doc(doc, 250_000.0)).encode()))
    collect(str(skewed), "-q")
    after = report_of(skewed)
    # Before, both ranks were on one host: one clock, no offset. The 250 ms is recovered up to
    # where the two ranks' collectives end apart (gloo on two shared cores: about a ms).
    assert before["ranks"][1]["clock_offset_ms"] == 0.0
    assert after["ranks"][1]["clock_offset_ms"] == pytest.approx(250.0, abs=5.0)
    assert [(h["host"], h["ranks"]) for h in after["clock"]["hosts"]] == [
        (before["ranks"][0]["host"], [0]),
        ("other-node", [1]),
    ]
    assert after["verdict"] == before["verdict"] == "straggler"
    assert [(s["rank"], s["phase"]) for s in after["stragglers"]] == [
        (s["rank"], s["phase"]) for s in before["stragglers"]
    ]
    collect(str(skewed), "-q", "--no-align", "-o", str(tmp_path / "unaligned"))
    unaligned = json.loads((tmp_path / "unaligned" / "report.json").read_text())
    assert unaligned["ranks"][1]["clock_offset_ms"] == 0.0


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-rank torch-mode run: its folder, which the tests below copy in parts."""
    return run_harness(["--mode", "torch", *QUICK, "--micro-ops", "5"], tmp_path_factory.mktemp("four"), nproc=4).dir


def test_several_node_folders_at_once(four_ranks: Path, tmp_path: Path) -> None:
    for rank, path in enumerate(list_traces(four_ranks)):
        node = tmp_path / f"node{rank}" / four_ranks.name
        node.mkdir(parents=True)
        shutil.copy(path, node)
    out = tmp_path / "out"
    proc = collect(str(tmp_path / "node0"), str(tmp_path / "node*"), "-o", str(out))
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["ranks_present"] == [0, 1, 2, 3] and doc["run"]["complete"]
    assert "report:" in proc.stdout


def test_missing_rank_gives_a_partial_report(four_ranks: Path, tmp_path: Path) -> None:
    part = tmp_path / "part"
    part.mkdir()
    for path in list_traces(four_ranks):
        if not path.name.startswith("rank00002-"):
            shutil.copy(path, part)
    proc = collect(str(part))
    doc = report_of(part)
    assert doc["run"]["ranks_missing"] == [2] and not doc["run"]["complete"]
    assert "incomplete" in doc["headline"] and "2 missing" in said(proc.stdout, "verdict")[0]
    assert "Incomplete run" in (part / "report" / "report.md").read_text()


THIRD_PARTY = [
    "dlrm_8rank_v100",
    "hta_trace_filter_2of128",
    "hta_single_rank/nccl_data_a100_rank0of2.json.gz",
    "hta_single_rank/df_index_resolver_v100_rank1of2.json.gz",
    "hta_single_rank/torchrec_a100_rank0of16.json.gz",
]


@pytest.mark.parametrize("folder", THIRD_PARTY)
def test_third_party_gpu_traces(folder: str, tmp_path: Path) -> None:
    out = tmp_path / "report"
    collect(str(REAL_TRACES / folder), "-o", str(out), "-q")
    doc = json.loads((out / "report.json").read_text())
    assert doc["run"]["device"] == "gpu"
    for r in doc["ranks"]:
        assert r["compute_ms"] > 0 and r["comm_ms"] > 0
        assert r["exposed_comm_ms"] <= r["comm_ms"] + 1e-6
        assert r["overlapped_comm_ms"] + r["exposed_comm_ms"] == pytest.approx(r["comm_ms"])
        assert r["idle_ms"] >= 0
    if folder == "dlrm_8rank_v100":
        # Ranks 1 and 3 have the longest steps, but everybody waits for rank 7.
        assert doc["verdict"] == "straggler" and [s["rank"] for s in doc["stragglers"]] == [7]
        steps = {r["rank"]: r["mean_step_ms"] for r in doc["ranks"]}
        assert sorted(steps, key=steps.get)[-2:] in ([1, 3], [3, 1])
        # ... and they are victims: diagnosed on their own work, waiting on rank 7
        waits_for = {d["rank"]: [r for r, _ in d["waits_for"]] for d in doc["diagnosis"]}
        assert waits_for[1] == waits_for[3] == [7]
        assert all(d["bottleneck"] != "straggler" for d in doc["diagnosis"] if d["rank"] != 7)
        assert all(abs(r["clock_offset_ms"]) < 0.05 for r in doc["ranks"])
    if folder == "hta_trace_filter_2of128":
        assert doc["run"]["ranks_present"] == [0, 1] and len(doc["run"]["ranks_missing"]) == 126
    if folder.startswith("hta_single_rank/"):
        assert len(doc["ranks"]) == 1 and not doc["run"]["complete"] and doc["verdict"] == "inconclusive"
        assert doc["verdict_reason"].startswith("one rank only")


def test_unrelated_single_rank_traces_are_refused_together() -> None:
    proc = collect(str(REAL_TRACES / "hta_single_rank"), "-o", "/dev/null/x", check=False)
    assert proc.returncode == 2
    assert "different runs are mixed: world size 2" in proc.stderr and "world size 16" in proc.stderr


def test_bad_inputs_get_one_clear_line(tmp_path: Path) -> None:
    proc = collect(str(tmp_path / "nope"), check=False)
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr and "Traceback" not in proc.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = collect(str(empty), check=False)
    assert proc.returncode == 2 and "no trace files" in proc.stderr
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "config.json").write_text('{"hello": 1}')
    (junk / "rank1.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", "na')
    proc = collect(str(junk), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "not valid JSON" in proc.stderr and "truncated" in proc.stderr
    proc = collect(str(junk), "--steps", "7-3", check=False)
    assert proc.returncode == 2 and "invalid step list" in proc.stderr
