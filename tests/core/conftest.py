"""Fixtures for the engine tests: a scratch inbox on a fake clock with the scenarios' settings
(docs/rules.md#the-reference-scenarios).

The rule tests are one conformance suite: in the modules named in CONFORMANCE every test that
uses an inbox runs once per backend (`[sqlite]`, `[postgresql]`) through the one parametrized
fixture `inbox_target`, which `path` and `inbox` build on. On PostgreSQL each test gets a
fresh schema (a URL whose search_path names it) in a database of the session's server
(tests/pg/server.py) and opens its "default" inbox, so `Inbox.open(path)` means the same
inbox on both. Elsewhere `path` is a file.
"""

from __future__ import annotations

import pytest

from core import FakeClock, Inbox

T = 1_000_000
DAY = 86_400

BACKENDS = ("sqlite", "postgresql")
CONFORMANCE = {"test_scenarios", "test_rules", "test_state_machine"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    if module in CONFORMANCE and "inbox_target" in metafunc.fixturenames:
        metafunc.parametrize("inbox_target", BACKENDS, indirect=True)


@pytest.fixture
def inbox_target(request, tmp_path) -> str:
    """What `Inbox.open` takes: a file path, or the URL of a fresh PostgreSQL database."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        return str(tmp_path / "inbox.db")
    from tests.pg.server import Unavailable, cluster
    try:
        return cluster().new_schema()
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T)


@pytest.fixture
def path(inbox_target) -> str:
    return inbox_target


@pytest.fixture
async def inbox(path, clock):
    box = await Inbox.open(path, clock=clock)
    await box.configure(lease_ttl=120, max_attempts=3, outbox_gap=3600)
    yield box
    await box.close()
