"""The transcript and spend through real worker processes: a million-character run stays
bounded; spend adds up across the retries of an event (on a file and on PostgreSQL); the
spend budget delays runs until an operator raises it from the command line; an isolated
agent's lines and spends reach the worker's transcript; logging records of the run, and of
the threads it starts, are the run's and nobody else's."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from onwatch.core import FakeClock, Inbox
from onwatch.core.runtime.worker import run_worker

from tests.worker.helpers import onwatch, query, stop

from .helpers import log_of, start_worker, wait_for


def _status(path: str, event_id: int = 1) -> str | None:
    rows = query(path, "SELECT status FROM events WHERE id = ?", (event_id,))
    return rows[0][0] if rows else None


async def test_a_million_character_run_is_bounded(tmp_path):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_transcript_chars=50_000)
        await inbox.ingest("chat", "long", {})
    worker = start_worker(path, "chatty", tmp_path)
    try:
        wait_for(lambda: _status(path) == "done", timeout=60, what="the long run to finish")
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
    async with await Inbox.open(path, create=False) as inbox:
        [run] = await inbox.runs(1)
        whole = await inbox.transcript(run.id, limit=10_000)
    assert whole.logged == 1000
    assert whole.lines[0].text.startswith("0000 ") and whole.lines[-1].text.startswith("0999 ")
    assert sum(len(line.text) + 64 for line in whole.lines) <= 50_000
    assert whole.dropped == 1000 - len(whole.lines) > 900
    [(stored,)] = query(path, "SELECT total(length(text)) FROM transcript_lines")
    assert stored < 50_000  # a million characters logged, under 50,000 kept


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_spend_adds_up_across_the_retries_of_an_event(tmp_path, backend):
    if backend == "sqlite":
        target = str(tmp_path / "inbox.db")
    else:
        from tests.pg.server import cluster_or_skip

        target = cluster_or_skip().new_schema()
    async with await Inbox.open(target) as inbox:
        await inbox.configure(backoff_base=1, max_attempts=3)
        await inbox.ingest("chat", "pay", {})
    worker = start_worker(target, "spender", tmp_path)
    try:
        async with await Inbox.open(target, create=False) as inbox:
            for _ in range(300):
                event = await inbox.get_event(1)
                if event.status == "done":
                    break
                await asyncio.sleep(0.1)
            assert event.status == "done", log_of(tmp_path)
            runs = await inbox.runs(1)
            assert [r.outcome for r in runs] == ["error", "error", "done"]
            spent = await inbox.run_spend([r.id for r in runs])
            assert [(s.run_id, s.amount, s.unit) for s in spent] == [
                (r.id, 0.5, "usd") for r in runs
            ]
            spending = await inbox.spending(days=1)
            assert spending.last_day == spending.total == {"usd": 1_500_000}
            # each attempt's transcript says what it spent, beside its failure
            for attempt, run in enumerate(runs, 1):
                [line] = (await inbox.transcript(run.id)).lines
                assert (line.level, line.text) == ("spend", f"spent 0.5 usd: attempt {attempt}")
    finally:
        assert stop(worker) == 0, log_of(tmp_path)


async def test_the_spend_budget_holds_runs_back_until_raised_from_the_command_line(tmp_path):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as inbox:
        await inbox.configure(max_spend_per_day={"usd": 1}, max_attempts=1, max_batch=1)
        for n in (1, 2, 3):
            await inbox.ingest("chat", f"m-{n}", {})
    # `spender` spends 0.5 and fails below its third attempt: with max_attempts 1 each
    # event runs once (and dies), having spent.
    worker = start_worker(path, "spender", tmp_path)
    try:
        wait_for(
            lambda: (
                query(path, "SELECT count(*) FROM runs") == [(2,)] and _status(path, 2) == "dead"
            ),
            what="two runs, 1 usd spent",
        )
        wait_for(lambda: query(path, "SELECT count(*) FROM runs") == [(2,)])
        assert _status(path, 3) == "pending"  # held back: the budget is reached
        status = onwatch("status", path, test_dir=tmp_path)
        assert "REACHED: runs wait" in status.stdout, status.stdout
        refused = onwatch(
            "raise-budget",
            path,
            "max_spend_per_day",
            "--unit",
            "usd",
            "--to",
            "2",
            "--expect",
            "5",
            test_dir=tmp_path,
        )
        assert refused.returncode == 1 and "changed meanwhile" in refused.stderr
        assert _status(path, 3) == "pending"
        raised = onwatch(
            "raise-budget",
            path,
            "max_spend_per_day",
            "--unit",
            "usd",
            "--to",
            "2",
            "--actor",
            "ana",
            "--reason",
            "worth it",
            test_dir=tmp_path,
        )
        assert raised.returncode == 0, raised.stderr
        assert raised.stdout.strip() == "raised max_spend_per_day usd: 1 usd → 2 usd"
        # The worker was asleep until the window would free (a day): the raise woke it.
        wait_for(lambda: _status(path, 3) in ("done", "dead"), what="the held-back run")
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
    [(actor, before, after, applied)] = query(
        path,
        "SELECT actor, before, after, applied FROM audit WHERE action = 'raise_budget' "
        "AND applied = 1",
    )
    assert (actor, before, after) == ("ana", "1 usd", "2 usd")


async def test_an_isolated_agents_lines_and_spend_reach_the_transcript(tmp_path):
    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path) as inbox:
        await inbox.ingest("chat", "m-1", {})
    for n, step in enumerate(
        (
            "log from the child",
            "logging from the child",
            "thread from the child's thread",
            "spend 0.75",
            "end",
        ),
        1,
    ):
        (tmp_path / f"say-{n}").write_text(step)
    worker = start_worker(path, "plain_talker", tmp_path, "--isolate")
    try:
        wait_for(lambda: _status(path) == "done", timeout=30, what="the isolated run")
    finally:
        assert stop(worker) == 0, log_of(tmp_path)
    async with await Inbox.open(path, create=False) as inbox:
        [run] = await inbox.runs(1)
        lines = (await inbox.transcript(run.id)).lines
        assert [(x.level, x.logger, x.text) for x in lines] == [
            ("log", None, "from the child"),
            ("warning", "agent.talker", "from the child"),
            ("warning", "agent.talker", "from the child's thread"),
            ("spend", None, "spent 0.75 usd: step 4"),
        ]
        assert lines[0].fields == {"step": 1}
        assert [(s.amount, s.unit) for s in await inbox.run_spend([run.id])] == [(0.75, "usd")]


async def test_logging_belongs_to_the_run_whose_code_emits_it(tmp_path):
    """In-process: a record from the run's task, its plain-def thread and a thread started
    through ctx.thread is the run's; one from a thread started plainly, and the worker's own
    lines, are not; a record with a traceback keeps it."""
    log = logging.getLogger("agent.in_process")
    log.setLevel(logging.INFO)
    done = threading.Event()

    def outsider() -> None:
        log.warning("not the run's")
        done.set()

    def agent(batch, ctx) -> None:
        log.info("from the agent's thread")
        ctx.thread(log.warning, "from ctx.thread").join()
        threading.Thread(target=outsider).start()
        done.wait(5)
        try:
            raise ValueError("kept with its traceback")
        except ValueError:
            log.exception("it failed")
        ctx.wrap(log.info)("from a wrapped call")

    path = str(tmp_path / "inbox.db")
    async with await Inbox.open(path, clock=FakeClock(1_000)) as inbox:
        await inbox.ingest("chat", "m-1", {})
        await run_worker(inbox, agent, max_runs=1, poll_interval=0.05)
        [run] = await inbox.runs(1)
        lines = (await inbox.transcript(run.id)).lines
    texts = [line.text.splitlines()[0] for line in lines]
    assert texts == [
        "from the agent's thread",
        "from ctx.thread",
        "it failed",
        "from a wrapped call",
    ]
    assert "ValueError: kept with its traceback" in lines[2].text
    assert {line.logger for line in lines} == {"agent.in_process"}
