"""A run's transcript on its way from the agent's code to the inbox, never in the agent's way.

    ctx.log("calling the model", model="m-1", tokens=812)     # a line with fields
    log.warning("rate limited, retrying")                     # any logger, during the run
    ctx.spend(0.0123, unit="usd", note="m-1 call")            # a spend, and a line saying so

Each of these only appends to this process's memory, under a lock, from whatever thread the
agent's code runs in (the worker's loop, a plain-def agent's thread, a thread it started
through the context): it never waits for the database. The worker's `TranscriptWriter` writes
what accumulated in small batches from a task of its own, one transaction per run per batch:
a line is on the inbox within one commit of being logged when the writer is idle, and while a
commit is in flight the next lines gather into the next batch, so a run that logs fast costs
few transactions. A run that logs faster than the disk can take is bounded in memory by the
same rule as in the inbox (core/engine/transcripts.py `Keep`): its beginning is kept, and of
its end only what the budget keeps; every line left out is counted.

Which run a `logging` record belongs to comes from the context: the worker sets this run's
`RunLog` in a context variable inside the run's task, which the agent's thread, its tasks and
`asyncio.to_thread` inherit, and which `ctx.thread()` and `ctx.wrap()` carry into threads the
agent starts itself. A record emitted anywhere else (the worker's own lines, another run's
code) is not this run's. Records reach the handler only at the levels the process's logging
lets through (`onwatch worker`: --log-level, info by default).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import json
import logging
import threading
import time
from typing import Any, Callable, Protocol

from ..checks import json_text
from ..clock import Clock
from ..engine.transcripts import MAX_LINE, Keep, NewLine, NewSpend, budgets, shown_amount, weight
from ..errors import InboxBusy, InboxError
from ..inbox import Inbox
from ..text import printable

log = logging.getLogger("onwatch.transcript")  # its own lines are never captured (below)

BATCH_LINES = 500  # lines one transaction stores at most
BATCH_CHARS = 1 << 20  # characters one transaction stores at most (a line is ≤ MAX_LINE)
MAX_PENDING_SPENDS = 1000  # past this, waiting spends of one unit are added up into one
RETRY_PAUSE = (0.05, 0.2, 1.0, 5.0)  # after a failed write (a locked database, a full disk)

# The run whose code is running here: set in the run's task, inherited by what it starts.
current: contextvars.ContextVar[Sink | None] = contextvars.ContextVar(
    "onwatch_run_log", default=None
)

_UNSTORABLE = str.maketrans({0: "\\x00"})  # NUL: no database text column holds it


def storable(text: str) -> str:
    """`text` as a line can hold it: a NUL or a lone surrogate (neither of which a database
    stores as text) escaped visibly, and cut past MAX_LINE characters, saying by how much.
    Other control characters stay as they were: every reader escapes them when it shows
    them, as it does for any untrusted text."""
    if len(text) > MAX_LINE:
        text = f"{text[:MAX_LINE]}… ({len(text) - MAX_LINE:,} more characters)"
    if "\x00" in text:
        text = text.translate(_UNSTORABLE)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


class Sink(Protocol):
    """Where a run's lines go in this process: its RunLog in the worker, the line to the
    worker in an isolated agent's process (core/runtime/child.py)."""

    def line(self, level: str, logger: str | None, text: str, fields: str | None = None) -> int: ...

    def spend(self, micros: int, unit: str, note: str | None) -> None: ...

    def record(self, record: logging.LogRecord) -> None: ...


def record_line(record: logging.LogRecord) -> tuple[str, str, str]:
    """A logging record as a transcript line: (level, logger, text with its traceback)."""
    try:
        text = record.getMessage()
    except Exception as exc:  # noqa: BLE001 - a bad format string must not break the agent
        text = f"{record.msg!r} (could not be formatted: {type(exc).__name__})"
    if record.exc_info and record.exc_info[0] is not None:
        text = f"{text}\n{logging.Formatter().formatException(record.exc_info)}"
    elif record.exc_text:
        text = f"{text}\n{record.exc_text}"
    level = record.levelname.lower()
    if level not in ("debug", "info", "warning", "error", "critical"):
        level = "info" if record.levelno < logging.WARNING else "warning"
    return level, storable(str(record.name)[:200]) or "root", text


