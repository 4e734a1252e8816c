"""The code blocks of the documentation (README.md and docs/*.md), read with a CommonMark
parser, each with what it is for: a shell command or Python to run, a file to write, or
text that is not run (a marker says why).

What a page may say just before a fenced block, as an HTML comment a reader sees in the
source and the rendered page hides:

    <!-- not run: the reason -->     the block is a command or snippet not run by the tests
    <!-- file: agent.py -->          the block's text is a file the next blocks use

A fenced block names its language (```sh, ```python, ```text, ```ini …); an indented code
block, or a fence without a language, is an error (tests/docs/test_blocks.py says where):
nothing may slip past the test unclassified.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]

SHELL = {"sh", "shell", "bash"}
PYTHON = {"python", "py"}
MARKER = re.compile(r"^<!--\s*(?P<kind>not run|file):\s*(?P<value>.*?)\s*-->$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it is, its language and text, and its marker."""

    page: str  # relative to the repository, e.g. docs/agent.md
    line: int  # 1-based line of its opening fence
    language: str
    text: str
    not_run: str | None = None  # the reason given by `<!-- not run: … -->`
    file: str | None = None  # the name given by `<!-- file: … -->`

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runnable(self) -> bool:
        """A shell command or a Python snippet the tests run (not marked, not a file)."""
        return self.language in SHELL | PYTHON and self.not_run is None and self.file is None


class PageError(Exception):
    """A page breaks the rules above: the message says where and how to fix it."""


def pages() -> list[Path]:
    """README.md, then docs/*.md in name order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(text: str, page: str) -> list[Block]:
    """The fenced blocks of one page's markdown, in order; PageError on a block that does
    not say what it is, or on a marker that is not followed by a block."""
    tokens = MarkdownIt("commonmark").parse(text)
    found: list[Block] = []
    marker: tuple[str, str, int] | None = None
    for token in tokens:
        line = token.map[0] + 1 if token.map else 0
        if token.type == "html_block":
            match = MARKER.match(token.content.strip())
            if match:
                if marker is not None:
                    raise PageError(f"{page}:{marker[2]}: a marker with no code block after it")
                value = match["value"]
                if not value:
                    raise PageError(f"{page}:{line}: `{match['kind']}:` needs a reason or name")
                marker = (match["kind"], value, line)
            continue
        if token.type == "code_block":
            raise PageError(
                f"{page}:{line}: an indented code block; fence it and name its language "
                "(```sh, ```python, ```text …) so the tests know whether to run it"
            )
        if token.type != "fence":
            if marker is not None:
                raise PageError(f"{page}:{marker[2]}: a marker must come just before its block")
            continue
        language = token.info.strip().split()[0] if token.info.strip() else ""
        if not language:
            raise PageError(
                f"{page}:{line}: a fenced block without a language; say what it is "
                "(```sh, ```python, ```text …) so the tests know whether to run it"
            )
        kind, value = (marker[0], marker[1]) if marker else (None, None)
        found.append(
            Block(
                page=page,
                line=line,
                language=language,
                text=token.content,
                not_run=value if kind == "not run" else None,
                file=value if kind == "file" else None,
            )
        )
        marker = None
    if marker is not None:
        raise PageError(f"{page}:{marker[2]}: a marker with no code block after it")
    return found
