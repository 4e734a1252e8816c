"""Every relative link and image of README.md, CHANGELOG.md and docs/*.md points at a file
that exists, and a link's `#anchor` at a heading of its page (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from tests.docs.blocks import ROOT, pages

PAGES = [*pages(), ROOT / "CHANGELOG.md"]
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto: …


def tokens(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))


def slug(text: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    stream = tokens(path)
    for i, token in enumerate(stream):
        if token.type != "heading_open":
            continue
        inline = stream[i + 1]
        text = "".join(
            c.content for c in inline.children or [] if c.type in ("text", "code_inline")
        )
        base = slug(text)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    found = []
    for token in tokens(path):
        for child in token.children or []:
            if child.type == "link_open":
                found.append(str(child.attrs.get("href", "")))
            elif child.type == "image":
                found.append(str(child.attrs.get("src", "")))
    return found


def broken(path: Path) -> list[str]:
    """What is wrong with the page's relative links, one line each."""
    wrong = []
    for href in links(path):
        if not href or EXTERNAL.match(href):
            continue
        target, _, anchor = href.partition("#")
        where = (path.parent / target).resolve() if target else path
        if not where.exists():
            wrong.append(f"{href}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            wrong.append(f"{href}: no heading #{anchor} in {target or path.name}")
    return wrong


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page):
    assert broken(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading: here\n")
    page.write_text(
        "[ok](other.md#a-code-heading-here) [gone](missing.md) [bad](other.md#nowhere) "
        "[self](#page) [web](https://example.org/x)\n\n# Page\n"
    )
    assert broken(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading #nowhere in other.md",
    ]
