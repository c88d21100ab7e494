"""The fixtures every test can ask for; the helpers the tests import are in jobs.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from jobs import LAB, LAB_SIZE, Run, run_harness


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "profiler_logs"


@pytest.fixture(scope="session")
def lab_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Run]:
    """One 2-rank DDP run of each lab mode at its default size (jobs.LAB), started the first time a
    test asks for it and shared by every test after: the machinery checks (test_train_runs.py)
    and the diagnosis of each mode's bottleneck (test_advisor.py) read the same runs."""
    root = tmp_path_factory.mktemp("lab")
    runs: dict[str, Run] = {}

    def get(mode: str) -> Run:
        if mode not in runs:
            runs[mode] = run_harness(["--mode", mode, *LAB, *LAB_SIZE.get(mode, [])], root, run_name=mode)
        return runs[mode]

    return get


# The longest groups beside the timing jobs (~60-90 s each: harness.Run's example jobs, ASan-built
# native tests, the lab's own runs outside the shared ones)
LONGEST_FIRST = ("test_api.py", "test_sanitize.py", "test_train_runs.py")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n 2 --dist loadgroup`, as make test runs it) a file's tests run on one
    worker, so its module fixtures (a real job each) run once. The torchrun jobs whose tests read
    a CPU run's timing (`timing`) are one group, and make test runs them apart, one at a time,
    after the rest (Makefile): beside other work their verdicts move (bench/RESULTS.md, "The test
    suite"). The tests of the session's lab runs (`lab_run`) are `timing` too: the lab workloads'
    verdicts read timing, and a session fixture runs once per pytest process."""
    first: list[pytest.Item] = []
    for item in items:
        name = item.path.name
        if "lab_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timing)  # with the lab's verdicts, for their shared runs
        timing = item.get_closest_marker("slow") and item.get_closest_marker("timing")
        item.add_marker(pytest.mark.xdist_group("timing" if timing else name))
        if timing or name in LONGEST_FIRST:
            first.append(item)
    # the scheduler hands out groups in the order they are collected: the longest start first
    # and the rest fill in around them (make test runs the timing group apart, after the rest, so
    # there the sanitizer starts first)
    chosen = {id(item) for item in first}
    items[:] = first + [item for item in items if id(item) not in chosen]
