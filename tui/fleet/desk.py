"""The fleet desk's engine room: scan the source, keep the summaries, never miss an approval.

One `FleetDesk` per app. It scans the fleet source in a thread every `POLL_SECONDS` (a scan
re-reads only the inboxes whose files changed), hands the summaries to whichever fleet view is
on screen, and raises the alarm — a toast, the terminal bell and a count in the title — when
an approval arrives anywhere or comes within `WARN_SECONDS` of its deadline, whatever view is
open. The title only ever carries fixed words and a number (`title_for`): an inbox name or an
action text must never reach the terminal's title bar.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable, Iterable, Protocol, runtime_checkable

from onwatch.core import Approval, Clock, Inbox
from onwatch.core.fleet import FleetScan, FleetSource, InboxSummary

from ..safe import safe_plain
from ..timefmt import Times

if TYPE_CHECKING:
    from ..screens.confirm import ConfirmScreen

WARN_SECONDS = 600  # an approval this close to its deadline raises the alarm
TITLE = "onwatch"


def approvals_phrase(waiting: int, soon: int = 0) -> str:
    """The fleet's one count of approvals, in the same words for the title, the header and
    the toasts: '4 approvals waiting · 1 expiring soon' (fixed words and numbers only)."""
    words = f"{int(waiting):,} approval{'s' if waiting != 1 else ''} waiting"
    if soon:
        words += f" · {int(soon):,} expiring soon"
    return words


def title_for(waiting: int, soon: int = 0) -> str:
    """The app and terminal title: fixed words and counts, nothing from an inbox."""
    if waiting <= 0:
        return TITLE
    return f"{TITLE} · {approvals_phrase(waiting, soon)}"


def approval_counts(summaries: Iterable[InboxSummary], now: int) -> tuple[int, int]:
    """(waiting, expiring soon) over the fleet: every request without an answer, and those
    of them whose deadline is at most WARN_SECONDS away and not yet passed. The title, the
    header and the toasts all say these two numbers."""
    waiting = soon = 0
    for summary in summaries:
        waiting += summary.waiting
        for approval in summary.approvals:  # soonest first
            left = approval.due - now
            if left > WARN_SECONDS:
                break
            if left > 0:
                soon += 1
    return waiting, soon


def lease_lost(summary: InboxSummary, now: int) -> bool:
    """An expired lease its holder never handed back: the worker died or stalled."""
    lease = summary.lease
    return lease is not None and lease.until < now and not summary.lease_released


def unserved_since(summary: InboxSummary, now: int) -> int | None:
    """Since when work has waited in an inbox that no worker is watching (nobody holds the
    lease: never taken, released, or lost); None when it is served or has nothing to do."""
    if summary.problem or summary.served(now):
        return None
    return summary.waiting_since(now)


def needs_worker(summary: InboxSummary, now: int, watched: bool = False) -> bool:
    """Nobody holds the lease while something waits on a worker: events or a due timer to
    run, or approvals whose answers (or expiry) only a worker will act on, unless the fleet
    is `watched` (a fleet worker is connected: it visits the inbox when the answer comes or
    the deadline passes)."""
    if summary.problem or summary.served(now):
        return False
    return (bool(summary.waiting) and not watched) or summary.waiting_since(now) is not None


def health(summary: InboxSummary, now: int) -> str:
    """The one word the row is coloured by, most urgent first."""
    if summary.problem:
        return "problem"
    due = summary.soonest_due
    if due is not None:
        return "urgent" if due - now <= WARN_SECONDS else "approval"
    if unserved_since(summary, now) is not None:
        return "unserved"
    if summary.dead or summary.interrupted:
        return "dead"
    if lease_lost(summary, now):
        return "lost"
    return "ok"


_RANK = {"urgent": 0, "approval": 0, "unserved": 1, "dead": 2, "lost": 3, "problem": 4, "ok": 5}


def needs_a_human_first(summary: InboxSummary, now: int) -> tuple[int, int, str, str]:
    """Sort key: approvals by deadline, then work waiting with no worker (longest waiting
    first), dead/interrupted, lost leases, unreadable files, then the rest; by name within
    each."""
    word = health(summary, now)
    if word == "unserved":
        at = unserved_since(summary, now) or 0
    else:
        at = summary.soonest_due or 0
    return (_RANK[word], at, summary.name.lower(), summary.key)


@runtime_checkable
class FleetView(Protocol):
    """A screen that shows the desk's summaries (the Fleet view, the approval queue)."""

    def show_fleet(self, now: int) -> None: ...
    def tick(self, now: int) -> None: ...


