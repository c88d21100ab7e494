"""report.json is the typed `Report` of harness/report/records.py, field for field and in order,
it reads back into the same records, and docs/report-schema.md is what the records generate."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.report import records
from harness.report.document import build_report

from jobs import REPO
from tracebuild import ring_docs, run_analysis


def test_the_schema_page_is_current() -> None:
    page = (REPO / "docs" / "report-schema.md").read_text()
    assert page == records.schema_markdown(), "run: python -m harness.report.records > docs/report-schema.md"


def test_every_field_has_its_docstring() -> None:
    for cls in records.RECORDS:
        docs = records.field_docs(cls)
        missing = [name for name, _ in records.field_types(cls) if not docs.get(name)]
        assert not missing, (cls.__name__, missing)


def test_every_record_a_report_holds_is_on_the_schema_page() -> None:
    """Each dataclass a Report field holds, at any depth, is one of RECORDS (so on the page)."""
    seen: set[type] = set()

    def walk(cls: type) -> None:
        if cls in seen or not dataclasses.is_dataclass(cls):
            return
        seen.add(cls)
        for f in dataclasses.fields(cls):
            for name in vars(records).values():
                if isinstance(name, type) and dataclasses.is_dataclass(name) and name.__name__ in str(f.type):
                    walk(name)

    walk(records.Report)
    assert seen <= set(records.RECORDS), seen - set(records.RECORDS)


def test_the_document_is_the_records_in_order_and_reads_back(tmp_path: Path) -> None:
    # 3 ranks, rank 1 arrives 500 us late at every step's all-reduce: a straggler
    docs = ring_docs(lambda r, s: 500.0 if r == 1 else 100.0, 3, 4, period_us=2000.0)
    report = build_report(run_analysis(tmp_path, docs), ["x"])
    doc = json.loads(json.dumps(records.as_document(report)))
    names = {cls: [name for name, _ in records.field_types(cls)] for cls in records.RECORDS}
    assert list(doc) == names[records.Report]
    assert list(doc["run"]) == names[records.RunRecord]
    assert doc["stragglers"] and all(list(s) == names[records.StragglerRecord] for s in doc["stragglers"])
    assert doc["ranks"] and all(list(r) == names[records.RankRecord] for r in doc["ranks"])
    assert doc["steps"] and all(list(s) == names[records.StepRecord] for s in doc["steps"])
    assert doc["process_groups"] and all(list(g) == names[records.ProcessGroupRecord] for g in doc["process_groups"])
    assert list(doc["clock"]) == names[records.ClockRecord]
    assert doc["next_steps"] and all(list(n) == names[records.NextStepRecord] for n in doc["next_steps"])
    assert records.load_report(doc) == report


def test_a_document_that_does_not_fit_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"report.json does not fit this version's schema .*collect the run again"):
        records.load_report({"schema_version": 1, "verdict": "balanced"})
