"""`--isolate`: the agent in a process of its own, which the worker ends when it gives a run
up. Each misbehaviour that in-process costs the worker its process costs a run only.

Real worker processes, real agent files (tests/worker/unruly.py); core/runtime/isolation.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal

import pytest

from onwatch.core import Inbox

from .helpers import event_status, query, scalar, wait_for
from .test_misbehaving import (
    exit_code,
    ingest,
    init,
    ledger,
    lease_released,
    log,
    start,
    stop,
    worker,
)

pytestmark = pytest.mark.slow


def settled(path: str, *source_ids: str) -> bool:
    return all(event_status(path, s) in ("done", "dead") for s in source_ids)


def runs_of(path: str) -> list[tuple]:
    return query(path, "SELECT gen, outcome FROM runs ORDER BY id")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_run_stuck_in_a_call_costs_its_process_not_the_worker(tmp_path):
    path = init(tmp_path, lease_ttl=30, max_run_seconds=2, max_attempts=1, max_batch=1)
    for source_id in ("stuck-1", "ok-1", "stuck-2", "ok-2"):
        ingest(path, source_id)
    process = worker(tmp_path, path, "hangs_in_a_call", "--isolate", "--grace", "0.2")
    try:
        wait_for(
            lambda: settled(path, "stuck-1", "ok-1", "stuck-2", "ok-2"),
            timeout=30,
            what="every event settled by one worker",
        )
        assert process.poll() is None, log(tmp_path)  # it never had to end itself
    finally:
        assert stop(process) == 0, log(tmp_path)
    assert [event_status(path, s) for s in ("stuck-1", "stuck-2")] == ["dead", "dead"]
    assert [event_status(path, s) for s in ("ok-1", "ok-2")] == ["done", "done"]
    assert sorted(e["called"] for e in ledger(tmp_path) if "called" in e) == ["ok-1", "ok-2"]
    assert scalar(path, "SELECT count(*) FROM lease_history") == 1  # one generation for all
    assert lease_released(path)


def test_a_helper_the_agent_forked_goes_with_its_process(tmp_path):
    """A helper forked by the agent would hold the line to the worker: a run given up kills
    the agent's whole process group, and a helper that left the group has the line's
    descriptors pointed at /dev/null; the worker goes on either way. (Killing the agent's
    process alone, the worker waited for the helper to close that line: 60 s here, forever
    for a helper that serves.)"""
    path = init(tmp_path, lease_ttl=30, max_run_seconds=2, max_attempts=1, max_batch=1)
    for source_id in ("stuck-1", "ok-1", "stuck-2-leaves", "ok-2"):
        ingest(path, source_id)
    process = worker(tmp_path, path, "forks_a_helper", "--isolate", "--grace", "0.2")
    helpers = []
    try:
        wait_for(
            lambda: settled(path, "stuck-1", "ok-1", "stuck-2-leaves", "ok-2"),
            timeout=30,
            what="all four settled",
        )
        helpers = [e["helper"] for e in ledger(tmp_path) if "helper" in e]
        assert process.poll() is None, log(tmp_path)
    finally:
        assert stop(process) == 0, log(tmp_path)
        for pid in helpers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert len(helpers) == 2
    wait_for(lambda: not alive(helpers[0]), what="the helper killed with the agent")
    statuses = [event_status(path, s) for s in ("stuck-1", "ok-1", "stuck-2-leaves", "ok-2")]
    assert statuses == ["dead", "done", "dead", "done"]


def test_an_agent_that_swallows_cancellation_is_killed_and_the_worker_goes_on(tmp_path):
    path = init(tmp_path, lease_ttl=30, max_run_seconds=2, max_attempts=1, max_batch=1)
    ingest(path, "m1")
    ingest(path, "m2")
    process = worker(tmp_path, path, "swallows_cancellation", "--isolate", "--grace", "0.2")
    try:
        wait_for(lambda: settled(path, "m1", "m2"), timeout=30, what="both runs given up")
        assert process.poll() is None, log(tmp_path)
    finally:
        assert stop(process) == 0, log(tmp_path)
    assert runs_of(path) == [(1, "lost"), (1, "lost")]
    # Killed, not cancelled: the agent never saw a CancelledError to swallow.
    assert not any("swallowed" in e for e in ledger(tmp_path))
    assert "did not end when cancelled" not in log(tmp_path)


def test_an_agent_that_holds_its_event_loop_holds_only_its_own(tmp_path):
    """time.sleep(3600) in async def: in-process this stops the worker's loop (and ends the
    worker past the lease); isolated, the worker's loop renews the lease meanwhile."""
    path = init(tmp_path, lease_ttl=2, max_run_seconds=4, max_attempts=1)
    ingest(path, "m1")
    process = worker(tmp_path, path, "never_yields", "--isolate", "--grace", "0.2")
    try:
        wait_for(lambda: (tmp_path / "inside-m1").exists(), what="the agent to hold its loop")
        until = scalar(path, "SELECT until FROM lease")
        wait_for(
            lambda: scalar(path, "SELECT until FROM lease") >= until + 2,
            what="the lease renewed while the agent holds its own loop",
        )
        wait_for(lambda: event_status(path, "m1") == "dead", timeout=15, what="m1 given up")
        assert process.poll() is None, log(tmp_path)
    finally:
        assert stop(process) == 0, log(tmp_path)
    assert "event loop has been blocked" not in log(tmp_path)
    assert runs_of(path) == [(1, "lost")]


