"""`onwatch demo`: the reference scenarios played step by step on a scratch inbox.

`scenarios` holds the steps, one module per scenario (no UI: tests play them headless);
`narrate` prints them where there is no terminal; `player` shows them in the real TUI; `live`
runs real worker processes; `desk` is what the two on-screen desks share.
"""

from __future__ import annotations

import sys


def run(*, live: bool = False) -> int:
    """Open the demo on a scratch inbox; return the process exit code.

    Without a terminal (piped output, CI), the scenarios are played headless and narrated.
    Each desk is imported only here: the scenarios must load without textual.
    """
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        from .narrate import narrate

        return narrate()
    if live:
        from .live import main as live_main

        return live_main()
    from .player import main

    return main()
