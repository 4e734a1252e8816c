"""Webhook signature checks: pure functions over the raw body, standard library only.

Every check raises `SignatureError` (with a short reason fit for a log line and the 401
answer) or returns normally. Digests are compared with `hmac.compare_digest`, and against every
configured secret, so a rotation can keep the old and the new secret valid at once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Sequence

STRIPE_TOLERANCE = 300  # seconds, either way: Stripe's documented default
STANDARD_TOLERANCE = 300  # seconds, either way: the Standard Webhooks specification's window
_MAX_TIMESTAMP_DIGITS = 12  # a Unix time in seconds; refuse absurd values before int()


class SignatureError(ValueError):
    """The request is not signed by a configured secret; `reason` says how it failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def hmac_sha256_hex(secret: bytes, message: bytes) -> str:
    """The lower-case hex HMAC-SHA256 of `message` under `secret`."""
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _matches(given: str, message: bytes, secrets: Sequence[bytes]) -> bool:
    """True if `given` is the hex HMAC of `message` under any secret (constant time each)."""
    if not given.isascii():
        return False  # compare_digest refuses non-ASCII str; such a value can never match
    given_bytes = given.lower().encode("ascii")
    matched = False
    for secret in secrets:  # no early exit: the time taken does not say which secret matched
        expected = hmac_sha256_hex(secret, message).encode("ascii")
        matched |= hmac.compare_digest(expected, given_bytes)
    return matched


def verify_sha256_header(
    body: bytes, header: str | None, secrets: Sequence[bytes], *, name: str = "X-Hub-Signature-256"
) -> None:
    """Check a `sha256=<hex HMAC-SHA256 of the raw body>` header (GitHub's scheme, also used
    by the generic route). Raises SignatureError."""
    if not secrets:
        raise SignatureError("no secret configured")
    if not header:
        raise SignatureError(f"missing {name}")
    scheme, sep, digest = header.strip().partition("=")
    if not sep or scheme.lower() != "sha256" or not digest:
        raise SignatureError(f"{name} is not of the form sha256=<hex>")
    if not _matches(digest, body, secrets):
        raise SignatureError("bad signature")


def parse_stripe_header(header: str) -> tuple[int, list[str]]:
    """Split `t=<unix time>,v1=<hex>[,v1=<hex>…]` into the timestamp and the v1 signatures.

    Other schemes (v0, future ones) are ignored, as Stripe's own libraries do. Raises
    SignatureError if the timestamp or every v1 signature is missing.
    """
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            continue
        if key == "t":
            if not (value.isascii() and value.isdigit() and len(value) <= _MAX_TIMESTAMP_DIGITS):
                raise SignatureError("Stripe-Signature has a malformed timestamp")
            timestamp = int(value)
        elif key == "v1" and value:
            signatures.append(value)
    if timestamp is None:
        raise SignatureError("Stripe-Signature has no timestamp")
    if not signatures:
        raise SignatureError("Stripe-Signature has no v1 signature")
    return timestamp, signatures


def verify_stripe(
    body: bytes,
    header: str | None,
    secrets: Sequence[bytes],
    *,
    now: float,
    tolerance: int = STRIPE_TOLERANCE,
) -> int:
    """Check a `Stripe-Signature` header: some v1 value must be the hex HMAC-SHA256 of
    `"{t}.{raw body}"` under some configured secret, and `t` within `tolerance` seconds of
    `now` (either way). Returns `t`; raises SignatureError."""
    if not secrets:
        raise SignatureError("no secret configured")
    if not header:
        raise SignatureError("missing Stripe-Signature")
    timestamp, signatures = parse_stripe_header(header)
    signed = str(timestamp).encode("ascii") + b"." + body
    if not any([_matches(given, signed, secrets) for given in signatures]):
        raise SignatureError("bad signature")
    if abs(now - timestamp) > tolerance:
        raise SignatureError(
            f"stale timestamp ({int(now - timestamp)} s off; tolerance {tolerance} s)"
        )
    return timestamp


def verify_standard(
    body: bytes,
    msg_id: str | None,
    timestamp: str | None,
    signature: str | None,
    secrets: Sequence[bytes],
    *,
    now: float,
    tolerance: int = STANDARD_TOLERANCE,
) -> int:
    """Check a Standard Webhooks delivery (the `webhook-id`, `webhook-timestamp` and
    `webhook-signature` headers' values): some space-separated `v1,<base64>` signature must be
    the HMAC-SHA256 of `"{id}.{timestamp}.{raw body}"` under some configured key (the secret's
    base64-decoded bytes), and the timestamp within `tolerance` seconds of `now` either way.

    The id and the timestamp are signed, so a captured request cannot be replayed under a new
    id (the signature no longer matches) nor after the window (stale). Returns the timestamp;
    raises SignatureError."""
    if not secrets:
        raise SignatureError("no secret configured")
    for name, value in (
        ("webhook-id", msg_id),
        ("webhook-timestamp", timestamp),
        ("webhook-signature", signature),
    ):
        if not value:
            raise SignatureError(f"missing {name}")
    assert msg_id and timestamp and signature  # for the type checker: checked just above
    if not (
        timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= _MAX_TIMESTAMP_DIGITS
    ):
        raise SignatureError("webhook-timestamp is not a Unix time in seconds")
    given = []
    for item in signature.split():
        version, sep, value = item.partition(",")
        if version != "v1" or not sep:
            continue  # v1a (asymmetric) and future versions: not ours to check
        try:
            given.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue  # not base64: can never match
    if not given:
        raise SignatureError("webhook-signature has no v1,<base64> signature")
    # Header values arrive decoded as UTF-8 with surrogateescape: encoding them back the same
    # way gives the bytes the sender signed.
    try:
        signed = (
            msg_id.encode("utf-8", "surrogateescape")
            + b"."
            + timestamp.encode("ascii")
            + b"."
            + body
        )
    except UnicodeEncodeError:
        raise SignatureError("webhook-id is not valid UTF-8") from None
    expected = [hmac.new(secret, signed, hashlib.sha256).digest() for secret in secrets]
    matched = False
    for digest in given:  # no early exit: the time taken does not say which one matched
        for wanted in expected:
            matched |= hmac.compare_digest(wanted, digest)
    if not matched:
        raise SignatureError("bad signature")
    sent_at = int(timestamp)
    if abs(now - sent_at) > tolerance:
        raise SignatureError(
            f"stale timestamp ({int(now - sent_at)} s off; tolerance {tolerance} s)"
        )
    return sent_at
