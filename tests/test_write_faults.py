"""The profiler never takes training down: write failures on the profiler side (full disk, a
read-only or removed log folder, a trace export that raises, a TensorBoard writer that cannot
write) are said once, recorded, and training goes on. Real torchrun jobs on tmpfs mounts."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.paths import partial_path, trace_path
from harness.run.run_info import host_name
from harness.run.stats import StepLog
from harness.write_faults import AppendOnlyFile, FaultLog, describe

from jobs import collect_report, run_harness

# -- unit: the append-only file -----------------------------------------------------------------


def test_refused_chunk_is_cut_back_and_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "log.jsonl"
    f = AppendOnlyFile(path, FaultLog(rank=3), "step log")
    f.append(b'{"step": 0}\n')
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        real_write(fd, data[: len(data) // 2])  # half a record lands, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(os, "write", half_then_full)
    f.append(b'{"step": 1}\n')
    f.append(b'{"step": 2}\n')  # within RETRY_S: queued, not tried
    assert path.read_bytes() == b'{"step": 0}\n' and len(f.pending) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"harness.train: warning: rank 3: step log failed (no space left on {tmp_path}): "
        "1 record(s) kept in memory and written when the disk takes them again"
    ]
    monkeypatch.setattr(os, "write", real_write)
    assert f.close()
    assert path.read_bytes() == b'{"step": 0}\n{"step": 1}\n{"step": 2}\n'


def test_step_log_comes_back_whole_after_its_folder_is_removed(tmp_path: Path) -> None:
    log = StepLog(tmp_path / "run" / "steps" / "rank0.jsonl", FaultLog(rank=0))
    log.write([{"step": 0}])
    shutil.rmtree(tmp_path / "run")
    log.write([{"step": 1}])
    assert log.close()
    lines = (tmp_path / "run" / "steps" / "rank0.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1]


def test_describe_names_the_cause() -> None:
    assert describe(OSError(errno.EROFS, "x", "/mnt/a")) == "/mnt/a is on a read-only file system"
    assert describe(OSError(errno.ENOENT, "x", "/mnt/a")) == "/mnt/a was removed"
    assert describe(RuntimeError("kineto: export failed\nmore")) == "RuntimeError: kineto: export failed"


# -- real runs on a tmpfs ------------------------------------------------------------------------


def _mount_tmpfs(where: Path, size_mb: int) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt, 80):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# Many short windows (--repeat 0) so that some fall inside the fault and some after it: the fault
# starts at the first window and holds 2 s of wall time, and the run outlasts it by more than the
# writers' 1 s retry on any machine: rank 0 sleeps 30 ms a step, which every rank waits for, so the
# 150 steps take 4.5 s at least (without it, a run whose windows the full disk skipped finished
# inside the fault, and its step records could not be written at its end).
LONG_STEPS = 150
LONG = [
    "--mode",
    "torch",
    "--micro-ops",
    "10",
    "--steps",
    str(LONG_STEPS),
    "--warmup-steps",
    "2",
    "--wait",
    "1",
    "--warmup",
    "1",
    "--active",
    "2",
    "--repeat",
    "0",
    "--batch-size",
    "16",
    "--slow-rank",
    "0",
    "--slow-ms",
    "30",
]


def _first_trace(run_dir: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run_dir.is_dir() and any(p.name.endswith(".pt.trace.json.gz") for p in run_dir.iterdir()):
            return
        time.sleep(0.05)


def _during(
    run_dir: Path, start: Callable[[], None], stop: Callable[[], None], hold_s: float = 2.0
) -> threading.Thread:
    """Once the run has written its first trace: start the fault, hold it, then end it."""

    def body() -> None:
        _first_trace(run_dir)
        start()
        time.sleep(hold_s)
        stop()

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 2**20)
        except OSError:
            pass


def _check_survived(run, nproc: int = 2) -> dict:
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert "Traceback" not in run.proc.stderr
    for rank in range(nproc):
        steps = run.steps(rank)
        assert [s["step"] for s in steps] == list(range(LONG_STEPS)), f"rank {rank}: {len(steps)} step records"
        status = json.loads((run.dir / "status" / f"rank{rank}.json").read_text())
        assert status["state"] == "finished", status
    assert not [p for p in run.dir.rglob("*") if ".partial" in p.name], "a temporary file was left behind"
    return json.loads((run.dir / "run.json").read_text())


@pytest.mark.slow
def test_disk_full_mid_run_skips_windows_and_training_goes_on(small_disk: Path) -> None:
    log_dir = small_disk / "logs"
    fault = _during(log_dir / "run", lambda: _fill(small_disk), lambda: (small_disk / "filler").unlink())
    run = run_harness(LONG, log_dir, timeout=600)
    fault.join(timeout=60)
    info = _check_survived(run)
    skipped = [w for r in info["ranks"] for w in r["skipped_windows"]]
    assert skipped and any(w["reason"].startswith("no space left on") for w in skipped), skipped
    assert "trace export failed (no space left on" in run.proc.stderr
    assert "tracing paused until" in run.proc.stderr or "the next window is tried" in run.proc.stderr
    assert "skipped: rank" in run.proc.stdout
    # tracing came back once there was room: windows after the fault were written
    assert all(r["traces"] for r in info["ranks"])
    status = json.loads((run.dir / "status" / "rank0.json").read_text())
    assert status["tracing"]["state"] == "degraded"
    doc = collect_report(run.dir)
    assert doc["run"]["skipped_windows"] and any("did not write trace window" in w for w in doc["warnings"])


@pytest.mark.slow
def test_log_folder_read_only_mid_run(tmp_path: Path) -> None:
    # A read-only file system laid over the run folder for two seconds: every file the ranks
    # create there (trace windows, status files) is refused with EROFS, as on a remounted disk.
    # (A remount of the disk itself is refused while the step logs are open for writing.)
    log_dir = tmp_path / "logs"
    run_dir = log_dir / "run"

    def read_only() -> None:
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(run_dir)], capture_output=True
            ).returncode
            != 0
        ):
            raise RuntimeError("mount failed")

    fault = _during(run_dir, read_only, lambda: subprocess.run(["umount", "-l", str(run_dir)], check=True))
    if not _mount_tmpfs(tmp_path / "probe", 1):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    subprocess.run(["umount", str(tmp_path / "probe")], check=True)
    run = run_harness(LONG, log_dir, timeout=600)
    fault.join(timeout=60)
    info = _check_survived(run)
    assert "is on a read-only file system" in run.proc.stderr
    assert any("read-only" in w["reason"] for r in info["ranks"] for w in r["skipped_windows"])


@pytest.mark.slow
def test_log_folder_removed_mid_run(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    run_dir = log_dir / "run"

    def remove() -> None:
        gone = tmp_path / "gone"
        run_dir.rename(gone)  # the folder disappears at once for the ranks, then its files
        shutil.rmtree(gone)

    fault = _during(run_dir, remove, lambda: None, hold_s=0.0)
    run = run_harness(LONG, log_dir, timeout=600)
    fault.join(timeout=60)
    _check_survived(run)  # step logs re-created whole, statuses and run.json written again
    assert (
        "step log: " in run.proc.stderr and "was removed; created again with what was written before" in run.proc.stderr
    )


@pytest.mark.slow
def test_export_error_inside_the_profiler_and_a_scalar_writer_that_cannot_write(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    run_dir = log_dir / "run"
    run_dir.mkdir(parents=True)
    # rank 0's window 2 cannot be written (its temporary name is taken by a folder: the export
    # raises IsADirectoryError inside torch.profiler), and rank 1's scalars folder is a file
    taken = partial_path(trace_path(run_dir, 0, host_name(), 2))
    taken.mkdir()
    (run_dir / "tb").mkdir()
    (run_dir / "tb" / "rank00001").write_text("not a folder")
    short = [*LONG[: LONG.index("--steps")], "--steps", "40", *LONG[LONG.index("--warmup-steps") :]]
    run = run_harness(short, log_dir, timeout=300)
    assert run.proc.returncode == 0 and "Traceback" not in run.proc.stderr, run.proc.stderr[-3000:]
    info = json.loads((run.dir / "run.json").read_text())
    assert info["ranks"][0]["skipped_windows"] == [{"first": 2, "last": 2, "reason": f"{taken}: Is a directory"}]
    assert info["ranks"][1]["skipped_windows"] == [] and len(info["ranks"][0]["traces"]) >= 2
    assert "trace export failed" in run.proc.stderr and "the next window is tried as usual" in run.proc.stderr
    assert "TensorBoard scalars failed" in run.proc.stderr
    assert [s["step"] for s in run.steps(1)] == list(range(40))
