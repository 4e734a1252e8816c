"""One table of operator actions: `Inbox.act` returns what happened (before → after, the
refusal's reason), the audit log uses the action's one name, and the CLI has a subcommand
for every row of the table."""

from __future__ import annotations

import re

import pytest

from onwatch.core import ACTIONS, BadInput, FakeClock, Inbox, Outcome


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
    from onwatch.core import actions

    row = actions.Action(
        "poke", "event", ("pending",), "pending", "a new row", "Poke {target}?", "Poke {count}?"
    )
    monkeypatch.setitem(actions.ACTIONS, "poke", row)
    from onwatch.cli.parser import build_parser

    parser = build_parser()
    listed = parser.format_help()
    for action in actions.ACTIONS.values():
        assert re.search(rf"^ +{re.escape(action.command)}\b", listed, re.M), action.command
    args = parser.parse_args(["poke", "a.db", "7", "--expect", "pending"])
    assert (args.event_id, args.expect) == (7, "pending")


async def test_settling_and_answering_are_audited_by_the_action_name(inbox):
    await inbox.request_approval("r1", 3600, "refund 5")
    await inbox.request_approval("r2", 3600, "refund 6")
    await inbox.act("approve", "r1")
    await inbox.answer_approval("r2", "no")  # the method the agent's code calls: same name
    await inbox.act("deny", "r1")  # refused: r1 stands as yes
    await inbox.act("mark_sent", 1)  # no such delivery: refused, audited
    await inbox.act("send_again", 1)
    words = [(entry.action, entry.applied) for entry in reversed(await inbox.audit())]
    assert words == [
        ("approve", True),
        ("deny", True),
        ("deny", False),
        ("mark_sent", False),
        ("send_again", False),
    ]


async def test_migration_5_renames_the_old_audit_words_of_a_version_4_file(tmp_path):
    import sqlite3

    from onwatch.core.sqlite import schema

    path = str(tmp_path / "v4.db")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    schema.migrate(db, path, target=4)
    old = [
        ("answer yes", "approval r1", 1),
        ("answer no", "approval r2", 1),
        ("answer yes", "approval r2", 0),
        ("delivery sent", "delivery 3", 1),
        ("delivery send again", "delivery 4", 1),
        ("mark done", "event 5", 1),
        ("send to dead", "event 6", 1),
        ("hold outbox", "outbox_held", 1),
        ("release outbox", "outbox_held", 1),
        # not operator actions: the engine's own entries keep their words
        ("refused sent", "delivery 3", 0),
        ("refused finish", "gen 1", 0),
        ("requeue", "event 6", 1),
    ]
    db.executemany(
        "INSERT INTO audit(at, actor, action, target, applied) VALUES (5, 'ops', ?, ?, ?)", old
    )
    db.close()
    async with await Inbox.open(path, clock=FakeClock(1_000), migrate=True) as box:
        entries = list(reversed(await box.audit()))
        assert [(e.action, e.target, e.applied) for e in entries] == [
            ("approve", "approval r1", True),
            ("deny", "approval r2", True),
            ("approve", "approval r2", False),
            ("mark_sent", "delivery 3", True),
            ("send_again", "delivery 4", True),
            ("resolve", "event 5", True),
            ("bury", "event 6", True),
            ("hold", "outbox_held", True),
            ("release", "outbox_held", True),
            ("refused sent", "delivery 3", False),
            ("refused finish", "gen 1", False),
            ("requeue", "event 6", True),
        ]
        # every operator entry now carries a name from the table, the CLI's and the desk's
        assert {e.action for e in entries if e.actor == "ops" and e.applied} <= set(ACTIONS)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION >= 5
    db.close()
