"""An agent in a process of its own, which the worker can always stop: `--isolate`.

    agent = IsolatedAgent("my_agent:handle")      # an agent like any other: (batch, ctx)
    await run_worker("alice.db", agent)           # … then `await agent.close()`

In-process, the worker bounds what an agent does only as far as Python lets it: a task that
swallows its cancellation, a thread stuck in a call, or code that holds the event loop can be
stopped only by ending the whole process (the worker then exits 4 and its service manager
starts it again). Isolated, the agent runs in a child process (core/runtime/child.py), kept
between runs, as Celery's prefork pool keeps its workers; a run given up (past
`max_run_seconds`, the lease lost, a stop past its grace) ends that process with SIGKILL, and
the next run starts a fresh one. Nothing the agent does reaches the worker: not a blocking
call (the worker's loop stays free), not `os.chdir`, `sys.exit()`, `os._exit()` or a crash of
the interpreter (the run fails), not a leak (the process goes with it).

The price is a process (its memory, and the start of a fresh one after each kill) and a hop
per context call; docs/performance.md gives the measured figures. The agent
and its context's values cross as JSON: the batch's events, the replies, requests, timers,
effect details and `ctx.result`, all of which the inbox stores as JSON anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
from typing import Any

from ..checks import LOG_LEVELS
from ..clock import check_int
from ..errors import BadInput, InboxError
from ..records import Event
from ..settings import MAX_SPEND, MICROS, spend_unit
from .context import LeaseLost, RunAbandoned, RunContext, _settle
from .loading import LoadError

log = logging.getLogger("onwatch.worker")
LINE_LIMIT = 1 << 30  # a line may carry a whole batch of payloads (each ≤ max_payload_bytes)


class AgentProcessEnded(RuntimeError):
    """The agent's process ended during a run (os._exit, a crash, a kill): the run failed."""


class RemoteError(Exception):
    """What the agent raised in its own process; `type(error).__name__` is its name there,
    `remote_trace` its traceback there (what the worker stores with the run)."""

    remote_trace = ""


_remote_types: dict[str, type[RemoteError]] = {}


def _remote(name: str, message: str, trace: str) -> RemoteError:
    """An exception named as the agent's was ("ValueError: boom" in the run's error)."""
    if not name.isidentifier():
        name = "RemoteError"
    cls = _remote_types.get(name)
    if cls is None:
        cls = _remote_types[name] = type(name, (RemoteError,), {"__module__": "agent"})
    error = cls(message)
    error.remote_trace = trace
    return error


def _forwarded(ctx: RunContext, message: dict[str, Any]) -> None:
    """A transcript line or a spend the agent's process sent: into this run's transcript,
    as far as it is what a line or a spend can be (the agent's process is not trusted to
    speak the line correctly: anything else is said in the worker's log and left out)."""
    run = ctx.transcript
    if run is None:
        return
    try:
        if message["op"] == "log":
            level, logger, text, fields = (message.get(k) for k in LINE_KEYS)
            if level not in LOG_LEVELS or not isinstance(text, str):
                raise ValueError("not a transcript line")
            if logger is not None and (not isinstance(logger, str) or not logger):
                raise ValueError("a logger is a name")
            if fields is not None and not isinstance(json.loads(fields), dict):
                raise ValueError("fields are a JSON object")
            run.line(level, None if logger is None else logger[:200], text, fields)
        else:
            micros, unit, note = message.get("micros"), message.get("unit"), message.get("note")
            micros = check_int(micros, "micros", 0, MAX_SPEND * MICROS)
            if spend_unit(unit) != unit or not (note is None or isinstance(note, str)):
                raise ValueError("not a spend")
            run.spend(micros, unit, None if note is None else note[:200])
    except (ValueError, TypeError, BadInput) as exc:
        log.warning("run %s: the agent's process sent %s: %s", ctx.run_id, message["op"], exc)


LINE_KEYS = ("level", "logger", "text", "fields")


