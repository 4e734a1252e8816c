"""`onwatch run`: receiver, scheduler and worker in one real process on one inbox."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.webhook.helpers import HOOK_SECRET, standard_headers
from tests.worker.helpers import ROOT, env, event_status, onwatch, scalar, sent_lines, wait_for

WRONG_SECRET = "whsec_" + base64.b64encode(b"not the secret the receiver has").decode()

pytestmark = pytest.mark.slow


def post(url: str, body: bytes, headers: dict) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def start_run(path: str, tmp_path, *extra: str) -> subprocess.Popen:
    err = open(tmp_path / "run.err", "ab")
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "onwatch",
                "run",
                path,
                "--agent",
                "tests.worker.agents:echo",
                "--port",
                "0",
                "--poll",
                "30",
                "--file",
                str(tmp_path / "sent.jsonl"),
                *extra,
            ],
            cwd=ROOT,
            env=env(tmp_path, ONWATCH_HOOK_SECRET_CI=HOOK_SECRET, ONWATCH_ECHO_PAUSE="0"),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def server_url(tmp_path) -> str:
    """The URL `onwatch run` logs once it listens."""
    return wait_for(
        lambda: re.search(r"listening on (http://\S+)", (tmp_path / "run.err").read_text()),
        timeout=20,
        what="the server",
    ).group(1)


def test_run_receives_a_signed_webhook_calls_the_agent_replies_and_stops_on_sigterm(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, "outbox_gap=0").returncode == 0
    process = start_run(path, tmp_path)
    try:
        url = server_url(tmp_path)
        # the worker takes the lease right after the server logs that it listens
        wait_for(
            lambda: scalar(path, "SELECT holder FROM lease"), timeout=20, what="the worker's lease"
        )
        body = json.dumps({"text": "hello"}).encode()
        assert post(f"{url}/hooks/ci", body, standard_headers(body, "delivery-1")) == 202
        # Acknowledged means stored: the event is in the file when the 2xx arrives.
        assert scalar(path, "SELECT count(*) FROM events WHERE source_id = 'delivery-1'") == 1
        # The fallback poll is 30 s: only the in-process wake explains a run within 10 s.
        wait_for(
            lambda: event_status(path, "delivery-1") == "done", timeout=10, what="the agent's run"
        )
        sent = wait_for(lambda: sent_lines(tmp_path / "sent.jsonl"), what="the reply")
        assert json.loads(sent[0])["text"] == "reply ci/delivery-1"
        # A retry of the same delivery is a duplicate: answered 2xx, still one event.
        assert post(f"{url}/hooks/ci", body, standard_headers(body, "delivery-1")) == 200
        # A bad signature is refused and stores nothing.
        assert (
            post(f"{url}/hooks/ci", body, standard_headers(body, "delivery-2", secret=WRONG_SECRET))
            == 401
        )
        assert scalar(path, "SELECT count(*) FROM events") == 1
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(20)
    log = (tmp_path / "run.err").read_text()
    assert code == 0, log
    assert scalar(path, "SELECT until FROM lease") < time.time(), log  # released
    assert "released" in log


def test_run_refuses_a_missing_inbox_or_no_secrets_in_one_line(tmp_path):
    missing = str(tmp_path / "none.db")
    for extra, words in (
        ({"ONWATCH_HOOK_SECRET_CI": HOOK_SECRET}, "no inbox"),
        ({}, "no webhook secrets"),
    ):
        environment = {
            k: v
            for k, v in env(tmp_path, **extra).items()
            if not k.startswith("ONWATCH_") or k in extra or k == "ONWATCH_TEST_DIR"
        }
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "onwatch",
                "run",
                missing,
                "--agent",
                "tests.worker.agents:echo",
                "--port",
                "0",
            ],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
        assert not os.path.exists(missing)


def test_run_stores_each_acknowledged_webhook_once_while_another_process_holds_the_lock(
    tmp_path,
):
    """Under `onwatch run` the receiver shares the worker's loop, where a lone ingest may
    commit (Inbox.loop_writes). Deliveries from eight clients at once and one at a time,
    while another process takes the file's write lock on and off: every 2xx is stored
    once, every event runs once, and the process stops cleanly."""
    import sqlite3
    import threading
    from concurrent.futures import ThreadPoolExecutor

    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, "outbox_gap=0").returncode == 0
    process = start_run(path, tmp_path)
    stop = threading.Event()

    def hold_the_lock() -> None:
        other = sqlite3.connect(path, isolation_level=None, timeout=10)
        try:
            while not stop.is_set():
                other.execute("BEGIN IMMEDIATE")
                time.sleep(0.02)
                other.execute("COMMIT")
                time.sleep(0.01)
        finally:
            other.close()

    try:
        url = server_url(tmp_path)
        holder = threading.Thread(target=hold_the_lock)
        holder.start()

        def deliver(key: str) -> tuple[str, int]:
            body = json.dumps({"text": key}).encode()
            return key, post(f"{url}/hooks/ci", body, standard_headers(body, key))

        try:
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(deliver, [f"c{k}" for k in range(120)]))
            answers += [deliver(f"s{k}") for k in range(40)]
        finally:
            stop.set()
            holder.join()
        assert {code for _, code in answers} == {202}, answers
        keys = [key for key, _ in answers]
        stored = scalar(path, "SELECT count(*) FROM events WHERE source = 'ci'")
        assert stored == len(keys) == 160  # each acknowledged delivery, once
        wait_for(
            lambda: scalar(path, "SELECT count(*) FROM events WHERE status = 'done'") == 160,
            timeout=60,
            what="every run",
        )
        assert scalar(path, "SELECT count(*) FROM run_events") == 160  # each event ran once
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = process.wait(20)
    assert code == 0, (tmp_path / "run.err").read_text()
