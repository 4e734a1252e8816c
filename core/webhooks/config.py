"""Webhook secrets: read from environment variables or a TOML file, never printed.

Environment (a comma-separated list is several secrets, for rotation):

    ONWATCH_GITHUB_SECRET           /hooks/github
    ONWATCH_STRIPE_SECRET           /hooks/stripe  (the endpoint's whsec_… signing secret)
    ONWATCH_HOOK_SECRET_<SOURCE>    /hooks/<source>  (<source> is SOURCE lower-cased, so
                                    ..._HOME_ASSISTANT serves /hooks/home_assistant; a
                                    name with "-" is configured in the file). Signed with
                                    Standard Webhooks: the secret is whsec_<base64>.

Config file (`--config FILE`):

    [github]
    secret = "…"                    # or: secrets = ["new", "old"]
    [stripe]
    secrets = ["whsec_new", "whsec_old"]
    [hooks.ci]
    secret = "…"

For one route, an environment variable wins over the file. A route with no secret is not
served at all (404). The engine's own sources (`approval`, `timer`) cannot be hook names: a
delivery under them would forge an approval answer or a timer tick.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field
from typing import Iterable, Mapping, MutableMapping

from ..checks import RESERVED_SOURCES

PROVIDERS = ("github", "stripe")
SOURCE_PATTERN = r"[a-z0-9][a-z0-9_-]{0,63}"
_SOURCE = re.compile(SOURCE_PATTERN)
ENV_GITHUB = "ONWATCH_GITHUB_SECRET"
ENV_STRIPE = "ONWATCH_STRIPE_SECRET"
ENV_HOOK_PREFIX = "ONWATCH_HOOK_SECRET_"
STANDARD_PREFIX = "whsec_"
MIN_STANDARD_KEY = 16  # bytes: below 128 bits a key can be guessed offline from one delivery


class ConfigError(ValueError):
    """The secrets configuration is unusable; the message is one line for a person."""


class Secret(bytes):
    """A webhook secret: usable wherever bytes are (hmac), redacted whenever printed."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class Route:
    """The secrets of one hook and where they came from (for the start-up line)."""

    secrets: tuple[Secret, ...]
    origin: str  # an environment variable's name, or "config file"

    def __repr__(self) -> str:
        return f"Route({len(self.secrets)} secret(s) from {self.origin})"


@dataclass(frozen=True)
class Secrets:
    """Which hooks are served and their secrets: `routes` maps a source name (`github`,
    `stripe`, or a generic source) to its Route. The repr never shows a secret."""

    routes: Mapping[str, Route] = field(default_factory=dict)

    @classmethod
    def of(cls, **sources: str | bytes | Iterable[str | bytes]) -> "Secrets":
        """Build from keyword arguments, e.g. `Secrets.of(github="s", stripe=["new", "old"],
        ci="t")` (tests and embedding). Raises ConfigError."""
        routes = {}
        for name, value in sources.items():
            _check_source(name, "Secrets.of")
            secrets = _secret_list(f"secret for {name!r}", value)
            if name not in PROVIDERS:
                secrets = _standard_keys(f"secret for {name!r}", secrets)
            routes[name] = Route(secrets, "arguments")
        return cls(routes)

    def for_source(self, source: str) -> tuple[Secret, ...]:
        """The secrets accepted on /hooks/<source>; empty if that hook is not configured."""
        route = self.routes.get(source)
        return route.secrets if route else ()

    def describe(self) -> str:
        """One line naming the served hooks and where their secrets came from."""
        if not self.routes:
            return "no hooks"
        return ", ".join(
            f"/hooks/{name} ({len(route.secrets)} secret"
            f"{'s' if len(route.secrets) != 1 else ''} from {route.origin})"
            for name, route in sorted(self.routes.items())
        )

    def __repr__(self) -> str:
        return f"Secrets({', '.join(sorted(self.routes)) or 'none'})"


def load_secrets(environ: Mapping[str, str], config_path: str | os.PathLike[str] | None) -> Secrets:
    """Secrets from `config_path` (optional TOML file) overlaid by `environ`. Raises
    ConfigError (one line, naming the variable or key, never a secret's value) if anything is
    malformed or if no hook at all ends up configured."""
    routes: dict[str, Route] = {}
    if config_path is not None:
        routes.update(_from_file(os.fspath(config_path)))
    routes.update(_from_environ(environ))
    if not routes:
        raise ConfigError(
            f"no webhook secrets configured: set {ENV_GITHUB}, {ENV_STRIPE} or "
            f"{ENV_HOOK_PREFIX}<SOURCE>, or pass --config FILE"
        )
    return Secrets(routes)


def is_secret_variable(name: str) -> bool:
    """Whether an environment variable's name is one this module reads secrets from."""
    return name in (ENV_GITHUB, ENV_STRIPE) or name.startswith(ENV_HOOK_PREFIX)


def take_secrets(
    environ: MutableMapping[str, str], config_path: str | os.PathLike[str] | None
) -> Secrets:
    """`load_secrets`, then the secret variables removed from `environ` (pass os.environ),
    so that nothing this process starts (a reply channel's command, an agent's tools)
    inherits them. Raises ConfigError, and then removes nothing."""
    secrets = load_secrets(environ, config_path)
    for name in [name for name in environ if is_secret_variable(name)]:
        del environ[name]
    return secrets


