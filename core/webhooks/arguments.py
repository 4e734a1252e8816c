"""The checks on `onwatch serve`'s arguments: host, port, body limit and the names /metrics
answers under, each refused with a one-line ConfigError before anything listens."""

from __future__ import annotations

from typing import Any

from .config import ConfigError

MAX_BODY = 2**31 - 1  # bytes: far past any sane webhook, and every buffer size can hold it


def check_serve_args(args: Any) -> tuple[str, int, int | None]:
    """(host, port, max_body) of `onwatch serve` once each is one the server can take;
    raises ConfigError (one line, naming the option) otherwise."""
    host, port, max_body = args.host, args.port, args.max_body
    if (
        not isinstance(host, str)
        or not host
        or len(host) > 253
        or not host.isascii()
        or not host.isprintable()
        or " " in host
    ):
        raise ConfigError("--host must name an interface, e.g. 127.0.0.1")
    try:
        host.encode("idna")  # what the resolver will do with it: a bad label fails here
    except UnicodeError:
        raise ConfigError(f"--host {host!r} is not a host name or address") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0-65535, got {port!r}")
    if max_body is not None and (
        isinstance(max_body, bool) or not isinstance(max_body, int) or not 0 < max_body <= MAX_BODY
    ):
        raise ConfigError(f"--max-body must be 1-{MAX_BODY} bytes, got {max_body!r}")
    check_allow_hosts(getattr(args, "allow_host", None) or ())
    return host, port, max_body


def check_allow_hosts(names: Any) -> tuple[str, ...]:
    """The `--allow-host` names once each is a plain host name (no port, no scheme);
    raises ConfigError otherwise."""
    checked = []
    for name in names:
        if (
            not isinstance(name, str)
            or not name
            or len(name) > 253
            or not name.isascii()
            or not all(c.isalnum() or c in ".-_" for c in name)
        ):
            raise ConfigError(
                f"--allow-host must be a host name such as metrics.example.org (no port), "
                f"got {name!r}"
            )
        checked.append(name.lower())
    return tuple(checked)
