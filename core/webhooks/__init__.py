"""Webhook intake (`onwatch serve`): signed deliveries stored in the inbox, 2xx only once durable.

aiohttp is imported only when a server starts, so `core.webhooks.signatures` and
`core.webhooks.config` stay standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from core.text import printable

from .config import ConfigError, Secret, Secrets, config_file_warning, load_secrets
from .signatures import SignatureError

if TYPE_CHECKING:
    from core import Inbox

    from .server import RunningServer

__all__ = ["ConfigError", "Secret", "Secrets", "SignatureError", "check_args", "load_secrets",
           "main", "start_server"]


def main(args: Any) -> int:
    """Run `onwatch serve` until SIGINT/SIGTERM. `args` has .path, .host, .port, .config
    (None or a TOML file), .max_body (None or bytes) and optionally .busy_timeout (seconds).

    Returns 0 after a clean stop; 2 for bad configuration or arguments, or a PATH that is not
    an inbox (the receiver never creates one: `onwatch init PATH` does); 3 if the inbox stayed
    locked; 1 if the port cannot be bound. Each failure is one line on stderr."""
    try:
        host, port, max_body = check_args(args)
        secrets = load_secrets(os.environ, args.config)
    except ConfigError as exc:
        print(f"onwatch serve: {printable(str(exc))}", file=sys.stderr)
        return 2
    if args.config is not None and (warning := config_file_warning(args.config)):
        print(f"onwatch serve: warning: {printable(warning)}", file=sys.stderr)
    from .server import run
    return run(os.fspath(args.path), host=host, port=port, secrets=secrets, max_body=max_body,
               busy_timeout=getattr(args, "busy_timeout", 5.0),
               name=getattr(args, "inbox", "default"))


_MAX_BODY = 2**31 - 1  # bytes: far past any sane webhook, and every buffer size can hold it


def check_args(args: Any) -> tuple[str, int, int | None]:
    host, port, max_body = args.host, args.port, args.max_body
    if not isinstance(host, str) or not host or len(host) > 253 or not host.isascii() \
            or not host.isprintable() or " " in host:
        raise ConfigError("--host must name an interface, e.g. 127.0.0.1")
    try:
        host.encode("idna")  # what the resolver will do with it: a bad label fails here
    except UnicodeError:
        raise ConfigError(f"--host {host!r} is not a host name or address") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0-65535, got {port!r}")
    if max_body is not None and (isinstance(max_body, bool) or not isinstance(max_body, int)
                                 or not 0 < max_body <= _MAX_BODY):
        raise ConfigError(f"--max-body must be 1-{_MAX_BODY} bytes, got {max_body!r}")
    return host, port, max_body


async def start_server(inbox: "Inbox", *, secrets: Secrets, host: str = "127.0.0.1",
                       port: int = 0, max_body: int | None = None) -> "RunningServer":
    """Serve webhooks into an open `inbox` (see server.start_server); for tests and embedding.
    `await (await start_server(...)).close()` stops it."""
    from .server import start_server as start
    return await start(inbox, secrets=secrets, host=host, port=port, max_body=max_body)
