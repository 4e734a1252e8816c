"""POST /hooks/{source}: Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature).

Signatures come from the `standardwebhooks` reference library (and, where a header must be
bent, from the independent signer in helpers): the receiver is never checked only against
itself. The inbox's clock is faked, so "old" and "new" timestamps are exact.
"""

from __future__ import annotations

import base64
import datetime as dt
import json

import pytest
from standardwebhooks import Webhook

from onwatch.core import FakeClock, Inbox
from onwatch.core.webhooks import Secrets

from .helpers import (
    GITHUB_SECRET,
    HOOK_SECRET,
    github_signature,
    post,
    standard_headers,
    standard_signature,
    stored,
)

T = 1_800_000_000
OLD_SECRET = "whsec_" + base64.b64encode(b"the-previous-key-of-ci-hook").decode()


def signed(body: bytes, msg_id: str, *, secret: str = HOOK_SECRET, at: int = T) -> dict:
    """Headers as a Standard Webhooks sender makes them, signed by the reference library."""
    sent_at = dt.datetime.fromtimestamp(at, dt.timezone.utc)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(at),
        "webhook-signature": Webhook(secret).sign(msg_id, sent_at, body.decode()),
        "Content-Type": "application/json",
    }


@pytest.fixture
async def clocked(tmp_path, serve):
    """(server, inbox) with the inbox's clock at T; ci accepts the new and the old secret."""
    inbox = await Inbox.open(tmp_path / "std.db", clock=FakeClock(T))
    server = await serve(
        inbox, secrets=Secrets.of(github=GITHUB_SECRET, ci=[HOOK_SECRET, OLD_SECRET])
    )
    yield server, inbox
    await inbox.close()


async def count(inbox) -> int:
    return sum((await inbox.counts()).values())


def test_the_independent_signer_agrees_with_the_reference_library():
    body = b'{"build": 1}'
    assert signed(body, "msg_1")["webhook-signature"] == standard_signature(
        HOOK_SECRET, "msg_1", T, body
    )


async def test_library_signed_delivery_is_stored_once_under_its_webhook_id(clocked, http):
    server, inbox = clocked
    body = json.dumps({"build": 812, "result": "failed"}).encode()
    headers = signed(body, "msg_2fWx")
    assert (await post(http, server.url + "/hooks/ci", body, headers))[:2] == (
        202,
        {"stored": True},
    )
    # The same request again (a sender's retry, or a replay inside the window): a duplicate.
    assert (await post(http, server.url + "/hooks/ci", body, headers))[:2] == (
        200,
        {"stored": False, "duplicate": True},
    )
    assert await stored(inbox, "ci") == {"msg_2fWx": {"build": 812, "result": "failed"}}


@pytest.mark.parametrize(
    "offset, status",
    [(-300, 202), (300, 202), (-301, 401), (301, 401), (-86_400, 401), (10**9, 401)],
)
async def test_timestamp_tolerance_is_five_minutes_either_way(clocked, http, offset, status):
    server, inbox = clocked
    body = b'{"n": 1}'
    got, answer, _ = await post(
        http, server.url + "/hooks/ci", body, signed(body, f"msg_{offset}", at=T + offset)
    )
    assert got == status, answer
    if status == 401:
        assert "stale timestamp" in answer["error"]
    assert await count(inbox) == (1 if status == 202 else 0)


async def test_a_captured_request_replayed_under_a_new_id_is_refused(clocked, http):
    server, inbox = clocked
    body = b'{"refund": 7}'
    headers = signed(body, "msg_original")
    assert (await post(http, server.url + "/hooks/ci", body, headers))[0] == 202
    for forged_id in ("msg_replay", "msg_original ", "msg_original2"):
        replay = dict(headers, **{"webhook-id": forged_id})
        got, answer, _ = await post(http, server.url + "/hooks/ci", body, replay)
        assert got == (200 if forged_id.strip() == "msg_original" else 401), forged_id
    # Moving the timestamp forward (to pass the window later) breaks the signature too.
    moved = dict(headers, **{"webhook-id": "msg_later", "webhook-timestamp": str(T + 60)})
    assert (await post(http, server.url + "/hooks/ci", body, moved))[0] == 401
    assert list(await stored(inbox, "ci")) == ["msg_original"]


