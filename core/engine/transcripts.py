"""The run's transcript: what an agent said while it ran (`ctx.log`) and what it logged, kept
with the run, bounded per run, and what the run spent (`ctx.spend`), recorded beside it.

A run may log a million characters; an inbox keeps `max_transcript_chars` of it. Past that the
beginning and the end stay: the first quarter of the budget holds the run's first lines (how it
started), the rest its latest ones (what it did last, before it died); the lines between are
dropped and counted. `Keep` decides which line goes where, the same way wherever it runs: the
writer in the worker (core/runtime/transcript.py) drops in memory exactly the lines this
script would drop, so a run that logs faster than the disk writes holds bounded memory.

Lines arrive in batches from one writer per run, each line numbered by the writer (`seq`, from
0): a batch already stored (a retry after an answer lost on the way back) changes nothing,
lines dropped before they were sent leave a gap in the numbers, and a reader shows a gap as
"… n lines dropped …". Nothing here is fenced: a transcript and a spend are records of fact,
like an effect's outcome, and a run given up may still say what its code does until it ends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from ..settings import from_micros
from .tx import Tx

LINE_WEIGHT = 64  # each line counts as this many characters more: a million empty lines
MAX_LINE = 16_384  # characters of one line's text; a longer one is cut, saying by how much
HEAD_SHARE = 4  # the beginning keeps 1/HEAD_SHARE of the budget, the end the rest
LEVELS = ("debug", "info", "warning", "error", "critical", "spend", "log")
DELETE_CHUNK = 256  # stored lines looked at per statement when the end moves on

# A line as a batch carries it: (seq, at, level, logger or None, text, fields JSON or None).
NewLine = tuple[int, int, str, str | None, str, str | None]
# A spend as a batch carries it: (seq of its transcript line, at, unit, micros, note or None).
NewSpend = tuple[int, int, str, int, str | None]


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a run's transcript. `level` is a logging level ("info", "warning", …),
    "log" for `ctx.log` and "spend" for `ctx.spend`; `logger` names the logger of a logging
    record (None for the agent's own `ctx.log`); `fields` are ctx.log's keyword fields."""

    run_id: int
    seq: int
    at: int
    level: str
    logger: str | None
    text: str
    fields: Any = None


@dataclass(frozen=True, slots=True)
class Transcript:
    """The lines of one run read (`lines`, by seq), and what the run's whole transcript is:
    `logged` lines in all, `dropped` of them (`dropped_chars` characters) left out between
    its beginning and its end, `head_lines` the lines of its beginning. `pruned`: the run's
    events' payloads were pruned, and its lines with them."""

    run_id: int
    lines: tuple[LogLine, ...]
    logged: int = 0
    dropped: int = 0
    dropped_chars: int = 0
    head_lines: int = 0
    pruned: bool = False
    updated: int | None = None

    @property
    def stored(self) -> int:
        return self.logged - self.dropped


def weight(text: str, fields: str | None) -> int:
    """What a line costs of the budget: its characters, its fields' and a fixed share."""
    return len(text) + (len(fields) if fields else 0) + LINE_WEIGHT


def budgets(limit: int) -> tuple[int, int]:
    """The beginning's and the end's share of `max_transcript_chars`."""
    head = limit // HEAD_SHARE
    return head, limit - head


class Keep:
    """Which lines of one run are kept: a line goes to the beginning while the beginning has
    room and has never been full; every later line goes to the end, which keeps only its
    newest lines within its budget. The same decision in the writer and in the database."""

    __slots__ = ("head", "tail", "head_chars", "head_closed")

    def __init__(self, head: int, tail: int, head_chars: int = 0, head_closed: bool = False):
        self.head, self.tail = head, tail
        self.head_chars, self.head_closed = head_chars, head_closed

    def to_head(self, size: int) -> bool:
        """True if a line of `size` belongs to the beginning (and count it there)."""
        if not self.head_closed and self.head_chars + size <= self.head:
            self.head_chars += size
            return True
        self.head_closed = True
        return False


@dataclass
class _State:
    lines: int = 0  # lines logged: the seq of the next
    head_end: int = 0  # the seq after the beginning's last line
    head_chars: int = 0
    head_closed: bool = False
    tail_chars: int = 0
    dropped: int = 0
    dropped_chars: int = 0  # of the lines this script dropped
    sent_dropped_chars: int = 0  # of the lines the writer dropped before sending
    head_budget: int = 0
    tail_budget: int = 0


