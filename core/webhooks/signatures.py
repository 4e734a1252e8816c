"""Webhook signature checks over the raw body, standard library only.

Every check raises `SignatureError` (with a short reason fit for a log line and the 401
answer) or returns normally. Each scheme has a `Verifier` built from the request's headers
before the body is read: it refuses a malformed header at once, and is then fed the body in
pieces as they arrive (`update`), so the MAC of the signed bytes is computed exactly once per
configured secret, however many signatures the header claims, and no single step hashes a
whole body. `check` compares every candidate with every digest (`hmac.compare_digest`, no
early exit), so a rotation can keep the old and the new secret valid at once. A header may
carry at most `MAX_SIGNATURES` candidates: a sender signs once per secret it holds, and a
header of thousands of `v1=` values is an attack, refused before the body is read.

`verify_sha256_header`, `verify_stripe` and `verify_standard` check a whole body in one call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Callable, Sequence

STRIPE_TOLERANCE = 300  # seconds, either way: Stripe's documented default
STANDARD_TOLERANCE = 300  # seconds, either way: the Standard Webhooks specification's window
_MAX_TIMESTAMP_DIGITS = 12  # a Unix time in seconds; refuse absurd values before int()
# Signatures one header may offer. Stripe signs with each of an endpoint's live secrets (two
# while one is rolled), Standard Webhooks senders likewise; eight leaves room for any sender.
MAX_SIGNATURES = 8
_DIGEST_SIZE = hashlib.sha256().digest_size


class SignatureError(ValueError):
    """The request is not signed by a configured secret; `reason` says how it failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Verifier:
    """One request's signature check: feed the body with `update`, then call `check`.

    `prefix` is what the scheme signs before the body (a timestamp, an id); `candidates` are
    the digests the header offers, already decoded; `after` runs once a signature matched
    (the timestamp window), so a stale but genuine request says "stale", not "bad signature".
    """

    def __init__(
        self,
        secrets: Sequence[bytes],
        prefix: bytes,
        candidates: Sequence[bytes],
        *,
        after: Callable[[], None] | None = None,
    ) -> None:
        if not secrets:
            raise SignatureError("no secret configured")
        self._macs = [hmac.new(secret, prefix, hashlib.sha256) for secret in secrets]
        self._candidates = list(candidates)
        self._after = after

    def update(self, chunk: bytes) -> None:
        """Hash the next piece of the body (in arrival order)."""
        for mac in self._macs:
            mac.update(chunk)

    def check(self) -> None:
        """Raise SignatureError unless some candidate is the MAC under some secret."""
        digests = [mac.digest() for mac in self._macs]
        matched = False
        for given in self._candidates:  # no early exit: the time does not say which matched
            for digest in digests:
                matched |= hmac.compare_digest(digest, given)
        if not matched:
            raise SignatureError("bad signature")
        if self._after is not None:
            self._after()


def hmac_sha256_hex(secret: bytes, message: bytes) -> str:
    """The lower-case hex HMAC-SHA256 of `message` under `secret`."""
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _too_many(name: str) -> SignatureError:
    return SignatureError(f"{name} offers more than {MAX_SIGNATURES} signatures")


def _hex_digest(text: str) -> bytes | None:
    """The digest a hex signature spells, or None if it cannot be a SHA-256 digest."""
    if len(text) != 2 * _DIGEST_SIZE or not text.isascii():
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None


def _check_window(sent_at: int, now: float, tolerance: int) -> Callable[[], None]:
    def check() -> None:
        if abs(now - sent_at) > tolerance:
            raise SignatureError(
                f"stale timestamp ({int(now - sent_at)} s off; tolerance {tolerance} s)"
            )

    return check


def sha256_header_verifier(
    header: str | None, secrets: Sequence[bytes], *, name: str = "X-Hub-Signature-256"
) -> Verifier:
    """The check of a `sha256=<hex HMAC-SHA256 of the raw body>` header (GitHub's scheme).
    Raises SignatureError if the header is missing or malformed."""
    if not secrets:
        raise SignatureError("no secret configured")
    if not header:
        raise SignatureError(f"missing {name}")
    scheme, sep, digest = header.strip().partition("=")
    if not sep or scheme.lower() != "sha256" or not digest:
        raise SignatureError(f"{name} is not of the form sha256=<hex>")
    given = _hex_digest(digest)
    # A value that is no digest at all can never match; it is still hashed against, so a
    # wrong signature costs the same whatever it looks like.
    return Verifier(secrets, b"", [given] if given is not None else [])


