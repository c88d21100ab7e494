"""Flight Recorder dumps: which rank never entered which collective (a hang), and ranks that
issued different collectives at the same sequence number (a mismatch). No torch.

Reads `<run>/flight/rank<R>.json` (harness/run/flight.py: torch's JSON dump plus a `harness` key
saying where the rank was and why it dumped), torch's JSON dumps written by other jobs (e.g.
torchtitan; the rank from the file name's last digits), and NCCL's watchdog pickles only when
the user allows it (`--unpickle-nccl-dumps`; even then no class is ever loaded).

Every entry is one collective a rank issued: `collective_seq_id` counts the collectives of its
process group on that rank, the same count on every rank. A collective completes only once every
member has entered it; on gloo every entry's `state` stays `scheduled`, so completion is read
from the sequence numbers, not the states.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.flight_entry import process_group
from harness.paths import (
    FLIGHT_DIR,
    NCCL_DUMP_PREFIX,
    PARTIAL_SUFFIX,
    STATUS_DIR,
    TRACE_PATTERN,
    is_summary,
    status_path,
    steps_path,
)
from harness.traces.analyse.flight_records import (
    CollectiveRef,
    DumpRank,
    Dumps,
    FlightResult,
    Hang,
    Mismatch,
    MismatchSide,
    MissingAt,
)
from harness.traces.read.decode import Limits
from harness.traces.read.run_state import last_logged_step

MAX_MISMATCHES = 20
PICKLE_HINT = (
    "the collector never unpickles a file by default (unpickling can run code); if you trust it, rerun "
    "with --unpickle-nccl-dumps"
)
_TRAILING_RANK = re.compile(r"(\d+)$")


class FlightError(ValueError):
    """A dump that cannot be read; the message is one line naming the file and why."""


@dataclass(frozen=True)
class Entry:
    """One collective as a rank's recorder holds it."""

    seq: int
    pg: str  # the process group's name (e.g. "0"), as the entries name it
    pg_desc: str
    name: str  # e.g. "all_reduce" (profiling_name without the "gloo:"/"nccl:" prefix)
    profiling_name: str
    input_sizes: Any
    input_dtypes: Any
    state: str | None
    created_ns: int | None


@dataclass
class RankDump:
    """One rank's dump: its collectives (p2p left out) and what the harness said about it."""

    rank: int
    path: Path
    entries: list[Entry]
    pg_ranks: dict[str, list[int]]  # process group name or desc -> its global ranks, where the dump says
    harness: dict[str, Any] = field(default_factory=dict)
    dumped_ns: int | None = None
    skipped_entries: int = 0


