"""The sandbox the `--help` examples run in: the files and inboxes they name, in the states
that make each of them do its job (tests/cli/test_help_examples.py)."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
import shutil
import stat

from onwatch.core import ApprovalRequest, Inbox, Reply

from tests.worker.helpers import ROOT

WEB_TOKEN = "a-token-of-the-operators-own-choosing"


async def _crash(text: str) -> None:
    raise asyncio.CancelledError  # the dispatcher dies mid-send


async def _run(inbox: Inbox, holder: str, now: int, **finish: object) -> list[int]:
    gen = await inbox.acquire(holder, now=now)
    assert gen is not None
    batch = [e.id for e in await inbox.claim_batch(holder, gen, now=now)]
    await inbox.finish(holder, gen, batch, now=now, **finish)  # type: ignore[arg-type]
    await inbox.release(holder, gen, now=now)
    return batch


async def make_alice(path: str) -> None:
    """alice.db, with the ids the examples name:

    events 1–6 done (chat; 2, 3 and 4 asked approvals refund-msg-2/3/4, still waiting),
    7 dead (stripe), 8 pending (chat, failed twice: in a backoff), 9 interrupted (stripe;
    its run 4 logged three lines and spent 0.02 usd), 10 pending (chat); a daily timer
    nightly-report;
    deliveries 1 and 2 uncertain (at-most-once sends cut off mid-send); one reply held for
    the next paced send; the lease released, so a worker takes it at once.
    """
    async with await Inbox.open(path) as inbox:
        await inbox.configure(
            lost_claim_by_source={"stripe": "interrupt"},
            lease_ttl=60,
            delivery="at_most_once",
            send_timeout=30,
        )
        t = inbox.now() - 3600
        for number, text in ((1, "hello"), (2, "refund 20"), (3, "refund 30")):
            await inbox.ingest("chat", f"msg-{number}", {"text": text}, now=t)
        asked = [ApprovalRequest(f"refund-msg-{n}", 8 * 3600, f"refund {n}0") for n in (2, 3)]
        assert await _run(inbox, "box-0", t, messages=["echo: hello"], approvals=asked) == [
            1,
            2,
            3,
        ]
        await _flush_cut_off(inbox, t)  # delivery 1
        await inbox.ingest("chat", "msg-4", {"text": "refund 40"}, now=t)
        asked = [ApprovalRequest("refund-msg-4", 8 * 3600, "refund 40")]
        assert await _run(inbox, "box-0", t, messages=["asked about 40"], approvals=asked) == [4]
        await _flush_cut_off(inbox, t)  # delivery 2
        for number, text in ((5, "thanks"), (6, "bye")):
            await inbox.ingest("chat", f"msg-{number}", {"text": text}, now=t)
        assert await _run(inbox, "box-0", t, messages=[Reply("echo: bye")]) == [5, 6]
        await inbox.ingest("stripe", "evt_7", {"type": "charge.refunded"}, now=t)
        assert await inbox.bury(7, reason="malformed payload", now=t)
        await inbox.ingest("chat", "msg-8", {"text": "are you there?"}, now=t)
        await inbox.ingest("stripe", "evt_9", {"type": "charge.succeeded"}, now=t)
        gen = await inbox.acquire("box-1", now=t)
        assert gen is not None
        claimed = await inbox.claim_batch("box-1", gen, now=t)
        assert [e.id for e in claimed] == [8, 9]
        run = claimed[0].run_id
        assert run == 4  # `onwatch logs alice.db 9 --run 4`
        said = [
            (0, t, "log", None, "looking up the charge", '{"charge": "ch_9"}'),
            (1, t + 1, "info", "stripe", "GET /v1/charges/ch_9 200", None),
            (2, t + 2, "spend", None, "spent 0.02 usd: model call", None),
        ]
        await inbox.append_transcript(run, said, spends=[(2, t + 2, "usd", 20_000, "model call")])
        # box-1 dies mid-run. Paused, the next claim only recovers its rows: 8 (chat, retry)
        # is pending again, 9 (stripe, interrupt) waits for a human.
        await inbox.pause(now=t)
        gen = await inbox.acquire("box-2", now=t + 61)
        assert gen is not None
        assert await inbox.claim_batch("box-2", gen, now=t + 61) == []
        await inbox.release("box-2", gen, now=t + 61)
        await inbox.resume(now=t + 61)
        await inbox.ingest("chat", "msg-10", {"text": "hello again"}, now=t + 61)
        events = {s: [e.id for e in await inbox.events(s)] for s in ("pending", "dead")}
        assert events == {"pending": [8, 10], "dead": [7]}
        assert (await inbox.get_event(9)).status == "interrupted"  # type: ignore[union-attr]
        assert [d.id for d in await inbox.uncertain_deliveries()] == [1, 2]
        assert len(await inbox.held_messages()) == 3  # two bound to the uncertain sends
        # 8 fails again and waits out a long backoff (run-now), still pending.
        await inbox.configure(backoff_base=7200, backoff_cap=7200)
        gen = await inbox.acquire("box-3")
        assert gen is not None
        assert [e.id for e in await inbox.claim_batch("box-3", gen)] == [8]  # retried: alone
        await inbox.finish("box-3", gen, [8], error="TimeoutError: the API did not answer")
        await inbox.release("box-3", gen)
        await inbox.add_timer("nightly-report", inbox.now() + 3600, None, every=86_400)


async def _flush_cut_off(inbox: Inbox, t: int) -> None:
    try:
        await inbox.flush_outbox(_crash, now=t)
    except asyncio.CancelledError:
        pass


def make_sandbox(folder: str) -> dict[str, str]:
    """Fill `folder` (the examples' working directory and $HOME) and return the environment
    the examples run in: `onwatch` on $PATH (this checkout's), examples/ importable."""
    alice = os.path.join(folder, "alice.db")
    asyncio.run(make_alice(alice))
    inboxes = os.path.join(folder, "inboxes")
    os.mkdir(inboxes)
    shutil.copy(alice, os.path.join(inboxes, "alice.db"))
    asyncio.run(make_alice(os.path.join(inboxes, "bob.db")))
    os.symlink(os.path.join(ROOT, "examples"), os.path.join(folder, "examples"))
    hooks = os.path.join(folder, "hooks.toml")
    with open(hooks, "w", encoding="utf-8") as handle:
        handle.write(
            '[github]\nsecret = "the secret typed into GitHub"\n'
            f'[hooks.chat]\nsecrets = ["whsec_{base64.b64encode(os.urandom(32)).decode()}"]\n'
        )
    os.chmod(hooks, stat.S_IRUSR | stat.S_IWUSR)
    token = os.path.join(folder, ".onwatch-web-token")
    with open(token, "w", encoding="utf-8") as handle:
        handle.write(WEB_TOKEN + "\n")
    os.chmod(token, stat.S_IRUSR | stat.S_IWUSR)
    bin_dir = os.path.join(folder, ".bin")
    os.mkdir(bin_dir)
    shim = os.path.join(bin_dir, "onwatch")
    with open(shim, "w", encoding="utf-8") as handle:
        handle.write(f'#!/bin/sh\nexec "{sys.executable}" -m onwatch "$@"\n')
    os.chmod(shim, 0o755)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ONWATCH_", "PYTEST_"))
    }
    env.update(
        HOME=folder,
        PATH=bin_dir + os.pathsep + env.get("PATH", "/usr/bin:/bin"),
        PYTHONPATH=str(ROOT),
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env
