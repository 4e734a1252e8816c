"""`onwatch demo`: the SPEC §2 scenarios played step by step on a scratch inbox.

`scenarios` holds the steps (no UI: tests play them headless); `player` shows them in the real
TUI; `live` runs real worker processes.
"""

from __future__ import annotations


def run(*, live: bool = False) -> int:
    """Open the demo player on a scratch inbox; return the process exit code."""
    from .player import main  # imported here: the scenarios must load without textual

    return main(live=live)
