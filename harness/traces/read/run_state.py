"""What the training job left about how it ended: elastic attempts and each rank's final state.

Reads the run folder as the training side writes it (harness/paths.py): `restart-N/` attempt
folders (torchrun --max-restarts), `status/rank<R>.json` and `steps/rank<R>.jsonl`, `run.json`.
Pure reads; no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.paths import (
    ATTEMPT_PATTERN,
    PARTIAL_SUFFIX,
    STATUS_DIR,
    STATUS_PATTERN,
    STEPS_DIR,
    attempt_dir,
    run_file,
    status_path,
    steps_path,
)


def attempts(run_dir: Path) -> list[int]:
    """The run's attempts: 0 (the run folder itself) and every N with a `restart-N/` folder."""
    found = {int(m["attempt"]) for p in run_dir.iterdir() if p.is_dir() and (m := ATTEMPT_PATTERN.match(p.name))}
    return sorted(found | {0})


def choose_attempt(inputs: list[str], wanted: int | None) -> tuple[list[str], list[str]]:
    """Point every run folder among `inputs` at one attempt: the latest, or `wanted`.

    Returns the new inputs and notes for the report; raises ValueError naming the folder when
    `wanted` does not exist there."""
    out, notes = [], []
    for item in inputs:
        folder = Path(item)
        if not folder.is_dir():
            out.append(item)
            continue
        have = attempts(folder)
        pick = have[-1] if wanted is None else wanted
        if pick not in have:
            raise ValueError(
                f"{folder} has no attempt {pick} (attempts: {', '.join(map(str, have))}); pick one with --attempt"
            )
        if len(have) > 1:
            others = ", ".join(str(a) for a in have if a != pick)
            notes.append(
                f"{folder}: the job was restarted by torchrun ({len(have) - 1} restart(s)); analysing attempt "
                f"{pick} ({attempt_dir(folder, pick)}), --attempt {others} for the other(s)"
            )
        out.append(str(attempt_dir(folder, pick)))
    return out, notes


def last_logged_step(path: Path) -> int | None:
    """The last step in a step log whose line is whole (a killed rank may leave half a line)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def ending_notes(run_dir: Path) -> list[str]:
    """How the ranks of one attempt ended, when the job did not finish cleanly.

    1. a folder without `status/` is not a harness run (or predates status files): nothing said;
    2. a rank whose status is still "running" after the job ended (no run.json) stopped without
       a word: killed by SIGKILL, the OOM killer or a lost node; its last logged step is named;
    3. "failed" names the exception, "terminated" the signal (the launcher stopping the rank
       after another one failed);
    4. the likely cause first: ranks killed without a word, then failures, then terminations,
       then files left under a temporary name (a window being exported at the kill)."""
    if not (run_dir / STATUS_DIR).is_dir():
        return []
    finished = run_file(run_dir).exists()
    notes: list[tuple[int, str]] = []  # (0 killed, 1 failed, 2 terminated: the cause first), note
    ranks = sorted(int(m["rank"]) for p in (run_dir / STATUS_DIR).iterdir() if (m := STATUS_PATTERN.match(p.name)))
    for rank in ranks:
        try:
            doc = json.loads(status_path(run_dir, rank).read_text())
        except (OSError, ValueError):
            continue
        state = doc.get("state")
        step = last_logged_step(steps_path(run_dir, rank)) if (run_dir / STEPS_DIR).is_dir() else None
        after = f"after step {step}" if step is not None else "before its first step"
        if state == "running" and not finished:
            notes.append(
                (
                    0,
                    f"rank {rank} ({doc.get('host')}, pid {doc.get('pid')}) stopped without a word {after}: "
                    "killed (SIGKILL, the out-of-memory killer) or its node was lost",
                )
            )
        elif state == "failed":
            notes.append((1, f"rank {rank} failed {after}: {doc.get('error')}"))
        elif state == "hung":
            notes.append(
                (1, f"rank {rank} timed out in a collective {after} (a peer never entered it): {doc.get('error')}")
            )
        elif state == "terminated":
            notes.append((2, f"rank {rank} was stopped by {doc.get('error')} {after} (the launcher ending the job)"))
    partial = sorted(p.name for p in run_dir.glob(f"*{PARTIAL_SUFFIX}*") if p.is_file())
    if partial:
        notes.append(
            (
                3,
                f"{len(partial)} file(s) were being written when their rank stopped and are ignored "
                f"({', '.join(partial[:3])}{', ...' if len(partial) > 3 else ''})",
            )
        )
    ordered = [n for _, n in sorted(notes, key=lambda x: x[0])]
    if ordered and not finished:
        ordered.insert(
            0,
            f"the run did not finish (no {run_file(run_dir).name} in {run_dir}); its steps up to the "
            "failure are analysed",
        )
    return ordered


def skipped_windows(run_dir: Path) -> list[dict]:
    """The trace windows the ranks could not write (a full disk, a read-only folder, an export
    error: the training side skipped them and went on), as [{rank, first, last, reason}]: from
    run.json's ranks, else from each rank's status file (a run that did not finish)."""
    out: list[dict] = []
    try:
        ranks = json.loads(run_file(run_dir).read_text()).get("ranks", [])
    except (OSError, ValueError, AttributeError):
        ranks = []
        if (run_dir / STATUS_DIR).is_dir():
            for p in sorted((run_dir / STATUS_DIR).iterdir()):
                try:
                    doc = json.loads(p.read_text())
                    ranks.append(
                        {"rank": doc["rank"], "skipped_windows": (doc.get("tracing") or {}).get("skipped_windows", [])}
                    )
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    continue
    for r in ranks if isinstance(ranks, list) else []:
        for w in (r.get("skipped_windows") or []) if isinstance(r, dict) else []:
            if isinstance(w, dict) and {"first", "last", "reason"} <= set(w):
                out.append({"rank": r.get("rank"), "first": w["first"], "last": w["last"], "reason": w["reason"]})
    return out


def skipped_note(w: dict) -> str:
    windows = f"window {w['first']}" if w["first"] == w["last"] else f"windows {w['first']}-{w['last']}"
    return f"rank {w['rank']} did not write trace {windows} ({w['reason']}): those steps are not in its traces"
