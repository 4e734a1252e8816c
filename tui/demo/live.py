"""`onwatch demo --live`: real worker processes running the example agent, on a real clock.

Two `onwatch worker` processes share a scratch inbox with a short lease (5 s). The viewer sends
chat messages (`i`), kills the worker that holds the lease with SIGKILL in the middle of its run
(`K`), watches the lease expire and the other worker take over with the next generation, and
switches the lost-claim policy (`t`) to see the same crash end as a retry or as an interrupted
event waiting for a human. The panes are the supervisor's own, following the file like they
would for any agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Label, Static

from onwatch.core import Inbox, Overview, SystemClock
from .agent import THINK_SECONDS_ENV

from ..actions import KEYS
from ..safe import safe_content
from .desk import DemoDesk

LEASE_TTL = 5  # seconds: short, so a takeover happens while you watch
AGENT_SECONDS = 4.0  # how long the slow example agent "thinks" before it answers
AGENT_SECONDS_ENV = THINK_SECONDS_ENV
SETTINGS: dict[str, Any] = {
    "lease_ttl": LEASE_TTL,
    "max_attempts": 3,
    "outbox_gap": 20,
    "on_lost_claim": "retry",
}


@dataclass
class WorkerProcess:
    """One `onwatch worker` OS process, as the demo started it."""

    name: str
    process: subprocess.Popen[bytes]
    log: str
    killed: bool = False
    exit_told: bool = False  # the story said it exited by itself

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: no finish, no release, no goodbye — a power cut as far as the inbox knows."""
        if self.alive:
            os.kill(self.process.pid, signal.SIGKILL)
            self.killed = True

    def stop(self, timeout: float = 3.0) -> None:
        """SIGTERM (the worker releases its lease), then SIGKILL if it does not exit."""
        if not self.alive:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)


def start_worker(
    path: str, name: str, scratch: str, *, agent_seconds: float = AGENT_SECONDS
) -> WorkerProcess:
    """Start `onwatch worker PATH --agent onwatch.tui.demo.agent:think_then_echo` as its own
    process.

    Its log and its sends go to files in `scratch`, never to the demo's terminal.
    """
    log = os.path.join(scratch, f"{name}.log")
    command = [
        sys.executable,
        "-m",
        "onwatch",
        "worker",
        path,
        "--agent",
        "onwatch.tui.demo.agent:think_then_echo",
        "--holder",
        name,
        "--poll",
        "0.2",
        "--grace",
        "1",
        "--file",
        os.path.join(scratch, "sent.jsonl"),
        "--log-level",
        "info",
    ]
    env = dict(os.environ, **{AGENT_SECONDS_ENV: str(agent_seconds)}, PYTHONUNBUFFERED="1")
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=scratch,
            env=env,
            start_new_session=True,
        )
    return WorkerProcess(name, process, log)


class LiveBar(Vertical):
    """Under the panes: the worker processes, the policy, and what just happened."""

    def compose(self) -> ComposeResult:
        yield Label(
            Text(f"Live: real worker processes on a real clock · lease {LEASE_TTL} s"),
            id="live-title",
        )
        yield Label("", id="live-workers")
        yield Label("", id="live-policy")
        yield Static("", id="live-story")

    def show(
        self,
        workers: list[WorkerProcess],
        holder: str | None,
        gen: int | None,
        policy: str,
        story: list[str],
    ) -> None:
        line = Text("workers: ", end="")
        for index, worker in enumerate(workers):
            if index:
                line.append("  ")
            if worker.killed:
                line.append(f"✗ {worker.name} (killed)", style="strike")
            elif not worker.alive:
                line.append(f"– {worker.name} (exited)", style="dim")
            elif worker.name == holder:
                line.append(f"● {worker.name} holds gen {gen}", style="bold")
            else:
                line.append(f"○ {worker.name} standby")
        self.query_one("#live-workers", Label).update(line)
        self.query_one("#live-policy", Label).update(
            Text(
                f"lost-claim policy {policy}: a killed run's events "
                + ("run again" if policy == "retry" else "wait for a human (interrupted)")
            )
        )
        # Newest first, so the latest line is never the one cut off on a small terminal.
        recent = list(reversed(story[-3:]))
        lines = [
            safe_content(line, limit=600, multiline=True, style="" if index == 0 else "dim")
            for index, line in enumerate(recent)
        ]
        self.query_one("#live-story", Static).update(Content("\n").join(lines))


