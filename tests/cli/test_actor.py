"""Who did it: every command that acts is audited under a person's name — `--actor`, else
`$ONWATCH_ACTOR`, else the operating system's user — never a made-up `cli:root`. Real
processes, the audit log read from the file."""

from __future__ import annotations

import getpass
import hashlib
import os
import sqlite3
import subprocess
import sys

import pytest

from tests.worker.helpers import ROOT


def onwatch(*args: str, actor_env: str | None = None) -> subprocess.CompletedProcess:
    """Run the command line with `$ONWATCH_ACTOR` set to `actor_env`, or unset."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=str(ROOT))
    env.pop("ONWATCH_ACTOR", None)
    if actor_env is not None:
        env["ONWATCH_ACTOR"] = actor_env
    return subprocess.run(
        [sys.executable, "-m", "onwatch", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def audit(path: str) -> list[tuple[str, str, str]]:
    """(actor, action, target) of every audit entry, oldest first."""
    with sqlite3.connect(path) as db:
        return list(db.execute("SELECT actor, action, target FROM audit ORDER BY id"))


def digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


@pytest.fixture
def path(tmp_path) -> str:
    path = str(tmp_path / "alice.db")
    assert onwatch("init", path).returncode == 0
    for request in ("r1", "r2", "r3"):
        script = (
            "import asyncio\nfrom onwatch import Inbox\n"
            "async def main():\n"
            f"    async with await Inbox.open({path!r}) as inbox:\n"
            f"        await inbox.request_approval({request!r}, 3600, 'refund 40')\n"
            "asyncio.run(main())\n"
        )
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=30)
    return path


def test_the_operating_system_user_then_the_environment_then_actor(path):
    assert onwatch("approve", path, "r1").returncode == 0
    assert onwatch("deny", path, "r2", actor_env="ana").returncode == 0
    assert onwatch("expire", path, "r3", "--actor", "bo", actor_env="ana").returncode == 0
    assert onwatch("pause", path, actor_env="ana").returncode == 0
    user = getpass.getuser()
    assert audit(path) == [
        (user, "approve", "approval r1"),
        ("ana", "deny", "approval r2"),
        ("bo", "expire", "approval r3"),
        ("ana", "pause", "paused"),
    ]
    assert not any(actor.startswith("cli:") for actor, _, _ in audit(path))


@pytest.mark.parametrize(
    "args, actor_env, why",
    [
        (("approve", "{path}", "r1", "--actor", "x" * 201), None, "--actor is 201 characters"),
        (("approve", "{path}", "r1"), "y" * 300, "$ONWATCH_ACTOR is 300 characters"),
        (("approve", "{path}", "r1", "--actor", " "), None, "--actor must be a non-empty"),
        (("dispatch", "{path}", "--now"), "z" * 201, "$ONWATCH_ACTOR is 201 characters"),
    ],
)
def test_a_name_the_audit_log_refuses_is_exit_2_and_changes_nothing(path, args, actor_env, why):
    before = digest(path)
    result = onwatch(*(a.format(path=path) for a in args), actor_env=actor_env)
    assert result.returncode == 2, result.stderr
    assert why in result.stderr and result.stderr.count("\n") == 1
    assert digest(path) == before


def test_the_desk_refuses_a_bad_actor_before_it_draws(path):
    result = onwatch("tui", path, "--actor", "q" * 201)
    assert result.returncode == 2 and "--actor is 201 characters" in result.stderr
    result = onwatch("tui", path, actor_env="\udcff")
    assert result.returncode == 2, result.stderr
