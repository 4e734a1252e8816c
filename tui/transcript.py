"""A run's transcript on the desk: each line as safe Text, the gaps where lines were dropped,
and what a run spent. Every word of a line (its text, its logger, its fields) came from the
agent, so all of it goes through tui/safe.py."""

from __future__ import annotations

from typing import Iterable

from rich.text import Text

from onwatch.core import LogLine, Spend, Transcript
from onwatch.core.engine.transcripts import shown_amount

from .safe import safe_text
from .timefmt import clock

LINE_CHARS = 4000  # of one line shown in the desk (the whole line: `onwatch logs`)
LEVEL_STYLE = {"warning": "bold", "error": "bold reverse", "critical": "bold reverse"}


def line_text(line: LogLine) -> Text:
    """'14:02:07 log    asked the model  model=m-1 tokens=812', escaped, one Text (a line
    with line breaks, a traceback, keeps them, indented)."""
    text = Text(end="")
    text.append(f"{clock(line.at, seconds=True)} ", style="dim")
    text.append(f"{line.level:<7} ", style=LEVEL_STYLE.get(line.level, "dim"))
    if line.logger:
        text.append_text(safe_text(line.logger, limit=60, style="italic"))
        text.append(": ")
    body = safe_text(line.text, limit=LINE_CHARS, multiline=True)
    if "\n" in body.plain:
        body = Text("\n    ", end="").join(body.split("\n", allow_blank=True))
    text.append_text(body)
    if line.level == "spend":  # its text says what the fields hold
        return text
    if isinstance(line.fields, dict):
        for name, value in list(line.fields.items())[:20]:
            text.append("  ")
            text.append_text(safe_text(name, limit=40, style="dim"))
            text.append("=", style="dim")
            text.append_text(safe_text(value, limit=200))
    elif line.fields is not None:
        text.append("  ")
        text.append_text(safe_text(line.fields, limit=200, style="dim"))
    return text


def gap_text(lines: int, chars: int | None = None) -> Text:
    """The mark where a transcript's dropped lines were."""
    what = f"… {lines:,} line{'s' if lines != 1 else ''} dropped"
    if chars:
        what += f" ({chars:,} characters)"
    return Text(what + " (over max_transcript_chars) …", style="italic dim", end="")


def with_gaps(lines: Iterable[LogLine], after: int = -1) -> list[Text]:
    """The lines as Text, with a gap mark wherever their seqs jump (lines dropped there);
    `after` is the seq of the line shown just before them."""
    shown: list[Text] = []
    last = after
    for line in lines:
        if line.seq > last + 1:
            shown.append(gap_text(line.seq - last - 1))
        shown.append(line_text(line))
        last = line.seq
    return shown


def transcript_text(head: Transcript, tail: Transcript | None, indent: str = "   ") -> Text:
    """A run's stored transcript (its first lines, and when there are more, its last ones)
    as one Text: what a finished run's detail shows next to its traceback."""
    text = Text(end="")
    if head.pruned:
        text.append(f"{indent}transcript pruned with the payloads\n", style="dim")
        return text
    if not head.lines:
        words = (
            f"transcript: {head.logged:,} line(s) logged, none kept (max_transcript_chars)"
            if head.logged
            else "no transcript"
        )
        text.append(f"{indent}{words}\n", style="dim")
        return text
    dropped = f", {head.dropped:,} dropped" if head.dropped else ""
    text.append(f"{indent}transcript ({head.logged:,} lines{dropped})\n", style="dim")
    lines = list(head.lines)
    last = lines[-1].seq
    rows = with_gaps(lines)
    later = [line for line in tail.lines if line.seq > last] if tail is not None else []
    if later and later[0].seq > last + 1:
        # Between the first lines shown and the last ones: lines stored but not shown here,
        # and the lines dropped over the budget (all of which lie between the two ends).
        between = later[0].seq - last - 1
        words = f"… {between:,} line{'s' if between != 1 else ''} between"
        if head.dropped:
            words += f" ({head.dropped:,} dropped over max_transcript_chars)"
        rows.append(Text(words + "; onwatch logs prints what is kept …", style="italic dim"))
        rows.append(line_text(later[0]))
        rows += with_gaps(later[1:], later[0].seq)
    else:
        rows += with_gaps(later, last)
    shown_last = (later or lines)[-1].seq
    if head.logged > shown_last + 1:  # dropped after the last line kept
        rows.append(gap_text(head.logged - shown_last - 1))
    for row in rows:
        text.append(indent)
        text.append_text(row)
        text.append("\n")
    return text


def spend_text(spends: Iterable[Spend]) -> str:
    """'spent 0.25 usd, 1,200 tokens' (our own words and numbers: no escaping needed)."""
    parts = [shown_amount(s.micros, s.unit) for s in spends]
    return "spent " + ", ".join(parts) if parts else ""
