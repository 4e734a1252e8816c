"""The confirmation dialog: what will be done, to what, and (for approvals) the time left."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from ..timefmt import WALL, Times, duration
from ..safe import join, safe_content, safe_text


@dataclass(frozen=True, slots=True)
class Subject:
    """One thing the action applies to: a safe description, and its deadline if it has one."""

    text: Text
    due: int | None = None


def time_left(due: int, now: int, times: Times = WALL) -> str:
    left = due - now
    if left <= 0:
        return f"deadline passed {duration(-left)} ago (at {times.clock(due)}): it will be refused"
    return f"time left {duration(left, precise=True)} (expires at {times.clock(due)})"


class ConfirmScreen(ModalScreen[bool]):
    """Ask before an action that cannot be undone; y or Enter confirms, n or Escape cancels."""

    BINDINGS = [
        Binding("y", "confirm", "Confirm", id="confirm-yes"),
        Binding("enter", "confirm", "Confirm", priority=True, id="confirm-enter", key_display="↵"),
        Binding("n", "cancel", "Cancel", id="confirm-no"),
        Binding("escape", "cancel", "Cancel", id="confirm-escape", key_display="esc"),
    ]
    SHOWN = 6  # subjects listed before "and N more"

    def __init__(
        self,
        question: str,
        subjects: list[Subject],
        now: int,
        note: str = "",
        where: str = "",
        times: Times = WALL,
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.times = times  # how the deadlines' instants are worded
        self.question = question
        self.where = where  # the inbox it writes to: a fleet holds many with the same ids
        self.subjects = subjects
        self.note = note
        self.now = now

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog confirm"):
            if self.where:
                yield Label(Text(self.question), classes="question -with-where")
                yield Label(join("in ", safe_text(self.where, limit=80)), classes="where")
            else:
                yield Label(Text(self.question), classes="question")
            for index, subject in enumerate(self.subjects[: self.SHOWN]):
                yield Static(subject.text, classes="subject")
                if subject.due is not None:
                    yield Label("", id=f"left-{index}", classes="time-left")
            if len(self.subjects) > self.SHOWN:
                more = len(self.subjects) - self.SHOWN
                yield Label(safe_content(f"… and {more} more"), classes="more")
            if self.note:
                yield Label(Text(self.note), classes="note")
            yield Label(join("y / ↵ ", "confirm    ", "n / esc ", "cancel"), classes="keys")

    def on_mount(self) -> None:
        self.tick(self.now)

    def tick(self, now: int) -> None:
        """Count the deadlines down while the operator thinks (the app's clock drives it)."""
        self.now = now  # kept for `on_mount`: the clock may tick between push and compose
        for index, subject in enumerate(self.subjects[: self.SHOWN]):
            if subject.due is not None:
                for label in self.query(f"#left-{index}").results(Label):
                    label.update(time_left(subject.due, now, self.times))
                    label.set_class(subject.due <= now, "-late")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)
