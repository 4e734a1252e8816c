"""`onwatch worker` and `onwatch serve` run where no terminal UI is installed: started as real
processes, neither imports textual or rich (their import log is read, not guessed)."""

from __future__ import annotations

import base64
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.worker.helpers import ROOT, env, onwatch, stop, wait_for

UI = ("textual", "rich")
SECRET = "whsec_" + base64.b64encode(b"a webhook secret, 32 bytes long").decode()


def imported(stderr: str) -> set[str]:
    """Top-level package names from `python -X importtime`'s log on stderr."""
    names = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)", stderr, re.M)
    assert names, "no import log: was -X importtime passed?"
    return {name.split(".")[0] for name in names}


def start(args: list[str], test_dir, name: str) -> subprocess.Popen:
    err = open(os.path.join(test_dir, f"{name}.err"), "wb")
    try:
        return subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "onwatch", *args],
            cwd=ROOT,
            env=env(test_dir, ONWATCH_HOOK_SECRET_CHAT=SECRET),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def log(test_dir, name: str) -> str:
    with open(os.path.join(test_dir, f"{name}.err"), encoding="utf-8") as handle:
        return handle.read()


@pytest.fixture
def path(tmp_path) -> str:
    path = str(tmp_path / "alice.db")
    assert onwatch("init", path).returncode == 0
    assert onwatch("ingest", path, "chat", "m1", '{"text": "hi"}').returncode == 0
    return path


def test_the_import_log_would_show_textual_if_it_came():
    # The check below can fail: a command that draws does import textual, and the log says so.
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import textual.app"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "textual" in imported(result.stderr)


def test_a_worker_runs_an_event_without_importing_textual_or_rich(path, tmp_path):
    worker = start(
        ["worker", path, "--agent", "tests.worker.agents:echo", "--poll", "0.1", "--max-runs", "1"],
        tmp_path,
        "worker",
    )
    try:
        assert worker.wait(timeout=60) == 0, log(tmp_path, "worker")
    finally:
        stop(worker)
    with sqlite3.connect(path) as db:  # it really ran the event
        assert db.execute("SELECT status FROM events").fetchall() == [("done",)]
    assert not imported(log(tmp_path, "worker")) & set(UI)


def test_serve_starts_and_stops_without_importing_textual_or_rich(path, tmp_path):
    server = start(["serve", path, "--port", "0"], tmp_path, "serve")
    try:
        wait_for(
            lambda: "listening on" in log(tmp_path, "serve") or server.poll() is not None,
            timeout=60,
            what="the receiver to listen",
        )
        assert server.poll() is None, log(tmp_path, "serve")
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0, log(tmp_path, "serve")
    finally:
        stop(server)
    assert not imported(log(tmp_path, "serve")) & set(UI)
