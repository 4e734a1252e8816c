"""`onwatch web` refuses what it cannot serve safely, in one line, exit 2, before listening."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from onwatch.cli import main

from .helpers import WebProcess


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "alice.db"
    assert main(["init", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--host", "0.0.0.0"], {}, "refusing to listen on 0.0.0.0 without $ONWATCH_WEB_TOKEN"),
        (["--host", "192.168.1.5"], {}, "without $ONWATCH_WEB_TOKEN"),
        ([], {"ONWATCH_WEB_TOKEN": "short"}, "ONWATCH_WEB_TOKEN is too short"),
        # long enough, but guessable: refused whatever the interface
        ([], {"ONWATCH_WEB_TOKEN": "aaaaaaaaaaaaaaaa"}, "ONWATCH_WEB_TOKEN is too easy to guess"),
        (
            ["--host", "0.0.0.0", "--public-url", "https://desk.example.org"],
            {"ONWATCH_WEB_TOKEN": "aaaaaaaaaaaaaaaa"},
            "ONWATCH_WEB_TOKEN is too easy to guess",
        ),
        (
            [],
            {"ONWATCH_WEB_TOKEN": "password12345678"},
            "ONWATCH_WEB_TOKEN is too easy to guess",
        ),
        # beyond loopback the desk must know the name browsers use, to check Host and Origin
        (
            ["--host", "0.0.0.0"],
            {"ONWATCH_WEB_TOKEN": "a-long-chosen-token-0123456789"},
            "listening on 0.0.0.0 needs --public-url",
        ),
        (["--public-url", "https://user:pw@desk.example.org"], {}, "--public-url must be like"),
        (["--inbox", "alice"], {}, "--inbox picks an inbox inside a PostgreSQL database"),
        (["--public-url", "desk.example.org"], {}, "--public-url must be like"),
        (["--public-url", "https://desk.example.org/x?y"], {}, "--public-url must be like"),
        (["--port", "70000"], {}, "argument --port: expected a port from 0 to 65535"),
    ],
)
def test_refusals(db, capsys, monkeypatch, argv, env, message):
    monkeypatch.delenv("ONWATCH_WEB_TOKEN", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["web", str(db), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_missing_target_and_an_unreachable_database_are_refused(tmp_path, capsys):
    assert main(["web", str(tmp_path / "nope.db")]) == 2
    assert "no inbox at" in capsys.readouterr().err
    assert main(["web", "postgresql://127.0.0.1:1/agents"]) == 2  # nothing listens there
    err = capsys.readouterr().err
    assert "connection failed" in err and err.count("\n") == 1


def test_a_folder_is_served_as_the_fleet_desk(tmp_path):
    from onwatch.tui.web import plan

    class Args:
        target, inbox, host, port, read_only, public_url = (
            str(tmp_path),
            None,
            "127.0.0.1",
            8000,
            True,
            None,
        )

    chosen = plan(Args, {})
    assert chosen.command.endswith(f"tui {tmp_path} --read-only")
    assert chosen.token_generated and len(chosen.token) >= 40


def test_a_configured_token_may_listen_beyond_loopback_behind_its_public_name(db):
    from onwatch.tui.web import plan

    class Args:
        target, inbox, host, port, read_only = str(db), None, "0.0.0.0", 0, False
        public_url = "https://Desk.Example.org:443/"

    chosen = plan(Args, {"ONWATCH_WEB_TOKEN": "a-long-chosen-token-0123456789"})
    assert not chosen.token_generated and chosen.token == "a-long-chosen-token-0123456789"
    assert chosen.public_url == "https://desk.example.org" and chosen.desk_host == ""


def test_on_this_machine_the_desk_gets_a_random_name_of_its_own(db):
    from onwatch.tui.web import plan

    class Args:
        target, inbox, host, port, read_only, public_url = (
            str(db),
            None,
            "127.0.0.1",
            0,
            False,
            None,
        )

    names = {plan(Args, {}).desk_host for _ in range(3)}
    assert len(names) == 3
    assert all(re.fullmatch(r"desk-[0-9a-f]{20}\.localhost", name) for name in names)


async def test_a_configured_token_is_not_printed_nor_inherited_by_the_desks(db, tmp_path):
    """The real process: the token from the environment is never printed (the printed link
    carries a one-time code instead), and the tui process a browser connection starts has
    neither it nor a webhook secret in its environment."""
    token = "a-long-chosen-token-0123456789"
    web = WebProcess(
        db,
        tmp_path,
        env={
            "ONWATCH_WEB_TOKEN": token,
            "ONWATCH_HOOK_SECRET_CI": "whsec_c2VjcmV0LWtleS1ieXRlcy0xMjM0",
        },
    ).start()
    try:
        assert web.token == "" and web.code
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(
                f"http://127.0.0.1:{web.port}/ws?width=80&height=24",
                headers={
                    "Authorization": f"Bearer {token}",
                    "Origin": web.origin,
                    "Host": web.host,
                },
            ) as ws:
                screen = b""
                deadline = time.monotonic() + 20
                while b"Pending" not in screen and time.monotonic() < deadline:
                    message = await ws.receive(timeout=20)
                    if isinstance(message.data, bytes):
                        screen += message.data
                desks = children(web.proc.pid)
                assert desks, "no desk process was started"
                for pid in desks:
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    assert any(item.startswith(b"TEXTUAL_DRIVER=") for item in environ)
                    assert not [item for item in environ if token.encode() in item]
                    assert not [item for item in environ if b"SECRET" in item]
    finally:
        assert web.stop() == 0
    assert token not in web.out.read_text() + web.err.read_text()


def children(pid: int) -> list[int]:
    """Descendants of `pid` (Linux /proc): the shell textual-serve starts and what it runs."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            with open(f"/proc/{parent}/task/{task}/children") as handle:
                kids = [int(p) for p in handle.read().split()]
            found += kids
            queue += kids
    return found


