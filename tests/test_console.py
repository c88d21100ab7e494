"""The collector's console as a person reads it: the verdict block first, every line within 100
columns (checked in a real terminal: tmux at 100 columns, its pane captured), a narrow per-rank
table of at most NARROW_RANKS ranks, and every column and rank behind --wide."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from reportbuild import diagnosis_of, rank_record, report_of, straggler_record

from harness.report.console import LABEL_WIDTH, NARROW_RANKS, WIDTH, labelled, narrow_table, why_text

from jobs import REPO, said
from tracebuild import ring_docs, write

RANKS = 24
SLOW = 5


def straggler_job(folder: Path) -> Path:
    """24 GPU ranks on hosts with cluster-long names, 6 steps; rank 5 arrives 600 us late at
    every step's all-reduce (the others at 200 us) of a 1 ms step."""
    hosts = [f"gpu-node-{r // 8:03d}.cluster.example.internal" for r in range(RANKS)]
    docs = ring_docs(lambda r, s: 800.0 if r == SLOW else 200.0, RANKS, 6, transfer_us=100.0, hosts=hosts)
    for r, doc in enumerate(docs):
        write(folder / f"rank{r}.pt.trace.json.gz", doc)
    return folder


def collect(folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "harness.collect", str(folder), "--no-merged", "-j", "1", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_labelled_text_wraps_under_its_label_and_keeps_long_words() -> None:
    text = labelled("next", "word " * 40 + "/a/path/" + "x" * 120)
    lines = text.splitlines()
    assert lines[0].startswith("next:".ljust(LABEL_WIDTH) + "word")
    assert all(line.startswith(" " * LABEL_WIDTH) for line in lines[1:])
    assert all(len(line) <= WIDTH for line in lines if "/a/path/" not in line)
    assert said(text, "next") == [" ".join(["word"] * 40 + ["/a/path/" + "x" * 120])]


def test_a_figure_stays_with_its_unit_and_a_what_if_with_its_figures() -> None:
    for n in range(40):  # every place the wrap can fall
        text = (
            "x" * n
            + " the step would take ~13.37 ms instead of ~78.26 ms (both replayed; measured 77.90 ms), late 64.54 ms"
        )
        lines = labelled("next", text).splitlines()
        assert any("instead of ~78.26 ms (both replayed; measured 77.90 ms)" in line for line in lines), lines
        assert all(not line.rstrip().endswith(("13.37", "64.54", "78.26")) for line in lines), lines


def test_why_names_the_straggler_or_the_bottleneck_most_ranks_share() -> None:
    diagnosis = [
        diagnosis_of(0, "launch-bound", "2153 ops per step"),
        diagnosis_of(1, "straggler", "arrives 7.77 ms per step after the punctual ranks"),
        diagnosis_of(2, "launch-bound", "2100 ops per step"),
    ]
    doc = report_of(stragglers=[straggler_record(1)], diagnosis=diagnosis)
    assert why_text(doc) == "rank 1 arrives 7.77 ms per step after the punctual ranks"
    doc = report_of(diagnosis=diagnosis)
    assert why_text(doc) == "2 of 3 ranks, rank 0 launch-bound: 2153 ops per step"
    assert why_text(report_of(verdict_reason="no collective matched")) == "no collective matched"


def test_the_narrow_table_keeps_the_straggler_and_says_how_many_it_leaves_out() -> None:
    ranks = [
        rank_record(r, mean_step_ms=10.0, late_ms=5.0 if r == 30 else 0.0, wait_ms=3.0, steps=3) for r in range(40)
    ]
    doc = report_of(ranks=ranks, stragglers=[straggler_record(30)])
    lines = narrow_table(doc).splitlines()
    assert len(lines) == 1 + NARROW_RANKS + 1
    assert any(line.split()[0] == "30" and line.endswith("<- straggler") for line in lines[1:-1])
    assert lines[-1].startswith(f"({40 - NARROW_RANKS} more ranks")


def test_the_console_starts_with_the_verdict_and_every_line_fits(tmp_path: Path) -> None:
    proc = collect(straggler_job(tmp_path / "job"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("verdict:") and f"rank {SLOW}" in lines[0]
    labels = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    assert labels[:2] == ["verdict", "why"] and said(proc.stdout, "why")[0].startswith(f"rank {SLOW} arrives")
    assert max(len(line) for line in lines if str(tmp_path) not in line) <= WIDTH, proc.stdout
    table = [line for line in lines if line.lstrip().startswith("rank ") and "bottleneck" in line]
    assert table, proc.stdout
    wide = collect(tmp_path / "job", "--wide")
    assert "beyond peers ms/step" in wide.stdout and "beyond peers" not in proc.stdout
    assert sum(" <- straggler" in line for line in wide.stdout.splitlines()) == 1
    assert len([line for line in wide.stdout.splitlines() if ".cluster.example.internal  " in line]) == RANKS


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (make test installs it)")
def test_a_100_column_terminal_shows_each_line_on_one_row(tmp_path: Path) -> None:
    """The collector runs in tmux at 100 columns; its pane, captured, holds exactly the lines it
    prints, none wrapped onto a second row. Paths are relative, as a user in the job's folder
    types them (an absolute temporary path is longer than a terminal by itself)."""
    straggler_job(tmp_path / "job")
    plain = subprocess.run(
        [sys.executable, "-m", "harness.collect", "job", "--no-merged", "-j", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert plain.returncode == 0, plain.stderr
    socket = f"harness-{uuid.uuid4().hex[:8]}"
    done = f"done-{socket}"
    command = (
        f"cd {tmp_path} && PYTHONPATH={REPO} {sys.executable} -m harness.collect job --no-merged -j 1 "
        f"2>/dev/null; tmux -L {socket} wait-for -S {done}; sleep 60"
    )
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-x", str(WIDTH), "-y", "200", command], check=True, timeout=10)
    try:
        subprocess.run([*tmux, "wait-for", done], check=True, timeout=120)
        pane = subprocess.run(
            [*tmux, "capture-pane", "-p", "-S", "-", "-E", "-"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
    rows = [row.rstrip() for row in pane.splitlines()]
    while rows and not rows[-1]:
        rows.pop()
    expected = [line.rstrip() for line in plain.stdout.splitlines()]
    assert rows == expected, "\n".join(rows)
    assert rows[0].startswith("verdict:") and max(map(len, rows)) <= WIDTH
