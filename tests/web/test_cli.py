"""`onwatch web` refuses what it cannot serve safely, in one line, exit 2, before listening."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tui.cli import main


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "alice.db"
    assert main(["init", str(path)]) == 0
    return path


@pytest.mark.parametrize("argv, env, message", [
    (["--host", "0.0.0.0"], {}, "refusing to listen on 0.0.0.0 without $ONWATCH_WEB_TOKEN"),
    (["--host", "192.168.1.5"], {}, "without $ONWATCH_WEB_TOKEN"),
    ([], {"ONWATCH_WEB_TOKEN": "short"}, "ONWATCH_WEB_TOKEN is too short"),
    (["--inbox", "alice"], {}, "--inbox picks an inbox inside a PostgreSQL database"),
    (["--public-url", "desk.example.org"], {}, "--public-url must be like"),
    (["--public-url", "https://desk.example.org/x?y"], {}, "--public-url must be like"),
    (["--port", "70000"], {}, "--port must be 0-65535"),
])
def test_refusals(db, capsys, monkeypatch, argv, env, message):
    monkeypatch.delenv("ONWATCH_WEB_TOKEN", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["web", str(db), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_target_and_postgres_are_refused(tmp_path, capsys):
    assert main(["web", str(tmp_path / "nope.db")]) == 2
    assert "no inbox at" in capsys.readouterr().err
    assert main(["web", "postgresql://localhost/agents"]) == 2
    assert "PostgreSQL targets are not available" in capsys.readouterr().err


def test_a_folder_is_served_as_the_fleet_desk(tmp_path):
    from tui.web import plan

    class Args:
        target, inbox, host, port, read_only, public_url = \
            str(tmp_path), None, "127.0.0.1", 8000, True, None
    chosen = plan(Args, {})
    assert chosen.command.endswith(f"tui {tmp_path} --read-only")
    assert chosen.token_generated and len(chosen.token) >= 40


def test_configured_token_allows_another_interface_and_stays_out_of_the_desks(db, tmp_path):
    """A chosen token may listen beyond loopback; it is not printed, and the tui processes the
    server starts do not inherit it (checked on the real process's children)."""
    token = "a-long-chosen-token-0123456789"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")},
           "ONWATCH_WEB_TOKEN": token}
    probe = ("import os, sys, tui.web as w\n"
             "class A: target, inbox, host, port, read_only, public_url = "
             f"{str(db)!r}, None, '0.0.0.0', 0, False, None\n"
             "p = w.plan(A, dict(os.environ))\n"
             "os.environ.pop(w.TOKEN_ENV, None)\n"
             "print(p.token_generated, p.token == os.environ.get('X', p.token), "
             "w.TOKEN_ENV in os.environ)\n")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.split() == ["False", "True", "False"], out.stderr