class RunLog:
    """One run's transcript in this process: numbers its lines, keeps them until the writer
    takes them, and holds them within the run's budget meanwhile. Every method may be called
    from any thread."""

    def __init__(self, writer: TranscriptWriter, run_id: int, limit: int) -> None:
        self.writer = writer
        self.run_id = run_id
        self.keep = Keep(*budgets(limit))
        self.next_seq = 0  # the seq of the next line
        self.sent = 0  # lines up to this seq have been taken by the writer
        self.stored = 0  # … and stored (a flush waits for this)
        # The waiting lines, (line, its weight): those of the beginning, then those of the
        # end (every line of the beginning comes before every line of the end).
        self.head_lines: collections.deque[tuple[NewLine, int]] = collections.deque()
        self.tail_lines: collections.deque[tuple[NewLine, int]] = collections.deque()
        self.tail_chars = 0  # of the waiting lines that belong to the end
        self.dropped = 0  # lines left out here (never sent)
        self.dropped_chars = 0  # a running total, sent with every batch
        self.spends: list[NewSpend] = []

    # --- what the agent's code calls (through RunContext and the logging handler) ---------

    def line(self, level: str, logger: str | None, text: str, fields: str | None = None) -> int:
        """Add a line; return its seq."""
        text = storable(text)
        at = self.writer.clock.now()
        with self.writer.lock:
            seq = self.next_seq
            self.next_seq += 1
            self._queue((seq, at, level, logger, text, fields))
        self.writer.wake()
        return seq

    def spend(self, micros: int, unit: str, note: str | None) -> None:
        """Add a spend and the line that says so; a spend is never dropped (only its line
        may be, with the others)."""
        text = f"spent {shown_amount(micros, unit)}" + (f": {note}" if note else "")
        fields = json_text({"amount": micros / 1_000_000, "unit": unit, "note": note})
        at = self.writer.clock.now()
        with self.writer.lock:
            seq = self.next_seq
            self.next_seq += 1
            self._queue((seq, at, "spend", None, storable(text), fields))
            self.spends.append((seq, at, unit, micros, note))
            if len(self.spends) > MAX_PENDING_SPENDS:
                self.spends = _added_up(self.spends)
        self.writer.wake()

    def record(self, record: logging.LogRecord) -> None:
        """A logging record emitted during the run: its message (and traceback, if any)."""
        self.line(*record_line(record))

    # --- the writer's side (the lock held) --------------------------------------------------

    @property
    def waiting(self) -> int:
        """Lines not yet taken by the writer."""
        return len(self.head_lines) + len(self.tail_lines)

    def _queue(self, line: NewLine) -> None:
        self.writer.waiting[self.run_id] = self
        size = weight(line[4], line[5])
        if self.keep.to_head(size):
            self.head_lines.append((line, size))
            return
        self.tail_lines.append((line, size))
        self.tail_chars += size
        self._bound()

    def _bound(self) -> None:
        """Drop the oldest waiting lines of the end while the end is over its budget: the
        inbox would drop them anyway, once newer ones arrived."""
        while self.tail_chars > self.keep.tail and self.tail_lines:
            _, size = self.tail_lines.popleft()
            self.tail_chars -= size
            self.dropped += 1
            self.dropped_chars += size

    def take(self) -> Batch | None:
        """The next batch (None when nothing waits), taken out of the queue."""
        if not self.waiting and not self.spends and self.sent == self.next_seq:
            return None
        head: list[tuple[NewLine, int]] = []
        tail: list[tuple[NewLine, int]] = []
        chars = 0
        for source, taken in ((self.head_lines, head), (self.tail_lines, tail)):
            while source and len(head) + len(tail) < BATCH_LINES and chars < BATCH_CHARS:
                item = source.popleft()
                taken.append(item)
                chars += item[1]
        self.tail_chars -= sum(size for _, size in tail)
        following = self.head_lines or self.tail_lines
        upto = following[0][0][0] if following else self.next_seq
        spends = [s for s in self.spends if s[0] < upto]
        self.spends = [s for s in self.spends if s[0] >= upto]
        batch = Batch(self, self.sent, head, tail, upto, self.dropped_chars, spends)
        self.sent = upto
        return batch

    def give_back(self, batch: Batch) -> None:
        """A batch that could not be written goes back in front, to be sent again with the
        same seqs (a batch that did commit before its answer was lost then changes nothing
        the second time), and the budget holds again."""
        self.head_lines.extendleft(reversed(batch.head))
        self.tail_lines.extendleft(reversed(batch.tail))
        self.tail_chars += sum(size for _, size in batch.tail)
        self.spends = batch.spends + self.spends
        self.sent = batch.start
        self._bound()


