"""The example agent end to end under the worker: echo, refund behind approval, digest."""

from __future__ import annotations

import json

from examples import refund_agent as example_agent

from .conftest import DAY, T, until


async def run_until_sent(inbox, start, sent, count):
    running = start(example_agent.handle, send=sent.append)
    await until(lambda: len(sent) >= count, what=f"{count} send(s)")
    return running


async def test_chat_is_echoed(inbox, start):
    await inbox.ingest("chat", "m1", {"text": "hello"})
    await inbox.ingest("chat", "m2", "bare string")
    sent = []
    running = await run_until_sent(inbox, start, sent, 1)
    await running.stop()
    assert str(sent[0]) == "echo: hello\n\necho: bare string"


async def test_refund_asks_first_and_acts_only_on_yes(inbox, start, tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(example_agent.LEDGER_ENV, str(ledger))
    await inbox.ingest("chat", "m1", {"text": "refund 25"})
    sent = []
    running = await run_until_sent(inbox, start, sent, 1)
    assert str(sent[0]) == "refund of 25 is waiting for approval"
    [approval] = await inbox.approvals()
    assert approval.request_id == "refund-m1" and approval.due == T + 4 * 3600
    assert not ledger.exists()
    assert await inbox.answer_approval("refund-m1", "yes") == "yes"
    await until(lambda: len(sent) == 2)
    await running.stop()
    assert str(sent[1]) == "refunded 25 (reference refund:refund-m1)"
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [
        {"amount": 25, "key": "refund:refund-m1"}
    ]
    event = (await inbox.events("done"))[-1]
    assert [(e.name, e.state, e.detail) for e in await inbox.effects(event.id)] == [
        ("refund", "confirmed", {"amount": 25, "request": "refund-m1"})
    ]


async def test_refund_denied_or_expired_refunds_nothing(inbox, start, clock, tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(example_agent.LEDGER_ENV, str(ledger))
    await inbox.ingest("chat", "m1", {"text": "refund 5"})
    await inbox.ingest("chat", "m2", {"text": "Refund 7"})
    sent = []
    running = await run_until_sent(inbox, start, sent, 1)
    assert await inbox.answer_approval("refund-m1", "no") == "no"
    await until(lambda: len(sent) == 2)
    clock.advance(4 * 3600)  # m2's request expires: the scheduler writes the answer
    await until(lambda: len(sent) == 3, what="the expiry's reply")
    await running.stop()
    assert [str(s) for s in sent[1:]] == [
        "refund of 5 was denied; nothing was refunded",
        "refund of 7 expired without an answer; nothing was refunded",
    ]
    assert not ledger.exists()


async def test_refund_is_idempotent_across_a_retried_run(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(example_agent.LEDGER_ENV, str(ledger))
    key = "refund:refund-m1"
    assert example_agent.fake_refund(5, key) == "refunded"
    assert example_agent.fake_refund(5, key) == "already refunded"
    assert len(ledger.read_text().splitlines()) == 1


async def test_daily_digest_coalesces_missed_days(inbox, start, clock):
    due = await example_agent.ensure_digest(inbox)
    assert due == T - T % DAY + 8 * 3600 + (DAY if T - T % DAY + 8 * 3600 <= T else 0)
    assert await example_agent.ensure_digest(inbox) == due  # a restart never moves it
    clock.set(due + 3 * DAY + 600)  # the machine was off for three days
    sent = []
    running = await run_until_sent(inbox, start, sent, 1)
    await running.stop()
    assert str(sent[0]).startswith("daily digest for ")
    assert str(sent[0]).endswith("(covers 3 missed days)")
    [timer] = await inbox.timers()
    assert timer.due == due + 4 * DAY and timer.catch_up == "coalesce"


async def test_events_it_does_not_know_end_silently(inbox, start):
    await inbox.ingest("github", "d1", {"action": "opened"})
    running = start(example_agent.handle, send=[].append)
    await until(lambda: _done(inbox))
    await running.stop()
    assert await inbox.held_messages() == []
    assert (await inbox.runs(1))[0].result == {"handled": []}


async def _done(inbox):
    return (await inbox.counts())["done"] == 1


async def test_the_customer_hears_waiting_before_denied(inbox, start):
    """Inside the outbox gap "waiting for approval" is held; the denial is urgent and carries
    it along, in the order written: never "denied" before "waiting for approval"."""
    await inbox.configure(outbox_gap=3600)
    await inbox.ingest("chat", "m0", {"text": "hello"})
    sent = []
    running = await run_until_sent(inbox, start, sent, 1)  # the paced send: the gap starts
    await inbox.ingest("chat", "m1", {"text": "refund 30"})
    await until(lambda: inbox.get_approval("refund-m1"), what="the approval request")
    await until(inbox.held_messages, what="the held reply")  # written inside the gap
    assert await inbox.act("deny", "refund-m1", actor="ana", reason="duplicate")
    await until(lambda: len(sent) == 2, what="the denial's send")
    await running.stop()
    assert str(sent[1]) == (
        "refund of 30 is waiting for approval\n\nrefund of 30 was denied; nothing was refunded"
    )
    [answer] = [e for e in await inbox.events("done") if e.source == "approval"]
    assert (answer.payload["answered_by"], answer.payload["reason"]) == ("ana", "duplicate")
