"""Each demo scenario, played headless to its end, leaves the inbox in the figures of
docs/rules.md#the-reference-scenarios.

The demo is a second, visual proof of the rules: these tests read the inbox the scenario
drove (not the narration) and check it shows exactly what the rules do.
"""

from __future__ import annotations

import pytest

from onwatch.tui.demo.scenarios import (
    DAY,
    SCENARIOS,
    START,
    ScenarioRun,
    play,
    scenario,
    since_start,
)


@pytest.fixture
async def played(tmp_path, request):
    run = await play(request.param, tmp_path / "demo.db")
    yield run
    await run.close()


def case(key: str):
    return pytest.mark.parametrize("played", [key], indirect=True)


async def all_events(inbox):
    found = []
    for status in ("pending", "running", "done", "dead", "interrupted", "cancelled"):
        found += await inbox.events(status)
    return sorted(found, key=lambda e: e.id)


def test_twelve_scenarios_in_spec_order():
    assert [s.number for s in SCENARIOS] == list(range(1, 13))
    assert len({s.key for s in SCENARIOS}) == 12
    for item in SCENARIOS:
        assert item.steps and all(step.title for step in item.steps)
        assert -len(item.steps) <= item.moment < len(item.steps)


def test_scenario_lookup_by_key_or_number():
    assert scenario("takeover").number == 4
    assert scenario(4).key == "takeover"
    assert scenario("4").key == "takeover"
    with pytest.raises(KeyError, match="known"):
        scenario("nope")


def test_since_start():
    assert since_start(START) == "t+0s"
    assert since_start(START + 131) == "t+2m11s"
    assert since_start(START + 4 * DAY + 600) == "t+4d00h10m"


@case("webhook-twice")
async def test_1_webhook_delivered_twice(played):
    inbox = played.stage.inbox
    assert played.stage.results["first"] is True
    assert played.stage.results["retry"] is False
    events = await all_events(inbox)
    assert [(e.source, e.source_id) for e in events] == [("github", "delivery-7f3a")]
    assert events[0].status == "done" and events[0].attempts == 1


@case("lease-race")
async def test_2_two_workers_one_instant(played):
    results = played.stage.results
    assert (results["a"], results["b"]) == (1, None)
    assert results["b_later"] is None and results["a_renewed"] == 1
    lease = await played.stage.inbox.lease_info()
    assert (lease.holder, lease.gen) == ("worker-A", 1)
    history = await played.stage.inbox.lease_history()
    assert [(h.gen, h.holder) for h in history] == [(1, "worker-A")]


@case("chat-batch")
async def test_3_three_chat_messages_one_run(played):
    inbox = played.stage.inbox
    claimed = played.stage.results["claimed"]
    events = await all_events(inbox)
    assert len(claimed) == 3 and claimed == [e.id for e in events]
    assert {e.run_id for e in events} == {events[0].run_id}  # one run, all three
    assert all(e.status == "done" and e.attempts == 1 for e in events)
    assert len(await inbox.held_messages()) == 1


