"""Search finds the same events on both backends, and an id always finds itself
(docs/rules.md#intake-and-deduplication).

The rule: the letters A to Z match either case; every other character matches only itself,
as stored (É is not é, and ids are never normalised: NFC "é" and NFD "e\\u0301" are two
different ids, and two different events). The property test stores the same events in a
file and in a PostgreSQL inbox and asks both, and a model of the rule, the same searches.
"""

from __future__ import annotations

import asyncio
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onwatch.core import FakeClock, Inbox

from .conftest import T

pytestmark = pytest.mark.backends  # the conformance suite: once per backend

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")


async def found(box: Inbox, search: str) -> list[str]:
    return [e.source_id for e in await box.events("pending", search=search)]


async def test_an_id_finds_itself_whatever_its_letters(inbox):
    ids = ["ÉCOLE-1", "straße-2", "KELVIN-\u212a", "İstanbul-4", "ﬁle-5", "Ǆ-6"]
    for source_id in ids:
        await inbox.ingest("chat", source_id, None)
    for source_id in ids:
        assert await found(inbox, source_id) == [source_id]


async def test_a_to_z_ignore_case_and_nothing_else_does(inbox):
    await inbox.ingest("chat", "ÉCOLE-1", None)
    await inbox.ingest("chat", "école-2", None)
    assert await found(inbox, "cole") == ["ÉCOLE-1", "école-2"]
    assert await found(inbox, "ÉCOLE") == ["ÉCOLE-1"]
    assert await found(inbox, "école") == ["école-2"]
    assert await found(inbox, "éCOLE") == ["école-2"]  # é as typed, COLE in either case


async def test_ids_that_differ_only_by_normalisation_are_two_events(inbox):
    assert NFC != NFD
    assert await inbox.ingest("chat", NFC, None) is True
    assert await inbox.ingest("chat", NFD, None) is True  # not a duplicate: another id
    assert (await inbox.counts())["pending"] == 2
    assert await found(inbox, NFC) == [NFC]
    assert await found(inbox, NFD) == [NFD]
    assert await found(inbox, "caf") == [NFC, NFD]


# --- both backends, one property ---------------------------------------------------------

ALPHABET = "aAzZéÉeE\u0301ßsSkK\u212aİiIı-1 ﬁ"
TEXTS = st.text(alphabet=ALPHABET, min_size=1, max_size=6)


def model(stored: list[str], search: str) -> list[str]:
    """The rule, written again: the source ("q") holds no letter of the alphabet."""
    fold = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
    return [s for s in stored if search.translate(fold) in s.translate(fold)]


def test_both_backends_and_the_rule_agree_on_every_search(tmp_path):
    from tests.pg.server import cluster_or_skip

    cluster = cluster_or_skip()
    counter = iter(range(10**6))

    @settings(
        max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.lists(TEXTS, min_size=1, max_size=8, unique=True), st.lists(TEXTS, max_size=6))
    def check(ids: list[str], searches: list[str]) -> None:
        searches = searches + [s[1:3] for s in ids if len(s) > 2] + ids

        async def run() -> None:
            file = str(tmp_path / f"s{next(counter)}.db")
            boxes = [
                await Inbox.open(file, clock=FakeClock(T)),
                await Inbox.open(cluster.new_schema(), clock=FakeClock(T)),
            ]
            try:
                for box in boxes:
                    for source_id in ids:
                        assert await box.ingest("q", source_id, None)
                for search in searches:
                    got = [sorted(await found(box, search)) for box in boxes]
                    assert got[0] == got[1] == sorted(model(ids, search)), search
            finally:
                for box in boxes:
                    await box.close()

        asyncio.run(run())

    check()
