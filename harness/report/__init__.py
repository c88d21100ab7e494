"""The report: the analysis turned into report.json (document.py; records.py, the schema), its tables
(tables.py), report.md (markdown.py), the console table (console.py), the distributed view page
(page.py, static/) and the files of the report folder (files.py). Reads `harness.collect`'s
Analysis; the TensorBoard plugin (`harness.view`) reads what this writes.
"""
