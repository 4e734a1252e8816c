"""Spend on the desk: the status strip's budget figure, badge and daily sparkline; raising the
spend budget with B (the dialog, a refused value, the confirmation, the audit entry, a change
made meanwhile reported and not overwritten); read-only offers no B; the fleet desk's spend
column; a finished event's detail shows each attempt's spend and transcript; /metrics."""

from __future__ import annotations

from textual.widgets import Input, Sparkline

from onwatch.core import FakeClock, Inbox
from onwatch.core.fleet import FolderFleet
from onwatch.core.metrics import InboxMetrics
from onwatch.tui.app import OnwatchApp
from onwatch.tui.fleet import FleetScreen
from onwatch.tui.screens.budget import BudgetScreen
from onwatch.tui.screens.confirm import ConfirmScreen
from onwatch.tui.screens.detail import load_detail

from tests.metrics.helpers import samples, value
from tests.tui.conftest import screen_text, started, wait_for, wait_for_text

T = 1_000_000 - 1_000_000 % 86_400 + 43_200  # noon UTC: one UTC day
SIZE = (120, 40)


async def spent_inbox(path: str, clock: FakeClock, amount_micros: int = 1_200_000) -> Inbox:
    """An inbox with max_spend_per_day usd 1 and one run that spent `amount_micros` today,
    after one that spent 0.3 yesterday; an event waits."""
    inbox = await Inbox.open(path, clock=clock)
    await inbox.configure(max_spend_per_day={"usd": 1})
    for source_id, at, micros in (("y", T - 86_400, 300_000), ("t", T, amount_micros)):
        clock.set(at)
        await inbox.ingest("chat", source_id, {})
        gen = await inbox.acquire("w")
        [event] = await inbox.claim_batch("w", gen)
        await inbox.append_transcript(
            event.run_id,
            [
                (0, at, "log", None, f"working on {source_id}", None),
                (1, at, "spend", None, f"spent {micros / 1e6:g} usd: model", None),
            ],
            spends=[(1, at, "usd", micros, "model")],
        )
        await inbox.finish(
            "w", gen, [event.id], error="boom" if source_id == "t" else None, run=event.run_id
        )
        await inbox.release("w", gen)
    await inbox.ingest("chat", "waiting", {})
    return inbox


async def test_the_strip_shows_the_spend_and_b_raises_the_budget(tmp_path):
    clock = FakeClock(T)
    inbox = await spent_inbox(str(tmp_path / "inbox.db"), clock)
    try:
        app = OnwatchApp(inbox, actor="ana")  # the person at the keys, as audited
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            text = screen_text(app)
            assert "budgets: spent 24h 1.2/1 usd" in text
            assert "BUDGET REACHED · B raises" in text
            spark = app.query_one("#spend", Sparkline)
            assert spark.display and list(spark.data)[-2:] == [0.3, 1.2]
            await pilot.press("B")
            await wait_for(pilot, lambda: isinstance(app.screen, BudgetScreen), what="the dialog")
            assert (
                "max_spend_per_day usd: 1.2 usd of 1 usd in the last 24 h (reached"
                in screen_text(app)
            )
            field = app.screen.query_one(Input)
            assert field.value == "2"  # twice the limit, to start from
            field.value = "0.5"
            await pilot.press("enter")
            await wait_for_text(pilot, "0.5 usd would not raise it (it is 1 usd)")
            field.value = "3"
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            assert "Raise max_spend_per_day usd from 1 usd to 3 usd?" in screen_text(app)
            await pilot.press("y")
            await wait_for_text(pilot, "raised max_spend_per_day usd: 1 usd → 3 usd")
            await wait_for(
                pilot,
                lambda: "BUDGET REACHED" not in screen_text(app),
                what="the badge to go",
            )
            assert "spent 24h 1.2/3 usd" in screen_text(app)
        [entry] = await inbox.audit(target="max_spend_per_day usd")
        assert (entry.action, entry.actor, entry.before, entry.after, entry.applied) == (
            "raise_budget",
            "ana",
            "1 usd",
            "3 usd",
            True,
        )
        assert inbox.settings.max_spend_per_day == {"usd": 3}
    finally:
        await inbox.close()


