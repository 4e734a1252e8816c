"""What every test folder shares: the two-backend run, and checks over the whole session.

One conformance suite: in a module marked `pytestmark = pytest.mark.backends`, every test
that uses `inbox_target` runs once per backend (`[sqlite]`, `[postgresql]`). On PostgreSQL
each test gets a fresh schema (a URL whose search_path names it) in a database of the
session's server (tests/pg/server.py) and opens its "default" inbox, so `Inbox.open(target)`
means the same inbox on both. Elsewhere `inbox_target` is a file.
"""

from __future__ import annotations

import sys

import pytest

BACKENDS = ("sqlite", "postgresql")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "inbox_target" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "backends"
    ):
        metafunc.parametrize("inbox_target", BACKENDS, indirect=True)


@pytest.fixture
def inbox_target(request: pytest.FixtureRequest, tmp_path) -> str:
    """What `Inbox.open` takes: a file path, or the URL of a fresh PostgreSQL schema."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        return str(tmp_path / "inbox.db")
    from tests.pg.server import cluster_or_skip

    return cluster_or_skip().new_schema()


# The repository keeps core/, tui/ and cli/ at its top, so from its root they can also be
# imported as top-level packages: a second copy of every module, whose classes are not the
# installed package's. Only `onwatch.*` is the package; a test that says `import core` fails
# here instead of passing against the wrong copy.
TOP_LEVEL_FOLDERS = ("core", "tui", "cli")


def pytest_collection_finish(session: pytest.Session) -> None:
    stray = [name for name in TOP_LEVEL_FOLDERS if name in sys.modules]
    if stray:
        raise pytest.UsageError(
            f"imported {', '.join(stray)} as top-level packages; the package is onwatch "
            f"(import onwatch.{stray[0]})"
        )