class _NoClassUnpickler(pickle.Unpickler):
    """Reads plain containers, strings and numbers only: any class or function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


def _load(path: Path, unpickle: bool) -> dict[str, Any]:
    """The dump's top-level object, or FlightError with the reason in words."""
    try:
        size = path.stat().st_size
        if size > (limit := Limits.from_env().whole_bytes):
            raise FlightError(
                f"{path}: {size / 2**20:.0f} MB, larger than the {limit / 2**20:g} MB a dump may take "
                "(Flight Recorder dumps are ~1 MB a process); raise HARNESS_MAX_WHOLE_MB if it is genuine"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise FlightError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not data.strip():
        raise FlightError(f"{path}: empty file (its rank was probably killed while dumping)")
    if data[:1] == b"\x80":
        if not unpickle:
            raise FlightError(f"{path}: a pickle (NCCL's watchdog dump format); {PICKLE_HINT}")
        try:
            doc = _NoClassUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 - any damage in a pickle is one reason
            raise FlightError(f"{path}: damaged pickle ({type(exc).__name__}: {exc})") from None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FlightError(f"{path}: damaged: neither JSON text nor a pickle") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            if exc.pos >= len(text.rstrip()) - 1:
                raise FlightError(
                    f"{path}: truncated JSON (ends after {len(data)} bytes mid-document; the rank was "
                    "probably killed while dumping)"
                ) from None
            raise FlightError(f"{path}: damaged JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
        raise FlightError(f"{path}: not a Flight Recorder dump (no 'entries' list)")
    return doc


def _rank_of(path: Path, doc: dict[str, Any]) -> int:
    """The dump's rank: the harness key, a `rank` key, else the file name's last digits (torch's
    own dump files are `<prefix><rank>`)."""
    for holder in (doc.get("harness"), doc):
        if isinstance(holder, dict) and isinstance(holder.get("rank"), int) and not isinstance(holder["rank"], bool):
            return holder["rank"]
    stem = path.name.removesuffix(".json").removesuffix(".pkl")
    if m := _TRAILING_RANK.search(stem):
        return int(m.group(1))
    raise FlightError(f"{path}: no rank: no 'harness.rank' key and no digits at the end of the file name")


def _pg_ranks(doc: dict[str, Any]) -> dict[str, list[int]]:
    """pg_config as {name: ranks, desc: ranks}; ranks may be a list or its text ("[0, 1]")."""
    out: dict[str, list[int]] = {}
    config = doc.get("pg_config")
    for key, pg in config.items() if isinstance(config, dict) else []:
        if not isinstance(pg, dict):
            continue
        ranks = pg.get("ranks")
        if isinstance(ranks, str):
            try:
                ranks = json.loads(ranks)
            except ValueError:
                continue
        if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
            for name in {str(key), str(pg.get("name", key)), str(pg.get("desc", ""))} - {""}:
                out[name] = ranks
    return out


def _entry(raw: Any) -> Entry | None:
    """A collective entry, or None for a p2p one or one that does not parse."""
    if not isinstance(raw, dict) or raw.get("is_p2p"):
        return None
    seq = raw.get("collective_seq_id")
    name = raw.get("profiling_name")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq <= 0 or not isinstance(name, str):
        return None
    pg_name, pg_desc = process_group(raw) or (str(raw.get("pg_id", "")), "")
    created = raw.get("time_created_ns")
    return Entry(
        seq=seq,
        pg=pg_name,
        pg_desc=pg_desc,
        name=name.split(":", 1)[-1],
        profiling_name=name,
        input_sizes=raw.get("input_sizes"),
        input_dtypes=raw.get("input_dtypes"),
        state=raw.get("state") if isinstance(raw.get("state"), str) else None,
        created_ns=created if isinstance(created, int) else None,
    )


def read_dump(path: Path, *, unpickle: bool = False) -> RankDump:
    """One rank's dump; FlightError (one line) when it cannot be read."""
    doc = _load(path, unpickle)
    rank = _rank_of(path, doc)
    parsed = [_entry(e) for e in doc["entries"]]
    entries = [e for e in parsed if e is not None]
    skipped = sum(
        1 for e, raw in zip(parsed, doc["entries"]) if e is None and not (isinstance(raw, dict) and raw.get("is_p2p"))
    )
    raw_harness = doc.get("harness")
    harness: dict[str, Any] = raw_harness if isinstance(raw_harness, dict) else {}
    dumped = harness.get("dumped_ns")
    if not isinstance(dumped, int):
        dumped = path.stat().st_mtime_ns  # other jobs' dumps: written when they dumped
    return RankDump(
        rank=rank,
        path=path,
        entries=entries,
        pg_ranks=_pg_ranks(doc),
        harness=harness,
        dumped_ns=dumped,
        skipped_entries=skipped,
    )


def _is_dump_name(path: Path) -> bool:
    name = path.name
    if PARTIAL_SUFFIX in name or TRACE_PATTERN.match(name) or is_summary(path):
        return False
    return bool(_TRAILING_RANK.search(name.removesuffix(".json").removesuffix(".pkl")))


def _looks_like_dump(path: Path) -> bool:
    """Another job's dump in a folder of its own: its opening holds torch's dump keys."""
    try:
        with path.open("rb") as fh:
            head = fh.read(1 << 16)
    except OSError:
        return False
    if b'"schemaVersion"' in head or b'"traceEvents"' in head:  # a profiler trace (its distributedInfo has a pg_config)
        return False
    return b'"pg_config"' in head or b'"entries"' in head[:64] or (head[:1] == b"\x80" and b"entries" in head)


def find_dumps(inputs: list[str]) -> list[Path]:
    """Dump files among the inputs: `<folder>/flight/*` of each run folder; a folder that is a
    dump folder itself (named `flight`, or holding `nccl_trace_rank_<R>` files, or files that open
    like torch's dumps: other jobs' dumps); dump files given by name. Files under a temporary name
    (a dump cut by a kill) are left out."""
    found: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_file() and _is_dump_name(p) and p.parent.name == FLIGHT_DIR:
            found.append(p)
        elif p.is_dir():
            folder = p / FLIGHT_DIR if (p / FLIGHT_DIR).is_dir() else p
            named = folder.name == FLIGHT_DIR or any(f.name.startswith(NCCL_DUMP_PREFIX) for f in folder.iterdir())
            found.extend(
                f
                for f in sorted(folder.iterdir())
                if f.is_file() and _is_dump_name(f) and (named or _looks_like_dump(f))
            )
    return sorted(set(found))


def read_dumps(paths: list[Path], *, unpickle: bool = False) -> tuple[list[RankDump], list[str]]:
    """Every readable dump (one per rank: the first by path wins) and one warning per file that is not."""
    dumps: dict[int, RankDump] = {}
    warnings: list[str] = []
    for p in paths:
        try:
            d = read_dump(p, unpickle=unpickle)
        except FlightError as exc:
            warnings.append(f"flight recorder: skipped {exc}")
            continue
        if d.rank in dumps:
            warnings.append(
                f"flight recorder: {p} is a second dump of rank {d.rank}; {dumps[d.rank].path.name} is used"
            )
            continue
        if d.skipped_entries:
            warnings.append(
                f"flight recorder: {p}: {d.skipped_entries} entr(ies) without a sequence number or name left out"
            )
        dumps[d.rank] = d
    return [dumps[r] for r in sorted(dumps)], warnings


def _status(run_dir: Path | None, rank: int) -> dict[str, Any]:
    if run_dir is None:
        return {}
    try:
        doc = json.loads(status_path(run_dir, rank).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _last_logged_step(run_dir: Path | None, rank: int) -> int | None:
    return None if run_dir is None else last_logged_step(steps_path(run_dir, rank))


def _members(dumps: list[RankDump], pg: str, desc: str, world_size: int | None) -> list[int]:
    """The global ranks of a process group: from any dump's pg_config; the default group is the
    world; else the ranks whose dumps hold it."""
    for d in dumps:
        for key in (pg, desc):
            if key and key in d.pg_ranks:
                return sorted(d.pg_ranks[key])
    if (desc == "default_pg" or pg == "0") and world_size:
        return list(range(world_size))
    return sorted(d.rank for d in dumps if any(e.pg == pg for e in d.entries))


def _agreed(values: list[Any]) -> Any:
    """The most common non-None value (None when there is none)."""
    present = [v for v in values if v is not None]
    return Counter(present).most_common(1)[0][0] if present else None


def _signature(e: Entry) -> tuple[str, str, str]:
    return e.name, json.dumps(e.input_sizes), json.dumps(e.input_dtypes)


def analyze(dumps: list[RankDump], *, run_dir: Path | None = None, world_size: int | None = None) -> FlightResult:
    """Hang, mismatches and each rank's last collectives, as report.json's `hang`, `mismatches`
    and `flight` sections.

    1. per process group, each member's last entered collective = its highest sequence number
       there (0: none in its buffer); a member whose last is below the group's highest never
       entered the collectives after it: it is missing, the ranks at the highest entered the
       hung one (waiting in it until their dump);
    2. with several groups hung, the one whose hung collective was issued first (creation time,
       else sequence number) is reported: the others usually wait on the same missing rank;
    3. `step` of the hung collective: where the entered ranks were when they dumped (the harness
       key: the step they were blocked in, exact); else their last logged step + 1 (a blocked
       rank never finishes, so never logs, the step it is stuck in); else null. `phase` likewise
       from the dump, else their status file's `where`, else null;
    4. `waited_s`: from the hung collective's creation to the entered ranks' dump (the longest);
    5. mismatches: at a sequence number held by two or more members' buffers, different names,
       input sizes or dtypes (a rank running other code, or other shapes);
    6. last completed per rank and group: the highest collective that every member of the group
       had entered (only then can it complete; needs every member's dump), or the highest entry
       torch marked `completed` (NCCL).
    Members of a group that left no dump are listed in `no_dump_ranks`, never guessed at.
    """
    ws = world_size or _agreed([d.harness.get("world_size") for d in dumps])
    if not ws:
        sizes = [len(r) for d in dumps for r in d.pg_ranks.values()]
        ws = max(sizes + [max(d.rank for d in dumps) + 1]) if dumps else None
    groups: dict[str, str] = {}
    for d in dumps:
        for e in d.entries:
            groups.setdefault(e.pg, e.pg_desc)
    by_rank = {d.rank: d for d in dumps}
    hangs: list[tuple[int, Hang]] = []  # (the hung collective's creation time, ns; the hang)
    mismatches: list[Mismatch] = []
    last_completed: dict[int, list[CollectiveRef]] = {}
    no_dump: set[int] = set()
    for pg, desc in sorted(groups.items()):
        members = _members(dumps, pg, desc, ws)
        dumped = [r for r in members if r in by_rank]
        no_dump.update(r for r in members if r not in by_rank)
        seqs = {r: {e.seq: e for e in by_rank[r].entries if e.pg == pg} for r in dumped}
        last = {r: max(s, default=0) for r, s in seqs.items()}
        top = max(last.values(), default=0)
        floor = min(last.values(), default=0)
        all_dumped = len(dumped) == len(members)
        for r in dumped:
            done = [e for e in seqs[r].values() if e.state == "completed"]
            best = max(done, key=lambda e: e.seq) if done else seqs[r].get(min(last[r], floor)) if all_dumped else None
            if best:
                last_completed.setdefault(r, []).append(
                    CollectiveRef(seq=best.seq, collective=best.name, process_group=_pg_label(pg, desc))
                )
        common = sorted(set.intersection(*(set(s) for s in seqs.values()))) if len(seqs) > 1 else []
        for seq in common:
            sigs = {r: _signature(seqs[r][seq]) for r in dumped}
            if len(set(sigs.values())) > 1 and len(mismatches) < MAX_MISMATCHES:
                mismatches.append(
                    Mismatch(
                        seq=seq,
                        process_group=_pg_label(pg, desc),
                        ranks={
                            str(r): MismatchSide(
                                collective=seqs[r][seq].name,
                                input_sizes=seqs[r][seq].input_sizes,
                                input_dtypes=seqs[r][seq].input_dtypes,
                            )
                            for r in dumped
                        },
                    )
                )
        if top > floor:
            entered = [r for r in dumped if last[r] == top]
            missing = [r for r in dumped if last[r] < top]
            created_ns = seqs[entered[0]][top].created_ns or 0
            hangs.append((created_ns, _hang(pg, desc, top, entered, missing, seqs, by_rank, run_dir, members, last)))
    ordered = [h for _, h in sorted(hangs, key=lambda ch: (ch[0], ch[1].seq))]
    ranks = [
        DumpRank(
            rank=d.rank,
            file=str(d.path),
            reason=d.harness.get("reason"),
            step=d.harness.get("step"),
            phase=d.harness.get("phase"),
            entries=len(d.entries),
            last_entered=_last_entered(d),
            last_completed=last_completed.get(d.rank, []),
        )
        for d in dumps
    ]
    return FlightResult(
        hang=ordered[0] if ordered else None,
        other_hangs=ordered[1:],
        mismatches=mismatches,
        flight=Dumps(world_size=ws, ranks=ranks, no_dump_ranks=sorted(no_dump)),
    )


def _pg_label(pg: str, desc: str) -> str:
    return f"{pg} ({desc})" if desc else pg


def _last_entered(d: RankDump) -> CollectiveRef | None:
    if not d.entries:
        return None
    e = max(d.entries, key=lambda e: (e.created_ns or 0, e.seq))
    return CollectiveRef(seq=e.seq, collective=e.name, process_group=_pg_label(e.pg, e.pg_desc))


def _hang(
    pg: str,
    desc: str,
    top: int,
    entered: list[int],
    missing: list[int],
    seqs: dict[int, dict[int, Entry]],
    by_rank: dict[int, RankDump],
    run_dir: Path | None,
    members: list[int],
    last: dict[int, int],
) -> Hang:
    """One hung collective (steps 3 and 4 of `analyse`)."""
    hung = seqs[entered[0]][top]
    step = _agreed([by_rank[r].harness.get("step") for r in entered])
    step_source = "dump" if step is not None else None
    if step is None:
        logged = [s for r in entered if (s := _last_logged_step(run_dir, r)) is not None]
        if logged:
            step, step_source = max(logged) + 1, "step log"
    phase = _agreed([by_rank[r].harness.get("phase") for r in entered])
    if phase is None:
        phase = _agreed([(_status(run_dir, r).get("where") or {}).get("phase") for r in entered])
    waits = [
        (dumped - created) / 1e9
        for r in entered
        if (dumped := by_rank[r].dumped_ns) and (created := seqs[r][top].created_ns)
    ]
    missing_at = {}
    for r in missing:
        where = {k: by_rank[r].harness.get(k) for k in ("step", "phase")}
        if where["step"] is None:
            where = _status(run_dir, r).get("where") or {"step": None, "phase": None}
        missing_at[str(r)] = MissingAt(
            last_seq=last[r],
            step=where.get("step"),
            phase=where.get("phase"),
            state=_status(run_dir, r).get("state") or by_rank[r].harness.get("reason"),
        )
    return Hang(
        seq=top,
        collective=hung.name,
        profiling_name=hung.profiling_name,
        process_group=_pg_label(pg, desc),
        input_sizes=hung.input_sizes,
        step=step,
        step_source=step_source,
        phase=phase,
        entered_ranks=entered,
        missing_ranks=missing,
        members=members,
        missing_at=missing_at,
        waited_s=round(max(waits), 1) if waits else None,
    )


def headline(result: FlightResult) -> str | None:
    """The hang (or, without one, the first mismatch) in one sentence; None when neither."""
    h = result.hang
    if h:
        step = f" of step {h.step}" if h.step is not None else ""
        phase = f", {h.phase} phase" if h.phase else ""
        waited = f" for {h.waited_s:.1f} s" if h.waited_s is not None else ""
        who = ", ".join(map(str, h.missing_ranks))
        return (
            f"hang: rank{'s' if len(h.missing_ranks) > 1 else ''} {who} "
            f"never entered the {h.collective}{step} "
            f"(collective #{h.seq} of process group {h.process_group}{phase}) that rank"
            f"{'s' if len(h.entered_ranks) > 1 else ''} {_and(h.entered_ranks)} waited in{waited}"
        )
    if result.mismatches:
        m = result.mismatches[0]
        groups: dict[str, list[str]] = {}
        for r, e in m.ranks.items():
            groups.setdefault(
                f"{e.collective} of sizes {e.input_sizes} ({', '.join(e.input_dtypes or [])})", []
            ).append(r)
        parts = [f"rank{'s' if len(rs) > 1 else ''} {', '.join(rs)} issued {sig}" for sig, rs in groups.items()]
        return f"mismatch: at collective #{m.seq} of process group {m.process_group}, " + "; ".join(parts)
    return None


def _and(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def next_step(result: FlightResult) -> str | None:
    """What to do about the hang or mismatch."""
    h = result.hang
    if h:
        where = "; ".join(
            f"rank {r} was in step {w.step} ({w.phase}) when it stopped"
            for r, w in h.missing_at.items()
            if w.step is not None
        )
        return (
            f"Look at what rank(s) {', '.join(map(str, h.missing_ranks))} did instead of entering collective "
            f"#{h.seq} ({h.collective}): a stuck data loader or I/O, a branch that skips the collective, "
            f"an exception swallowed, or a dead process"
            + (f" ({where})" if where else "")
            + "; py-spy dump --pid <pid> on a live rank shows its stack."
        )
    if result.mismatches:
        return (
            "Ranks issued different collectives or sizes at the same sequence number: look for rank-dependent "
            "control flow or shapes (uneven last batch, a conditional all_reduce, different model configs)."
        )
    return None


def status_rank_count(run_dir: Path) -> int:
    """Ranks with a status file (a flight-only run's world size where no dump says it)."""
    folder = run_dir / STATUS_DIR
    return sum(1 for p in folder.iterdir() if p.suffix == ".json") if folder.is_dir() else 0
