"""A server that stops taking writes under running processes: a primary demoted in a
failover (its restart as a standby ends every session, and the sessions opened again are
read-only), or writes turned off for maintenance.

Before, the first write refused (ReadOnlySqlTransaction) was a ReadOnlyInbox: the worker
exited 1 with its agent's outcome unwritten, and every restart met the same server and exited
again. A server that took writes when the inbox was opened is now waited out like a full
disk (ServerReadOnly, a WritesRefused): nothing was written, the session is dropped so the
next try opens a new one, and the run's outcome is written once, when a server takes writes
again. A URL that gives a read-only server from the start still opens the inbox read-only
(test_backend.py: a read replica's URL).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import psycopg
import pytest

from onwatch.core import ConnectionLost, Inbox, ServerReadOnly
from onwatch.core.pg.shared import Connections
from onwatch.core.webhooks import Secrets, start_server
from tests.webhook.helpers import HOOK_SECRET, standard_headers
from tests.worker.helpers import log_of, onwatch, start_worker, stop, wait_for


def _demote(url: str) -> None:
    """What a failover does to the database at this URL: new sessions take no writes, and
    every session it had is ended (a demoted primary restarts as a standby)."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )


def _promote(url: str) -> None:
    """Writes are taken again at this URL, by new sessions only: the sessions opened while
    they were not stay read-only (a new primary at the same name)."""
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(url, autocommit=True, options="-c default_transaction_read_only=off") as c:
        c.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


def test_a_worker_waits_out_a_failover_and_writes_its_outcome_once(url, tmp_path):
    assert onwatch("init", url, "--inbox", "a", test_dir=tmp_path).returncode == 0
    assert (
        onwatch("ingest", url, "--inbox", "a", "s", "one", "{}", test_dir=tmp_path).returncode == 0
    )
    worker = start_worker(url, "held", tmp_path, "--inbox", "a")
    try:
        wait_for(lambda: (tmp_path / "inside-one").exists(), what="the run to start")
        _demote(url)
        (tmp_path / "release").touch()
        wait_for(
            lambda: "stopped taking writes" in log_of(tmp_path) or worker.poll() is not None,
            what="the finish to meet the demoted server",
        )
        assert worker.poll() is None, log_of(tmp_path)
        _promote(url)
        wait_for(
            lambda: "takes writes again" in log_of(tmp_path),
            timeout=30,
            what="the finish once writes are taken again",
        )
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
    log = log_of(tmp_path)
    assert log.count("stopped taking writes") == 1, log  # said once, not at every try
    assert "1 run(s), 1 done" in log, log
    done = onwatch("events", url, "done", "--json", "--inbox", "a", test_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    [event] = json.loads(done.stdout)
    assert (event["source_id"], event["attempts"]) == ("one", 1), event  # no second run


async def test_each_write_is_refused_changing_nothing_until_a_server_takes_writes(url):
    box = await Inbox.open(url, name="a")
    try:
        assert await box.ingest("s", "before", None)
        _demote(url)
        # The session it had was ended: replaced before the write, by one that refuses it;
        # each try opens a new session, refused too.
        for key in ("during-0", "during-1", "during-2"):
            with pytest.raises(ServerReadOnly, match="stopped taking writes.*nothing was written"):
                await box.ingest("s", key, None)
        assert box.read_only is None  # the inbox is writable: the server is what refuses
        assert (await box.counts())["pending"] == 1  # reads still answer
        _promote(url)
        # The read's session was opened while writes were off, and stays read-only: the
        # first write after a refusal runs on a session opened for it (it was refused once
        # more on the read's).
        assert await box.ingest("s", "after", None) is True
        assert await box.ingest("s", "again", None) is True  # on the same session
        assert (await box.counts())["pending"] == 3
    finally:
        await box.close()


async def test_sessions_shared_by_inboxes_and_opened_while_writes_were_off_take_no_write(url):
    """Inboxes that share connections (a fleet's visits): reads during the spell open
    sessions that stay read-only, and go back to the shared connections. Neither the inbox
    whose write was refused nor one that never wrote during the spell runs a write on them
    afterwards: every write after the promotion is stored at its first try."""
    shared = Connections(url, limit=2)
    a = await Inbox.open(url, name="a", connections=shared)
    b = await Inbox.open(url, name="b", connections=shared)
    try:
        assert await a.ingest("s", "before", None) and await b.ingest("s", "before", None)
        _demote(url)
        for attempt in range(20):  # the sessions the server ended are met and dropped
            try:
                await a.ingest("s", f"during-{attempt}", None)
            except ServerReadOnly:
                break
            except ConnectionLost:
                await asyncio.sleep(0.1)  # the reconnection's backoff
        else:
            pytest.fail("no write was refused as the server's")

        async def read(box: Inbox) -> None:
            for _ in range(50):
                try:
                    await box.counts()
                    return
                except ConnectionLost:
                    await asyncio.sleep(0.1)
            pytest.fail("a read never answered during the spell")

        await asyncio.gather(read(a), read(b), read(a), read(b))  # sessions opened now
        _promote(url)
        for n in range(3):
            for box in (b, a):
                assert await box.ingest("s", f"after-{n}", None) is True
        assert [(await box.counts())["pending"] for box in (a, b)] == [4, 4]
    finally:
        await a.close()
        await b.close()
        shared.close()


async def test_a_receiver_answers_503_and_stores_the_retry_after_the_failover(url):
    box = await Inbox.open(url, name="a")
    server = await start_server(
        box, secrets=Secrets.of(ci=HOOK_SECRET), host="127.0.0.1", port=0, max_body=None
    )
    try:
        async with aiohttp.ClientSession() as http:
            assert (await _post(http, server.url, 0))[0] == 202
            _demote(url)
            status, body, headers = await _post(http, server.url, 1)  # on a new session
            assert status == 503 and "takes no writes" in body, body
            assert headers["Retry-After"] == "5"
            _promote(url)
            status, body, _ = await _post(http, server.url, 1)  # the sender's retry
            assert (status, json.loads(body)) == (202, {"stored": True})
    finally:
        await server.close()
        await box.close()


async def test_a_receiver_that_cannot_reach_its_database_answers_503_saying_so(url):
    """Not a failover but its neighbour: the database turns every connection away (its
    sessions ended, new ones refused). The receiver answers 503 saying it cannot reach the
    database, and stores the sender's retry once connections are taken again."""
    box = await Inbox.open(url, name="a")
    server = await start_server(
        box, secrets=Secrets.of(ci=HOOK_SECRET), host="127.0.0.1", port=0, max_body=None
    )
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    try:
        async with aiohttp.ClientSession() as http:
            assert (await _post(http, server.url, 0))[0] == 202
            elsewhere = url.rsplit("/", 1)[0] + "/postgres"  # the server's own database
            with psycopg.connect(elsewhere, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                admin.execute(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (name,),
                )
            status, body, headers = await _post(http, server.url, 1)
            assert status == 503 and "cannot reach the database" in body, body
            with psycopg.connect(elsewhere, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            for _ in range(100):  # the sender's retries, past the reconnection's backoff
                status, body, _ = await _post(http, server.url, 1)
                if status != 503:
                    break
                await asyncio.sleep(0.05)
            assert (status, json.loads(body)) == (202, {"stored": True})
    finally:
        await server.close()
        await box.close()


async def _post(http: aiohttp.ClientSession, url: str, n: int) -> tuple[int, str, dict]:
    body = json.dumps({"n": n}).encode()
    async with http.post(
        url + "/hooks/ci", data=body, headers=standard_headers(body, f"msg-{n}")
    ) as response:
        return response.status, await response.text(), dict(response.headers)
