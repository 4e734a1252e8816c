"""A misbehaving agent cannot wedge, double or silently stop the worker.

Each test runs real `onwatch` processes with an agent file written as people write them,
wrongly (tests/worker/unruly.py), and checks what docs/rules.md#a-misbehaving-agent
promises: an effect never blocks the loop, a run given up holds no capacity, code that
cannot be stopped ends the process with exit 4 after the lease is released, an agent's
exit is a failed run, a changed directory moves nothing, two starters under one name do
not share a generation, an effect whose outcome cannot be written is not reported as failed,
SIGHUP stops like SIGTERM, and a blocked event loop is named in the log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.webhook.helpers import HOOK_SECRET, standard_headers

from .helpers import ROOT, env, event_status, onwatch, query, scalar, sent_lines, wait_for
from .unruly import FORGED

pytestmark = pytest.mark.slow

UNRULY = "tests.worker.unruly"
AGENT_STUCK = 4  # cli/commands/runtime.py: the worker ended itself; start it again


def init(tmp_path: Path, **settings: object) -> str:
    path = str(tmp_path / "inbox.db")
    pairs = [f"{k}={json.dumps(v)}" for k, v in {"outbox_gap": 0, **settings}.items()]
    result = onwatch("init", path, *pairs)
    assert result.returncode == 0, result.stderr
    return path


def ingest(path: str, source_id: str, source: str = "chat") -> None:
    result = onwatch("ingest", path, source, source_id, '{"text": "hi"}')
    assert result.returncode == 0, result.stderr


def start(
    tmp_path: Path, *args: str, name: str = "worker", cwd: Path = ROOT, **extra: str
) -> subprocess.Popen:
    """`onwatch ARGS` in its own process; its stderr goes to NAME.err in tmp_path."""
    err = open(tmp_path / f"{name}.err", "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "onwatch", *args],
            cwd=cwd,
            env=env(tmp_path, **extra),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def worker(tmp_path: Path, path: str, agent: str, *extra: str, **kw: str) -> subprocess.Popen:
    return start(
        tmp_path, "worker", path, "--agent", f"{UNRULY}:{agent}", "--poll", "0.1", *extra, **kw
    )


def log(tmp_path: Path, name: str = "worker") -> str:
    try:
        return (tmp_path / f"{name}.err").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def exit_code(process: subprocess.Popen, timeout: float = 20.0) -> int:
    """Wait, bounded, for the process to end: a hang is what these tests catch."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise AssertionError(f"process {process.pid} did not exit within {timeout} s") from None


def stop(process: subprocess.Popen, signum: int = signal.SIGTERM) -> int:
    if process.poll() is None:
        process.send_signal(signum)
    return exit_code(process)


def ledger(tmp_path: Path) -> list[dict]:
    try:
        text = (tmp_path / "ledger").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def lease_released(path: str) -> bool:
    return scalar(path, "SELECT until FROM lease") < time.time()


def runs(path: str) -> list[tuple]:
    return query(path, "SELECT gen, outcome FROM runs ORDER BY id")


# --- an effect never blocks the loop ---------------------------------------------------------


