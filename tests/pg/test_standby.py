"""A failover with a real hot standby: a primary and a standby that streams from it, both
started by the test, a worker reaching them through one address (a proxy, as a DNS name or
a virtual address would be moved), the primary stopped, the address moved to the standby
while it still takes no writes, then the standby promoted.

test_failover.py makes the same fault with a setting on one server (new sessions read-only,
every session ended); this is the real thing, with a standby in recovery, which refuses more
than writes (a LISTEN), and a promotion.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.pg.proxy import Proxy
from tests.pg.server import ENV_URL, Unavailable, _OwnedServer
from tests.worker.helpers import log_of, onwatch, start_worker, stop, wait_for


@pytest.fixture
def pair():
    """A primary and its hot standby, started for this test."""
    if os.environ.get(ENV_URL):
        pytest.skip(f"a standby needs servers the tests start, not the one of ${ENV_URL}")
    try:
        primary = _OwnedServer(replication=True)
    except Unavailable as exc:
        pytest.skip(f"no server to replicate: {exc}")
    standby = None
    try:
        standby = _OwnedServer(standby_of=primary)
        yield primary, standby
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


def _url(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


@pytest.mark.parametrize("serving", [("--inbox", "a"), ("--all-inboxes",)], ids=["inbox", "fleet"])
def test_a_worker_rides_out_a_switchover_to_its_standby(pair, tmp_path, serving):
    primary, standby = pair
    assert onwatch("init", _url(primary.port), "--inbox", "a", test_dir=tmp_path).returncode == 0
    ingest = onwatch(
        "ingest", _url(primary.port), "s", "one", "{}", "--inbox", "a", test_dir=tmp_path
    )
    assert ingest.returncode == 0, ingest.stderr
    # The standby is read-only from the start: its URL opens the inbox read-only, and a
    # worker started on it refuses, saying why.
    wait_for(
        lambda: "pending 1" in onwatch("status", _url(standby.port), "--inbox", "a").stdout,
        what="the standby to have the event",
    )
    refused = onwatch("worker", _url(standby.port), *serving, "--agent", "tests.worker.agents:echo")
    assert refused.returncode == 1 and "a standby server" in refused.stderr, refused.stderr

    proxy = Proxy(primary.port)
    worker = start_worker(proxy.url(_url(primary.port)), "held", tmp_path, *serving)
    try:
        wait_for(lambda: (tmp_path / "inside-one").exists(), what="the run to start")
        # The switchover: the primary stops (a fast stop sends the standby all it wrote),
        # and the address now leads to the standby, still in recovery.
        primary.pg_ctl("-w", "-m", "fast", "stop")
        proxy.target_port = standby.port
        proxy.refuse()  # every connection through it was to the stopped primary
        proxy.relay()
        (tmp_path / "release").touch()
        wait_for(
            lambda: "stopped taking writes" in log_of(tmp_path) or worker.poll() is not None,
            timeout=60,
            what="the finish to meet the standby",
        )
        assert worker.poll() is None, log_of(tmp_path)
        standby.pg_ctl("-w", "promote")
        wait_for(
            lambda: "takes writes again" in log_of(tmp_path),
            timeout=60,
            what="the finish on the promoted standby",
        )
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
        proxy.close()
    log = log_of(tmp_path)
    assert "Traceback" not in log, log
    assert ("1 run(s), 1 done" if serving[0] == "--inbox" else "1 run(s) over 1 inbox") in log
    done = onwatch("events", _url(standby.port), "done", "--json", "--inbox", "a")
    assert done.returncode == 0, done.stderr
    [event] = json.loads(done.stdout)
    assert (event["source_id"], event["attempts"]) == ("one", 1), event  # no second run