# `onwatch web` whose server signals its own process the moment its port is bound: the
# narrowest window between listening and serving, made certain instead of raced.
SIGNALLED_AT_BIND = """
import os, signal, sys
from onwatch.core.webhooks import connections
from onwatch.cli import main

start = connections.GuardedSite.start

async def bound_then_signalled(self):
    await start(self)
    os.kill(os.getpid(), signal.SIGTERM)

connections.GuardedSite.start = bound_then_signalled
sys.exit(main(["web", os.environ["INBOX"], "--port", "0"]))
"""


def test_a_stop_signal_the_moment_the_port_is_bound_stops_it_cleanly(tmp_path):
    path = tmp_path / "inbox.db"
    assert main(["init", str(path)]) == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")}
    done = subprocess.run(
        [sys.executable, "-c", SIGNALLED_AT_BIND],
        env={**env, "INBOX": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr  # not -15: the signal's default never ran
    assert "stopping: ending 0 desk(s)" in done.stderr


def test_a_database_is_served_as_its_fleet_desk_or_one_of_its_inboxes(capsys):
    """A postgresql:// target: the fleet desk over the database, or `--inbox NAME`; checked
    before anything listens, with the desk's own words; a password in the URL is in the
    desk's command but neither in what is printed nor in the page's name."""
    import asyncio

    from onwatch.core import Inbox
    from onwatch.tui.web import plan
    from tests.pg.server import cluster_or_skip

    url = cluster_or_skip().new_database()

    async def make() -> None:
        async with await Inbox.open(url, name="alpha"):
            pass

    asyncio.run(make())
    secret = url + "?password=sekrit"

    class Args:
        target, inbox, host, port, read_only, public_url = (
            secret,
            None,
            "127.0.0.1",
            0,
            False,
            None,
        )

    fleet = plan(Args, {})
    assert fleet.argv[-2:] == ("tui", secret)
    Args.inbox = "alpha"
    one = plan(Args, {})
    assert one.argv[-4:] == ("tui", secret, "--inbox", "alpha")
    database = url.rsplit("/", 1)[1]
    assert (fleet.name, one.name) == (database, f"{database} inbox alpha")
    for chosen in (fleet, one):
        assert "sekrit" not in chosen.command + chosen.name + chosen.shown
    assert main(["web", url, "--inbox", "nobody"]) == 2
    err = capsys.readouterr().err
    assert "no inbox 'nobody'" in err and err.count("\n") == 1
    assert main(["web", url.rsplit("/", 1)[0] + "/no_such_database"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1