class Supervisor(Protocol):
    """The app that mounts the desk (tui/app.py's `OnwatchApp`), as the desk and its screens
    use it: its clock and the inbox its panes show, the switch to another, the pane to show,
    the confirmation of an action; and the parts of Textual's `App` they call. A protocol,
    not an import: the app imports the fleet package, never the other way round.
    """

    actor: str  # who the audit log says acted
    times: Times  # how instants are worded
    clock: Clock
    inbox: Inbox | None
    title: str
    back_to_queue: Hashable | None  # the queue's row the inbox shown was opened from

    @property
    def screen(self) -> Any: ...
    @property
    def screen_stack(self) -> list[Any]: ...
    @property
    def top_screen(self) -> Any: ...
    @property
    def is_headless(self) -> bool: ...
    def tick(self) -> None: ...
    async def switch_inbox(self, inbox: Inbox) -> None: ...
    def action_show_pane(self, pane_id: str) -> None: ...
    def _confirmation(
        self,
        action: str,
        targets: tuple[Any, ...],
        hidden: int = 0,
        inbox: Inbox | None = None,
    ) -> ConfirmScreen: ...
    def push_screen_wait(self, *args: Any, **kwargs: Any) -> Any: ...
    def pop_screen(self, *args: Any, **kwargs: Any) -> Any: ...
    def bell(self) -> None: ...
    def notify(self, *args: Any, **kwargs: Any) -> Any: ...
    def call_later(self, *args: Any, **kwargs: Any) -> Any: ...
    def call_from_thread(self, *args: Any, **kwargs: Any) -> Any: ...
    def run_worker(self, *args: Any, **kwargs: Any) -> Any: ...
    def set_interval(self, *args: Any, **kwargs: Any) -> Any: ...


