"""PostgreSQL under the faults a real deployment has: a process stopped inside a transaction,
a server that stops answering, an answer lost after a COMMIT, many processes opening a new
database at once, passwords in every form the driver takes."""

from __future__ import annotations

import asyncio
import os
import signal
import shutil
import subprocess
import sys

import psycopg
import pytest

from onwatch.core import FakeClock, Inbox, InboxError
from onwatch.core.pg.connect import IDLE_IN_TRANSACTION, STATEMENT_TIMEOUT, connect
from tests.pg.proxy import Proxy
from tests.terminal import Terminal
from tests.waiting import until, until_sync
from tests.worker.helpers import ROOT

pytestmark = pytest.mark.slow
T = 1_000_000


# --- a process stopped inside a write transaction ----------------------------------------

STALLER = """
import asyncio, os, signal, sys
from onwatch.core import FakeClock, Inbox
from onwatch.core.pg import tx as pg_tx

KIND, URL = sys.argv[1], sys.argv[2]
real_run = pg_tx.Tx.run


def stall(self, name, /, **params):
    # The first statement of the transaction under test, after the inbox's row lock: the
    # process stops here, holding the lock, as a paused VM or a cut network would leave it.
    if getattr(pg_tx, "armed", False):
        print("stalled", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return real_run(self, name, **params)


pg_tx.Tx.run = stall


async def main():
    box = await Inbox.open(URL, clock=FakeClock(1_000_000))
    gen = await box.acquire("stalled")
    batch = await box.claim_batch("stalled", gen) if KIND == "finish" else []
    pg_tx.armed = True
    if KIND == "claim":
        await box.claim_batch("stalled", gen)
    elif KIND == "finish":
        await box.finish("stalled", gen, [e.id for e in batch], ["hi"])
    elif KIND == "ingest":
        await box.ingest("chat", "stalled-ingest", {})
    elif KIND == "scheduler":
        await box.run_scheduler()
    elif KIND == "operator":
        await box.pause(actor="ops")


asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["claim", "finish", "ingest", "scheduler", "operator"])
async def test_a_process_stopped_inside_any_write_cannot_wedge_its_inbox(pg, kind):
    url = pg.new_schema()
    async with await Inbox.open(url, clock=FakeClock(T)) as box:
        await box.configure(lease_ttl=60)
        await box.ingest("chat", "m1", {})
        await box.add_timer("due", T - 1, None)
    stalled = subprocess.Popen(
        [sys.executable, "-c", STALLER, kind, url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert stalled.stdout.readline().strip() == "stalled"
        # The stopped process holds the inbox's row lock. The server ends its transaction
        # after IDLE_IN_TRANSACTION seconds, well inside this busy timeout: intake goes on.
        async with await Inbox.open(url, busy_timeout=IDLE_IN_TRANSACTION + 10) as box:
            assert await box.ingest("chat", "after-the-stall", {}) is True
            # Once its lease lapses, another worker takes over and runs what is pending.
            later = T + 61
            gen = await box.acquire("B", now=later)
            assert gen == 2
            batch = await box.claim_batch("B", gen, now=later)
            assert "after-the-stall" in [e.source_id for e in batch] or batch
            assert stalled.poll() is None  # all of it while the staller is still stopped
    finally:
        stalled.send_signal(signal.SIGKILL)
        stalled.wait(10)


# --- a server that stops answering -------------------------------------------------------


def test_every_connection_carries_the_bounds_that_notice_a_silent_server(pg, monkeypatch):
    # Both sides of the socket give up on a peer that stopped answering, and a statement or
    # an idle transaction has a limit on the server; set in one statement at connect, each
    # value a parameter (a quote in one is text, never SQL).
    url = pg.new_database(schema=False)
    sent = []
    execute = psycopg.Connection.execute
    monkeypatch.setattr(
        psycopg.Connection,
        "execute",
        lambda self, q, p=None, **k: sent.append(q) or execute(self, q, p, **k),
    )
    with connect(url, application_name="it's; SELECT 1 --") as conn:
        assert len(sent) == 1  # one round trip for every setting
        shown = conn.execute(
            "SELECT current_setting('statement_timeout'), "
            "current_setting('idle_in_transaction_session_timeout'), "
            "current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'), "
            "current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout'), "
            "current_setting('application_name')"
        ).fetchone()
        # The server shows its TCP settings as 0 on a Unix socket (a server given by URL).
        tcp = not conn.info.host.startswith("/")
    assert shown == (
        f"{STATEMENT_TIMEOUT // 60}min",
        f"{IDLE_IN_TRANSACTION}s",
        *(("10", "5", "3", "30000") if tcp else ("0", "0", "0", "0")),  # the last in ms
        "it's; SELECT 1 --",
    )


async def test_closing_an_inbox_whose_server_stopped_answering_returns(pg, proxy):
    url = proxy.url(pg.new_schema())
    box = await Inbox.open(url)
    await box.counts()
    proxy.blackhole()
    call = asyncio.ensure_future(box.ingest("chat", "into-the-void", {}))
    await asyncio.sleep(0.2)  # the ingest is on its way to the silent server
    call.cancel()  # what a worker's SIGTERM, or q in the desk, does to the call in flight
    # close() cuts the socket of the job still waiting, instead of waiting with it for ever
    await asyncio.wait_for(box.close(), 30)
    proxy.relay()


# --- an answer lost after COMMIT -----------------------------------------------------------


async def test_a_finish_whose_answer_was_lost_is_not_audited_as_a_stale_write(pg, proxy):
    url = proxy.url(pg.new_schema())
    async with await Inbox.open(url, clock=FakeClock(T)) as box:
        await box.ingest("chat", "m1", {})
        gen = await box.acquire("W")
        [event] = await box.claim_batch("W", gen)
        proxy.cut_after_commit()
        with pytest.raises(InboxError, match="lost the connection"):
            await box.finish("W", gen, [event.id], ["hi"], run=event.run_id)
        assert proxy.commits_cut == 1
        # The worker does not know it committed; it finishes again, and is told the truth.
        assert await box.finish("W", gen, [event.id], ["hi"], run=event.run_id) is True
        assert (await box.get_event(event.id)).status == "done"
        assert [m.body for m in await box.held_messages()] == ["hi"]  # once
        assert [a.action for a in await box.audit()] == []
        assert (await box.overview()).refused_writes == 0


# --- many processes opening a brand-new database ------------------------------------------

OPENER = """
import asyncio, sys
from onwatch.core import Inbox

