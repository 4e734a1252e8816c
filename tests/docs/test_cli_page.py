"""docs/cli.md is what the parser gives now (tests/docs/cli_page.py makes it)."""

from __future__ import annotations

import difflib

from onwatch.cli.parser import build_parser
from tests.docs.cli_page import PAGE, REGENERATE, render, subcommands


def test_the_command_line_page_is_the_parsers():
    wanted = render()
    found = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    if found != wanted:
        diff = "".join(
            list(
                difflib.unified_diff(
                    found.splitlines(keepends=True),
                    wanted.splitlines(keepends=True),
                    "docs/cli.md (committed)",
                    "docs/cli.md (from cli/parser.py)",
                )
            )[:60]
        )
        raise AssertionError(
            f"docs/cli.md is not what cli/parser.py gives; run `{REGENERATE}` and commit it\n"
            + diff
        )


def test_the_page_has_every_command_and_option():
    page = render()
    parser = build_parser()
    for name, sub in subcommands(parser).items():
        assert f"## onwatch {name}\n" in page, name
        for action in sub._actions:
            for option in action.option_strings:
                assert option in page, (name, option)
    assert "--version" in page
