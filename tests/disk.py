"""A small file system of a test's own, to fill and to free: the real "no space left on
device" that a write meets on a full disk, not an imitation of it.

`small_disk()` mounts a tmpfs of a few MiB (its size is the test's choice), which needs root
(the mount system call); where that cannot be had, the test is skipped and says why.
`fill()` writes a filler file until the file system refuses another byte, `free()` removes
it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


class Disk:
    """The mounted file system: `path`, its folder; `fill()` and `free()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._filler = path / "filler"

    def fill(self) -> None:
        """Take every byte left (the file system refuses the next write)."""
        with open(self._filler, "ab", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        assert os.statvfs(self.path).f_bavail == 0, "the disk still has room"

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


@contextmanager
def small_disk(kib: int = 4096) -> Iterator[Disk]:
    """A tmpfs of `kib` KiB mounted for the block, in a new folder of the system's temporary
    one (every user may reach it: a PostgreSQL server's own user too); skips where it
    cannot."""
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a file system of the test's own: mounting needs root")
    where = Path(tempfile.mkdtemp(prefix="onwatch-disk-"))
    where.chmod(0o755)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={kib}k,mode=0777", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    try:
        yield Disk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)
