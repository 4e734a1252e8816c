"""Every public entry point is total: any argument either works or raises BadInput, and a
refused call leaves the database byte-identical (on PostgreSQL: the inbox's rows identical,
every table's rows of that inbox compared in key order). The Inbox methods are fed on both
backends.

The methods are enumerated from the classes themselves (Inbox, Worker, RunContext), so a new
method is fed hostile values the day it is added; a method this test does not know how to
call fails the test until it is taught.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import shutil
import sqlite3
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onwatch.core import (
    ApprovalRequest,
    BadInput,
    FakeClock,
    FollowUp,
    Inbox,
    Reply,
    RunContext,
    Settings,
)
from onwatch.core.runtime.worker import Worker

from .conftest import BACKENDS, dump as dump_inbox

T = 1_000_000


def _deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def _circular() -> list:
    value: list = []
    value.append(value)
    return value


class _Weird:
    def __repr__(self) -> str:
        raise RuntimeError("a repr that raises")


INTS = [
    0,
    -1,
    1,
    2,
    2**31,
    2**53,
    2**53 + 1,
    2**62,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**30,
    10**5000,
]
FLOATS = [math.nan, math.inf, -math.inf, 0.5, 1e308, -0.0]
TEXTS = [
    "",
    "x",
    "\x00",
    "\ud800",
    "a\udfffb",
    "x" * 5000,
    "y" * (1 << 20) + "z",
    "[@click=app.quit]x[/]",
    "\x1b]0;t\x07",
    "approval",
    "timer",
    "approval:r",
]
JSONS = [
    None,
    {},
    {"a": 1},
    [1, 2],
    _deep(100_000),
    _deep(101),
    _deep(99),
    list(range(300_000)),
    {1: 2},
    {"k": math.nan},
    {"\ud800": 1},
    _circular(),
    {"big": 10**5000},
    b"bytes",
    {"set": {1}},
]
OTHERS = [
    None,
    True,
    False,
    object(),
    _Weird(),
    [],
    (),
    {},
    [1, "x"],
    ("chat", "x"),
    ("approval", "r"),
    [["chat", "x", None]],
    [("chat", "x", None)] * 3,
    Reply("hi"),
    Reply("", urgent=True),
    Reply("x", urgent="yes"),
    ApprovalRequest("r", 2**63, "do"),
    ApprovalRequest("r", 60, "do"),
    FollowUp("t", 2**63),
    FollowUp("t", T, _deep(1000)),
    FollowUp("approval:x", T),
    FollowUp("t", T, every=0),
    FollowUp("t", T + 5, catch_up="never"),
]
HOSTILE = st.sampled_from(INTS + FLOATS + TEXTS + JSONS + OTHERS)


def _send_ok(text):
    return None


def _send_fails(text):
    raise ConnectionError("channel down")


async def _send_async(text):
    await asyncio.sleep(0)


# A plausible value for each parameter name: with the hostile ones drawn beside them, a
# call gets far enough to meet the rules behind the argument checks.
VALID = {
    "source": ["chat", "hook"],
    "source_id": ["x1", "x2"],
    "payload": [{"a": 1}, None],
    "now": [T, T + 200, None],
    "holder": ["W", "V"],
    "gen": [1, 2],
    "ids": [[1], [1, 2]],
    "messages": [["hi"], ()],
    "error": [None, "boom"],
    "result": [None, {"ok": 1}],
    "approvals": [(), [ApprovalRequest("r", 60, "do")]],
    "timers": [(), [FollowUp("f", T + 5)]],
    "run": [None, 1],
    "run_id": [1, 2],
    "name": ["pay"],
    "detail": [None, {"n": 1}],
    "key": [None, "k1"],
    "event": [None, 1],
    "state": ["confirmed", "failed"],
    "event_id": [1, 2],
    "timer_id": ["t", "u"],
    "due": [T + 5],
    "every": [None, 60],
    "catch_up": ["coalesce", "each"],
    "request_id": ["r", "s"],
    "expires_in": [60],
    "action": ["do"],
    "answer": ["yes", "no"],
    "traceback": [None, "Traceback (most recent call last):\n  KeyError: 'x'\n"],
    "actor": ["op"],
    "reason": [None, "why"],
    "expect": [None, "pending", "uncertain"],
    "status": ["pending", "done"],
    "limit": [10],
    "after": [None, 0],
    "before": [None, 5],
    "search": [None, "x"],
    "older_than": [T],
    "items": [[("chat", "b1", None)]],
    "delivery_id": [1],
    "outcome": ["sent", "send again"],
    "target": [None, "event 1"],
    "send": [_send_ok, _send_fails, _send_async],
    "fresh": [False, True],
    "fire_timers": [True, False],
    "mark": [True, False],
    # the run's transcript and spend, raising a budget, what needs a person
    "lines": [[(0, T, "log", None, "x", None)], [(0, T, "info", "lib", "y", '{"a": 1}')], []],
    "upto": [None, 1, 5],
    "dropped_chars": [0, 10],
    "spends": [(), [(0, T, "usd", 5, None)]],
    "run_ids": [[1], [1, 2]],
    "days": [1, 14],
    "budget": ["max_spend_per_day", "max_runs_per_day"],
    "to": [2, 5.5],
    "unit": [None, "usd"],
    "value": [None, 3],
    "since": [T, 0],
    # the desk's round three: dead events by error, workers
    "line": ["", "too many attempts (3/3): boom"],
    "host": ["box-1"],
    "pid": [1, 4242],
}
# Parameters whose value decides nothing about the database (a flag read with bool()).
FLAGS = {
    ("events", "payload"),
    ("acquire", "fresh"),
    ("transcript", "newest"),
    ("next_wake", "sends"),
}

SETTING_NAMES = sorted(f for f in Settings.__dataclass_fields__)

# Lifecycle methods fed separately below (open) or that take no value at all.
NOT_FED = {
    "close": "takes no value; closing is the test's teardown",
    "now": "takes no value",
    "open": "fed below with hostile paths and timeouts",
    "open_when_reachable": "open's own options, fed below through open; and a callable",
    "file_replaced": "takes no value (two stat calls on the opened file)",
}


def public_methods(cls: type) -> dict[str, object]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def dump(harness: "Harness") -> list:
    return dump_inbox(harness.path, harness.name)


class Harness:
    """A seeded inbox file (a little of everything in it) copied fresh for each example, so
    that every example starts from the same state and a failure replays exactly."""

    def __init__(self, backend: str = "sqlite") -> None:
        self.loop = asyncio.new_event_loop()
        self.name = "default"
        self.serial = 0
        self.url = None
        if backend == "postgresql":
            # One database; each example gets a freshly seeded inbox of its own (by name).
            from tests.pg.server import cluster

            self.url = self.path = cluster().new_database()
            self.folder = None
            return
        self.folder = tempfile.mkdtemp(prefix="onwatch-total-")
        self.template = os.path.join(self.folder, "template.db")
        self.path = self.template
        self.clock = FakeClock(T)
        self.box = self.run(Inbox.open(self.template, clock=self.clock))
        self.run(self._seed())
        self.run(self.box.close())

    def fresh(self) -> None:
        """Open a new copy of the seeded file as `self.box` at `self.path` (on PostgreSQL,
        a new inbox of the database, seeded the same way)."""
        self.serial += 1
        if self.url is not None:
            self.name = f"inbox-{self.serial}"
            self.clock = FakeClock(T)
            self.box = self.run(Inbox.open(self.url, name=self.name, clock=self.clock))
            self.run(self._seed())
            return
        self.path = os.path.join(self.folder, f"inbox-{self.serial}.db")
        source = sqlite3.connect(self.template)
        target = sqlite3.connect(self.path)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        self.clock = FakeClock(T)
        self.box = self.run(Inbox.open(self.path, clock=self.clock))

    def done(self) -> None:
        self.run(self.box.close())
        if self.url is not None:
            return
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.path + suffix):
                os.remove(self.path + suffix)

    async def _seed(self) -> None:
        box = self.box
        await box.configure(
            outbox_gap=0,
            delivery="at_least_once",
            max_spend_per_day={"usd": 1},  # a budget raise_budget can raise
            max_runs_per_day=100,
        )
        for i in range(3):
            await box.ingest("chat", f"seed-{i}", {"i": i})
        gen = await box.acquire("W")
        batch = await box.claim_batch("W", gen)
        await box.finish("W", gen, [batch[0].id], ["hello"])
        await box.request_approval("r", 600, "do")
        await box.add_timer("t", T + 5, every=60)

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 60))

    def close(self) -> None:
        self.loop.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _arguments(data, method_name: str, method) -> tuple[list, dict]:
    args, kwargs = [], {}
    for parameter in list(inspect.signature(method).parameters.values())[1:]:
        if parameter.kind is parameter.VAR_KEYWORD:  # configure(**changes)
            names = data.draw(
                st.lists(st.sampled_from(SETTING_NAMES + ["nonsense"]), max_size=3, unique=True)
            )
            for name in names:
                kwargs[name] = data.draw(
                    st.one_of(
                        HOSTILE,
                        st.sampled_from(
                            [None, 1, 60, "retry", "at_most_once", {"chat": "interrupt"}]
                        ),
                    )
                )
            continue
        if (method_name, parameter.name) in FLAGS:
            value = data.draw(st.booleans())
        else:
            assert parameter.name in VALID, (
                f"{method_name}({parameter.name}=…): teach this test a valid value for it"
            )
            if parameter.default is not parameter.empty and data.draw(st.booleans()):
                continue  # left at its default
            value = data.draw(st.one_of(st.sampled_from(VALID[parameter.name]), HOSTILE))
        if parameter.kind is parameter.KEYWORD_ONLY:
            kwargs[parameter.name] = value
        else:
            args.append(value)
    return args, kwargs


def _methods() -> list[str]:
    return sorted(name for name in public_methods(Inbox) if name not in NOT_FED)


def test_every_public_method_is_known_to_this_test():
    for name in public_methods(Inbox):
        assert name in NOT_FED or inspect.iscoroutinefunction(getattr(Inbox, name)), name


HARNESS: list[Harness] = []
HARNESSES: dict[str, Harness] = {}


def _harness(backend: str) -> Harness:
    if backend not in HARNESSES:
        if backend == "postgresql":
            from tests.pg.server import cluster_or_skip

            cluster_or_skip()
        HARNESSES[backend] = Harness(backend)
    return HARNESSES[backend]


@pytest.mark.parametrize("backend", BACKENDS)
@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(data=st.data())
def test_every_inbox_method_is_total(backend, data):
    harness = _harness(backend)
    name = data.draw(st.sampled_from(_methods()))
    method = getattr(Inbox, name)
    args, kwargs = _arguments(data, name, method)
    harness.fresh()
    try:
        harness.clock.advance(data.draw(st.sampled_from([0, 1, 61, 400])))
        before = dump(harness)
        try:
            harness.run(getattr(harness.box, name)(*args, **kwargs))
        except BadInput:
            assert dump(harness) == before, f"{name} refused but changed the database"
    finally:
        harness.done()


def teardown_module(module) -> None:
    for harness in HARNESS + list(HARNESSES.values()):
        harness.close()


@settings(max_examples=60, deadline=None, database=None)
@given(
    path=st.one_of(
        st.sampled_from(["", "\x00", "a\ud800.db", "x" * 5000, "/nonexistent/dir/x.db", "."]),
        HOSTILE,
    ),
    busy=st.one_of(st.sampled_from([5.0, 1]), HOSTILE),
    create=st.one_of(st.booleans(), HOSTILE),
)
def test_open_is_total(path, busy, create):
    folder = tempfile.mkdtemp(prefix="onwatch-open-")
    loop = asyncio.new_event_loop()
    try:
        from onwatch.core import NotAnInbox

        target = (
            path
            if not isinstance(path, str) or path in ("", ".") or path.startswith("/")
            else os.path.join(folder, path)
        )
        try:
            box = loop.run_until_complete(Inbox.open(target, busy_timeout=busy, create=create))
        except (BadInput, NotAnInbox):
            assert os.listdir(folder) == []  # a refused open creates nothing
        else:
            loop.run_until_complete(box.close())
    finally:
        loop.close()
        shutil.rmtree(folder, ignore_errors=True)


def _worker_arguments(data) -> dict:
    return {
        "holder": data.draw(st.one_of(st.sampled_from([None, "W"]), HOSTILE)),
        "send": data.draw(st.one_of(st.sampled_from([None, _send_ok]), HOSTILE)),
        "poll_interval": data.draw(st.one_of(st.sampled_from([0.5]), HOSTILE)),
        "grace": data.draw(st.one_of(st.sampled_from([1.0]), HOSTILE)),
        "setup": data.draw(st.one_of(st.sampled_from([None]), HOSTILE)),
        "max_runs": data.draw(st.one_of(st.sampled_from([None, 1]), HOSTILE)),
        "on_stuck": data.draw(st.one_of(st.sampled_from([None]), HOSTILE)),
    }


CONTEXT_VALID = {
    "text": ["hi"],
    "urgent": [False, True],
    "request_id": ["r"],
    "expires_in": [60],
    "action": ["do"],
    "timer_id": ["t"],
    "due": [T + 5],
    "payload": [None, {"a": 1}],
    "every": [None, 60],
    "key": [None],
    "catch_up": ["coalesce"],
    "amount": [0.5, 2],
    "unit": ["usd", "tokens"],
    "note": [None, "model"],
    "target": [print],
    "name": [None, "helper"],
    "fn": [print],
}


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_worker_and_run_context_take_user_values_totally(data):
    if not HARNESS:
        HARNESS.append(Harness())
    harness = HARNESS[0]
    harness.fresh()
    try:
        _worker_and_context(harness, data)
    finally:
        harness.done()


def _worker_and_context(harness: Harness, data) -> None:
    try:
        Worker(harness.box, _send_ok, **_worker_arguments(data))
    except BadInput:
        pass
    # The run context's plain methods (effect/perform journal through Inbox.intend_effect,
    # fed above): each takes the agent's values now, or refuses them with BadInput.
    ctx = RunContext(harness.box, "W", 1, [], harness.loop)
    sync = {
        name: m
        for name, m in public_methods(RunContext).items()
        if not inspect.iscoroutinefunction(m) and name not in ("close", "effect", "perform")
    }
    assert set(sync) == {
        "reply",
        "ask_approval",
        "follow_up",
        "log",
        "spend",
        "thread",
        "wrap",
    }, sorted(sync)
    name = data.draw(st.sampled_from(sorted(sync)))
    args, kwargs = [], {}
    for parameter in list(inspect.signature(sync[name]).parameters.values())[1:]:
        if parameter.kind is parameter.VAR_KEYWORD:  # ctx.log's fields, a thread's kwargs
            kwargs.update(data.draw(st.dictionaries(st.sampled_from(["f", "g"]), HOSTILE)))
            continue
        if parameter.kind is parameter.VAR_POSITIONAL:  # a thread's args: none
            continue
        if parameter.default is not parameter.empty and data.draw(st.booleans()):
            continue
        value = data.draw(st.one_of(st.sampled_from(CONTEXT_VALID[parameter.name]), HOSTILE))
        if parameter.kind is parameter.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[parameter.name] = value
    if name == "thread":
        kwargs = {k: v for k, v in kwargs.items() if k in ("target", "name")}
        kwargs.setdefault("target", print)  # a thread's own kwargs would go to it
        kwargs["target"] = kwargs["target"] if kwargs["target"] is not print else (lambda: None)
    try:
        outcome = getattr(ctx, name)(*args, **kwargs)
    except BadInput:
        return
    if name == "thread":
        outcome.join(5)
