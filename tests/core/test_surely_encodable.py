"""checks.surely_encodable: the payload check a known duplicate takes instead of encoding
(Inbox.ingest). Its True must always mean that checks.encode accepts the payload, whatever
the payload and the limit; its False only sends the payload to encode."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from onwatch.core import BadInput
from onwatch.core.checks import encode, surely_encodable

# Text that costs the most per character: escapes (six characters each), four-byte UTF-8,
# lone surrogates (escaped when the payload is encoded again as ASCII).
COSTLY_TEXT = st.text(alphabet=st.sampled_from('\x00\x1f"\\\n\u2028\ud800é日𝄞a'), max_size=60)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.integers(min_value=-(2**1400), max_value=2**1400)
    | st.sampled_from([math.nan, math.inf, -math.inf, 2**63 - 1, -(2**63), 2**63])
    | st.floats()
    | st.text()
    | COSTLY_TEXT
    | st.binary(max_size=4)
    | st.builds(object)
)
KEYS = st.text(max_size=8) | COSTLY_TEXT | st.integers() | st.floats() | st.none()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)
# Flat objects with text keys: the shape the shortcut decides, so the one to attack.
FLAT = st.dictionaries(st.text(max_size=8) | COSTLY_TEXT, SCALARS, max_size=6)
LIMITS = st.integers(min_value=1, max_value=400) | st.just(1 << 20)


@settings(max_examples=3000, deadline=None)
# Found by this test: a lone surrogate makes the payload ASCII, and a character beyond the
# BMP then takes twelve bytes ("\ud834\udd1e").
@example(payload={"": "\x1f" * 6 + "\ud800𝄞", "\x1f": -(10**15)}, limit=90)
@given(payload=FLAT | VALUES | st.dictionaries(KEYS, SCALARS, max_size=6), limit=LIMITS)
def test_true_means_encode_accepts(payload, limit):
    if surely_encodable(payload, limit):
        encode(payload, limit)  # raises BadInput if the shortcut was wrong


@pytest.mark.parametrize(
    "payload",
    [
        {"n": 1, "event": "push", "repo": "acme/api", "text": "x" * 120},
        {"ok": True, "none": None, "ratio": 0.5, "name": "日本 ✓"},
        {},
    ],
)
def test_a_flat_webhook_body_is_decided_without_encoding(payload):
    assert surely_encodable(payload, 1 << 20)


@pytest.mark.parametrize(
    "payload, limit",
    [
        ({"nan": math.nan}, 1 << 20),
        ({"inf": -math.inf}, 1 << 20),
        ({"when": object()}, 1 << 20),
        ({1: "an int key"}, 1 << 20),
        ({"big": 2**64}, 1 << 20),
        ({"nested": {"a": 1}}, 1 << 20),
        ({"text": "x" * 40}, 100),  # might be over the limit: only encoding can tell
        (["a", "list"], 1 << 20),
        ("text", 1 << 20),
    ],
)
def test_anything_else_goes_to_encode(payload, limit):
    assert not surely_encodable(payload, limit)


def test_an_oversized_flat_body_is_refused_by_encode():
    assert not surely_encodable({"text": "x" * 200}, 100)
    with pytest.raises(BadInput, match="the limit is 100"):
        encode({"text": "x" * 200}, 100)
