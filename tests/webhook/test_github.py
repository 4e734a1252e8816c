"""POST /hooks/github over real HTTP, signed as GitHub documents it."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from .helpers import GITHUB_SECRET, github_headers, github_signature, post, stored

BODY = json.dumps({"action": "opened", "issue": {"number": 7, "title": "Webhook intake"}})


async def test_valid_delivery_is_stored_with_its_event_then_deduplicated(server, inbox, http):
    url = server.url + "/hooks/github"
    body = BODY.encode()
    status, answer, _ = await post(http, url, body, github_headers(body, "guid-1", event="issues"))
    assert (status, answer) == (202, {"stored": True})
    assert await stored(inbox, "github") == {
        "guid-1": {"event": "issues", "body": json.loads(BODY)}
    }

    # GitHub's redelivery of the same delivery: 2xx, so it stops, and still one row.
    status, answer, _ = await post(http, url, body, github_headers(body, "guid-1", event="issues"))
    assert (status, answer) == (200, {"stored": False, "duplicate": True})
    assert (await inbox.counts())["pending"] == 1


@pytest.mark.parametrize(
    "case",
    [
        "tampered body",
        "wrong secret",
        "missing signature",
        "sha1 signature",
        "empty digest",
        "uppercase garbage",
    ],
)
async def test_refused_signatures_store_nothing(server, inbox, http, case):
    body = BODY.encode()
    headers = github_headers(body, "guid-2")
    if case == "tampered body":
        body = body.replace(b"7", b"8")
    elif case == "wrong secret":
        headers["X-Hub-Signature-256"] = github_signature("not-the-secret", body)
    elif case == "missing signature":
        del headers["X-Hub-Signature-256"]
    elif case == "sha1 signature":
        headers["X-Hub-Signature-256"] = "sha1=" + "0" * 40
    elif case == "empty digest":
        headers["X-Hub-Signature-256"] = "sha256="
    else:
        headers["X-Hub-Signature-256"] = "sha256=" + "Z" * 64
    status, answer, _ = await post(http, server.url + "/hooks/github", body, headers)
    assert status == 401, answer
    assert "error" in answer
    assert sum((await inbox.counts()).values()) == 0


async def test_signature_is_checked_before_the_delivery_headers(server, inbox, http):
    # Unsigned and without a delivery id: the refusal is about the signature (401), not 400.
    body = BODY.encode()
    status, _, _ = await post(http, server.url + "/hooks/github", body, {})
    assert status == 401


@pytest.mark.parametrize("missing", ["X-GitHub-Delivery", "X-GitHub-Event"])
async def test_signed_but_missing_delivery_headers_is_400(server, inbox, http, missing):
    body = BODY.encode()
    headers = github_headers(body, "guid-3")
    del headers[missing]
    status, answer, _ = await post(http, server.url + "/hooks/github", body, headers)
    assert status == 400
    assert missing in answer["error"]
    assert sum((await inbox.counts()).values()) == 0


async def test_signed_malformed_json_is_400(server, inbox, http):
    body = b'{"action": "opened",'
    status, answer, _ = await post(
        http, server.url + "/hooks/github", body, github_headers(body, "guid-4")
    )
    assert status == 400
    assert answer["error"].startswith("malformed JSON")
    assert sum((await inbox.counts()).values()) == 0


async def test_form_encoded_delivery_is_verified_on_the_raw_body(server, inbox, http):
    # GitHub's other content type: payload=<json>, signed as sent (form-encoded).
    body = urlencode({"payload": BODY}).encode()
    headers = github_headers(body, "guid-5", event="issues")
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    status, _, _ = await post(http, server.url + "/hooks/github", body, headers)
    assert status == 202
    assert (await stored(inbox, "github"))["guid-5"]["body"] == json.loads(BODY)


async def test_secret_is_keyed_as_utf8_text(server, inbox, http):
    # The test secret has non-ASCII letters: GitHub keys the HMAC with the secret's UTF-8.
    assert not GITHUB_SECRET.isascii()
    body = b"{}"
    status, _, _ = await post(
        http, server.url + "/hooks/github", body, github_headers(body, "guid-6", event="ping")
    )
    assert status == 202


async def test_json_sent_with_a_form_content_type_is_still_json(server, inbox, http):
    # curl -d sends application/x-www-form-urlencoded; the body decides, not the header.
    body = BODY.encode()
    headers = github_headers(body, "guid-7", event="issues")
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    status, _, _ = await post(http, server.url + "/hooks/github", body, headers)
    assert status == 202