class Batch:
    """Lines of one run taken together for one transaction: those of the beginning and
    those of the end (each as (line, weight)), the seq after them, the characters the writer
    dropped so far, and the spends among them."""

    __slots__ = ("run", "start", "head", "tail", "upto", "dropped_chars", "spends")

    def __init__(
        self,
        run: RunLog,
        start: int,
        head: list[tuple[NewLine, int]],
        tail: list[tuple[NewLine, int]],
        upto: int,
        dropped_chars: int,
        spends: list[NewSpend],
    ) -> None:
        self.run, self.start, self.head, self.tail, self.upto = run, start, head, tail, upto
        self.dropped_chars, self.spends = dropped_chars, spends

    @property
    def lines(self) -> list[NewLine]:
        return [line for line, _ in self.head] + [line for line, _ in self.tail]


def _added_up(spends: list[NewSpend]) -> list[NewSpend]:
    """Waiting spends added up per unit into the last one of each (notes dropped): what a
    flood of tiny spends costs in memory stays bounded, and nothing spent is lost."""
    totals: dict[str, int] = {}
    last: dict[str, NewSpend] = {}
    for spend in spends:
        totals[spend[2]] = totals.get(spend[2], 0) + spend[3]
        last[spend[2]] = spend
    return sorted(
        ((s[0], s[1], unit, totals[unit], "(several spends added up)") for unit, s in last.items()),
        key=lambda s: s[0],
    )


