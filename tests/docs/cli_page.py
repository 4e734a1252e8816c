"""docs/cli.md, made from the argument parser (cli/parser.py) so the page cannot drift from
the program: `python3 dev.py docs` writes it, tests/docs/test_cli_page.py fails when the
committed page differs from what the parser gives."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from onwatch.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cli.md"
REGENERATE = "python3 dev.py docs"
WIDTH = "100"  # argparse wraps help to $COLUMNS: one width, whatever the terminal

INTRO = f"""\
# The command line

<!-- Generated from cli/parser.py by `{REGENERATE}`; do not edit by hand. -->

Every `onwatch` command with its options, exactly as its `--help` prints it. The examples at
the end of each are run as written by `tests/cli/test_help_examples.py`. Inside a checkout,
`python3 dev.py onwatch …` runs any of them in the project's environment.

Exit codes, for every command: 0 done; 1 not applied or refused (what stands is printed); 2
bad usage, bad input or not an inbox; 3 the inbox stayed locked past `--busy-timeout`, or
its disk had no room (nothing was written; try again); 4 (`worker`, `run`) the worker ended
itself for an agent it could not stop. An operator command's exit code follows what the
audit log says: 0 when the call changed something, 1 when it did not (re-approving an
approved request, pausing a paused inbox). Each is audited under `--actor`, else
`$ONWATCH_ACTOR`, else your user name.

Errors are one line on stderr; `--json` output has sorted keys. Every argument either does
the job or is refused (exit 2) with the inbox byte-identical and no file left behind:
numbers past a 64-bit integer, seconds past a day, JSON nested too deeply, text that is not
UTF-8. A long-running command that stops or crashes exits even if a thread it started is
stuck (a plain-def agent blocked in a call is abandoned after `--grace`).

Text that came from outside (sources, ids, payloads, actions, errors, transcripts) never
drives the terminal: control and invisible characters print escaped (`\\x1b`, `\\u202e`, …).
Inside a field of a line (a column of `events` or `approvals`, the names in `show`'s
header) a tab or a newline prints as `\\t` or `\\n` too, so each line is one record and
its columns are the command's own.
"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [group] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(group.choices)


def summaries(parser: argparse.ArgumentParser) -> dict[str, str]:
    [group] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {choice.dest: choice.help or "" for choice in group._choices_actions}


def render() -> str:
    """The page's text for the parser as it is now."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        parts = [INTRO, "## Commands\n"]
        helps = summaries(parser)
        for name in subcommands(parser):
            parts.append(f"- [`{name}`](#onwatch-{name}): {helps.get(name, '')}")
        parts.append("")
        parts.append(section("onwatch", parser))
        for name, sub in subcommands(parser).items():
            parts.append(section(f"onwatch {name}", sub))
        return "\n".join(parts).rstrip("\n") + "\n"
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def section(title: str, parser: argparse.ArgumentParser) -> str:
    text = "\n".join(line.rstrip() for line in parser.format_help().splitlines())
    return f"## {title}\n\n```text\n{text.strip()}\n```\n"


def main(argv: list[str]) -> int:
    """`--write` writes docs/cli.md; without it, the page goes to stdout."""
    text = render()
    if argv == ["--write"]:
        PAGE.write_text(text, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)}", file=sys.stderr)
        return 0
    if argv:
        print("usage: python -m tests.docs.cli_page [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
