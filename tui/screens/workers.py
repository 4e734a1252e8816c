"""Who watches this inbox: the worker processes, the lease holder first, then those standing
by, each with its host, pid, since when it runs and when it was last seen."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from onwatch.core import Lease, Worker

from ..safe import safe_text
from ..timefmt import WALL, Times, duration


def worker_role(worker: Worker, now: int, lease_ttl: int) -> str:
    """'lease holder · gen N', 'standing by', or 'gone? no heartbeat' for a process not
    seen for two lease TTLs (it died without saying so)."""
    if worker.holds:
        return f"lease holder · gen {worker.gen}"
    if now - worker.seen > 2 * lease_ttl:
        return "gone? no heartbeat"
    return "standing by"


def workers_table(
    workers: list[Worker], lease: Lease | None, now: int, lease_ttl: int, times: Times = WALL
) -> Table:
    """The workers as a table of safe Text, the lease holder first."""
    table = Table(box=None, padding=(0, 1), expand=True, show_edge=False)
    table.add_column("worker", ratio=2, no_wrap=True, overflow="ellipsis", min_width=10)
    table.add_column("role", no_wrap=True, min_width=20)
    table.add_column("host", ratio=1, no_wrap=True, overflow="ellipsis", min_width=8)
    table.add_column("pid", no_wrap=True, justify="right")
    table.add_column("since", no_wrap=True)
    table.add_column("seen", no_wrap=True)
    ordered = sorted(workers, key=lambda w: (not w.holds, w.started, w.holder))
    for worker in ordered:
        since = worker.since if worker.holds and worker.since is not None else worker.started
        table.add_row(
            safe_text(worker.holder, limit=120, style="bold" if worker.holds else ""),
            Text(worker_role(worker, now, lease_ttl)),
            safe_text(worker.host, limit=120),
            Text(str(worker.pid)),
            Text(times.clock(since)),
            Text(f"{duration(max(now - worker.seen, 0))} ago"),
        )
    if lease is not None and lease.until >= now and not any(w.holds for w in workers):
        # A holder that records no heartbeat (an older worker, or a program of its own).
        table.add_row(
            safe_text(lease.holder, limit=120, style="bold"),
            Text(f"lease holder · gen {lease.gen}"),
            Text("?"),
            Text("?"),
            Text(""),
            Text(""),
        )
    return table


class WorkersScreen(ModalScreen[None]):
    """The worker processes of the inbox shown; Escape or W closes."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="workers-close", key_display="esc"),
        Binding("W", "close", "Close", show=False, id="workers-close-w"),
    ]

    def __init__(
        self, workers: list[Worker], lease: Lease | None, now: int, lease_ttl: int, times: Times
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.seen = workers
        self.lease = lease
        self.at = now
        self.lease_ttl = lease_ttl
        self.times = times

    def compose(self) -> ComposeResult:
        standing = sum(1 for w in self.seen if not w.holds)
        with Vertical(classes="dialog workers"):
            yield Label(
                Text(f"Workers · {len(self.seen)} seen, {standing} not holding the lease"),
                classes="question",
            )
            with VerticalScroll():
                if self.seen or self.lease is not None:
                    yield Static(
                        workers_table(self.seen, self.lease, self.at, self.lease_ttl, self.times)
                    )
                else:
                    yield Label("No worker has been seen: nothing watches this inbox.")
            yield Label("esc close", classes="keys")

    def action_close(self) -> None:
        self.dismiss(None)
