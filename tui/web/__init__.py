"""`onwatch web TARGET`: the supervisor desk in a browser, behind a locked door.

Each browser tab gets its own `onwatch tui TARGET [--inbox NAME] [--read-only]` process
(textual-serve runs it under Textual's web driver), so the browser shows exactly the terminal
app: the fleet desk when TARGET is a folder or a PostgreSQL database, one inbox otherwise.
`door.py` locks it (one name, one origin, login, sessions), `sessions.py` keeps the logins,
`pages.py` writes the pages, `serving.py` is the only module that knows textual-serve and owns
the desk processes.

On this machine the desk is served under a host name of its own, a random
`desk-<20 hex digits>.localhost`: browsers resolve every `*.localhost` name to the loopback
address without asking DNS, and keep cookies per host name but not per port, so under
127.0.0.1 or localhost the session cookie would also be sent to every other local server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import shlex
import signal
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TOKEN_ENV = "ONWATCH_WEB_TOKEN"
MIN_TOKEN = 16  # characters of a configured token
MIN_TOKEN_BITS = 64  # estimated entropy of a configured token (door.token_bits)
SHUTDOWN_TIMEOUT = 5.0  # seconds requests in flight get on SIGTERM, once the desks ended
SWEEP_EVERY = 60.0  # seconds between two looks for expired sessions

log = logging.getLogger("onwatch.web")


class WebConfigError(Exception):
    """A reason not to start, said in one line."""


@dataclass(frozen=True)
class Plan:
    """What `onwatch web` will serve, checked before anything listens."""

    command: str  # the desk command, for a person to read (a database URL's secrets hidden)
    target: str
    host: str
    port: int
    token: str
    token_generated: bool
    read_only: bool
    public_url: str | None
    argv: tuple[str, ...] = ()  # the desk command, as run (no shell)
    desk_host: str = ""  # the *.localhost name served under, without --public-url
    name: str = ""  # what the page calls the target
    shown: str = ""  # the target as the log says it (a database URL's secrets hidden)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plan(args: Any, environ: dict[str, str]) -> Plan:
    """Check the arguments and the environment; raises WebConfigError."""
    from onwatch.core.pg import is_url, redact

    target = os.fspath(args.target)
    inbox = getattr(args, "inbox", None)
    if is_url(target):
        shown = redact(target)
        name = urlsplit(shown).path.strip("/") or shown
        if inbox is not None:
            name += f" inbox {inbox}"
        desk = [target, *(["--inbox", inbox] if inbox is not None else [])]
        readable = [shown, *desk[1:]]
    else:
        if inbox is not None:
            raise WebConfigError(
                "--inbox picks an inbox inside a PostgreSQL database; a file is "
                "one inbox and a folder shows all of its inboxes"
            )
        if not os.path.exists(target):
            raise WebConfigError(f"no inbox at {target} (run `onwatch init {target}` first)")
        target = os.path.abspath(target)
        name = os.path.basename(target.rstrip(os.sep)) or target
        desk = readable = [target]
    host, port = args.host, args.port
    if not host:
        raise WebConfigError("--host must name an interface, e.g. 127.0.0.1")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise WebConfigError(f"--port must be 0-65535, got {port!r}")
    token = environ.get(TOKEN_ENV, "").strip()
    if token and len(token) < MIN_TOKEN:
        raise WebConfigError(
            f"${TOKEN_ENV} is too short: use {MIN_TOKEN} characters or more "
            f"(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if token:
        from .door import token_bits

        if token_bits(token) < MIN_TOKEN_BITS:
            raise WebConfigError(
                f"${TOKEN_ENV} is too easy to guess (repeated or sequential characters, or "
                f"too few kinds of them): use a random one, e.g. "
                f"python3 -c 'import secrets; print(secrets.token_urlsafe())'"
            )
    if not token and not is_loopback(host):
        raise WebConfigError(
            f"refusing to listen on {host} without ${TOKEN_ENV}: beyond this "
            f"machine the token must be one you chose and keep, not one "
            f"printed to a terminal"
        )
    public_url = getattr(args, "public_url", None)
    if public_url is not None:
        public_url = _origin(public_url)
    elif not is_loopback(host):
        raise WebConfigError(
            f"listening on {host} needs --public-url, the address browsers will use "
            f"(e.g. https://desk.example.org): the desk answers under that name only"
        )
    if is_url(target):  # last: the checks above need no server
        _check_database(target, inbox, bool(args.read_only))
    tui = [sys.executable, "-m", "onwatch", "tui"]
    options = ["--read-only"] if args.read_only else []
    argv = [*tui, *desk, *options]
    return Plan(
        command=shlex.join([*tui, *readable, *options]),
        target=target,
        host=host,
        port=port,
        token=token or secrets.token_urlsafe(32),
        token_generated=not token,
        read_only=bool(args.read_only),
        public_url=public_url,
        argv=tuple(argv),
        desk_host="" if public_url else f"desk-{secrets.token_hex(10)}.localhost",
        name=name,
        shown=shlex.join(readable),
    )


def _check_database(url: str, inbox: str | None, read_only: bool) -> None:
    """What the desk will open, opened once as it will be, before anything listens: a
    database that cannot be reached, is not onwatch's, or has no inbox `inbox`, is refused
    in one line (the desk's own words)."""
    from onwatch.core import Inbox
    from onwatch.core.errors import InboxError
    from onwatch.core.fleet import DatabaseFleet

    async def open_inbox(name: str) -> None:
        box = await Inbox.open(url, name=name, create=False, read_only=read_only)
        await box.close()

    try:
        if inbox is None:
            fleet = DatabaseFleet(url)
            try:
                fleet.check()
            finally:
                fleet.close()
        else:
            asyncio.run(open_inbox(inbox))
    except InboxError as exc:
        raise WebConfigError(str(exc)) from None


def _origin(url: str) -> str:
    """`url` as browsers write its origin (scheme://host[:port], lower case, no default
    port), which the door compares Origin and Host headers with; raises WebConfigError."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or port == -1
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or not url.isascii()
        or not url.isprintable()
    ):
        raise WebConfigError(f"--public-url must be like https://desk.example.org, got {url!r}")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def main(args: Any) -> int:
    """Serve until SIGINT/SIGTERM. 0 after a clean stop, 2 for a refused configuration,
    1 if the port cannot be bound."""
    try:
        chosen = plan(args, dict(os.environ))
    except WebConfigError as exc:
        print(f"onwatch web: {exc}", file=sys.stderr)
        return 2
    # The token stays in this process: the desks it starts (and anything they start) do not
    # inherit it through the environment.
    os.environ.pop(TOKEN_ENV, None)
    from onwatch.core.text import LineFormatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter("%(asctime)s onwatch web: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        return asyncio.run(serve(chosen))
    except KeyboardInterrupt:
        return 0
    finally:
        root.removeHandler(handler)


async def serve(chosen: Plan) -> int:
    """Run the desk's web server for `chosen` until SIGINT/SIGTERM."""
    from aiohttp import web

    from onwatch.core.webhooks.connections import (
        HEAD_TIMEOUT,
        ConnectionGuard,
        GuardedSite,
        ServerLog,
        quiet_accept_errors,
    )

    from .door import AccessLog, Door
    from .serving import desk_app
    from .sessions import Sessions

    # Stop signals are this loop's from its start: one that comes while the server starts
    # is kept, and it then stops at once and cleanly (the signal's default would end the
    # process with the port bound and the desks' processes left behind).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    name = chosen.name
    title = f"{name} · onwatch"
    guard = ConnectionGuard(log)
    websocket_url = ""
    app, desks = await desk_app(
        chosen.argv,
        title=title,
        name=f"{name} (read-only)" if chosen.read_only else name,
        websocket_url=lambda: websocket_url,
        hold=guard.hold,
    )
    sessions = Sessions(on_end=desks.end_session)
    door = Door(chosen.token, sessions, title=title)
    door.install(app)
    app.middlewares.insert(0, guard.middleware)  # outermost: it times the whole request
    runner = web.AppRunner(
        app,
        access_log_class=AccessLog,
        access_log=log,
        logger=ServerLog(log),
        keepalive_timeout=HEAD_TIMEOUT,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    await runner.setup()
    sweeping: asyncio.Task[None] | None = None
    try:
        try:
            await GuardedSite(runner, chosen.host, chosen.port, guard).start()
        except OSError as exc:
            print(
                f"onwatch web: cannot listen on {chosen.host}:{chosen.port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
        quiet_accept_errors(log)
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        origin = chosen.public_url or f"http://{chosen.desk_host}:{port}"
        door.bind(origin)
        netloc = urlsplit(origin).netloc
        websocket_url = f"{'wss' if origin.startswith('https:') else 'ws'}://{netloc}/ws"
        log.info(
            "listening on http://%s:%s as %s; serving %s%s",
            shown,
            port,
            origin,
            chosen.shown,
            " read-only" if chosen.read_only else "",
        )
        if not is_loopback(chosen.host):
            log.warning(
                "listening beyond this machine (%s): put a TLS reverse proxy in "
                "front, see docs/operating.md",
                chosen.host,
            )
        # stdout, once: the address to open, with a login code that works once (in the
        # fragment, which no request carries). Never logged: stderr has no code, no token.
        print(f"open {origin}/#code={sessions.issue_code()}", flush=True)
        if chosen.token_generated:
            print(f"token (login form, Authorization: Bearer): {chosen.token}", flush=True)

        async def sweep() -> None:
            while True:
                await asyncio.sleep(SWEEP_EVERY)
                sessions.sweep()

        sweeping = asyncio.create_task(sweep())
        await stop.wait()
        log.info("stopping: ending %d desk(s)", len(desks.processes))
    finally:
        if sweeping is not None:
            sweeping.cancel()
        sessions.end_all()
        await desks.close_all()
        await runner.cleanup()
    return 0
