"""Every relative link in README.md and docs/*.md leads somewhere: to a file that exists
and, where it names an anchor, to a heading of that page as GitHub makes its anchors.

A renamed heading or a moved file leaves a link that opens the top of a page, or nothing,
and no reader reports it; this holds them to the tree instead, and so every repository path
the pages write as code (`app/cli.py`), link or not.
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


TOP_LEVEL = ("offload/", "app/", "tests/", "bench/", "docs/", "docker/", "dashboards/", ".ci/")
CURRENT = [page for page in PAGES if page.name != "POLICY_RESEARCH.md"]
"""The pages that describe the tree as it is: the research log is dated, its paths as they were."""


def written_paths(page: Path) -> list[str]:
    """The repository paths a page writes as code (`app/cli.py`, `docker/k8s/`): each word of
    a code span that starts at a top-level folder, wildcards and placeholders left out."""
    return [
        word.rstrip(".,;:)")
        for span in re.findall(r"`([^`\n]+)`", page.read_text())
        for word in span.split()
        if word.startswith(TOP_LEVEL) and not re.search(r"[*<>{}]", word)
    ]


@pytest.mark.parametrize("page", CURRENT, ids=lambda page: page.name)
def test_every_path_written_as_code_exists(page: Path) -> None:
    """A path a page names (a module, a test, a config file) is there, unless .gitignore
    lists it: made by a command (`make vendor`), not kept in the tree."""
    made = {line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()}
    missing = [
        path for path in written_paths(page) if not (ROOT / path).exists() and path not in made
    ]
    assert not missing, f"{page.name} names paths that are not there: {missing}"


def test_the_pages_write_paths_at_all() -> None:
    assert sum(len(written_paths(page)) for page in CURRENT) >= 100
