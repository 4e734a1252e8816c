"""`onwatch logs TARGET EVENT`: an event's transcript, each attempt under its run, from a
shell; `--follow` keeps printing while it runs (like `kubectl logs -f`), `--json` prints one
JSON object per line for a program."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

from onwatch.cli.output import NOT_APPLIED, OK, CliError, field, local_time, one_line
from onwatch.cli.running import STOP_SIGNALS, open_inbox
from onwatch.core import Inbox, LogLine, Run, Transcript
from onwatch.core.engine.transcripts import shown_amount

PAGE = 1000  # lines read at once
FOLLOW_POLL = 0.25  # s between looks when nothing wakes the command (PostgreSQL, no inotify)
DONE = ("done", "dead", "interrupted", "cancelled", "gone")  # states where no run follows by itself


class Printer:
    """Prints runs and lines, as text for a person or JSON lines for a program."""

    def __init__(self, as_json: bool, now: int) -> None:
        self.as_json = as_json
        self.now = now

    def emit(self, data: dict[str, Any]) -> None:
        # ASCII-only JSON: every control or invisible character in the agent's text stays
        # an escape, whatever reads it.
        print(json.dumps(data, sort_keys=True, ensure_ascii=True), flush=True)

    def run(self, run: Run, attempt: int, transcript: Transcript, spent: str) -> None:
        if self.as_json:
            self.emit(
                {
                    "type": "run",
                    "run": run.id,
                    "attempt": attempt,
                    "gen": run.gen,
                    "holder": run.holder,
                    "claimed_at": run.claimed_at,
                    "finished_at": run.finished_at,
                    "outcome": run.outcome,
                    "error": run.error,
                    "logged": transcript.logged,
                    "dropped": transcript.dropped,
                    "dropped_chars": transcript.dropped_chars,
                    "pruned": transcript.pruned,
                }
            )
            return
        outcome = run.outcome or "running"
        if run.error:
            outcome += f": {one_line(run.error)[:200]}"
        print(
            f"── run {run.id} · attempt {attempt} · gen {run.gen} · {field(run.holder)} · claimed "
            f"{local_time(run.claimed_at, self.now)} · {outcome}"
            + (f" · {spent}" if spent else "")
            + " ──",
            flush=True,
        )
        if transcript.pruned:
            print("(its transcript was pruned with the payloads)", flush=True)
        elif transcript.logged == 0:
            print("(no transcript)" if run.outcome else "(nothing logged yet)", flush=True)

    def line(self, line: LogLine) -> None:
        if self.as_json:
            self.emit(
                {
                    "type": "line",
                    "run": line.run_id,
                    "seq": line.seq,
                    "at": line.at,
                    "level": line.level,
                    "logger": line.logger,
                    "text": line.text,
                    "fields": line.fields,
                }
            )
            return
        head = f"{_clock(line.at)} {line.level:<7} "
        if line.logger:
            head += f"{field(line.logger)}: "
        text = line.text.replace("\n", "\n    ")
        fields = ""
        if isinstance(line.fields, dict) and line.level != "spend":  # its text says it all
            fields = "".join(
                f"  {name}={json.dumps(value, ensure_ascii=False)}"
                for name, value in line.fields.items()
            )
        print(head + text + fields, flush=True)

    def gap(self, run_id: int, after: int, lines: int) -> None:
        if self.as_json:
            self.emit({"type": "gap", "run": run_id, "after_seq": after, "dropped": lines})
        else:
            print(
                f"… {lines:,} line{'s' if lines != 1 else ''} dropped (over "
                f"max_transcript_chars) …",
                flush=True,
            )

    def end(self, run: Run) -> None:
        if self.as_json:
            self.emit({"type": "end", "run": run.id, "outcome": run.outcome, "error": run.error})
        else:
            print(f"── run {run.id} ended: {run.outcome} ──", flush=True)


def _clock(at: int) -> str:
    """A line's local time of day (its run's heading has the date)."""
    try:
        return time.strftime("%H:%M:%S", time.localtime(at))
    except (OverflowError, OSError, ValueError, TypeError):  # a row written by hand
        return f"{at!r}"


async def _lines(inbox: Inbox, printer: Printer, run_id: int, after: int) -> int:
    """Print every stored line of the run after seq `after` (gaps marked); return the last
    seq printed."""
    while True:
        page = await inbox.transcript(run_id, after=after, limit=PAGE)
        for line in page.lines:
            if line.seq > after + 1:
                printer.gap(run_id, after, line.seq - after - 1)
            printer.line(line)
            after = line.seq
        if len(page.lines) < PAGE:
            return after


async def _spent(inbox: Inbox, run_id: int) -> str:
    spends = await inbox.run_spend([run_id])
    return ", ".join(shown_amount(s.micros, s.unit) for s in spends)


class Shown:
    """What has been printed of an event: each run's last seq, and the runs whose end was
    said."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}
        self.ended: set[int] = set()


