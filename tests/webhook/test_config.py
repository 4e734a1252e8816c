"""Secrets from the environment or a TOML file; never shown; bad configuration exits 2."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import pytest

from core.webhooks import ConfigError, Secret, Secrets, load_secrets, main
from core.webhooks.config import config_file_warning


def write(tmp_path, text: str):
    path = tmp_path / "hooks.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_environment_variables_name_the_hooks():
    secrets = load_secrets({"ONWATCH_GITHUB_SECRET": "g",
                            "ONWATCH_STRIPE_SECRET": "whsec_new,whsec_old",
                            "ONWATCH_HOOK_SECRET_HOME_ASSISTANT": "h",
                            "PATH": "/bin"}, None)
    assert secrets.for_source("github") == (b"g",)
    assert secrets.for_source("stripe") == (b"whsec_new", b"whsec_old")
    assert secrets.for_source("home_assistant") == (b"h",)
    assert secrets.for_source("ci") == ()


def test_config_file_with_every_form(tmp_path):
    path = write(tmp_path, '[github]\nsecret = "g"\n[stripe]\nsecrets = ["n", "o"]\n'
                           '[hooks.home-assistant]\nsecret = "h"\n[hooks.ci]\nsecrets = ["c"]\n')
    secrets = load_secrets({}, path)
    assert secrets.for_source("github") == (b"g",)
    assert secrets.for_source("stripe") == (b"n", b"o")
    assert secrets.for_source("home-assistant") == (b"h",)
    assert secrets.for_source("ci") == (b"c",)


def test_environment_wins_over_the_file_per_hook(tmp_path):
    path = write(tmp_path, '[github]\nsecret = "file"\n[stripe]\nsecret = "file-stripe"\n')
    secrets = load_secrets({"ONWATCH_GITHUB_SECRET": "env"}, path)
    assert secrets.for_source("github") == (b"env",)
    assert secrets.for_source("stripe") == (b"file-stripe",)
    assert "ONWATCH_GITHUB_SECRET" in secrets.describe()
    assert "config file" in secrets.describe()


@pytest.mark.parametrize("environ, message", [
    ({}, "no webhook secrets configured"),
    ({"ONWATCH_GITHUB_SECRET": ""}, "ONWATCH_GITHUB_SECRET has an empty secret"),
    ({"ONWATCH_STRIPE_SECRET": "a,,b"}, "ONWATCH_STRIPE_SECRET has an empty secret"),
    ({"ONWATCH_STRIPE_SECRET": "a, b"}, "leading or trailing whitespace"),
    ({"ONWATCH_HOOK_SECRET_": "x"}, "hook name ''"),
    ({"ONWATCH_HOOK_SECRET_A.B": "x"}, "hook name 'a.b'"),
    ({"ONWATCH_HOOK_SECRET_GITHUB": "x"}, "use ONWATCH_GITHUB_SECRET"),
])
def test_bad_environment_is_one_clear_error_without_the_value(environ, message):
    with pytest.raises(ConfigError) as info:
        load_secrets(environ, None)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("[github]\nsecret = 'a'\nsecrets = ['b']\n", "exactly one of"),
    ("[github]\nsecert = 'a'\n", "unknown key(s) secert"),
    ("[github]\nsecret = ['a']\n", "secret must be a string"),
    ("[stripe]\nsecrets = []\n", "non-empty list"),
    ("[stripe]\nsecrets = [1]\n", "non-empty list"),
    ("[gitlab]\nsecret = 'a'\n", "unknown section 'gitlab'"),
    ("[hooks.github]\nsecret = 'a'\n", "use [github]"),
    ("[hooks.'Bad Name']\nsecret = 'a'\n", "hook name 'Bad Name'"),
    ("hooks = 3\n", "'hooks' must be a table"),
    ("[github\nsecret = 'a'\n", "not valid TOML"),
    ("", "no webhook secrets configured"),
])
def test_bad_config_file_is_one_clear_error(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_secrets({}, write(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_secrets({}, tmp_path / "nope.toml")


def test_secrets_never_appear_in_reprs_or_strings(tmp_path):
    secrets = load_secrets({"ONWATCH_GITHUB_SECRET": "hunter2-gh",
                            "ONWATCH_HOOK_SECRET_CI": "hunter2-ci"},
                           write(tmp_path, '[stripe]\nsecrets = ["hunter2-st"]\n'))
    shown = " ".join([repr(secrets), str(secrets), secrets.describe(),
                      repr(secrets.routes), str(secrets.for_source("github")),
                      f"{secrets.for_source('ci')[0]}", repr(Secret(b"hunter2-x"))])
    assert "hunter2" not in shown
    assert "/hooks/github" in secrets.describe()


def test_world_readable_config_file_is_warned_about(tmp_path):
    path = write(tmp_path, '[github]\nsecret = "g"\n')
    assert config_file_warning(path) is None
    path.chmod(0o644)
    assert "chmod 600" in config_file_warning(path)


def args(path, **changes):
    values = dict(path=str(path), host="127.0.0.1", port=8787, config=None, max_body=None)
    values.update(changes)
    return SimpleNamespace(**values)


@pytest.mark.parametrize("changes, message", [
    ({}, "no webhook secrets configured"),
    ({"port": 70000}, "--port must be 0-65535"),
    ({"max_body": 0}, "--max-body must be a positive number"),
    ({"host": ""}, "--host"),
    ({"config": "/nonexistent/hooks.toml"}, "cannot read config file"),
])
def test_main_refuses_bad_configuration_with_status_2(tmp_path, monkeypatch, capsys, changes,
                                                      message):
    for name in list(os.environ):
        if name.startswith("ONWATCH_"):
            monkeypatch.delenv(name)
    assert main(args(tmp_path / "inbox.db", **changes)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "inbox.db").exists()


def test_main_refuses_a_foreign_file_status_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ONWATCH_GITHUB_SECRET", "g")
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a database, just notes\n" * 10)
    receiver_log = logging.getLogger("onwatch.webhooks")
    before = receiver_log.level, receiver_log.propagate
    assert main(args(foreign)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "onwatch serve:" in err, err
    assert foreign.read_text().startswith("not a database")
    # The receiver's logger is as it was (an embedding app's logging still gets its lines).
    assert (receiver_log.level, receiver_log.propagate) == before


def test_secrets_of_checks_names():
    with pytest.raises(ConfigError):
        Secrets.of(**{"Bad": "x"})
