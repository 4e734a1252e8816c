"""core.metrics on an inbox with a fake clock: every figure read back with the client
library's parser equals what the inbox API says."""

from __future__ import annotations

import pytest

from onwatch.core import Inbox
from onwatch.core.clock import FakeClock
from onwatch.core.metrics import MAX_SOURCES, InboxMetrics, SourceLabels, inbox_label

from .helpers import samples, value

T = 1_000_000


@pytest.fixture
async def inbox(tmp_path):
    clock = FakeClock(T)
    inbox = await Inbox.open(tmp_path / "alice.db", clock=clock)
    yield inbox, clock
    await inbox.close()


async def render(metrics: InboxMetrics) -> dict:
    body, content_type = await metrics.render()
    assert content_type.startswith("text/plain")
    return samples(body.decode())


async def test_state_figures_equal_the_inbox_api(inbox):
    inbox, clock = inbox
    for n in range(4):
        await inbox.ingest("chat", f"m{n}", {"text": "hi"})
    gen = await inbox.acquire("w1")
    batch = await inbox.claim_batch("w1", gen)
    await inbox.finish("w1", gen, [batch[0].id], messages=["one", "two"])
    await inbox.request_approval("refund-1", 3600, "refund 40")
    await inbox.request_approval("refund-2", 600, "refund 5")
    await inbox.add_timer("digest", T + 900, {"kind": "digest"})
    clock.advance(100)
    assert await inbox.finish("w0", 99, [batch[1].id]) is False  # a refused stale write
    metrics = InboxMetrics(inbox, process=False)
    found = await render(metrics)
    counts = await inbox.counts()
    for state, number in counts.items():
        assert value(found, "onwatch_events", inbox="alice", state=state) == number
    view = await inbox.overview()
    assert value(found, "onwatch_inbox_readable", inbox="alice") == 1
    assert value(found, "onwatch_approvals_waiting", inbox="alice") == 2
    assert value(found, "onwatch_approval_soonest_deadline_seconds", inbox="alice") == 500
    lease = await inbox.lease_info()
    assert value(found, "onwatch_lease_generation", inbox="alice") == lease.gen == gen
    assert value(found, "onwatch_lease_expiry_seconds", inbox="alice") == lease.until - (T + 100)
    assert value(found, "onwatch_lease_ttl_seconds", inbox="alice") == 120
    assert value(found, "onwatch_outbox_held_messages", inbox="alice") == view.held_messages
    assert view.held_messages == 2
    assert value(found, "onwatch_outbox_next_send_seconds", inbox="alice") == view.next_send_at - (
        T + 100
    )
    assert value(found, "onwatch_next_timer_seconds", inbox="alice") == 500  # the approval's
    assert (
        value(found, "onwatch_stale_writes_refused_total", inbox="alice")
        == view.refused_writes
        >= 1
    )
    assert value(found, "onwatch_paused", inbox="alice") == 0
    assert value(found, "onwatch_cleanup_held_back", inbox="alice") == 0
    clock.advance(1000)  # past refund-2's deadline: overdue is negative, the lease expired
    found = await render(metrics)
    assert value(found, "onwatch_approval_soonest_deadline_seconds", inbox="alice") == -500
    assert value(found, "onwatch_lease_expiry_seconds", inbox="alice") < -120


async def test_empty_inbox_leaves_out_what_does_not_exist(inbox):
    inbox, _ = inbox
    found = await render(InboxMetrics(inbox, name="bob", process=False))
    assert value(found, "onwatch_lease_generation", inbox="bob") == 0
    for absent in (
        "onwatch_lease_expiry_seconds",
        "onwatch_approval_soonest_deadline_seconds",
        "onwatch_outbox_next_send_seconds",
        "onwatch_next_timer_seconds",
    ):
        assert not [key for key in found if key[0] == absent]
    assert not [key for key in found if key[0].startswith("onwatch_runs")]  # not a worker


async def test_worker_counters_and_latency(inbox):
    inbox, clock = inbox
    metrics = InboxMetrics(inbox, process=False)
    await inbox.ingest("chat", "m1", None)
    clock.advance(7)
    gen = await inbox.acquire("w1")
    batch = await inbox.claim_batch("w1", gen)
    metrics.worker.claimed(batch, clock.now())
    metrics.worker.ended("failed", 0.3)
    found = await render(metrics)
    assert value(found, "onwatch_runs_total", inbox="alice") == 1
    assert value(found, "onwatch_run_failures_total", inbox="alice") == 1
    assert value(found, "onwatch_run_duration_seconds_count", inbox="alice") == 1
    assert value(found, "onwatch_run_duration_seconds_sum", inbox="alice") == pytest.approx(0.3)
    assert value(found, "onwatch_claim_latency_seconds_sum", inbox="alice", source="chat") == 7
    assert (
        value(found, "onwatch_claim_latency_seconds_bucket", inbox="alice", source="chat", le="5.0")
        == 0
    )
    assert (
        value(
            found, "onwatch_claim_latency_seconds_bucket", inbox="alice", source="chat", le="10.0"
        )
        == 1
    )


async def test_sources_are_bounded_and_payload_text_never_becomes_a_label(inbox):
    inbox, _ = inbox
    metrics = InboxMetrics(inbox, process=False)
    for n in range(MAX_SOURCES + 30):
        metrics.intake.stored(f"src{n}", True)
    metrics.intake.stored("src0", False)
    metrics.intake.stored("x" * 65, True)
    await inbox.ingest("chat", "secret-id-123", {"text": "payload words"})
    body, _ = await metrics.render()
    found = samples(body.decode())
    sources = {
        dict(labels).get("source")
        for (name, labels) in found
        if name == "onwatch_events_ingested_total"
    }
    assert len(sources) == MAX_SOURCES + 1 and "other" in sources
    assert value(found, "onwatch_events_ingested_total", inbox="alice", source="other") == 31
    assert value(found, "onwatch_ingest_duplicates_total", inbox="alice", source="src0") == 1
    assert b"secret-id-123" not in body and b"payload words" not in body


def test_labels():
    assert inbox_label("/srv/agents/alice.db") == "alice"
    assert inbox_label("bob") == "bob"
    labels = SourceLabels(limit=2)
    assert [labels(s) for s in ("a", "b", "c", "a")] == ["a", "b", "other", "a"]