def verify_sha256_header(
    body: bytes, header: str | None, secrets: Sequence[bytes], *, name: str = "X-Hub-Signature-256"
) -> None:
    """Check a `sha256=<hex HMAC-SHA256 of the raw body>` header (GitHub's scheme).
    Raises SignatureError."""
    verifier = sha256_header_verifier(header, secrets, name=name)
    verifier.update(body)
    verifier.check()


def parse_stripe_header(header: str) -> tuple[int, list[str]]:
    """Split `t=<unix time>,v1=<hex>[,v1=<hex>…]` into the timestamp and the v1 signatures.

    Other schemes (v0, future ones) are ignored, as Stripe's own libraries do. Raises
    SignatureError if the timestamp or every v1 signature is missing, or if there are more
    than MAX_SIGNATURES v1 signatures.
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
            if len(signatures) == MAX_SIGNATURES:
                raise _too_many("Stripe-Signature")
            signatures.append(value)
    if timestamp is None:
        raise SignatureError("Stripe-Signature has no timestamp")
    if not signatures:
        raise SignatureError("Stripe-Signature has no v1 signature")
    return timestamp, signatures


def stripe_verifier(
    header: str | None,
    secrets: Sequence[bytes],
    *,
    now: float,
    tolerance: int = STRIPE_TOLERANCE,
) -> Verifier:
    """The check of a `Stripe-Signature` header: some v1 value must be the hex HMAC-SHA256 of
    `"{t}.{raw body}"` under some configured secret, and `t` within `tolerance` seconds of
    `now` (either way). Raises SignatureError if the header is missing or malformed."""
    if not secrets:
        raise SignatureError("no secret configured")
    if not header:
        raise SignatureError("missing Stripe-Signature")
    timestamp, signatures = parse_stripe_header(header)
    given = [digest for value in signatures if (digest := _hex_digest(value)) is not None]
    return Verifier(
        secrets,
        str(timestamp).encode("ascii") + b".",
        given,
        after=_check_window(timestamp, now, tolerance),
    )


def verify_stripe(
    body: bytes,
    header: str | None,
    secrets: Sequence[bytes],
    *,
    now: float,
    tolerance: int = STRIPE_TOLERANCE,
) -> int:
    """Check a `Stripe-Signature` header against the whole body (see stripe_verifier).
    Returns `t`; raises SignatureError."""
    verifier = stripe_verifier(header, secrets, now=now, tolerance=tolerance)
    verifier.update(body)
    verifier.check()
    return parse_stripe_header(header or "")[0]


def standard_verifier(
    msg_id: str | None,
    timestamp: str | None,
    signature: str | None,
    secrets: Sequence[bytes],
    *,
    now: float,
    tolerance: int = STANDARD_TOLERANCE,
) -> Verifier:
    """The check of a Standard Webhooks delivery (the `webhook-id`, `webhook-timestamp` and
    `webhook-signature` headers' values): some space-separated `v1,<base64>` signature must be
    the HMAC-SHA256 of `"{id}.{timestamp}.{raw body}"` under some configured key (the secret's
    base64-decoded bytes), and the timestamp within `tolerance` seconds of `now` either way.

    The id and the timestamp are signed, so a captured request cannot be replayed under a new
    id (the signature no longer matches) nor after the window (stale). Raises SignatureError
    if a header is missing or malformed."""
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
    offered = 0
    for item in signature.split():
        version, sep, value = item.partition(",")
        if version != "v1" or not sep:
            continue  # v1a (asymmetric) and future versions: not ours to check
        offered += 1
        if offered > MAX_SIGNATURES:
            raise _too_many("webhook-signature")
        try:
            given.append(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            continue  # not base64: can never match
    if not given:
        raise SignatureError("webhook-signature has no v1,<base64> signature")
    # Header values arrive decoded as UTF-8 with surrogateescape: encoding them back the same
    # way gives the bytes the sender signed.
    try:
        prefix = msg_id.encode("utf-8", "surrogateescape") + b"." + timestamp.encode("ascii") + b"."
    except UnicodeEncodeError:
        raise SignatureError("webhook-id is not valid UTF-8") from None
    return Verifier(secrets, prefix, given, after=_check_window(int(timestamp), now, tolerance))


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
    """Check a Standard Webhooks delivery against the whole body (see standard_verifier).
    Returns the timestamp; raises SignatureError."""
    verifier = standard_verifier(
        msg_id, timestamp, signature, secrets, now=now, tolerance=tolerance
    )
    verifier.update(body)
    verifier.check()
    return int(timestamp or 0)
