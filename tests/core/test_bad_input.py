"""Bad arguments raise BadInput with a message that says what was wrong, and write nothing."""

from __future__ import annotations

import asyncio

import pytest

from onwatch.core import ApprovalRequest, BadInput, FollowUp, Inbox, InboxError, Reply

from .conftest import T, dump

pytestmark = pytest.mark.backends  # the conformance suite: once per backend


@pytest.fixture
async def busy_inbox(inbox):
    """An inbox with a held lease and a claimed event, so finish and claims have something."""
    await inbox.ingest("chat", "m1", {"text": "hi"})
    gen = await inbox.acquire("W")
    [event] = await inbox.claim_batch("W", gen)
    inbox.test_event = event
    return inbox


CASES = [
    ("empty source", lambda b: b.ingest("", "x", None), "source must not be empty"),
    ("non-string id", lambda b: b.ingest("chat", 7, None), "source_id must be a string"),
    ("NUL in source", lambda b: b.ingest("ch\x00at", "x", None), "NUL"),
    ("unserialisable", lambda b: b.ingest("chat", "x", {"f": object()}), "JSON-serialisable"),
    ("NaN payload", lambda b: b.ingest("chat", "x", float("nan")), "JSON-serialisable"),
    ("oversized", lambda b: b.ingest("chat", "x", "a" * (1 << 20)), "limit is 1048576"),
    ("float now", lambda b: b.ingest("chat", "x", None, now=T + 0.5), "integer number"),
    ("bool now", lambda b: b.acquire("W", now=True), "integer number"),
    (
        "a unit with no text",  # found by test_totality: str() of 10**5000 raises ValueError
        lambda b: b.raise_budget("max_spend_per_day", 2, unit=10**5000),
        "unit must be a string",
    ),
    ("float due", lambda b: b.add_timer("t", T + 0.5, None), "integer number"),
    ("zero every", lambda b: b.add_timer("t", T, None, every=0), "every must be a positive"),
    (
        "key on repeating",
        lambda b: b.add_timer("t", T, None, every=60, key=("a", "b")),
        "only allowed on a one-off",
    ),
    ("bad catch-up", lambda b: b.add_timer("t", T, None, catch_up="all"), "catch_up"),
    ("bad answer", lambda b: b.answer_approval("r", "maybe"), "answer must be"),
    ("zero expiry", lambda b: b.request_approval("r", 0, "do it"), "expires_in"),
    ("bad status", lambda b: b.events("finished"), "status must be one of"),
    ("bad gen", lambda b: b.claim_batch("W", 0), "gen must be a positive"),
    ("empty ids", lambda b: b.finish("W", 1, []), "at least one"),
    ("string ids", lambda b: b.finish("W", 1, "12"), "list of event ids"),
    ("bad message", lambda b: b.finish("W", 1, [1], [42]), "str or core.Reply"),
    (
        "error with replies",
        lambda b: b.finish("W", 1, [1], ["hi"], error="boom"),
        "cannot also queue",
    ),
    ("bad approval", lambda b: b.finish("W", 1, [1], approvals=["r"]), "ApprovalRequest"),
    (
        "bad follow-up",
        lambda b: b.finish("W", 1, [1], timers=[FollowUp("t", T, every=-1)]),
        "every must be a positive",
    ),
    ("bad setting", lambda b: b.configure(max_attempts=0), "max_attempts must be a positive"),
    ("unknown setting", lambda b: b.configure(retries=3), "unknown setting"),
    ("bad policy", lambda b: b.configure(on_lost_claim="ignore"), "on_lost_claim"),
    (
        "bad override",
        lambda b: b.configure(lost_claim_by_source={"stripe": "drop"}),
        "lost_claim_by_source",
    ),
    ("bad expect", lambda b: b.requeue(1, expect="gone"), "expect must be"),
    ("bad event id", lambda b: b.requeue("1"), "event id must be"),
    ("bad effect state", lambda b: b.settle_effect("k", "maybe"), "state must be"),
    ("not callable", lambda b: b.dispatch("stdout"), "send must be callable"),
]


@pytest.mark.parametrize("name,call,message", CASES, ids=[c[0] for c in CASES])
async def test_bad_input_is_refused_and_writes_nothing(busy_inbox, path, name, call, message):
    before = dump(path)
    with pytest.raises(BadInput, match=message) as caught:
        await call(busy_inbox)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, InboxError)
    assert dump(path) == before


async def test_follow_up_budget_refuses_the_whole_finish(busy_inbox, path):
    await busy_inbox.configure(max_followups_per_run=1)
    before = dump(path)
    event = busy_inbox.test_event
    with pytest.raises(BadInput, match="budget max_followups_per_run allows 1"):
        await busy_inbox.finish(
            "W",
            event.claim_gen,
            [event.id],
            [Reply("done")],
            timers=[FollowUp("a", T + 60), FollowUp("b", T + 60)],
        )
    assert dump(path) == before
    assert (await busy_inbox.get_event(event.id)).status == "running"


async def test_a_settings_change_is_validated_as_a_whole(inbox):
    with pytest.raises(BadInput, match="backoff_cap must be at least backoff_base"):
        await inbox.configure(backoff_base=100, backoff_cap=10)
    assert inbox.settings.backoff_base == 10


async def test_approval_request_in_finish_is_atomic_with_the_outcome(busy_inbox):
    event = busy_inbox.test_event
    assert await busy_inbox.finish(
        "W",
        event.claim_gen,
        [event.id],
        ["asking"],
        approvals=[ApprovalRequest("refund-1", 3600, "refund 5")],
    )
    [approval] = await busy_inbox.approvals()
    assert approval.request_id == "refund-1" and approval.answer is None
    assert [t.id for t in await busy_inbox.timers()] == ["approval:refund-1"]


async def test_a_payload_limit_lowered_by_another_process_still_holds(inbox, path):
    other = await Inbox.open(path)
    try:
        await other.configure(max_payload_bytes=100)
        before = dump(path)
        with pytest.raises(BadInput, match="max_payload_bytes"):
            await inbox.ingest("hook", "big", "x" * 200)  # this inbox's cache still says 1 MiB
        assert dump(path) == before
    finally:
        await other.close()


async def test_a_lone_surrogate_in_a_payload_round_trips_and_harms_no_neighbour(inbox):
    # JSON allows "\ud800" as an escape; UTF-8 does not. A webhook may well send one.
    results = await asyncio.gather(
        inbox.ingest("hook", "ok-1", 1),
        inbox.ingest("hook", "odd", {"t": "bad \ud800 half"}),
        inbox.ingest("hook", "ok-2", 2),
    )
    assert results == [True, True, True]
    [odd] = [e for e in await inbox.events("pending") if e.source_id == "odd"]
    assert odd.payload == {"t": "bad \ud800 half"}


async def test_a_lone_surrogate_in_a_key_is_bad_input(inbox, path):
    before = dump(path)
    with pytest.raises(BadInput, match="not valid Unicode"):
        await inbox.ingest("hook", "id-\udfff", None)
    assert dump(path) == before
