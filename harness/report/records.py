"""report.json as typed records: `Report`, the document, and one dataclass per kind of part or
row in it, a docstring per field.

`build_report` (document.py) makes each part as one of these and the pipeline completes the
`Report`; `as_document` writes it with fields in their order here, so that order is the keys' order
in report.json. docs/report-schema.md is generated from these records (`python -m
harness.report.records > docs/report-schema.md`) and a test keeps it current. Every duration is
in ms unless its name says `_us`; "per step" figures are means over the analysed steps, "total"
ones sums over them.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any

import msgspec

from harness.traces.analyse import flight_records
from harness.traces.analyse.advisor import Diagnosis, Evidence
from harness.traces.analyse.flight_records import Dumps, Hang, Mismatch
from harness.traces.analyse.memory import MemoryFinding, MemoryStep, MemoryTimeline
from harness.traces.analyse.overlap import Gap
from harness.traces.read.watch_log import CaptureRecord, WatchFlagRecord, WatchRecord
from harness.traces.read.windows import WindowRecord

# report.json's schema version: the TensorBoard view refuses a report of another
SCHEMA_VERSION = 2


@dataclass(kw_only=True)
class RunRecord:
    """`run`: the job the traces came from."""

    run_id: str | None
    """the run's id (from the harness metadata; null for other jobs' traces)"""
    world_size: int | None
    """ranks in the job (null where no trace says)"""
    ranks_present: list[int]
    """ranks whose traces were read"""
    ranks_missing: list[int]
    """ranks of the world with no trace"""
    complete: bool
    """every rank present and the job finished"""
    ending: list[str]
    """how a job that did not finish ended, rank by rank (read/run_state.py)"""
    skipped_windows: list[SkippedWindowRecord]
    """trace windows a rank could not write (e.g. a full disk)"""
    hosts: list[str]
    """the machines, sorted"""
    device: str
    """"gpu" when any rank's trace has device activity, else "cpu\""""
    steps_source: list[str]
    """where step boundaries came from (ProfilerStep, or a fallback)"""
    steps: list[int]
    """every step number analysed"""
    median_step_ms: float | None
    """the median over ranks of their mean step (per step)"""
    replayed_step_ms: float | None
    """the what-if replay with nothing changed: how well the replay reproduces the run (per step)"""
    measured_step_ms: float | None
    """what replayed_step_ms reproduces, measured: the mean over the replayed steps of (the last
    rank's step end - the last rank's step start), on the timeline the collectives are on (the
    device's on a GPU) (per step)"""
    replay_faithful: bool
    """whether replayed_step_ms is within 10% of measured_step_ms (replay.REPLAY_FIDELITY); where
    not, the what-ifs are said as shares of the step, with no absolute figure"""
    whatif_all_fixed_step_ms: float | None
    """the replayed step with every straggler fixed (per step)"""


@dataclass(kw_only=True)
class SkippedWindowRecord:
    """`run.skipped_windows[]`: a profiler window a rank could not write; training went on
    (read/run_state.py)."""

    rank: int | None
    """the rank (null where its status file does not say)"""
    first: int
    """the window's first step"""
    last: int
    """its last step"""
    reason: str
    """why it was skipped"""


@dataclass(kw_only=True)
class GpuRecord:
    """`stragglers[].gpu`: its GPU against its peers' over the analysed steps (NVML readings in the
    step logs), where it ran slower; null otherwise."""

    sm_clock_mhz: float
    """the median SM clock of its readings"""
    peer_sm_clock_mhz: float
    """the median of its peers' medians"""
    throttle: list[str]
    """throttle reasons it had in half of its steps or more that no peer had (power, temperature, ...)"""
    temp_c: float | None
    """its highest temperature, C"""
    peer_temp_c: float | None
    """its peers' highest temperature, C"""
    text: str
    """the sentence the report says"""


