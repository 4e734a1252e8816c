"""The status strip: the lease (holder, generation, time left), takeovers, refused stale
writes, the paused / outbox-held badges, a sparkline of the last hour's runs and how fresh
the view is. Always visible."""

from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label, Sparkline

from onwatch.core import Overview, Spending
from onwatch.core.fleet import run_buckets

from ..safe import join, safe_text
from ..timefmt import duration

RUN_BUCKETS = 12  # five-minute bars: the last hour
SPEND_DAYS = 14  # daily bars of what the inbox spent


def lease_line(overview: Overview | None, now: int) -> Text:
    """'lease worker-a · gen 3 · 1m52s left', or 'expired 12s ago' once it lapsed."""
    if overview is None:
        return Text("reading the inbox…")
    lease = overview.lease
    if lease is None:
        head = join("lease: none yet (no worker has started)")
    else:
        left = lease.until - now
        if left >= 0:
            when = f"{duration(left, precise=True)} left"
        elif overview.lease_released:  # handed back (a clean stop): nobody died
            when = f"released {duration(max(-left - 1, 0))} ago"
        else:
            when = f"expired {duration(-left)} ago"
        head = join(
            "lease ", safe_text(lease.holder, limit=24, style="bold"), f" gen {lease.gen} · {when}"
        )
    pending = overview.counts.get("pending", 0)
    if pending and (lease is None or lease.until < now):
        # Work waits and nobody holds the lease: nothing will run it (as the fleet says).
        head.append(f" · no worker runs the {pending:,} pending", style="bold")
    return head


def fencing_line(overview: Overview | None) -> Text:
    """'takeovers 2 · refused stale writes 1': how often the lease changed hands by force,
    and how many late writes of a lost generation the fence turned away."""
    if overview is None:
        return Text("")
    # Only a lease left to expire counts: a worker that released it on a clean stop and
    # its successor are a restart, not a takeover.
    text = Text(f"takeovers {overview.takeovers} · ")
    text.append(
        f"refused stale writes {overview.refused_writes}",
        style="bold" if overview.refused_writes else "",
    )
    return text


def budget_line(overview: Overview | None) -> str:
    """The budgets that are set, as 'runs today 14/100 · pending 5/1,000'."""
    if overview is None:
        return ""
    parts = []
    runs = overview.budgets.get("max_runs_per_day", {})
    if runs.get("limit"):
        parts.append(f"runs today {runs.get('used', 0):,}/{runs['limit']:,}")
    pending = overview.budgets.get("max_pending", {})
    if pending.get("limit"):
        parts.append(f"pending {pending.get('used', 0):,}/{pending['limit']:,}")
    spend = overview.budgets.get("max_spend_per_day", {})
    for unit, limit in sorted((spend.get("limit") or {}).items()):
        used = (spend.get("used") or {}).get(unit, 0)
        parts.append(f"spent 24h {_amount(used)}/{_amount(limit)} {unit}")
    for name, words in (
        ("max_run_seconds", "run ≤ {}s"),
        ("max_followups_per_run", "≤ {} follow-ups"),
    ):
        limit = overview.budgets.get(name, {}).get("limit")
        if limit:
            parts.append(words.format(limit))
    return ("budgets: " + " · ".join(parts)) if parts else ""


def _amount(value: float) -> str:
    return f"{value:,.6f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value):,}"


def reached(overview: Overview | None) -> list[str]:
    """The delaying budgets used up now (runs wait for them): 'runs per day', 'usd'…"""
    if overview is None:
        return []
    found = []
    runs = overview.budgets.get("max_runs_per_day", {})
    if runs.get("limit") and runs.get("used", 0) >= runs["limit"]:
        found.append("runs per day")
    spend = overview.budgets.get("max_spend_per_day", {})
    for unit, limit in sorted((spend.get("limit") or {}).items()):
        if (spend.get("used") or {}).get(unit, 0) >= limit:
            found.append(f"{unit} per day")
    return found


def spend_days(spending: Spending | None) -> tuple[str, list[float]] | None:
    """The unit the strip's spend sparkline shows (a budgeted one first) and its daily
    amounts, oldest first; None while nothing was spent or budgeted."""
    if spending is None or not spending.units:
        return None
    unit = spending.units[0]
    days = spending.per_day.get(unit, (0,) * spending.days)
    return unit, [micros / 1_000_000 for micros in days]


