"""The twelve reference scenarios of SPEC §2, as steps that drive only the public core API.

No UI here (no textual import): the same steps are played headless by the tests and on screen
by the player. Each step moves the fake clock, calls the inbox, and returns its narration line
built from what the inbox really answered, so the demo can never show an outcome the rules did
not produce.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from core import Event, FakeClock, Inbox

START = 1_000_000  # SPEC §2: t
DAY = 86_400
HOUR = 3_600
MINUTE = 60

# SPEC §2: every scenario runs with these settings.
SETTINGS: dict[str, Any] = {"lease_ttl": 120, "max_attempts": 3, "outbox_gap": 3600}


# --- the stage a scenario plays on ------------------------------------------------------------


def since_start(now: int) -> str:
    """The simulated time as an offset from t, e.g. 't+2m11s', 't+4d00h10m'."""
    offset = now - START
    sign = "-" if offset < 0 else "+"
    offset = abs(offset)
    days, rest = divmod(offset, DAY)
    hours, rest = divmod(rest, HOUR)
    minutes, seconds = divmod(rest, MINUTE)
    if days:
        text = f"{days}d{hours:02d}h{minutes:02d}m" + (f"{seconds:02d}s" if seconds else "")
    elif hours:
        text = f"{hours}h{minutes:02d}m" + (f"{seconds:02d}s" if seconds else "")
    elif minutes:
        text = f"{minutes}m{seconds:02d}s"
    else:
        text = f"{seconds}s"
    return f"t{sign}{text}"


def span(seconds: int) -> str:
    """A duration in words a person reads at a glance: '2 min 10 s', '23.8 h'."""
    if seconds < MINUTE:
        return f"{seconds} s"
    if seconds < HOUR:
        minutes, rest = divmod(seconds, MINUTE)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    if seconds < 2 * DAY:
        hours = seconds / HOUR
        return f"{hours:.0f} h" if hours == int(hours) else f"{hours:.1f} h"
    return f"{seconds / DAY:.1f} days"


class Stage:
    """A scratch inbox on a fake clock, plus what the scenario's steps have seen so far.

    `inbox` is the connection the viewer (and the TUI) reads. A scenario that restarts a
    worker process opens a separate connection for it with `worker_connection`, so closing
    that connection is a real process restart as far as the file is concerned.
    """

    def __init__(self, inbox: Inbox, clock: FakeClock) -> None:
        self.inbox = inbox
        self.clock = clock
        self.results: dict[str, Any] = {}  # figures steps hand on (and tests read)
        self.sent: list[str] = []  # what the demo's chat channel received, in order
        self._workers: dict[str, Inbox] = {}

    @property
    def now(self) -> int:
        return self.clock.now()

    def at(self, when: int) -> int:
        """Move the simulated clock to `when` (never backwards) and return it."""
        if when < self.clock.now():
            raise ValueError(f"a scenario may not move the clock back ({when} < {self.now})")
        self.clock.set(when)
        return when

    def later(self, seconds: int) -> int:
        return self.clock.advance(seconds)

    def channel(self, text: str) -> None:
        """The demo's chat channel: it just keeps what it was given."""
        self.sent.append(str(text))

    async def worker_connection(self, name: str) -> Inbox:
        """The inbox as a worker process named `name` sees it (its own connection)."""
        if name not in self._workers:
            self._workers[name] = await Inbox.open(self.inbox.path, clock=self.clock)
        return self._workers[name]

    async def stop_worker(self, name: str) -> None:
        """The worker process exits: its connection closes, nothing in memory survives."""
        worker = self._workers.pop(name, None)
        if worker is not None:
            await worker.close()

    async def close_workers(self) -> None:
        for name in list(self._workers):
            await self.stop_worker(name)

    # Small reads the narrations share.

    async def event(self, event_id: int) -> Event:
        event = await self.inbox.get_event(event_id)
        assert event is not None, f"event {event_id} vanished"
        return event

    async def held(self) -> int:
        return len(await self.inbox.held_messages())

    async def lease_until(self) -> str:
        lease = await self.inbox.lease_info()
        return "no lease" if lease is None else since_start(lease.until)


Action = Callable[[Stage], Awaitable[str]]


@dataclass(frozen=True)
class Step:
    """One thing that happens: `act` does it on the stage and returns the narration line."""

    title: str
    act: Action
    pane: str | None = None  # the pane that shows this step's outcome (player switches to it)


@dataclass(frozen=True)
class Scenario:
    """One SPEC §2 scenario: its steps and how the player should present it."""

    number: int
    key: str  # short id: used for screenshots and the command line
    title: str
    intro: str  # what the viewer is about to see, shown before the first step
    steps: tuple[Step, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)  # on top of SETTINGS
    focus: str = "pending"  # the pane that tells this story best
    watch: str = ""  # where on the screen the viewer should look
    moment: int = -1  # the step (index) whose outcome is the scenario's key picture

    @property
    def start_pane(self) -> str:
        """The pane shown before the first step: the one the first step will write to."""
        return self.steps[0].pane or self.focus if self.steps else self.focus


def plural(count: int, word: str, words: str | None = None) -> str:
    """'1 event', '3 events', 'no events'."""
    many = words or word + "s"
    if count == 0:
        return f"no {many}"
    return f"{count} {word if count == 1 else many}"


# --- 1. Webhook delivered twice -----------------------------------------------------------------


