"""POST /hooks/{source}: X-Onwatch-Signature (sha256= HMAC of the raw body), Idempotency-Key."""

from __future__ import annotations

import json

import pytest

from core.webhooks import Secrets

from .helpers import GITHUB_SECRET, HOOK_SECRET, generic_headers, github_signature, post, \
    stored


async def test_valid_delivery_is_stored_under_its_idempotency_key(server, inbox, http):
    url = server.url + "/hooks/ci"
    body = json.dumps({"build": 812, "result": "failed"}).encode()
    status, answer, _ = await post(http, url, body, generic_headers(body, "build-812"))
    assert (status, answer) == (202, {"stored": True})
    status, answer, _ = await post(http, url, body, generic_headers(body, "build-812"))
    assert (status, answer) == (200, {"stored": False, "duplicate": True})
    assert await stored(inbox, "ci") == {"build-812": {"build": 812, "result": "failed"}}


@pytest.mark.parametrize("case", ["tampered body", "wrong secret", "missing signature",
                                  "another source's secret"])
async def test_refused_signatures_store_nothing(server, inbox, http, case):
    body = b'{"build": 813}'
    headers = generic_headers(body, "build-813")
    if case == "tampered body":
        body = b'{"build": 814}'
    elif case == "wrong secret":
        headers["X-Onwatch-Signature"] = github_signature("wrong", body)
    elif case == "missing signature":
        del headers["X-Onwatch-Signature"]
    else:  # GitHub's secret does not open the ci hook
        headers["X-Onwatch-Signature"] = github_signature(GITHUB_SECRET, body)
    status, _, _ = await post(http, server.url + "/hooks/ci", body, headers)
    assert status == 401
    assert sum((await inbox.counts()).values()) == 0


@pytest.mark.parametrize("body, key", [(b'{"build": 815}', None), (b'{"build": 815}', " "),
                                       (b"not json", "k1"), (b"", "k2"), (b"NaN", "k3"),
                                       (b'{"a": 1}{"b": 2}', "k4")])
async def test_signed_but_no_key_or_not_json_is_400(server, inbox, http, body, key):
    status, answer, _ = await post(http, server.url + "/hooks/ci", body,
                                   generic_headers(body, key))
    assert status == 400, answer
    assert sum((await inbox.counts()).values()) == 0


async def test_overlong_idempotency_key_is_400(server, inbox, http):
    body = b"{}"
    status, _, _ = await post(http, server.url + "/hooks/ci", body,
                              generic_headers(body, "k" * 1025))
    assert status == 400
    assert sum((await inbox.counts()).values()) == 0


async def test_deeply_nested_json_is_400_not_a_crash(server, inbox, http):
    body = b"[" * 100_000 + b"]" * 100_000
    status, _, _ = await post(http, server.url + "/hooks/ci", body, generic_headers(body, "deep"))
    assert status == 400
    assert sum((await inbox.counts()).values()) == 0


@pytest.mark.parametrize("path", ["/hooks/unconfigured", "/hooks/CI", "/hooks/ci/extra",
                                  "/hooks/", "/", "/hooks/ci.json", "/admin"])
async def test_unknown_or_unconfigured_routes_are_404(server, inbox, http, path):
    body = b"{}"
    async with http.post(server.url + path, data=body,
                         headers=generic_headers(body, "k")) as response:
        assert response.status == 404
    assert sum((await inbox.counts()).values()) == 0


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
        async with http.post(f"{server.url}/hooks/{hook}", data=body,
                             headers=generic_headers(body, "k", secret=HOOK_SECRET)) as r:
            assert r.status == 404


async def test_the_access_log_line_escapes_a_hostile_delivery_id(server, inbox, http, caplog):
    caplog.set_level("INFO", logger="onwatch.webhooks")
    body, key = b"{}", "k\u202eevil\u200b"
    headers = generic_headers(body, "x")
    headers["Idempotency-Key"] = key
    status, _, _ = await post(http, server.url + "/hooks/ci", body, headers)
    assert status == 202 and key in await stored(inbox, "ci")
    [line] = [r.getMessage() for r in caplog.records if "POST /hooks/ci" in r.getMessage()]
    assert "ci/k\\u202eevil\\u200b stored" in line
