"""Real worker processes killed, stalled and stopped at the worst moment (lease_ttl = 2 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .helpers import (
    SHOW_NAPS,
    ROOT,
    env,
    event_status,
    log_of,
    onwatch,
    query,
    scalar,
    sent_lines,
    start_worker,
    stop,
    wait_asleep,
    wait_for,
)

pytestmark = pytest.mark.slow


def make_inbox(tmp_path, **settings) -> str:
    path = str(tmp_path / "inbox.db")
    pairs = [
        f"{k}={json.dumps(v)}" for k, v in {"lease_ttl": 2, "outbox_gap": 0, **settings}.items()
    ]
    result = onwatch("init", path, *pairs)
    assert result.returncode == 0, result.stderr
    return path


def effects_of(path, source_id: str) -> list[tuple]:
    """(run gen, effect name, state) for every effect of every run that claimed the event."""
    return query(
        path,
        """
        SELECT runs.gen, effects.name, effects.state FROM effects
        JOIN runs ON runs.id = effects.run_id
        JOIN run_events ON run_events.run_id = runs.id
        JOIN events ON events.id = run_events.event_id
        WHERE events.source_id = ? ORDER BY effects.id""",
        (source_id,),
    )


def ledger(tmp_path) -> list[dict]:
    try:
        lines = (tmp_path / "ledger").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def kill_mid_run(tmp_path, policy: str):
    path = make_inbox(tmp_path, on_lost_claim=policy)
    assert onwatch("ingest", path, "chat", "m1", '{"text": "pay"}').stdout.strip() == "stored"
    first = start_worker(path, "blocking", tmp_path, "--no-dispatch", holder="A", name="a")
    try:
        wait_for(lambda: (tmp_path / "inside-m1").exists(), what="worker A inside its effect")
        assert scalar(path, "SELECT holder || ':' || gen FROM lease") == "A:1"
        assert event_status(path, "m1") == "running"
        first.send_signal(signal.SIGKILL)
        first.wait(5)
    finally:
        if first.poll() is None:
            first.kill()
    (tmp_path / "release").touch()  # the successor's run is not blocked
    second = start_worker(path, "blocking", tmp_path, "--no-dispatch", holder="B", name="b")
    return path, second


def test_sigkill_mid_run_retry_runs_again_under_a_new_generation(tmp_path):
    path, second = kill_mid_run(tmp_path, "retry")
    try:
        wait_for(
            lambda: event_status(path, "m1") == "done", timeout=30, what="worker B to finish m1"
        )
    finally:
        assert stop(second) == 0, log_of(tmp_path, "b")
    assert scalar(path, "SELECT gen FROM lease_history WHERE holder = 'B'") == 2
    runs = query(path, "SELECT gen, outcome FROM runs ORDER BY id")
    assert runs == [(1, "lost"), (2, "done")]
    assert scalar(path, "SELECT attempts FROM events WHERE source_id = 'm1'") == 2
    # The journal tells what the killed run did: charged (confirmed), mail intended only.
    assert effects_of(path, "m1") == [
        (1, "charge", "confirmed"),
        (1, "send-mail", "intended"),
        (2, "charge", "confirmed"),
        (2, "send-mail", "confirmed"),
    ]
    assert query(path, "SELECT body FROM outbox") == [("done m1",)]
    # At-least-once: under retry this tool really charged twice (that is what interrupt is
    # for), but both runs passed it the same idempotency key: a payment API that dedupes on
    # it charges once.
    charges = [e for e in ledger(tmp_path) if e["effect"] == "charge"]
    assert len(charges) == 2 and charges[0]["key"] == charges[1]["key"]


def test_sigkill_mid_run_interrupt_waits_for_the_operator(tmp_path):
    path, second = kill_mid_run(tmp_path, "interrupt")
    try:
        wait_for(
            lambda: event_status(path, "m1") == "interrupted",
            timeout=15,
            what="m1 to become interrupted",
        )
        # B keeps running: it runs the next event, but never picks the interrupted one up.
        assert onwatch("ingest", path, "chat", "m2", '{"text": "next"}').returncode == 0
        wait_for(lambda: event_status(path, "m2") == "done", timeout=15, what="B to run m2")
        assert event_status(path, "m1") == "interrupted"
        assert scalar(path, "SELECT gen FROM lease") == 2
    finally:
        assert stop(second) == 0, log_of(tmp_path, "b")
    assert effects_of(path, "m1") == [(1, "charge", "confirmed"), (1, "send-mail", "intended")]
    assert scalar(path, "SELECT count(*) FROM outbox WHERE body = 'done m1'") == 0
    shown = json.loads(onwatch("show", path, "1", "--json").stdout)
    assert [(e["name"], e["state"]) for e in shown["effects"]] == [
        ("charge", "confirmed"),
        ("send-mail", "intended"),
    ]
    assert "completion uncertain" in shown["event"]["error"]
    # Knowing the mail may have gone, the operator marks it done.
    result = onwatch("resolve", path, "1", "--actor", "ana", "--reason", "mail was sent")
    assert result.returncode == 0, result.stderr
    assert event_status(path, "m1") == "done"


def test_sigstop_stalled_worker_is_fenced_after_a_takeover(tmp_path):
    path = make_inbox(tmp_path)
    onwatch("ingest", path, "chat", "m1", '{"text": "pay"}')
    stalled = start_worker(path, "blocking", tmp_path, "--no-dispatch", holder="A", name="a")
    second = None
    try:
        wait_for(lambda: (tmp_path / "inside-m1").exists(), what="A inside its effect")
        stalled.send_signal(signal.SIGSTOP)
        (tmp_path / "release").touch()
        second = start_worker(path, "blocking", tmp_path, "--no-dispatch", holder="B", name="b")
        wait_for(lambda: event_status(path, "m1") == "done", timeout=15, what="B to finish")
        assert scalar(path, "SELECT holder || ':' || gen FROM lease") == "B:2"
        stalled.send_signal(signal.SIGCONT)
        # A wakes up: its renewal and/or its finish of the generation-1 claim are refused.
        wait_for(
            lambda: scalar(
                path,
                "SELECT count(*) FROM audit WHERE applied = 0 AND "
                "actor = 'A' AND action LIKE 'refused %'",
            ),
            timeout=10,
            what="A's stale write to be refused",
        )
    finally:
        assert stop(stalled) == 0, log_of(tmp_path, "a")
        if second is not None:
            assert stop(second) == 0, log_of(tmp_path, "b")
    refused = query(path, "SELECT action, target FROM audit WHERE actor = 'A' AND applied = 0")
    assert refused and all(target == "gen 1" for _, target in refused), refused
    assert query(path, "SELECT body FROM outbox") == [("done m1",)]  # no duplicate reply
    assert query(path, "SELECT gen, outcome FROM runs ORDER BY id") == [(1, "lost"), (2, "done")]
    assert "abandoned" in log_of(tmp_path, "a") or "refused" in log_of(tmp_path, "a")


STALE_FINISH = textwrap.dedent("""
    import asyncio, os, sys, time
    from onwatch.core import Inbox
    async def main(path, gate):
        inbox = await Inbox.open(path)
        gen = await inbox.acquire("A")
        batch = await inbox.claim_batch("A", gen)
        print("claimed", gen, [e.id for e in batch], flush=True)
        while not os.path.exists(gate):   # SIGSTOP lands here
            time.sleep(0.02)
        print("finish", await inbox.finish("A", gen, [e.id for e in batch],
                                           messages=["late reply"]), flush=True)
        await inbox.close()
    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