@dataclass(kw_only=True)
class StragglerRecord:
    """`stragglers[]`: each rank that keeps the others waiting, latest beyond its peers first;
    empty unless the verdict is straggler."""

    rank: int
    """the rank"""
    host: str
    """its machine"""
    phase: str | None
    """where it is slow: a phase (data, forward, ...), "op:<name>", "idle ..." or "outside its ranges\""""
    phase_excess_ms: float | None
    """how much longer that phase takes than on its peers (per step)"""
    late_ms: float
    """how much later than the punctual ranks it arrives at collectives (per step)"""
    beyond_peers_ms: float
    """its lateness beyond its peers', per step: what flags it over threshold_ms"""
    core_wait_ms: float | None
    """CPU-only traces with step logs: its wait for a core per step (what other work on its cores cost
    it: part of its lateness, not taken out of it); null without"""
    cost_ms: float
    """its share of how much later the collectives start (per step): what fixing it buys when others are late too"""
    blame_ms: float
    """the others' waiting it caused (total)"""
    wait_ms: float
    """its own waiting for others (total)"""
    late_fraction: float
    """share of its collectives at which it was late beyond the clocks' noise"""
    steps_late: int
    """steps in which its lateness exceeded the bound"""
    steps: int
    """steps with matched collectives"""
    pattern: str | None
    """persistent (late in at least 2/3 of the steps) or intermittent"""
    last_fraction: float
    """share of steps in which it cost the most"""
    whatif_step_ms: float | None
    """the replayed step with its excess removed (per step)"""
    mean_step_ms: float | None
    """its mean step (per step)"""
    syncs: dict[str, list[float]]
    """{caller: [syncs per step, ms of device idle they cause per step]} when its syncs made it late, else {}"""
    gpu: GpuRecord | None
    """its GPU's clock and throttling against its peers' where it ran slower (GPU runs with NVML readings in
    their step logs); null otherwise"""


@dataclass(kw_only=True)
class RankRecord:
    """`ranks[]`: one per rank; compute..idle are totals over the analysed steps, and
    exposed_comm = exposed_wait + exposed_transfer."""

    rank: int
    """the rank"""
    host: str
    """its machine"""
    steps: int
    """its analysed steps"""
    mean_step_ms: float | None
    """its mean step (per step)"""
    compute_ms: float
    """device time in compute kernels (on CPU: ops), total"""
    comm_ms: float
    """communication, total"""
    overlapped_comm_ms: float
    """communication hidden behind compute, total"""
    exposed_comm_ms: float
    """communication not hidden behind compute, total"""
    exposed_wait_ms: float
    """exposed communication only waiting for a later peer, total"""
    exposed_transfer_ms: float
    """exposed communication moving data, total"""
    memcpy_ms: float
    """host<->device copies and memsets on the device (neither compute nor idle), total"""
    idle_ms: float
    """the device idle inside the steps, total"""
    wait_ms: float
    """its waiting for later peers at collectives, total"""
    blame_ms: float
    """the others' waiting it caused, total"""
    late_ms: float
    """its lateness at collectives (per step)"""
    beyond_peers_ms: float
    """its lateness beyond its peers', per step: what the straggler rule judges"""
    core_wait_ms: float | None
    """CPU-only traces with step logs: its wait for a core per step (what other work on its cores cost
    it: part of its lateness, not taken out of it); null without"""
    cost_ms: float
    """its share of the collectives' delay (per step)"""
    late_fraction: float
    """share of its collectives at which it was late beyond the noise"""
    last_fraction: float
    """share of steps in which it cost the most"""
    waits_for: list[list[Any]]
    """[[rank, ms per step]] the stragglers it waited on beyond the noise, most first"""
    clock_offset_ms: float
    """its host clock's offset from the reference host"""
    clock_spread_ms: float
    """the scatter of its collectives' ends after alignment (the clocks' noise)"""
    clock_samples: int
    """collectives its offset was measured from"""
    peak_rss_bytes: float | None
    """peak host memory in the steady steps (step logs; null without them)"""
    rss_growth_bytes_per_step: float | None
    """least-squares host memory growth per step (null under 3 steps)"""
    peak_gpu_allocated_bytes: float | None
    """peak GPU memory allocated (null on CPU)"""
    peak_gpu_reserved_bytes: float | None
    """peak GPU memory reserved by the caching allocator (null on CPU)"""
    gpu_growth_bytes_per_step: float | None
    """least-squares GPU memory growth per step (null under 3 steps or on CPU)"""


@dataclass(kw_only=True)
class HostRecord:
    """`hosts[]`: one per machine."""

    host: str
    """the machine"""
    ranks: list[int]
    """its ranks"""
    blame_ms: float
    """the others' waiting its ranks caused, total"""
    wait_ms: float
    """its ranks' waiting for others, total"""
    stragglers: list[int]
    """its ranks that are stragglers"""


