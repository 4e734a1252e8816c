"""An at-most-once send cut off mid-send shows as uncertain in the outbox pane, and an
operator settles it (mark sent / send again), conditionally and audited."""

from __future__ import annotations

import asyncio

import pytest

from onwatch.tui import operator
from onwatch.tui.app import OnwatchApp

from .conftest import screen_text, started, wait_for_text

SIZE = (160, 48)


async def _cut_off(inbox, clock) -> int:
    """Queue a message and cut its at-most-once send off mid-send; return the delivery."""
    await inbox.configure(delivery="at_most_once", send_timeout=30)
    await inbox.release_outbox()

    async def crash(text):
        raise asyncio.CancelledError  # the dispatcher dies mid-send

    with pytest.raises(asyncio.CancelledError):
        await inbox.flush_outbox(crash)
    clock.advance(31)
    [delivery] = await inbox.uncertain_deliveries()
    return delivery.id


async def test_the_outbox_pane_shows_an_uncertain_send(seeded):
    inbox, clock, _ = seeded
    delivery_id = await _cut_off(inbox, clock)
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("6")
        await wait_for_text(pilot, "1 UNCERTAIN send")
        assert f"#{delivery_id}" in screen_text(app)
        assert "uncertai" in screen_text(app)  # the status column (cut at its width)


async def test_operator_settles_an_uncertain_send_once(seeded):
    inbox, clock, _ = seeded
    delivery_id = await _cut_off(inbox, clock)
    now = clock.now()
    first = await operator.delivery_action(inbox, "mark_sent", delivery_id, now=now, actor="ann")
    assert first.applied and "marked sent" in first.text
    again = await operator.delivery_action(inbox, "send_again", delivery_id, now=now, actor="bob")
    assert not again.applied and "it is sent now, not uncertain" in again.text
    assert (await inbox.overview()).uncertain_deliveries == 0
    [entry, earlier] = await inbox.audit(target=f"delivery {delivery_id}", limit=2)
    assert (earlier.actor, earlier.applied, entry.actor, entry.applied) == (
        "ann",
        True,
        "bob",
        False,
    )


@pytest.mark.parametrize("key, word", [("x", "marked sent"), ("A", "held again")])
async def test_the_outbox_pane_settles_the_oldest_uncertain_send_by_key(seeded, key, word):
    inbox, clock, _ = seeded
    delivery_id = await _cut_off(inbox, clock)
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("6")
        await wait_for_text(pilot, "1 UNCERTAIN send")
        await pilot.press(key)
        await wait_for_text(pilot, f"send #{delivery_id}")  # the confirmation names it
        await pilot.press("y")
        await wait_for_text(pilot, word)
    assert (await inbox.overview()).uncertain_deliveries == 0
    [entry] = await inbox.audit(target=f"delivery {delivery_id}", limit=1)
    assert entry.applied and entry.before == "uncertain"