async def main():
    async with await Inbox.open(sys.argv[1], name=sys.argv[2]) as box:
        await box.counts()

asyncio.run(main())
print("opened", flush=True)
"""


def test_many_processes_opening_a_new_database_at_once_all_succeed(pg):
    for trial in range(5):
        url = pg.new_database(schema=False)
        openers = [
            subprocess.Popen(
                [sys.executable, "-c", OPENER, url, f"inbox-{i % 3}"],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(8)
        ]
        for opener in openers:
            out, err = opener.communicate(timeout=60)
            assert opener.returncode == 0 and out.strip() == "opened", (trial, err)
        with psycopg.connect(url) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM inboxes ORDER BY name")]
        assert names == ["inbox-0", "inbox-1", "inbox-2"]


# --- passwords and names in what is shown ---------------------------------------------------

SECRET = "s3cret-Pa55word"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "onwatch", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, **(env or {})),
    )


def with_query_password(url: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}password={SECRET}"


def test_a_password_in_any_form_the_driver_takes_never_reaches_output(pg, tmp_path):
    url = pg.new_database()
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[onwatch]\npassword={SECRET}\n")
    cases = [
        (with_query_password(url), {}),
        (url, {"PGPASSWORD": SECRET}),
        (url, {"PGSERVICEFILE": str(service), "PGSERVICE": "onwatch"}),
    ]
    for target, env in cases:
        for args in (
            ("init", target, "--inbox", "a"),
            ("status", target, "--inbox", "a"),
            ("status", target, "--inbox", "missing"),
            ("ingest", target + "x-not-a-db", "chat", "m1", "{}"),
        ):
            result = run_cli(*args, env=env)
            shown = result.stdout + result.stderr
            assert SECRET not in shown, (args, env, shown)


def test_an_inbox_name_with_control_characters_cannot_forge_log_lines(pg):
    url = pg.new_database()
    name = "evil\nINFO forged line\x1b[2J"
    result = run_cli("init", url, "--inbox", name)
    shown = result.stdout + result.stderr
    assert "\nINFO forged line" not in shown and "\x1b" not in shown, shown


# --- a worker meeting these faults ----------------------------------------------------------


async def test_a_claim_whose_answer_was_lost_is_recovered_at_once(pg, proxy, tmp_path):
    """The claim committed, its answer never came back: the worker cannot know what it
    claimed, so it hands its generation back, and the next generation recovers the events
    and runs them (before: they stayed 'running' for as long as the worker lived)."""
    from onwatch.core.runtime.worker import Worker

    url = proxy.url(pg.new_schema())
    inbox = await Inbox.open(url)
    await inbox.configure(lease_ttl=30)
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    real_claim = inbox.claim_next

    async def claim_cut_once(holder, gen, **kwargs):
        if proxy.commits_cut == 0 and await inbox.counts() != {}:
            if (await inbox.counts())["pending"]:
                proxy.cut_after_commit()  # the next COMMIT on this connection is the claim's
        return await real_claim(holder, gen, **kwargs)

    inbox.claim_next = claim_cut_once  # type: ignore[method-assign]
    worker = Worker(inbox, agent, holder="w", poll_interval=0.05, grace=1)
    task = asyncio.create_task(worker.run())
    try:
        await inbox.ingest("chat", "m1", {})
        for _ in range(400):  # bounded: 20 s
            if ran:
                break
            await asyncio.sleep(0.05)
        assert ran == ["m1"] and proxy.commits_cut == 1
        event = await inbox.get_event(1)
        for _ in range(100):
            event = await inbox.get_event(1)
            if event.status == "done":
                break
            await asyncio.sleep(0.05)
        assert event.status == "done" and event.attempts == 2  # claimed twice, run once
        assert [c.how for c in await inbox.lease_history()] == ["released", "first"]
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        await inbox.close()


async def test_a_finish_that_claimed_and_lost_its_answer_hands_its_generation_back(
    pg, proxy, tmp_path
):
    """The finish of run 1 also claimed run 2 in its transaction, which committed, and its
    answer never came back: the worker cannot know it claimed m2, so once the finish is
    confirmed (the same finish again is answered as done) it hands its generation back,
    and the next generation recovers m2 and runs it, instead of leaving it 'running' under
    a generation no claim of its own recovers."""
    from onwatch.core.runtime.worker import Worker

    url = proxy.url(pg.new_schema())
    inbox = await Inbox.open(url)
    await inbox.configure(lease_ttl=30, max_batch=1)
    ran: list[str] = []

    async def agent(batch, ctx) -> None:
        ran.extend(e.source_id for e in batch)

    real = inbox.finish_and_claim

    async def cut_once(*args, **kwargs):
        if proxy.commits_cut == 0:
            proxy.cut_after_commit()  # the next COMMIT on this connection is this one's
        return await real(*args, **kwargs)

    inbox.finish_and_claim = cut_once  # type: ignore[method-assign]
    await inbox.ingest_batch([("chat", "m1", {}), ("chat", "m2", {})])
    worker = Worker(inbox, agent, holder="w", poll_interval=0.05, grace=1)
    task = asyncio.create_task(worker.run())
    try:
        await until(lambda: ran == ["m1", "m2"], what="m2 recovered and run", timeout=20)
        assert proxy.commits_cut == 1

        async def m2_done() -> bool:
            return (await inbox.get_event(2)).status == "done"

        await until(m2_done, what="m2 done", timeout=20)
        m1, m2 = await inbox.get_event(1), await inbox.get_event(2)
        assert (m1.status, m1.attempts) == ("done", 1)
        assert (m2.status, m2.attempts) == ("done", 2)  # claimed twice, run once
        assert [c.how for c in await inbox.lease_history()][:2] == ["released", "first"]
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 30)
        await inbox.close()


WORKER_LOG = "worker.err"


def start_worker_on(url: str, tmp_path) -> subprocess.Popen:
    err = open(tmp_path / WORKER_LOG, "ab")
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "onwatch", "worker", url, "--agent", "tests.worker.agents:echo"]
            + ["--poll", "0.1", "--grace", "1", "--log-level", "info"],
            cwd=ROOT,
            env=dict(os.environ, ONWATCH_TEST_DIR=str(tmp_path), PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    finally:
        err.close()


def wait_until(check, what: str, timeout: float = 30) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigterm_stops_a_worker_whose_server_stopped_answering(pg, proxy, tmp_path):
    url = proxy.url(pg.new_schema())
    asyncio.run(_make(url))
    worker = start_worker_on(url, tmp_path)
    log = tmp_path / WORKER_LOG
    try:
        wait_until(lambda: log.exists() and "lease acquired" in log.read_text(), "the lease")
        proxy.blackhole()
        worker.send_signal(signal.SIGTERM)
        # --grace 1: it stops within 2 × grace + the slack, whatever the server does
        assert worker.wait(60) == 0, log.read_text()
    finally:
        proxy.relay()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert "Traceback" not in log.read_text()


def test_a_worker_waits_out_a_server_outage_without_spinning(pg, proxy, tmp_path):
    """Server unreachable for a while: the worker backs off and says so once (and once a
    minute), then carries on when the server is back."""
    url = proxy.url(pg.new_schema())
    asyncio.run(_make(url))
    worker = start_worker_on(url, tmp_path)
    log = tmp_path / WORKER_LOG
    try:
        wait_until(lambda: log.exists() and "lease acquired" in log.read_text(), "the lease")
        before = len(log.read_text().splitlines())
        proxy.refuse()
        import time

        time.sleep(5)  # the outage being watched (its log is counted, not its duration)
        during = [line for line in log.read_text().splitlines()[before:] if line[:1].isdigit()]
        proxy.relay()
        asyncio.run(_ingest(url, "after-the-outage"))
        wait_until(lambda: "run" in log.read_text().split("after", 1)[-1], "a run", 60)
    finally:
        proxy.relay()
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    print(f"\n{len(during)} log lines in a 5 s outage:\n" + "\n".join(during[:10]))
    assert len(during) <= 8, during  # log records; was tens of thousands


def test_a_worker_started_while_its_server_is_down_waits_for_it(pg, proxy, tmp_path):
    """A worker that starts before its database answers (a machine booting faster than the
    database, a server restarting, a failover under way) exited 1 at once: restarted every
    2 s by its unit, it used up the start limit in half a minute and stayed stopped. It
    now waits, saying so once, and serves when the server answers; a stop meanwhile is a
    clean exit."""
    direct = pg.new_schema()
    asyncio.run(_make(direct))
    asyncio.run(_ingest(direct, "waiting"))
    url = proxy.url(direct)
    proxy.refuse()
    worker = start_worker_on(url, tmp_path)
    log = tmp_path / WORKER_LOG
    try:
        wait_until(lambda: log.exists() and "waiting for it" in log.read_text(), "the wait")
        assert worker.poll() is None, log.read_text()
        assert "the server does not answer" in log.read_text()
        proxy.relay()
        wait_until(lambda: _done(direct), "the run", 60)
        assert "answers after" in log.read_text()
    finally:
        proxy.relay()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log.read_text()
    text = log.read_text()
    assert text.count("waiting for it") == 1 and "Traceback" not in text, text

    proxy.refuse()
    stopped = start_worker_on(url, tmp_path)
    try:
        wait_until(lambda: log.read_text().count("waiting for it") == 2, "the second wait")
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(60) == 0, log.read_text()  # asked to stop while waiting
    finally:
        proxy.relay()
        if stopped.poll() is None:
            stopped.kill()
            stopped.wait()


def test_a_worker_started_while_its_role_is_at_its_connection_limit_waits(pg, tmp_path):
    """ "too many connections for role" (a fleet scaled past max_connections, or a role's
    limit) is a server that answers a ping: it was read as a refusal for good, and the
    worker exited 1 at its start. It is a limit that frees up: waited for, saying why."""
    url = pg.new_database(schema=False)
    asyncio.run(_make(url))
    asyncio.run(_ingest(url, "capped"))
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "DO $$ BEGIN CREATE ROLE onwatch_capped LOGIN CONNECTION LIMIT 1; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        admin.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO onwatch_capped")
        admin.execute("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO onwatch_capped")
    capped = url.replace("postgres@", "onwatch_capped@", 1)
    holding = psycopg.connect(capped)  # the role's one connection, taken
    worker = start_worker_on(capped, tmp_path)
    log = tmp_path / WORKER_LOG
    try:
        wait_until(lambda: log.exists() and "waiting for it" in log.read_text(), "the wait")
        assert "at a connection limit" in log.read_text()
        assert worker.poll() is None, log.read_text()
        holding.close()
        wait_until(lambda: _done(url), "the run", 60)
    finally:
        holding.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(60) == 0, log.read_text()


def test_a_server_that_answers_and_refuses_is_not_waited_for(pg, tmp_path):
    """A server that answers but refuses this database (or role, or password) will not
    change its mind: the worker and the receiver still stop at once, saying why."""
    missing = pg.new_schema().rsplit("/", 1)[0] + "/no_such_database"
    worker = start_worker_on(missing, tmp_path)
    assert worker.wait(60) == 1
    assert "cannot connect to" in (tmp_path / WORKER_LOG).read_text()
    served = subprocess.run(
        [sys.executable, "-m", "onwatch", "serve", missing, "--port", "0"],
        cwd=ROOT,
        env=dict(os.environ, ONWATCH_GITHUB_SECRET="s3cret", PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 1 and "cannot connect to" in served.stderr, served.stderr


def test_a_receiver_started_while_its_server_is_down_waits_for_it(pg, proxy, tmp_path):
    direct = pg.new_schema()
    asyncio.run(_make(direct))
    serve = ["serve", proxy.url(direct), "--port", "0"]
    _waits_for_its_server(proxy, serve, tmp_path / "serve.err", "listening on")


@pytest.mark.parametrize("watching", [("--inbox", "default"), ()], ids=["inbox", "database"])
def test_a_notifier_started_while_its_server_is_down_waits_for_it(pg, proxy, tmp_path, watching):
    """`onwatch notify URL`, a service of its own, the same way: watching one inbox of the
    database, or every inbox of it."""
    direct = pg.new_schema()
    asyncio.run(_make(direct))
    notify = ["notify", proxy.url(direct), *watching, "--command", "true"]
    notify += ["--state", str(tmp_path / "state.db"), "--poll", "0.2"]
    _waits_for_its_server(proxy, notify, tmp_path / "notify.err", "notify: watching")


def _waits_for_its_server(proxy: Proxy, command: list[str], log, ready: str) -> None:
    """`onwatch COMMAND`, a service, started while the server behind `proxy` turns every
    connection away: it waits, saying so (it exited 1 at once); once the server answers it
    gets going (`ready` in its log); a SIGTERM then ends it cleanly."""
    proxy.refuse()
    with open(log, "ab") as err:
        service = subprocess.Popen(
            [sys.executable, "-m", "onwatch", *command],
            cwd=ROOT,
            env=dict(os.environ, ONWATCH_GITHUB_SECRET="s3cret", PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        wait_until(lambda: "waiting for it" in log.read_text(), "the wait")
        assert service.poll() is None, log.read_text()
        proxy.relay()
        wait_until(lambda: ready in log.read_text(), ready, 60)
    finally:
        proxy.relay()
        service.send_signal(signal.SIGTERM)
        assert service.wait(60) == 0, log.read_text()


def _done(url: str) -> bool:
    async def done() -> bool:
        async with await Inbox.open(url) as box:
            return (await box.counts()).get("done", 0) == 1

    return asyncio.run(done())


async def _make(url: str) -> None:
    async with await Inbox.open(url) as box:
        await box.configure(lease_ttl=10)


async def _ingest(url: str, key: str) -> None:
    async with await Inbox.open(url) as box:
        await box.ingest("chat", key, {})


def test_q_quits_the_desk_whose_server_stopped_answering(pg, proxy, tmp_path):
    """`q` in `onwatch tui postgresql://… --inbox NAME` quits, exit 0, while the server
    accepts the connection but answers nothing: the desk's close cuts the socket of the read
    still waiting instead of waiting with it."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: the desk needs a real terminal")
    url = proxy.url(pg.new_schema())
    asyncio.run(_ingest(url, "still-here"))
    terminal = Terminal(str(tmp_path), {**os.environ, "TERM": "xterm-256color"}, (120, 40))
    exit_file = str(tmp_path / "desk.exit")
    try:
        terminal.start(f"{sys.executable} -m onwatch tui '{url}' --inbox default", exit_file)
        until_sync(lambda: "still-here" in terminal.screen(), timeout=60, what="the desk")
        proxy.blackhole()  # every byte from now on goes nowhere, both ways
        # The desk's next poll is a read that will never be answered.
        until_sync(lambda: proxy.held > 0, timeout=30, what="a read sent to the silent server")
        terminal.keys("q")
        until_sync(lambda: os.path.exists(exit_file), timeout=60, what="the desk to quit")
        assert open(exit_file).read().strip() == "0", terminal.screen()
    finally:
        proxy.relay()
        terminal.close()


async def _ingest(url: str, source_id: str) -> None:
    async with await Inbox.open(url) as box:
        await box.ingest("chat", source_id, {})
