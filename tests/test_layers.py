"""The layers import downwards only: traces (reading and analysis) never imports report (the
files made from it), collect (the command) or the view; report never imports collect or the view;
collect never imports the view; compare (run against run) reads files only, and runs without
torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from jobs import REPO

HARNESS = REPO / "harness"
FORBIDDEN = {
    "traces": ("harness.report", "harness.collect", "harness.view", "harness.train", "harness.lab"),
    "report": ("harness.collect", "harness.view", "harness.train", "harness.lab"),
    "collect": ("harness.view", "harness.train", "harness.lab"),
    "compare": ("harness.view", "harness.train", "harness.lab", "torch"),
}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layers_import_downwards_only(layer: str) -> None:
    bad = []
    for path in sorted((HARNESS / layer).rglob("*.py")):
        for name in imported(path):
            if name.startswith(FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert not bad, bad


def test_the_check_sees_an_import() -> None:
    assert "harness.report.document" in imported(HARNESS / "collect" / "pipeline.py")
