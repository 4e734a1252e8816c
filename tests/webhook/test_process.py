"""The receiver as its own OS process: a bounded load, SIGKILL mid-load, a clean SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import time

import aiohttp
import pytest

from onwatch.core import Inbox

from .helpers import (
    GITHUB_SECRET,
    HOOK_SECRET,
    STRIPE_SECRET,
    ServerProcess,
    standard_headers,
    github_headers,
    percentile,
    secrets_env,
    stored,
)

pytestmark = pytest.mark.slow

CLIENTS = 100
PAD = "x" * 1500  # a delivery of ~1.6 KB, the size of a small GitHub event


def delivery(n: int) -> tuple[str, bytes]:
    return f"delivery-{n:05d}", json.dumps({"n": n, "pad": PAD}).encode()


async def run_clients(url: str, work: list[tuple[str, bytes]], clients: int, on_answer=None):
    """`clients` concurrent HTTP clients (one connection each) working through `work`.
    Returns [(key, status or None, seconds)] in completion order."""
    queue: asyncio.Queue = asyncio.Queue()
    for item in work:
        queue.put_nowait(item)
    results = []

    async def client():
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not queue.empty():
                key, body = queue.get_nowait()
                started = time.perf_counter()
                try:
                    async with session.post(
                        url, data=body, headers=github_headers(body, key)
                    ) as response:
                        await response.read()
                        status = response.status
                except aiohttp.ClientError:
                    status = None
                results.append((key, status, time.perf_counter() - started))
                if on_answer:
                    on_answer(key, status)
                if status is None:
                    return  # the server is gone

    await asyncio.gather(*(client() for _ in range(clients)))
    return results


async def test_bounded_load_2000_deliveries_100_clients_30_percent_duplicates(tmp_path):
    db = tmp_path / "load.db"
    server = await ServerProcess(db, tmp_path / "server.log").start()
    try:
        rng = random.Random(7)
        unique = [delivery(n) for n in range(1400)]
        work = unique + [rng.choice(unique) for _ in range(600)]
        rng.shuffle(work)

        started = time.perf_counter()
        results = await run_clients(server.url + "/hooks/github", work, CLIENTS)
        elapsed = time.perf_counter() - started
    finally:
        assert server.stop(signal.SIGTERM) == 0

    statuses = [status for _, status, _ in results]
    assert len(results) == 2000
    assert all(status is not None and 200 <= status < 300 for status in statuses)
    assert statuses.count(202) == 1400 and statuses.count(200) == 600

    async with await Inbox.open(db) as inbox:
        events = await stored(inbox, "github")
    assert set(events) == {key for key, _ in unique}
    assert all(events[key]["body"]["n"] == int(key.split("-")[1]) for key in events)

    latencies = [seconds for _, _, seconds in results]
    figures = (
        f"webhook load: 2000 deliveries (1400 unique, 600 duplicates), {CLIENTS} "
        f"concurrent clients, ~1.6 KB each: {2000 / elapsed:.0f} deliveries/s, "
        f"p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms, total {elapsed:.2f} s"
    )
    print("\n" + figures)

    log = server.log.read_text()
    request_lines = [line for line in log.splitlines() if "POST /hooks/github" in line]
    assert len(request_lines) == 2000  # one line per request
    assert GITHUB_SECRET not in log and STRIPE_SECRET not in log and HOOK_SECRET not in log
    assert PAD not in log  # no bodies


async def test_sigkill_mid_load_loses_no_acknowledged_delivery(tmp_path):
    db = tmp_path / "kill.db"
    server = await ServerProcess(db, tmp_path / "server.log").start()
    acknowledged: set[str] = set()
    killed = asyncio.Event()

    def on_answer(key, status):
        if status is not None and 200 <= status < 300:
            acknowledged.add(key)
        if len(acknowledged) >= 400 and not killed.is_set():
            os.kill(server.proc.pid, signal.SIGKILL)  # mid-load: ~100 requests in flight
            killed.set()

    try:
        work = [delivery(n) for n in range(20_000)]
        results = await run_clients(server.url + "/hooks/github", work, CLIENTS, on_answer)
    finally:
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    failed = [key for key, status, _ in results if status is None]
    assert killed.is_set() and failed, "the kill did not land in the middle of the load"
    assert len(results) < len(work)

    # The file after the kill: intact, and every acknowledged delivery is in it.
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    async with await Inbox.open(db) as inbox:
        keys = set(await stored(inbox, "github"))
    missing = acknowledged - keys
    assert not missing, f"{len(missing)} acknowledged deliveries lost, e.g. {sorted(missing)[:5]}"
    print(
        f"\nwebhook SIGKILL: {len(acknowledged)} acknowledged, {len(failed)} cut off in "
        f"flight, {len(keys)} stored (cut-off ones may be stored too); none lost"
    )

    # Restart on the same file: the senders' retries of acknowledged deliveries are
    # duplicates, the cut-off ones are stored now if they were not before.
    restarted = await ServerProcess(db, tmp_path / "server.log").start()
    try:
        retry = [delivery(int(key.split("-")[1])) for key in sorted(acknowledged | set(failed))]
        results = await run_clients(restarted.url + "/hooks/github", retry, 20)
    finally:
        assert restarted.stop(signal.SIGTERM) == 0
    answers = {key: status for key, status, _ in results}
    assert all(answers[key] == 200 for key in acknowledged)
    assert all(answers[key] in (200, 202) for key in failed)
    async with await Inbox.open(db) as inbox:
        assert set(await stored(inbox, "github")) == acknowledged | keys | set(failed)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_sigterm_or_sigint_stops_cleanly_with_status_0(tmp_path, sig):
    server = await ServerProcess(tmp_path / "term.db", tmp_path / "server.log").start()
    body = b'{"build": 1}'
    async with aiohttp.ClientSession() as session:
        async with session.post(
            server.url + "/hooks/ci", data=body, headers=standard_headers(body, "b1")
        ) as response:
            assert response.status == 202
    assert server.stop(sig) == 0
    log = server.log.read_text()
    assert "listening on http://127.0.0.1:" in log
    assert "/hooks/ci (1 secret from ONWATCH_HOOK_SECRET_CI)" in log
    assert "/hooks/stripe (2 secrets from ONWATCH_STRIPE_SECRET)" in log
    assert "POST /hooks/ci 202 ci/b1 stored" in log
    assert "stopping" in log
    assert HOOK_SECRET not in log


async def test_port_in_use_is_one_line_and_status_1(tmp_path):
    first = await ServerProcess(tmp_path / "a.db", tmp_path / "a.log").start()
    try:
        port = first.url.rsplit(":", 1)[1]
        proc = await asyncio.create_subprocess_exec(
            *first.command, "--port", port, stderr=asyncio.subprocess.PIPE, env=first.env
        )
        _, err = await asyncio.wait_for(proc.communicate(), 20)
        assert proc.returncode == 1
        assert err.decode().count("\n") == 1 and "cannot listen" in err.decode()
    finally:
        first.stop(signal.SIGTERM)


async def test_missing_inbox_is_refused_with_status_2(tmp_path):
    # Like every onwatch command but init, serve does not create an inbox: a typo in PATH
    # must not silently start a second, empty inbox nobody watches.
    server = ServerProcess(tmp_path / "typo.db", tmp_path / "x.log")
    proc = await asyncio.create_subprocess_exec(
        *server.command, "--port", "0", stderr=asyncio.subprocess.PIPE, env=server.env
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 2
    assert err.decode().count("\n") == 1 and "onwatch init" in err.decode(), err
    assert not (tmp_path / "typo.db").exists()


# A receiver whose server signals its own process the moment its port is bound: the
# narrowest window between listening and serving, made certain instead of raced.
SIGNALLED_AT_BIND = """
import os, signal, sys
from onwatch.core.webhooks import main, server

start = server.start_server

async def bound_then_signalled(*args, **kwargs):
    started = await start(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return started

server.start_server = bound_then_signalled

class Args:
    path, host, port, config, max_body = os.environ["INBOX"], "127.0.0.1", 0, None, None

sys.exit(main(Args))
"""


async def test_a_stop_signal_the_moment_the_port_is_bound_stops_it_cleanly(tmp_path):
    path = str(tmp_path / "inbox.db")
    await (await Inbox.open(path)).close()
    env = dict(secrets_env(), INBOX=path)
    done = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SIGNALLED_AT_BIND,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = (await asyncio.wait_for(done.communicate(), 60))[0].decode()
    assert done.returncode == 0, output  # not -15: the signal's default never ran
    assert "stopping: finishing requests in flight" in output