@dataclass(kw_only=True)
class StepRecord:
    """`steps[]`: one per rank and step; compute_ms + exposed_comm_ms + memcpy_ms + idle_ms add up
    to step_ms."""

    rank: int
    """the rank"""
    step: int
    """the step number"""
    step_ms: float
    """the step's span on the timeline the device works on (on GPU cut from the device's own timeline,
    which runs behind the host; on CPU the ProfilerStep)"""
    host_step_ms: float
    """its ProfilerStep on the host"""
    wait_ms: float
    """this rank's waiting for others in the step"""
    blame_ms: float
    """the others' waiting it caused in the step"""
    exposed_comm_ms: float
    """communication not hidden behind compute"""
    exposed_wait_ms: float
    """exposed communication only waiting for a later peer"""
    exposed_transfer_ms: float
    """exposed communication moving data"""
    compute_ms: float
    """compute on the device (on CPU: ops)"""
    comm_ms: float
    """communication"""
    memcpy_ms: float
    """host<->device copies and memsets"""
    idle_ms: float
    """the device idle"""
    last_arriver: bool
    """it cost the most that step"""
    rss_mb: float | None
    """host memory at the step (step logs; null without them)"""
    gpu_allocated_mb: float | None
    """peak GPU memory allocated in the step (null on CPU)"""


@dataclass(kw_only=True)
class ClockHostRecord:
    """`clock.hosts[]`: one clock offset per machine."""

    host: str
    """the machine"""
    ranks: list[int]
    """its ranks"""
    offset_ms: float
    """its clock's offset from the reference host's"""
    spread_ms: float
    """the scatter of the collectives' ends it was measured from"""
    samples: int
    """collectives measured"""
    via: str | None
    """the host it was aligned against (null for the reference)"""


@dataclass(kw_only=True)
class ProcessGroupRecord:
    """`process_groups[]`: one per process group, summed over its ranks and the analysed steps
    (groups that run at the same time each count the time)."""

    pg: str
    """the process group (its name or number; a library's family where kernels carry no group)"""
    ranks: list[int]
    """the ranks seen in its matched collectives"""
    collectives: int
    """its matched collective instances"""
    comm_ms: float
    """its communication time, total"""
    exposed_wait_ms: float
    """its communication not hidden behind compute, only waiting for a later peer, total"""
    exposed_transfer_ms: float
    """its communication not hidden behind compute, moving data, total"""
    wait_ms: float
    """every rank's waiting in its collectives, total"""
    transfer_ms: float
    """its instances' transfer times, total"""


@dataclass(kw_only=True)
class CollectiveStatRecord:
    """`collective_stats[]`: one per collective, process group and message size, longest total
    transfer first; bandwidths follow NCCL-tests' conventions."""

    name: str
    """the collective (all_reduce, all_gather, ...)"""
    pg: str
    """its process group"""
    ranks: int
    """ranks taking part"""
    bytes: int | None
    """bytes per instance (null where the trace carries no sizes, e.g. gloo's ranges)"""
    count: int
    """matched instances"""
    transfer_ms: float
    """the instances' transfer times (the shortest of their ranks' durations after the last arrival), total"""
    wait_ms: float
    """every rank's waiting in them, total"""
    mean_transfer_ms: float
    """transfer time per instance"""
    algbw_gbps: float | None
    """bytes x count / transfer time, GB/s (null without sizes or transfer time)"""
    busbw_gbps: float | None
    """algbw x the collective's bus factor for its rank count, GB/s"""


@dataclass(kw_only=True)
class NoiseFloorRecord:
    """`noise_floor`: how late a rank must be to be named here, and how close the latest came
    (floor.py); null where no straggler analysis ran."""

    bound_ms: float
    """the straggler bound (threshold_ms): how much later than its peers, per step, a rank must
    arrive to be named"""
    clean_step_ms: float
    """the punctual ranks' own work per step, what the shares are of"""
    share: float | None
    """bound_ms / clean_step_ms: the smallest straggler this run can tell, as a share of the
    step (null without a clean step)"""
    set_by: str
    """the bound that sets it (a key of bounds_ms): relative (the material bound) or a noise bound"""
    noise_limited: bool
    """a noise bound, not the material one, sets it: a straggler between the two passes for noise here"""
    jitter_measured: bool
    """the run's step-to-step jitter was measured (false: too few steps, and the bound then
    holds none of the run's own noise)"""
    noise_model: str
    """the devices whose noise the rule allowed for (traces/analyse/noise.py): GPU devices or
    shared CPU cores"""
    latest_rank: int
    """the rank furthest beyond its peers, straggler or not"""
    latest_beyond_ms: float
    """its lateness beyond its peers per step (beyond_peers_ms)"""


