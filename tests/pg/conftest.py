"""The PostgreSQL-only tests: a fresh database of the session's server per test, or a skip
that says why there is no server."""

from __future__ import annotations

import pytest

from tests.pg.server import Cluster, cluster_or_skip


@pytest.fixture
def pg() -> Cluster:
    return cluster_or_skip()


@pytest.fixture
def url(pg) -> str:
    """An empty database: these tests also check what opening one creates."""
    return pg.new_database(schema=False)
