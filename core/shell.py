"""A shell command run for one text: the outbox's command channel and `onwatch notify`.

The text reaches the command as its standard input (an unlinked temporary file), and the end
of its standard error is kept for a failure's message (a pipe read as it fills, never waited
on): the wait is for the command alone. A daemon the command starts, or a job it leaves in
the background, may hold its standard error as long as it likes. (Waiting for asyncio's
pipes, the wait lasted until every process that had inherited one closed it. A command that
started a daemon, as `notify-send` may start a session bus, and exited 0 was then killed at
its timeout and counted as failed, so the same message was sent again; a notifier whose
command's child left its process group waited for that child, and said nothing meanwhile.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from dataclasses import dataclass

# How much of the end of a command's standard error is kept, for its last line.
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
    with tempfile.TemporaryFile() as stdin, _Tail() as stderr:
        stdin.write(text.encode("utf-8"))
        stdin.seek(0)
        process = await asyncio.create_subprocess_exec(
            shell,
            "-c",
            command,
            stdin=stdin,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr.writer(),
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        stderr.started()
        code: int | None
        try:
            code = await asyncio.wait_for(process.wait(), timeout)
        except TimeoutError:
            await _kill(process)
            code = None
        except BaseException:  # the caller was cancelled: the command goes with it
            await _kill(process)
            raise
        lines = stderr.drained().decode("utf-8", "replace").strip().splitlines()
        return Finished(code, lines[-1] if lines else "")


class _Tail:
    """The command's standard error: a pipe of our own, read on the event loop as it comes,
    of which the last ERROR_TAIL bytes are kept (a command that writes gigabytes to it costs
    neither memory nor disk), and read to its end, without waiting, once the shell is gone:
    whatever a leftover process writes later is not waited for."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        self._kept = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> _Tail:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self._read)
        os.close(self._read)
        if self._write >= 0:  # never started: the command was not
            os.close(self._write)

    def writer(self) -> int:
        return self._write

    def started(self) -> None:
        """The command holds its end now: ours is closed, and the pipe read as it fills."""
        os.close(self._write)
        self._write = -1  # its number may be another file's from now on
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._read, self._take)

    def _take(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._read, 65536):
                self._kept += chunk
                del self._kept[:-ERROR_TAIL]
            if self._loop is not None:  # end of file: every writer is gone
                self._loop.remove_reader(self._read)

    def drained(self) -> bytes:
        self._take()
        return bytes(self._kept)


async def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()  # asyncio holds no pipe of it: this wait is for the shell alone
