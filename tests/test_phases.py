"""A step's phases are the loop's top-level ranges, whoever named them (phases.py)."""

from __future__ import annotations

from pathlib import Path

from harness.traces.read.parse import parse_trace
from harness.traces.read.phases import is_data, is_model, phase_name, top_level

from tracebuild import document, step, write, x


def test_phase_names_and_roles() -> None:
    assert phase_name("harness:backward") == "backward"
    assert phase_name("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__") == "data"
    assert phase_name("DistributedDataParallel.forward") == "forward"
    assert phase_name("Optimizer.step#AdamW.step") == phase_name("Optimizer.zero_grad#SGD.zero_grad") == "optimizer"
    assert phase_name("[pl][profile][Strategy]DDPStrategy.backward") == "backward"
    assert phase_name("[pl][profile][_TrainingEpochLoop].train_dataloader_next") == "data"
    assert phase_name("my attention block") == "my attention block"
    assert [is_data(p) for p in ("data", "Data Loading", "next_batch", "dataloader", "forward", "database")] == [
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    assert [is_model(p) for p in ("forward", "loss", "optimizer_step", "zero_grad", "data", "h2d")] == [
        True,
        True,
        False,
        False,
        False,
        True,
    ]


def test_top_level_ranges() -> None:
    marks = [(0.0, 10.0, "a"), (1.0, 5.0, "a.1"), (10.0, 20.0, "b"), (10.0, 20.0, "b twin"), (12.0, 25.0, "c")]
    assert top_level(marks) == [(0.0, 10.0, "a"), (10.0, 20.0, "b"), (12.0, 25.0, "c")]


def test_a_plain_loops_ranges_are_its_phases(tmp_path: Path) -> None:
    # a tutorial loop: DataLoader's own range, record_function("forward") around DDP's forward
    # (nested: not a phase of its own), "loss", "backward", and the optimizer's own range
    ev = [
        step(1, 0, 1000),
        x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "user_annotation", 0, 100),
        x("forward", "user_annotation", 100, 300),
        x("DistributedDataParallel.forward", "user_annotation", 110, 280),
        x("loss", "user_annotation", 400, 50),
        x("backward", "user_annotation", 450, 400),
        x("Optimizer.step#SGD.step", "user_annotation", 850, 100),
        x("aten::mm", "cpu_op", 120, 200),
    ]
    t = parse_trace(write(tmp_path / "rank0.pt.trace.json", document(ev, 0, base_ns=None)))
    [s] = t.steps
    assert s.phases_us == {"data": 100.0, "forward": 300.0, "loss": 50.0, "backward": 400.0, "optimizer": 100.0}
    assert [p for p, _, _ in s.phase_spans] == ["data", "forward", "loss", "backward", "optimizer"]


def test_a_range_around_the_loop_is_no_phase(tmp_path: Path) -> None:
    # record_function("train_epoch") around the whole loop holds both steps: the phases are
    # still each step's own top-level ranges
    ev = [x("train_epoch", "user_annotation", 0, 2000), step(1, 0, 1000), step(2, 1000, 1000)]
    for t in (0, 1000):
        ev += [
            x("data", "user_annotation", t, 100),
            x("forward", "user_annotation", t + 100, 400),
            x("aten::mm", "cpu_op", t + 120, 300),
        ]
    trace = parse_trace(write(tmp_path / "rank0.pt.trace.json", document(ev, 0, base_ns=None)))
    assert [s.phases_us for s in trace.steps] == [{"data": 100.0, "forward": 400.0}] * 2
