"""Untrusted text made safe for a terminal: control and invisible characters shown as escapes.

Payloads, sources, action texts, errors and message bodies come from webhooks and agents. Raw,
an ESC or OSC sequence retitles or repaints the reader's terminal, a bidi override reorders
what they read. The supervisor TUI (tui/safe.py) and every plain-text output (the command
line, the stdout channel) escape the same characters, defined once here.
"""

from __future__ import annotations

import logging
import re

# C0 controls, DEL and C1 controls, invisible/format characters that reorder or hide text
# (bidi embeddings, overrides and isolates, zero-width marks, BOM, interlinear annotations,
# tag characters), Unicode line and paragraph separators, and lone surrogates (which cannot
# even be encoded for output).
UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_char(char: str) -> str:
    """The visible escape of one unsafe character: \\n, \\x1b, \\u202e, \\U000e0041."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code <= 0xFF
        else f"\\u{code:04x}"
        if code <= 0xFFFF
        else f"\\U{code:08x}"
    )


def printable(text: str, *, keep: str = "") -> str:
    """Return `text` with every unsafe character escaped, except those in `keep` (e.g.
    "\\n\\t" for multi-line output). Idempotent: escaped text has nothing left to escape."""
    return UNSAFE.sub(lambda m: m.group() if m.group() in keep else escape_char(m.group()), text)


class LineFormatter(logging.Formatter):
    """Log records as lines that cannot pass for another record's: control and invisible
    characters escaped (tabs kept), and every line after a record's first indented. A
    message or traceback with a newline in it (an agent's error, text from an inbox) would
    otherwise print a line that starts as a record does ("2026-… onwatch-worker INFO run 9
    finished: done") in a log that people and their tools read line by line."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep="\n\t").replace("\n", "\n    ")
