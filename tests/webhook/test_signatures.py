"""The pure verification functions against independently computed signatures."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from core.webhooks.signatures import SignatureError, parse_stripe_header, \
    verify_sha256_header, verify_stripe

from .helpers import github_signature, stripe_signature

T = 1_700_000_000


@given(body=st.binary(max_size=512), secret=st.text(min_size=1, max_size=40))
def test_sha256_header_accepts_exactly_the_documented_signature(body, secret):
    key = secret.encode()
    verify_sha256_header(body, github_signature(secret, body), [key])
    verify_sha256_header(body, github_signature(secret, body).upper().replace("SHA256", "sha256"),
                         [key])
    with pytest.raises(SignatureError):
        verify_sha256_header(body + b"!", github_signature(secret, body), [key])
    with pytest.raises(SignatureError):
        verify_sha256_header(body, github_signature(secret + "x", body), [key])


@pytest.mark.parametrize("header", [None, "", "sha256", "sha256=", "md5=abc", "sha256=\u00e9",
                                    "sha256=" + "0" * 64])
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


@pytest.mark.parametrize("offset", [-301, 301, -10**6])
def test_stripe_refuses_stale_timestamps(offset):
    body = b"{}"
    with pytest.raises(SignatureError, match="stale timestamp"):
        verify_stripe(body, stripe_signature(body, ["k"], T + offset), [b"k"], now=T)


def test_stripe_header_parsing():
    assert parse_stripe_header("t=12,v1=ab,v0=cd,v1=ef,x") == (12, ["ab", "ef"])
    assert parse_stripe_header(" t=12 , v1=ab ") == (12, ["ab"])
    for header in ("v1=ab", "t=12", "t=12,v0=ab", "t=-1,v1=ab", "t=1e3,v1=ab", "t=,v1=ab",
                   "t=1234567890123,v1=ab", "t=\u0661\u0662,v1=ab"):
        with pytest.raises(SignatureError):
            parse_stripe_header(header)


def test_stripe_rotation_any_v1_against_any_secret():
    body = b'{"id": "evt"}'
    both = stripe_signature(body, ["new", "old"], T)
    for configured in ([b"new"], [b"old"], [b"old", b"new"]):
        verify_stripe(body, both, configured, now=T)
    with pytest.raises(SignatureError, match="bad signature"):
        verify_stripe(body, both, [b"other"], now=T)
