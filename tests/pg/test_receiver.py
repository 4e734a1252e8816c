"""The webhook receiver on one inbox of a PostgreSQL database (`onwatch serve URL --inbox
NAME`), in its own process, through a server restart (`pg_ctl restart -m immediate`): every
delivery it acknowledged before the restart is stored after it, it answers 503 (retry later)
while the server is away rather than acknowledge what it could not store, it says so in its
log, and it stores again once the server is back, without being restarted itself."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time

import aiohttp
import psycopg
import pytest

from onwatch.core import Inbox
from tests.webhook.helpers import github_headers, secrets_env
from tests.worker.helpers import ROOT

pytestmark = pytest.mark.slow


async def start_receiver(url: str, name: str, log_path) -> tuple[subprocess.Popen, str]:
    log_file = open(log_path, "ab")
    env = dict(secrets_env(), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "onwatch", "serve", url, "--inbox", name, "--port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )
    log_file.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.findall(r"listening on (http://\S+?);", log_path.read_text())
        if found:
            return proc, found[-1] + "/hooks/github"
        if proc.poll() is not None:
            raise AssertionError(f"receiver exited {proc.returncode}: {log_path.read_text()}")
        await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError(f"receiver did not start: {log_path.read_text()}")


async def deliver(http: aiohttp.ClientSession, hook: str, n: int) -> int | None:
    """One GitHub delivery; the HTTP status, or None if the request itself failed."""
    body = json.dumps({"n": n}).encode()
    try:
        async with http.post(hook, data=body, headers=github_headers(body, f"d-{n}")) as resp:
            await resp.read()
            return resp.status
    except aiohttp.ClientError:
        return None


def test_deliveries_acknowledged_before_a_server_restart_are_all_stored(pg, tmp_path):
    if pg.owned is None:
        pytest.skip("needs a server the tests started (it is restarted)")
    url = pg.new_database()

    async def main() -> tuple[set[int], dict[int, list], str]:
        await (await Inbox.open(url, name="hooks")).close()
        proc, hook = await start_receiver(url, "hooks", tmp_path / "serve.log")
        acked: set[int] = set()
        answers: dict[int, list] = {}
        try:
            async with aiohttp.ClientSession() as http:

                async def client(numbers) -> None:
                    for n in numbers:
                        status = await deliver(http, hook, n)
                        answers.setdefault(n, []).append(status)
                        if status in (200, 202):
                            acked.add(n)

                # Before: 200 deliveries, 10 senders at once, every one acknowledged.
                await asyncio.gather(*(client(range(k, 200, 10)) for k in range(10)))
                assert acked == set(range(200))
                # During: senders keep delivering while PostgreSQL restarts under them.
                senders = asyncio.gather(*(client(range(200 + k, 600, 10)) for k in range(10)))
                deadline = time.monotonic() + 30
                while len(acked) < 220 and not senders.done():  # the senders are under way
                    assert time.monotonic() < deadline, "no delivery of the second wave stored"
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(pg.pg_ctl, "-w", "-m", "immediate", "restart")
                await senders
                # After: what was not acknowledged is delivered again (as a sender retries),
                # with backoff, until the receiver stores it; it is never restarted.
                deadline = time.monotonic() + 30
                while len(acked) < 600 and time.monotonic() < deadline:
                    await client(sorted(set(range(600)) - acked))
                    await asyncio.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        return acked, answers, (tmp_path / "serve.log").read_text()

    acked, answers, log = asyncio.run(main())
    assert acked == set(range(600)), log[-2000:]
    refused = {n for n, statuses in answers.items() if statuses[0] not in (200, 202)}
    assert refused, "the restart refused no delivery: it did not happen under load"
    # Nothing was acknowledged without being stored, and nothing stored twice.
    assert all(s in (200, 202, 503, None) for statuses in answers.values() for s in statuses), {
        n: s for n, s in answers.items() if set(s) - {200, 202, 503, None}
    }
    with psycopg.connect(url) as conn:
        stored = [
            r[0]
            for r in conn.execute(
                "SELECT e.source_id FROM events e JOIN inboxes i ON i.id = e.inbox_id "
                "WHERE i.name = 'hooks' AND e.source = 'github'"
            )
        ]
    assert sorted(stored) == sorted(f"d-{n}" for n in range(600))
    # The restart is in the log (each 503 above was one of these): a session lost under a
    # job, or a new one the server refused while it restarted; then the reconnection. (A
    # session it ended while idle is replaced quietly, at INFO: nothing was lost.)
    assert "lost the connection" in log or "cannot reconnect" in log, log
    assert "reconnected" in log, log


def test_the_start_line_names_the_database_without_its_password(pg, tmp_path):
    """The receiver's start line named a URL as if it were a file (the working folder in
    front, the slashes merged) with its password in it: the log is read by others."""
    url = pg.new_database()
    with_password = url.replace("postgres@", "postgres:s3cret-word@", 1)
    assert with_password != url

    async def main() -> str:
        await (await Inbox.open(url, name="hooks")).close()
        log_path = tmp_path / "serve.log"
        proc, _ = await start_receiver(with_password, "hooks", log_path)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        return log_path.read_text()

    log = asyncio.run(main())
    shown = url.replace("postgres@", "postgres:***@", 1)
    assert f"serve: {shown} inbox hooks; listening on http://" in log, log
    assert "s3cret-word" not in log, log


def test_the_engines_lines_reach_the_receivers_log_in_its_format(pg, tmp_path):
    """The receiver logged only its own lines: the engine's went to Python's last-resort
    handler, its warnings bare (no time, no name) and its INFO lines not at all, so a
    session the server ended while idle, replaced before the next delivery, left no trace.
    Now every onwatch line is in the log, each with the time and `onwatch serve:`."""
    url = pg.new_database()

    async def main() -> str:
        await (await Inbox.open(url, name="hooks")).close()
        log_path = tmp_path / "serve.log"
        proc, hook = await start_receiver(url, "hooks", log_path)
        try:
            async with aiohttp.ClientSession() as http:
                assert await deliver(http, hook, 1) == 202
                with psycopg.connect(url, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                assert await deliver(http, hook, 2) == 202  # on a session opened anew
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        return log_path.read_text()

    log = asyncio.run(main())
    [line] = [line for line in log.splitlines() if "ended the session while it was idle" in line]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} onwatch serve: inbox ", line), line

    async def stored() -> int:
        async with await Inbox.open(url, name="hooks") as inbox:
            return (await inbox.counts()).get("pending", 0)

    assert asyncio.run(stored()) == 2