def test_a_plain_def_effect_runs_once_while_the_loop_keeps_the_lease(tmp_path):
    """A 'payment' inside ctx.perform from a plain def, slower than the lease TTL (2 s): the
    loop renews the lease meanwhile, a second worker never gets it, the payment runs once."""
    path = init(tmp_path, lease_ttl=2)
    ingest(path, "m1")
    first = worker(tmp_path, path, "pays_in_a_plain_def", "--holder", "A", name="a")
    second = None
    try:
        wait_for(lambda: (tmp_path / "inside-m1").exists(), what="A inside its payment")
        until = scalar(path, "SELECT until FROM lease")
        # Renewed twice while the payment still runs: the loop is free.
        wait_for(
            lambda: scalar(path, "SELECT until FROM lease") >= until + 2,
            timeout=10,
            what="A's lease to be renewed during the payment",
        )
        second = worker(tmp_path, path, "pays_in_a_plain_def", "--holder", "B", name="b")
        wait_for(lambda: "lease held by A" in log(tmp_path, "b"), what="B to wait for A")
        assert scalar(path, "SELECT holder || ':' || gen FROM lease") == "A:1"
        (tmp_path / "release").touch()
        wait_for(lambda: event_status(path, "m1") == "done", what="the run to finish")
    finally:
        (tmp_path / "release").touch()
        assert stop(first) == 0, log(tmp_path, "a")
        if second is not None:
            assert stop(second) == 0, log(tmp_path, "b")
    assert [e["pid"] for e in ledger(tmp_path) if e.get("effect") == "pay"] == [first.pid]
    assert runs(path) == [(1, "done")]
    assert query(path, "SELECT name, state FROM effects") == [("pay", "confirmed")]
    assert query(path, "SELECT body FROM outbox") == [("paid m1",)]


def post(url: str, body: bytes, headers: dict) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def start_run(tmp_path: Path, path: str, agent: str, *extra: str, cwd: Path = ROOT):
    return start(
        tmp_path,
        "run",
        path,
        "--agent",
        f"{UNRULY}:{agent}",
        "--port",
        "0",
        "--poll",
        "0.1",
        *extra,
        name="run",
        cwd=cwd,
        ONWATCH_HOOK_SECRET_CI=HOOK_SECRET,
    )


def listening(tmp_path: Path) -> str:
    found = wait_for(
        lambda: re.search(r"listening on (http://\S+)", log(tmp_path, "run")),
        timeout=20,
        what="the receiver",
    )
    return found.group(1)


def test_onwatch_run_answers_webhooks_while_a_plain_def_effect_runs(tmp_path):
    path = init(tmp_path, lease_ttl=60)
    process = start_run(tmp_path, path, "pays_in_a_plain_def")
    try:
        url = listening(tmp_path)
        body = b'{"text": "pay"}'
        assert post(f"{url}/hooks/ci", body, standard_headers(body, "d1")) == 202
        wait_for(lambda: (tmp_path / "inside-d1").exists(), what="the payment to start")
        # The payment is still running (it waits for `release`): the receiver answers.
        for n in range(2, 5):
            assert post(f"{url}/hooks/ci", body, standard_headers(body, f"d{n}")) == 202
        assert not (tmp_path / "release").exists() and event_status(path, "d1") == "running"
        (tmp_path / "release").touch()
        wait_for(
            lambda: all(event_status(path, f"d{n}") == "done" for n in range(1, 5)),
            timeout=30,
            what="all four runs",
        )
    finally:
        (tmp_path / "release").touch()
        assert stop(process) == 0, log(tmp_path, "run")


# --- a run given up holds no capacity ----------------------------------------------------------


def test_runs_given_up_never_use_up_the_capacity_for_runs(tmp_path):
    """More plain-def runs stuck in a call than the old shared pool had threads, then healthy
    events. Each stuck run is given up after max_run_seconds and its grace; its thread cannot
    be stopped, so the worker releases the lease and exits 4, and is started again (as a
    service manager would). Every healthy event is then run by the agent: none fails for
    max_run_seconds without the agent having been called."""
    pool = min(32, (os.cpu_count() or 1) + 4)  # asyncio.to_thread's default pool
    path = init(tmp_path, lease_ttl=30, max_run_seconds=2, max_attempts=1, max_batch=1)
    stuck = [f"stuck-{n}" for n in range(pool)]
    healthy = ["ok-1", "ok-2"]
    for source_id in stuck + healthy:
        ingest(path, source_id)
    codes = []
    deadline = time.monotonic() + 20 + 5 * pool
    settled = {"done", "dead"}
    while not all(event_status(path, s) in settled for s in healthy):
        assert time.monotonic() < deadline, (codes, log(tmp_path))
        process = worker(tmp_path, path, "hangs_in_a_call", "--grace", "0.2")
        try:
            wait_for(
                lambda: (
                    process.poll() is not None  # noqa: B023 - this iteration's process
                    or all(event_status(path, s) in settled for s in healthy)
                ),
                timeout=max(1.0, deadline - time.monotonic()),
                interval=0.05,
                what="the worker to end itself or the healthy events to be settled",
            )
        finally:
            codes.append(stop(process))
    assert [event_status(path, s) for s in healthy] == ["done", "done"], log(tmp_path)
    assert sorted(e["called"] for e in ledger(tmp_path) if "called" in e) == healthy
    assert [event_status(path, s) for s in stuck] == ["dead"] * pool
    # One worker ended itself per stuck run (exit 4); the last one was stopped (0).
    assert codes == [AGENT_STUCK] * pool + [0], codes
    assert "its thread(s) onwatch-run-" in log(tmp_path)


