"""The pure verification functions against independently computed signatures."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from hypothesis import given, strategies as st
from standardwebhooks import Webhook

from onwatch.core.webhooks.signatures import (
    SignatureError,
    parse_stripe_header,
    verify_sha256_header,
    verify_standard,
    verify_stripe,
)

from .helpers import github_signature, stripe_signature

T = 1_700_000_000


@given(body=st.binary(max_size=512), secret=st.text(min_size=1, max_size=40))
def test_sha256_header_accepts_exactly_the_documented_signature(body, secret):
    key = secret.encode()
    verify_sha256_header(body, github_signature(secret, body), [key])
    verify_sha256_header(
        body, github_signature(secret, body).upper().replace("SHA256", "sha256"), [key]
    )
    with pytest.raises(SignatureError):
        verify_sha256_header(body + b"!", github_signature(secret, body), [key])
    with pytest.raises(SignatureError):
        verify_sha256_header(body, github_signature(secret + "x", body), [key])


@pytest.mark.parametrize(
    "header", [None, "", "sha256", "sha256=", "md5=abc", "sha256=\u00e9", "sha256=" + "0" * 64]
)
def test_sha256_header_refusals(header):
    with pytest.raises(SignatureError):
        verify_sha256_header(b"{}", header, [b"s"])


def test_any_configured_secret_opens_it_and_none_configured_refuses():
    body = b"{}"
    verify_sha256_header(body, github_signature("old", body), [b"new", b"old"])
    with pytest.raises(SignatureError, match="no secret"):
        verify_sha256_header(body, github_signature("old", body), [])


@given(body=st.binary(max_size=512), offset=st.integers(-300, 300))
def test_stripe_accepts_the_documented_signature_within_tolerance(body, offset):
    verify_stripe(body, stripe_signature(body, ["whsec_a"], T + offset), [b"whsec_a"], now=T)


@pytest.mark.parametrize("offset", [-301, 301, -(10**6)])
def test_stripe_refuses_stale_timestamps(offset):
    body = b"{}"
    with pytest.raises(SignatureError, match="stale timestamp"):
        verify_stripe(body, stripe_signature(body, ["k"], T + offset), [b"k"], now=T)


def test_stripe_header_parsing():
    assert parse_stripe_header("t=12,v1=ab,v0=cd,v1=ef,x") == (12, ["ab", "ef"])
    assert parse_stripe_header(" t=12 , v1=ab ") == (12, ["ab"])
    for header in (
        "v1=ab",
        "t=12",
        "t=12,v0=ab",
        "t=-1,v1=ab",
        "t=1e3,v1=ab",
        "t=,v1=ab",
        "t=1234567890123,v1=ab",
        "t=\u0661\u0662,v1=ab",
    ):
        with pytest.raises(SignatureError):
            parse_stripe_header(header)


def test_stripe_rotation_any_v1_against_any_secret():
    body = b'{"id": "evt"}'
    both = stripe_signature(body, ["new", "old"], T)
    for configured in ([b"new"], [b"old"], [b"old", b"new"]):
        verify_stripe(body, both, configured, now=T)
    with pytest.raises(SignatureError, match="bad signature"):
        verify_stripe(body, both, [b"other"], now=T)


@given(
    body=st.binary(max_size=512).filter(lambda b: _utf8(b)),
    msg_id=st.text(
        st.characters(min_codepoint=33, max_codepoint=0x2FFF, exclude_categories=("Cs",)),
        min_size=1,
        max_size=40,
    ),
    key=st.binary(min_size=16, max_size=64),
    offset=st.integers(-300, 300),
)
def test_standard_accepts_what_the_reference_library_signs(body, msg_id, key, offset):
    secret = "whsec_" + base64.b64encode(key).decode()
    at = dt.datetime.fromtimestamp(T + offset, dt.timezone.utc)
    signature = Webhook(secret).sign(msg_id, at, body.decode())
    assert verify_standard(body, msg_id, str(T + offset), signature, [key], now=T) == T + offset
    for bad_body, bad_id, bad_t in (
        (body + b" ", msg_id, T + offset),
        (body, msg_id + "x", T + offset),
        (body, msg_id, T + offset + 1),
    ):
        with pytest.raises(SignatureError, match="bad signature"):
            verify_standard(bad_body, bad_id, str(bad_t), signature, [key], now=T)
    with pytest.raises(SignatureError, match="bad signature"):
        verify_standard(body, msg_id, str(T + offset), signature, [key + b"!"], now=T)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("offset", [-301, 301, -(10**6)])
def test_standard_refuses_stale_timestamps(offset):
    key = b"k" * 32
    at = dt.datetime.fromtimestamp(T + offset, dt.timezone.utc)
    signature = Webhook(key).sign("msg", at, "{}")
    with pytest.raises(SignatureError, match="stale timestamp"):
        verify_standard(b"{}", "msg", str(T + offset), signature, [key], now=T)


@pytest.mark.parametrize(
    "msg_id, timestamp, signature",
    [
        (None, str(T), "v1,AAAA"),
        ("m", None, "v1,AAAA"),
        ("m", str(T), None),
        ("", str(T), "x"),
        ("m", "", "v1,AAAA"),
        ("m", str(T), ""),
        ("m", "1e9", "v1,AAAA"),
        ("m", "-5", "v1,AAAA"),
        ("m", "9" * 13, "v1,AAAA"),
        ("m", "\u0661", "v1,AAAA"),
        ("m", str(T), "v1"),
        ("m", str(T), "v2,AAAA"),
        ("m", str(T), "v1,@@@@"),
        ("m", str(T), "v1,AAAA v1a,BBBB"),
        ("\ud800", str(T), "v1,AAAA"),
    ],
)
def test_standard_refusals_are_signature_errors(msg_id, timestamp, signature):
    with pytest.raises(SignatureError):
        verify_standard(b"{}", msg_id, timestamp, signature, [b"k" * 32], now=T)


def test_standard_rotation_any_signature_against_any_key():
    old, new = b"o" * 24, b"n" * 24
    at = dt.datetime.fromtimestamp(T, dt.timezone.utc)
    both = " ".join(Webhook(k).sign("m", at, "{}") for k in (new, old))
    for configured in ([new], [old], [old, new]):
        verify_standard(b"{}", "m", str(T), both, configured, now=T)
    with pytest.raises(SignatureError, match="bad signature"):
        verify_standard(b"{}", "m", str(T), both, [b"x" * 24], now=T)
    with pytest.raises(SignatureError, match="no secret"):
        verify_standard(b"{}", "m", str(T), both, [], now=T)


def count_macs(monkeypatch) -> list[bytes]:
    """Every HMAC the verifiers start, by key: the cost of a check is this list's length
    times the body's size."""
    from onwatch.core.webhooks import signatures

    made: list[bytes] = []
    real = signatures.hmac.new

    def new(key, *args, **kwargs):
        made.append(key)
        return real(key, *args, **kwargs)

    monkeypatch.setattr(signatures.hmac, "new", new)
    return made


