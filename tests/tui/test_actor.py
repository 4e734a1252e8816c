"""Who did it, from the desk: an action is audited as the person at the keys (`--actor`,
else `$ONWATCH_ACTOR`, else the operating system's user), in the inbox shown and in the
fleet's all-approvals queue alike; never as a made-up 'operator'."""

from __future__ import annotations

import getpass
import os

import pytest

from onwatch.core import BadInput, FakeClock, Inbox
from onwatch.core.fleet import FolderFleet
from onwatch.tui.app import OnwatchApp
from onwatch.tui.fleet import FleetScreen
from onwatch.tui.fleet.queue import ApprovalQueueScreen
from onwatch.tui.screens.confirm import ConfirmScreen

from .conftest import T0, started, wait_for, wait_for_text


async def approve_first(app, pilot) -> None:
    await started(app, pilot)
    await pilot.press("4", "a")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
    await pilot.press("y")
    await wait_for_text(pilot, "approved refund-ord-991")


@pytest.mark.parametrize(
    "env, given, expected",
    [
        (None, None, getpass.getuser()),
        ("ana", None, "ana"),
        ("ana", "bo@laptop", "bo@laptop"),
    ],
)
async def test_the_desk_audits_as_the_person_at_the_keys(seeded, monkeypatch, env, given, expected):
    inbox, _, _ = seeded
    monkeypatch.delenv("ONWATCH_ACTOR", raising=False)
    if env is not None:
        monkeypatch.setenv("ONWATCH_ACTOR", env)
    app = OnwatchApp(inbox, actor=given)
    async with app.run_test(size=(120, 40)) as pilot:
        await approve_first(app, pilot)
        await pilot.press("p")  # pause: an inbox switch, audited the same way
        await wait_for_text(pilot, "paused: claims return nothing")
    approval = await inbox.get_approval("refund-ord-991")
    assert approval is not None and approval.answered_by == expected
    entries = {(e.action, e.target): e.actor for e in await inbox.audit(limit=10)}
    assert entries[("approve", "approval refund-ord-991")] == expected
    assert entries[("pause", "paused")] == expected


def test_a_name_the_audit_log_refuses_is_refused_before_the_desk_opens(monkeypatch):
    clock = FakeClock(T0)
    with pytest.raises(BadInput, match="201 characters"):
        OnwatchApp(None, clock=clock, actor="x" * 201)
    monkeypatch.setenv("ONWATCH_ACTOR", "y" * 300)
    with pytest.raises(BadInput, match=r"\$ONWATCH_ACTOR is 300 characters"):
        OnwatchApp(None, clock=clock)


async def test_the_fleets_approval_queue_answers_as_the_same_person(tmp_path, monkeypatch):
    monkeypatch.setenv("ONWATCH_ACTOR", "ana")
    clock = FakeClock(T0)
    path = os.path.join(str(tmp_path), "shop.db")
    async with await Inbox.open(path, clock=clock) as shop:
        await shop.request_approval("refund-9", 3600, "refund 9")
    app = OnwatchApp(None, clock=clock, fleet=FolderFleet(str(tmp_path)))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(
            pilot,
            lambda: (
                app.fleet_desk is not None
                and app.fleet_desk.loaded
                and isinstance(app.screen, FleetScreen)
            ),
            what="the fleet",
        )
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ApprovalQueueScreen), what="q")
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
        await pilot.press("y")
        await wait_for_text(pilot, "shop: denied refund-9")
    async with await Inbox.open(path, create=False) as shop:
        approval = await shop.get_approval("refund-9")
        assert approval is not None and approval.answer == "no" and approval.answered_by == "ana"
