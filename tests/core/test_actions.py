"""One table of operator actions: `Inbox.act` returns what happened (before → after, the
refusal's reason), the audit log uses the action's one name, and the CLI has a subcommand
for every row of the table."""

from __future__ import annotations

import re

import pytest

from core import ACTIONS, BadInput, FakeClock, Inbox, Outcome


@pytest.fixture
async def inbox(tmp_path):
    inbox = await Inbox.open(str(tmp_path / "a.db"), clock=FakeClock(1_800_000_000))
    yield inbox
    await inbox.close()


async def test_act_returns_before_and_after_and_is_truthy_when_applied(inbox):
    await inbox.ingest("chat", "m1", {})
    outcome = await inbox.act("cancel", 1, expect="pending", actor="ana", reason="spam")
    assert outcome == Outcome("cancel", "event 1", True, "pending", "cancelled", "spam", True)
    assert outcome
    assert (await inbox.get_event(1)).status == "cancelled"
    [entry] = await inbox.audit(limit=1)
    assert (entry.action, entry.before, entry.after, entry.applied) == (
        "cancel",
        "pending",
        "cancelled",
        True,
    )


async def test_act_says_why_when_a_second_operator_acted_in_between(inbox):
    await inbox.ingest("chat", "m1", {})
    seen = (await inbox.get_event(1)).status  # the first operator looks: pending
    assert await inbox.bury(1, actor="bo")  # a second operator acts meanwhile
    outcome = await inbox.act("cancel", 1, expect=seen, actor="ana")
    assert not outcome
    assert (outcome.before, outcome.after) == ("dead", "dead")
    assert outcome.reason == "changed meanwhile: it is dead now, not pending"
    assert (await inbox.get_event(1)).status == "dead"  # nothing changed


async def test_one_name_per_action_in_the_audit_log(inbox):
    await inbox.ingest("chat", "m1", {})
    await inbox.ingest("chat", "m2", {})
    await inbox.bury(1)
    assert await inbox.requeue(1)
    await inbox.act("bury", 2)
    assert not await inbox.resolve(2)  # a dead event cannot be resolved
    assert await inbox.hold_outbox()
    assert (await inbox.act("release")).after == "false"
    words = [entry.action for entry in reversed(await inbox.audit())]
    assert words == ["bury", "requeue", "bury", "resolve", "hold", "release"]
    assert set(words) <= set(ACTIONS)


async def test_approvals_and_switches_report_the_standing_state(inbox):
    await inbox.request_approval("r1", 3600, "refund 5")
    assert (await inbox.act("approve", "r1")).result == "yes"
    refused = await inbox.act("deny", "r1")
    assert not refused and refused.result == "yes"
    assert await inbox.answer_approval("r1", "no") == "yes"  # the old contract holds
    assert (await inbox.act("pause")).applied
    again = await inbox.act("pause")
    assert not again and (again.before, again.after) == ("true", "true")


@pytest.mark.parametrize(
    "name, target, expect",
    [
        ("nope", 1, None),
        ("cancel", "one", None),
        ("cancel", 1, "gone"),
        ("pause", 1, None),
        ("approve", "r1", "waiting"),
        (None, 1, None),
    ],
)
async def test_act_refuses_bad_input_and_changes_nothing(inbox, name, target, expect):
    await inbox.ingest("chat", "m1", {})
    before = await inbox.audit()
    with pytest.raises(BadInput):
        await inbox.act(name, target, expect=expect)
    assert await inbox.audit() == before
    assert (await inbox.get_event(1)).status == "pending"


def test_the_cli_has_a_subcommand_for_every_action_in_the_table(monkeypatch):
    from core import actions

    row = actions.Action(
        "poke", "event", ("pending",), "pending", "a new row", "Poke {target}?", "Poke {count}?"
    )
    monkeypatch.setitem(actions.ACTIONS, "poke", row)
    from cli.parser import build_parser

    parser = build_parser()
    listed = parser.format_help()
    for action in actions.ACTIONS.values():
        assert re.search(rf"^ +{re.escape(action.command)}\b", listed, re.M), action.command
    args = parser.parse_args(["poke", "a.db", "7", "--expect", "pending"])
    assert (args.event_id, args.expect) == (7, "pending")
