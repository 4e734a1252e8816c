"""POST /hooks/stripe over real HTTP, signed as Stripe documents it (t=…,v1=…)."""

from __future__ import annotations

import json

import pytest

from onwatch.core import FakeClock, Inbox
from onwatch.core.webhooks import Secrets

from .helpers import STRIPE_OLD_SECRET, STRIPE_SECRET, post, stored, stripe_event, stripe_signature

T = 1_700_000_000


@pytest.fixture
async def clock_inbox(tmp_path):
    """An inbox on a fake clock: the receiver checks Stripe timestamps against it."""
    clock = FakeClock(T)
    inbox = await Inbox.open(tmp_path / "inbox.db", clock=clock)
    yield inbox, clock
    await inbox.close()


async def send(http, server, body: bytes, header: str | None):
    headers = {"Content-Type": "application/json"}
    if header is not None:
        headers["Stripe-Signature"] = header
    return await post(http, server.url + "/hooks/stripe", body, headers)


async def test_valid_event_is_stored_as_sent_then_deduplicated_on_its_id(serve, clock_inbox, http):
    inbox, _ = clock_inbox
    server = await serve(inbox)
    body = stripe_event("evt_1")
    status, answer, _ = await send(http, server, body, stripe_signature(body, [STRIPE_SECRET], T))
    assert (status, answer) == (202, {"stored": True})
    assert await stored(inbox, "stripe") == {"evt_1": json.loads(body)}

    # Stripe retries the same event later, freshly signed: a duplicate, still 2xx.
    status, answer, _ = await send(
        http, server, body, stripe_signature(body, [STRIPE_SECRET], T + 60)
    )
    assert (status, answer) == (200, {"stored": False, "duplicate": True})
    assert (await inbox.counts())["pending"] == 1


@pytest.mark.parametrize(
    "offset, expected", [(-300, 202), (300, 202), (-301, 401), (301, 401), (-86_400, 401)]
)
async def test_timestamp_tolerance_is_five_minutes_either_way(
    serve, clock_inbox, http, offset, expected
):
    inbox, _ = clock_inbox
    server = await serve(inbox)
    body = stripe_event("evt_t")
    status, answer, _ = await send(
        http, server, body, stripe_signature(body, [STRIPE_SECRET], T + offset)
    )
    assert status == expected, answer
    if expected == 401:
        assert "stale timestamp" in answer["error"]
    assert (await inbox.counts())["pending"] == (1 if expected == 202 else 0)


@pytest.mark.parametrize(
    "case",
    [
        "tampered body",
        "wrong secret",
        "missing header",
        "no timestamp",
        "no v1",
        "only v0",
        "timestamp swapped",
        "garbage",
    ],
)
async def test_refused_signatures_store_nothing(serve, clock_inbox, http, case):
    inbox, _ = clock_inbox
    server = await serve(inbox)
    body = stripe_event("evt_2")
    header = stripe_signature(body, [STRIPE_SECRET], T)
    if case == "tampered body":
        body = body.replace(b"invoice.paid", b"invoice.void")
    elif case == "wrong secret":
        header = stripe_signature(body, ["whsec_someone_else"], T)
    elif case == "missing header":
        header = None
    elif case == "no timestamp":
        header = header.split(",", 1)[1]
    elif case == "no v1":
        header = f"t={T}"
    elif case == "only v0":
        header = header.replace("v1=", "v0=")
    elif case == "timestamp swapped":  # a valid v1 replayed under another (fresh) t
        header = header.replace(f"t={T}", f"t={T + 1}")
    else:
        header = "definitely not a stripe header"
    status, answer, _ = await send(http, server, body, header)
    assert status == 401, answer
    assert sum((await inbox.counts()).values()) == 0


@pytest.mark.parametrize(
    "signed_with, configured",
    [
        ([STRIPE_SECRET, STRIPE_OLD_SECRET], [STRIPE_SECRET]),  # Stripe sends both v1 values
        ([STRIPE_SECRET, STRIPE_OLD_SECRET], [STRIPE_OLD_SECRET]),  # receiver not yet updated
        ([STRIPE_OLD_SECRET, STRIPE_SECRET], [STRIPE_SECRET]),  # order does not matter
        ([STRIPE_OLD_SECRET], [STRIPE_SECRET, STRIPE_OLD_SECRET]),  # receiver already has both
        ([STRIPE_SECRET], [STRIPE_SECRET, STRIPE_OLD_SECRET]),
    ],
)
async def test_rotated_secrets_are_accepted(serve, clock_inbox, http, signed_with, configured):
    inbox, _ = clock_inbox
    server = await serve(inbox, secrets=Secrets.of(stripe=configured))
    body = stripe_event("evt_rot")
    status, answer, _ = await send(http, server, body, stripe_signature(body, signed_with, T))
    assert (status, answer) == (202, {"stored": True})


async def test_rotation_window_closed_old_secret_is_refused(serve, clock_inbox, http):
    inbox, _ = clock_inbox
    server = await serve(inbox, secrets=Secrets.of(stripe=[STRIPE_SECRET]))
    body = stripe_event("evt_old")
    status, _, _ = await send(http, server, body, stripe_signature(body, [STRIPE_OLD_SECRET], T))
    assert status == 401
    assert sum((await inbox.counts()).values()) == 0


@pytest.mark.parametrize(
    "body",
    [
        b'{"object": "event"}',
        b'{"id": ""}',
        b'{"id": 42}',
        b'["evt_1"]',
        b'{"id": "evt_1"',
        b"\xff\xfe",
    ],
)
async def test_signed_event_without_an_id_or_not_json_is_400(serve, clock_inbox, http, body):
    inbox, _ = clock_inbox
    server = await serve(inbox)
    status, _, _ = await send(http, server, body, stripe_signature(body, [STRIPE_SECRET], T))
    assert status == 400
    assert sum((await inbox.counts()).values()) == 0


async def test_real_clock_is_used_by_default(server, inbox, http):
    # The default inbox clock is the wall clock: a freshly signed event passes.
    import time

    body = stripe_event("evt_now")
    status, _, _ = await send(
        http, server, body, stripe_signature(body, [STRIPE_SECRET], int(time.time()))
    )
    assert status == 202
