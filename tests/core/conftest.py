"""Fixtures for the engine tests: a scratch inbox on a fake clock with the SPEC's settings."""

from __future__ import annotations

import pytest

from core import FakeClock, Inbox

T = 1_000_000
DAY = 86_400


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T)


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "inbox.db")


@pytest.fixture
async def inbox(path, clock):
    box = await Inbox.open(path, clock=clock)
    await box.configure(lease_ttl=120, max_attempts=3, outbox_gap=3600)
    yield box
    await box.close()
