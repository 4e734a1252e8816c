"""Prometheus metrics of an inbox: its state read at scrape time, plus what this process counts.

    metrics = InboxMetrics(inbox)               # one per open inbox and process
    metrics.intake.stored("github", True)       # the webhook receiver counts deliveries
    metrics.worker.claimed(batch, now)          # the worker counts runs and claim latency
    body, content_type = await metrics.render() # the /metrics answer

What the database knows (events by state, approvals waiting and the soonest deadline, the
lease, the outbox, refused stale writes) is read in one consistent snapshot per scrape, so
every process that serves /metrics reports the same figures for the same file; counters
(ingests, runs, failures, durations, claim latency) count what this process did since it
started, as Prometheus counters do.

Labels are bounded: `inbox` (the file's name without its extension) and `source`; the first
`MAX_SOURCES` distinct sources keep their own label and the rest are counted as "other", so a
sender inventing sources cannot grow the series without limit. Never an id, never payload text.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client import exposition
from prometheus_client.exposition import generate_latest
from prometheus_client.process_collector import ProcessCollector

from .engine.spend import Spending
from .errors import InboxError
from .records import EVENT_STATES, Overview
from .settings import MAX_UNITS, from_micros

if TYPE_CHECKING:
    from aiohttp import web

    from .inbox import Inbox
    from .records import Event

log = logging.getLogger("onwatch.metrics")

MAX_SOURCES = 20  # distinct source labels per process before the rest become "other"
OTHER = "other"
# A run is one agent call: seconds to minutes. Claim latency is in the inbox's whole seconds.
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
LATENCY_BUCKETS = (0, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600)
# The text format every Prometheus version reads (newer clients default to 1.0.0, which only
# differs for metric names outside the classic character set; these names are all classic).
CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)


def inbox_label(path: str | os.PathLike[str]) -> str:
    """The `inbox` label of a file inbox: its name without the extension (alice.db → alice)."""
    name = os.path.basename(os.fspath(path)) or "inbox"
    stem, _ = os.path.splitext(name)
    return stem or name


class SourceLabels:
    """Maps a source to a bounded label value: the first `limit` sources seen keep theirs."""

    def __init__(self, limit: int = MAX_SOURCES) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def __call__(self, source: str) -> str:
        if source in self._known:
            return source
        if len(self._known) < self.limit and len(source) <= 64:
            self._known.add(source)
            return source
        return OTHER


@dataclass(frozen=True)
class _Snapshot:
    overview: Overview
    soonest_deadline: int | None
    lease_ttl: int
    spending: Spending | None = None
    held_back: bool = False


class _StateCollector:
    """Yields the families read from the database; `InboxMetrics.render` fills the snapshot."""

    def __init__(self, owner: "InboxMetrics") -> None:
        self.owner = owner

    def describe(self) -> Iterable[Any]:
        return ()  # families vary with what the snapshot holds; described at collect time

    def collect(self) -> Iterable[Any]:
        name = self.owner.name
        snapshot = self.owner._snapshot
        up = GaugeMetricFamily(
            "onwatch_inbox_readable",
            "1 if the inbox could be read for this scrape, else 0",
            labels=["inbox"],
        )
        up.add_metric([name], 0 if snapshot is None else 1)
        yield up
        if snapshot is None:
            return
        view, now = snapshot.overview, snapshot.overview.now

        def gauge(metric: str, text: str, value: float | None) -> GaugeMetricFamily | None:
            if value is None:
                return None
            family = GaugeMetricFamily(metric, text, labels=["inbox"])
            family.add_metric([name], value)
            return family

        events = GaugeMetricFamily(
            "onwatch_events", "events in the inbox, by state", labels=["inbox", "state"]
        )
        for state in EVENT_STATES:
            events.add_metric([name, state], view.counts.get(state, 0))
        yield events
        lease = view.lease
        families = [
            gauge(
                "onwatch_approvals_waiting",
                "approval requests without an answer",
                view.waiting_approvals,
            ),
            gauge(
                "onwatch_approval_soonest_deadline_seconds",
                "seconds until the soonest waiting approval expires (negative: overdue); "
                "absent when none is waiting",
                None if snapshot.soonest_deadline is None else snapshot.soonest_deadline - now,
            ),
            gauge(
                "onwatch_lease_generation",
                "current lease generation (0: never taken)",
                lease.gen if lease else 0,
            ),
            gauge(
                "onwatch_lease_expiry_seconds",
                "seconds until the lease expires (negative: expired or released that long "
                "ago); absent before the first lease",
                None if lease is None else lease.until - now,
            ),
            gauge("onwatch_lease_ttl_seconds", "the inbox's lease_ttl setting", snapshot.lease_ttl),
            gauge(
                "onwatch_outbox_held_messages", "messages held in the outbox", view.held_messages
            ),
            gauge(
                "onwatch_outbox_next_send_seconds",
                "seconds until the next paced send is allowed (0 or less: now); absent "
                "when nothing is held",
                None if view.next_send_at is None else view.next_send_at - now,
            ),
            gauge(
                "onwatch_outbox_on_hold",
                "1 while an operator holds the outbox",
                int(view.outbox_held),
            ),
            gauge("onwatch_paused", "1 while execution is paused by an operator", int(view.paused)),
            gauge(
                "onwatch_cleanup_held_back",
                "1 while another process's read keeps the store from cleaning up after its "
                "writes (Inbox.held_back: a -wal that cannot be copied back, a transaction "
                "left open)",
                int(snapshot.held_back),
            ),
            gauge(
                "onwatch_next_timer_seconds",
                "seconds until the soonest timer is due; absent without timers",
                None if view.next_timer_due is None else view.next_timer_due - now,
            ),
        ]
        yield from (f for f in families if f is not None)
        for metric, text, value in (
            (
                "onwatch_stale_writes_refused",
                "writes refused because their lease generation no longer held the lease (audited)",
                view.refused_writes,
            ),
            (
                "onwatch_lease_takeovers",
                "lease generations started by taking over an expired lease",
                view.takeovers,
            ),
        ):
            family = CounterMetricFamily(metric, text, labels=["inbox"])
            family.add_metric([name], value)
            yield family
        spending = snapshot.spending
        if spending is not None and spending.units:
            # Units are a label: bounded (budgeted ones first), as sources are.
            units = spending.units[:MAX_UNITS]
            spent = CounterMetricFamily(
                "onwatch_spend",
                "what runs spent since the inbox began (ctx.spend), in the unit",
                labels=["inbox", "unit"],
            )
            day = GaugeMetricFamily(
                "onwatch_spend_last_day",
                "what runs spent in the last 24 hours, in the unit: what max_spend_per_day counts",
                labels=["inbox", "unit"],
            )
            budget = GaugeMetricFamily(
                "onwatch_spend_budget",
                "max_spend_per_day of the unit (runs wait once the last 24 hours reach it)",
                labels=["inbox", "unit"],
            )
            for unit in units:
                spent.add_metric([name, unit], from_micros(spending.total.get(unit, 0)))
                day.add_metric([name, unit], from_micros(spending.last_day.get(unit, 0)))
                if unit in spending.limits:
                    budget.add_metric([name, unit], from_micros(spending.limits[unit]))
            yield spent
            yield day
            yield budget


class IntakeMetrics:
    """What a receiver counts: deliveries stored and duplicates, by source."""

    def __init__(self, registry: CollectorRegistry, name: str, sources: SourceLabels) -> None:
        self._name, self._sources = name, sources
        self._ingested = Counter(
            "onwatch_events_ingested",
            "events stored by this process",
            ["inbox", "source"],
            registry=registry,
        )
        self._duplicates = Counter(
            "onwatch_ingest_duplicates",
            "deliveries answered as duplicates by this process",
            ["inbox", "source"],
            registry=registry,
        )

    def stored(self, source: str, new: bool) -> None:
        counter = self._ingested if new else self._duplicates
        counter.labels(self._name, self._sources(source)).inc()


class WorkerMetrics:
    """What a worker counts: runs and how they ended, their duration, claim latency."""

    def __init__(self, registry: CollectorRegistry, name: str, sources: SourceLabels) -> None:
        self._name, self._sources = name, sources

        def counter(metric: str, text: str) -> Any:
            return Counter(metric, text, ["inbox"], registry=registry).labels(name)

        self._runs = counter("onwatch_runs", "runs started by this worker (one agent call each)")
        self._failures = counter(
            "onwatch_run_failures", "runs whose agent raised (finished with an error, backoff)"
        )
        self._abandoned = counter(
            "onwatch_runs_abandoned",
            "runs abandoned unfinished: lease lost, over max_run_seconds or stopping",
        )
        self._duration = Histogram(
            "onwatch_run_duration_seconds",
            "wall time of each run, agent call to its finish",
            ["inbox"],
            buckets=RUN_BUCKETS,
            registry=registry,
        ).labels(name)
        self._latency = Histogram(
            "onwatch_claim_latency_seconds",
            "seconds from an event's commit to its first claim (whole seconds of the inbox "
            "clock): how long new work waited for the worker to wake and claim it",
            ["inbox", "source"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def claimed(self, batch: Sequence["Event"], now: int) -> None:
        """A run starts on `batch`: count it, and each first attempt's wait since commit."""
        self._runs.inc()
        for event in batch:
            if event.attempts == 1 and event.created:
                waited = (event.claimed_at or now) - event.created
                self._latency.labels(self._name, self._sources(event.source)).observe(
                    max(waited, 0)
                )

    def ended(self, outcome: str, seconds: float) -> None:
        """A run ended: 'done', 'failed' (the agent raised) or 'abandoned'."""
        if outcome == "failed":
            self._failures.inc()
        elif outcome == "abandoned":
            self._abandoned.inc()
        self._duration.observe(seconds)