async def test_replay_after_the_window_is_refused(tmp_path, serve, http):
    clock = FakeClock(T)
    inbox = await Inbox.open(tmp_path / "late.db", clock=clock)
    try:
        server = await serve(inbox, secrets=Secrets.of(ci=HOOK_SECRET))
        body = b'{"pay": 1}'
        headers = signed(body, "msg_once")
        assert (await post(http, server.url + "/hooks/ci", body, headers))[0] == 202
        clock.advance(301)
        got, answer, _ = await post(http, server.url + "/hooks/ci", body, headers)
        assert got == 401 and "stale" in answer["error"]
        assert await count(inbox) == 1
    finally:
        await inbox.close()


async def test_rotation_old_and_new_secret_and_several_signatures(clocked, http):
    server, inbox = clocked
    body = b'{"rotated": true}'
    # Signed with the old secret only, with the new only, and with both (space-separated).
    old = signed(body, "msg_old", secret=OLD_SECRET)
    new = signed(body, "msg_new")
    both = signed(body, "msg_both")
    both["webhook-signature"] = " ".join(
        [
            "v1a,bm90IGNoZWNrZWQ=",  # an asymmetric signature: not ours to check, skipped
            signed(body, "msg_both", secret=OLD_SECRET)["webhook-signature"],
            both["webhook-signature"],
        ]
    )
    for headers in (old, new, both):
        assert (await post(http, server.url + "/hooks/ci", body, headers))[0] == 202
    other = "whsec_" + base64.b64encode(b"x" * 32).decode()
    stranger = signed(body, "msg_stranger", secret=other)
    got, answer, _ = await post(http, server.url + "/hooks/ci", body, stranger)
    assert (got, answer["error"]) == (401, "bad signature")
    assert sorted(await stored(inbox, "ci")) == ["msg_both", "msg_new", "msg_old"]


async def test_svix_named_headers_are_the_same_scheme(clocked, http):
    server, inbox = clocked
    body = b'{"svix": 1}'
    headers = {
        name.replace("webhook-", "svix-"): value for name, value in signed(body, "msg_svix").items()
    }
    assert (await post(http, server.url + "/hooks/ci", body, headers))[0] == 202
    assert list(await stored(inbox, "ci")) == ["msg_svix"]


def _malformed(case: str, body: bytes) -> dict:
    headers = signed(body, "msg_bad")
    if case == "no id":
        del headers["webhook-id"]
    elif case == "no timestamp":
        del headers["webhook-timestamp"]
    elif case == "no signature":
        del headers["webhook-signature"]
    elif case == "empty signature":
        headers["webhook-signature"] = " "
    elif case == "only v2":
        headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v2,")
    elif case == "no comma":
        headers["webhook-signature"] = headers["webhook-signature"].replace("v1,", "v1")
    elif case == "not base64":
        headers["webhook-signature"] = "v1,***not base64***"
    elif case == "hex instead of base64":
        headers["webhook-signature"] = "v1," + github_signature(HOOK_SECRET, body)[7:]
    elif case == "float timestamp":
        headers["webhook-timestamp"] = f"{T}.5"
    elif case == "negative timestamp":
        headers["webhook-timestamp"] = "-1"
    elif case == "milliseconds":
        headers["webhook-timestamp"] = str(T * 1000)
    elif case == "huge timestamp":
        headers["webhook-timestamp"] = "9" * 400
    elif case == "non-ASCII digits":
        headers["webhook-timestamp"] = "\u0661\u0662"
    elif case == "Stripe form":
        headers["webhook-signature"] = f"t={T},v1=" + "0" * 64
    elif case == "GitHub form":
        headers = {
            "X-Hub-Signature-256": github_signature(HOOK_SECRET, body),
            "webhook-id": "msg_bad",
        }
    return headers


@pytest.mark.parametrize(
    "case",
    [
        "no id",
        "no timestamp",
        "no signature",
        "empty signature",
        "only v2",
        "no comma",
        "not base64",
        "hex instead of base64",
        "float timestamp",
        "negative timestamp",
        "milliseconds",
        "huge timestamp",
        "non-ASCII digits",
        "Stripe form",
        "GitHub form",
    ],
)
async def test_malformed_headers_are_401_and_store_nothing(clocked, http, case):
    server, inbox = clocked
    body = b'{"x": 1}'
    headers = _malformed(case, body)
    got, answer, _ = await post(http, server.url + "/hooks/ci", body, headers)
    assert got == 401, (case, answer)
    assert await count(inbox) == 0


