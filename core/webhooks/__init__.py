"""Webhook intake (`onwatch serve`): signed deliveries stored in the inbox, 2xx only once durable.

aiohttp is imported only when a server starts, so `core.webhooks.signatures` and
`core.webhooks.config` stay standard library only.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Iterable

from onwatch.core.text import printable

from .arguments import check_serve_args
from .config import (
    ConfigError,
    Secret,
    Secrets,
    config_file_warning,
    load_secrets,
    take_secrets,
)
from .signatures import SignatureError

if TYPE_CHECKING:
    from onwatch.core import Inbox

    from .server import RunningServer

__all__ = [
    "ConfigError",
    "Secret",
    "Secrets",
    "SignatureError",
    "check_serve_args",
    "load_secrets",
    "main",
    "start_server",
    "take_secrets",
]


def main(args: Any) -> int:
    """Run `onwatch serve` until SIGINT/SIGTERM. `args` has .path, .host, .port, .config
    (None or a TOML file), .max_body (None or bytes) and optionally .allow_host (names
    /metrics answers under) and .busy_timeout (seconds). The secrets' environment variables
    are removed from os.environ once read.

    Returns 0 after a clean stop; 2 for bad configuration or arguments, or a PATH that is not
    an inbox (the receiver never creates one: `onwatch init PATH` does); 3 if the inbox stayed
    locked; 1 if the port cannot be bound. Each failure is one line on stderr."""
    try:
        host, port, max_body = check_serve_args(args)
        secrets = take_secrets(os.environ, args.config)
    except ConfigError as exc:
        print(f"onwatch serve: {printable(str(exc))}", file=sys.stderr)
        return 2
    if args.config is not None and (warning := config_file_warning(args.config)):
        print(f"onwatch serve: warning: {printable(warning)}", file=sys.stderr)
    from .server import run

    return run(
        os.fspath(args.path),
        host=host,
        port=port,
        secrets=secrets,
        max_body=max_body,
        busy_timeout=getattr(args, "busy_timeout", 5.0),
        name=getattr(args, "inbox", "default"),
        allow_hosts=getattr(args, "allow_host", None) or (),
    )


async def start_server(
    inbox: "Inbox",
    *,
    secrets: Secrets,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body: int | None = None,
    allow_hosts: Iterable[str] = (),
    max_connections: int | None = None,
) -> "RunningServer":
    """Serve webhooks into an open `inbox` (see server.start_server); for tests and embedding.
    `await (await start_server(...)).close()` stops it."""
    from .server import start_server as start

    return await start(
        inbox,
        secrets=secrets,
        host=host,
        port=port,
        max_body=max_body,
        allow_hosts=allow_hosts,
        max_connections=max_connections,
    )