class _Child:
    """One agent process and the line to it."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps(message, ensure_ascii=True).encode() + b"\n")
        await stdin.drain()

    async def receive(self) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        line = await stdout.readline()
        if not line:
            code = await self.process.wait()
            raise AgentProcessEnded(
                f"the agent's process ended during the run (exit status {code})"
            )
        message: dict[str, Any] = json.loads(line)
        return message

    async def kill(self) -> None:
        """SIGKILL to the process's whole group (it runs in a session of its own): a helper
        the agent forked goes with it. (A forked helper holds no end of the line to the
        worker, which the wait below would wait for: core/runtime/child.py `off_the_line`.)"""
        if self.process.returncode is None:  # not yet reaped: its id is still its group's
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        await self.process.wait()  # SIGKILL: this wait is short


class IsolatedAgent:
    """An agent (`module:function` or `file.py:function`) run in a child process of its own.

    Use it where an agent is taken (`Worker`, `run_worker`, `FleetWorker`); each concurrent
    run gets a process of its own, and a process serves one run after another until a run is
    given up (then it is killed) or `close()` is called.
    """

    def __init__(self, spec: str, *, python: str = sys.executable) -> None:
        if not isinstance(spec, str) or ":" not in spec:
            raise BadInput(f"an isolated agent is named module:function, got {spec!r}")
        self.spec = spec
        self.python = python
        self.folder = os.getcwd()  # where the agent's module is looked for, as in-process
        self.started = 0  # processes started, for logs and tests
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()

    async def start(self) -> None:
        """Start one process and keep it idle: raises LoadError (the agent cannot be loaded
        there) at once, rather than at the first run."""
        self._idle.append(await self._spawn())

    async def close(self) -> None:
        """End every process (their runs, if any, are abandoned)."""
        children, self._idle = [*self._idle, *self._busy], []
        self._busy.clear()
        for child in children:
            await child.kill()

    async def __aenter__(self) -> IsolatedAgent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _spawn(self) -> _Child:
        process = await asyncio.create_subprocess_exec(
            self.python,
            "-m",
            "onwatch.core.runtime.child",
            self.spec,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=self.folder,
            env=dict(os.environ, ONWATCH_WORKER_PID=str(os.getpid())),
            limit=LINE_LIMIT,
            # Its own session: a Ctrl-C or a closed terminal signals the worker, which
            # decides what becomes of the run; the agent is never interrupted behind its back.
            start_new_session=True,
        )
        child = _Child(process)
        try:
            hello = await child.receive()
        except AgentProcessEnded as exc:
            raise LoadError(f"--agent {self.spec}: {exc} before it was ready") from None
        except BaseException:
            await child.kill()
            raise
        if hello.get("op") != "ready":
            await child.kill()
            raise LoadError(str(hello.get("message") or f"--agent {self.spec}: no answer"))
        self.started += 1
        return child

    async def __call__(self, batch: list[Event], ctx: RunContext) -> None:
        child = self._idle.pop() if self._idle else await self._spawn()
        self._busy.add(child)
        try:
            await child.send(
                {
                    "op": "run",
                    "batch": [dataclasses.asdict(event) for event in batch],
                    "holder": ctx.holder,
                    "gen": ctx.gen,
                    "run_id": ctx.run_id,
                }
            )
            while True:
                message = await child.receive()
                if message["op"] == "call":
                    await child.send(await self._serve(ctx, message["method"], message["args"]))
                elif message["op"] in ("log", "spend"):
                    _forwarded(ctx, message)
                elif message["op"] == "done":
                    ctx.result = message["result"]
                    break
                else:
                    raise _remote(message["type"], message["message"], message["trace"])
        except (AgentProcessEnded, RemoteError):
            self._busy.discard(child)
            if child.process.returncode is None:
                self._idle.append(child)  # a failed run; the process is fine
            raise
        except BaseException:
            # Given up (cancelled), or a line it could not speak: the process goes, at once,
            # whatever its agent is doing; the next run gets a fresh one.
            self._busy.discard(child)
            await child.kill()
            raise
        self._busy.discard(child)
        self._idle.append(child)

    async def _serve(self, ctx: RunContext, method: str, args: list[Any]) -> dict[str, Any]:
        """One call of the agent's context, made on the worker's real RunContext."""
        value: Any = None
        try:
            if method == "now":
                value = ctx.now
            elif method == "reply":
                ctx.reply(*args)
            elif method == "ask_approval":
                ctx.ask_approval(*args)
            elif method == "follow_up":
                timer_id, due, payload, every, key, catch_up = args
                key = tuple(key) if isinstance(key, list) else key
                ctx.follow_up(timer_id, due, payload, every, key=key, catch_up=catch_up)
            elif method == "intend":
                value = await ctx._intend(*args)
            elif method == "settle":
                key, state = args
                await _settle(ctx._inbox, key, state)
            else:
                raise BadInput(f"no such call from an agent: {method!r}")
        except (BadInput, LeaseLost, RunAbandoned, InboxError) as exc:
            kind = type(exc).__name__
            if not isinstance(exc, (BadInput, LeaseLost, RunAbandoned)):
                kind = "InboxError"
            return {"op": "raise", "type": kind, "message": str(exc)}
        except (TypeError, ValueError) as exc:  # arguments the call does not take
            return {"op": "raise", "type": "BadInput", "message": f"{method}: {exc}"}
        return {"op": "return", "value": value}
