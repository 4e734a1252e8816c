"""The desk's footer: Textual's, rebuilt only when the keys it shows changed.

Textual's Footer recomposes (unmounts and mounts a widget per key) whenever anything calls
refresh_bindings, which the desk does after every refresh (and when the cursor moves) so
that a key that stopped applying greys out. Most refreshes change no key: a worker renewing
its lease moves the inbox, the desk reads it again, and the same keys are shown. That
recompose was two thirds of a refresh's CPU (a refresh and its screen update: 28 ms with
it, 9.5 ms without), paid on every commit the desk follows.
"""

from __future__ import annotations

from typing import Hashable

from textual.widgets import Footer


class KeysFooter(Footer):
    """A Footer that recomposes only when what it would show differs from what it shows."""

    def __init__(self) -> None:
        super().__init__()
        self._shown: tuple[Hashable, ...] | None = None

    def shown_keys(self) -> tuple[Hashable, ...]:
        """What Footer.compose reads: each active key, its binding (action, description,
        group, whether shown) and whether it applies now; and the palette's key."""
        return (
            self.show_command_palette,
            *(
                (key, active.binding, active.enabled, active.tooltip)
                for key, active in self.screen.active_bindings.items()
            ),
        )

    async def recompose(self) -> None:
        # Footer.bindings_changed schedules this after the screen's next refresh, where
        # compose would read the bindings anyway: read them here first, and stop if the same.
        if not self.is_attached:
            return
        keys = self.shown_keys()
        if keys == self._shown:
            return
        self._shown = keys
        await super().recompose()