def _webhook_twice() -> Scenario:
    async def first(s: Stage) -> str:
        s.at(START)
        stored = await s.inbox.ingest("github", "delivery-7f3a", {"event": "push",
                                                                  "ref": "refs/heads/main"})
        s.results["first"] = stored
        return (f"GitHub delivers webhook delivery-7f3a: ingest returned {stored} — stored "
                f"durably before the receiver answers 200.")

    async def retry(s: Stage) -> str:
        s.later(30)
        stored = await s.inbox.ingest("github", "delivery-7f3a", {"event": "push",
                                                                  "ref": "refs/heads/main"})
        s.results["retry"] = stored
        counts = await s.inbox.counts()
        total = sum(counts.values())
        return (f"GitHub never saw the 200 and redelivers the same id: ingest returned {stored}, "
                f"the inbox still has {plural(total, 'event')}. The unique key "
                f"(source, source_id) turns the retry into a no-op, not a second run.")

    async def run_once(s: Stage) -> str:
        s.later(5)
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        ok = await s.inbox.finish("worker", gen, [e.id for e in claimed],
                                  ["Deployed main."]) if claimed else False
        s.results["runs"] = len(claimed)
        return (f"The worker runs: {plural(len(claimed), 'event')} claimed, finish returned "
                f"{ok}. One delivery, one run, one reply — however often the provider retries.")

    return Scenario(1, "webhook-twice", "Webhook delivered twice",
                    "A provider that gets no answer in time delivers the same webhook again.",
                    (Step("GitHub delivers a webhook", first, "pending"),
                     Step("GitHub retries the same delivery", retry, "pending"),
                     Step("The worker runs it once", run_once, "outbox")),
                    watch="Watch the Pending count: a redelivery never adds a row.",
                    focus="pending", moment=1)


# --- 2. Two workers, one instant ----------------------------------------------------------------


def _lease_race() -> Scenario:
    async def both_ask(s: Stage) -> str:
        s.at(START)
        a = await s.inbox.acquire("worker-A")
        b = await s.inbox.acquire("worker-B")
        s.results.update(a=a, b=b)
        return (f"A and B start at the same instant t. A's acquire returned generation {a}, "
                f"B's returned {b}: one worker per inbox, so two never run the agent at once.")

    async def b_again(s: Stage) -> str:
        s.later(60)
        b = await s.inbox.acquire("worker-B")
        s.results["b_later"] = b
        return (f"B tries again at {since_start(s.now)}: {b}. A's lease runs until "
                f"{await s.lease_until()}; B must wait for it to expire or be released.")

    async def a_renews(s: Stage) -> str:
        s.later(40)
        a = await s.inbox.acquire("worker-A")
        s.results["a_renewed"] = a
        return (f"A renews before expiry: still generation {a}, now until "
                f"{await s.lease_until()}. Renewing never changes the generation; only a "
                f"takeover does.")

    return Scenario(2, "lease-race", "Two workers ask for the lease at once",
                    "Two worker processes start together on the same inbox file.",
                    (Step("A and B ask at the same instant", both_ask, "running"),
                     Step("B asks again", b_again, "running"),
                     Step("A renews its lease", a_renews, "running")),
                    watch="Watch the lease line at the top: holder, generation, time left.",
                    focus="running", moment=0)


# --- 3. Three quick chat messages ---------------------------------------------------------------


def _chat_batch() -> Scenario:
    texts = ("hi", "are you there?", "can you check order 1182?")

    async def arrive(s: Stage) -> str:
        s.at(START)
        for number, text in enumerate(texts, 1):
            await s.inbox.ingest("chat", f"msg-{number}", {"from": "dana", "text": text})
            s.later(1)
        pending = (await s.inbox.counts()).get("pending", 0)
        return (f"Dana types three messages in three seconds: {plural(pending, 'event')} "
                f"pending.")

    async def claim(s: Stage) -> str:
        s.later(2)
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        s.results["claimed"] = [e.id for e in claimed]
        s.results["gen"] = gen
        return (f"The worker claims: one run takes {plural(len(claimed), 'event')} "
                f"({', '.join(e.source_id for e in claimed)}). One agent run reads the whole "
                f"conversation instead of three runs answering fragments.")

    async def finish(s: Stage) -> str:
        s.later(8)
        ok = await s.inbox.finish("worker", s.results["gen"], s.results["claimed"],
                                  ["Hi Dana! Order 1182 shipped this morning."])
        done = (await s.inbox.counts()).get("done", 0)
        return (f"The run finishes (finish returned {ok}): {plural(done, 'event')} done, "
                f"{plural(await s.held(), 'reply', 'replies')} in the outbox.")

    return Scenario(3, "chat-batch", "Three quick chat messages",
                    "A person sends three short messages back to back.",
                    (Step("Three messages arrive", arrive, "pending"),
                     Step("One run claims all three", claim, "running"),
                     Step("One reply", finish, "outbox")),
                    watch="Watch the Running pane: three rows, one run number.",
                    focus="running", moment=1)


# --- 4. A stalls, B takes over, A wakes up ------------------------------------------------------


