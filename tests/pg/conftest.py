"""The PostgreSQL-only tests: a fresh database of the session's server per test, or a skip
that says why there is no server."""

from __future__ import annotations

import re

from typing import Callable

import pytest

from tests.pg.proxy import Proxy
from tests.pg.server import Cluster, cluster_or_skip


@pytest.fixture
def pg() -> Cluster:
    return cluster_or_skip()


@pytest.fixture
def record_statements(monkeypatch) -> Callable[[], list[str]]:
    """`record_statements()` starts recording what every psycopg connection of this process
    sends, each statement as its first two words, into the list it returns (until the test
    ends, or monkeypatch.undo())."""

    def start() -> list[str]:
        import psycopg

        sent: list[str] = []
        execute = psycopg.Connection.execute

        def recorded(self, query, *args, **kwargs):
            # A session statement's argument is left out: "EXECUTE onwatch_count(7)" is
            # recorded as "EXECUTE onwatch_count".
            sent.append(re.sub(r"(?<=\w)\(.*", "", " ".join(str(query).split()[:2])))
            return execute(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", recorded)
        return sent

    return start


@pytest.fixture
def url(pg) -> str:
    """An empty database: these tests also check what opening one creates."""
    return pg.new_database(schema=False)


@pytest.fixture
def proxy(pg):
    """A TCP proxy in front of the test server (tests/pg/proxy.py): its faults on demand."""
    if pg.owned is None:
        pytest.skip("needs the server the tests started (its port is proxied)")
    proxied = Proxy(pg.owned.port)
    yield proxied
    proxied.close()
