"""report.json's rows are the typed records of harness/report/records.py, field for field and in
order, and docs/report-schema.md is what the records generate."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, (cls.__name__, missing)


def test_report_rows_have_the_records_fields_in_order(tmp_path: Path) -> None:
    # 3 ranks, rank 1 arrives 500 us late at every step's all-reduce: a straggler
    docs = ring_docs(lambda r, s: 500.0 if r == 1 else 100.0, 3, 4, period_us=2000.0)
    doc = build_report(run_analysis(tmp_path, docs), ["x"])
    names = {cls: [f.name for f in dataclasses.fields(cls)] for cls in records.RECORDS}
    assert list(doc["run"]) == names[records.RunRecord]
    assert doc["stragglers"] and all(list(s) == names[records.StragglerRecord] for s in doc["stragglers"])
    assert doc["ranks"] and all(list(r) == names[records.RankRecord] for r in doc["ranks"])
    assert doc["hosts"] and all(list(h) == names[records.HostRecord] for h in doc["hosts"])
    assert doc["steps"] and all(list(s) == names[records.StepRecord] for s in doc["steps"])
    assert all(list(c) == names[records.ClockHostRecord] for c in doc["clock"]["hosts"])
    assert doc["process_groups"] and all(list(g) == names[records.ProcessGroupRecord] for g in doc["process_groups"])
    assert doc["collective_stats"] and all(
        list(c) == names[records.CollectiveStatRecord] for c in doc["collective_stats"]
    )
