"""The desk's footer (tui/footer.py): it follows the keys that apply, and only them.

Textual's Footer rebuilds itself (a widget per key, unmounted and mounted again) whenever
bindings may have changed, which the desk says after every refresh. The desk's footer
rebuilds only when the keys it shows changed, so following a commit that changes no key
costs no rebuild (it was nearly all of a refresh's CPU).
"""

from __future__ import annotations

from textual.widgets._footer import FooterKey

from onwatch.tui.app import OnwatchApp
from onwatch.tui.footer import KeysFooter

from .conftest import screen_text, started
from .test_actions import press

SIZE = (120, 40)


def keys(app) -> dict[str, bool]:
    """The footer's keys as shown: key → greyed out (Textual's FooterKey says so with a
    class, not with `disabled`)."""
    return {key.key: key.has_class("-disabled") for key in app.query(FooterKey)}


async def test_the_footer_follows_the_pane_and_what_it_holds(seeded):
    """The keys change with the pane; a key greys out when the pane empties (nothing to
    look at or mark) and comes back with a row: each time, the footer shows it."""
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert isinstance(app.query_one(KeysFooter), KeysFooter)
        assert "c" in keys(app) and "m" not in keys(app)  # Pending: cancel
        await press(pilot, "3")
        assert "m" in keys(app) and "c" not in keys(app)  # Dead: resolve, requeue
        await press(pilot, "1")
        assert keys(app)["enter"] is False and keys(app)["space"] is False
        for event in await inbox.events("pending", limit=1000):
            await inbox.cancel(event.id)  # by another hand: the desk follows the commit
        await app._refresh()
        await pilot.pause()
        assert keys(app)["enter"] is True and keys(app)["space"] is True  # nothing there
        await inbox.ingest("chat", "back", {"text": "a new one"})
        await app._refresh()
        await pilot.pause()
        assert keys(app)["enter"] is False and keys(app)["space"] is False


async def test_a_refresh_that_changes_no_key_leaves_the_footer_as_it_is(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        before = list(app.query(FooterKey))
        for n in range(5):
            await inbox.ingest("chat", f"more-{n}", {"text": "another"})  # a new row
            await app._refresh()
            await pilot.pause()
        assert "more-4" in screen_text(app)  # the refreshes were shown
        assert list(app.query(FooterKey)) == before  # the same widgets: not rebuilt
