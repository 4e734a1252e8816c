"""Hostile text from webhooks and agents is shown literally and can never act or escape."""

from __future__ import annotations

import json
import sqlite3

import pytest
from rich.text import Text

from onwatch.core import ApprovalRequest, FakeClock, Inbox
from onwatch.tui.app import OnwatchApp
from onwatch.tui.safe import safe_content, safe_json, safe_plain, safe_text
from onwatch.tui.screens.confirm import ConfirmScreen
from onwatch.tui.screens.detail import DetailScreen

from .conftest import T0, screen_text, started, wait_for, wait_for_text

CLICK = "[@click=app.quit]x[/]"
LINK = "[link=http://x]y[/link]"
STYLE = "[bold red]z"
OSC = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
HOSTILE = [
    CLICK,
    LINK,
    STYLE,
    OSC,
    CLEAR,
    "a\rb",
    "c\bd",
    "e\x7ff",
    "g\x9bh",
    "\u202eevil",
    "line one\nline two",
]
RAW = ("\x1b", "\x07", "\r", "\b", "\x7f", "\x9b", "\u202e")


# --- the helper itself ----------------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE)
def test_safe_text_is_literal_and_escapes_controls(value):
    text = safe_text(value)
    assert isinstance(text, Text)
    assert all(span.style == "reverse" for span in text.spans)  # only controls are styled
    assert not any(char in text.plain for char in RAW + ("\n",))
    if value in (CLICK, LINK, STYLE):
        assert text.plain == value  # markup is never parsed: brackets survive as typed
    assert safe_content(value).plain == text.plain
    assert safe_plain(value) == text.plain


def test_escapes_are_visible_and_named():
    assert safe_plain(OSC) == "\\x1b]0;pwned\\x07"
    assert safe_plain("a\rb\tc\nd") == "a\\rb\\tc\\nd"
    assert safe_plain("\u202eabc") == "\\u202eabc"
    assert safe_plain("\udcff") == "\\udcff"  # a lone surrogate cannot even be printed
    assert safe_text("x\ny", multiline=True).plain == "x\ny"


def test_long_values_are_cut_before_any_work():
    text = safe_text("x" * 1_000_000, limit=50)
    assert text.plain == "x" * 50 + "…"
    pretty = safe_json({"blob": "y" * 300_000})
    assert "more characters not shown" in pretty.plain and len(pretty.plain) < 210_000


def test_non_strings_and_odd_bytes():
    assert safe_plain(b"\xff\xfeA") == "\\xff\\xfeA"
    assert safe_plain({"a": [1, "\x1b"]}) == '{"a": [1, "\\u001b"]}'
    assert safe_plain(None) == "" and safe_plain(12) == "12"
    assert "\\u001b" in safe_json({"k": "\x1b"}).plain  # JSON escapes it; still literal


# --- in the running app ---------------------------------------------------------------------


async def hostile_inbox(path: str) -> tuple[Inbox, FakeClock]:
    clock = FakeClock(T0)
    inbox = await Inbox.open(path, clock=clock)
    for i, value in enumerate(HOSTILE):
        await inbox.ingest(value if i % 2 else "webhook", value, {"text": value, "i": i})
    await inbox.ingest("webhook", "long-" + "w" * 1000, {"blob": "v" * 500_000})
    gen = await inbox.acquire("w")
    # the first claim takes a batch; finish it with hostile errors, messages and approvals
    batch = await inbox.claim_batch("w", gen)
    first, rest = batch[:2], batch[2:]
    await inbox.finish(
        "w",
        gen,
        [e.id for e in rest[:1]],
        messages=[f"{value} body" for value in HOSTILE],
        approvals=[
            ApprovalRequest(CLICK, 3600, f"{LINK} {OSC} {STYLE}"),
            ApprovalRequest(f"req{CLEAR}", 3600, "line one\nline two"),
        ],
    )
    for event in first:
        await inbox.finish("w", gen, [event.id], error=f"{CLICK} {OSC} {LINK}")
    await inbox.add_timer(f"t{OSC}", T0 + 60, {"x": CLICK})
    return inbox, clock