# --- code that cannot be stopped ends the process ------------------------------------------


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_an_agents_text_with_a_newline_cannot_forge_a_line_of_the_workers_log(tmp_path, isolate):
    """The worker's log (stderr: a journal, a file, a person's terminal) is read line by line.
    The agent's log record and its error, each carrying a line that reads as the worker's
    own, print that line indented under the record it belongs to, never at a line's start."""
    path = init(tmp_path, max_attempts=1)
    ingest(path, "m1")
    extra = ["--isolate"] if isolate else []
    process = worker(tmp_path, path, "forges_log_lines", "--max-runs", "1", *extra)
    assert exit_code(process) == 0, log(tmp_path)
    text = log(tmp_path)
    assert text.count(FORGED) >= 3, text  # logged, raised, and in the traceback
    assert not any(line.startswith(FORGED) for line in text.splitlines()), text
    assert event_status(path, "m1") == "dead"


def test_an_agent_that_swallows_cancellation_is_given_up_and_the_worker_exits_4(tmp_path):
    path = init(tmp_path, lease_ttl=30, max_run_seconds=2)
    ingest(path, "m1")
    process = worker(tmp_path, path, "swallows_cancellation", "--grace", "0.5")
    assert exit_code(process) == AGENT_STUCK, log(tmp_path)
    text = log(tmp_path)
    assert "abandoned (exceeded max_run_seconds (2 s))" in text
    assert "did not end when cancelled" in text and "exit 4" in text
    assert lease_released(path)  # released on the way out: a successor starts at once
    assert any("swallowed" in e for e in ledger(tmp_path))
    successor = start(
        tmp_path,
        "worker",
        path,
        "--agent",
        "tests.worker.agents:echo",
        "--max-runs",
        "1",
        "--poll",
        "0.1",
        name="successor",
    )
    assert exit_code(successor) == 0, log(tmp_path, "successor")
    assert event_status(path, "m1") == "done"
    assert scalar(path, "SELECT attempts FROM events WHERE source_id = 'm1'") == 2
    assert runs(path) == [(1, "lost"), (2, "done")]


def test_one_sigterm_stops_a_worker_whose_agent_swallows_cancellation(tmp_path):
    path = init(tmp_path, lease_ttl=30)
    ingest(path, "m1")
    process = worker(tmp_path, path, "swallows_cancellation", "--grace", "0.5")
    wait_for(lambda: (tmp_path / "inside-m1").exists(), what="the run to start")
    process.send_signal(signal.SIGTERM)
    # Asked to stop, it stopped: 0, though it left code it could not stop behind.
    assert exit_code(process) == 0, log(tmp_path)
    assert "abandoned (stopping)" in log(tmp_path)
    assert "task(s) that ignored their cancellation" in log(tmp_path)
    assert lease_released(path)
    assert event_status(path, "m1") == "running"  # left for the next generation


