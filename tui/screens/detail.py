"""The detail view: one row's whole story — payload pretty-printed, attempts, errors, runs
(each with what it spent and its transcript), effect journal and operator actions; a running
event's run followed live."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, RichLog, Static

from onwatch.core import Approval, AuditEntry, Event, Inbox, InboxError, Message, Spend, Timer

from ..safe import join, safe_json, safe_text
from ..timefmt import WALL, Times, ago, countdown, period
from ..transcript import spend_text, transcript_text, with_gaps

HEAD_LINES = 100  # of a finished run's transcript: its first lines …
TAIL_LINES = 300  # … and its last ones (`onwatch logs` prints all that is kept)
LIVE_LINES = 2000  # lines the live transcript keeps on screen
FOLLOW_PAGE = 500  # lines read at once while following
FOLLOW_POLL = 0.05  # s: at most this long between looks, whatever wakes the desk or not
RUN_CHECK = 0.5  # s between two looks at whether the followed run has ended


def _field(text: Text, name: str, value: Text | str) -> None:
    text.append(f"{name:<12}", style="bold")
    text.append_text(value if isinstance(value, Text) else Text(value))
    text.append("\n")


def _section(text: Text, title: str) -> None:
    text.append(f"\n── {title} ", style="bold")
    text.append("─" * max(0, 50 - len(title)), style="dim")
    text.append("\n")


def _audit(text: Text, entries: list[AuditEntry], times: Times) -> None:
    _section(text, "Operator actions and refusals")
    if not entries:
        text.append("none\n", style="dim")
    for entry in reversed(entries):
        text.append(f"{times.stamp(entry.at)}  ")
        text.append_text(safe_text(entry.actor, limit=40))
        text.append(f"  {entry.action}  ")
        text.append_text(safe_text(f"{entry.before} → {entry.after}", limit=60))
        text.append(
            "  applied" if entry.applied else "  refused", style="" if entry.applied else "bold"
        )
        if entry.reason:
            text.append(": ")
            text.append_text(safe_text(entry.reason, limit=500))
        text.append("\n")


@dataclass(frozen=True, slots=True)
class Follow:
    """A running run whose transcript the detail follows live: the event and its run."""

    inbox: Inbox
    event_id: int
    run_id: int


@dataclass(frozen=True, slots=True)
class Detail:
    """What a detail screen shows: a title, the body, and the run to follow, if one runs."""

    title: str
    body: Text
    follow: Follow | None = None


async def event_detail(
    inbox: Inbox, event_id: int, now: int, times: Times = WALL
) -> tuple[str, Text]:
    """Read everything about one event; return a title and the body (safe Text)."""
    detail = await read_event(inbox, event_id, now, times)
    return detail.title, detail.body


async def _transcript(inbox: Inbox, run_id: int) -> Text:
    """A finished run's transcript: its first lines and, when it has more, its last ones."""
    head = await inbox.transcript(run_id, limit=HEAD_LINES)
    tail = None
    if head.stored > len(head.lines):
        tail = await inbox.transcript(run_id, newest=True, limit=TAIL_LINES)
    return transcript_text(head, tail)


