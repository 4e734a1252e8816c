"""Checks over the whole test session."""

from __future__ import annotations

import sys

import pytest

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
