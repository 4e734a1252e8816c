"""The virtual environment the peer queues run in: made on first use, never onwatch's own.

The queues onwatch is measured against (tests/bench/bench_peers.py, bench_queues.py) are not
dependencies of the project: they are installed, pinned, into an environment of the
benchmarks' own, `$XDG_CACHE_HOME/onwatch-bench/peers` (`~/.cache/…` without it), and their
side of a benchmark runs as processes of that environment's Python. Delete the folder to
start over; a benchmark's `--peers-python` names another interpreter that has them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

# Pinned so that figures from different days compare; litequeue 0.9 is the newest release
# that installs on Python 3.11 (0.11 onwards want 3.12).
PEER_PACKAGES = [
    "pgqueuer==1.6.0",
    "procrastinate==3.10.0",
    "asyncpg",
    "psycopg[binary]",
    "huey==3.5.4",
    "persist-queue==1.1.0",
    "litequeue==0.9",
]


def peers_folder() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "onwatch-bench" / "peers"


def peers_python(given: str | None = None) -> str:
    """An interpreter with the peers installed: `given`, or the benchmarks' own environment,
    made (and filled with pip) on first use and topped up when the list above changes."""
    if given:
        return given
    folder = peers_folder()
    python = folder / "bin" / "python"
    # A stamp of its own, naming the whole list: benchmarks that stamp the folder with a
    # shorter list of theirs (".installed") and rebuild it when that differs see their
    # stamp untouched, and this tops the folder up again after such a rebuild.
    stamp = folder / ".installed-peers"
    wanted = " ".join(PEER_PACKAGES)
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    if not python.exists():
        venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    # pip install over an existing environment adds or re-pins what changed: another
    # benchmark using the environment at this moment keeps its packages.
    print(f"bench: installing {wanted} into {folder} …", file=sys.stderr)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES], check=True)
    stamp.write_text(wanted)
    return str(python)