def config_file_warning(path: str | os.PathLike[str]) -> str | None:
    """A warning if the config file can be read by other users (it holds secrets)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (
            f"config file {os.fspath(path)} is readable by other users; "
            f"run: chmod 600 {os.fspath(path)}"
        )
    return None


def reserved_sources() -> tuple[str, ...]:
    """The sources the engine writes itself (approval answers, timer ticks): no hook may
    take their names."""
    return tuple(RESERVED_SOURCES)


def _check_source(name: str, where: str) -> None:
    if not isinstance(name, str) or not _SOURCE.fullmatch(name):
        raise ConfigError(
            f"{where}: hook name {name!r} must be 1-64 characters of a-z, 0-9, "
            f"'_' or '-', starting with a letter or digit"
        )
    if name in reserved_sources():
        raise ConfigError(
            f"{where}: hook name {name!r} is reserved for the engine's own "
            f"events (approval answers, timers); choose another name"
        )


def _standard_keys(where: str, secrets: tuple[Secret, ...]) -> tuple[Secret, ...]:
    """Standard Webhooks secrets (whsec_<base64>) → the HMAC keys they encode."""
    keys = []
    for secret in secrets:
        text = secret.decode("utf-8", "replace")
        encoded = text[len(STANDARD_PREFIX) :] if text.startswith(STANDARD_PREFIX) else None
        key = b""
        if encoded:
            try:  # senders print it with or without the trailing '=' padding
                key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
            except (binascii.Error, ValueError):
                key = b""
        if len(key) < MIN_STANDARD_KEY:
            raise ConfigError(
                f"{where}: a Standard Webhooks secret is {STANDARD_PREFIX!r} "
                f"followed by base64 of at least {MIN_STANDARD_KEY} bytes (the "
                f"body-only X-Onwatch-Signature scheme is gone; see docs/operating.md)"
            )
        keys.append(Secret(key))
    return tuple(keys)


def _secret_list(where: str, value: object) -> tuple[Secret, ...]:
    items = [value] if isinstance(value, (str, bytes)) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ConfigError(f"{where} must be a string or a non-empty list of strings")
    secrets = []
    for item in items:
        if isinstance(item, str):
            try:  # an environment value may hold undecodable bytes (surrogate escapes)
                item = item.encode("utf-8")
            except UnicodeEncodeError:
                raise ConfigError(f"{where} is not valid UTF-8 text") from None
        if not isinstance(item, bytes):
            raise ConfigError(f"{where} must be a string or a non-empty list of strings")
        if not item:
            raise ConfigError(f"{where} has an empty secret")
        if item != item.strip():
            raise ConfigError(
                f"{where} has a secret with leading or trailing whitespace; "
                f"remove it (signatures would never match)"
            )
        secrets.append(Secret(item))
    return tuple(secrets)


def _from_environ(environ: Mapping[str, str]) -> dict[str, Route]:
    routes: dict[str, Route] = {}
    for name, value in environ.items():
        if name == ENV_GITHUB:
            source = "github"
        elif name == ENV_STRIPE:
            source = "stripe"
        elif name.startswith(ENV_HOOK_PREFIX):
            source = name[len(ENV_HOOK_PREFIX) :].lower()
            if source in PROVIDERS:
                raise ConfigError(
                    f"{name}: use {ENV_GITHUB if source == 'github' else ENV_STRIPE}"
                    f" for /hooks/{source}"
                )
            _check_source(source, name)
        else:
            continue
        secrets = _secret_list(name, value.split(","))
        if source not in PROVIDERS:
            secrets = _standard_keys(name, secrets)
        routes[source] = Route(secrets, name)
    return routes


def _from_file(path: str) -> dict[str, Route]:
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    except ValueError:  # a NUL in the path
        raise ConfigError(f"cannot read config file {path!r}: not a valid path") from None
    except RecursionError:
        raise ConfigError(f"config file {path} is nested too deeply") from None
    routes: dict[str, Route] = {}
    for key, table in data.items():
        if key in PROVIDERS:
            routes[key] = _route_table(path, f"[{key}]", table)
        elif key == "hooks":
            if not isinstance(table, dict):
                raise ConfigError(
                    f"config file {path}: 'hooks' must be a table of [hooks.<source>] tables"
                )
            for source, sub in table.items():
                where = f"[hooks.{source}]"
                _check_source(source, f"config file {path}: {where}")
                if source in PROVIDERS:
                    raise ConfigError(f"config file {path}: use [{source}], not {where}")
                route = _route_table(path, where, sub)
                routes[source] = Route(
                    _standard_keys(f"config file {path}: {where}", route.secrets), route.origin
                )
        else:
            raise ConfigError(
                f"config file {path}: unknown section {key!r} "
                f"(expected [github], [stripe] or [hooks.<source>])"
            )
    return routes


def _route_table(path: str, where: str, table: object) -> Route:
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: {where} must be a table")
    unknown = set(table) - {"secret", "secrets"}
    if unknown:
        raise ConfigError(
            f"config file {path}: {where} has unknown key(s) "
            f"{', '.join(sorted(unknown))} (expected secret or secrets)"
        )
    if len(table) != 1:
        raise ConfigError(
            f'config file {path}: {where} needs exactly one of secret = "…" or secrets = ["…", …]'
        )
    ((key, value),) = table.items()
    if key == "secret" and not isinstance(value, str):
        raise ConfigError(f"config file {path}: {where} secret must be a string")
    return Route(_secret_list(f"config file {path}: {where} {key}", value), "config file")