@pytest.fixture
async def hostile(tmp_path):
    path = str(tmp_path / "hostile.db")
    inbox, clock = await hostile_inbox(path)
    # A payload that decodes to a lone surrogate, written as a JSON escape by a raw writer.
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE events SET payload = ? WHERE source_id = ?",
            (json.dumps({"odd": "\udcff\ud800"}), "line one\nline two"),
        )
    try:
        yield inbox, clock, path
    finally:
        await inbox.close()


def assert_clean(app) -> str:
    shown = screen_text(app)
    assert not any(char in shown for char in RAW), repr(shown)
    assert app.is_running and app.return_code is None
    return shown


async def test_every_pane_shows_hostile_text_literally(hostile):
    inbox, _, _ = hostile
    app = OnwatchApp(inbox)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(app, pilot)
        seen = [assert_clean(app)]
        for key in "23456":
            await pilot.press(key)
            await wait_for(pilot, lambda: not app.active_pane.stale, what=f"pane {key}")
            await pilot.pause()
            seen.append(assert_clean(app))
        shown = "\n".join(seen)
        for literal in (
            CLICK,
            LINK,
            STYLE,
            "\\x1b]0;pwned\\x07",
            "\\x1b[2J",
            "a\\rb",
            "c\\x08d",
            "e\\x7ff",
            "g\\x9bh",
            "\\u202eevil",
            "line one\\nline two",
            "t\\x1b]0;pwned",
        ):
            assert literal in shown, literal


async def test_clicking_hostile_markup_does_nothing(hostile):
    inbox, _, _ = hostile
    app = OnwatchApp(inbox)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(app, pilot)
        lines = screen_text(app).splitlines()
        row = next(i for i, line in enumerate(lines) if CLICK in line)
        column = lines[row].index(CLICK)
        for dx in range(len(CLICK)):
            await pilot.click(offset=(column + dx, row))
        await pilot.pause()
        assert app.is_running and app.return_code is None
        assert CLICK in assert_clean(app)


async def test_details_dialogs_and_outcomes_stay_literal(hostile):
    inbox, _, _ = hostile
    app = OnwatchApp(inbox)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(app, pilot)
        # the detail of every pending row, the odd-payload one included
        for index in range(app.pane("pending").table.row_count):
            app.pane("pending").table.move_cursor(row=index)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), what="detail")
            assert_clean(app)
            body = app.screen.body.plain
            assert not any(char in body for char in RAW)
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, DetailScreen))
        # a hostile approval: confirmation, then the outcome line
        await pilot.press("4")
        await wait_for(pilot, lambda: app.pane("approvals").cursor_key() is not None)
        while app.pane("approvals").cursor_key() != CLICK:
            await pilot.press("down")
        await pilot.press("a")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        shown = assert_clean(app)
        assert CLICK in shown and LINK in shown and "\\x1b]0;pwned\\x07" in shown
        await pilot.press("y")
        await wait_for_text(pilot, f"approved {CLICK}")
        assert_clean(app)
        assert (await inbox.get_approval(CLICK)).answer == "yes"
        # a hostile outbox message, and its detail
        await pilot.press("6")
        await wait_for(pilot, lambda: not app.active_pane.stale)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen), what="detail")
        assert f"{CLICK} body" in assert_clean(app)


async def test_filter_text_is_literal_too(hostile):
    inbox, _, _ = hostile
    app = OnwatchApp(inbox)
    async with app.run_test(size=(160, 50)) as pilot:
        await started(app, pilot)
        app.pane("pending").set_filter("[@click=app.quit]")
        await wait_for(pilot, lambda: "matching" in screen_text(app))
        shown = assert_clean(app)
        assert "filter “[@click=app.quit]”" in shown