def test_an_agent_that_holds_the_event_loop_past_the_lease_ends_the_worker(tmp_path):
    """time.sleep(3600) in async def: nothing on the loop runs, SIGTERM included. Past the
    lease TTL and the grace the watch ends the process, exit 4, saying which run and where."""
    path = init(tmp_path, lease_ttl=2)
    ingest(path, "m1")
    process = worker(tmp_path, path, "never_yields", "--grace", "0.5")
    wait_for(lambda: (tmp_path / "inside-m1").exists(), what="the run to start")
    process.send_signal(signal.SIGTERM)  # cannot be handled while the loop is held
    assert exit_code(process) == AGENT_STUCK, log(tmp_path)
    text = log(tmp_path)
    assert "blocked" in text and "run 1 (events [1]" in text, text
    assert re.search(r"unruly\.py:\d+ in never_yields", text), text
    assert "ending the worker (exit 4)" in text
    successor = start(
        tmp_path,
        "worker",
        path,
        "--agent",
        "tests.worker.agents:echo",
        "--max-runs",
        "1",
        "--poll",
        "0.1",
        name="successor",
    )
    assert exit_code(successor) == 0, log(tmp_path, "successor")
    assert event_status(path, "m1") == "done"


def test_a_blocked_event_loop_is_logged_with_the_run_and_the_line(tmp_path):
    path = init(tmp_path, lease_ttl=4)
    ingest(path, "m1")
    process = worker(tmp_path, path, "sleeps_in_async")
    try:
        wait_for(lambda: event_status(path, "m1") == "done", timeout=15, what="the run")
        wait_for(lambda: "turned again" in log(tmp_path), what="the end of the stall logged")
    finally:
        assert stop(process) == 0, log(tmp_path)
    text = log(tmp_path)
    line = next(x for x in text.splitlines() if "event loop has been blocked" in x)
    assert "run 1 (events [1], gen 1)" in line
    assert re.search(r"unruly\.py:\d+ in sleeps_in_async", line), line
    assert re.search(r"turned again after [12]\.\d s blocked", text), text


# --- an agent's exit is a failed run ---------------------------------------------------------


@pytest.mark.parametrize(
    ("agent", "events"),
    [
        (
            "exits",
            {
                "exit-1": "SystemExit: 0",
                "interrupt-1": "KeyboardInterrupt",
                "generator-exit-1": "GeneratorExit",
            },
        ),
        ("exits_in_a_plain_def", {"exit-1": "SystemExit: 3"}),
    ],
)
def test_sys_exit_and_friends_are_a_failed_run_and_the_worker_goes_on(tmp_path, agent, events):
    path = init(tmp_path, lease_ttl=30, max_attempts=1, max_batch=1)
    for source_id in [*events, "ok-1"]:
        ingest(path, source_id)
    process = worker(tmp_path, path, agent)
    try:
        wait_for(
            lambda: (
                event_status(path, "ok-1") == "done"
                and all(event_status(path, s) == "dead" for s in events)
            ),
            timeout=15,
            what="every run to be recorded",
        )
        assert process.poll() is None, log(tmp_path)  # still serving
    finally:
        assert stop(process) == 0, log(tmp_path)
    for source_id, raised in events.items():
        error = scalar(path, "SELECT error FROM events WHERE source_id = ?", (source_id,))
        assert raised in error, (source_id, error)
    assert [outcome for _, outcome in runs(path)].count("error") == len(events)


# --- a changed directory moves nothing -------------------------------------------------------


