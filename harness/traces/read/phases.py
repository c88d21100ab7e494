"""A step's phases: the ranges a training loop marks its work with, whoever wrote them.

A phase is a top-level range on the main thread inside a ProfilerStep (a `user_annotation`:
`record_function`, or NVTX through the profiler), not inside another range of that step; a range
that starts in the step and holds all of it (`record_function("train_epoch")` around the loop) is
not one. Its
name is the user's own (`record_function("forward")` is the phase "forward"); the harness's
`harness:<phase>` ranges lose their prefix; the ranges libraries open in a plain loop are named
for the phase they stand for (`LIBRARY_PHASES`: DataLoader's `enumerate(DataLoader)#...`,
DDP's forward, the optimizer's step, Lightning's hooks). The rules that need a phase's role
(the input pipeline for data-bound; what is not the model's own work) read it from the name:
`is_data`, `is_model`.
"""

from __future__ import annotations

import re

from harness.paths import RANGE_PREFIX

# Ranges opened by torch and training frameworks, and the phase each stands for. Sources:
# torch/utils/data/dataloader.py (`enumerate(DataLoader)#<iterator class>.__next__`),
# torch/optim/optimizer.py (`Optimizer.step#<class>.step`, `Optimizer.zero_grad#<class>.zero_grad`),
# torch/nn/parallel/distributed.py, torch/distributed/fsdp (`<wrapper>.forward`), and Lightning's
# PyTorchProfiler (`[pl][profile]<action>`, lightning/pytorch/profilers/pytorch.py).
LIBRARY_PHASES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), name)
    for p, name in (
        (r"^enumerate\(DataLoader\)#", "data"),
        (r"^(?:DistributedDataParallel|FullyShardedDataParallel|CustomFSDP)\.forward$", "forward"),
        (r"^Optimizer\.(?:step|zero_grad)#", "optimizer"),
        (r"^\[pl\]\[profile\]\[_TrainingEpochLoop\]\.train_dataloader_next$", "data"),
        (r"^\[pl\]\[profile\]\[Strategy\]\w+\.batch_to_device$", "h2d"),
        (r"^\[pl\]\[profile\]\[Strategy\]\w+\.training_step$", "forward"),
        (r"^\[pl\]\[profile\]\[Strategy\]\w+\.backward$", "backward"),
        (r"^\[pl\]\[profile\]\[LightningModule\]\w+\.optimizer_(?:step|zero_grad)$", "optimizer"),
    )
)
# Names users give the input pipeline and the optimizer (case and separators aside).
DATA_NAMES = re.compile(
    r"^(?:data|dataloader|data ?load(?:ing|er)?|load ?(?:data|batch|inputs?)|"
    r"(?:get|next|fetch) ?(?:batch|data)|inputs?|batch)$"
)
OPTIMIZER_NAMES = re.compile(r"^(?:optimi[sz]er|optim|opt|optimi[sz]er ?step|opt ?step|update|zero ?grad)$")


def phase_name(range_name: str) -> str:
    """The phase a top-level range stands for: the library's phase (`LIBRARY_PHASES`), the
    harness's phase without its prefix, else the range's own name."""
    if range_name.startswith(RANGE_PREFIX):
        return range_name[len(RANGE_PREFIX) :]
    for pattern, name in LIBRARY_PHASES:
        if pattern.match(range_name):
            return name
    return range_name


# Inductor's range around each compiled graph's call (torch/_inductor/output_code.py: `## Call
# CompiledFxGraph <hash> ##`): the hash differs from rank to rank, so a phase keeps the graph's
# place in its step instead (`step_phases`).
COMPILED_GRAPH = re.compile(r"^## Call CompiledFxGraph \S+ ##$")


def step_phases(ranges: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """A step's phases from its ranges (start_us, end_us, name): the top-level ones (`top_level`)
    named by `phase_name`; a compiled graph's range (`COMPILED_GRAPH`) by its place among the
    step's compiled graphs, `compiled graph 2`, which its peers share."""
    out: list[tuple[float, float, str]] = []
    compiled = 0
    for a, b, name in top_level(ranges):
        if COMPILED_GRAPH.match(name):
            compiled += 1
            out.append((a, b, f"compiled graph {compiled}"))
        else:
            out.append((a, b, phase_name(name)))
    return out


def _plain(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", name.strip().lower())


def is_data(phase: str) -> bool:
    """Whether a phase is the input pipeline (what data-bound measures)."""
    return DATA_NAMES.match(_plain(phase)) is not None


def is_model(phase: str) -> bool:
    """Whether a phase is the model's own work (not the input pipeline, not the optimizer): where
    its host ops and compute by kernel are counted."""
    plain = _plain(phase)
    return DATA_NAMES.match(plain) is None and OPTIMIZER_NAMES.match(plain) is None


def top_level(marks: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The marks (start_us, end_us, name) that no other mark of the list contains, in start order;
    of two with the same span, the first. A mark contains another when it starts no later and ends
    no earlier."""
    out: list[tuple[float, float, str]] = []
    reach = -float("inf")
    for a, b, name in sorted(marks, key=lambda m: (m[0], -m[1])):
        if b <= reach:
            continue
        out.append((a, b, name))
        reach = b
    return out
