"""Secrets from the environment or a TOML file; never shown; bad configuration exits 2."""

from __future__ import annotations

import base64
import logging
import os
from types import SimpleNamespace

import pytest

from onwatch.core.webhooks import ConfigError, Secret, Secrets, load_secrets, main
from onwatch.core.webhooks.config import config_file_warning, reserved_sources

# Standard Webhooks secrets (the generic hooks' scheme) and the keys they decode to.
H = "whsec_" + base64.b64encode(b"home-assistant-key-01").decode()
C = "whsec_" + base64.b64encode(b"ci-hook-key-0123456789").decode()


def write(tmp_path, text: str):
    path = tmp_path / "hooks.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_environment_variables_name_the_hooks():
    secrets = load_secrets(
        {
            "ONWATCH_GITHUB_SECRET": "g",
            "ONWATCH_STRIPE_SECRET": "whsec_new,whsec_old",
            "ONWATCH_HOOK_SECRET_HOME_ASSISTANT": H,
            "PATH": "/bin",
        },
        None,
    )
    assert secrets.for_source("github") == (b"g",)
    # Stripe's whsec_ secret is used as it is; a Standard Webhooks one is decoded to its key.
    assert secrets.for_source("stripe") == (b"whsec_new", b"whsec_old")
    assert secrets.for_source("home_assistant") == (b"home-assistant-key-01",)
    assert secrets.for_source("ci") == ()


def test_config_file_with_every_form(tmp_path):
    path = write(
        tmp_path,
        '[github]\nsecret = "g"\n[stripe]\nsecrets = ["n", "o"]\n'
        f'[hooks.home-assistant]\nsecret = "{H}"\n'
        f'[hooks.ci]\nsecrets = ["{C}", "{H.rstrip("=")}"]\n',
    )
    secrets = load_secrets({}, path)
    assert secrets.for_source("github") == (b"g",)
    assert secrets.for_source("stripe") == (b"n", b"o")
    assert secrets.for_source("home-assistant") == (b"home-assistant-key-01",)
    # Several secrets (rotation); padding may be left off, as some senders print it.
    assert secrets.for_source("ci") == (b"ci-hook-key-0123456789", b"home-assistant-key-01")


def test_environment_wins_over_the_file_per_hook(tmp_path):
    path = write(tmp_path, '[github]\nsecret = "file"\n[stripe]\nsecret = "file-stripe"\n')
    secrets = load_secrets({"ONWATCH_GITHUB_SECRET": "env"}, path)
    assert secrets.for_source("github") == (b"env",)
    assert secrets.for_source("stripe") == (b"file-stripe",)
    assert "ONWATCH_GITHUB_SECRET" in secrets.describe()
    assert "config file" in secrets.describe()