class LiveDemoApp(DemoDesk):
    """The supervisor over a scratch inbox that real worker processes are running."""

    TITLE = "onwatch demo --live"
    OBSERVE_SECONDS = 0.5
    inbox: Inbox  # always one (the supervisor's is None only on a fleet desk before a choice)

    BINDINGS = [
        Binding(
            "i",
            "send_messages",
            "Send messages",
            id="live-ingest",
            tooltip="Three chat messages arrive; a worker runs them as one slow run",
        ),
        Binding(
            "K",
            "kill",
            "Kill active worker",
            id="live-kill",
            tooltip="SIGKILL the process that holds the lease, in the middle of its run",
        ),
        Binding(
            "w",
            "start_worker",
            "Start worker",
            id="live-start",
            tooltip="Start another worker process (a standby)",
        ),
        Binding(
            "t",
            "toggle_policy",
            "Policy",
            id="live-policy",
            tooltip="Switch the lost-claim policy between retry and interrupt",
        ),
    ]
    LIVE_ACTIONS = frozenset({"send_messages", "kill", "start_worker", "toggle_policy"})
    FOOTER_FIRST = LIVE_ACTIONS

    def __init__(
        self, inbox: Inbox, scratch: str, *, workers: int = 2, agent_seconds: float = AGENT_SECONDS
    ) -> None:
        super().__init__(inbox, clock=inbox.clock, read_only=False)
        self.scratch = scratch
        self.agent_seconds = agent_seconds
        self.initial_workers = workers
        self.processes: list[WorkerProcess] = []
        self.story: list[str] = []
        self.messages_sent = 0
        self._seen: Overview | None = None
        self._killed_at: dict[str, tuple[int, int]] = {}  # name → (when, its generation)
        self._observing = False

    def make_bar(self) -> Widget:
        return LiveBar(id="live")

    def key(self, action: str) -> str:
        """The key of one of the live demo's own actions, as the narration names it: read
        from its binding, so a line never names a key that does something else."""
        for binding in self.BINDINGS:
            if isinstance(binding, Binding) and binding.action == action:
                return binding.key
        raise KeyError(action)

    def on_mount(self) -> None:
        super().on_mount()
        self.tell(
            f"Starting {self.initial_workers} worker processes running the example "
            f"agent (each run takes {self.agent_seconds:g} s). Press "
            f"{self.key('send_messages')} to send messages."
        )
        for _ in range(self.initial_workers):
            self.action_start_worker(quiet=True)
        self.set_interval(self.OBSERVE_SECONDS, self._observe_soon, name="live-observe")

    # --- keys -----------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action not in self.LIVE_ACTIONS:
            return super().check_action(action, parameters)
        if self._dialog_open():
            return False
        if action == "kill":
            lease = self._seen.lease if self._seen else None
            holder = lease.holder if lease and lease.until >= self.clock.now() else None
            return True if any(w.alive and w.name == holder for w in self.processes) else None
        return True

    async def action_send_messages(self) -> None:
        texts = ("hello", "are you there?", "please summarise my day")
        first = self.messages_sent + 1
        # One transaction: the worker sees all three at once and runs them as one batch.
        await self.inbox.ingest_batch(
            [("chat", f"msg-{first + i}", {"text": text}) for i, text in enumerate(texts)]
        )
        self.messages_sent += len(texts)
        self.tell(
            f"msg-{first}…msg-{self.messages_sent} arrived. The lease holder claims them "
            f"as one run; the agent takes {self.agent_seconds:g} s — press "
            f"{self.key('kill')} meanwhile."
        )
        self.action_show_pane("running")
        await self.reload()

    async def action_kill(self) -> None:
        lease = await self.inbox.lease_info()
        now = self.clock.now()
        victim = next(
            (w for w in self.processes if lease and w.alive and w.name == lease.holder), None
        )
        if victim is None or lease is None:
            self.tell("No live worker holds the lease right now: nothing to kill.")
            return
        victim.kill()
        self._killed_at[victim.name] = (now, lease.gen)
        running = (await self.inbox.counts()).get("running", 0)
        mid = (
            f"in the middle of a run of {running} event{'s' if running != 1 else ''}"
            if running
            else "while idle"
        )
        standby = any(w.alive for w in self.processes)
        self.tell(
            f"You killed {victim.name} (SIGKILL, pid {victim.pid}) {mid}: no finish, no "
            f"release. Its lease (gen {lease.gen}) stays valid for "
            f"{max(lease.until - now, 0)} s more: a dead worker looks like a slow one "
            f"until then."
            + (
                ""
                if standby
                else f" No standby is running: press {self.key('start_worker')} to start one."
            )
        )
        self._show_live()

    def action_start_worker(self, quiet: bool = False) -> None:
        name = f"worker-{len(self.processes) + 1}"
        worker = start_worker(self.inbox.path, name, self.scratch, agent_seconds=self.agent_seconds)
        self.processes.append(worker)
        if not quiet:
            self.tell(
                f"Started {name} (pid {worker.pid}). If another worker holds the lease it "
                f"waits as a standby."
            )
        self._show_live()

    async def action_toggle_policy(self) -> None:
        policy = "interrupt" if self.inbox.settings.on_lost_claim == "retry" else "retry"
        await self.inbox.configure(on_lost_claim=policy)
        self.tell(
            f"Lost-claim policy is now {policy}. Send messages ({self.key('send_messages')}) "
            f"and kill the active worker ({self.key('kill')}) to see what a takeover does "
            f"with its run."
        )
        self._show_live()

    # --- watching the inbox and the processes -----------------------------------------------

    def tell(self, line: str) -> None:
        self.story.append(line)
        self._show_live()

    def _show_live(self) -> None:
        lease = self._seen.lease if self._seen else None
        live = lease if lease is not None and lease.until >= self.clock.now() else None
        self.query_one(LiveBar).show(
            self.processes,
            live.holder if live else None,
            live.gen if live else None,
            self.inbox.settings.on_lost_claim,
            self.story,
        )
        self.refresh_bindings()

    def _observe_soon(self) -> None:
        if self._observing or self._dialog_open():  # like the desk's poll: wait for it
            return
        self._observing = True
        self.run_worker(self._observe(), group="live", exit_on_error=False)

    async def _observe(self) -> None:
        """Narrate what the workers did since the last look: takeovers, lost runs, answers."""
        try:
            now = self.clock.now()
            seen, current = self._seen, await self.inbox.overview(now=now)
            self._seen = current
            await self._narrate(seen or current, current, now)
            self._show_live()
        finally:
            self._observing = False

    async def _narrate(self, before: Overview, after: Overview, now: int) -> None:
        old, new = before.lease, after.lease
        if (
            new is not None
            and (old is None or new.gen != old.gen)
            or (before is after and new is not None)
        ):
            if old is None or before is after:
                self.tell(
                    f"{new.holder} took the lease: generation {new.gen}. The other "
                    f"worker waits as a standby."
                )
            else:
                killed = self._killed_at.get(old.holder)
                after_kill = (
                    f", {now - killed[0]} s after {old.holder} was killed" if killed else ""
                )
                line = (
                    f"{new.holder} took over as generation {new.gen}{after_kill}: "
                    f"{old.holder}'s lease had expired."
                )
                interrupted = after.counts.get("interrupted", 0) - before.counts.get(
                    "interrupted", 0
                )
                if interrupted > 0:
                    line += (
                        f" Policy interrupt: {interrupted} event"
                        f"{'s' if interrupted != 1 else ''} of the lost run became "
                        f"interrupted and will not run again by themselves — see pane 3 "
                        f"({KEYS['resolve'].key} marks done, {KEYS['requeue'].key} "
                        f"requeues)."
                    )
                    self.action_show_pane("dead")
                else:
                    retried = [e for e in await self.inbox.events("running") if e.attempts > 1]
                    if retried:
                        line += (
                            f" Policy retry: the lost run's events run again (attempt "
                            f"{max(e.attempts for e in retried)}), one at a time: an event "
                            f"that was already attempted runs alone, in case it is the "
                            f"one that crashes."
                        )
                self.tell(line)
        done = after.counts.get("done", 0) - before.counts.get("done", 0)
        if done > 0:
            holder = new.holder if new else "a worker"
            self.tell(
                f"{holder} finished: {done} event{'s' if done != 1 else ''} done, the "
                f"replies went to the outbox in the same transaction."
            )
        for worker in self.processes:
            if not worker.alive and not worker.killed and not worker.exit_told:
                worker.exit_told = True
                self.tell(f"{worker.name} exited (see its log: {worker.log})")

    async def action_quit(self) -> None:
        self.exit(0)

    def stop_workers(self) -> None:
        for worker in self.processes:
            with contextlib.suppress(Exception):
                worker.stop()


async def open_scratch_inbox(scratch: str) -> Inbox:
    inbox = await Inbox.open(os.path.join(scratch, "live.db"), clock=SystemClock())
    await inbox.configure(**SETTINGS)
    return inbox


def main() -> int:
    """Run the live demo until the viewer quits; every worker is stopped on the way out."""
    scratch = tempfile.mkdtemp(prefix="onwatch-live-")

    async def run() -> int:
        inbox = await open_scratch_inbox(scratch)
        app = LiveDemoApp(inbox, scratch)
        try:
            code = await app.run_async()
            return code if isinstance(code, int) else (app.return_code or 0)
        finally:
            app.stop_workers()
            await inbox.close()

    try:
        return asyncio.run(run())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
