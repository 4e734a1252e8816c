"""The pane bar: the seven panes with their keys and counts; click or press 1–7 to switch."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.events import Click
from textual.message import Message
from textual.widgets import Label


class PaneTab(Label):
    """One pane's name, key and count."""

    def __init__(self, pane_id: str, key: str, name: str) -> None:
        super().__init__(f"{key} {name}", id=f"tab-{pane_id}", classes="tab")
        self.pane_id = pane_id
        self.key = key
        self.pane_name = name

    def show_count(self, count: str) -> None:
        self.update(f"{self.key} {self.pane_name} {count}")

    def on_click(self, event: Click) -> None:
        event.stop()
        self.post_message(PaneBar.Chosen(self.pane_id))


class PaneBar(Horizontal):
    """A row of pane tabs; the active one is highlighted with the `-active` class."""

    class Chosen(Message):
        """The operator clicked a tab."""

        def __init__(self, pane_id: str) -> None:
            super().__init__()
            self.pane_id = pane_id

    def __init__(self, panes: list[tuple[str, str, str]], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._panes = panes

    def compose(self) -> ComposeResult:
        for pane_id, key, name in self._panes:
            yield PaneTab(pane_id, key, name)

    def show_counts(self, counts: dict[str, str]) -> None:
        for tab in self.query(PaneTab):
            if tab.pane_id in counts:
                tab.show_count(counts[tab.pane_id])

    def activate(self, pane_id: str) -> None:
        for tab in self.query(PaneTab):
            tab.set_class(tab.pane_id == pane_id, "-active")
