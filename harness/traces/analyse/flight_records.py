"""The Flight Recorder analysis's findings as typed records (flight.py `analyze`), as report.json
holds them (`hang`, `other_hangs`, `mismatches`, `flight`): one dataclass per part, a docstring per
field (docs/report-schema.md is generated from them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(kw_only=True)
class CollectiveRef:
    """A collective a rank's recorder holds: `flight.ranks[].last_entered`, `last_completed[]`."""

    seq: int
    """its sequence number in its process group"""
    collective: str
    """its name (e.g. all_reduce)"""
    process_group: str
    """its process group, with its description in parentheses where the dump gives one"""


@dataclass(kw_only=True)
class MissingAt:
    """`hang.missing_at[rank]`: where a rank that never entered the hung collective was."""

    last_seq: int
    """the last sequence number it entered in that process group"""
    step: int | None
    """the step it was in (its dump, else its status file)"""
    phase: str | None
    """the phase it was in"""
    state: str | None
    """how it ended (its status file, else why it dumped)"""


@dataclass(kw_only=True)
class Hang:
    """`hang` (null: none) and `other_hangs[]`: a collective some ranks entered and others never
    did, in one process group; the earliest issued is `hang`."""

    seq: int
    """the hung collective's sequence number"""
    collective: str
    """its name"""
    profiling_name: str
    """its name as the profiler says it (e.g. nccl:all_reduce)"""
    process_group: str
    """its process group"""
    input_sizes: Any
    """its input sizes, as the recorder holds them"""
    step: int | None
    """the step it was issued in"""
    step_source: str | None
    """where that step came from: dump or step log"""
    phase: str | None
    """the phase it was issued in"""
    entered_ranks: list[int]
    """the ranks that entered it and waited"""
    missing_ranks: list[int]
    """the ranks that never entered it"""
    members: list[int]
    """the process group's ranks"""
    missing_at: dict[str, MissingAt]
    """per missing rank (as a string): where it was"""
    waited_s: float | None
    """how long the ranks that entered it waited before they dumped, s"""


@dataclass(kw_only=True)
class MismatchSide:
    """`mismatches[].ranks[rank]`: what one rank issued at the mismatched sequence number."""

    collective: str
    """the collective's name"""
    input_sizes: Any
    """its input sizes"""
    input_dtypes: Any
    """its input dtypes"""


@dataclass(kw_only=True)
class Mismatch:
    """`mismatches[]`: ranks that issued different collectives or sizes at one sequence number."""

    seq: int
    """the sequence number"""
    process_group: str
    """the process group"""
    ranks: dict[str, MismatchSide]
    """per rank (as a string): what it issued"""


@dataclass(kw_only=True)
class DumpRank:
    """`flight.ranks[]`: one rank's dump."""

    rank: int
    """the rank"""
    file: str
    """its dump file"""
    reason: str | None
    """why it dumped (the harness's note in the dump)"""
    step: int | None
    """the step it was in"""
    phase: str | None
    """the phase it was in"""
    entries: int
    """collectives its recorder held"""
    last_entered: CollectiveRef | None
    """the last collective it entered"""
    last_completed: list[CollectiveRef]
    """per process group, the last collective it completed"""


@dataclass(kw_only=True)
class Dumps:
    """`flight`: the dumps read (null: none)."""

    world_size: int | None
    """the job's ranks, where a dump says"""
    ranks: list[DumpRank]
    """each dump"""
    no_dump_ranks: list[int]
    """members of a process group that left no dump"""


@dataclass(kw_only=True)
class FlightResult:
    """What `analyze` finds in a run's dumps."""

    hang: Hang | None
    """the earliest hung collective"""
    other_hangs: list[Hang]
    """further process groups hung the same way"""
    mismatches: list[Mismatch]
    """collectives the ranks issued differently"""
    flight: Dumps
    """the dumps"""


RECORDS = (Hang, MissingAt, Mismatch, MismatchSide, Dumps, DumpRank, CollectiveRef)
