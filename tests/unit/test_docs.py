"""The README reads in five minutes: at most 8 KB, no section longer than a screen, and every link
from it or from docs/ leads to a file that exists (details moved out of the README stay reachable)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SCREEN_LINES = 50
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_each_section_fits_a_screen():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 8 * 1024
    sections = re.split(r"\n(?=## )", text)
    assert max(len(section.splitlines()) for section in sections) <= SCREEN_LINES


def test_every_relative_link_of_the_readme_and_docs_exists():
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in [README, *sorted((ROOT / "docs").glob("*.md"))]
        for target in LINK.findall(page.read_text(encoding="utf-8"))
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert broken == []


def test_every_doc_is_reachable_from_the_readme():
    linked = {
        (README.parent / target).resolve()
        for target in LINK.findall(README.read_text(encoding="utf-8"))
    }
    docs = {page.resolve() for page in (ROOT / "docs").glob("*.md")}
    assert sorted(p.name for p in docs - linked) == []
