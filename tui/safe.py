"""The one door for untrusted text: inbox strings become Text that is never parsed as markup.

Payloads, sources, ids, action texts, errors and message bodies come from webhooks and agents.
A plain `str` handed to a Textual widget, a DataTable cell, a border title or `notify()` is
parsed as markup (`"[@click=app.quit]x[/]"` becomes a live button), and Textual passes ESC
through to the real terminal (`"\\x1b]0;pwned\\x07"` retitles it). So every inbox string reaches
the screen through this module only:

- `safe_text(value)` → a Rich `Text` (DataTable cells) built from the raw string, never parsed;
- `safe_content(value)` → the same as a Textual `Content` (Static, Label, titles);
- `safe_plain(value)` → the escaped string, for APIs that take `str` with markup off;
- `safe_json(value)` → a pretty-printed, escaped, multi-line `Text` for detail views.

Control characters (C0, DEL, C1), invisible format characters (bidi overrides, zero-width
marks), line/paragraph separators and lone surrogates are shown as visible escapes (`\\x1b`,
`\\r`, `\\u202e`, `\\udcff`) in reverse video, so a hostile value is both harmless and obvious.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text
from textual.content import Content

# The unsafe characters and their escapes are defined once, for the TUI and every plain-text
# output alike.
from onwatch.core.text import UNSAFE, escape_char

ESCAPE_STYLE = "reverse"
ELLIPSIS = "…"


def _to_str(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=repr)
    except (TypeError, ValueError):  # a cycle or an unencodable key: show its repr
        return repr(value)


def safe_text(
    value: object, *, style: str = "", limit: int | None = None, multiline: bool = False
) -> Text:
    """Return `value` as Rich Text, shown literally, with unsafe characters escaped.

    Never parses markup. `limit` cuts the string at that many characters (adding "…") before
    any work is done, so a 1 MiB payload costs nothing in a cell. With `multiline`, newlines
    stay newlines (detail views); otherwise they are shown as `\\n` so a cell stays one line.
    Tabs become spaces in multi-line text.
    """
    raw = _to_str(value)
    cut = False
    if limit is not None and len(raw) > limit:
        raw, cut = raw[: max(limit, 0)], True
    text = Text(style=style, end="", no_wrap=not multiline)
    position = 0
    for match in UNSAFE.finditer(raw):
        char = match.group()
        start = match.start()
        if start > position:
            text.append(raw[position:start])
        if multiline and char == "\n":
            text.append("\n")
        elif multiline and char == "\t":
            text.append("    ")
        else:
            text.append(escape_char(char), style=ESCAPE_STYLE)
        position = match.end()
    if position < len(raw):
        text.append(raw[position:])
    if cut:
        text.append(ELLIPSIS)
    return text


def safe_plain(value: object, *, limit: int | None = None) -> str:
    """Return the escaped one-line string (no styles) for APIs that take `str`; pass it with
    markup off (e.g. `notify(safe_plain(x), markup=False)`)."""
    return safe_text(value, limit=limit).plain


def safe_content(
    value: object, *, style: str = "", limit: int | None = None, multiline: bool = False
) -> Content:
    """Return `value` as Textual Content (for Static, Label, titles), shown literally."""
    return Content.from_rich_text(safe_text(value, style=style, limit=limit, multiline=multiline))


def safe_json(value: Any, *, limit: int = 200_000) -> Text:
    """Pretty-print a decoded JSON value (indent 2) as escaped multi-line Text.

    Strings are JSON-quoted, so their newlines show as `\\n`; the layout newlines stay real.
    Very large values are cut at `limit` characters with a note.
    """
    if isinstance(value, str):
        rendered = json.dumps(value, ensure_ascii=False)
    else:
        try:
            rendered = json.dumps(value, indent=2, ensure_ascii=False, default=repr)
        except (TypeError, ValueError):
            rendered = repr(value)
    text = safe_text(rendered, limit=limit, multiline=True)
    if len(rendered) > limit:
        text.append(f"\n({len(rendered) - limit:,} more characters not shown)", style="italic")
    return text


def join(*parts: Text | str, style: str = "") -> Text:
    """Assemble our own labels (plain `str`, trusted) and safe Text pieces into one Text.

    A plain `str` part is appended as text, never parsed: only use it for the TUI's own
    words; inbox strings must come in as `safe_text(...)`.
    """
    text = Text(style=style, end="", no_wrap=True)
    for part in parts:
        text.append(part if isinstance(part, Text) else str(part))
    return text
