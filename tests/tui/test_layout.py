"""How columns share the width (tui/panes/layout.py), figure by figure, and the ids shortened
in the middle; then the panes at 80 columns, as the issue found them."""

from __future__ import annotations

from rich.text import Text

from onwatch.core import FakeClock, Inbox
from onwatch.tui.app import OnwatchApp
from onwatch.tui.panes.layout import Column, fit, middle
from onwatch.tui.safe import safe_text

from .conftest import T0, screen_text, started, wait_for

PENDING = (
    Column("id", "id", 7, narrow=5),
    Column("source", "source", 12, narrow=7, rank=3),
    Column("source_id", "source id", 22, narrow=11, rank=2, middle=True),
    Column("age", "age", 7, narrow=6, ticking=True, rank=4),
    Column("error", "last error", 20, narrow=12, fill=True, rank=1),
)


def test_an_empty_fill_column_keeps_its_heading_and_the_ids_take_the_room():
    widths = fit(PENDING, 54, {"id": 2, "source": 7, "source_id": 16})
    assert widths["source_id"] == 16  # whole, before the empty column gets a cell more
    assert widths["error"] == len("last error")
    assert sum(w + 2 for w in widths.values()) == 54
    roomy = fit(PENDING, 70, {"id": 2, "source": 7, "source_id": 16})
    assert roomy["source_id"] == 16 and sum(w + 2 for w in roomy.values()) == 70


def test_a_fill_column_with_text_grows_before_the_ids_and_takes_what_is_left():
    held = {"id": 2, "source": 7, "source_id": 16, "error": 55}
    widths = fit(PENDING, 60, held)  # 9 cells to spare: the error's comfort first
    assert (widths["error"], widths["source_id"]) == (20, 12)
    widths = fit(PENDING, 100, held)  # room: the id whole, the rest to the error
    others = sum(w for k, w in widths.items() if k != "error")
    assert widths["source_id"] == 16 and widths["error"] == 100 - 10 - others


def test_columns_give_way_by_importance_an_empty_one_first():
    columns = (
        Column("id", "id", 5),
        Column("reason", "reason", 40, narrow=28, fill=True, rank=1),
        Column("source", "source", 10, narrow=7, rank=3),
        Column("tries", "tries", 5, rank=5),
        Column("since", "since", 7, ticking=True, rank=4),
        Column("note", "note", 10, rank=2),
    )
    held = {"id": 1, "reason": 50, "source": 6, "tries": 3, "since": 5}
    widths = fit(columns, 54, held)
    assert widths["note"] == 0  # empty: gave way first, though ranked above tries
    assert widths["tries"] == 0 and widths["since"] == 0  # then the least important
    assert widths["source"] and widths["reason"] >= 28  # what matters stayed
    assert fit(columns, 200, held)["note"] == len("note")  # room: all shown


def test_rank_0_columns_never_give_way():
    columns = (Column("a", "a", 30), Column("b", "b", 30, rank=1))
    widths = fit(columns, 20, {"a": 30, "b": 30})
    assert widths["a"] == 30 and widths["b"] == 0


def test_middle_keeps_the_distinguishing_end():
    assert middle(Text("gh-delivery-4411"), 11).plain == "gh-de…-4411"
    assert middle(Text("msg-12"), 11).plain == "msg-12"
    assert middle(Text("daily-digest@1699920000"), 11).plain == "daily…20000"
    assert middle(Text("日本語の長いイベント番号"), 9).cell_len <= 9  # wide characters
    hostile = middle(safe_text("[@click=app.quit]x[/]\x1b"), 11)
    assert hostile.cell_len == 11 and hostile.plain.endswith("\\x1b")
    assert any(span.style == "reverse" for span in hostile.spans)  # the escape stays marked


async def test_at_80_columns_the_source_ids_keep_their_ends_and_an_empty_error_gives_way(
    tmp_path,
):
    """Three webhook deliveries named alike up to their end, no error: at 80×24 each id
    is told apart, and 'last error' keeps no more than its heading."""
    clock = FakeClock(T0)
    async with await Inbox.open(str(tmp_path / "i.db"), clock=clock) as inbox:
        for tail in ("7f3a91c2", "7f3b02d9", "7f4c77e1"):
            await inbox.ingest("webhook", f"github-delivery-{tail}", {"n": 1}, now=T0)
        app = OnwatchApp(inbox, clock=clock)
        async with app.run_test(size=(80, 24)) as pilot:
            await started(app, pilot)
            pane = app.pane("pending")
            await wait_for(pilot, lambda: len(pane._records) == 3, what="the rows")
            text = screen_text(app)
            for tail in ("7f3a91c2", "7f3b02d9", "7f4c77e1"):
                assert tail in text, text
            assert pane._widths["error"] == len("last error")


async def test_at_80_columns_the_dead_pane_keeps_what_the_event_is_and_its_reason(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox, clock=clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        await pilot.press("3")
        pane = app.pane("dead")
        await wait_for(pilot, lambda: len(pane._records) == 2, what="the dead rows")
        await pilot.pause()
        assert pane._shown == ("id", "state", "error", "source", "source_id")
        assert pane._widths["error"] >= 28
        text = screen_text(app)
        assert "stripe" in text and "evt_1OqRm2" in text and "gh-po…on-77" in text
        assert "completion uncertain: run lost" in text
        # At the design size every column is back.
        await pilot.resize_terminal(120, 40)
        await wait_for(pilot, lambda: "attempts" in pane._shown, what="tries coming back")
        await wait_for(pilot, lambda: "3/3" in screen_text(app), what="the tries column")


async def test_at_80_columns_the_footer_keeps_0_fleet(tmp_path):
    import os

    from onwatch.core.fleet import FolderFleet
    from onwatch.tui.fleet import FleetScreen
    from onwatch.tui.fleet.seed import seed_fleet

    folder = str(tmp_path / "agents")
    os.mkdir(folder)
    clock = await seed_fleet(folder)
    app = OnwatchApp(None, clock=clock, fleet=FolderFleet(folder))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(
            pilot,
            lambda: (
                app.fleet_desk is not None
                and app.fleet_desk.loaded
                and isinstance(app.screen, FleetScreen)
            ),
            what="the fleet",
        )
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.inbox is not None, what="an inbox")
        for pane in "123456":
            await pilot.press(pane)
            await pilot.pause()
            footer = screen_text(app).splitlines()[-1]
            assert "0 Fleet" in footer, (pane, footer)
        await app.inbox.close()


async def test_a_single_inbox_offers_no_fleet_key_in_its_footer(seeded):
    inbox, clock, _ = seeded
    app = OnwatchApp(inbox, clock=clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await started(app, pilot)
        assert "Fleet" not in screen_text(app).splitlines()[-1]


async def test_the_status_strip_says_when_no_worker_runs_the_pending_work(tmp_path):
    """As the fleet's row does: work waiting and nobody holding the lease is said, not left
    to be read from 'released 59m ago'."""
    clock = FakeClock(T0)
    async with await Inbox.open(str(tmp_path / "i.db"), clock=clock) as inbox:
        await inbox.ingest("chat", "m-1", {"text": "hi"}, now=T0)
        app = OnwatchApp(inbox, clock=clock)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(app, pilot)
            assert "no worker runs the 1 pending" in screen_text(app)
            gen = await inbox.acquire("w-1", now=T0)
            await app.reload()
            assert "no worker runs" not in screen_text(app)
            await inbox.release("w-1", gen, now=T0)
            await app.reload()
            assert "released 0s ago · no worker runs the 1 pending" in screen_text(app)
