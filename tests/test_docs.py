"""The docs stay true to the tree: the README is short (at most 150 lines: what it is, the set-up,
the commands, the outputs, an index), and every relative link in it and in docs/ leads to a file."""

from __future__ import annotations

import re

from jobs import REPO

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_at_most_150_lines() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_every_relative_link_leads_to_a_file() -> None:
    pages = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert broken == []
