"""The `onwatch` command line: outputs, one-line errors, exit codes, stable --json."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from tests.worker.helpers import ROOT
from onwatch import cli


def run(capsys, *args, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        import io

        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("onwatch") and "Traceback" not in err


@pytest.fixture
def path(tmp_path, capsys) -> str:
    path = str(tmp_path / "alice.db")
    assert run(capsys, "init", path) == (0, f"created: {path}\n", "")
    return path


def test_help_lists_commands_examples_and_exit_codes(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for word in (
        "init",
        "ingest",
        "status",
        "worker",
        "dispatch",
        "approve",
        "examples (every command's --help has its own):",
        "exit codes",
    ):
        assert word in out
    for sub in ("worker", "status", "config", "dispatch", "ingest", "serve", "tui"):
        code, out, _ = run(capsys, sub, "--help")
        assert code == 0 and "usage: onwatch " + sub in out


def test_usage_errors_are_one_line_and_exit_2(capsys, path):
    for args in (
        (),
        ("status",),
        ("frobnicate", path),
        ("cancel", path, "not-a-number"),
        ("events", path, "sleeping"),
        ("worker", path),
    ):
        code, out, err = run(capsys, *args)
        assert code == 2, args
        if args:
            assert one_line_error(err), (args, err)


def test_out_of_range_numbers_and_an_empty_path_are_usage_errors(capsys, path):
    huge = str(2**64)  # past SQLite's INTEGER: used to end as an 'internal error'
    agent = ("--agent", "examples.refund_agent:handle")
    for args in (
        ("show", path, huge),
        ("requeue", path, huge),
        ("events", path, "--after", huge),
        ("approvals", path, "--limit", huge),
        ("status", path, "--busy-timeout", "nan"),
        ("status", path, "--busy-timeout", "inf"),
        ("ingest", path, "c", "1", "--busy-timeout", "0"),
        ("worker", path, *agent, "--poll", "nan"),
        ("worker", path, *agent, "--grace", "-1"),
        ("worker", path, *agent, "--max-runs", "0"),
        ("init", ""),
        ("status", ""),
    ):
        code, out, err = run(capsys, *args)
        assert code == 2 and out == "" and one_line_error(err), (args, err)
        assert "argument" in err, (args, err)  # names the option or argument at fault
    assert run(capsys, "events", path)[1] == ""  # nothing was ingested


def test_init_is_idempotent_and_takes_settings(capsys, path):
    code, out, _ = run(capsys, "init", path, "max_pending=10", "--json")
    data = json.loads(out)
    assert code == 0 and data["created"] is False and data["settings"]["max_pending"] == 10


def test_ingest_prints_stored_then_duplicate_and_both_exit_0(capsys, path, monkeypatch):
    assert run(capsys, "ingest", path, "chat", "m1", '{"text": "hi"}') == (0, "stored\n", "")
    assert run(capsys, "ingest", path, "chat", "m1", '{"text": "hi"}') == (0, "duplicate\n", "")
    code, out, _ = run(
        capsys, "ingest", path, "hook", "d1", "-", stdin="[1, 2]", monkeypatch=monkeypatch
    )
    assert code == 0 and out == "stored\n"
    code, out, _ = run(capsys, "ingest", path, "hook", "d2", "--json")
    assert json.loads(out) == {"source": "hook", "source_id": "d2", "stored": True}
    code, out, _ = run(capsys, "show", path, "2", "--json")
    assert json.loads(out)["event"]["payload"] == [1, 2]


def test_bad_input_and_foreign_files_exit_2_with_one_line(capsys, path, tmp_path):
    code, _, err = run(capsys, "ingest", path, "chat", "m1", "{not json")
    assert code == 2 and one_line_error(err) and "not valid JSON" in err
    code, _, err = run(capsys, "ingest", path, "", "m1")
    assert code == 2 and one_line_error(err)
    code, _, err = run(capsys, "ingest", path, "chat", "m2", "[" * 100_000 + "]" * 100_000)
    assert code == 2 and one_line_error(err) and "nested too deeply" in err
    foreign = tmp_path / "notes.txt"
    foreign.write_text("hello")
    code, _, err = run(capsys, "status", foreign)
    assert code == 2 and one_line_error(err) and "not an onwatch inbox" in err
    code, _, err = run(capsys, "status", tmp_path / "missing.db")
    assert code == 2 and one_line_error(err) and "onwatch init" in err
    assert not (tmp_path / "missing.db").exists()


def test_status_json_is_stable_and_documented(capsys, path):
    run(capsys, "ingest", path, "chat", "m1", "{}")
    run(capsys, "config", path, "max_pending=100", "max_runs_per_day=50")
    code, out, _ = run(capsys, "status", path, "--json")
    assert code == 0
    assert out == json.dumps(json.loads(out), sort_keys=True, ensure_ascii=False) + "\n"
    data = json.loads(out)
    documented = {
        "path",
        "now",
        "counts",
        "lease",
        "lease_ttl",
        "on_lost_claim",
        "takeovers",
        "refused_writes",
        "paused",
        "outbox_held",
        "held_messages",
        "next_send_at",
        "next_timer_due",
        "waiting_approvals",
        "runs_last_day",
        "budgets",
    }
    assert documented <= set(data)
    _, help_text, _ = run(capsys, "status", "--help")
    for key in documented:
        assert key in help_text
    assert data["counts"]["pending"] == 1 and data["lease"] is None
    assert data["budgets"]["max_pending"] == {"excess": "refused", "limit": 100, "used": 1}
    assert data["budgets"]["max_runs_per_day"] == {"excess": "delayed", "limit": 50, "used": 0}
    assert data["budgets"]["max_followups_per_run"]["excess"] == "refused"
    assert data["budgets"]["max_run_seconds"]["excess"] == "lost claim"
    code, out, _ = run(capsys, "status", path)
    assert code == 0 and "budgets" in out and "max_pending" in out and "1 / 100" in out


def test_config_shows_sets_and_validates(capsys, path):
    code, out, _ = run(capsys, "config", path)
    assert code == 0 and "lease_ttl = 120" in out and "max_pending = null" in out
    code, out, _ = run(
        capsys,
        "config",
        path,
        "on_lost_claim=interrupt",
        "max_pending=5",
        'lost_claim_by_source={"stripe": "retry"}',
    )
    assert code == 0 and 'on_lost_claim = "interrupt"   (was "retry")' in out
    code, out, _ = run(capsys, "config", path, "max_pending=unlimited", "--json")
    assert json.loads(out)["max_pending"] is None
    for bad in (
        "max_pending=-1",
        "lease_ttl=1.5",
        "bogus=1",
        "on_lost_claim=maybe",
        "no-equals-sign",
    ):
        code, _, err = run(capsys, "config", path, bad)
        assert code == 2 and one_line_error(err), bad


def test_settings_may_come_after_an_option(capsys, tmp_path):
    """`onwatch config URL --inbox a max_batch=1` is how people type it: argparse ends the
    positionals at the first option, so the settings after it are taken here. Anything
    else left over is refused as before, and nothing is stored."""
    path = str(tmp_path / "after.db")
    assert run(capsys, "init", path, "--busy-timeout", "2", "max_batch=4")[0] == 0
    code, out, _ = run(capsys, "config", path, "--json", "max_pending=7", "outbox_gap=60")
    assert code == 0
    stored = json.loads(out)
    assert (stored["max_batch"], stored["max_pending"], stored["outbox_gap"]) == (4, 7, 60)
    for stray in ("stray", "--stray", "-x=1"):
        code, _, err = run(capsys, "config", path, "--json", "max_pending=9", stray)
        assert code == 2 and one_line_error(err) and "unrecognized arguments" in err, stray
    code, _, err = run(capsys, "status", path, "--json", "max_pending=9")
    assert code == 2 and "unrecognized arguments: max_pending=9" in err  # no settings here
    assert json.loads(run(capsys, "config", path, "--json")[1])["max_pending"] == 7


def test_budget_max_pending_refusal_exits_1(capsys, path):
    run(capsys, "config", path, "max_pending=1")
    assert run(capsys, "ingest", path, "chat", "m1", "{}")[0] == 0
    code, _, err = run(capsys, "ingest", path, "chat", "m2", "{}")
    assert code == 1 and one_line_error(err) and "max_pending" in err
    assert run(capsys, "ingest", path, "chat", "m1", "{}") == (0, "duplicate\n", "")


def test_event_actions_say_whether_they_applied(capsys, path):
    run(capsys, "ingest", path, "chat", "m1", "{}")
    code, out, err = run(capsys, "cancel", path, "1", "--actor", "ana", "--reason", "spam")
    assert (code, out) == (0, "cancel: event 1 was pending, is now cancelled\n")
    code, out, err = run(capsys, "cancel", path, "1")
    assert code == 1 and out == "" and one_line_error(err) and "cancelled" in err
    code, out, _ = run(capsys, "requeue", path, "1", "--expect", "dead", "--json")
    assert code == 1 and json.loads(out)["applied"] is False
    assert "changed meanwhile" in json.loads(out)["reason"]
    code, out, _ = run(capsys, "requeue", path, "1", "--json")
    assert code == 0 and json.loads(out) == {
        "action": "requeue",
        "applied": True,
        "before": "cancelled",
        "event_id": 1,
        "reason": None,
        "status": "pending",
    }
    assert run(capsys, "bury", path, "1")[0] == 0
    assert run(capsys, "resolve", path, "1")[0] == 1
    code, _, err = run(capsys, "cancel", path, "99")
    assert code == 1 and "no such event" in err


def test_audit_lists_who_did_what_oldest_first_and_filters_by_target(capsys, path):
    run(capsys, "ingest", path, "chat", "m1", "{}")
    run(capsys, "ingest", path, "chat", "m2", "{}")
    assert run(capsys, "cancel", path, "1", "--actor", "ana", "--reason", "spam")[0] == 0
    assert run(capsys, "cancel", path, "1", "--actor", "bo")[0] == 1  # refused: audited too
    assert run(capsys, "bury", path, "2", "--actor", "ana", "--reason", "poison")[0] == 0
    assert run(capsys, "pause", path, "--actor", "cy")[0] == 0
    code, out, err = run(capsys, "audit", path)
    assert (code, err) == (0, "")
    rows = [line.split("\t")[1:] for line in out.splitlines()]
    assert rows == [
        ["ana", "cancel", "event 1", "pending → cancelled", "applied: spam"],
        [
            "bo",
            "cancel",
            "event 1",
            "cancelled (unchanged)",
            "refused: cannot cancel a cancelled event (only pending)",
        ],
        ["ana", "bury", "event 2", "pending → dead", "applied: poison"],
        ["cy", "pause", "paused", "false → true", "applied"],
    ]
    code, out, _ = run(capsys, "audit", path, "--target", "event 1", "--limit", "1", "--json")
    [entry] = json.loads(out)
    assert (entry["actor"], entry["action"], entry["applied"]) == ("bo", "cancel", False)
    assert run(capsys, "audit", path, "--target", "event 99")[:2] == (0, "")


def test_answers_print_the_standing_outcome(capsys, path):
    import asyncio

    from onwatch.core import Inbox

    async def ask():
        async with await Inbox.open(path) as inbox:
            await inbox.request_approval("r1", 3600, "refund 5")
            await inbox.request_approval("r2", 3600, "refund 6")

    asyncio.run(ask())
    code, out, _ = run(capsys, "approvals", path)
    assert code == 0 and "r1\trefund 5\twaiting" in out
    assert run(capsys, "approve", path, "r1", "--actor", "ana")[:2] == (0, "yes\n")
    # Approving it again changes nothing: exit 1, as the audit log says refused.
    code, out, err = run(capsys, "approve", path, "r1")
    assert (code, out) == (1, "yes\n") and "the answer that stands is 'yes'" in err
    code, out, _ = run(capsys, "approve", path, "r1", "--json")
    assert code == 1 and json.loads(out) == {
        "applied": False,
        "request_id": "r1",
        "standing": "yes",
    }
    code, out, _ = run(capsys, "audit", path, "--target", "approval r1")
    assert [line.split("\t")[-1] for line in out.splitlines()] == [
        "applied",
        "refused: already answered",
        "refused: already answered",
    ]
    code, out, err = run(capsys, "deny", path, "r1")
    assert (code, out) == (1, "yes\n") and "the answer that stands is 'yes'" in err
    assert err.startswith("onwatch: deny not applied to r1")  # not "no not applied"
    assert run(capsys, "expire", path, "r2")[:2] == (0, "expired\n")
    code, out, _ = run(capsys, "approve", path, "r2", "--json")
    assert code == 1 and json.loads(out) == {
        "applied": False,
        "request_id": "r2",
        "standing": "expired",
    }
    code, out, err = run(capsys, "approve", path, "never-asked")
    assert (code, out) == (1, "unknown\n") and "no such request" in err


def test_a_switch_already_set_exits_1_as_its_audit_entry_says(capsys, path):
    assert run(capsys, "pause", path)[:2] == (
        0,
        "execution paused: claims return nothing, intake goes on\n",
    )
    code, out, err = run(capsys, "pause", path)
    assert (code, out) == (
        1,
        "already so: execution paused: claims return nothing, intake goes on\n",
    )
    assert err == "onwatch: pause not applied to paused: it was already so; nothing changed\n"
    code, out, _ = run(capsys, "pause", path, "--json")
    assert code == 1 and json.loads(out) == {"changed": False, "paused": True}
    audit = run(capsys, "audit", path, "--target", "paused")[1].splitlines()
    assert [line.split("\t")[-1] for line in audit] == [
        "applied",
        *["refused: no reason recorded"] * 2,
    ]
    assert "PAUSED" in run(capsys, "status", path)[1]
    assert run(capsys, "resume", path)[0] == 0
    assert run(capsys, "hold", path)[0] == 0
    assert "HELD" in run(capsys, "status", path)[1]
    assert run(capsys, "release", path)[0] == 0


def _queue(path, *bodies):
    import asyncio

    from onwatch.core import Inbox

    async def queue():
        async with await Inbox.open(path) as inbox:
            for body in bodies:
                await inbox.ingest("chat", f"q{body}", None)
            gen = await inbox.acquire("t")
            batch = await inbox.claim_batch("t", gen)
            await inbox.finish("t", gen, [e.id for e in batch], messages=list(bodies))
            await inbox.release("t", gen)

    asyncio.run(queue())


def test_dispatch_channels(capsys, path, tmp_path):
    _queue(path, "one", "two")
    sent = tmp_path / "sent.jsonl"
    code, out, err = run(capsys, "dispatch", path, "--file", sent)
    assert code == 0 and "2 message(s) sent" in err
    [line] = sent.read_text().splitlines()
    record = json.loads(line)
    assert record["text"] == "one\n\ntwo" and record["count"] == 2
    assert record["key"].startswith("onwatch-") and sorted(record) == ["at", "count", "key", "text"]
    _queue(path, "three")
    code, out, err = run(capsys, "dispatch", path, "--stdout")
    assert code == 0 and out == "" and "nothing sent" in err and "next send allowed" in err
    code, out, err = run(capsys, "dispatch", path, "--command", "exit 7", "--now")
    assert code == 1 and one_line_error(err) and "exited with 7" in err
    assert run(capsys, "status", path, "--json")[1].count('"held_messages": 1') == 1
    target = tmp_path / "piped.txt"
    code, out, err = run(
        capsys,
        "dispatch",
        path,
        "--now",
        "--command",
        f'cat > {target}; printf "\\n%s\\n" "$ONWATCH_DELIVERY_KEY" >> {target}',
    )
    assert code == 0
    text, key = target.read_text().split("\n")[:2]
    assert text == "three" and key.startswith("onwatch-")


def test_show_and_events_list_what_an_operator_needs(capsys, path):
    run(capsys, "ingest", path, "chat", "m1", '{"text": "[bold]hi[/]"}')
    code, out, _ = run(capsys, "events", path)
    assert code == 0 and out.startswith("1\tchat\tm1\tpending")
    code, out, _ = run(capsys, "events", path, "done", "--json")
    assert json.loads(out) == []
    code, out, _ = run(capsys, "show", path, "1")
    assert code == 0 and "[bold]hi[/]" in out
    assert run(capsys, "show", path, "7")[0] == 1


def test_missing_ui_modules_are_reported_not_crashed(capsys, path, monkeypatch):
    real = cli.running.importlib.import_module

    def missing(name, *args):
        if name in ("onwatch.tui.app", "onwatch.tui.demo", "onwatch.core.webhooks"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(cli.running.importlib, "import_module", missing)
    for args in (("tui", path), ("demo",), ("serve", path)):
        code, _, err = run(capsys, *args)
        assert code == 2 and one_line_error(err) and "not available in this build" in err


def test_serve_hands_its_arguments_to_the_webhook_receiver(capsys, path, monkeypatch):
    seen = {}
    fake = types.SimpleNamespace(main=lambda args: seen.update(vars(args)) or 0)
    monkeypatch.setattr(cli.running, "lazy", lambda module, what: fake)
    code, _, _ = run(
        capsys, "serve", path, "--port", "9000", "--max-body", "1000", "--config", "hooks.toml"
    )
    assert code == 0
    assert (seen["path"], seen["host"], seen["port"], seen["config"], seen["max_body"]) == (
        path,
        "127.0.0.1",
        9000,
        "hooks.toml",
        1000,
    )


def test_tui_and_demo_are_called_lazily(capsys, path, monkeypatch):
    calls = []
    fake = types.SimpleNamespace(run=lambda *a, **k: calls.append((a, k)) or 0)
    monkeypatch.setattr(cli.running, "lazy", lambda module, what: fake)
    monkeypatch.setenv("ONWATCH_ACTOR", "ana")
    assert run(capsys, "tui", path, "--read-only")[0] == 0
    assert run(capsys, "demo", "--live")[0] == 0
    assert calls == [((path,), {"read_only": True, "actor": "ana"}), ((), {"live": True})]


def test_status_never_imports_textual(path):
    code = (
        "import sys; import cli; rc = cli.main(['status', sys.argv[1]]); "
        "bad = [m for m in ('textual', 'rich') if m in sys.modules]; "
        "sys.exit(10 if bad else rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, path], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_the_console_script_runs(path):
    result = subprocess.run(
        [sys.executable, "-m", "onwatch", "status", path, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0 and json.loads(result.stdout)["path"] == path


def test_worker_agent_errors_are_one_line(capsys, path, tmp_path):
    for spec, words in (
        ("nocolon", "module:function"),
        ("no_such_module_xyz:handle", "cannot import"),
        ("examples.refund_agent:nope", "no function"),
        (f"{tmp_path}/missing.py:handle", "no file"),
    ):
        code, _, err = run(capsys, "worker", path, "--agent", spec)
        assert code == 2 and one_line_error(err) and words in err, (spec, err)


def test_worker_runs_an_agent_from_a_file_and_stops_after_max_runs(path, tmp_path):
    agent = tmp_path / "my_agent.py"
    agent.write_text(
        "async def handle(batch, ctx):\n"
        "    ctx.reply('seen ' + ', '.join(e.source_id for e in batch))\n"
    )
    subprocess.run(
        [sys.executable, "-m", "onwatch", "ingest", path, "chat", "a1"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onwatch",
            "worker",
            path,
            "--agent",
            f"{agent}:handle",
            "--max-runs",
            "1",
            "--holder",
            "file-agent",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "seen a1\n"
    assert "1 run(s), 1 done" in result.stderr and "Traceback" not in result.stderr


def test_an_agent_file_is_loaded_once_as_a_real_module(tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n"
        "@dataclass\n"
        "class Note:\n"
        "    text: str\n"
        "STATE = {}\n"
        "def setup(inbox):\n"
        "    STATE['ready'] = True\n"
        "async def handle(batch, ctx):\n"
        "    ctx.reply(Note(str(STATE)).text)\n"
    )
    setup = cli.running.load_callable(f"{agent}:setup", "--setup")  # a dataclass under
    handle = cli.running.load_callable(f"{agent}:handle", "--agent")  # string annotations loads
    try:
        setup(None)
        assert handle.__globals__ is setup.__globals__  # the setup's state reaches the agent
        assert handle.__globals__["STATE"] == {"ready": True}
    finally:
        sys.modules.pop(handle.__module__, None)


def test_a_failing_setup_is_reported_as_the_setups_failure(path, tmp_path):
    agent = tmp_path / "agent.py"
    agent.write_text(
        "def setup(inbox):\n    raise KeyError('timers')\nasync def handle(batch, ctx):\n    pass\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onwatch",
            "worker",
            path,
            "--agent",
            f"{agent}:handle",
            "--setup",
            f"{agent}:setup",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and one_line_error(result.stderr), result.stderr
    assert f"--setup {agent}:setup failed: KeyError: 'timers'" in result.stderr


@pytest.mark.parametrize("flag, where", [((), "loop"), (("--commits-off-loop",), "connection")])
def test_commits_off_loop_keeps_a_workers_claims_and_finishes_off_its_loop(
    capsys, path, monkeypatch, flag, where
):
    import threading

    from onwatch.core.engine import runs

    main, seen = threading.get_ident(), []
    for name in ("claim_next", "finish", "finish_and_claim"):
        real = getattr(runs, name)

        def spied(*args, real=real, **kwargs):
            seen.append("loop" if threading.get_ident() == main else "connection")
            return real(*args, **kwargs)

        monkeypatch.setattr(runs, name, spied)
    assert run(capsys, "ingest", path, "chat", "m1", "{}")[0] == 0
    agent = ("--agent", "tests.worker.agents:echo", "--poll", "0.05", "--max-runs", "1")
    code, _, err = run(capsys, "worker", path, *agent, "--no-dispatch", *flag)
    assert code == 0, err
    assert "1 run(s), 1 done" in err
    assert seen and set(seen) == {where}
