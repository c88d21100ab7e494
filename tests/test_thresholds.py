"""Every decision threshold has its source (harness/sourced.py): docs/thresholds.md is what the
fields generate, every field of a registered holder is declared with `threshold()`, no module of
the analysis holds a module-level number outside the page's lists, and no kind admits a value
without a source."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from harness import sourced

from jobs import REPO


def test_the_page_is_what_the_fields_generate() -> None:
    page = (REPO / "docs" / "thresholds.md").read_text()
    assert page == sourced.thresholds_markdown(), "run: python -m harness.sourced > docs/thresholds.md"


def test_every_field_of_a_holder_is_a_threshold_with_its_source() -> None:
    for _, owner, obj in sourced.registry():
        for f in dataclasses.fields(obj):
            if f.name == "name":  # a noise model's name is how the report says it
                continue
            assert f.metadata.get("kind") in sourced.KINDS, f"{owner}.{f.name} has no threshold() kind"
            assert f.metadata["source"].strip(), f"{owner}.{f.name} has no source"


def _module_numbers() -> set[str]:
    """module.NAME of every upper-case module-level name bound to a number in the analysis."""

    def numeric(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.BinOp):
            return numeric(node.left) and numeric(node.right)
        return isinstance(node, ast.UnaryOp) and numeric(node.operand)

    found = set()
    for stem, module in sourced.analysis_modules().items():
        path = REPO / (module.replace(".", "/") + ".py")
        for node in ast.parse(path.read_text()).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and target.id.isupper() and value is not None and numeric(value):
                found.add(f"{stem}.{target.id}")
    return found


def test_no_module_number_of_the_analysis_is_outside_the_page() -> None:
    found = _module_numbers()
    assert found - set(sourced.NOT_THRESHOLDS) - set(sourced.UNDECLARED) == set(), (
        "a new threshold is a threshold() field with its source (harness/sourced.py)"
    )
    # the lists hold nothing that is gone: moving a constant into a field takes it off them
    assert set(sourced.UNDECLARED) | set(sourced.NOT_THRESHOLDS) <= found


def test_no_threshold_is_without_a_source() -> None:
    assert "unsourced" not in sourced.KINDS
    with pytest.raises(ValueError, match="not one of"):
        sourced.threshold(1.0, kind="unsourced", source="set on our own runs")


def test_a_threshold_needs_a_known_kind_and_a_source() -> None:
    with pytest.raises(ValueError, match="kind 'tuned'"):
        sourced.threshold(1.0, kind="tuned", source="x")
    with pytest.raises(ValueError, match="needs its source"):
        sourced.threshold(1.0, kind="statistic", source=" ")
