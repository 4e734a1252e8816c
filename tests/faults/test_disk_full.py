"""A full disk, for real: the inbox's file system (or the PostgreSQL server's tablespace)
filled to the last byte while onwatch writes to it, then freed.

The rule it tests (docs/rules.md, "A full disk", under the inbox file against the world
outside it): a write that finds no room raises StorageFull, a kind of InboxBusy, and changes
nothing; whatever retries a locked inbox retries it, so nothing is lost and nothing runs
twice once space is freed. Before, the engine called it a plain error (a damaged inbox, when
the `-shm` index could not be made; a lost connection on PostgreSQL), the worker exited
after the agent's run with its outcome unwritten, the webhook receiver answered 500, and
`onwatch notify` with its memory there stopped with an internal error.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from onwatch.core import Inbox, InboxBusy, StorageFull
from onwatch.core.webhooks import Secrets, start_server
from tests.disk import Disk, small_disk
from tests.watch.helpers import die
from tests.webhook.helpers import HOOK_SECRET, standard_headers
from tests.worker.helpers import env, log_of, onwatch, start_worker, stop, wait_for

PAD = {"pad": "x" * 3000}  # events big enough to need new pages soon


async def _ingest_until_refused(box: Inbox, prefix: str) -> tuple[int, StorageFull]:
    """Ingest until the disk refuses: (how many were stored first, the refusal). The log
    may still have room for a few: its space is reused after a checkpoint."""
    for n in range(500):
        try:
            assert await box.ingest("s", f"{prefix}{n}", PAD)
        except StorageFull as exc:
            return n, exc
    raise AssertionError("500 ingests on a full disk and none refused")


async def test_an_ingest_on_a_full_disk_is_refused_and_stores_nothing(tmp_path):
    with small_disk() as disk:
        box = await Inbox.open(disk.path / "inbox.db")
        try:
            assert await box.ingest("s", "before", {"n": 1})
            disk.fill()
            stored, refused = await _ingest_until_refused(box, "k")
            assert isinstance(refused, InboxBusy)  # whatever retries a lock retries this
            assert "no room to write on its disk" in str(refused)
            assert "nothing was written" in str(refused)
            assert (await box.counts())["pending"] == 1 + stored
            disk.free()
            # The refused event was not stored: the same key is new, not a duplicate.
            assert await box.ingest("s", f"k{stored}", PAD) is True
            assert (await box.counts())["pending"] == 2 + stored
        finally:
            await box.close()


async def test_an_inbox_opened_on_a_full_disk_says_so_not_damaged(tmp_path):
    """Opening needs room for the `-shm` index; a full disk makes that an I/O error, which
    was reported as a damaged inbox ("not a usable inbox", exit 2)."""
    with small_disk() as disk:
        path = disk.path / "inbox.db"
        box = await Inbox.open(path)
        await box.ingest("s", "before", {"n": 1})
        await box.close()  # the last connection: SQLite removes the -wal and -shm files
        assert not Path(f"{path}-shm").exists()
        disk.fill()
        with pytest.raises(StorageFull, match="no room to write on its disk"):
            await Inbox.open(path)
        cli = onwatch("ingest", path, "s", "by-cli", "{}", test_dir=tmp_path)
        assert cli.returncode == 3, cli.stderr  # busy: worth another try
        assert "no room to write on its disk" in cli.stderr
        disk.free()
        box = await Inbox.open(path)
        try:
            assert (await box.counts())["pending"] == 1
            assert await box.ingest("s", "by-cli", {}) is True
        finally:
            await box.close()


def test_a_worker_waits_out_a_full_disk_and_finishes_its_run_once(tmp_path):
    """The agent's run ends while the disk is full: the worker keeps its run, says so once,
    and writes the outcome once there is room, with no second run."""
    with small_disk() as disk:
        path = disk.path / "inbox.db"
        assert onwatch("init", path, test_dir=tmp_path).returncode == 0
        assert onwatch("ingest", path, "s", "one", "{}", test_dir=tmp_path).returncode == 0
        worker = start_worker(path, "held", tmp_path)
        try:
            wait_for(lambda: (tmp_path / "inside-one").exists(), what="the run to start")
            disk.fill()
            (tmp_path / "release").touch()
            wait_for(
                lambda: "no room to write" in log_of(tmp_path) or worker.poll() is not None,
                what="the finish to meet the full disk",
            )
            assert worker.poll() is None, log_of(tmp_path)
            disk.free()
            wait_for(
                lambda: "takes writes again" in log_of(tmp_path),
                timeout=20,
                what="the finish once there is room",
            )
        finally:
            assert stop(worker) == 0, log_of(tmp_path)
        log = log_of(tmp_path)
        assert log.count("no room to write") == 1, log  # said once, not at every try
        assert "worker" in log and "1 run(s), 1 done" in log, log
        status = onwatch("events", path, "done", "--json", test_dir=tmp_path)
        assert [e["source_id"] for e in json.loads(status.stdout)] == ["one"], status


async def test_a_webhook_on_a_full_disk_gets_503_and_is_stored_when_retried(tmp_path):
    with small_disk() as disk:
        box = await Inbox.open(disk.path / "inbox.db")
        server = await start_server(
            box, secrets=Secrets.of(ci=HOOK_SECRET), host="127.0.0.1", port=0, max_body=None
        )
        try:
            async with aiohttp.ClientSession() as http:
                disk.fill()
                answers = [await _post(http, server.url, n) for n in range(300)]
                refused = next(n for n, (status, _, _) in enumerate(answers) if status != 202)
                status, body, headers = answers[refused]
                assert status == 503, body
                assert headers["Retry-After"] == "60"
                assert "disk full" in body
                disk.free()
                status, body, _ = await _post(http, server.url, refused)  # the sender's retry
                assert (status, json.loads(body)) == (202, {"stored": True})
        finally:
            await server.close()
            await box.close()


async def _post(http: aiohttp.ClientSession, url: str, n: int) -> tuple[int, str, dict]:
    body = json.dumps({"n": n, **PAD}).encode()
    async with http.post(
        url + "/hooks/ci", data=body, headers=standard_headers(body, f"msg-{n}")
    ) as response:
        return response.status, await response.text(), dict(response.headers)


async def test_postgresql_out_of_room_is_storage_full_not_a_lost_connection(tmp_path):
    """The server's own "could not extend file: No space left on device" (53100), from a
    tablespace on the small disk: it was reported as a lost connection, whose write may or
    may not have committed; it is a refusal that changed nothing."""
    from tests.pg.server import cluster_or_skip

    cluster = cluster_or_skip()
    if cluster.owned is None or cluster.owned.user is None:
        pytest.skip("a tablespace on a disk of the test's own needs the server it started as root")
    with small_disk(kib=8192) as disk:
        url, drop = _database_on(cluster, disk)
        box = await Inbox.open(url, name="full")
        try:
            assert await box.ingest("s", "before", {"n": 1})
            disk.fill()
            stored, refused = await _ingest_until_refused(box, "k")
            assert "the PostgreSQL server has no room to write" in str(refused)
            # Ingests that arrive together share a transaction: the disk is no one item's
            # fault, so none of them is refused as if it were (they were: "event not
            # stored", a plain error, a receiver's 500).
            together = await asyncio.gather(
                *(box.ingest("s", f"g{n}", PAD) for n in range(20)), return_exceptions=True
            )
            kinds = [f"{type(result).__name__}: {str(result)[:60]}" for result in together]
            assert all(isinstance(result, StorageFull) for result in together), kinds
            assert (await box.counts())["pending"] == 1 + stored
            disk.free()
            assert await box.ingest("s", f"k{stored}", PAD) is True
        finally:
            await box.close()
            drop()


def _database_on(cluster, disk: Disk):
    """A new database whose onwatch tables are made in a tablespace on `disk`; and what
    drops both."""
    import os
    import pwd

    owner = pwd.getpwnam(cluster.owned.user)
    place = disk.path / "tablespace"
    place.mkdir()
    os.chown(place, owner.pw_uid, owner.pw_gid)
    url = cluster.new_database(schema=False)
    name = url.rsplit("/", 1)[1].split("?")[0]
    space = f"{name}_space"
    with cluster.admin() as admin:
        admin.execute(f"CREATE TABLESPACE {space} LOCATION '{place}'")
        admin.execute(f"ALTER DATABASE {name} SET default_tablespace = {space}")

    def drop() -> None:
        with cluster.admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.execute(f"DROP TABLESPACE IF EXISTS {space}")

    return url, drop


def test_the_disk_helper_fills_and_frees(tmp_path):
    with small_disk(kib=256) as disk:
        disk.fill()
        with pytest.raises(OSError):
            (disk.path / "more").write_bytes(b"x" * 8192)
        disk.free()
        (disk.path / "more").write_bytes(b"x" * 8192)


async def test_the_notifier_waits_out_a_full_disk_and_says_each_death_once(tmp_path):
    """Its memory on the full disk: it says nothing it cannot remember (it used to stop with
    an internal error), says so once, and says each thing once when there is room."""
    path = tmp_path / "alice.db"
    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_attempts=1)
    with small_disk() as disk:
        log = tmp_path / "notify.err"
        with open(log, "ab") as err:
            notifier = subprocess.Popen(
                [sys.executable, "-m", "onwatch", "notify", str(path), "--command",
                 "cat >> said.jsonl", "--state", str(disk.path / "notify.db"), "--poll", "0.2"],
                cwd=tmp_path, env=env(tmp_path), stderr=err,
            )  # fmt: skip
        try:
            wait_for(lambda: "watching" in log.read_text(), what="the notifier to start")
            disk.fill()
            async with await Inbox.open(path, create=False) as inbox:
                for name in ("m-1", "m-2"):
                    await die(inbox, name)
            wait_for(
                lambda: "nothing more is said" in log.read_text() or notifier.poll() is not None,
                what="the notifier to meet the full disk",
            )
            assert notifier.poll() is None, log.read_text()
            assert not (tmp_path / "said.jsonl").exists()
            disk.free()
            wait_for(lambda: _said(tmp_path) == 2, timeout=20, what="both deaths said")
            wait_for(lambda: "works again" in log.read_text(), what="the recovery said")
        finally:
            assert stop(notifier) == 0, log.read_text()
    text = log.read_text()
    assert text.count("nothing more is said") == 1, text
    docs = [json.loads(line) for line in (tmp_path / "said.jsonl").read_text().splitlines()]
    assert sorted(d["ids"]["event_id"] for d in docs) == [1, 2]


def _said(folder: Path) -> int:
    said = folder / "said.jsonl"
    return len(said.read_text().splitlines()) if said.exists() else 0
