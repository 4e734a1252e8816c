"""A shell command run for one text: the outbox's command channel and `onwatch notify`.

The text reaches the command as its standard input, and its standard error is kept for a
failure's message. Both go through unlinked temporary files, not pipes, so the wait is for
the command alone. A daemon the command starts, or a job it leaves in the background, may
hold those files as long as it likes. With pipes, the wait lasted until every process that
had inherited one closed it. A command that started a daemon (as `notify-send` may start a
session bus) and exited 0 was then killed at its timeout and counted as failed, so the same
message was sent again. A notifier whose command's child left its process group waited for
that child, and said nothing more meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from dataclasses import dataclass

# How much of the end of a command's standard error is read for its last line.
ERROR_TAIL = 4096


@dataclass(frozen=True)
class Finished:
    """How a command ended: its exit status, or None when it ran past its timeout and was
    killed, and the last line of its standard error ("" if none)."""

    code: int | None
    last_line: str

    @property
    def ok(self) -> bool:
        return self.code == 0


async def run_shell(
    command: str,
    text: str,
    *,
    timeout: float,
    env: dict[str, str],
    cwd: str | None = None,
    shell: str = "/bin/sh",
) -> Finished:
    """Run `command` through `shell`, `text` on its standard input, for at most `timeout`
    seconds. It runs in a session of its own: at the timeout, or if the caller is cancelled,
    its whole process group is killed (what it started in the background too) before this
    returns or re-raises. Raises OSError if it cannot be started."""
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stderr:
        stdin.write(text.encode("utf-8"))
        stdin.seek(0)
        process = await asyncio.create_subprocess_exec(
            shell,
            "-c",
            command,
            stdin=stdin,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        code: int | None
        try:
            code = await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            await _kill(process)
            code = None
        except BaseException:  # the caller was cancelled: the command goes with it
            await _kill(process)
            raise
        stderr.seek(max(0, os.fstat(stderr.fileno()).st_size - ERROR_TAIL))
        lines = stderr.read().decode("utf-8", "replace").strip().splitlines()
        return Finished(code, lines[-1] if lines else "")


async def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()  # no pipe to drain: this wait is for the shell alone
