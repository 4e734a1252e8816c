"""Who watches an inbox, with real processes: two `onwatch worker` processes on one file, the
one that holds the lease and the one standing by, each seen with its host and pid by the
engine (`Inbox.workers`) and by `onwatch status`; a stopped one is no longer listed."""

from __future__ import annotations

import asyncio
import json
import socket

from onwatch.core import Inbox

from .helpers import log_of, onwatch, start_worker, stop, wait_for


def workers(path):
    async def read():
        async with await Inbox.open(path) as inbox:
            return await inbox.workers()

    return asyncio.run(read())


def test_the_lease_holder_and_the_standby_are_seen_with_host_and_pid(tmp_path):
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, "lease_ttl=6").returncode == 0
    first = start_worker(path, "echo", tmp_path, "--no-dispatch", holder="A", name="a")
    second = None
    try:
        wait_for(lambda: any(w.holds for w in workers(path)), timeout=30, what="A to hold")
        second = start_worker(path, "echo", tmp_path, "--no-dispatch", holder="B", name="b")
        seen = wait_for(
            lambda: {w.holder: w for w in workers(path)} if len(workers(path)) == 2 else None,
            timeout=30,
            what="B standing by",
        )
        assert (seen["A"].holds, seen["A"].pid, seen["A"].host) == (
            True,
            first.pid,
            socket.gethostname(),
        )
        assert (seen["B"].holds, seen["B"].pid, seen["B"].gen) == (False, second.pid, None)
        status = onwatch("status", path, "--json", test_dir=tmp_path)
        listed = {w["holder"]: w for w in json.loads(status.stdout)["workers"]}
        assert listed["A"]["holds"] and listed["B"]["pid"] == second.pid
        text = onwatch("status", path, test_dir=tmp_path).stdout
        assert f"worker      A on {socket.gethostname()} pid {first.pid}: holds the lease" in text
        assert f"worker      B on {socket.gethostname()} pid {second.pid}: standing by" in text
        assert stop(first) == 0, log_of(tmp_path, "a")
        # A handed its lease back and left: B takes over, and A is no longer listed.
        wait_for(
            lambda: [(w.holder, w.holds) for w in workers(path)] == [("B", True)],
            timeout=30,
            what="B alone, holding the lease",
        )
    finally:
        stop(first)
        if second is not None:
            assert stop(second) == 0, log_of(tmp_path, "b")
    assert workers(path) == []
