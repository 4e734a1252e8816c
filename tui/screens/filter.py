"""The filter dialog: text to match in the focused pane (empty clears the filter)."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class FilterScreen(ModalScreen[str | None]):
    """Enter applies (an empty text clears the filter); Escape keeps the old one."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="filter-cancel", key_display="esc")]

    def __init__(self, pane_title: str, current: str | None, hint: str) -> None:
        super().__init__(classes="dialog-screen")
        self.pane_title = pane_title
        self.current = current or ""
        self.hint = hint

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog filter"):
            yield Label(Text(f"Filter {self.pane_title}"), classes="question")
            yield Input(value=self.current, placeholder="text to match", id="filter-input")
            yield Label(Text(self.hint), classes="note")
            yield Label("↵ apply (empty clears)    esc cancel", classes="keys")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_key(self, event: events.Key) -> None:
        if not self.query_one(Input).has_focus:
            self.type_ahead(event)

    def type_ahead(self, event: events.Key) -> None:
        """Keys typed ahead of the dialog (a paste: "/chat" arrives as five keys, the last
        four queued before the dialog is up) go into the input, in order, never lost and
        never taken for the pane's keys (`c` would have opened a cancel dialog)."""
        field = self.query_one(Input)
        # The input's own enter also reaches here (its binding runs at the app): only an
        # enter typed ahead, before the input had the focus, submits from here.
        if event.key == "enter" and not field.has_focus:
            event.stop()
            self.dismiss(field.value)
        elif event.is_printable and event.character:
            event.stop()
            field.insert_text_at_cursor(event.character)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
