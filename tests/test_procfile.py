"""The kept-open /proc file the step log reads every step (harness/run/procfile.py)."""

from __future__ import annotations

from pathlib import Path

from harness.run.procfile import KeptProcFile


def test_a_kept_file_reads_current_text_follows_its_path_and_gives_up_after_a_failure(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"1 2 3\n")
    b.write_bytes(b"7 8 9\n")
    path = [str(a)]
    kept = KeptProcFile(lambda: path[0])
    second = lambda text: int(text.split()[1])  # noqa: E731
    try:
        assert kept.read(second) == 2
        a.write_bytes(b"1 5 3\n")  # rewritten in place: the open file reads the new text
        assert kept.read(second) == 5
        path[0] = str(b)  # another reader's file (a thread, a forked child): reopened
        assert kept.read(second) == 8
        b.write_bytes(b"only-one-field\n")
        assert kept.read(second) is None and kept.broken
        b.write_bytes(b"7 8 9\n")  # given up for good: no reopen after a failure
        assert kept.read(second) is None
    finally:
        kept.close()
    missing = KeptProcFile(lambda: str(tmp_path / "none"))
    assert missing.read(second) is None and missing.broken
