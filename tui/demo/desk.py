"""What both demo desks (the scenario player and the live demo) add to the supervisor."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import ActiveBinding, Binding
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from .. import app as app_module
from ..app import OnwatchApp


class DemoScreen(Screen[None]):
    """The demo's main screen: the footer lists the demo's own keys before the desk's.

    The app names them in `FOOTER_FIRST` (a set of action names).
    """

    @property
    def active_bindings(self) -> dict[str, ActiveBinding]:
        bindings = super().active_bindings
        desk = self.app
        wanted = desk.FOOTER_FIRST if isinstance(desk, DemoDesk) else frozenset()
        # In the order the app declares them (priority bindings would otherwise lead).
        declared = [binding.action for binding in desk.BINDINGS if isinstance(binding, Binding)]
        first = dict(
            sorted(
                (
                    (key, active)
                    for key, active in bindings.items()
                    if active.binding.action in wanted
                ),
                key=lambda item: (
                    declared.index(item[1].binding.action)
                    if item[1].binding.action in declared
                    else len(declared)
                ),
            )
        )
        return {**first, **{k: v for k, v in bindings.items() if k not in first}}


class DemoDesk(OnwatchApp):
    """What both demo apps add to the supervisor: the viewer as actor, the one stylesheet, the
    demo screen (their keys first in the footer), and a bar of their own above the footer."""

    ACTOR = "viewer"
    FOOTER_FIRST: ClassVar[frozenset[str]] = frozenset()  # the demo's own actions
    # The supervisor's one stylesheet (a relative CSS_PATH would resolve beside this module).
    CSS_PATH = str(Path(app_module.__file__).with_name(OnwatchApp.CSS_PATH))

    def make_bar(self) -> Widget:
        """The demo's own bar, shown between the panes and the footer."""
        raise NotImplementedError

    def get_default_screen(self) -> Screen[None]:
        return DemoScreen(id="_default")

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, Footer):
                yield self.make_bar()
            yield widget
