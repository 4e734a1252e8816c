"""The run's transcript and its spend in the engine, on both backends: bounded per run (its
beginning and its end kept, the rest counted), a batch sent twice stored once, pruned with the
payloads; spend adding up across retries and days; max_spend_per_day delaying claims until
the window frees or an operator raises it (conditional, audited); bad input refused with
nothing written."""

from __future__ import annotations

import json

import pytest

from onwatch.core import BadInput, FakeClock, Inbox
from onwatch.core.engine.transcripts import LINE_WEIGHT

pytestmark = pytest.mark.backends

T = 1_000_000
DAY = 86_400


async def claimed(inbox: Inbox, source_id: str = "m-1"):
    """A claimed event of a fresh inbox (ingested, lease taken)."""
    await inbox.ingest("chat", source_id, {"text": source_id})
    gen = await inbox.acquire("w")
    [event] = await inbox.claim_batch("w", gen)
    return gen, event


def lines(first: int, count: int, width: int = 1000):
    return [
        (i, T, "log", None, f"{i:05d} " + "x" * (width - 6), None)
        for i in range(first, first + count)
    ]


async def test_a_million_character_transcript_keeps_its_beginning_and_end(inbox_target):
    async with await Inbox.open(inbox_target, clock=FakeClock(T)) as inbox:
        await inbox.configure(max_transcript_chars=100_000)
        _, event = await claimed(inbox)
        for start in range(0, 1000, 50):  # 1,000 lines of 1,000 characters, 50 at a time
            await inbox.append_transcript(event.run_id, lines(start, 50))
        whole = await inbox.transcript(event.run_id, limit=10_000)
        kept = [line.seq for line in whole.lines]
        size = 1000 + LINE_WEIGHT
        head, tail = 25_000 // size, 75_000 // size  # a quarter of the budget, and the rest
        assert kept == list(range(head)) + list(range(1000 - tail, 1000))
        assert whole.logged == 1000 and whole.head_lines == head
        assert whole.dropped == 1000 - head - tail == whole.logged - whole.stored
        assert whole.dropped_chars == whole.dropped * size
        assert sum(len(line.text) + LINE_WEIGHT for line in whole.lines) <= 100_000
        newest = await inbox.transcript(event.run_id, newest=True, limit=3)
        assert [line.seq for line in newest.lines] == [997, 998, 999]
        after = await inbox.transcript(event.run_id, after=head - 2, limit=3)
        assert [line.seq for line in after.lines] == [head - 1, 1000 - tail, 1001 - tail]
        assert await inbox.transcript_last(event.run_id) == 999


async def test_lines_the_writer_left_out_are_counted_and_a_batch_sent_twice_is_stored_once(
    inbox_target,
):
    async with await Inbox.open(inbox_target, clock=FakeClock(T)) as inbox:
        _, event = await claimed(inbox)
        batch = [
            (0, T, "log", None, "first", json.dumps({"k": 1})),
            (3, T, "info", "lib", "fourth", None),
        ]
        spends = [(1, T, "usd", 250_000, "model")]
        assert (
            await inbox.append_transcript(
                event.run_id, batch, upto=5, dropped_chars=40, spends=spends
            )
            == 2
        )
        # The same batch again (its first commit's answer lost): nothing changes.
        assert (
            await inbox.append_transcript(
                event.run_id, batch, upto=5, dropped_chars=40, spends=spends
            )
            == 0
        )
        transcript = await inbox.transcript(event.run_id)
        assert [(x.seq, x.level, x.logger, x.text, x.fields) for x in transcript.lines] == [
            (0, "log", None, "first", {"k": 1}),
            (3, "info", "lib", "fourth", None),
        ]
        assert (transcript.logged, transcript.dropped, transcript.dropped_chars) == (5, 3, 40)
        [spent] = await inbox.run_spend([event.run_id])
        assert (spent.unit, spent.micros, spent.amount) == ("usd", 250_000, 0.25)
        assert await inbox.append_transcript(999_999, batch) == -1  # no such run: nothing kept