def test_stalled_process_late_finish_returns_false(tmp_path):
    """Scenario 4 (docs/rules.md#scenario-4-stall-and-takeover) with real processes: A claims,
    is stopped, B takes over and finishes; A's finish of its generation-1 claim returns False
    and writes nothing."""
    path = make_inbox(tmp_path)
    onwatch("ingest", path, "chat", "m1", '{"text": "hi"}')
    gate = tmp_path / "gate"
    stalled = subprocess.Popen(
        [sys.executable, "-c", STALE_FINISH, path, str(gate)],
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stalled.stdout.readline().split()[:2] == ["claimed", "1"]
        stalled.send_signal(signal.SIGSTOP)
        second = start_worker(path, "echo", tmp_path, "--no-dispatch", holder="B", name="b")
        try:
            wait_for(lambda: event_status(path, "m1") == "done", timeout=15, what="B")
        finally:
            assert stop(second) == 0
        gate.touch()
        stalled.send_signal(signal.SIGCONT)
        assert stalled.stdout.readline().strip() == "finish False"
        assert stalled.wait(10) == 0
    finally:
        if stalled.poll() is None:
            stalled.kill()
    assert query(path, "SELECT body FROM outbox") == [("reply chat/m1",)]
    assert (
        scalar(
            path, "SELECT count(*) FROM audit WHERE action = 'refused finish' AND target = 'gen 1'"
        )
        == 1
    )
    assert scalar(path, "SELECT attempts FROM events") == 2


def test_sigterm_idle_releases_the_lease_and_exits_0(tmp_path):
    path = make_inbox(tmp_path, lease_ttl=60)
    worker = start_worker(path, "echo", tmp_path, *SHOW_NAPS, holder="A")
    wait_for(lambda: scalar(path, "SELECT holder FROM lease") == "A", what="A's lease")
    wait_asleep(tmp_path)  # idle, the case under test
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(5) == 0, log_of(tmp_path)
    until = scalar(path, "SELECT until FROM lease")
    assert until < time.time()  # released: a successor need not wait 60 s
    assert "released" in log_of(tmp_path)


def test_sigterm_mid_run_abandons_after_grace_and_successor_starts_at_once(tmp_path):
    path = make_inbox(tmp_path, lease_ttl=60)
    onwatch("ingest", path, "chat", "m1", '{"text": "slow"}')
    worker = start_worker(path, "sleepy", tmp_path, "--grace", "0.5", holder="A", name="a")
    wait_for(lambda: (tmp_path / "inside-m1").exists(), what="A's run to start")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(5) == 0, log_of(tmp_path, "a")
    assert "abandoned (stopping)" in log_of(tmp_path, "a")
    successor = start_worker(path, "echo", tmp_path, holder="B", name="b")
    try:
        # far less than the 60 s TTL: B need not wait out A's lease
        wait_for(lambda: event_status(path, "m1") == "done", timeout=20, what="B")
    finally:
        assert stop(successor) == 0
    assert query(path, "SELECT gen, outcome FROM runs ORDER BY id") == [(1, "lost"), (2, "done")]


def test_new_events_and_timers_wake_an_idle_worker_quickly(tmp_path):
    path = make_inbox(tmp_path, lease_ttl=600)  # renewed every 200 s
    worker = start_worker(
        path, "echo", tmp_path, "--file", str(tmp_path / "sent.jsonl"), "--poll", "120", *SHOW_NAPS
    )
    try:
        wait_for(lambda: scalar(path, "SELECT count(*) FROM lease"), what="the lease")
        wait_asleep(tmp_path)  # idle: only a wake-up brings it to the new event
        onwatch("ingest", path, "chat", "wake", '"x"')
        # Its nap lasts 120 s (the poll) unless woken: a run within 30 s is the wake's.
        wait_for(lambda: event_status(path, "wake") == "done", timeout=30, what="the run")
        sent = json.loads(wait_for(lambda: sent_lines(tmp_path / "sent.jsonl"), what="the send")[0])
        assert sent["text"] == "reply chat/wake" and sent["key"].startswith("onwatch-")
    finally:
        assert stop(worker) == 0, log_of(tmp_path)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_idle_worker_uses_well_under_one_percent_cpu(tmp_path):
    path = make_inbox(tmp_path, lease_ttl=30)
    worker = start_worker(path, "echo", tmp_path, "--poll", "0.5", *SHOW_NAPS)
    try:
        wait_for(lambda: scalar(path, "SELECT count(*) FROM lease"), what="the lease")
        wait_asleep(tmp_path)  # past start-up: asleep in its idle nap
        before, started = cpu_seconds(worker.pid), time.monotonic()
        time.sleep(4.0)  # the window measured (its CPU time, which load does not inflate)
        used = cpu_seconds(worker.pid) - before
        share = used / (time.monotonic() - started)
    finally:
        assert stop(worker) == 0
    print(f"\nidle worker CPU: {share * 100:.2f}% ({used:.2f} s over 4 s, poll 0.5 s)")
    (tmp_path / "cpu.txt").write_text(f"{share}")
    assert share < 0.01