def _takeover() -> Scenario:
    async def arrive(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("chat", "msg-3", {"from": "dana", "text": "move my 3pm to 4pm"})
        return "Chat message msg-3 arrives: 'move my 3pm to 4pm'."

    async def a_claims(s: Stage) -> str:
        s.at(START + 10)
        gen = await s.inbox.acquire("worker-A")
        claimed = await s.inbox.claim_batch("worker-A", gen) if gen else []
        s.results.update(a_gen=gen, event_id=claimed[0].id if claimed else None)
        attempt = claimed[0].attempts if claimed else 0
        return (f"Worker A takes the lease (generation {gen}, until {await s.lease_until()}) "
                f"and claims msg-3 (attempt {attempt}). Then A stalls: its laptop lid closes "
                f"mid-run. It stops renewing.")

    async def b_refused(s: Stage) -> str:
        s.at(START + 60)
        gen = await s.inbox.acquire("worker-B")
        s.results["b_early"] = gen
        return (f"Standby worker B asks for the lease at {since_start(s.now)}: {gen}. A's lease "
                f"is valid until {await s.lease_until()}, and a stalled worker looks exactly "
                f"like a slow one.")

    async def b_takes_over(s: Stage) -> str:
        s.at(START + 10 + 121)
        gen = await s.inbox.acquire("worker-B")
        claimed = await s.inbox.claim_batch("worker-B", gen) if gen else []
        s.results.update(b_gen=gen, b_claimed=[e.source_id for e in claimed])
        attempt = claimed[0].attempts if claimed else 0
        return (f"A's lease expired. B takes over as generation {gen} and its claim returns "
                f"{', '.join(e.source_id for e in claimed) or 'nothing'} (attempt {attempt}): "
                f"A's lost claim went back to pending instead of being lost.")

    async def b_finishes(s: Stage) -> str:
        s.later(9)
        ok = await s.inbox.finish("worker-B", s.results["b_gen"], [s.results["event_id"]],
                                  ["Done: your 3pm is now at 4pm."])
        s.results["b_finish"] = ok
        return (f"B finishes msg-3: finish returned {ok}. 'done' and the reply are written in "
                f"one transaction: the outbox holds {plural(await s.held(), 'message')}.")

    async def a_wakes(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at((lease.until if lease else s.now) + 1)
        gen = await s.inbox.acquire("worker-A")
        s.results["a_new_gen"] = gen
        return (f"B goes idle and its lease lapses too. A wakes up, still in its old run, and "
                f"acquires: generation {gen}. By name, A is the lease holder again.")

    async def a_late_finish(s: Stage) -> str:
        s.later(1)
        ok = await s.inbox.finish("worker-A", s.results["a_gen"], [s.results["event_id"]],
                                  ["Done: your 3pm is now at 5pm."])
        s.results["a_late_finish"] = ok
        event = await s.event(s.results["event_id"])
        return (f"A reports its old generation-{s.results['a_gen']} run: finish returned {ok} "
                f"(refused and audited). msg-3 stays {event.status}, attempts "
                f"{event.attempts}, outbox {plural(await s.held(), 'message')}. A name check "
                f"alone would have let it through: only the generation tells A's runs apart.")

    return Scenario(4, "takeover", "A stalls, B takes over, A wakes up",
                    "Worker A stalls mid-run; B takes over; then A wakes and tries to finish.",
                    (Step("msg-3 arrives", arrive, "pending"),
                     Step("A claims msg-3 and stalls", a_claims, "running"),
                     Step("B asks too early", b_refused, "running"),
                     Step("B takes over", b_takes_over, "running"),
                     Step("B finishes", b_finishes, "outbox"),
                     Step("A wakes up", a_wakes, "outbox"),
                     Step("A's late finish", a_late_finish, "outbox")),
                    watch="Watch the lease line at the top (holder, generation, takeovers, "
                          "refused stale writes), then the Outbox.",
                    focus="running", moment=6)


# --- 5. Poison event with a healthy one ---------------------------------------------------------


def _poison() -> Scenario:
    async def arrive(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("email", "mail-poison",
                             {"subject": "Invoice", "attachment": "scan.pdf (412 MB)"})
        await s.inbox.ingest("email", "mail-healthy", {"subject": "Lunch on Friday?"})
        return ("Two e-mails arrive: one has an attachment that crashes the agent every time "
                "(poison), the other is ordinary.")

    def crash_run(worker: str, index: int) -> Action:
        async def act(s: Stage) -> str:
            lease = await s.inbox.lease_info()
            s.at(lease.until + 1 if lease else START + 5)
            gen = await s.inbox.acquire(worker)
            claimed = await s.inbox.claim_batch(worker, gen) if gen else []
            s.results[f"{worker}_claimed"] = [e.source_id for e in claimed]
            names = ", ".join(f"{e.source_id} (attempt {e.attempts})" for e in claimed)
            if index == 0:
                why = ("it claims both and crashes on the attachment before finishing. Attempts "
                       "are counted at claim time, so a crash still uses one up.")
            else:
                why = ("an event that already failed runs alone, so the poison cannot take the "
                       "healthy e-mail down with it. It crashes again.")
            took = "takes the lease" if index == 0 else "takes over"
            return f"{worker} {took} (generation {gen}) and claims {names or 'nothing'}: {why}"
        return act

    async def w3(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at(lease.until + 1)
        gen = await s.inbox.acquire("W3")
        claimed = await s.inbox.claim_batch("W3", gen) if gen else []
        s.results["W3_claimed"] = [e.source_id for e in claimed]
        s.results["W3_gen"] = gen
        dead = await s.inbox.events("dead")
        poison = dead[0] if dead else None
        if poison is None:
            verdict = "Nothing is dead"
        else:
            verdict = (f"The poison e-mail is dead after {poison.attempts} attempts "
                       f"('{(poison.error or '').split(';')[0]}'), kept for a human")
        return (f"W3 takes over (generation {gen}). {verdict}; W3 claims "
                f"{', '.join(e.source_id for e in claimed) or 'nothing'} alone.")

    async def w3_finishes(s: Stage) -> str:
        s.later(5)
        healthy = (await s.inbox.events("running"))
        ok = await s.inbox.finish("W3", s.results["W3_gen"], [e.id for e in healthy],
                                  ["Friday works, see you at noon."])
        done = await s.inbox.events("done")
        attempts = done[0].attempts if done else 0
        return (f"W3 finishes it (finish returned {ok}): the healthy e-mail is done on attempt "
                f"{attempts}. It waited for two crashes, but it was never lost or dragged "
                f"to dead.")

    async def w4(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at(lease.until + 1)
        gen = await s.inbox.acquire("W4")
        claimed = await s.inbox.claim_batch("W4", gen) if gen else []
        s.results["W4_claimed"] = [e.source_id for e in claimed]
        counts = await s.inbox.counts()
        return (f"W4 takes over (generation {gen}) and claims {plural(len(claimed), 'event')}. "
                f"{counts.get('dead', 0)} dead for a human to look at, {counts.get('done', 0)} "
                f"done: the crash loop is over.")

    return Scenario(5, "poison", "Poison event with a healthy one",
                    "One event crashes every worker that runs it; a healthy one waits behind it.",
                    (Step("Two e-mails arrive", arrive, "pending"),
                     Step("W0 claims both, crashes", crash_run("W0", 0), "running"),
                     Step("W1 retries the poison alone, crashes", crash_run("W1", 1),
                          "running"),
                     Step("W2 retries the poison alone, crashes", crash_run("W2", 2),
                          "running"),
                     Step("The poison is dead; W3 claims the healthy one", w3, "dead"),
                     Step("W3 finishes the healthy one", w3_finishes, "dead"),
                     Step("W4 finds nothing to do", w4, "dead")),
                    watch="Watch the tries column, then the Dead & interrupted pane.",
                    focus="dead", moment=4)


# --- 6. Timers ----------------------------------------------------------------------------------


def _timers() -> Scenario:
    async def register(s: Stage) -> str:
        s.at(START)
        await s.inbox.add_timer("digest", START, {"kind": "daily digest"}, every=DAY)
        return ("The agent registers a daily digest timer, first due now (t), catch-up "
                "'coalesce'.")

    async def first_pass(s: Stage) -> str:
        due = await s.inbox.run_scheduler()
        s.results["first_pass"] = due
        return (f"Scheduler pass at t: {due} due. It does not run the agent; it writes the "
                f"occurrence to the inbox as event digest@{START}, which is what makes a "
                f"replay deduplicable.")

    async def second_pass(s: Stage) -> str:
        due = await s.inbox.run_scheduler()
        s.results["second_pass"] = due
        return (f"A second pass at the same instant: {due} due. The first pass advanced the "
                f"timer in the same transaction that wrote the event.")

    async def redeploy(s: Stage) -> str:
        s.later(20)
        await s.inbox.add_timer("digest", START, {"kind": "daily digest"}, every=DAY)
        due = await s.inbox.run_scheduler()
        digests = await _digests(s)
        s.results["redeploy_pass"] = due
        return (f"A deploy re-registers the schedule with its old due time t: {due} due, but "
                f"still {plural(len(digests), 'digest event')} — the occurrence key "
                f"digest@{START} was already taken.")

    async def outage(s: Stage) -> str:
        timer = next(t for t in await s.inbox.timers() if t.id == "digest")
        s.at(timer.due + 3 * DAY + 10 * MINUTE)
        due = await s.inbox.run_scheduler()
        digests = await _digests(s)
        newest = max(digests, key=lambda e: e.id)
        payload = newest.payload or {}
        timer = next(t for t in await s.inbox.timers() if t.id == "digest")
        s.results.update(outage_pass=due, next_due_in=timer.due - s.now)
        return (f"The machine was off for 3 days. Back at next due + 3 d 10 min: {due} due, "
                f"{plural(len(digests), 'digest event')} in total; the new one has skipped "
                f"{payload.get('skipped')}, late_by {payload.get('late_by')} s. Next due in "
                f"{timer.due - s.now:,} s ({span(timer.due - s.now)}). One digest, not four.")

    return Scenario(6, "timer-coalesce", "Timers: replays and an outage",
                    "A daily digest timer fires, is replayed by a deploy, then misses 3 days.",
                    (Step("Register a daily timer", register, "timers"),
                     Step("The scheduler fires it", first_pass, "pending"),
                     Step("A second pass at the same instant", second_pass, "pending"),
                     Step("A deploy replays the old due time", redeploy, "pending"),
                     Step("Three days of outage", outage, "timers")),
                    watch="Watch the Timers pane: next due, last fired, skipped.",
                    focus="timers", moment=4)


async def _digests(s: Stage) -> list[Event]:
    found: list[Event] = []
    for status in ("pending", "running", "done"):
        found += [e for e in await s.inbox.events(status) if e.source_id.startswith("digest@")]
    return found


# --- 7. Approvals -------------------------------------------------------------------------------

FOUR_HOURS = 4 * HOUR


def _approvals() -> Scenario:
    async def ask(request_id: str, action: str, s: Stage) -> None:
        await s.inbox.request_approval(request_id, FOUR_HOURS, action)
        s.results[f"{request_id}_at"] = s.now

    async def request_1(s: Stage) -> str:
        s.at(START)
        await ask("refund-1", "Refund $40 to order 1182", s)
        return ("The agent asks: 'Refund $40 to order 1182?' (4-hour window) and its run ends "
                "there. The answer or the expiry will come back as an inbox event.")

    async def expire_1(s: Stage) -> str:
        s.at(s.results["refund-1_at"] + 5 * HOUR)
        due = await s.inbox.run_scheduler()
        approval = await s.inbox.get_approval("refund-1")
        if approval.answered_by != "scheduler":  # the viewer answered it from the pane
            return (f"At T+5h the scheduler runs ({due} due): refund-1 already has its answer "
                    f"'{approval.answer}' (from {approval.answered_by}), so its expiry has "
                    f"nothing to do.")
        return (f"Nobody answered. At T+5h the scheduler runs ({due} due): refund-1's expiry "
                f"timer stores '{approval.answer}', so the agent still wakes up, with a refusal.")

    async def late_yes_1(s: Stage) -> str:
        s.at(s.results["refund-1_at"] + 6 * HOUR)
        standing = await s.inbox.answer_approval("refund-1", "yes", actor="dana")
        s.results["refund-1_late_yes"] = standing
        return (f"Dana taps 'yes' at T+6h: the call returns '{standing}'. The answer that "
                f"stands is the one she is told — no refund the agent was told not to make.")

    async def request_2(s: Stage) -> str:
        await ask("refund-2", "Refund $15 to order 1190", s)
        return ("A second request, refund-2, with its own 4-hour window. This time the "
                "scheduler will not run before the answer comes.")

    async def late_yes_2(s: Stage) -> str:
        s.at(s.results["refund-2_at"] + 5 * HOUR)
        standing = await s.inbox.answer_approval("refund-2", "yes", actor="dana")
        s.results["refund-2_late_yes"] = standing
        if standing != "expired":
            return (f"'yes' arrives at T+5h: the call returns '{standing}', the answer given "
                    f"in time from the Approvals pane. It stands.")
        return (f"'yes' arrives at T+5h, the expiry timer not yet fired: '{standing}'. The "
                f"deadline is checked in the answer's own transaction, not left to the "
                f"scheduler having run.")

    async def request_3(s: Stage) -> str:
        await ask("refund-3", "Refund $90 to order 1201", s)
        return "A third request, refund-3, 4-hour window."

    async def yes_3(s: Stage) -> str:
        s.at(s.results["refund-3_at"] + HOUR)
        standing = await s.inbox.answer_approval("refund-3", "yes", actor="dana")
        s.results["refund-3_yes"] = standing
        if standing != "yes":
            return (f"Dana answers 'yes' at T+1h: the call returns '{standing}', the answer "
                    f"already given from the Approvals pane. She is told what stands.")
        return f"Dana answers 'yes' at T+1h, in time: '{standing}'. The agent resumes."

    async def no_3(s: Stage) -> str:
        s.at(s.results["refund-3_at"] + 2 * HOUR)
        standing = await s.inbox.answer_approval("refund-3", "no", actor="sam")
        s.results["refund-3_second_tap"] = standing
        return (f"Sam taps 'no' at T+2h: the call returns '{standing}'. Exactly one answer is "
                f"ever stored, and Sam is told which one stands.")

    async def expiry_3(s: Stage) -> str:
        s.at(s.results["refund-3_at"] + 5 * HOUR)
        due = await s.inbox.run_scheduler()
        approval = await s.inbox.get_approval("refund-3")
        s.results["refund-3_after_expiry"] = approval.answer
        return (f"T+5h, past refund-3's deadline, the scheduler runs ({due} due): the stored "
                f"answer is still '{approval.answer}' — an expiry never overwrites an answer.")

    async def unknown(s: Stage) -> str:
        s.later(60)
        standing = await s.inbox.answer_approval("refund-404", "yes", actor="dana")
        s.results["unknown"] = standing
        events = await _approval_events(s)
        return (f"An answer for refund-404, never requested: '{standing}'. Each request woke "
                f"the agent exactly once: {plural(len(events), 'approval event')}.")

    return Scenario(7, "approval-expiry", "Approvals with a 4-hour window",
                    "The agent asks a human before refunding; answers come late, twice, or never.",
                    (Step("refund-1 requested", request_1, "approvals"),
                     Step("refund-1 expires", expire_1, "approvals"),
                     Step("A late 'yes' for refund-1", late_yes_1, "approvals"),
                     Step("refund-2 requested", request_2, "approvals"),
                     Step("'yes' past the deadline, scheduler idle", late_yes_2, "approvals"),
                     Step("refund-3 requested", request_3, "approvals"),
                     Step("'yes' in time", yes_3, "approvals"),
                     Step("A second tap: 'no'", no_3, "approvals"),
                     Step("refund-3's deadline passes", expiry_3, "approvals"),
                     Step("An answer for an unknown request", unknown, "approvals")),
                    watch="Watch the Approvals pane: each request's answer. Press a yourself "
                          "on a waiting one.",
                    focus="approvals", moment=2)


async def _approval_events(s: Stage) -> list[Event]:
    found: list[Event] = []
    for status in ("pending", "running", "done"):
        found += [e for e in await s.inbox.events(status) if e.source == "approval"]
    return found


# --- 8. Outbox pacing ---------------------------------------------------------------------------


async def _run_with_reply(s: Stage, source_id: str, body: str, worker: str = "worker") -> bool:
    """Ingest one event, let `worker` claim it and finish with `body` as its reply."""
    await s.inbox.ingest("build", source_id, {"step": source_id})
    gen = await s.inbox.acquire(worker)
    claimed = await s.inbox.claim_batch(worker, gen) if gen else []
    ok = await s.inbox.finish(worker, gen, [e.id for e in claimed], [body]) if claimed else False
    await s.inbox.release(worker, gen)  # the worker goes idle between events
    return ok


def _outbox() -> Scenario:
    minute0 = START + 2 * HOUR

    async def earlier(s: Stage) -> str:
        s.at(START)
        await _run_with_reply(s, "briefing", "morning briefing")
        sent = await s.inbox.dispatch(s.channel)
        return (f"Two hours before this story starts, the morning briefing went out ({sent} "
                f"sent). The gap between paced sends is one hour.")

    def update(number: int) -> Action:
        async def act(s: Stage) -> str:
            s.at(minute0 + 10 * number * MINUTE)
            first = len(s.sent)
            await _run_with_reply(s, f"update-{number}", f"update {number}")
            sent = await s.inbox.dispatch(s.channel)
            s.results.setdefault("dispatched", []).append(sent)
            held = await s.held()
            next_at = await s.inbox.next_send_at()
            if sent:
                what = (f"dispatch sent {sent}: {s.sent[first]!r} (the last send was "
                        f"{span(s.now - START)} ago).")
            else:
                what = (f"dispatch sent 0: inside the gap. {plural(held, 'message')} held, "
                        f"next send at {since_start(next_at) if next_at else '-'}.")
            return f"Minute {10 * number}: a run queues 'update {number}'; {what}"
        return act

    async def minute61(s: Stage) -> str:
        s.at(minute0 + 61 * MINUTE)
        first = len(s.sent)
        sent = await s.inbox.dispatch(s.channel)
        s.results.setdefault("dispatched", []).append(sent)
        s.results["sends"] = s.sent[s.sent.index("update 0"):] if "update 0" in s.sent else []
        text = s.sent[first] if len(s.sent) > first else ""
        return (f"Minute 61, the gap is over: dispatch sent {sent} in one message, "
                f"{text!r}. Two sends in the hour instead of three pings.")

    return Scenario(8, "outbox-pacing", "Outbox with a one-hour gap",
                    "Progress updates arrive every 10 minutes; the person gets at most one "
                    "message an hour.",
                    (Step("The last send, two hours ago", earlier, "outbox"),
                     Step("Minute 0: update 0", update(0), "outbox"),
                     Step("Minute 10: update 1", update(1), "outbox"),
                     Step("Minute 20: update 2", update(2), "outbox"),
                     Step("Minute 61: the gap is over", minute61, "outbox")),
                    watch="Watch the Outbox pane: what is held, when the next send is allowed, "
                          "what was sent.",
                    focus="outbox", moment=4)


# --- 9. Restart before claim --------------------------------------------------------------------


def _restart_before_claim() -> Scenario:
    async def wake_up(s: Stage) -> str:
        s.at(START)
        await s.inbox.add_timer("standup-reminder", START, {"text": "stand-up in 15 min"},
                                key=("reminder", "standup-2024-05-06"))
        worker = await s.worker_connection("worker")
        due = await worker.run_scheduler()
        pending = await s.inbox.events("pending")
        s.results["event_id"] = pending[0].id if pending else None
        return (f"The worker's scheduler turns a one-off reminder into an inbox event ({due} "
                f"due): {plural(len(pending), 'event')} pending.")

    async def restart(s: Stage) -> str:
        s.later(2)
        await s.stop_worker("worker")
        pending = await s.inbox.events("pending")
        return (f"The worker process is restarted (a deploy) before it claims anything. The "
                f"wake-up lived only in the database, not in the process: "
                f"{plural(len(pending), 'event')} still pending.")

    async def claim(s: Stage) -> str:
        s.later(20)
        worker = await s.worker_connection("worker")
        gen = await worker.acquire("worker")
        claimed = await worker.claim_batch("worker", gen) if gen else []
        s.results.update(gen=gen, claimed=[e.id for e in claimed])
        return (f"The new process acquires (generation {gen}) and claims "
                f"{plural(len(claimed), 'event')}: the reminder survived the restart.")

    async def finish(s: Stage) -> str:
        s.later(5)
        worker = await s.worker_connection("worker")
        ok = await worker.finish("worker", s.results["gen"], s.results["claimed"],
                                 ["Stand-up in 15 minutes."])
        again = await worker.claim_batch("worker", s.results["gen"])
        s.results["claimed_again"] = len(again)
        event = await s.event(s.results["event_id"])
        await s.stop_worker("worker")
        return (f"It finishes (finish returned {ok}); a further claim returns "
                f"{plural(len(again), 'event')}. The reminder ran once: {event.status}, "
                f"attempts {event.attempts}.")

    return Scenario(9, "restart-before-claim", "Restart before claim",
                    "A wake-up is stored, then the worker restarts before claiming it.",
                    (Step("A wake-up is stored", wake_up, "pending"),
                     Step("The worker restarts", restart, "pending"),
                     Step("The new process claims it", claim, "running"),
                     Step("It runs once", finish, "running")),
                    watch="Watch the Pending pane across the restart.",
                    focus="pending", moment=1)


# --- 10. Restart during a run (policy interrupt) ------------------------------------------------


def _restart_during_run() -> Scenario:
    async def arrive(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("stripe", "evt_1PqR", {"type": "refund.requested",
                                                    "amount": "$40", "order": 1182})
        return ("A refund request arrives. This inbox uses lost-claim policy 'interrupt': a "
                "refund must never be paid twice.")

    async def run(s: Stage) -> str:
        s.later(5)
        worker = await s.worker_connection("worker-1")
        gen = await worker.acquire("worker-1")
        claimed = await worker.claim_batch("worker-1", gen) if gen else []
        s.results.update(event_id=claimed[0].id if claimed else None, gen=gen)
        return (f"worker-1 (generation {gen}) claims the refund and calls the payment API. "
                f"Did the money move? Only the payment provider knows now.")

    async def crash(s: Stage) -> str:
        s.later(3)
        await s.stop_worker("worker-1")  # dies before finish: no outcome recorded
        event = await s.event(s.results["event_id"])
        return (f"worker-1's process is killed before it records the outcome. The event is "
                f"still '{event.status}' under generation {event.claim_gen}.")

    async def restart(s: Stage) -> str:
        lease = await s.inbox.lease_info()
        s.at(lease.until + 1)
        worker = await s.worker_connection("worker-2")
        gen = await worker.acquire("worker-2")
        claimed = await worker.claim_batch("worker-2", gen) if gen else []
        event = await s.event(s.results["event_id"])
        s.results.update(gen2=gen, restart_claimed=len(claimed))
        return (f"The restarted worker takes over (generation {gen}) and claims "
                f"{plural(len(claimed), 'event')}. The refund is '{event.status}': completion "
                f"is uncertain, so it is not retried — a retry could pay twice.")

    async def still(s: Stage) -> str:
        s.later(HOUR)
        worker = await s.worker_connection("worker-2")
        gen = await worker.acquire("worker-2")
        claimed = await worker.claim_batch("worker-2", gen) if gen else []
        event = await s.event(s.results["event_id"])
        s.results["later_claimed"] = len(claimed)
        return (f"An hour later the worker claims {plural(len(claimed), 'event')}: the refund "
                f"is still '{event.status}', waiting in the Dead & interrupted pane for a "
                f"human.")

    async def resolve(s: Stage) -> str:
        s.later(5 * MINUTE)
        ok = await s.inbox.resolve(s.results["event_id"], actor="dana",
                                   reason="Stripe dashboard shows the refund was paid")
        event = await s.event(s.results["event_id"])
        await s.close_workers()
        if not ok:
            return (f"resolve returned {ok}: the refund is already '{event.status}' (marked "
                    f"from the Dead pane first). An action on a row that changed meanwhile "
                    f"reports it instead of overwriting.")
        return (f"Dana checks the Stripe dashboard: the refund was paid. She marks it done "
                f"(resolve returned {ok}): now '{event.status}', attempts {event.attempts}, "
                f"paid once.")

    return Scenario(10, "interrupted", "Restart during a run (policy interrupt)",
                    "A worker dies in the middle of a refund; nobody knows if it was paid.",
                    (Step("A refund request arrives", arrive, "pending"),
                     Step("worker-1 starts the refund", run, "running"),
                     Step("worker-1 is killed", crash, "running"),
                     Step("The restarted worker takes over", restart, "dead"),
                     Step("It is never retried automatically", still, "dead"),
                     Step("The operator resolves it", resolve, "dead")),
                    settings={"on_lost_claim": "interrupt"},
                    watch="Watch the Dead & interrupted pane: the refund waits there for a "
                          "human (m marks it done).",
                    focus="dead", moment=4)


# --- 11. Result stored, delivery failed ---------------------------------------------------------


def _delivery_failed() -> Scenario:
    async def run(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("chat", "msg-41", {"from": "dana", "text": "summarise my inbox"})
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        s.later(40)
        ok = await s.inbox.finish("worker", gen, [e.id for e in claimed],
                                  ["You have 3 new mails; none urgent."],
                                  result={"summary": "3 new mails, none urgent"})
        s.results["event_id"] = claimed[0].id if claimed else None
        runs = await s.inbox.runs(s.results["event_id"])
        return (f"The agent runs (40 s of model time) and finishes (finish returned {ok}): the "
                f"result is stored as run #{runs[0].id if runs else '?'}, its reply held in "
                f"the outbox, apart from delivery.")

    async def fail(s: Stage) -> str:
        s.later(2)

        def broken(text: str) -> None:
            s.results["attempts_to_send"] = s.results.get("attempts_to_send", 0) + 1
            raise ConnectionError("chat API answered 503")

        sent = await s.inbox.dispatch(broken)
        held = await s.held()
        delivery = (await s.inbox.deliveries(limit=1))[0]
        return (f"dispatch: the chat API answers 503, {sent} sent. Delivery is "
                f"'{delivery.status}' ({delivery.last_error}); the reply is still held "
                f"({plural(held, 'message')}) and the agent is not run again.")

    async def retry(s: Stage) -> str:
        s.later(5 * MINUTE)
        sent = await s.inbox.dispatch(s.channel)
        runs = await s.inbox.runs(s.results["event_id"])
        delivery = (await s.inbox.deliveries(limit=1))[0]
        s.results["runs"] = len(runs)
        return (f"Five minutes later the next dispatch delivers it ({sent} sent, delivery "
                f"'{delivery.status}', key {delivery.key}). The agent ran "
                f"{plural(len(runs), 'time')}: a delivery retry never re-runs the model.")

    return Scenario(11, "delivery-failed", "Result stored, delivery failed",
                    "The run succeeds, then the chat channel is down when the reply goes out.",
                    (Step("The run finishes", run, "outbox"),
                     Step("The send fails", fail, "outbox"),
                     Step("The next dispatch delivers it", retry, "outbox")),
                    watch="Watch the Outbox pane: the reply stays held while the channel is down.",
                    focus="outbox", moment=1)


# --- 12. Cancel a waiting task ------------------------------------------------------------------


def _cancel() -> Scenario:
    async def first_runs(s: Stage) -> str:
        s.at(START)
        await s.inbox.ingest("chat", "msg-50", {"from": "dana", "text": "draft the Q3 report"})
        gen = await s.inbox.acquire("worker")
        claimed = await s.inbox.claim_batch("worker", gen) if gen else []
        s.results.update(gen=gen, running_id=claimed[0].id if claimed else None)
        return "Dana asks for the Q3 report; the worker claims it and starts a long run."

    async def second_waits(s: Stage) -> str:
        s.later(30)
        await s.inbox.ingest("chat", "msg-51", {"from": "dana", "text": "also email it to Sam"})
        pending = await s.inbox.events("pending")
        s.results["pending_id"] = pending[0].id if pending else None
        return (f"She adds 'also email it to Sam': {plural(len(pending), 'event')} pending, "
                f"waiting for the next run.")

    async def cancel_pending(s: Stage) -> str:
        s.later(30)
        ok = await s.inbox.cancel(s.results["pending_id"], actor="dana",
                                  reason="changed my mind")
        s.results["cancel_pending"] = ok
        event = await s.event(s.results["pending_id"])
        return (f"She changes her mind and cancels msg-51 from the Pending pane: cancel "
                f"returned {ok}, it is now '{event.status}'.")

    async def cancel_running(s: Stage) -> str:
        s.later(10)
        ok = await s.inbox.cancel(s.results["running_id"], actor="dana")
        s.results["cancel_running"] = ok
        entry = (await s.inbox.audit(limit=1))[0]
        return (f"She tries to cancel the running report too: cancel returned {ok} "
                f"('{entry.reason}'). The run is already under way; the action says so "
                f"instead of pretending.")

    async def finish(s: Stage) -> str:
        s.later(30)
        ok = await s.inbox.finish("worker", s.results["gen"], [s.results["running_id"]],
                                  ["Q3 report drafted: q3.md"])
        claimed = await s.inbox.claim_batch("worker", s.results["gen"])
        s.results["claimed_after"] = [e.id for e in claimed]
        event = await s.event(s.results["pending_id"])
        return (f"The report run finishes ({ok}); the next claim returns "
                f"{plural(len(claimed), 'event')}. msg-51 stays '{event.status}' with "
                f"{plural(event.attempts, 'attempt')}: a cancelled event is never claimed.")

    return Scenario(12, "cancel", "Cancel a waiting task",
                    "The operator cancels one waiting request and tries to cancel a running one.",
                    (Step("A long run starts", first_runs, "running"),
                     Step("A second request waits", second_waits, "pending"),
                     Step("Cancel the waiting one", cancel_pending, "pending"),
                     Step("Try to cancel the running one", cancel_running, "running"),
                     Step("The worker never sees the cancelled one", finish, "pending")),
                    watch="Watch Pending and Running, and what each cancel answers.",
                    focus="pending", moment=3)


SCENARIOS: tuple[Scenario, ...] = (
    _webhook_twice(), _lease_race(), _chat_batch(), _takeover(), _poison(), _timers(),
    _approvals(), _outbox(), _restart_before_claim(), _restart_during_run(),
    _delivery_failed(), _cancel(),
)


def scenario(key: str | int) -> Scenario:
    """The scenario with this key or number; raise KeyError naming the known ones."""
    for item in SCENARIOS:
        if key in (item.key, item.number, str(item.number)):
            return item
    raise KeyError(f"no scenario {key!r}; known: "
                   f"{', '.join(f'{s.number} {s.key}' for s in SCENARIOS)}")


# --- playing ------------------------------------------------------------------------------------


class ScenarioRun:
    """One scenario being played on one stage, a step at a time."""

    def __init__(self, scenario: Scenario, stage: Stage) -> None:
        self.scenario = scenario
        self.stage = stage
        self.position = 0  # how many steps have been played
        self.narration: list[str] = []

    @classmethod
    async def open(cls, scenario: Scenario, path: str | os.PathLike,
                   clock: FakeClock | None = None) -> "ScenarioRun":
        """Open a fresh inbox at `path` on `clock` (reset to t) with the scenario's settings."""
        clock = clock or FakeClock(START)
        clock.set(START)
        inbox = await Inbox.open(path, clock=clock)
        await inbox.configure(**{**SETTINGS, **scenario.settings})
        return cls(scenario, Stage(inbox, clock))

    @property
    def finished(self) -> bool:
        return self.position >= len(self.scenario.steps)

    @property
    def next_step(self) -> Step | None:
        return None if self.finished else self.scenario.steps[self.position]

    async def step(self) -> str:
        """Play the next step; return its narration. Raises IndexError when finished."""
        if self.finished:
            raise IndexError(f"scenario {self.scenario.key} has no more steps")
        step = self.scenario.steps[self.position]
        line = await step.act(self.stage)
        self.position += 1
        self.narration.append(line)
        return line

    async def close(self) -> None:
        await self.stage.close_workers()
        await self.stage.inbox.close()


async def play(scenario: Scenario | str | int, path: str | os.PathLike | None = None,
               *, echo: Callable[[str], Any] | None = None) -> ScenarioRun:
    """Play a scenario headless to its end on a scratch inbox; return the (open) run.

    The caller closes it (`await run.close()`). Without `path`, a temporary file is used.
    """
    chosen = scenario if isinstance(scenario, Scenario) else globals()["scenario"](scenario)
    if path is None:
        folder = tempfile.mkdtemp(prefix="onwatch-demo-")
        path = os.path.join(folder, f"{chosen.key}.db")
    run = await ScenarioRun.open(chosen, path)
    while not run.finished:
        line = await run.step()
        if echo is not None:
            echo(f"{since_start(run.stage.now):>12}  {line}")
    return run
