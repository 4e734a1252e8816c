"""One table of operator actions drives the desk: every row of core.actions.ACTIONS has a CLI
subcommand, a desk key where its rows are shown and a confirmation, and a new row (with its
desk key) is offered by the desk with nothing else written for it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
from textual.binding import Binding

from onwatch.cli.parser import build_parser
from onwatch.core import ACTIONS, Inbox
from onwatch.tui import actions as desk
from onwatch.tui.app import OnwatchApp
from onwatch.tui.demo.live import LiveDemoApp
from onwatch.tui.demo.player import DemoApp
from onwatch.tui.fleet.queue import ApprovalQueueScreen
from onwatch.tui.panes import PANES, Pane
from onwatch.tui.panes.base import PaneTable
from onwatch.tui.screens.confirm import ConfirmScreen

from .conftest import screen_text, started, wait_for_text
from .test_actions import SIZE, confirm_open, highlight, press

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bound(bindings) -> dict[str, list[Binding]]:
    """Operator action name → the bindings that run it."""
    found: dict[str, list[Binding]] = {}
    for binding in bindings:
        if isinstance(binding, Binding) and desk.acted(binding):
            found.setdefault(desk.acted(binding), []).append(binding)
    return found


def desk_bindings() -> list[Binding]:
    return [b for pane in PANES for b in pane.BINDINGS] + list(OnwatchApp.BINDINGS)


@pytest.mark.parametrize("name", list(ACTIONS))
def test_every_action_has_a_subcommand_a_desk_key_and_a_confirmation(name):
    action = ACTIONS[name]
    listed = build_parser().format_help()
    assert re.search(rf"^ +{re.escape(action.command)}\b", listed, re.M), "no CLI subcommand"
    assert name in desk.KEYS, "no desk key in tui/actions.py"
    keys = bound(desk_bindings()).get(name, [])
    assert keys, "no pane (or the app) shows a state this action applies to"
    assert {b.key for b in keys} == {desk.KEYS[name].key}
    assert all(b.id == action.command and b.description and b.tooltip for b in keys)
    # The confirmation comes from the core's row; only an inbox switch acts at once (the
    # same key undoes it).
    assert action.question.endswith("?") and action.question_many
    if action.target == "inbox":
        assert action.switch in ("paused", "outbox_held")
    else:
        assert "{n}" in action.question_many
        assert desk.KEYS[name].confirm, "an action on rows must ask first"
        assert "{label}" in desk.KEYS[name].done and desk.KEYS[name].verb


def test_the_desk_table_names_only_core_actions():
    assert set(desk.KEYS) <= set(ACTIONS)


def test_a_pane_writes_exactly_the_actions_on_the_states_it_shows():
    expected = {
        "pending": {"cancel", "bury", "run_now"},
        "running": set(),
        "dead": {"requeue", "resolve", "bury"},
        "approvals": {"approve", "deny", "expire"},
        "timers": {"fire_timer", "pause_timer", "resume_timer", "delete_timer"},
        "outbox": {"mark_sent", "send_again"},
        "done": set(),
    }
    for pane in PANES:
        assert pane.ACTIONS == expected[pane.PANE_ID], pane.PANE_ID
        assert set(bound(pane.BINDINGS)) == pane.ACTIONS, pane.PANE_ID
    # The inbox-wide ones: its two switches and raising a delaying budget (B).
    assert set(bound(OnwatchApp.BINDINGS)) == {
        "pause",
        "resume",
        "hold",
        "release",
        "raise_budget",
    }
    assert ApprovalQueueScreen.ACTIONS == {"approve", "deny", "expire"}
    assert {b.id for b in ApprovalQueueScreen.BINDINGS if desk.acted(b)} == {
        "queue-approve",
        "queue-deny",
        "queue-expire",
    }


def test_an_action_key_takes_no_key_the_desk_already_uses():
    """A pane's keys come before the app's: an action key on a key of the app, of every pane,
    of the table or of a demo desk (the player's `b`, the live demo's `K`) would hide it."""
    taken = {
        key
        for owner in (Pane, PaneTable, OnwatchApp, DemoApp, LiveDemoApp)
        for b in owner.BINDINGS
        if isinstance(b, Binding) and not desk.acted(b)
        for key in b.key.split(",")
    }
    for name, action in desk.KEYS.items():
        assert action.key not in taken, f"{name}: {action.key} is taken"
    for pane in PANES:  # one key per action within a pane
        keys = [b.key for b in pane.BINDINGS if desk.acted(b)]
        assert len(keys) == len(set(keys)), pane.PANE_ID
    # The app's two switch pairs share a key: exactly one of each pair is offered at a time.
    for first, second in (("pause", "resume"), ("hold", "release")):
        assert desk.KEYS[first].key == desk.KEYS[second].key
        assert not set(ACTIONS[first].allowed) & set(ACTIONS[second].allowed)


# --- the new key: bury ---------------------------------------------------------------------


async def test_bury_a_pending_event_and_an_interrupted_one(seeded):
    inbox, _, _ = seeded
    app = OnwatchApp(inbox)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await highlight(pilot, "pending", "13")
        await press(pilot, "D")
        await confirm_open(pilot)
        assert "Bury this event (send it to dead)?" in screen_text(app)
        await press(pilot, "y")
        await wait_for_text(pilot, "buried #13: it stays in Dead until requeued")
        assert (await inbox.get_event(13)).status == "dead"
        await press(pilot, "3")
        await highlight(pilot, "dead", "1")  # interrupted
        assert app.pane("dead").check_action("act", ("bury",)) is True
        await press(pilot, "D")
        await confirm_open(pilot)
        await press(pilot, "y")
        await wait_for_text(pilot, "buried #1")
        assert (await inbox.get_event(1)).status == "dead"
        await highlight(pilot, "dead", "2")  # a dead row: bury does not apply, greyed
        assert app.pane("dead").check_action("act", ("bury",)) is None
        await press(pilot, "D")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
    [latest, first] = [a for a in await inbox.audit() if a.action == "bury"][:2]
    assert (latest.target, latest.before, latest.after) == ("event 1", "interrupted", "dead")
    assert (first.target, first.before, first.after) == ("event 13", "pending", "dead")


# --- a new row is enough --------------------------------------------------------------------

# Run in a fresh interpreter: a pane's keys are made when its class is (at import), so the
# rows are added first, as a new row in the two tables would be, and the desk imported after.
PROBE = textwrap.dedent(
    """
    import asyncio, io, json, sys

    from rich.console import Console

    from onwatch.core import actions
    from onwatch.tui import actions as desk

    actions.ACTIONS["shelve"] = actions.Action(
        "shelve", "event", ("pending",), "cancelled", "pending → cancelled, to look at later",
        "Shelve this event?", "Shelve these {n} events?", "It will not be claimed again.",
    )
    desk.KEYS["shelve"] = desk.DeskAction(
        "z", "Shelve", "set the event aside for later", "shelved {label}", "shelved"
    )

    from onwatch.cli.parser import build_parser
    from tests.tui.conftest import screen_text, wait_for, wait_for_text
    from onwatch.tui.app import OnwatchApp
    from onwatch.tui.screens.confirm import ConfirmScreen
    from onwatch.tui.screens.help import HelpScreen
    from onwatch.tui.seed import open_seeded, use_utc

    async def main(path):
        use_utc()
        inbox, clock = await open_seeded(path)
        seen = {}
        try:
            app = OnwatchApp(inbox)
            async with app.run_test(size=(120, 40)) as pilot:
                await asyncio.wait_for(app.loaded.wait(), 10)
                await pilot.pause()
                pane = app.pane("pending")
                seen["pending_actions"] = sorted(pane.ACTIONS)
                seen["dead_actions"] = sorted(app.pane("dead").ACTIONS)
                seen["footer"] = screen_text(app).splitlines()[-1]
                seen["target"] = pane.cursor_key()
                await pilot.press("z")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
                seen["question"] = "Shelve this event?" in screen_text(app)
                await pilot.press("y")
                await wait_for_text(pilot, f"shelved #{seen['target']}")
                await pilot.press("question_mark")
                await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
                console = Console(width=120, file=io.StringIO(), record=True)
                console.print(app.screen.body)
                seen["help"] = "Shelve" in console.export_text()
        finally:
            await inbox.close()
        seen["cli"] = "shelve" in build_parser().format_help()
        print(json.dumps(seen))

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_new_row_in_the_two_tables_is_offered_by_the_desk(tmp_path):
    path = str(tmp_path / "inbox.db")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TZ": "UTC"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["pending_actions"] == ["bury", "cancel", "run_now", "shelve"]
    assert "shelve" not in seen["dead_actions"]  # it applies to no state the pane shows
    assert "z Shelve" in seen["footer"]
    assert seen["question"], "the confirmation asks the row's question"
    assert seen["help"], "help lists the new key"
    assert seen["cli"], "the CLI has its subcommand"
    # The core ran it as any other row: conditional, applied, audited under its name.
    async with await Inbox.open(path, create=False) as inbox:
        event = await inbox.get_event(int(seen["target"]))
        assert event.status == "cancelled"
        [entry] = await inbox.audit(target=f"event {event.id}", limit=1)
        assert (entry.action, entry.before, entry.after, entry.applied) == (
            "shelve",
            "pending",
            "cancelled",
            True,
        )