@case("takeover")
async def test_4_stall_takeover_late_finish_refused(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["b_early"] is None
    assert results["b_gen"] == 2 and results["b_claimed"] == ["msg-3"]
    assert results["b_finish"] is True
    assert results["a_late_finish"] is False
    event = await inbox.get_event(results["event_id"])
    assert (event.source_id, event.status, event.attempts) == ("msg-3", "done", 2)
    held = await inbox.held_messages()
    assert [m.body for m in held] == ["Done: your 3pm is now at 4pm."]
    lease = await inbox.lease_info()
    assert (lease.holder, lease.gen) == ("worker-A", 3)
    refused = [a for a in await inbox.audit() if not a.applied]
    assert refused[0].action == "refused finish" and refused[0].target == "gen 1"
    # B's takeover at t+10+121 (docs/rules.md#scenario-4-stall-and-takeover).
    takeover = [h for h in await inbox.lease_history() if h.gen == 2][0]
    assert (takeover.holder, takeover.previous_holder, takeover.at) == (
        "worker-B",
        "worker-A",
        START + 10 + 121,
    )


@case("poison")
async def test_5_poison_isolated_and_dead(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["W0_claimed"] == ["mail-poison", "mail-healthy"]
    assert results["W1_claimed"] == ["mail-poison"]
    assert results["W2_claimed"] == ["mail-poison"]
    assert results["W3_claimed"] == ["mail-healthy"]
    assert results["W4_claimed"] == []
    poison, healthy = await all_events(inbox)
    assert (poison.status, poison.attempts) == ("dead", 3)
    assert "too many attempts" in poison.error
    assert (healthy.status, healthy.attempts) == ("done", 2)
    history = await inbox.lease_history()
    assert sorted(h.gen for h in history) == [1, 2, 3, 4, 5]  # each after the last expired


@case("timer-coalesce")
async def test_6_timers_replay_and_outage(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["first_pass"] == 1
    assert results["second_pass"] == 0
    assert results["redeploy_pass"] == 1
    assert results["outage_pass"] == 1
    digests = [e for e in await all_events(inbox) if e.source == "timer"]
    assert len(digests) == 2
    first, newest = digests
    assert first.source_id == f"digest@{START}"
    assert newest.payload["skipped"] == 3
    assert newest.payload["late_by"] == 600
    assert newest.payload["scheduled_for"] == START + 4 * DAY
    [timer] = [t for t in await inbox.timers() if t.id == "digest"]
    assert timer.due - played.stage.now == 85_800 == results["next_due_in"]


@case("approval-expiry")
async def test_7_approvals_standing_answers(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["refund-1_late_yes"] == "expired"
    assert results["refund-2_late_yes"] == "expired"
    assert results["refund-3_yes"] == "yes"
    assert results["refund-3_second_tap"] == "yes"
    assert results["refund-3_after_expiry"] == "yes"
    assert results["unknown"] == "unknown"
    answers = {a.request_id: a.answer for a in await inbox.approvals()}
    assert answers == {"refund-1": "expired", "refund-2": "expired", "refund-3": "yes"}
    # Exactly one resuming event per request, carrying the answer that stands.
    resumed = {
        e.source_id: e.payload["answer"] for e in await all_events(inbox) if e.source == "approval"
    }
    assert resumed == answers
    # The timings: each late answer came at the scenario's offsets from its request
    # (docs/rules.md#scenario-7-approvals).
    assert results["refund-2_at"] - results["refund-1_at"] == 6 * 3600


@case("outbox-pacing")
async def test_8_outbox_two_sends_in_the_hour(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["dispatched"] == [1, 0, 0, 2]
    assert results["sends"] == ["update 0", "update 1\n\nupdate 2"]
    assert played.stage.sent == ["morning briefing", "update 0", "update 1\n\nupdate 2"]
    assert await inbox.held_messages() == []
    deliveries = await inbox.deliveries()
    assert [d.message_count for d in reversed(deliveries)] == [1, 1, 2]
    assert all(d.status == "sent" for d in deliveries)
    sent_at = sorted(d.sent_at for d in deliveries)
    assert [t - sent_at[1] for t in sent_at[1:]] == [0, 61 * 60]  # minute 0, minute 61
    assert sent_at[1] - sent_at[0] == 2 * 3600  # the last send was two hours earlier


@case("restart-before-claim")
async def test_9_restart_before_claim(played):
    inbox, results = played.stage.inbox, played.stage.results
    [event] = await all_events(inbox)
    assert results["claimed"] == [event.id]
    assert results["claimed_again"] == 0
    assert (event.status, event.attempts) == ("done", 1)
    assert len(await inbox.runs(event.id)) == 1


@case("interrupted")
async def test_10_restart_during_run_interrupt(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert inbox.settings.on_lost_claim == "interrupt"
    assert results["restart_claimed"] == 0
    assert results["later_claimed"] == 0
    [event] = await all_events(inbox)
    assert (event.status, event.attempts) == ("done", 1)  # resolved by the operator, ran once
    runs = await inbox.runs(event.id)
    assert [r.outcome for r in runs] == ["lost"]
    resolved = [a for a in await inbox.audit() if a.action == "resolve"]
    assert resolved and resolved[0].before == "interrupted" and resolved[0].applied


async def test_10_interrupted_until_the_operator_resolves(tmp_path):
    """Stop scenario 10 before its last step: the event sits in 'interrupted'."""
    run = await ScenarioRun.open(scenario("interrupted"), tmp_path / "demo.db")
    try:
        while len(run.scenario.steps) - run.position > 1:
            await run.step()
        [event] = await run.stage.inbox.events("interrupted")
        assert "lost its lease" in event.error and event.attempts == 1
        assert (await run.stage.inbox.counts())["pending"] == 0
    finally:
        await run.close()


@case("delivery-failed")
async def test_11_delivery_failed_then_delivered(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["attempts_to_send"] == 1
    assert played.stage.sent == ["You have 3 new mails; none urgent."]
    [event] = await all_events(inbox)
    assert (event.status, event.attempts) == ("done", 1)
    runs = await inbox.runs(event.id)
    assert len(runs) == 1 and runs[0].result == {"summary": "3 new mails, none urgent"}
    [delivery] = await inbox.deliveries()
    assert (delivery.status, delivery.attempts) == ("sent", 2)
    assert await inbox.held_messages() == []


@case("cancel")
async def test_12_cancel_waiting_not_running(played):
    inbox, results = played.stage.inbox, played.stage.results
    assert results["cancel_pending"] is True
    assert results["cancel_running"] is False
    assert results["claimed_after"] == []
    report, waiting = await all_events(inbox)
    assert (report.status, report.attempts) == ("done", 1)
    assert (waiting.status, waiting.attempts) == ("cancelled", 0)
    refusal = [a for a in await inbox.audit() if a.action == "cancel" and not a.applied]
    assert refusal and "running" in refusal[0].reason


@pytest.mark.parametrize("chosen", SCENARIOS, ids=lambda s: s.key)
async def test_every_step_narrates_and_time_never_runs_back(chosen, tmp_path):
    run = await ScenarioRun.open(chosen, tmp_path / "demo.db")
    try:
        times = []
        while not run.finished:
            line = await run.step()
            assert line and "\n" not in line
            times.append(run.stage.now)
        assert times == sorted(times)
        with pytest.raises(IndexError):
            await run.step()
    finally:
        await run.close()


def test_scenarios_load_without_textual():
    """The scenarios drive only the core: tests and scripts play them with no UI loaded."""
    import subprocess
    import sys

    code = (
        "import sys, tui.demo, tui.demo.scenarios; "
        "bad = [m for m in ('textual', 'rich') if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, f"scenarios imported UI modules: {result.stdout} {result.stderr}"


def test_demo_without_a_terminal_narrates_every_scenario(capsys):
    """`onwatch demo` piped or under CI cannot draw the TUI: it plays and prints instead."""
    from onwatch.tui.demo import run

    assert run() == 0  # pytest's stdin is not a terminal
    out = capsys.readouterr().out
    for item in SCENARIOS:
        assert f"{item.number}. {item.title}" in out
    assert "finish returned False" in out  # scenario 4's refused late finish