async def test_bad_lines_and_spends_are_refused_and_nothing_is_written(inbox_target):
    async with await Inbox.open(inbox_target, clock=FakeClock(T)) as inbox:
        _, event = await claimed(inbox)
        good = (0, T, "log", None, "fine", None)
        for bad in [
            [(0, T, "shout", None, "x", None)],  # no such level
            [(0, T, "log", None, "nul \x00", None)],
            [(0, T, "log", None, "lone \ud800", None)],
            [(0, T, "log", None, "x", "[1, 2]")],  # fields are an object
            [(0, 1.5, "log", None, "x", None)],  # time not an int
            [(1, T, "log", None, "a", None), (0, T, "log", None, "b", None)],  # out of order
            [(0, T, "log", "", "x", None)],  # an empty logger name
            [good, "not a tuple"],
        ]:
            with pytest.raises(BadInput):
                await inbox.append_transcript(event.run_id, bad)
        for spend in [(0, T, "USD", 1, None), (0, T, "usd", -1, None), (0, T, "u s d", 1, None)]:
            with pytest.raises(BadInput):
                await inbox.append_transcript(event.run_id, [good], spends=[spend])
        with pytest.raises(BadInput):
            await inbox.append_transcript(event.run_id, [good], upto=0)
        assert (await inbox.transcript(event.run_id)).logged == 0
        assert await inbox.run_spend([event.run_id]) == []
        for changes in [
            {"max_spend_per_day": {"usd": -1}},
            {"max_spend_per_day": {"usd": float("nan")}},
            {"max_spend_per_day": {"US D": 5}},
            {"max_spend_per_day": {"USD": 5}},
            {"max_spend_per_day": [5]},
            {"max_spend_per_day": {"usd": 0}},
            {"max_transcript_chars": -1},
            {"max_transcript_chars": True},
        ]:
            with pytest.raises(BadInput):
                await inbox.configure(**changes)
        assert inbox.settings.max_spend_per_day == {}


async def test_transcripts_are_pruned_with_the_payloads_and_what_was_spent_stays(inbox_target):
    clock = FakeClock(T)
    async with await Inbox.open(inbox_target, clock=clock) as inbox:
        gen, done = await claimed(inbox, "done-1")
        await inbox.append_transcript(done.run_id, lines(0, 3, 20), spends=[(0, T, "usd", 5, None)])
        assert await inbox.finish("w", gen, [done.id], run=done.run_id)
        await inbox.ingest("chat", "dead-1", {})
        [dead] = await inbox.claim_batch("w", gen)
        await inbox.append_transcript(dead.run_id, lines(0, 2, 20))
        await inbox.configure(max_attempts=1)
        assert await inbox.finish("w", gen, [dead.id], error="boom", run=dead.run_id)
        clock.advance(10)
        assert await inbox.prune_payloads(T + 5) == 1  # the done event only
        pruned = await inbox.transcript(done.run_id)
        assert pruned.pruned and pruned.lines == () and pruned.logged == 3
        kept = await inbox.transcript(dead.run_id)  # dead events keep payload and lines
        assert not kept.pruned and len(kept.lines) == 2
        assert [s.micros for s in await inbox.run_spend([done.run_id])] == [5]
        assert (await inbox.spending()).total == {"usd": 5}


async def test_spend_adds_up_across_retries_and_days(inbox_target):
    clock = FakeClock(T - T % DAY + 3600)  # 01:00 UTC: each retry a day later, a new UTC day
    async with await Inbox.open(inbox_target, clock=clock) as inbox:
        await inbox.configure(backoff_base=1, max_attempts=3)
        gen, event = await claimed(inbox)
        runs = []
        for attempt in (1, 2, 3):
            if attempt > 1:
                clock.advance(DAY)
                gen = await inbox.acquire("w")
                [event] = await inbox.claim_batch("w", gen)
            runs.append(event.run_id)
            spend = [
                (0, clock.now(), "usd", 500_000, f"attempt {attempt}"),
                (1, clock.now(), "tokens", 1_000_000 * 800, None),
            ]
            await inbox.append_transcript(event.run_id, [], upto=2, spends=spend)
            error = None if attempt == 3 else f"attempt {attempt} failed"
            assert await inbox.finish("w", gen, [event.id], error=error, run=event.run_id)
        per_run = await inbox.run_spend(runs)
        assert [(s.run_id, s.unit, s.amount) for s in per_run if s.unit == "usd"] == [
            (run, "usd", 0.5) for run in runs
        ]
        assert sum(s.micros for s in per_run if s.unit == "usd") == 1_500_000
        spending = await inbox.spending(days=4)
        assert spending.per_day["usd"] == (0, 500_000, 500_000, 500_000)
        assert spending.per_day["tokens"] == (0, 800_000_000, 800_000_000, 800_000_000)
        assert spending.last_day == {"usd": 500_000, "tokens": 800_000_000}
        assert spending.total == {"usd": 1_500_000, "tokens": 2_400_000_000}
        assert spending.units == ["tokens", "usd"]  # no budget: by name