class InboxMetrics:
    """The /metrics of one open inbox in one process. See the module docstring."""

    def __init__(self, inbox: "Inbox", *, name: str | None = None, process: bool = True) -> None:
        self.inbox = inbox
        self.name = name or inbox_label(inbox.path)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StateCollector(self))
        if process:
            ProcessCollector(registry=self.registry)
        self._sources = SourceLabels()
        self._snapshot: _Snapshot | None = None
        self._intake: IntakeMetrics | None = None
        self._worker: WorkerMetrics | None = None

    @property
    def intake(self) -> IntakeMetrics:
        """The receiver's counters (registered on first use, so a worker shows none)."""
        if self._intake is None:
            self._intake = IntakeMetrics(self.registry, self.name, self._sources)
        return self._intake

    @property
    def worker(self) -> WorkerMetrics:
        """The worker's counters (registered on first use)."""
        if self._worker is None:
            self._worker = WorkerMetrics(self.registry, self.name, self._sources)
        return self._worker

    async def snapshot(self) -> _Snapshot | None:
        """Read what the database knows now; None (logged) if the inbox cannot be read."""
        try:
            overview = await self.inbox.overview()
            waiting = await self.inbox.approvals(limit=1) if overview.waiting_approvals else []
            settings = await self.inbox.reload_settings()
            spending = await self.inbox.spending(days=1, now=overview.now)
            held_back = await self.inbox.held_back() is not None
        except InboxError as exc:
            log.warning("metrics: could not read the inbox: %s", exc)
            return None
        soonest = waiting[0].due if waiting and waiting[0].answer is None else None
        return _Snapshot(overview, soonest, settings.lease_ttl, spending, held_back)

    async def render(self) -> tuple[bytes, str]:
        """The exposition text of everything registered, and its content type."""
        snapshot = await self.snapshot()
        # No await between here and generate_latest: concurrent scrapes cannot mix snapshots.
        self._snapshot = snapshot
        return generate_latest(self.registry), CONTENT_TYPE

    async def handle(self, request: "web.Request") -> "web.Response":
        """aiohttp handler of GET /metrics."""
        from aiohttp import web

        body, content_type = await self.render()
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response


class MetricsServer:
    """A tiny aiohttp server with only GET /metrics, for processes without an HTTP app."""

    def __init__(self, runner: Any, host: str, port: int) -> None:
        self.runner, self.host, self.port = runner, host, port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_metrics_server(
    metrics: InboxMetrics, *, host: str = "127.0.0.1", port: int = 0
) -> MetricsServer:
    """Serve `metrics` on host:port (0 picks a free port). Raises OSError if it cannot bind."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/metrics", metrics.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_host, bound_port = runner.addresses[0][:2]
    return MetricsServer(runner, bound_host, bound_port)