@pytest.mark.parametrize(
    "environ, message",
    [
        ({}, "no webhook secrets configured"),
        ({"ONWATCH_GITHUB_SECRET": ""}, "ONWATCH_GITHUB_SECRET has an empty secret"),
        ({"ONWATCH_STRIPE_SECRET": "a,,b"}, "ONWATCH_STRIPE_SECRET has an empty secret"),
        ({"ONWATCH_STRIPE_SECRET": "a, b"}, "leading or trailing whitespace"),
        ({"ONWATCH_HOOK_SECRET_": "x"}, "hook name ''"),
        ({"ONWATCH_HOOK_SECRET_A.B": "x"}, "hook name 'a.b'"),
        ({"ONWATCH_HOOK_SECRET_GITHUB": "x"}, "use ONWATCH_GITHUB_SECRET"),
        ({"ONWATCH_HOOK_SECRET_APPROVAL": H}, "hook name 'approval' is reserved"),
        ({"ONWATCH_HOOK_SECRET_TIMER": H}, "hook name 'timer' is reserved"),
        ({"ONWATCH_HOOK_SECRET_CI": "ci-secret"}, "a Standard Webhooks secret is 'whsec_'"),
        ({"ONWATCH_HOOK_SECRET_CI": "whsec_***"}, "a Standard Webhooks secret is 'whsec_'"),
        (
            {"ONWATCH_HOOK_SECRET_CI": "whsec_" + base64.b64encode(b"short").decode()},
            "at least 16 bytes",
        ),
        ({"ONWATCH_HOOK_SECRET_CI": f"{C},whsec_"}, "a Standard Webhooks secret is 'whsec_'"),
        ({"ONWATCH_HOOK_SECRET_CI": "whsec_\udcff\udcfe"}, "not valid UTF-8"),
    ],
)
def test_bad_environment_is_one_clear_error_without_the_value(environ, message):
    with pytest.raises(ConfigError) as info:
        load_secrets(environ, None)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[github]\nsecret = 'a'\nsecrets = ['b']\n", "exactly one of"),
        ("[github]\nsecert = 'a'\n", "unknown key(s) secert"),
        ("[github]\nsecret = ['a']\n", "secret must be a string"),
        ("[stripe]\nsecrets = []\n", "non-empty list"),
        ("[stripe]\nsecrets = [1]\n", "non-empty list"),
        ("[gitlab]\nsecret = 'a'\n", "unknown section 'gitlab'"),
        ("[hooks.github]\nsecret = 'a'\n", "use [github]"),
        ("[hooks.'Bad Name']\nsecret = 'a'\n", "hook name 'Bad Name'"),
        (f"[hooks.approval]\nsecret = '{H}'\n", "hook name 'approval' is reserved"),
        (f"[hooks.timer]\nsecrets = ['{H}']\n", "hook name 'timer' is reserved"),
        ("[approval]\nsecret = 'a'\n", "unknown section 'approval'"),
        ("[hooks.ci]\nsecret = 'ci-secret'\n", "[hooks.ci]: a Standard Webhooks secret"),
        ("[hooks.ci]\nsecrets = " + "[" * 5000 + "]" * 5000 + "\n", "config file"),
        (
            "[github]\nsecret = '" + "x" * 100 + "'\n[stripe]\nsecret = 1.5\n",
            "secret must be a string",
        ),
        ("hooks = 3\n", "'hooks' must be a table"),
        ("[github\nsecret = 'a'\n", "not valid TOML"),
        ("", "no webhook secrets configured"),
    ],
)
def test_bad_config_file_is_one_clear_error(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        load_secrets({}, write(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_unreadable_or_impossible_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_secrets({}, tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_secrets({}, str(tmp_path / "a\x00b.toml"))
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[github]\nsecret = '\xe9'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_secrets({}, latin)


def test_reserved_names_follow_the_engine():
    # The engine's list when it exports one, else the two sources it writes itself.
    assert {"approval", "timer"} <= set(reserved_sources())
    for name in reserved_sources():
        with pytest.raises(ConfigError, match="reserved"):
            Secrets.of(**{name: H})


def test_secrets_never_appear_in_reprs_or_strings(tmp_path):
    secrets = load_secrets(
        {
            "ONWATCH_GITHUB_SECRET": "hunter2-gh",
            "ONWATCH_HOOK_SECRET_CI": "whsec_aHVudGVyMi1jaS1rZXktMTIzNA==",
        },
        write(tmp_path, '[stripe]\nsecrets = ["hunter2-st"]\n'),
    )
    shown = " ".join(
        [
            repr(secrets),
            str(secrets),
            secrets.describe(),
            repr(secrets.routes),
            str(secrets.for_source("github")),
            f"{secrets.for_source('ci')[0]}",
            repr(Secret(b"hunter2-x")),
        ]
    )
    assert "hunter2" not in shown and "aHVudGVy" not in shown
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


@pytest.mark.parametrize(
    "changes, message",
    [
        ({}, "no webhook secrets configured"),
        ({"port": 70000}, "--port must be 0-65535"),
        ({"max_body": 0}, "--max-body must be 1-"),
        ({"host": ""}, "--host"),
        ({"config": "/nonexistent/hooks.toml"}, "cannot read config file"),
        ({"port": 2**64}, "--port must be 0-65535"),
        ({"max_body": 2**63}, "--max-body must be 1-"),
        ({"host": "a\x00b"}, "--host"),
        ({"host": "h\udcff"}, "--host"),
        ({"config": "x\x00y"}, "cannot read config file"),
        ({"config": "line\nbreak.toml"}, "cannot read config file"),
    ],
)
def test_main_refuses_bad_configuration_with_status_2(
    tmp_path, monkeypatch, capsys, changes, message
):
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


@pytest.mark.parametrize("source", ["environment", "file"])
@pytest.mark.parametrize("name", ["approval", "timer"])
def test_serve_refuses_a_hook_named_after_an_engine_source(
    tmp_path, monkeypatch, capsys, source, name
):
    """Class 5: /hooks/approval would let any signer forge approval answers."""
    for variable in list(os.environ):
        if variable.startswith("ONWATCH_"):
            monkeypatch.delenv(variable)
    config = None
    if source == "environment":
        monkeypatch.setenv(f"ONWATCH_HOOK_SECRET_{name.upper()}", H)
    else:
        config = write(tmp_path, f'[hooks.{name}]\nsecret = "{H}"\n')
    assert main(args(tmp_path / "inbox.db", config=config)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"hook name '{name}' is reserved" in err, err
    assert not (tmp_path / "inbox.db").exists()


# --- totality: whatever the configuration holds, a Secrets or one ConfigError line ----------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_NAMES = st.sampled_from(
    [
        "ONWATCH_GITHUB_SECRET",
        "ONWATCH_STRIPE_SECRET",
        "ONWATCH_HOOK_SECRET_CI",
        "ONWATCH_HOOK_SECRET_APPROVAL",
        "ONWATCH_HOOK_SECRET_",
        "ONWATCH_HOOK_SECRET_\udcff",
        "ONWATCH_HOOK_SECRET_A-B",
    ]
) | st.text(max_size=30)
_VALUES = st.sampled_from([H, C, f"{H},{C}", "whsec_", ",", "\udcff", "x" * 100_000]) | st.text(
    max_size=60
)
_ANY = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.lists(st.text(max_size=10) | st.integers(), max_size=3)
)


def _one_line_config_error(call) -> None:
    try:
        call()
    except ConfigError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(environ=st.dictionaries(_NAMES, _VALUES, max_size=4))
def test_any_environment_gives_secrets_or_one_config_error(environ):
    _one_line_config_error(lambda: load_secrets(environ, None))


_FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=200, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(
    text=st.binary(max_size=300)
    | st.sampled_from(
        [
            b"[hooks.ci]\nsecret = 1\n",
            b"[hooks]\nci = 'x'\n",
            b"[[github]]\nsecret = 'a'\n",
            b"[stripe]\nsecrets = [[]]\n",
            b"[hooks.ci.deeper]\nsecret = 'a'\n",
            b'[github]\nsecret = "\\u0000"\n',
            b"[hooks.ci]\nsecrets = [" + b"[" * 3000 + b"]" * 3000 + b"]\n",
        ]
    )
)
def test_any_config_file_gives_secrets_or_one_config_error(tmp_path, text):
    path = tmp_path / "any.toml"
    path.write_bytes(text)
    _one_line_config_error(lambda: load_secrets({}, path))


@given(name=st.text(max_size=70), value=_ANY)
def test_secrets_of_takes_anything_or_one_config_error(name, value):
    _one_line_config_error(lambda: Secrets.of(**{name: value}))


@settings(max_examples=150, deadline=None)
@given(host=_ANY, port=_ANY, max_body=_ANY)
def test_serve_arguments_of_any_type_are_accepted_or_one_config_error(host, port, max_body):
    from onwatch.core.webhooks.arguments import check_serve_args

    try:
        check_serve_args(SimpleNamespace(host=host, port=port, max_body=max_body))
    except ConfigError as exc:
        assert "\n" not in str(exc)


@pytest.mark.parametrize("path", ["x" * 5000, "a\x00b.db", "\ud800.db"])
def test_serve_refuses_a_path_it_cannot_open_with_status_2(tmp_path, monkeypatch, capsys, path):
    monkeypatch.setenv("ONWATCH_GITHUB_SECRET", "g")
    monkeypatch.chdir(tmp_path)
    assert main(args(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("onwatch serve: "), err
    assert list(tmp_path.iterdir()) == []
