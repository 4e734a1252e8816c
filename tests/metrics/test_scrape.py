"""/metrics of a real `onwatch serve` process and a real `onwatch worker --metrics-port`
process, scraped while work happens; every figure compared with the database file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
from tests import waiting
import pytest

from onwatch.core import Inbox
from tests.webhook.helpers import ServerProcess, post, standard_headers

from .helpers import samples, scrape, value

pytestmark = pytest.mark.slow

AGENT = textwrap.dedent('''
    """A test agent: waits for a flag file when asked to, fails when asked to."""
    import asyncio, os, time

    async def handle(batch, ctx):
        for event in batch:
            payload = event.payload or {}
            if payload.get("fail"):
                raise RuntimeError("asked to fail")
            if payload.get("hold"):
                deadline = time.monotonic() + 20
                while not os.path.exists(payload["hold"]) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        ctx.reply(f"done {len(batch)}")
''')


async def until(check, timeout: float = 20.0):
    return await waiting.until(check, timeout=timeout, what="the scrape to agree")


async def assert_state_matches(found: dict, db: Path) -> None:
    async with await Inbox.open(db, create=False) as inbox:
        counts = await inbox.counts()
        view = await inbox.overview()
    for state, number in counts.items():
        assert value(found, "onwatch_events", inbox="alice", state=state) == number, state
    assert value(found, "onwatch_approvals_waiting", inbox="alice") == view.waiting_approvals
    assert value(found, "onwatch_outbox_held_messages", inbox="alice") == view.held_messages
    assert value(found, "onwatch_lease_generation", inbox="alice") == (
        view.lease.gen if view.lease else 0
    )
    assert value(found, "onwatch_stale_writes_refused_total", inbox="alice") == view.refused_writes


async def test_serve_metrics_while_deliveries_arrive(tmp_path):
    db = tmp_path / "alice.db"
    server = await ServerProcess(db, tmp_path / "serve.log").start()
    url = server.url
    try:
        async with aiohttp.ClientSession() as http:
            for key in ("build-1", "build-2", "build-1"):
                body = json.dumps({"build": key}).encode()
                status, _, _ = await post(
                    http, f"{url}/hooks/ci", body, standard_headers(body, key)
                )
                assert status in (200, 202)
        # another process ingests too: state comes from the file, counters from serve alone
        async with await Inbox.open(db, create=False) as inbox:
            await inbox.ingest("chat", "m1", {"text": "hi"})
            await inbox.request_approval("refund-1", 3600, "refund 40")
        found = samples(scrape(f"{url}/metrics"))
        await assert_state_matches(found, db)
        assert value(found, "onwatch_events", inbox="alice", state="pending") == 3
        assert value(found, "onwatch_events_ingested_total", inbox="alice", source="ci") == 2
        assert value(found, "onwatch_ingest_duplicates_total", inbox="alice", source="ci") == 1
        assert value(found, "onwatch_events_ingested_total", inbox="alice", source="chat") is None
        soonest = value(found, "onwatch_approval_soonest_deadline_seconds", inbox="alice")
        assert 3595 <= soonest <= 3600
        assert value(found, "process_resident_memory_bytes") > 0
    finally:
        assert server.stop(signal.SIGTERM) == 0


async def test_worker_metrics_while_runs_happen(tmp_path):
    db = tmp_path / "alice.db"
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    flag = tmp_path / "go"
    async with await Inbox.open(db) as inbox:
        await inbox.configure(max_attempts=1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")},
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    log = tmp_path / "worker.log"
    with open(log, "wb") as err:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onwatch",
                "worker",
                str(db),
                "--agent",
                f"{agent}:handle",
                "--file",
                str(tmp_path / "sent.jsonl"),
                "--poll",
                "0.1",
                "--metrics-port",
                "0",
                "--holder",
                "box-1",
            ],
            stderr=err,
            stdout=subprocess.DEVNULL,
            env=env,
        )
    try:

        async def metrics_url():
            found = re.search(r"metrics on (http://\S+/metrics)", log.read_text())
            return found and found.group(1)

        url = await until(metrics_url)

        async with await Inbox.open(db, create=False) as inbox:
            await inbox.ingest("chat", "m1", {"text": "hi"})

            async def done(n):
                return (await inbox.counts())["done"] >= n

            await until(lambda: done(1))
            # a run in progress: the scrape sees it running, as the file does
            await inbox.ingest("chat", "m2", {"hold": str(flag)})

            async def running():
                return (await inbox.counts())["running"] == 1

            await until(running)
            found = samples(scrape(url))
            assert value(found, "onwatch_events", inbox="alice", state="running") == 1
            assert value(found, "onwatch_runs_total", inbox="alice") == 2
            assert value(found, "onwatch_run_duration_seconds_count", inbox="alice") == 1
            flag.touch()
            await until(lambda: done(2))
            await inbox.ingest("chat", "m3", {"fail": True})

            async def dead():
                return (await inbox.counts())["dead"] == 1

            await until(dead)

            async def settled():  # the worker has counted the failed run's end too
                found = samples(scrape(url))
                ended = value(found, "onwatch_run_duration_seconds_count", inbox="alice")
                return found if ended == 3 else None

            found = await until(settled)
            await assert_state_matches(found, db)
            runs = set()
            for state in ("done", "dead"):
                for event in await inbox.events(state):
                    runs.update(run.id for run in await inbox.runs(event.id))
            assert value(found, "onwatch_runs_total", inbox="alice") == len(runs) == 3
            assert value(found, "onwatch_run_failures_total", inbox="alice") == 1
            assert value(found, "onwatch_runs_abandoned_total", inbox="alice") == 0
            assert (
                value(found, "onwatch_claim_latency_seconds_count", inbox="alice", source="chat")
                == 3
            )
            lease = await inbox.lease_info()
            assert lease.holder == "box-1"
            assert value(found, "onwatch_lease_generation", inbox="alice") == lease.gen
            left = value(found, "onwatch_lease_expiry_seconds", inbox="alice")
            assert abs(left - (lease.until - inbox.now())) <= 2
            (tmp_path / "scrape.txt").write_text(scrape(url))
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
