"""Every relative link in README.md and docs/*.md leads somewhere: to a file that exists
and, where it names an anchor, to a heading of that page as GitHub makes its anchors.

A renamed heading or a moved file leaves a link that opens the top of a page, or nothing,
and no reader reports it; this holds them to the tree instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as ``-``, and ``-1``, ``-2``... on repeats; fenced code holds none."""
    repeats: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (heading := re.match(r"#{1,6} (.+)", line)):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            count = repeats.get(slug, 0)
            repeats[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    return [link for link in LINK.findall(page.read_text()) if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} names no file"
        if anchor:
            assert target.suffix == ".md", f"{page.name}: {link} anchors into a non-page"
            assert anchor in anchors(target), f"{page.name}: {link} names no heading"


def test_the_pages_link_at_all() -> None:
    """A pattern that stopped matching would pass every page above with nothing checked."""
    assert sum(len(relative_links(page)) for page in PAGES) >= 20