def test_an_agent_that_ends_its_process_fails_its_run_only(tmp_path):
    path = init(tmp_path, lease_ttl=30, max_attempts=1, max_batch=1)
    for source_id in ("hard-exit-1", "ok-1"):
        ingest(path, source_id)
    process = worker(tmp_path, path, "ends_its_process", "--isolate")
    try:
        wait_for(lambda: settled(path, "hard-exit-1", "ok-1"), timeout=20, what="both runs")
        assert process.poll() is None, log(tmp_path)
    finally:
        assert stop(process) == 0, log(tmp_path)
    error = scalar(path, "SELECT error FROM events WHERE source_id = 'hard-exit-1'")
    assert "AgentProcessEnded" in error and "exit status 0" in error, error
    assert event_status(path, "ok-1") == "done"
    pids = {e["called"]: e["pid_of_agent"] for e in ledger(tmp_path)}
    assert pids["hard-exit-1"] != pids["ok-1"] != process.pid  # a fresh process after it


def test_an_isolated_agent_has_the_whole_context_checks_and_journal_included(tmp_path):
    path = init(tmp_path, lease_ttl=30)
    ingest(path, "m1")
    process = worker(tmp_path, path, "checks_its_context", "--isolate", "--no-dispatch")
    try:
        wait_for(lambda: event_status(path, "m1") == "done", timeout=20, what="the run")
    finally:
        assert stop(process) == 0, log(tmp_path)
    assert [e["refused"] for e in ledger(tmp_path) if "refused" in e] == ["BadInput"]
    [(name, state, key)] = query(path, "SELECT name, state, key FROM effects")
    assert (name, state) == ("notify", "confirmed")
    assert query(path, "SELECT body FROM outbox") == [(f"ok m1 {key}",)]
    assert scalar(path, "SELECT count(*) FROM timers WHERE id = 'check-m1'") == 1
    result = json.loads(scalar(path, "SELECT result FROM runs"))
    assert result["event"] == "m1" and result["pid"] != process.pid
    # The agent's process ends with the worker.
    wait_for(lambda: not alive(result["pid"]), what="the agent's process to end")


def test_an_agent_the_isolated_process_cannot_load_is_exit_2(tmp_path):
    path = init(tmp_path)
    process = worker(tmp_path, path, "no_such_agent", "--isolate")
    assert exit_code(process) == 2, log(tmp_path)
    assert "has no function 'no_such_agent'" in log(tmp_path)
    assert scalar(path, "SELECT count(*) FROM lease") == 0  # it never took the lease


def test_sigterm_mid_run_ends_the_isolated_agent_with_the_worker(tmp_path):
    path = init(tmp_path, lease_ttl=30)
    ingest(path, "m1")
    process = worker(tmp_path, path, "never_yields", "--isolate", "--grace", "0.3")
    wait_for(lambda: (tmp_path / "inside-m1").exists(), what="the run to start")
    process.send_signal(signal.SIGTERM)
    assert exit_code(process) == 0, log(tmp_path)
    assert "abandoned (stopping)" in log(tmp_path)
    assert lease_released(path)


# --- the fleet worker (PostgreSQL) ------------------------------------------------------------


@pytest.fixture
def database_url() -> str:
    from tests.pg.server import Unavailable, cluster

    try:
        return cluster().new_database(schema=False)
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


async def _fleet_inbox(url: str, *, source_id: str) -> None:
    async with await Inbox.open(url, name="a") as box:
        await box.configure(max_run_seconds=2, max_attempts=1, lease_ttl=30)
        await box.ingest("chat", source_id, None)


async def _fleet_state(url: str):
    async with await Inbox.open(url, name="a", create=False) as box:
        [event] = await box.events("dead") or await box.events("running") or [None]
        return event, await box.lease_info(), box.now()


def _fleet(tmp_path, url: str, *extra: str):
    return start(
        tmp_path,
        "worker",
        url,
        "--all-inboxes",
        "--concurrency",
        "2",
        "--agent",
        "tests.worker.unruly:swallows_cancellation",
        "--grace",
        "0.3",
        "--poll",
        "0.2",
        "--no-dispatch",
        *extra,
        name="fleet",
    )


def test_a_fleet_worker_ends_for_an_agent_it_cannot_stop_unless_isolated(tmp_path, database_url):
    asyncio.run(_fleet_inbox(database_url, source_id="m1"))
    fleet = _fleet(tmp_path, database_url)
    assert exit_code(fleet, timeout=30) == 4, log(tmp_path, "fleet")
    assert "did not end when cancelled" in log(tmp_path, "fleet")
    event, lease, now = asyncio.run(_fleet_state(database_url))
    assert event.status == "running" and lease.until < now  # released on the way out

    asyncio.run(_fleet_inbox(database_url, source_id="m2"))
    fleet = _fleet(tmp_path, database_url, "--isolate")
    try:
        wait_for(
            lambda: asyncio.run(_dead_count(database_url)) == 2,
            timeout=30,
            what="both runs given up by the isolated fleet",
        )
        assert fleet.poll() is None, log(tmp_path, "fleet")
    finally:
        assert stop(fleet) == 0, log(tmp_path, "fleet")


async def _dead_count(url: str) -> int:
    async with await Inbox.open(url, name="a", create=False) as box:
        return (await box.counts())["dead"]