async def read_event(inbox: Inbox, event_id: int, now: int, times: Times = WALL) -> Detail:
    """Everything about one event, and its running run to follow, if any."""
    event: Event | None = await inbox.get_event(event_id)
    if event is None:
        return Detail(f"Event #{event_id}", Text("This event no longer exists."))
    runs = await inbox.runs(event_id)
    spent: dict[int, list[Spend]] = {}
    for spend in await inbox.run_spend([run.id for run in runs]) if runs else []:
        spent.setdefault(spend.run_id, []).append(spend)
    follow: Follow | None = None
    effects = await inbox.effects(event_id)
    audit = await inbox.audit(target=f"event {event_id}", limit=50)
    text = Text(end="")
    _field(text, "state", Text(event.status, style="bold"))
    _field(text, "source", safe_text(event.source, limit=1000))
    _field(text, "source id", safe_text(event.source_id, limit=1000))
    _field(text, "attempts", f"{event.attempts} of {inbox.settings.max_attempts}")
    _field(text, "created", f"{times.stamp(event.created)} ({ago(now, event.created)})")
    _field(text, "changed", f"{times.stamp(event.updated)} ({ago(now, event.updated)})")
    if event.status == "pending":
        _field(
            text,
            "available",
            "now"
            if event.available_at <= now
            else (
                f"{times.stamp(event.available_at)} ({countdown(now, event.available_at)}, backoff)"
            ),
        )
    if event.claim_gen is not None:
        _field(
            text,
            "claimed",
            f"by lease generation {event.claim_gen}"
            + (f" at {times.stamp(event.claimed_at)}" if event.claimed_at else "")
            + (f", run #{event.run_id}" if event.run_id else ""),
        )
    if event.error:
        _field(text, "error", safe_text(event.error, limit=10_000, multiline=True))
    _section(text, "Payload")
    text.append_text(
        Text("(pruned: the body was dropped, the dedupe key stays)", style="dim")
        if event.payload is None
        else safe_json(event.payload)
    )
    text.append("\n")
    _section(text, f"Runs ({len(runs)})")
    if not runs:
        text.append("never claimed\n", style="dim")
    for run in runs:
        text.append(f"#{run.id}  gen {run.gen}  ")
        text.append_text(safe_text(run.holder, limit=40))
        text.append(f"  claimed {times.stamp(run.claimed_at)}  ")
        outcome = run.outcome or "running"
        text.append(f"→ {outcome}", style="bold" if outcome in ("error", "lost") else "")
        if run.finished_at:
            text.append(f" at {times.clock(run.finished_at, seconds=True)}")
        if run.error:
            text.append(": ")
            text.append_text(safe_text(run.error, limit=1000))
        if len(run.event_ids) > 1:
            text.append(f"  (batch of {len(run.event_ids)})", style="dim")
        text.append("\n")
        if run.result is not None:
            text.append("   result ")
            text.append_text(safe_text(run.result, limit=1000))
            text.append("\n")
        if run.traceback:
            # The agent's own traceback: its text (file names, the exception's message) is
            # untrusted like any error, so it goes through safe_text, line breaks kept.
            text.append("   traceback (most recent call last at the bottom)\n", style="dim")
            text.append_text(
                safe_text(run.traceback.rstrip(), limit=20_000, multiline=True, style="dim")
            )
            text.append("\n")
        if run.id in spent:
            text.append(f"   {spend_text(spent[run.id])}\n")
        if run.outcome is None and event.status == "running" and event.run_id == run.id:
            follow = Follow(inbox, event.id, run.id)
            text.append("   transcript: followed live below\n", style="dim")
        else:
            # Each attempt's own transcript, beside its traceback: what it did before it
            # failed, died or was lost.
            text.append_text(await _transcript(inbox, run.id))
    _section(text, f"Effect journal ({len(effects)})")
    if not effects:
        text.append("no external effects recorded\n", style="dim")
    for effect in effects:
        text.append(f"run #{effect.run_id}  ")
        text.append_text(safe_text(effect.name, limit=80, style="bold"))
        text.append(f"  {effect.state}", style="bold" if effect.state == "intended" else "")
        text.append(f"  intended {times.clock(effect.intended_at, seconds=True)}")
        if effect.settled_at:
            text.append(f", settled {times.clock(effect.settled_at, seconds=True)}")
        text.append("\n   key ")
        text.append_text(safe_text(effect.key, limit=200, style="dim"))
        if effect.detail is not None:
            text.append("  detail ")
            text.append_text(safe_text(effect.detail, limit=500))
        text.append("\n")
    _audit(text, audit, times)
    return Detail(f"Event #{event.id} · {event.status}", text, follow)


async def approval_detail(
    inbox: Inbox, request_id: str, now: int, times: Times = WALL
) -> tuple[str, Text]:
    approval: Approval | None = await inbox.get_approval(request_id)
    if approval is None:
        return "Approval", join("No such request: ", safe_text(request_id, limit=200))
    audit = await inbox.audit(target=f"approval {request_id}", limit=50)
    text = Text(end="")
    _field(text, "request", safe_text(approval.request_id, limit=1000))
    _field(text, "asked", f"{times.stamp(approval.requested)} ({ago(now, approval.requested)})")
    left = countdown(now, approval.due, precise=True)
    _field(text, "deadline", f"{times.stamp(approval.due)} ({left})")
    if approval.answer is None:
        _field(text, "answer", Text("waiting", style="bold"))
    else:
        by = join(
            approval.answer,
            " by ",
            safe_text(approval.answered_by, limit=100),
            f" at {times.stamp(approval.answered_at)}",
        )
        _field(text, "answer", by)
    _section(text, "Action")
    text.append_text(safe_text(approval.action, limit=20_000, multiline=True))
    text.append("\n")
    _audit(text, audit, times)
    state = approval.answer or "waiting"
    return f"Approval · {state}", text