def test_an_agent_that_changes_directory_does_not_move_the_inbox(tmp_path):
    init(tmp_path, lease_ttl=30)
    path = str(tmp_path / "inbox.db")
    process = start(
        tmp_path,
        "worker",
        "inbox.db",  # relative, to the folder it starts in
        "--agent",
        f"{UNRULY}:changes_directory",
        "--file",
        "sent.jsonl",
        "--poll",
        "0.1",
        cwd=tmp_path,
    )
    try:
        for source_id in ("m1", "m2"):
            ingest(path, source_id)
            wait_for(lambda: event_status(path, source_id) == "done", what=source_id)  # noqa: B023
            assert process.poll() is None, log(tmp_path)
        wait_for(
            lambda: len(sent_lines(tmp_path / "sent.jsonl")) == 2,
            what="both replies in the file named at start",
        )
    finally:
        assert stop(process) == 0, log(tmp_path)
    assert all(e["cwd"].endswith("elsewhere") for e in ledger(tmp_path))
    assert not (tmp_path / "elsewhere" / "sent.jsonl").exists()
    assert not (tmp_path / "elsewhere" / "inbox.db").exists()
    assert "deleted" not in log(tmp_path)


def test_onwatch_run_keeps_receiving_after_an_agent_changes_directory(tmp_path):
    init(tmp_path, lease_ttl=30)
    path = str(tmp_path / "inbox.db")
    process = start_run(tmp_path, "inbox.db", "changes_directory", cwd=tmp_path)
    try:
        url = listening(tmp_path)
        for n in (1, 2):
            body = b'{"text": "hi"}'
            assert post(f"{url}/hooks/ci", body, standard_headers(body, f"d{n}")) == 202
            wait_for(lambda: event_status(path, f"d{n}") == "done", what=f"d{n}")  # noqa: B023
        assert process.poll() is None
    finally:
        assert stop(process) == 0, log(tmp_path, "run")
    assert "deleted" not in log(tmp_path, "run")


# --- two starters under one name ------------------------------------------------------------


def test_two_workers_started_together_under_one_holder_never_run_at_once(tmp_path):
    """Both look at the lease before either takes it (the setup makes them meet there):
    one gets generation 1, the other waits for it, and never runs beside it."""
    path = init(tmp_path, lease_ttl=30, max_batch=1)
    ingest(path, "m1")
    ingest(path, "m2")
    args = ("--holder", "box", "--setup", f"{UNRULY}:meet_at_the_lease", "--no-dispatch")
    processes = [
        start(
            tmp_path,
            "worker",
            path,
            "--agent",
            "tests.worker.agents:blocking",
            "--poll",
            "0.1",
            *args,
            name=name,
        )
        for name in ("a", "b")
    ]
    try:
        wait_for(
            lambda: len(list(tmp_path.glob("looked-*"))) == 2, what="both to look at the lease"
        )
        waiting = wait_for(
            lambda: [n for n in ("a", "b") if "held under this holder name" in log(tmp_path, n)],
            what="one of them to wait for the other",
        )
        wait_for(lambda: list(tmp_path.glob("inside-*")), what="the other one's run")
        # One run at a time: the waiting one has not started m2 beside it.
        assert [p.name for p in tmp_path.glob("inside-*")] == ["inside-m1"]
        (tmp_path / "release").touch()
        wait_for(
            lambda: event_status(path, "m1") == "done" and event_status(path, "m2") == "done",
            what="both events, one after the other",
        )
    finally:
        (tmp_path / "release").touch()
        codes = [stop(p) for p in processes]
    assert codes == [0, 0], (log(tmp_path, "a"), log(tmp_path, "b"))
    assert len(waiting) == 1
    # Generation 1 was one process's (the other took generation 2 once it was released).
    history = query(path, "SELECT gen, how FROM lease_history ORDER BY gen")
    assert history[0] == (1, "first") and [h[0] for h in history] == list(
        range(1, len(history) + 1)
    )
    assert runs(path) == [(1, "done"), (1, "done")]
    active = {"a": processes[0].pid, "b": processes[1].pid}[({"a", "b"} - set(waiting)).pop()]
    assert {e["pid"] for e in ledger_of_agents(tmp_path)} == {active}


def ledger_of_agents(tmp_path: Path) -> list[dict]:
    return [e for e in ledger(tmp_path) if "effect" in e]