async def test_a_raise_made_meanwhile_is_reported_not_overwritten(tmp_path):
    clock = FakeClock(T)
    path = str(tmp_path / "inbox.db")
    inbox = await spent_inbox(path, clock)
    try:
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            await pilot.press("B")
            await wait_for(pilot, lambda: isinstance(app.screen, BudgetScreen), what="the dialog")
            async with await Inbox.open(path, create=False, clock=clock) as other:
                assert await other.raise_budget("max_spend_per_day", 5, unit="usd", actor="bo")
            await pilot.press("enter")  # 2 usd, as proposed
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            await pilot.press("y")
            await wait_for_text(pilot, "not raised: changed meanwhile: it is 5 usd now, not 1 usd")
        assert inbox.settings.max_spend_per_day == {"usd": 5}
    finally:
        await inbox.close()


async def test_read_only_offers_no_raise_and_an_inbox_without_budget_none_either(tmp_path):
    clock = FakeClock(T)
    inbox = await spent_inbox(str(tmp_path / "inbox.db"), clock)
    try:
        app = OnwatchApp(inbox, read_only=True)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            await pilot.press("B")
            await pilot.pause()
            assert not isinstance(app.screen, BudgetScreen)
        await inbox.configure(max_spend_per_day=None)
        app = OnwatchApp(inbox)
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            assert "BUDGET" not in screen_text(app)
            assert app.query_one("#spend", Sparkline).display  # it spent: the sparkline stays
            await pilot.press("B")
            await pilot.pause()
            assert not isinstance(app.screen, BudgetScreen)
    finally:
        await inbox.close()


async def test_a_finished_events_detail_shows_each_attempts_spend_and_transcript(tmp_path):
    clock = FakeClock(T)
    inbox = await spent_inbox(str(tmp_path / "inbox.db"), clock)
    try:
        detail = await load_detail(inbox, await inbox.get_event(2), clock.now())
        body = detail.body.plain
        assert "spent 1.2 usd" in body
        assert "working on t" in body and "spend   spent 1.2 usd: model" in body
        assert body.index("working on t") > body.index("→ error")
        assert detail.follow is None
    finally:
        await inbox.close()


async def test_the_fleet_shows_a_spend_column_once_an_inbox_spends(tmp_path):
    folder = tmp_path / "agents"
    folder.mkdir()
    clock = FakeClock(T)
    await (await spent_inbox(str(folder / "alice.db"), clock)).close()
    await (await Inbox.open(str(folder / "bob.db"), clock=clock)).close()
    app = OnwatchApp(None, clock=clock, fleet=FolderFleet(str(folder), label="agents"))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, FleetScreen) and app.fleet_desk.loaded,
            what="the fleet",
        )
        await pilot.pause()
        text = screen_text(app)
        assert "spend/d" in text
        rows = {
            line.split()[0]: line
            for line in text.splitlines()
            if line.split()[:1] in (["alice"], ["bob"])
        }
        assert "1.2 usd!" in rows["alice"]  # reached its budget: runs wait
        assert "usd" not in rows["bob"]
    if app.inbox is not None:
        await app.inbox.close()


async def test_metrics_show_the_spend_per_unit(tmp_path):
    clock = FakeClock(T)
    inbox = await spent_inbox(str(tmp_path / "alice.db"), clock)
    try:
        body, _ = await InboxMetrics(inbox, process=False).render()
        found = samples(body.decode())
        assert value(found, "onwatch_spend_total", inbox="alice", unit="usd") == 1.5
        assert value(found, "onwatch_spend_last_day", inbox="alice", unit="usd") == 1.2
        assert value(found, "onwatch_spend_budget", inbox="alice", unit="usd") == 1.0
    finally:
        await inbox.close()
