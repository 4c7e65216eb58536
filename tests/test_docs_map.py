"""The README stays a five-minute read and a map of docs/: every docs page is linked from it, and
every relative link in the README and in docs/ points at a file that exists (and, inside the
README, at a heading that exists). Reads files only: no database, no server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
README = BASE_DIR / "README.md"
DOCS = BASE_DIR / "docs"
README_MAX_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def links(path: Path) -> list[str]:
    """The targets of the Markdown links in `path`, outside fenced code blocks."""
    return LINK.findall(FENCE.sub("", path.read_text()))


def relative(targets: list[str]) -> list[str]:
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto:


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of the headings of `path`: lowercase, punctuation dropped, spaces to '-'."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", path.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into a docs/ page"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target.split("#", 1)[0]).resolve() for target in relative(links(README))}
    missing = sorted(page.name for page in DOCS.glob("*.md") if page.resolve() not in linked)
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_the_docs_map_lists_every_page() -> None:
    index = DOCS / "README.md"
    linked = {(DOCS / target.split("#", 1)[0]).resolve() for target in relative(links(index))}
    missing = sorted(page.name for page in DOCS.glob("*.md") if page != index and page.resolve() not in linked)
    assert not missing, f"docs pages missing from docs/README.md: {missing}"


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda page: page.name)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in relative(links(page)):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        wrong_anchor = anchor and page == README and file.suffix == ".md" and anchor not in anchors(file)
        if not file.exists() or wrong_anchor:
            broken.append(target)
    assert not broken, f"{page.relative_to(BASE_DIR)}: links to nothing: {broken}"