@dataclass(kw_only=True)
class NextStepRecord:
    """`next_steps[]`: what to do, most important first: the list report.md, the view and the
    console show."""

    about: str
    """what it is about: "hang", "mismatch", "watch", "inconclusive", "straggler", "memory", a
    bottleneck class (advisor.py) or "noise\""""
    ranks: list[int]
    """the ranks it is about"""
    text: str
    """what to do, in words"""


@dataclass(kw_only=True)
class CollectivesRecord:
    """`collectives`: the collectives matched across ranks."""

    matched: int
    """matched collective instances"""
    by_name: dict[str, int]
    """matched instances per collective name"""


@dataclass(kw_only=True)
class ClockRecord:
    """`clock`: how the ranks were put on one clock (one offset per host)."""

    aligned: bool
    """the hosts' clocks were aligned (false: one host, or --no-align)"""
    reference_rank: int | None
    """the rank whose clock the others are put on (the lowest present)"""
    reference_host: str | None
    """its host"""
    hosts: list[ClockHostRecord]
    """each host's offset"""


@dataclass(kw_only=True)
class MergedRecord:
    """`merged`: what merged.pt.trace.json.gz holds (report/merged.py); null without one."""

    file: str
    """its file name, in the report folder"""
    steps: list[int] | None
    """the steps it holds (null: every event of every trace)"""
    note: str
    """why those steps"""
    estimated_bytes: int
    """the JSON size estimated before writing"""
    json_bytes: int
    """its JSON size, uncompressed"""
    gz_bytes: int
    """its file's size"""
    events: int
    """trace events written"""


@dataclass(kw_only=True)
class WatchStragglerRecord:
    """`watch_stragglers[]`: a rank the live watch flagged that the window did not name
    (watch_verdict.py)."""

    rank: int
    """the rank"""
    host: str | None
    """its host"""
    phase: str | None
    """the phase the watch saw it slow in, where it said one"""
    steps: list[int]
    """the steps at which it was flagged"""


@dataclass(kw_only=True)
class Report:
    """report.json: the whole document `build_report` makes (document.py) and the pipeline
    completes with the Flight Recorder's findings, the merged trace, the window and the live watch.
    Written as `as_document(report)`; read back as `load_report(doc)`."""

    schema_version: int
    """report.json's schema version"""
    inputs: list[str]
    """the paths as given"""
    input_dirs: list[str]
    """the absolute folders the traces were read from"""
    verdict: str
    """straggler, balanced, inconclusive (nothing could be analysed: one rank, no matched
    collective, ...), hang or mismatch (the Flight Recorder's findings lead)"""
    verdict_reason: str | None
    """why inconclusive, else null"""
    headline: str
    """the verdict in one sentence"""
    trace_verdict: str | None = None
    """the traced window's own verdict where the Flight Recorder or the live watch lead `verdict`, else null"""
    run: RunRecord
    """the job"""
    stragglers: list[StragglerRecord]
    """latest beyond its peers first; empty unless the window's verdict is straggler"""
    diagnosis: list[Diagnosis]
    """one per rank (advisor.py)"""
    diagnosis_summary: str
    """the diagnosis in a line, e.g. "launch-bound (ranks 0, 1)\""""
    ranks: list[RankRecord]
    """one per rank"""
    hosts: list[HostRecord]
    """one per machine"""
    steps: list[StepRecord]
    """one per rank and analysed step; their parts add up to step_ms"""
    gaps: list[Gap]
    """the longest stretches of exposed communication or idle device"""
    gaps_total: int
    """all such stretches, counted"""
    process_groups: list[ProcessGroupRecord]
    """one per process group"""
    collective_stats: list[CollectiveStatRecord]
    """per collective and message size (NCCL-tests conventions)"""
    collectives: CollectivesRecord
    """the collectives matched"""
    clock: ClockRecord
    """the clock alignment"""
    memory_findings: list[MemoryFinding] = field(default_factory=list)
    """the step logs' memory findings"""
    memory_steps: list[MemoryStep] = field(default_factory=list)
    """the memory heatmap's rows"""
    memory_timelines: list[MemoryTimeline] = field(default_factory=list)
    """torch memory timelines"""
    threshold_ms: float | None
    """the straggler bound applied to each rank's lateness beyond its peers (beyond_peers_ms)"""
    bounds_ms: dict[str, float]
    """the bounds threshold_ms is the largest of, by name"""
    noise_floor: NoiseFloorRecord | None
    """that bound as a share of the clean step, what sets it, the latest rank's figure; null where
    nothing was analysed"""
    warnings: list[str]
    """what was missing or doubtful"""
    next_steps: list[NextStepRecord]
    """what to do, most important first"""
    hang: Hang | None = None
    """the earliest hung collective the Flight Recorder's dumps show (flight.py)"""
    other_hangs: list[Hang] = field(default_factory=list)
    """further process groups hung the same way"""
    mismatches: list[Mismatch] = field(default_factory=list)
    """collectives the ranks issued differently"""
    flight: Dumps | None = None
    """the Flight Recorder's dumps read (null: none)"""
    merged: MergedRecord | None = None
    """what merged.pt.trace.json.gz holds"""
    window: WindowRecord | None = None
    """the profiler window analysed"""
    watch: WatchRecord | None = None
    """the live straggler watch's record"""
    watch_stragglers: list[WatchStragglerRecord] = field(default_factory=list)
    """the ranks the watch flagged that the window did not name; where the window's verdict was
    balanced or inconclusive and this is not empty, `verdict` is straggler"""


