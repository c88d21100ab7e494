"""The layers import downwards only: traces (reading and analysis) never imports report (the
files made from it), collect (the command) or the view; report never imports collect or the view;
collect never imports the view; the run library (harness/run/, behind harness.Run) and the live
watch (harness/watch/, which the Run class starts) never import the lab (harness/train/) or the
collector's command and files; compare (run against run) reads files only, and runs without
torch. Imports under `if TYPE_CHECKING:` are annotations only and not counted."""

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
    "run": ("harness.train", "harness.lab", "harness.collect", "harness.report", "harness.view"),
    "watch": ("harness.run.run", "harness.train", "harness.lab", "harness.collect", "harness.report", "harness.view"),
}


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    guarded = [top for top in ast.walk(tree) if isinstance(top, ast.If) and _type_checking(top)]
    skipped = {id(n) for top in guarded for b in top.body for n in ast.walk(b)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
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


def test_an_annotation_only_import_is_not_counted() -> None:
    assert "harness.train.config" not in imported(HARNESS / "run" / "run_config.py")
    assert "harness.run.settings" in imported(HARNESS / "run" / "run_config.py")
