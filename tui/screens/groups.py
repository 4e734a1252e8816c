"""Dead events grouped by error: one line per first line of an error, largest group first;
Enter (or r) asks to requeue the whole group shown, Escape closes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from onwatch.core import DeadGroup

from ..safe import join, safe_text


class GroupsScreen(ModalScreen[DeadGroup | None]):
    """Pick a group of dead events (the app confirms, naming the count, and requeues it)."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="groups-close", key_display="esc"),
        Binding(
            "r",
            "pick",
            "Requeue group",
            id="groups-requeue",
            tooltip="requeue every event of the highlighted group (confirmed)",
        ),
    ]

    def __init__(self, groups: list[DeadGroup], *, read_only: bool = False) -> None:
        super().__init__(classes="dialog-screen")
        self.groups = groups
        self.read_only = read_only

    def compose(self) -> ComposeResult:
        total = sum(g.count for g in self.groups)
        with Vertical(classes="dialog groups"):
            yield Label(
                Text(f"Dead events by error · {total:,} in {len(self.groups):,} groups"),
                classes="question",
            )
            if self.groups:
                yield OptionList(
                    *(
                        Option(
                            join(
                                Text(f"{g.count:>6,}  ", style="bold"),
                                safe_text(g.line or "(no error)", limit=300),
                            ),
                            id=str(index),
                        )
                        for index, g in enumerate(self.groups)
                    ),
                    id="groups-list",
                )
            else:
                yield Label("No dead events.", classes="note")
            yield Label(
                "esc close" if self.read_only else "↵ or r requeue the group    esc close",
                classes="keys",
            )

    def on_mount(self) -> None:
        if self.groups:
            self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._pick(event.option_index)

    def action_pick(self) -> None:
        if self.groups:
            index = self.query_one(OptionList).highlighted
            self._pick(0 if index is None else index)

    def _pick(self, index: int) -> None:
        if not self.read_only and 0 <= index < len(self.groups):
            self.dismiss(self.groups[index])

    def action_close(self) -> None:
        self.dismiss(None)