class StatusStrip(Vertical):
    """Two lines: the lease and its history counters; badges, budgets and freshness."""

    def __init__(self, path: str, *, read_only: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.path = path
        self.read_only = read_only
        self.overview: Overview | None = None
        self.updated_at: int | None = None
        self.problem: str | None = None
        self.alarm: str | None = None  # the file is no longer the one opened: standing
        self._shown: dict[str, Text | str] = {}  # what each ticking label shows now
        self.activity: tuple[tuple[int, int, int], ...] = ()  # (minute, runs, failed)
        self.spending: Spending | None = None
        self._minute: int | None = None

    def compose(self) -> ComposeResult:
        yield Label("", id="alarm")
        with Horizontal(classes="status-line"):
            yield Label("", id="lease")
            # What the inbox spent per day (the last SPEND_DAYS), once it spent anything.
            yield Label("", id="spend-label")
            yield Sparkline([0] * SPEND_DAYS, id="spend")
            yield Label("", id="fencing")
        with Horizontal(classes="status-line"):
            # The key that undoes the state is on the badge: p and o left the footer.
            yield Label("PAUSED · p resumes", id="paused", classes="badge")
            yield Label("OUTBOX HELD · o releases", id="held", classes="badge")
            yield Label("READ-ONLY", id="read-only", classes="badge")
            # A delaying budget used up: runs wait until the window frees or it is raised.
            yield Label("", id="over-budget", classes="badge")
            # Another process's read keeps the store from cleaning up (Inbox.held_back).
            yield Label("CLEANUP HELD BACK", id="held-back", classes="badge")
            yield Label("", id="budgets")
            # Runs of the last hour, as on the inbox's fleet row: a stall or failures show.
            yield Label("runs/h", id="runs-label")
            yield Sparkline([0] * RUN_BUCKETS, id="runs")
            yield Label(safe_text(os.path.basename(self.path), limit=30), id="file")
            yield Label("", id="updated")

    def on_mount(self) -> None:
        self.query_one("#read-only").display = self.read_only
        self.query_one("#alarm").display = False
        self.query_one("#spend-label").display = False
        self.query_one("#spend").display = False
        self.tick(0)

    def raise_alarm(self, why: str | None) -> None:
        """Show (or, with None, take down) the standing alarm over everything else."""
        self.alarm = why
        label = self.query_one("#alarm", Label)
        label.display = why is not None
        if why is not None:
            label.update(
                join(
                    "⚠ ",
                    safe_text(why, limit=200),
                    " · every action is refused · R reopens the path",
                )
            )
        self.set_class(why is not None, "-alarm")

    def show_held_back(self, why: str | None) -> None:
        """Show (or, with None, take down) the held-back badge; `why` is its tooltip."""
        badge = self.query_one("#held-back", Label)
        badge.display = why is not None
        badge.tooltip = None if why is None else safe_text(why, limit=500)

    def show(
        self,
        overview: Overview,
        now: int,
        updated_at: int | None,
        problem: str | None = None,
        activity: tuple[tuple[int, int, int], ...] | None = None,
        spending: Spending | None = None,
    ) -> None:
        """Show a fresh overview (attributes down from the app), the runs of the last hour
        per minute (`core.fleet.run_activity`) and the spend per day, when they were read."""
        if activity is not None:
            self.activity = activity
            self._minute = None
        if spending is not None:
            self.spending = spending
            days = spend_days(spending)
            self.query_one("#spend-label").display = days is not None
            self.query_one("#spend").display = days is not None
            if days is not None:
                unit, amounts = days
                self.query_one("#spend-label", Label).update(f"{unit}/day")
                self.query_one("#spend", Sparkline).data = amounts
        self.overview = overview
        self.updated_at = updated_at
        self.problem = problem
        self.query_one("#paused").display = overview.paused
        self.query_one("#held").display = overview.outbox_held
        self.query_one("#budgets", Label).update(budget_line(overview))
        over = reached(overview)
        badge = self.query_one("#over-budget", Label)
        badge.display = bool(over)
        if over:
            badge.update("BUDGET REACHED · B raises")
            badge.tooltip = f"used up: {', '.join(over)}; runs wait until the window frees"
        self.query_one("#fencing", Label).update(fencing_line(overview))
        self.tick(now)

    def _put(self, label_id: str, content: Text | str) -> None:
        """Update a label only when its text changed: an unchanged second redraws nothing."""
        if self._shown.get(label_id) == content:
            return
        self._shown[label_id] = content
        self.query_one(f"#{label_id}", Label).update(content)

    def tick(self, now: int) -> None:
        """Redraw what the clock moves: lease time left and 'updated Ns ago'."""
        overview = self.overview
        self._put("lease", lease_line(overview, now))
        expired = (
            overview is not None
            and overview.lease is not None
            and overview.lease.until < now
            and not overview.lease_released
        )
        unserved = (
            overview is not None
            and bool(overview.counts.get("pending", 0))
            and (overview.lease is None or overview.lease.until < now)
        )
        self.set_class(expired or unserved, "-lease-expired")
        if self.alarm:  # the rows shown are a lost file's: never "updated 0s ago"
            self._put("updated", "not the file at the path")
        elif self.problem:
            self._put("updated", safe_text(self.problem, limit=60))
        elif self.updated_at is None:
            self._put("updated", "loading…")
        else:
            self._put("updated", f"updated {duration(max(now - self.updated_at, 0))} ago")
        self.set_class(bool(self.problem or self.alarm), "-problem")
        if now // 60 != self._minute:  # the buckets move by the minute
            self._minute = now // 60
            runs, failed = run_buckets(self.activity, now, RUN_BUCKETS)
            spark = self.query_one("#runs", Sparkline)
            if spark.data != runs:
                spark.data = runs
            spark.set_class(bool(failed), "-failing")