class TranscriptWriter:
    """Writes the transcripts of one worker's runs to its inbox, in small batches, from a
    task of its own (`start`), never from the agent's code. See the module docstring."""

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.clock: Clock = inbox.clock
        self.lock = threading.Lock()
        self.waiting: dict[int, RunLog] = {}  # runs with something to write, by run id
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Event | None = None
        self._kicked = False  # a wake-up is on its way to the loop: no need for another
        self._written: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.failures = 0  # failed writes in a row (a locked database, a full disk)
        self.stored = 0  # lines stored by this writer, for tests and logs

    def start(self) -> None:
        """Start writing from a task on the running loop (idempotent)."""
        if self._task is not None and not self._task.done():
            return
        self._loop = asyncio.get_running_loop()
        self._kick, self._written = asyncio.Event(), asyncio.Event()
        # A fresh context: the writer's own code belongs to no run, even when a run starts it.
        self._task = self._loop.create_task(self._write_all(), context=contextvars.Context())

    def open(self, run_id: int, limit: int) -> RunLog:
        """The transcript of a run about to start here, bounded by `limit` characters."""
        return RunLog(self, run_id, limit)

    def wake(self) -> None:
        """Something was added (any thread): have the writer task look, with at most one
        call handed to the loop until it has looked."""
        loop, kick = self._loop, self._kick
        if loop is None or kick is None:
            return
        with self.lock:
            if self._kicked:
                return
            self._kicked = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            kick.set()
        else:
            try:
                loop.call_soon_threadsafe(kick.set)
            except RuntimeError:  # the loop is closed: the worker is gone
                pass

    def _runs_waiting(self) -> list[RunLog]:
        return list(self.waiting.values())

    async def flush(self, run: RunLog, timeout: float) -> bool:
        """Wait until every line `run` had when called is stored (True), or `timeout`
        seconds (False: they stay queued, and are written when the inbox lets them)."""
        target = run.next_seq
        if run.stored >= target and not (run.spends and run.spends[0][0] < target):
            return True  # nothing of it is waiting (a run that logged nothing)
        deadline = time.monotonic() + timeout
        self.wake()
        while run.stored < target or (run.spends and run.spends[0][0] < target):
            left = deadline - time.monotonic()
            if left <= 0 or self._written is None:
                return False
            self._written.clear()
            try:
                await asyncio.wait_for(self._written.wait(), min(left, 0.5))
            except TimeoutError:
                pass
        return True

    async def close(self, timeout: float = 5.0) -> None:
        """Write what is left (for at most `timeout` seconds), then stop."""
        task = self._task
        if task is None:
            return
        for run in list(self._runs_waiting()):
            await self.flush(run, max(0.0, timeout))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        self._task = None
        with self.lock:
            left = sum(run.waiting for run in self.waiting.values())
        if left:
            log.warning(
                "%s transcript line(s) could not be written before the worker stopped", left
            )

    async def _write_all(self) -> None:
        kick = self._kick
        assert kick is not None
        while True:
            await kick.wait()
            kick.clear()
            with self.lock:
                self._kicked = False
            while True:
                with self.lock:
                    batches = [b for run in self._runs_waiting() if (b := run.take()) is not None]
                    for batch in batches:
                        if not batch.run.waiting and not batch.run.spends:
                            self.waiting.pop(batch.run.run_id, None)
                if not batches:
                    break
                for batch in batches:
                    if not await self._write(batch):
                        with self.lock:
                            batch.run.give_back(batch)
                            self.waiting[batch.run.run_id] = batch.run
                        await asyncio.sleep(RETRY_PAUSE[min(self.failures, len(RETRY_PAUSE)) - 1])
                assert self._written is not None
                self._written.set()

    async def _write(self, batch: Batch) -> bool:
        run = batch.run
        try:
            stored = await self.inbox.append_transcript(
                run.run_id,
                batch.lines,
                upto=batch.upto,
                dropped_chars=batch.dropped_chars,
                spends=batch.spends,
            )
        except InboxBusy as exc:
            self.failures += 1
            log.debug("transcript of run %s waits (locked, or no room): %s", run.run_id, exc)
            return False
        except InboxError as exc:
            self.failures += 1
            if self.failures in (1, 10) or self.failures % 100 == 0:
                log.warning(
                    "transcript of run %s could not be written (%s); retrying, its lines "
                    "are kept meanwhile within the run's budget",
                    run.run_id,
                    printable(str(exc)),
                )
            return False
        self.failures = 0
        if stored < 0:
            log.warning(
                "transcript of run %s: no such run in the inbox; lines left out", run.run_id
            )
        else:
            self.stored += stored
        run.stored = max(run.stored, batch.upto)
        return True


class CaptureHandler(logging.Handler):
    """Hands every logging record emitted during a run (the `current` context) to that run's
    transcript; records of the transcript's own logger never (they would feed themselves)."""

    def emit(self, record: logging.LogRecord) -> None:
        run = current.get()
        if run is None or record.name.startswith(log.name):
            return
        try:
            run.record(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the agent's code
            self.handleError(record)


_handler: CaptureHandler | None = None
_handler_lock = threading.Lock()


def capture_logging() -> None:
    """Install the one CaptureHandler on the root logger of this process (idempotent)."""
    global _handler
    with _handler_lock:
        if _handler is None:
            _handler = CaptureHandler()
            logging.getLogger().addHandler(_handler)


def in_run(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` made to run in the context it was wrapped in (this run's), each call in a copy
    of it: for a thread pool the agent submits to (`ctx.wrap`)."""
    context = contextvars.copy_context()

    def bound(*args: Any, **kwargs: Any) -> Any:
        return context.copy().run(fn, *args, **kwargs)

    return bound


def fields_text(fields: dict[str, Any]) -> str | None:
    """ctx.log's keyword fields as the JSON text of an object (None for none). A value JSON
    cannot hold (a datetime, NaN, an object) is kept as its repr: a log call never fails
    the run over a field. Bounded like a line: past MAX_LINE characters the fields are
    kept as one cut text."""
    if not fields:
        return None
    try:
        text = json.dumps(fields, default=repr, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps({name: repr(value)[:MAX_LINE] for name, value in fields.items()})
    if len(text) > MAX_LINE:
        text = json.dumps({"fields (cut)": text[: MAX_LINE - 100]})
    return text
