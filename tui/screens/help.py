"""The help dialog, generated from the same bindings the footer and the command palette read."""

from __future__ import annotations

from typing import Callable, Iterable

from rich.console import RenderableType

from rich.console import Group as RenderGroup
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Label, Static

# One group per heading: (heading, [(binding, available?)]).
Group = tuple[str, list[tuple[Binding, bool]]]
# How the app shows a binding's key when it names no `key_display` (App.get_key_display).
KeyDisplay = Callable[[Binding], str]


def key_name(binding: Binding, app_key_display: KeyDisplay) -> str:
    return binding.key_display or app_key_display(binding)


def render_groups(
    groups: Iterable[Group], key_display: KeyDisplay, notes: list[str]
) -> RenderGroup:
    """Per group a heading and a grid of key, name and what it does; notes below."""
    parts: list[RenderableType] = []
    for heading, bindings in groups:
        if not bindings:
            continue
        parts.append(Text(heading, style="bold"))
        table = Table.grid(padding=(0, 1))
        table.add_column(width=7, no_wrap=True)
        table.add_column(width=18, no_wrap=True)
        table.add_column(ratio=1)
        for binding, available in bindings:
            style = "" if available else "dim"
            what = binding.tooltip + ("" if available else " (not in read-only mode)")
            table.add_row(
                Text("  " + key_name(binding, key_display), style=style),
                Text(binding.description, style=style),
                Text(what, style=style),
            )
        parts += [table, Text("")]
    parts += [Text(note, style="italic") for note in notes]
    return RenderGroup(*parts)


class HelpScreen(ModalScreen[None]):
    """Every key of every pane, with what it does; Escape, q or ? closes it."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="help-close", key_display="esc"),
        Binding("question_mark", "close", "Close", show=False, id="help-close-question"),
        Binding("q", "close", "Close", show=False, id="help-close-q"),
    ]

    def __init__(self, body: RenderGroup) -> None:
        super().__init__(classes="dialog-screen")
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Label(Text("onwatch keys"), classes="question")
            with VerticalScroll(id="help-scroll"):
                yield Static(self.body, id="help-body")
            yield Label("esc close    ctrl+p command palette", classes="keys")

    def on_mount(self) -> None:
        self.query_one("#help-scroll").focus()

    def action_close(self) -> None:
        self.dismiss(None)
