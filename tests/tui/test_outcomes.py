"""The desk words an action's outcome from the Outcome the core returns, never from a second
read of the audit log: a second operator acting between the look and the action (and a third
one writing to the log right after) cannot change what the desk says about its own action."""

from __future__ import annotations

import pytest

from onwatch.core import FakeClock, Inbox
from onwatch.tui import operator


@pytest.fixture
async def two(tmp_path):
    path = str(tmp_path / "a.db")
    clock = FakeClock(1_800_000_000)
    mine = await Inbox.open(path, clock=clock)
    other = await Inbox.open(path, clock=clock, create=False)
    yield mine, other
    await other.close()
    await mine.close()


def no_log_reads(monkeypatch, inbox):
    async def refuse(*args, **kwargs):
        raise AssertionError("the desk re-read the audit log")

    monkeypatch.setattr(inbox, "audit", refuse)


async def test_an_event_another_operator_buried_meanwhile(two, monkeypatch):
    mine, other = two
    await mine.ingest("chat", "m1", {})
    seen = await mine.get_event(1)  # the operator looks: pending
    assert await other.bury(1, actor="bob")  # the second operator acts first
    no_log_reads(monkeypatch, mine)
    outcome = await operator.event_action(mine, "cancel", seen, now=mine.now(), actor="ana")
    assert outcome == operator.Outcome(
        False, "#1: changed meanwhile: it went to dead (it was pending)"
    )
    assert (await other.get_event(1)).status == "dead"


async def test_a_refusal_reason_comes_from_the_action_itself(two, monkeypatch):
    mine, other = two
    await mine.ingest("chat", "m1", {})
    await mine.bury(1)
    seen = await mine.get_event(1)  # dead: resolve applies only to interrupted
    no_log_reads(monkeypatch, mine)
    outcome = await operator.event_action(mine, "resolve", seen, now=mine.now(), actor="ana")
    assert outcome == operator.Outcome(False, "#1: cannot resolve a dead event (only interrupted)")


async def test_an_answer_is_applied_for_this_operator_even_if_another_writes_next(two, monkeypatch):
    mine, other = two
    await mine.request_approval("r1", 3600, "refund 5")
    approval = (await mine.approvals())[0]
    no_log_reads(monkeypatch, mine)
    outcome = await operator.approval_action(mine, "approve", approval, now=mine.now(), actor="ana")
    assert outcome == operator.Outcome(True, "approved r1")
    assert await other.answer_approval("r1", "no", actor="bob") == "yes"


async def test_a_switch_already_in_place_is_reported(two, monkeypatch):
    mine, other = two
    assert await other.pause(actor="bob")
    no_log_reads(monkeypatch, mine)
    outcome = await operator.flag_action(mine, "pause", now=mine.now(), actor="ana")
    assert not outcome.applied and "already paused" in outcome.text