class FleetDesk:
    """The summaries of every inbox of `source`, kept fresh, and the approval alarm."""

    POLL_SECONDS = 1.0

    def __init__(self, app: Supervisor, source: FleetSource, *, read_only: bool = False) -> None:
        self.app = app
        self.source = source
        self.read_only = read_only
        self.summaries: dict[str, InboxSummary] = {}
        self.workers = 0  # fleet workers serving the source, as of the last scan
        self.silent = 0  # fleet workers connected but silent (FleetScan.silent)
        self.loaded = False  # the first scan has been applied
        self.scans = 0
        self.bells = 0
        self._scanning = False
        self.failure: str | None = None  # why the last scan failed (a lost database), if it did
        self._force: set[str] = set()
        self._again = False
        self._known: dict[str, set[str]] = {}  # inbox key → waiting request ids seen
        self._waiting: dict[str, int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._deadlines: list[tuple[int, str, str]] = []  # (due, key, request id), soonest first

    def now(self) -> int:
        return self.app.clock.now()  # the app's one clock

    def start(self) -> None:
        self.scan()
        # The countdowns have no timer of their own: the app's one clock calls `tick`.
        self.app.set_interval(self.POLL_SECONDS, self.scan, name="fleet-scan")

    # --- scanning -------------------------------------------------------------------------

    def scan(self, force: Iterable[str] = ()) -> None:
        """Start a scan in a thread unless one runs (then it runs again right after)."""
        self._force.update(force)
        if self._scanning:
            self._again = True
            return
        self._scanning = True
        force_now, self._force = frozenset(self._force), set()
        known, now = dict(self.summaries), self.now()

        def work() -> None:
            try:
                result = self.source.scan(now, known, force_now)
            except Exception as exc:  # noqa: BLE001 - a failed pass must not stop the desk
                self.app.call_from_thread(self._failed, exc)
                return
            self.app.call_from_thread(self.apply, result)

        self.app.run_worker(work, thread=True, group="fleet-scan", exit_on_error=False)

    def _failed(self, exc: BaseException) -> None:
        self._scanning = False
        if self.failure is None:  # once per outage, not at every scan while it lasts
            self.app.notify(
                safe_plain(f"cannot scan the fleet: {exc}", limit=200),
                severity="error",
                markup=False,
            )
        self.failure = str(exc)

    def apply(self, scan: FleetScan) -> None:
        """Take a finished scan: new summaries, alarms, and the view on screen repainted."""
        self._scanning = False
        if self.failure is not None:
            self.failure = None
            self.app.notify("the fleet is read again", severity="information")
        first = not self.loaded
        self.summaries = scan.summaries
        workers_moved = (scan.workers, scan.silent) != (self.workers, self.silent)
        self.workers, self.silent = scan.workers, scan.silent
        self.loaded = True
        self.scans += 1
        now = self.now()
        arrived = self._arrivals(scan, first)
        if scan.read or scan.removed or first or workers_moved:
            self._deadlines = sorted(
                (a.due, s.key, a.request_id) for s in self.summaries.values() for a in s.approvals
            )
            self._forget_answered()
            view = self.view()
            if view is not None:
                view.show_fleet(now)
        warned = self._due_soon(now)
        self._alarm(arrived, warned)
        if self._again:
            self._again = False
            self.app.call_later(self.scan)

    def view(self) -> FleetView | None:
        screen = self.app.top_screen
        return screen if isinstance(screen, FleetView) else None

    # --- the alarm ------------------------------------------------------------------------

    def _arrivals(self, scan: FleetScan, first: bool) -> list[tuple[InboxSummary, Approval]]:
        arrived = []
        for key in scan.read:
            summary = scan.summaries[key]
            ids = {a.request_id for a in summary.approvals}
            before = self._known.get(key)
            if not first and before is not None:
                new = [a for a in summary.approvals if a.request_id not in before]
                if not new and summary.waiting > self._waiting.get(key, 0):
                    new = list(summary.approvals[-1:])  # beyond the listed ones: say so
                arrived += [(summary, a) for a in new]
            elif not first and summary.approvals:  # a new inbox file with requests waiting
                arrived += [(summary, a) for a in summary.approvals]
            self._known[key] = ids
            self._waiting[key] = summary.waiting
        for key in scan.removed:
            self._known.pop(key, None)
            self._waiting.pop(key, None)
        return arrived

    def _forget_answered(self) -> None:
        self._warned &= {(key, rid) for _, key, rid in self._deadlines}

    def _due_soon(self, now: int) -> list[tuple[InboxSummary, Approval]]:
        """Approvals that just came within WARN_SECONDS of their deadline (once each)."""
        found = []
        for due, key, rid in self._deadlines:
            if due - now > WARN_SECONDS:
                break
            if due <= now or (key, rid) in self._warned:
                continue
            self._warned.add((key, rid))
            summary = self.summaries.get(key)
            if summary is not None:
                match = [a for a in summary.approvals if a.request_id == rid]
                if match:
                    found.append((summary, match[0]))
        return found

    def approval_counts(self, now: int) -> tuple[int, int]:
        """(waiting, expiring soon) over the fleet: what the title, the header and the
        toasts say."""
        return approval_counts(self.summaries.values(), now)

    def _alarm(
        self,
        arrived: list[tuple[InboxSummary, Approval]],
        warned: list[tuple[InboxSummary, Approval]],
    ) -> None:
        if arrived:
            if len(arrived) == 1:
                summary, approval = arrived[0]
                text = (
                    f"New approval in {safe_plain(summary.name, limit=40)}: "
                    f"{safe_plain(approval.action, limit=120)}"
                )
            else:
                names = sorted({safe_plain(s.name, limit=24) for s, _ in arrived})
                text = (
                    f"{len(arrived)} new approvals in "
                    + ", ".join(names[:4])
                    + (" …" if len(names) > 4 else "")
                )
            waiting, soon = self.approval_counts(self.now())
            self.app.notify(
                f"{text}\n{approvals_phrase(waiting, soon)} in the fleet",
                title="Approval waiting",
                severity="warning",
                markup=False,
                timeout=10,
            )
        for summary, approval in warned[:3]:
            left = max(approval.due - self.now(), 0)
            self.app.notify(
                f"{safe_plain(summary.name, limit=40)}: {safe_plain(approval.request_id, limit=60)}"
                f" expires in {left // 60}m{left % 60:02d}s",
                title="Deadline close",
                severity="error",
                markup=False,
                timeout=15,
            )
        if len(warned) > 3:
            self.app.notify(
                f"{len(warned) - 3} more approvals expire within 10 minutes",
                title="Deadline close",
                severity="error",
                markup=False,
            )
        if arrived or warned:
            self.bells += 1
            self.app.bell()
        self._update_title(self.now())

    def _update_title(self, now: int) -> None:
        title = title_for(*self.approval_counts(now))
        if self.app.title == title:
            return
        self.app.title = title
        set_terminal_title(self.app, title)

    def tick(self, now: int) -> None:
        """Every second, from the app's clock: deadlines coming close, the title's count and
        the countdowns of the fleet view on screen."""
        if not self.loaded:
            return
        warned = self._due_soon(now)
        if warned:
            self._alarm([], warned)
        else:
            self._update_title(now)
        view = self.view()
        if view is not None:
            view.tick(now)


def set_terminal_title(app: Supervisor, title: str) -> None:
    """Put `title` (fixed words from `title_for`) in the terminal's title bar.

    Textual has no public call for the terminal title; this writes the standard OSC 2
    sequence through the app's driver, after removing every control character.
    """
    driver = getattr(app, "_driver", None)
    if driver is None or app.is_headless:
        return
    clean = "".join(ch for ch in title if ch.isprintable())
    driver.write(f"\x1b]2;{clean}\x07")
