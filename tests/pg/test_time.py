"""Many machines, one clock: on PostgreSQL every decision that compares instants takes "now"
from the database server, inside the transaction that decides (docs/rules.md#time).

A machine whose clock is off is played by a real process whose `time.time` is moved by a
fixed skew before onwatch is imported: everything it computes from its own clock is off by
that much, as on a machine whose clock drifted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from onwatch.core import Inbox
from tests.worker.helpers import ROOT

pytestmark = pytest.mark.slow


def skewed(seconds: float, code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `code` (`main(argv)`, plain or async, its result printed as JSON) in a process
    whose clock is `seconds` off the real time."""
    script = (
        textwrap.dedent(
            f"""
        import asyncio, json, sys, time
        _real = time.time
        time.time = lambda: _real() + {seconds!r}
        from onwatch.core import Inbox
        """
        )
        + textwrap.dedent(code)
        + textwrap.dedent(
            """
        result = main(sys.argv[1:])
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        print(json.dumps(result))
        """
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result


def answer(result: subprocess.CompletedProcess[str]):
    return json.loads(result.stdout.strip().splitlines()[-1])


ACQUIRE = """
async def main(argv):
    async with await Inbox.open(argv[0]) as inbox:
        return await inbox.acquire("B")
"""


async def test_a_worker_whose_clock_runs_ahead_cannot_take_a_live_lease(url):
    async with await Inbox.open(url) as inbox:
        await inbox.configure(lease_ttl=10)
        assert await inbox.acquire("A") == 1
        # A machine 60 s ahead would see the lease as expired 50 s ago; the server does not.
        assert answer(skewed(60, ACQUIRE, url)) is None
        assert (await inbox.lease_info()).holder == "A"
        assert await inbox.renew("A", 1) is True


INGEST = """
async def main(argv):
    async with await Inbox.open(argv[0]) as inbox:
        return await inbox.ingest("chat", "from-the-future", {"text": "hi"})
"""


async def test_an_event_from_a_machine_ten_minutes_ahead_runs_at_once(url):
    assert answer(skewed(600, INGEST, url)) is True
    async with await Inbox.open(url) as inbox:
        gen = await inbox.acquire("W")
        [event] = await inbox.claim_batch("W", gen)  # available now, not in ten minutes
        assert event.source_id == "from-the-future"
        assert abs(event.available_at - inbox.now()) <= 5


ANSWER = """
async def main(argv):
    async with await Inbox.open(argv[0]) as inbox:
        return await inbox.answer_approval("refund-1", "yes", actor="ops")
"""


async def test_an_operator_five_minutes_behind_cannot_answer_after_the_deadline(url):
    async with await Inbox.open(url) as inbox:
        now = inbox.now()
        await inbox.request_approval("refund-1", 60, "refund 40", now=now - 100)  # due 40 s ago
    assert answer(skewed(-300, ANSWER, url)) == "expired"
    async with await Inbox.open(url) as inbox:
        assert (await inbox.get_approval("refund-1")).answer == "expired"


STATUS = """
def main(argv):
    from onwatch.cli.entry import main as cli
    return cli(["status", argv[0]])
"""


async def test_a_skewed_machine_says_so_in_status_and_in_its_log(url):
    await (await Inbox.open(url)).close()
    result = skewed(45, STATUS, url)
    assert "clock       this machine is" in result.stdout
    assert "ahead of the server's clock" in result.stdout
    assert "ahead of the PostgreSQL server's by" in result.stderr  # the log line, once
    assert result.stderr.count("ahead of the PostgreSQL server's") == 1
    calm = skewed(0, STATUS, url)
    assert "clock " not in calm.stdout and "PostgreSQL server's" not in calm.stderr


async def test_the_inbox_clock_follows_the_server(url):
    """Countdowns and a worker's sleeps use Inbox.clock: on PostgreSQL it follows the server,
    so they agree with the decisions."""
    code = """
async def main(argv):
    async with await Inbox.open(argv[0]) as inbox:
        await inbox.counts()
        return [inbox.now(), inbox.clock_offset]
"""
    async with await Inbox.open(url) as inbox:
        await inbox.counts()
        here = inbox.now()
    there, offset = answer(skewed(-3600, code, url))
    assert abs(there - here) <= 5
    assert 3590 <= offset <= 3610