async def test_tampered_body_or_another_hooks_secret_is_401(clocked, http):
    server, inbox = clocked
    body = b'{"build": 813}'
    headers = signed(body, "msg_t")
    assert (await post(http, server.url + "/hooks/ci", b'{"build": 814}', headers))[0] == 401
    # GitHub's secret is not a Standard Webhooks key and does not open the ci hook.
    forged = dict(
        headers,
        **{
            "webhook-signature": "v1,"
            + base64.b64encode(github_signature(GITHUB_SECRET, body).encode()).decode()
        },
    )
    assert (await post(http, server.url + "/hooks/ci", body, forged))[0] == 401
    assert await count(inbox) == 0


async def test_the_old_body_only_signature_is_no_longer_accepted(server, inbox, http):
    body = b'{"build": 900}'
    headers = {
        "X-Onwatch-Signature": github_signature("ci-secret", body),
        "Idempotency-Key": "build-900",
        "Content-Type": "application/json",
    }
    got, answer, _ = await post(http, server.url + "/hooks/ci", body, headers)
    assert (got, answer["error"]) == (401, "missing webhook-signature")
    assert await count(inbox) == 0


@pytest.mark.parametrize("body", [b"not json", b"", b"NaN", b'{"a": 1}{"b": 2}'])
async def test_signed_but_not_json_is_400(server, inbox, http, body):
    status, answer, _ = await post(
        http, server.url + "/hooks/ci", body, standard_headers(body, "k1")
    )
    assert status == 400, answer
    assert await count(inbox) == 0


async def test_overlong_webhook_id_is_400(server, inbox, http):
    body = b"{}"
    status, _, _ = await post(
        http, server.url + "/hooks/ci", body, standard_headers(body, "k" * 1025)
    )
    assert status == 400
    assert await count(inbox) == 0


async def test_deeply_nested_json_is_400_not_a_crash(server, inbox, http):
    body = b"[" * 100_000 + b"]" * 100_000
    status, _, _ = await post(http, server.url + "/hooks/ci", body, standard_headers(body, "deep"))
    assert status == 400
    assert await count(inbox) == 0


@pytest.mark.parametrize(
    "path",
    [
        "/hooks/unconfigured",
        "/hooks/CI",
        "/hooks/ci/extra",
        "/hooks/",
        "/",
        "/hooks/ci.json",
        "/admin",
    ],
)
async def test_unknown_or_unconfigured_routes_are_404(server, inbox, http, path):
    body = b"{}"
    async with http.post(
        server.url + path, data=body, headers=standard_headers(body, "k")
    ) as response:
        assert response.status == 404
    assert await count(inbox) == 0


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
@pytest.mark.parametrize("hook", ["ci", "github", "stripe"])
async def test_wrong_method_is_405(server, http, method, hook):
    async with http.request(method, f"{server.url}/hooks/{hook}") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"


async def test_secret_for_one_hook_name_only(serve, inbox, http):
    # A hook serves only when configured: with just GitHub configured, ci and stripe are 404.
    server = await serve(inbox, secrets=Secrets.of(github="x"))
    body = b"{}"
    for hook in ("ci", "stripe"):
        async with http.post(
            f"{server.url}/hooks/{hook}", data=body, headers=standard_headers(body, "k")
        ) as r:
            assert r.status == 404


async def test_the_access_log_line_escapes_a_hostile_delivery_id(server, inbox, http, caplog):
    caplog.set_level("INFO", logger="onwatch.webhooks")
    body, msg_id = b"{}", "k\u202eevil\u200b"
    status, _, _ = await post(http, server.url + "/hooks/ci", body, standard_headers(body, msg_id))
    assert status == 202 and msg_id in await stored(inbox, "ci")
    [line] = [r.getMessage() for r in caplog.records if "POST /hooks/ci" in r.getMessage()]
    assert "ci/k\\u202eevil\\u200b stored" in line