# --- an effect whose outcome cannot be written -------------------------------------------------


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE")
def test_an_effect_whose_outcome_cannot_be_recorded_is_not_reported_as_failed(tmp_path):
    path = init(tmp_path, lease_ttl=60)
    ingest(path, "m1")
    # stderr to a pipe: while the "disk" is full, a log file could not be written either.
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "onwatch",
            "worker",
            path,
            "--agent",
            f"{UNRULY}:pays_on_a_full_disk",
            "--poll",
            "0.1",
            "--no-dispatch",
        ],
        cwd=ROOT,
        env=env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: scalar(path, "SELECT outcome FROM runs WHERE id = 1"),
            timeout=20,
            what="the run's outcome",
        )
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    told = [e["told"] for e in ledger(tmp_path) if "told" in e]
    assert told == ["paid"], (told, err)  # the truth: the payment went through
    assert event_status(path, "m1") == "done"
    assert len([e for e in ledger(tmp_path) if e.get("effect") == "pay"]) == 1
    # The journal could not record it: "intended", outcome unknown, for the operator.
    assert query(path, "SELECT name, state FROM effects") == [("pay", "intended")]
    assert "could not be recorded" in err and "'intended'" in err, err
    assert query(path, "SELECT body FROM outbox") == [("payment paid",)]


# --- SIGHUP stops like SIGTERM ----------------------------------------------------------------


def test_sighup_stops_the_worker_as_sigterm_does(tmp_path):
    path = init(tmp_path, lease_ttl=60)
    ingest(path, "m1")
    process = start(
        tmp_path,
        "worker",
        path,
        "--agent",
        "tests.worker.agents:blocking",
        "--grace",
        "0.5",
        "--poll",
        "0.1",
    )
    wait_for(lambda: (tmp_path / "inside-m1").exists(), what="the run to start")
    process.send_signal(signal.SIGHUP)
    assert exit_code(process) == 0, log(tmp_path)
    assert "abandoned (stopping)" in log(tmp_path)
    assert lease_released(path)  # a successor need not wait the 60 s


def test_sighup_stops_onwatch_run_as_sigterm_does(tmp_path):
    path = init(tmp_path, lease_ttl=60)
    process = start_run(tmp_path, path, "changes_directory")
    listening(tmp_path)
    wait_for(lambda: scalar(path, "SELECT holder FROM lease"), what="the lease")
    process.send_signal(signal.SIGHUP)
    assert exit_code(process) == 0, log(tmp_path, "run")
    assert lease_released(path)


# --- dev.py passes signals through -----------------------------------------------------------


def _dev_py_ready() -> bool:
    import hashlib

    stamp = ROOT / ".venv" / ".onwatch-installed"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    return stamp.exists() and stamp.read_text() == wanted


@pytest.mark.skipif(not _dev_py_ready(), reason="dev.py's .venv is not installed")
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_dev_py_passes_signals_through_and_exits_with_the_workers_code(tmp_path, how):
    """Ctrl-C at a terminal signals the whole foreground process group; a service manager
    signals the process it started. Either way the worker stops cleanly, releases its lease,
    and dev.py exits with its code (0), no traceback."""
    path = init(tmp_path, lease_ttl=60)
    err = open(tmp_path / "dev.err", "ab")
    try:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "dev.py"), "onwatch", "worker", path]
            + ["--agent", "tests.worker.agents:echo", "--poll", "0.1"],
            cwd=ROOT,
            env=env(tmp_path),
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,  # its own process group, as a terminal's job is
        )
    finally:
        err.close()
    try:
        wait_for(lambda: scalar(path, "SELECT holder FROM lease"), what="the worker's lease")
        if how == "ctrl-c":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGTERM)
        code = exit_code(process)
    finally:
        try:  # nothing of it may outlive the test (before, a SIGTERM left the worker running)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = (tmp_path / "dev.err").read_text()
    assert code == 0, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text
    assert "released" in text and lease_released(path)
