"""The seven panes of the supervisor TUI, one module each, plus the status strip and pane bar."""

from .approvals import ApprovalsPane
from typing import Any

from .base import Pane, PaneData, Window
from .dead import DeadPane
from .done import DonePane
from .outbox import OutboxPane
from .pending import PendingPane
from .running import RunningPane
from .timers import TimersPane

PANES: tuple[type[Pane[Any]], ...] = (
    PendingPane,
    RunningPane,
    DeadPane,
    ApprovalsPane,
    TimersPane,
    OutboxPane,
    DonePane,
)

__all__ = [
    "PANES",
    "ApprovalsPane",
    "DeadPane",
    "DonePane",
    "OutboxPane",
    "Pane",
    "PaneData",
    "PendingPane",
    "RunningPane",
    "TimersPane",
    "Window",
]
