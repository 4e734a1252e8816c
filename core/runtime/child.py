"""An isolated agent's own process: `python -m onwatch.core.runtime.child MODULE:FUNCTION`.

The worker (core/runtime/isolation.py) starts it, and it serves runs one at a time for as
long as the worker keeps it. It speaks JSON lines on the stdin and stdout it was started
with; the agent's own prints go to stderr (the worker's log), and its stdin is empty.

    worker → child   {"op": "run", "batch": [event…], "holder", "gen", "run_id"}
    child → worker   {"op": "call", "method": …, "args": […]}   (one at a time, answered:)
    worker → child   {"op": "return", "value": …} | {"op": "raise", "type", "message"}
    child → worker   {"op": "done", "result": …} | {"op": "failed", "type", "message", "trace"}

Every reply, approval request, follow-up timer and effect goes to the worker's real
RunContext at once, so its checks (BadInput), its fence (LeaseLost) and its end
(RunAbandoned) answer exactly as they would in-process. The worker ends this process with
SIGKILL when it gives a run up: nothing the agent does here can hold the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import json
import logging
import os
import sys
import threading
import traceback
from typing import IO, Any, AsyncIterator, Callable

from .. import checks
from ..errors import BadInput, InboxError
from ..records import Event
from ..settings import spend_unit, to_micros
from ..text import LineFormatter
from .context import LeaseLost, RunAbandoned
from .loading import LoadError, load
from .transcript import capture_logging, current, fields_text, in_run, record_line, storable

ERRORS: dict[str, type[Exception]] = {
    "BadInput": BadInput,
    "LeaseLost": LeaseLost,
    "RunAbandoned": RunAbandoned,
    "InboxError": InboxError,
}


class Link:
    """The line to the worker: one JSON object per line, one call at a time (an agent's
    own threads may call the context too)."""

    def __init__(self, incoming: IO[str], outgoing: IO[str]) -> None:
        self._in = incoming
        self._out = outgoing
        self._lock = threading.Lock()  # one call (a message and its answer) at a time
        self._sending = threading.Lock()  # one message at a time, answered or not

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=True) + "\n"
        with self._sending:
            self._out.write(line)
            self._out.flush()

    def receive(self) -> dict[str, Any] | None:
        line = self._in.readline()
        if not line:
            return None  # the worker is gone
        message: dict[str, Any] = json.loads(line)
        return message

    def call(self, method: str, *args: Any) -> Any:
        try:
            json.dumps(args)
        except (TypeError, ValueError) as exc:
            raise BadInput(f"{method}: a value is not JSON: {exc}") from None
        with self._lock:
            self.send({"op": "call", "method": method, "args": list(args)})
            answer = self.receive()
        if answer is None:
            os._exit(0)  # the worker went away: nothing is kept of this run any more
        if answer["op"] == "raise":
            raise ERRORS.get(answer["type"], InboxError)(answer["message"])
        return answer["value"]


class ForwardLog:
    """This run's transcript as the agent's process has it: every line and spend goes to
    the worker at once, unanswered (the worker's writer batches them); the calls that
    need an answer keep theirs, in order."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def line(self, level: str, logger: str | None, text: str, fields: str | None = None) -> int:
        self._link.send(
            {
                "op": "log",
                "level": level,
                "logger": logger,
                "text": storable(text),
                "fields": fields,
            }
        )
        return -1  # numbered by the worker

    def spend(self, micros: int, unit: str, note: str | None) -> None:
        self._link.send({"op": "spend", "micros": micros, "unit": unit, "note": note})

    def record(self, record: logging.LogRecord) -> None:
        self.line(*record_line(record))


class ChildContext:
    """The RunContext as the agent sees it in its own process: the same calls, each one
    made by the worker's RunContext (see the module docstring)."""

    def __init__(self, link: Link, batch: list[Event], holder: str, gen: int, run_id: int):
        self._link = link
        self.transcript = ForwardLog(link)
        self.batch = batch
        self.holder = holder
        self.gen = gen
        self.run_id = run_id
        self.result: Any = None
        self.messages: list[tuple[str, bool]] = []
        self.approvals: list[tuple[str, int, str]] = []
        self.timers: list[tuple[Any, ...]] = []

    @property
    def now(self) -> int:
        value: int = self._link.call("now")
        return value

    def log(self, text: str, /, **fields: Any) -> None:
        if not isinstance(text, str):
            raise BadInput(f"ctx.log takes a string, got {type(text).__name__}")
        self.transcript.line("log", None, text, fields_text(fields))

    def spend(self, amount: Any, unit: str = "usd", note: str | None = None) -> None:
        micros = to_micros(amount)
        unit = spend_unit(unit)
        if note is not None:
            note = checks.text("note", note, limit=200)
        self.transcript.spend(micros, unit, note)

    def thread(
        self, target: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any
    ) -> threading.Thread:
        if not callable(target):
            raise BadInput(f"ctx.thread runs a callable, got {type(target).__name__}")
        thread = threading.Thread(
            target=in_run(target), args=args, kwargs=kwargs, name=name, daemon=True
        )
        thread.start()
        return thread

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(fn):
            raise BadInput(f"ctx.wrap takes a callable, got {type(fn).__name__}")
        return in_run(fn)

    def reply(self, text: str, urgent: bool = False) -> None:
        self._link.call("reply", text, urgent)
        self.messages.append((text, bool(urgent)))

    def ask_approval(self, request_id: str, expires_in: int, action: str) -> None:
        self._link.call("ask_approval", request_id, expires_in, action)
        self.approvals.append((request_id, expires_in, action))

    def follow_up(
        self,
        timer_id: str,
        due: int,
        payload: Any = None,
        every: int | None = None,
        *,
        key: tuple[str, str] | None = None,
        catch_up: str = "coalesce",
    ) -> None:
        self._link.call("follow_up", timer_id, due, payload, every, key, catch_up)
        self.timers.append((timer_id, due, payload, every, key, catch_up))

    def _intend(self, name: str, detail: Any, key: str | None, event: int | Event | None) -> str:
        event_id = event.id if isinstance(event, Event) else event
        intended: str = self._link.call("intend", name, detail, key, event_id)
        return intended

    def _settle(self, key: str, state: str) -> None:
        self._link.call("settle", key, state)

    @contextlib.asynccontextmanager
    async def effect(
        self,
        name: str,
        detail: Any = None,
        *,
        key: str | None = None,
        event: int | Event | None = None,
    ) -> AsyncIterator[str]:
        intended = self._intend(name, detail, key, event)
        try:
            yield intended
        except Exception:
            self._settle(intended, "failed")
            raise
        self._settle(intended, "confirmed")

    def perform(
        self,
        name: str,
        detail: Any,
        fn: Callable[[str], Any],
        *,
        key: str | None = None,
        event: int | Event | None = None,
    ) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a plain def: do it now
            intended = self._intend(name, detail, key, event)
            try:
                outcome = fn(intended)
                if inspect.isawaitable(outcome):
                    outcome = asyncio.run(_awaited(outcome))
            except Exception:
                self._settle(intended, "failed")
                raise
            self._settle(intended, "confirmed")
            return outcome
        return self._perform(name, detail, fn, key, event)

    async def _perform(
        self, name: str, detail: Any, fn: Callable[[str], Any], key: Any, event: Any
    ) -> Any:
        async with self.effect(name, detail, key=key, event=event) as intended:
            outcome = fn(intended)
            if inspect.isawaitable(outcome):
                outcome = await outcome
            return outcome


async def _awaited(outcome: Any) -> Any:
    return await outcome


def serve(agent: Callable[..., Any], link: Link) -> None:
    """Run what the worker sends, one run at a time, until it closes the line."""
    loop = asyncio.new_event_loop()  # one for the process: an agent's loop-bound clients stay
    asyncio.set_event_loop(loop)
    while True:
        message = link.receive()
        if message is None:
            return
        batch = [Event(**fields) for fields in message["batch"]]
        ctx = ChildContext(link, batch, message["holder"], message["gen"], message["run_id"])
        # The run's logging records go to the worker, from this thread and what it starts.
        token = current.set(ctx.transcript)
        try:
            outcome = agent(batch, ctx)
            if inspect.isawaitable(outcome):
                loop.run_until_complete(_awaited(outcome))
            json.dumps(ctx.result)
        except BaseException as exc:  # noqa: B036 - SystemExit too: a failed run, told
            link.send(
                {
                    "op": "failed",
                    "type": type(exc).__name__,
                    "message": str(exc),
                    "trace": "".join(traceback.format_exception(exc)),
                }
            )
            continue
        finally:
            current.reset(token)
        link.send({"op": "done", "result": ctx.result})


def _die_with_the_worker() -> None:
    """Linux: SIGKILL this process when the worker's process ends, however it ends."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        if os.getppid() != int(os.environ.get("ONWATCH_WORKER_PID", os.getppid())):
            os._exit(0)  # it ended before the request was made


def main(argv: list[str]) -> int:
    _die_with_the_worker()
    # The line to the worker keeps the descriptors it came on; the agent gets stderr for
    # stdout (a print must not break the line) and an empty stdin.
    incoming = os.fdopen(os.dup(0), "r", encoding="utf-8")
    outgoing = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(2, 1)

    def off_the_line() -> None:
        # In a process the agent forks (multiprocessing's default start on Linux): the
        # line's descriptors point at /dev/null, so that it can neither keep the worker
        # waiting for the line to close (it may leave the process group, which a given-up
        # run's kill takes) nor write into it what this process had buffered.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, incoming.fileno())
        os.dup2(null, outgoing.fileno())
        os.close(null)

    os.register_at_fork(after_in_child=off_the_line)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter("%(asctime)s onwatch-agent %(levelname)s %(message)s"))
    logging.basicConfig(
        level=os.environ.get("ONWATCH_LOG_LEVEL", "INFO").upper(), handlers=[handler]
    )
    link = Link(incoming, outgoing)
    capture_logging()
    try:
        agent = load(argv[0], "--agent")
    except LoadError as exc:
        link.send({"op": "error", "message": str(exc)})
        return 2
    link.send({"op": "ready"})
    serve(agent, link)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