async def test_a_spend_budget_delays_runs_until_the_window_frees_or_it_is_raised(inbox_target):
    clock = FakeClock(T)
    async with await Inbox.open(inbox_target, clock=clock) as inbox:
        await inbox.configure(max_spend_per_day={"usd": 1})
        gen, first = await claimed(inbox, "m-1")
        await inbox.append_transcript(
            first.run_id, [], upto=1, spends=[(0, T, "usd", 600_000, None)]
        )
        clock.advance(60)
        await inbox.append_transcript(
            first.run_id, [], upto=2, spends=[(1, T + 60, "usd", 400_000, None)]
        )
        assert await inbox.finish("w", gen, [first.id], run=first.run_id)
        await inbox.ingest("chat", "m-2", {})
        clock.advance(60)
        assert await inbox.claim_batch("w", gen) == []  # 1 usd spent in the last 24 h
        view = await inbox.overview()
        assert view.budgets["max_spend_per_day"] == {
            "limit": {"usd": 1.0},
            "used": {"usd": 1.0},
            "excess": "delayed",
        }
        # The worker sleeps until the window has let go of enough: the 0.6 spent first.
        assert await inbox.next_wake() == T + DAY
        clock.set(T + DAY)  # the 0.6 at T is out of the window (after T + DAY - DAY), 0.4 left
        gen = await inbox.acquire("w")
        [second] = await inbox.claim_batch("w", gen)
        assert second.source_id == "m-2"
        await inbox.append_transcript(
            second.run_id, [], upto=1, spends=[(0, T + DAY, "usd", 600_000, None)]
        )
        assert await inbox.finish("w", gen, [second.id], run=second.run_id)
        await inbox.ingest("chat", "m-3", {})
        assert await inbox.claim_batch("w", gen) == []
        # An operator raises it: refused when it changed meanwhile or would not raise it …
        stale = await inbox.raise_budget("max_spend_per_day", 3, unit="usd", expect=2, actor="ana")
        assert not stale and "changed meanwhile" in stale.reason
        lower = await inbox.raise_budget("max_spend_per_day", 0.5, unit="usd", actor="ana")
        assert not lower and "would not raise it" in lower.reason
        assert await inbox.claim_batch("w", gen) == []
        # … and applied, audited, when it does: the delayed event runs at once.
        raised = await inbox.raise_budget(
            "max_spend_per_day", 2.5, unit="usd", expect=1, actor="ana", reason="launch"
        )
        assert (raised.applied, raised.before, raised.after) == (True, "1 usd", "2.5 usd")
        assert inbox.settings.max_spend_per_day == {"usd": 2.5}
        [third] = await inbox.claim_batch("w", gen)
        assert third.source_id == "m-3"
        entries = await inbox.audit(target="max_spend_per_day usd")
        assert [(e.action, e.applied, e.before, e.after, e.actor) for e in entries] == [
            ("raise_budget", True, "1 usd", "2.5 usd", "ana"),
            ("raise_budget", False, "1 usd", "1 usd", "ana"),
            ("raise_budget", False, "1 usd", "1 usd", "ana"),
        ]
        assert entries[0].reason == "launch"
        # Not set: nothing to raise. A bad budget name or value: BadInput, nothing written.
        unset = await inbox.raise_budget("max_spend_per_day", 5, unit="eur")
        assert not unset and "not set" in unset.reason
        for name, value, unit in [
            ("max_pending", 5, None),
            ("max_spend_per_day", 5, None),
            ("max_spend_per_day", "5", "usd"),
            ("max_runs_per_day", 1.5, None),
        ]:
            with pytest.raises(BadInput):
                await inbox.raise_budget(name, value, unit=unit)


async def test_runs_per_day_is_raised_the_same_way(inbox_target):
    async with await Inbox.open(inbox_target, clock=FakeClock(T)) as inbox:
        await inbox.configure(max_runs_per_day=1)
        gen, event = await claimed(inbox)
        assert await inbox.finish("w", gen, [event.id], run=event.run_id)
        await inbox.ingest("chat", "m-2", {})
        assert await inbox.claim_batch("w", gen) == []
        outcome = await inbox.act("raise_budget", "max_runs_per_day", value=2, expect=1)
        assert (outcome.applied, outcome.before, outcome.after) == (True, "1 runs", "2 runs")
        assert len(await inbox.claim_batch("w", gen)) == 1


async def test_dead_events_are_found_by_when_they_died(inbox_target):
    clock = FakeClock(T)
    async with await Inbox.open(inbox_target, clock=clock) as inbox:
        await inbox.configure(max_attempts=1)
        gen, first = await claimed(inbox, "a")
        assert await inbox.finish("w", gen, [first.id], error="boom", run=first.run_id)
        clock.advance(100)
        await inbox.ingest("chat", "b", {})
        [second] = await inbox.claim_batch("w", gen)
        assert await inbox.finish("w", gen, [second.id], error="bang", run=second.run_id)
        assert [e.source_id for e in await inbox.died_since(T)] == ["a", "b"]
        assert [e.source_id for e in await inbox.died_since(T + 1)] == ["b"]
        assert (await inbox.died_since(T))[0].payload is None  # no payloads in this list
        assert await inbox.work_since() is None
        await inbox.ingest("chat", "c", {})
        assert await inbox.work_since() == T + 100