def timer_detail(timer: Timer, now: int, times: Times = WALL) -> tuple[str, Text]:
    text = Text(end="")
    _field(text, "timer", safe_text(timer.id, limit=1000))
    if timer.broken is not None:  # set aside by the scheduler: why, before what it stored
        _field(text, "set aside", safe_text(timer.broken, limit=2000))
    _field(text, "kind", "approval expiry" if timer.kind == "approval" else "timer")
    _field(text, "next due", f"{times.stamp(timer.due)} ({countdown(now, timer.due)})")
    _field(text, "period", period(timer.every))
    _field(text, "catch-up", timer.catch_up if timer.every else "—")
    if timer.key:
        _field(
            text,
            "event key",
            join(safe_text(timer.key[0], limit=200), " / ", safe_text(timer.key[1], limit=200)),
        )
    _field(
        text,
        "last fired",
        "never"
        if timer.last_fired is None
        else f"{times.stamp(timer.last_fired)} ({ago(now, timer.last_fired)})",
    )
    _field(
        text,
        "skipped",
        f"{timer.last_skipped} by the last catch-up; {timer.overflow} over the catch-up cap in all",
    )
    _section(text, "Payload")
    text.append_text(safe_json(timer.payload))
    text.append("\n")
    return "Timer", text


def message_detail(message: Message, now: int, times: Times = WALL) -> tuple[str, Text]:
    text = Text(end="")
    _field(
        text, "message", f"#{message.id}" + ("  urgent: skips the gap" if message.urgent else "")
    )
    _field(text, "queued", f"{times.stamp(message.created)} ({ago(now, message.created)})")
    _field(text, "status", message.status)
    if message.run_id:
        _field(text, "from run", f"#{message.run_id}")
    _section(text, "Body")
    text.append_text(safe_text(message.body, limit=200_000, multiline=True))
    text.append("\n")
    return f"Outbox message #{message.id}", text


async def load_detail(inbox: Inbox, record: Any, now: int, times: Times = WALL) -> Detail:
    """The detail of any pane's row, its instants worded by `times` (and, for a running
    event, its run to follow)."""
    if isinstance(record, Event):
        return await read_event(inbox, record.id, now, times)
    if isinstance(record, Approval):
        return Detail(*await approval_detail(inbox, record.request_id, now, times))
    if isinstance(record, Timer):
        return Detail(*timer_detail(record, now, times))
    if isinstance(record, Message):
        return Detail(*message_detail(record, now, times))
    return Detail("Detail", safe_text(record, limit=10_000, multiline=True))


# A link from one detail to another: what it is, and ("event", id) or ("approval", id).
Link = tuple[str, tuple[str, int | str]]
MAX_LINKS = 9  # followed by the keys 1–9


async def detail_links(inbox: Inbox, record: Any) -> list[Link]:
    """Where a row leads: from an approval, the event that asked for it and the event its
    answer became; from an event, the approvals its runs asked for, and, for an answer's
    event, the approval it answers."""
    links: list[Link] = []
    if isinstance(record, Approval):
        trail = await inbox.approval_trail(record.request_id)
        if trail is not None:
            for event_id in trail.asked_by:
                run = f" (run #{trail.run_id})" if trail.run_id is not None else ""
                links.append(
                    (f"event #{event_id}: asked for this approval{run}", ("event", event_id))
                )
            if trail.answer_event is not None:
                links.append(
                    (
                        f"event #{trail.answer_event}: what its answer became",
                        ("event", trail.answer_event),
                    )
                )
    elif isinstance(record, Event):
        if record.source == "approval":
            links.append(
                (
                    f"approval {record.source_id}: this event answers it",
                    ("approval", record.source_id),
                )
            )
        for request_id in await inbox.approvals_asked_by(record.id):
            links.append(
                (f"approval {request_id}: asked by this event's run", ("approval", request_id))
            )
    return links[:MAX_LINKS]


def links_text(links: list[Link]) -> Text:
    """The links section of a detail (inbox text inside: made safe)."""
    text = Text(end="")
    if not links:
        return text
    _section(text, "Links (press the number to open)")
    for number, (label, _) in enumerate(links, start=1):
        text.append(f"{number}  ", style="bold")
        text.append_text(safe_text(label, limit=300))
        text.append("\n")
    return text