def test_the_mac_is_computed_once_per_secret_whatever_the_stripe_header_offers(monkeypatch):
    """Before, every v1 value cost an HMAC of the whole body: 1,600 values in one header
    were 1,600 passes over a megabyte."""
    body = b"{}" * 50_000
    header = stripe_signature(body, ["a"], T) + "".join(",v1=" + "0" * 64 for _ in range(7))
    made = count_macs(monkeypatch)  # the signer above uses hmac too: count from here on
    verify_stripe(body, header, [b"x", b"a"], now=T)
    assert made == [b"x", b"a"]
    made.clear()
    with pytest.raises(SignatureError, match="offers more than 8 signatures"):
        verify_stripe(body, header + ",v1=" + "0" * 64, [b"a"], now=T)
    with pytest.raises(SignatureError, match="offers more than 8 signatures"):
        verify_stripe(body, "t=%d," % T + ",".join("v1=0" for _ in range(1600)), [b"a"], now=T)
    assert made == [], "a header over the cap is refused before any hashing"


def test_the_mac_is_computed_once_per_secret_whatever_the_standard_header_offers(monkeypatch):
    key = b"k" * 32
    at = dt.datetime.fromtimestamp(T, dt.timezone.utc)
    good = Webhook(key).sign("m", at, "{}")
    junk = " ".join("v1," + base64.b64encode(bytes([n]) * 32).decode() for n in range(7))
    made = count_macs(monkeypatch)
    verify_standard(b"{}", "m", str(T), f"{junk} {good}", [b"o" * 32, key], now=T)
    assert made == [b"o" * 32, key]
    made.clear()
    with pytest.raises(SignatureError, match="offers more than 8 signatures"):
        verify_standard(b"{}", "m", str(T), f"{junk} {good} {good}", [key], now=T)
    assert made == []


def test_a_body_fed_in_pieces_verifies_like_a_whole_one():
    from onwatch.core.webhooks.signatures import stripe_verifier

    body = bytes(range(256)) * 1000
    verifier = stripe_verifier(stripe_signature(body, ["s"], T), [b"s"], now=T)
    for start in range(0, len(body), 4096):
        verifier.update(body[start : start + 4096])
    verifier.check()
    tampered = stripe_verifier(stripe_signature(body, ["s"], T), [b"s"], now=T)
    tampered.update(body[:-1])
    with pytest.raises(SignatureError, match="bad signature"):
        tampered.check()
