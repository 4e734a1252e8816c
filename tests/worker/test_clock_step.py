"""A wall-clock step on the worker's machine (an NTP correction, a VM resumed after hours):
the worker neither gives up a healthy run of its own nor blames itself in the audit log.
Its renewal deadlines are measured on the monotonic clock, and a lease that looks lapsed
to the stepped clock, which nobody took over, is renewed by its holder
(docs/rules.md#lease-and-fencing)."""

from __future__ import annotations

import json

import pytest

from tests.worker.helpers import log_of, onwatch, query, start_worker, stop, wait_for

pytestmark = pytest.mark.slow


def ledger(tmp_path) -> list:
    path = tmp_path / "ledger"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_two_hour_step_forward_mid_run_keeps_the_run(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, "lease_ttl=6", "outbox_gap=0").returncode == 0
    worker = start_worker(
        path,
        "clock_stepper",
        tmp_path,
        "--file",
        str(tmp_path / "out.jsonl"),
        module="tests.worker.stepping",
    )
    try:
        assert onwatch("ingest", path, "chat", "m1", "{}").returncode == 0
        wait_for(
            lambda: query(path, "SELECT status FROM events WHERE source_id = 'm1'") == [("done",)],
            timeout=60,
            what="the run to finish",
        )
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
    log = log_of(tmp_path)
    assert ledger(tmp_path) == [{"ran": ["m1"]}]  # once
    assert "0 abandoned" in log and "lease generation 1 lost" not in log, log
    refused = query(path, "SELECT action FROM audit WHERE applied = 0")
    assert refused == [], refused  # nobody was accused of a stale write
    assert query(path, "SELECT attempts FROM events WHERE source_id = 'm1'") == [(1,)]
    assert query(path, "SELECT count(*) FROM lease_history") == [(1,)]  # no takeover