async def _pass(
    inbox: Inbox, printer: Printer, event_id: int, only: int | None, shown: Shown, ends: bool
) -> bool:
    """Print what is new of the event's runs (a new run's heading, new lines, an end); True
    when every run printed has ended."""
    for attempt, run in enumerate(await inbox.runs(event_id), 1):
        if only is not None and run.id != only:
            continue
        if run.id not in shown.last:
            transcript = await inbox.transcript(run.id, limit=1)
            printer.run(run, attempt, transcript, await _spent(inbox, run.id))
            shown.last[run.id] = -1
            if transcript.pruned:
                shown.ended.add(run.id)
                continue
        if run.id in shown.ended:
            continue
        # The outcome was read before the lines: every line stored before the run ended
        # is printed before its end is said.
        shown.last[run.id] = await _lines(inbox, printer, run.id, shown.last[run.id])
        if run.outcome is not None:
            # Lines dropped after the last one kept (the end's oldest, or the writer's).
            logged = (await inbox.transcript(run.id, limit=1)).logged
            if logged > shown.last[run.id] + 1:
                printer.gap(run.id, shown.last[run.id], logged - shown.last[run.id] - 1)
            shown.ended.add(run.id)
            if ends:
                printer.end(run)
    return all(run_id in shown.ended for run_id in shown.last)


async def cmd_logs(args: argparse.Namespace) -> int:
    async with await open_inbox(args) as inbox:
        event = await inbox.get_event(args.event_id)
        if event is None:
            raise CliError(f"no event {args.event_id} in {inbox.path}", NOT_APPLIED)
        runs = await inbox.runs(event.id)
        if args.run is not None and all(r.id != args.run for r in runs):
            claimed = ", ".join(str(r.id) for r in runs) or "none"
            raise CliError(
                f"run {args.run} did not claim event {event.id} (its runs: {claimed})",
                NOT_APPLIED,
            )
        printer = Printer(args.json, inbox.now())
        shown = Shown()
        if not args.follow:
            await _pass(inbox, printer, event.id, args.run, shown, args.json)
            if not runs and not args.json:
                print(f"(event {event.id} is {event.status}: no run has claimed it yet)")
            return OK
        await _follow(inbox, printer, event.id, args.run, shown)
    return OK


async def _follow(
    inbox: Inbox, printer: Printer, event_id: int, only: int | None, shown: Shown
) -> None:
    """Print lines as they are stored, and each new attempt's, until the event is in a
    state where no run follows by itself (done, dead, interrupted, cancelled; with --run,
    until that run ends) or a signal asks to stop: exit 0 either way."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    try:
        wake = inbox.wake
        while not stop.is_set():
            seen = wake.seq
            printer.now = inbox.now()
            status = (await inbox.get_event(event_id) or _GONE).status
            ended = await _pass(inbox, printer, event_id, only, shown, True)
            if ended and (status in DONE or (only is not None and only in shown.ended)):
                return
            waiting = asyncio.ensure_future(wake.wait(seen, FOLLOW_POLL))
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                stopping.cancel()
    finally:
        for signum in STOP_SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)


class _Gone:
    status = "gone"


_GONE = _Gone()
