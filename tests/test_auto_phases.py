"""Phases found by themselves (harness/run/auto_phases.py): the order of the boundaries, exact;
and one process's `harness.Run(model=, optimizer=)` with gradient accumulation, hand-marked
phases beside the automatic ones, activation checkpointing and torch.compile. The runs under
torchrun with a rank slow in each phase are in test_api.py."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import harness
from harness.paths import list_traces, steps_path
from harness.run.auto_phases import DATA, FORWARD, OPTIMIZER, Sequencer


def test_what_follows_a_backward_is_named_after_the_step_before() -> None:
    """Two micro-batches a step: in the first step nothing is known, so both backwards' gaps read
    optimizer; from the second on, the first gap is data (a forward came next) and the second
    optimizer (the optimizer's step came next)."""
    order = Sequencer()
    gaps = []
    for _ in range(3):
        assert order.step_starts() == DATA
        step = []
        for _ in range(2):
            assert order.forward_starts() == FORWARD
            step.append(order.backward_returns())
        assert order.optimizer_starts() == OPTIMIZER
        gaps.append(step)
    assert gaps == [[OPTIMIZER, OPTIMIZER], [DATA, OPTIMIZER], [DATA, OPTIMIZER]]


def loop(
    tmp_path: Path,
    name: str,
    *,
    accumulate: int = 1,
    by_hand: bool = False,
    wrap=lambda m: m,
    checkpointed: bool = False,
    slept: list[dict[str, float]] | None = None,
) -> list[dict]:
    """Eight steps of a small model on one process, each pass: 4 ms of data, a forward, 2 ms of
    loss, a backward; then 1 ms of clipping and the optimizer's step. Returns the step records;
    `slept` gets each step's sleeps as they lasted, ms per phase (a sleep outlasts its time by as
    long as the process waits for a core when it wakes)."""

    def sleep(seconds: float, phase: str, step: dict[str, float]) -> None:
        start = time.perf_counter()
        time.sleep(seconds)
        step[phase] = step.get(phase, 0.0) + (time.perf_counter() - start) * 1e3

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    called = wrap(model)
    run_options = {"steps": 8, "warmup_steps": 2, "wait": 1, "warmup": 1, "active": 3}
    with harness.Run(
        run_name=name, log_dir=str(tmp_path), model=called, optimizer=opt, watch_every=0, **run_options
    ) as run:
        for _ in range(8):
            lasted: dict[str, float] = {}
            with run.step():
                for _ in range(accumulate):
                    if by_hand:
                        with run.phase("fetch"):
                            sleep(0.004, "fetch", lasted)
                    else:
                        sleep(0.004, "data", lasted)
                    x, y = torch.randn(8, 32), torch.randn(8, 4)
                    out = checkpoint(called, x, use_reentrant=False) if checkpointed else called(x)
                    sleep(0.002, "loss", lasted)
                    loss = ((out - y) ** 2).mean()
                    loss.backward()
                sleep(0.001, "optimizer", lasted)
                opt.step()
                opt.zero_grad()
            if slept is not None:
                slept.append(lasted)
    return [json.loads(line) for line in steps_path(tmp_path / name, 0).read_text().splitlines()]


def ranges_per_step(run_dir: Path) -> Counter:
    """How many harness phase ranges of each name the trace holds, per recorded step."""
    doc = json.loads(gzip.decompress(list_traces(run_dir)[0].read_bytes()))
    names = Counter(e["name"] for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("harness:"))
    steps = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    return Counter({k: v / steps for k, v in names.items()})


def test_each_pass_of_a_step_adds_to_its_phase(tmp_path: Path) -> None:
    slept: list[dict[str, float]] = []
    records = loop(tmp_path, "accumulate", accumulate=3, slept=slept)
    for r in records[2:]:
        ms, lasted = r["phases_ms"], slept[r["step"]]
        assert set(ms) == {"data", "forward", "loss", "backward", "optimizer"}, ms
        # three 4 ms loads: the 2nd and 3rd between a backward and a forward; three 2 ms losses;
        # the clipping, then the step: one phase. Each holds all its sleeps as they lasted; a pass
        # given to another phase would leave its own short of them, and one counted twice would
        # break the sum. No bound from above: the phases' own work takes what the machine's load
        # makes it take
        for phase in ("data", "loss", "optimizer"):
            assert ms[phase] >= lasted[phase], (phase, ms, lasted)
        assert sum(ms.values()) == pytest.approx(r["step_ms"], rel=0.05)
    assert ranges_per_step(tmp_path / "accumulate") == {
        "harness:data": 3,
        "harness:forward": 3,
        "harness:loss": 3,
        "harness:backward": 3,
        "harness:optimizer": 1,
    }


def test_a_phase_marked_by_hand_wins_inside_its_range(tmp_path: Path) -> None:
    records = loop(tmp_path, "by-hand", by_hand=True)
    for r in records[2:]:
        ms = r["phases_ms"]
        assert ms["fetch"] >= 4.0 and ms["data"] < 1.0, ms  # the loop's own name for its data phase
        assert {"forward", "loss", "backward", "optimizer"} <= set(ms)


def test_a_forward_recomputed_in_backward_is_no_boundary(tmp_path: Path) -> None:
    loop(tmp_path, "checkpointed", checkpointed=True)
    assert ranges_per_step(tmp_path / "checkpointed")["harness:forward"] == 1


def test_a_compiled_model_is_timed_the_same(tmp_path: Path) -> None:
    records = loop(tmp_path, "compiled", wrap=torch.compile)
    assert set(records[-1]["phases_ms"]) == {"data", "forward", "loss", "backward", "optimizer"}
    assert records[-1]["phases_ms"]["loss"] >= 2.0


def test_the_hooks_and_backward_are_given_back_when_the_run_ends(tmp_path: Path) -> None:
    before = torch.autograd.backward
    loop(tmp_path, "restored")
    assert torch.autograd.backward is before