def append(
    tx: Tx,
    run_id: int,
    lines: Sequence[NewLine],
    upto: int,
    sent_dropped_chars: int,
    spends: Sequence[NewSpend],
    limit: int,
    now: int | None,
) -> int:
    """Store a batch of one run's transcript: `lines` (by seq), `upto` the seq after the last
    line the batch covers (a seq it skips is a line the writer dropped before sending), the
    characters the writer dropped so far for this run (`sent_dropped_chars`, a running total:
    a batch sent twice counts them once), and the run's `spends`. Returns how many lines were
    stored, or -1 if the run does not exist. `limit` (max_transcript_chars) is fixed by the
    run's first batch."""
    if tx.run("run_exists", id=run_id).fetchone() is None:
        return -1
    now = tx.now(now)
    row = tx.run("transcript_state", run=run_id).fetchone()
    if row is None:
        state = _State(*(0, 0, 0, False, 0, 0, 0, 0), *budgets(limit))
    else:
        state = _State(
            row[0], row[1], row[2], bool(row[3]), row[4], row[5], row[6], row[11], row[7], row[8]
        )
    if upto <= state.lines:
        return 0  # this batch is stored already: its first commit's answer was lost
    for seq, at, unit, micros, note in spends:
        if seq >= state.lines:
            tx.run("spend_insert", run=run_id, seq=seq, at=at, unit=unit, micros=micros, note=note)
            tx.run("spend_total_add", unit=unit, micros=micros)
    keep = Keep(state.head_budget, state.tail_budget, state.head_chars, state.head_closed)
    head: list[NewLine] = []
    tail: list[tuple[NewLine, int]] = []
    for line in lines:
        if line[0] < state.lines:
            continue
        size = weight(line[4], line[5])
        if keep.to_head(size):
            head.append(line)
            state.head_end = line[0] + 1
        else:
            tail.append((line, size))
    state.head_chars, state.head_closed = keep.head_chars, keep.head_closed
    fresh = sum(1 for line in lines if line[0] >= state.lines)
    state.dropped += upto - state.lines - fresh  # the seqs the batch skips
    state.sent_dropped_chars = max(state.sent_dropped_chars, sent_dropped_chars)
    excess = state.tail_chars + sum(size for _, size in tail) - state.tail_budget
    while excess > 0 and state.tail_chars > 0:  # the end's oldest stored lines go first
        rows = tx.run(
            "transcript_oldest_tail", run=run_id, head_end=state.head_end, limit=DELETE_CHUNK
        ).fetchall()
        if not rows:
            state.tail_chars = 0  # a count out of step with the rows: they are gone
            break
        cut = None
        for seq, size in rows:
            if excess <= 0:
                break
            cut, excess = seq, excess - size
            state.tail_chars -= size
            state.dropped += 1
            state.dropped_chars += size
        if cut is not None:
            tx.run("transcript_cut", run=run_id, head_end=state.head_end, upto=cut)
    kept: list[NewLine] = list(head)
    for line, size in tail:
        if excess > 0:  # a batch larger than the end's budget: its oldest lines go too
            excess -= size
            state.dropped += 1
            state.dropped_chars += size
        else:
            kept.append(line)
            state.tail_chars += size
    if kept:
        rows = [[*line, weight(line[4], line[5])] for line in kept]
        tx.run("transcript_lines_insert", run=run_id, rows=json.dumps(rows, ensure_ascii=False))
    state.lines = upto
    tx.run(
        "transcript_state_store",
        run=run_id,
        lines=state.lines,
        head_end=state.head_end,
        head_chars=state.head_chars,
        head_closed=state.head_closed,
        tail_chars=state.tail_chars,
        dropped=state.dropped,
        dropped_chars=state.dropped_chars,
        sent_dropped_chars=state.sent_dropped_chars,
        head_budget=state.head_budget,
        tail_budget=state.tail_budget,
        now=now,
    )
    return len(kept)


def read(tx: Tx, run_id: int, after: int | None, limit: int, newest: bool) -> Transcript:
    """Up to `limit` lines of a run's transcript after seq `after` (oldest first), or, with
    `newest`, its last `limit` lines; and what the whole transcript is."""
    row = tx.run("transcript_state", run=run_id).fetchone()
    if newest:
        rows = tx.run("transcript_lines_newest", run=run_id, limit=limit).fetchall()
        rows.reverse()
    else:
        after = -1 if after is None else after
        rows = tx.run("transcript_lines_after", run=run_id, after=after, limit=limit).fetchall()
    lines = tuple(_line(run_id, r) for r in rows)
    if row is None:
        return Transcript(run_id, lines)
    dropped_chars = row[6] + row[11]  # by this script, and by the writer before sending
    return Transcript(run_id, lines, row[0], row[5], dropped_chars, row[1], bool(row[9]), row[10])


def _line(run_id: int, r: Sequence[Any]) -> LogLine:
    """From `seq, at, level, logger, text, fields`: a line a listing shows, whatever a hand
    may have stored (fields that do not decode are shown as stored)."""
    fields: Any = r[5]
    if isinstance(fields, str):
        try:
            fields = json.loads(fields)
        except ValueError:
            pass
    return LogLine(run_id, r[0], r[1], str(r[2]), r[3], str(r[4]), fields)


def last_seq(tx: Tx, run_id: int) -> int:
    """The seq of the last line stored for the run (-1 for none): what a follower compares."""
    row = tx.run("transcript_last_seq", run=run_id).fetchone()
    return -1 if row is None or row[0] is None else int(row[0])


def prune(tx: Tx) -> int:
    """Drop the lines of every run none of whose events keeps its payload (pruned with the
    payload, docs/rules.md#the-runs-transcript); return how many runs lost their lines.
    What the runs spent stays: it is accounting, not a body."""
    runs = [r[0] for r in tx.run("transcripts_prune_mark").fetchall()]
    if runs:
        tx.run("transcript_lines_delete", runs=runs)
    return len(runs)


def shown_amount(micros: int, unit: str) -> str:
    """'0.0032 usd', '5 usd', '1,200 tokens': an amount for a person."""
    value = from_micros(micros)
    text = f"{value:,.6f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value):,}"
    return f"{text} {unit}"