def as_document(report: Report) -> dict[str, Any]:
    """report.json's document: every record as a dict, fields in order."""
    doc: dict[str, Any] = msgspec.to_builtins(report)
    return doc


def load_report(doc: Any) -> Report:
    """A report.json document as records; ValueError, saying where, when it does not fit them (a
    report of another version, a hand-edited file)."""
    try:
        return msgspec.convert(doc, Report)
    except msgspec.ValidationError as exc:
        raise ValueError(f"report.json does not fit this version's schema ({exc}); collect the run again") from None


RECORDS: tuple[type, ...] = (
    Report,
    RunRecord,
    SkippedWindowRecord,
    StragglerRecord,
    GpuRecord,
    Diagnosis,
    Evidence,
    RankRecord,
    HostRecord,
    StepRecord,
    Gap,
    ProcessGroupRecord,
    CollectiveStatRecord,
    CollectivesRecord,
    ClockRecord,
    ClockHostRecord,
    MemoryFinding,
    MemoryStep,
    MemoryTimeline,
    NoiseFloorRecord,
    NextStepRecord,
    *flight_records.RECORDS,
    MergedRecord,
    WindowRecord,
    CaptureRecord,
    WatchRecord,
    WatchFlagRecord,
    WatchStragglerRecord,
)


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal right after it in the class body)."""
    body = ast.parse(inspect.getsource(cls)).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    items = body.body
    for node, after in zip(items, items[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def field_types(cls: type) -> list[tuple[str, str]]:
    """A record's fields and their types as written, in order: a dataclass's fields, a
    TypedDict's keys."""
    if dataclasses.is_dataclass(cls):
        return [(f.name, str(f.type)) for f in dataclasses.fields(cls)]
    # a TypedDict keeps a postponed annotation as a ForwardRef: its text is what was written
    return [(name, getattr(kind, "__forward_arg__", str(kind))) for name, kind in cls.__annotations__.items()]


def schema_markdown() -> str:
    """docs/report-schema.md: a table per record, in field order."""
    lines = [
        "# report.json",
        "",
        "Generated from the records report.json is made of (`python -m harness.report.records`):",
        "`Report` is the document, each other record one of its parts. Durations are ms unless a",
        'name says `_us`; "per step" figures are means over the analysed steps, "total" ones sums.',
        "",
    ]
    for cls in RECORDS:
        lines += [
            f"## {cls.__name__}",
            "",
            " ".join((cls.__doc__ or "").split()),
            "",
            "| field | type | meaning |",
            "|---|---|---|",
        ]
        docs = field_docs(cls)
        for name, kind in field_types(cls):
            cell = kind.replace("|", "\\|")  # a pipe would end the table cell
            lines.append(f"| `{name}` | `{cell}` | {docs.get(name, '')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(schema_markdown())
