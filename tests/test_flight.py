"""Hung and mismatched collectives from Flight Recorder dumps: real torchrun gloo jobs (a rank
that stops at step 8, a clean run, a shape mismatch) and hand-built dumps with exact answers,
damaged, truncated, empty, pickled and missing ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.paths import flight_path, status_path
from harness.run.settings import ConfigError
from harness.traces.analyse.flight import FlightError, analyze, headline, read_dump, read_dumps
from harness.traces.analyse.flight_records import MissingAt
from harness.train.config import build_config

from jobs import QUICK, REPO, job_env, run_harness, said


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.collect", *args], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def entry(
    seq: int,
    name: str = "all_reduce",
    sizes: list | None = None,
    pg: tuple[str, str] = ("0", "default_pg"),
    created_s: float = 100.0,
) -> dict:
    return {
        "collective_seq_id": seq,
        "profiling_name": f"gloo:{name}",
        "process_group": list(pg),
        "input_sizes": sizes or [[8]],
        "input_dtypes": ["Float"],
        "state": "scheduled",
        "is_p2p": False,
        "p2p_seq_id": 0,
        "time_created_ns": int((created_s + seq) * 1e9),
    }


def dump(
    folder: Path,
    rank: int,
    entries: list[dict],
    *,
    harness: dict | None = None,
    pg_config: dict | None = None,
    name: str | None = None,
) -> Path:
    doc = {
        "version": "2.10",
        "pg_config": pg_config or {"": {"name": "", "desc": "", "ranks": "[0, 1, 2]"}},
        "entries": entries,
    }
    if harness is not None:
        doc["harness"] = {"rank": rank, **harness}
    path = folder / (name or f"rank{rank}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


# --- real jobs -------------------------------------------------------------------------------


def test_hang_ends_by_timeout_and_names_the_missing_rank(tmp_path: Path) -> None:
    run = run_harness(
        [
            "--mode",
            "baseline",
            "--hidden",
            "64",
            *QUICK,
            "--steps",
            "12",
            "--hang-rank",
            "1",
            "--hang-step",
            "8",
            "--collective-timeout",
            "10",
        ],
        tmp_path,
        nproc=3,
        check=False,
        timeout=300,
    )
    assert run.proc.returncode != 0
    states = {r: json.loads(status_path(run.dir, r).read_text()) for r in range(3)}
    assert [states[r]["state"] for r in range(3)] == ["hung", "terminated", "hung"]
    assert states[1]["where"] == {"step": 8, "phase": "forward"}
    for r in range(3):
        assert json.loads(flight_path(run.dir, r).read_text())["harness"]["rank"] == r
    out = collect(str(run.dir), "-q")
    assert out.returncode == 0, out.stderr
    first = said(out.stdout, "verdict")[0]
    assert out.stdout.startswith("verdict:")
    assert first.startswith("hang: rank 1 never entered the all_reduce of step 8 "), first
    assert "ranks 0 and 2 waited in" in first
    doc = json.loads((run.dir / "report" / "report.json").read_text())
    hang = doc["hang"]
    assert doc["verdict"] == "hang"
    assert (hang["collective"], hang["step"], hang["phase"]) == ("all_reduce", 8, "backward")
    assert (hang["entered_ranks"], hang["missing_ranks"]) == ([0, 2], [1])
    assert hang["missing_at"]["1"]["step"] == 8 and hang["missing_at"]["1"]["phase"] == "forward"
    assert 8 <= hang["waited_s"] <= 120
    assert doc["mismatches"] == []
    assert "Collectives in flight" in (run.dir / "report" / "report.md").read_text()
    assert 'id="sec-hang"' in (run.dir / "report" / "report.html").read_text()


def test_clean_run_is_not_a_hang(tmp_path: Path) -> None:
    run = run_harness(["--mode", "baseline", "--hidden", "64", *QUICK], tmp_path, nproc=2)
    assert not (run.dir / "flight").exists()  # dumps are written only when a rank ends badly
    out = collect(str(run.dir), "-q")
    assert out.returncode == 0, out.stderr
    doc = json.loads((run.dir / "report" / "report.json").read_text())
    assert doc["verdict"] != "hang" and doc["hang"] is None and doc["flight"] is None
    assert not said(out.stdout, "verdict")[0].startswith("hang")


def test_size_mismatch_from_a_real_job_is_reported(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "tests" / "flight_mismatch_job.py"),
        str(tmp_path),
    ]
    env = {**job_env(), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = collect(str(tmp_path), "-q")
    assert out.returncode == 0, out.stderr
    assert said(out.stdout, "verdict")[0] == (
        "mismatch: at collective #3 of process group 0 (default_pg), rank 0 issued "
        "all_reduce of sizes [[12]] (Float); rank 1 issued all_reduce of sizes "
        "[[3, 4]] (Float)"
    )
    doc = json.loads((tmp_path / "report" / "report.json").read_text())
    assert doc["verdict"] == "mismatch" and doc["hang"] is None
    assert [m["seq"] for m in doc["mismatches"]] == [3]


# --- hand-built dumps -------------------------------------------------------------------------


def test_hand_built_hang_exact(tmp_path: Path) -> None:
    flight = tmp_path / "flight"
    for r in (0, 2, 3):
        dump(
            flight,
            r,
            [entry(s) for s in range(1, 6)],
            harness={"world_size": 4, "step": 2, "phase": "backward", "reason": "hung", "dumped_ns": int(135.5e9)},
            pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]}},
        )
    dump(
        flight,
        1,
        [entry(s) for s in range(1, 5)],
        harness={"world_size": 4, "step": 2, "phase": "data", "reason": "terminated"},
    )
    dumps, warnings = read_dumps(sorted(flight.iterdir()))
    assert warnings == []
    result = analyze(dumps)
    h = result.hang
    assert h is not None
    assert (h.seq, h.collective, h.step, h.phase) == (5, "all_reduce", 2, "backward")
    assert (h.entered_ranks, h.missing_ranks, h.waited_s) == ([0, 2, 3], [1], 30.5)
    assert h.missing_at["1"] == MissingAt(last_seq=4, step=2, phase="data", state="terminated")
    assert [r.last_completed[0].seq for r in result.flight.ranks] == [4, 4, 4, 4]
    assert headline(result) == (
        "hang: rank 1 never entered the all_reduce of step 2 (collective #5 of process group "
        "0 (default_pg), backward phase) that ranks 0, 2 and 3 waited in for 30.5 s"
    )


def test_foreign_dumps_step_from_step_logs_and_subgroup(tmp_path: Path) -> None:
    """No harness key (another job's dumps): the rank from the file name, the step from the step
    logs (last logged + 1); a hang in a subgroup of ranks 0 and 1 only."""
    pg = {
        "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"},
        "1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"},
    }
    world = [entry(s) for s in range(1, 4)]
    sub = lambda n: [entry(s, "all_gather", pg=("1", "tp")) for s in range(1, n + 1)]  # noqa: E731
    folder = tmp_path / "dumps"
    dump(folder, 0, world + sub(7), pg_config=pg, name="nccl_trace_rank_0.json")
    dump(folder, 1, world + sub(6), pg_config=pg, name="nccl_trace_rank_1.json")
    dump(folder, 2, world, pg_config=pg, name="nccl_trace_rank_2.json")
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "rank0.jsonl").write_text('{"step": 4}\n{"step": 5}\n{"st')
    dumps, _ = read_dumps(sorted(folder.iterdir()))
    h = analyze(dumps, run_dir=tmp_path).hang
    assert h is not None
    assert (h.process_group, h.seq, h.collective) == ("1 (tp)", 7, "all_gather")
    assert (h.entered_ranks, h.missing_ranks, h.members) == ([0], [1], [0, 1])
    assert (h.step, h.step_source, h.phase) == (6, "step log", None)


def test_no_hang_when_every_rank_entered_the_same(tmp_path: Path) -> None:
    for r in range(3):
        dump(tmp_path, r, [entry(s) for s in range(1, 4)])
    result = analyze(read_dumps(sorted(tmp_path.iterdir()))[0])
    assert result.hang is None and result.mismatches == [] and headline(result) is None


def test_a_rank_without_a_dump_is_not_guessed_at(tmp_path: Path) -> None:
    for r in (0, 2):
        dump(tmp_path, r, [entry(s) for s in range(1, 4)], harness={"world_size": 3})
    result = analyze(read_dumps(sorted(tmp_path.iterdir()))[0])
    assert result.hang is None and result.flight.no_dump_ranks == [1]


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "empty file"),
        (b'{"version": "2.10", "entries": [{"collective_seq_id": 1', "truncated JSON"),
        (b'{"version": "2.10", "entries": [}]} trailing', "damaged JSON"),
        (b"\x80\x04\x95\x10\x00\x00\x00", "a pickle (NCCL's watchdog dump format)"),
        (b'{"version": "2.10"}', "not a Flight Recorder dump"),
        (b"\xff\xfe\x00garbage", "damaged: neither JSON text nor a pickle"),
    ],
)
def test_unreadable_dump_one_line_reason(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "flight" / "rank0.json"
    path.parent.mkdir()
    path.write_bytes(content)
    with pytest.raises(
        FlightError, match="^" + str(path).replace(".", r"\.") + ": " + reason.replace("(", r"\(").replace(")", r"\)")
    ):
        read_dump(path)
    out = collect(str(tmp_path))
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("harness.collect: error: no readable trace and no readable Flight Recorder dump")
    ), out.stderr
    assert reason in out.stderr


def test_pickle_read_only_when_allowed_and_never_loads_classes(tmp_path: Path) -> None:
    import pickle

    folder = tmp_path / "flight"
    folder.mkdir()

    def pickled(seq: int, pg_id: int) -> dict:
        # NCCL's pickles hold the group as a tuple (name, description); pg_id is the rank's own
        # number for the group (it counts only the groups the rank is in), so ranks differ on it
        return {**entry(seq), "process_group": ("3", "undefined"), "pg_id": pg_id}

    doc = {"version": "2.10", "pg_config": {}, "entries": [pickled(1, 1), pickled(2, 1)]}
    (folder / "nccl_trace_rank_0").write_bytes(pickle.dumps(doc))
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps({**doc, "entries": [pickled(1, 2)]}))
    assert collect(str(tmp_path)).returncode == 2
    out = collect(str(tmp_path), "--unpickle-nccl-dumps", "-q")
    assert out.returncode == 0, out.stderr
    assert said(out.stdout, "verdict")[0].startswith(
        "hang: rank 1 never entered the all_reduce (collective #2 of process group 3"
    )
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps({**doc, "entries": [Path("x")]}))
    with pytest.raises(FlightError, match="refused to load"):
        read_dump(folder / "nccl_trace_rank_1", unpickle=True)


def test_one_damaged_dump_is_a_warning_not_the_end(tmp_path: Path) -> None:
    flight = tmp_path / "flight"
    dump(flight, 0, [entry(1), entry(2)], harness={"world_size": 2})
    (flight / "rank1.json").write_text('{"entries": [')
    dumps, warnings = read_dumps(sorted(flight.iterdir()))
    assert [d.rank for d in dumps] == [0] and len(warnings) == 1 and "truncated JSON" in warnings[0]
    assert analyze(dumps).flight.no_dump_ranks == [1]


def test_no_trace_and_no_dump_still_exits_2(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    out = collect(str(tmp_path / "run"))
    assert out.returncode == 2 and "no trace files" in out.stderr


# --- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer, field",
    [
        ({"hang": {"rank": 1}}, "hang.step"),
        ({"hang": {"step": 3}}, "hang.rank"),
        ({"hang": {"rank": 1, "step": 99}}, "hang.step"),
        ({"hang": {"rank": 1, "step": 2, "phase": "loss"}}, "hang.phase"),
        ({"parallel": {"collective_timeout": 0}}, "parallel.collective_timeout"),
        ({"parallel": {"flight_recorder": -1}}, "parallel.flight_recorder"),
    ],
)
def test_bad_hang_and_timeout_knobs(layer: dict, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build_config([layer])
    assert exc.value.field == field