class DetailScreen(ModalScreen[tuple[str, int | str] | None]):
    """A scrollable read of one row; Escape, q or Enter closes it; 1–9 open its links (the
    app opens the linked row's detail). A running event's detail follows its run's
    transcript live below, like `kubectl logs -f`: a line the agent logs (in another
    process) is on screen within one commit and FOLLOW_POLL."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="detail-close", key_display="esc"),
        Binding("q", "close", "Close", show=False, id="detail-close-q"),
        Binding("enter", "close", "Close", show=False, id="detail-close-enter"),
        Binding(
            "tab",
            "switch",
            "Detail/transcript",
            show=False,
            id="detail-switch",
            tooltip="move between the detail and the live transcript (scroll either)",
        ),
        *(
            Binding(str(n), f"open_link({n})", f"Link {n}", show=False, id=f"detail-link-{n}")
            for n in range(1, MAX_LINKS + 1)
        ),
    ]

    def __init__(
        self,
        title: str,
        body: Text,
        follow: Follow | None = None,
        links: list[Link] | None = None,
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.links = links or []
        self.body = join(body, links_text(self.links)) if self.links else body
        self.follow = follow
        self.followed = 0  # transcript lines shown live (tests wait on it)
        self.ended: str | None = None  # how the followed run ended, once it has

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog detail"):
            yield Label(Text(self.title_text), classes="question")
            with VerticalScroll(id="detail-scroll"):
                yield Static(self.body, id="detail-body")
            if self.follow is not None:
                yield Label(
                    f"Transcript of run #{self.follow.run_id}: following (tab moves here)",
                    id="live-title",
                    classes="live-title",
                )
                yield RichLog(id="live", wrap=True, markup=False, max_lines=LIVE_LINES)
            keys = "↑↓ scroll" + ("    1–9 open a link" if self.links else "") + "    esc close"
            yield Label(keys + ("    tab detail/transcript" if self.follow else ""), classes="keys")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "open_link":
            return bool(parameters) and int(str(parameters[0])) <= len(self.links)
        return True

    def action_open_link(self, number: int) -> None:
        if 1 <= number <= len(self.links):
            self.dismiss(self.links[number - 1][1])

    def on_mount(self) -> None:
        self.query_one("#detail-scroll").focus()
        if self.follow is not None:
            self.run_worker(self._follow(self.follow), group="follow", exit_on_error=False)

    def action_switch(self) -> None:
        if self.follow is None:
            return
        live = self.query_one("#live", RichLog)
        (self.query_one("#detail-scroll") if live.has_focus else live).focus()

    def _write(self, rows: list[Text]) -> None:
        live = self.query_one("#live", RichLog)
        # Wrapped at the log's own width once it is known (RichLog would otherwise wrap at
        # each line's measured width, or its minimum, before its layout settles).
        width = live.scrollable_content_region.width or None
        for row in rows:
            live.write(row, width=width)
        self.followed += len(rows)

    async def _follow(self, follow: Follow) -> None:
        """Show the newest lines, then every line as it is stored, until the run ends: a
        wake-up from the inbox (another process's commit, on a file) or FOLLOW_POLL,
        whichever comes first (PostgreSQL tells of new work only, not of lines)."""
        inbox = follow.inbox
        wake = inbox.wake
        seen = wake.seq
        last = -1
        first = True
        ended_seen: str | None = None
        looked = 0.0
        while True:
            try:
                if first:
                    page = await inbox.transcript(follow.run_id, newest=True, limit=LIVE_LINES)
                    rows = []
                    if page.lines and page.lines[0].seq > 0:
                        rows.append(
                            Text(
                                f"… {page.lines[0].seq:,} earlier line(s): onwatch logs prints "
                                f"them",
                                style="italic dim",
                            )
                        )
                    start = page.lines[0].seq - 1 if page.lines else -1
                    first = False
                else:
                    page = await inbox.transcript(follow.run_id, after=last, limit=FOLLOW_PAGE)
                    rows, start = [], last
                if page.lines:
                    self._write(rows + with_gaps(page.lines, start))
                    last = page.lines[-1].seq
                    continue  # more may wait
                if rows:
                    self._write(rows)
                if ended_seen is not None:
                    self.ended = ended_seen
                    self._write(
                        [Text(f"── run #{follow.run_id} ended: {ended_seen} ──", style="bold")]
                    )
                    self.query_one("#live-title", Label).update(
                        f"Transcript of run #{follow.run_id}: ended ({ended_seen})"
                    )
                    return
                if time.monotonic() - looked >= RUN_CHECK:
                    looked = time.monotonic()
                    ended_seen = await self._ended(inbox, follow)
                    if ended_seen is not None:
                        continue  # read what was stored before it ended, then say so
            except InboxError as exc:
                self._write([safe_text(f"cannot read the transcript: {exc}", style="bold")])
                await asyncio.sleep(1.0)
            if await wake.wait(seen, FOLLOW_POLL):
                # Another process's commit is reported at its first write to the file,
                # before it is visible: look again a few times over a few milliseconds
                # (cut short as soon as a line shows) rather than wait for the next poll.
                await wake.confirm(lambda: inbox.transcript_last(follow.run_id), last)
            seen = wake.seq

    async def _ended(self, inbox: Inbox, follow: Follow) -> str | None:
        """How the followed run ended (done, error, lost), or None while it runs."""
        for run in await inbox.runs(follow.event_id):
            if run.id == follow.run_id:
                return run.outcome
        return "gone"

    def action_close(self) -> None:
        self.dismiss(None)
