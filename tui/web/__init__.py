"""`onwatch web TARGET`: the supervisor desk in a browser, behind a locked door.

Each browser tab gets its own `onwatch tui TARGET [--read-only]` process (textual-serve runs it
under Textual's web driver), so the browser shows exactly the terminal app, the fleet desk
when TARGET is a folder. `door.py` locks it; `serving.py` is the only module that knows
textual-serve.
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
SHUTDOWN_TIMEOUT = 5.0  # seconds open tabs get to close on SIGTERM

log = logging.getLogger("onwatch.web")


class WebConfigError(Exception):
    """A reason not to start, said in one line."""


@dataclass(frozen=True)
class Plan:
    """What `onwatch web` will serve, checked before anything listens."""

    command: str
    target: str
    host: str
    port: int
    token: str
    token_generated: bool
    read_only: bool
    public_url: str | None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plan(args: Any, environ: dict[str, str]) -> Plan:
    """Check the arguments and the environment; raises WebConfigError."""
    target = os.fspath(args.target)
    if target.startswith(("postgresql://", "postgres://")):
        raise WebConfigError(
            "PostgreSQL targets are not available in this build; serve an "
            "inbox file or a folder of them"
        )
    if getattr(args, "inbox", None) is not None:
        raise WebConfigError(
            "--inbox picks an inbox inside a PostgreSQL database; a file is "
            "one inbox and a folder shows all of its inboxes"
        )
    if not os.path.exists(target):
        raise WebConfigError(f"no inbox at {target} (run `onwatch init {target}` first)")
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
    if not token and not is_loopback(host):
        raise WebConfigError(
            f"refusing to listen on {host} without ${TOKEN_ENV}: beyond this "
            f"machine the token must be one you chose and keep, not one "
            f"printed to a terminal"
        )
    public_url = getattr(args, "public_url", None)
    if public_url is not None:
        parts = urlsplit(public_url)
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise WebConfigError(
                f"--public-url must be like https://desk.example.org, got {public_url!r}"
            )
        public_url = f"{parts.scheme}://{parts.netloc}"
    argv = [sys.executable, "-m", "onwatch", "tui", os.path.abspath(target)]
    if args.read_only:
        argv.append("--read-only")
    return Plan(
        command=shlex.join(argv),
        target=os.path.abspath(target),
        host=host,
        port=port,
        token=token or secrets.token_urlsafe(32),
        token_generated=not token,
        read_only=bool(args.read_only),
        public_url=public_url,
    )


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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s onwatch web: %(message)s"))
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

    from .door import AccessLog, Door
    from .serving import desk_app

    door = Door(chosen.token, public_url=chosen.public_url)
    title = f"onwatch {os.path.basename(chosen.target.rstrip(os.sep)) or chosen.target}"
    app = await desk_app(
        chosen.command, title=title, public_url=chosen.public_url, middlewares=(door.middleware,)
    )
    runner = web.AppRunner(
        app, access_log_class=AccessLog, access_log=log, shutdown_timeout=SHUTDOWN_TIMEOUT
    )
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, chosen.host, chosen.port).start()
        except OSError as exc:
            print(
                f"onwatch web: cannot listen on {chosen.host}:{chosen.port}: {exc.strerror or exc}",
                file=sys.stderr,
            )
            return 1
        host, port = runner.addresses[0][:2]
        shown = f"[{host}]" if ":" in host else host
        base = chosen.public_url or f"http://{shown}:{port}"
        log.info(
            "listening on http://%s:%s; serving %s%s",
            shown,
            port,
            chosen.target,
            " read-only" if chosen.read_only else "",
        )
        if not is_loopback(chosen.host):
            log.warning(
                "listening beyond this machine (%s): put a TLS reverse proxy in "
                "front, see the README",
                chosen.host,
            )
        if chosen.token_generated:
            # stdout, once: the address to open. Never logged (stderr has no token).
            print(f"open {base}/?token={chosen.token}", flush=True)
        else:
            print(f"open {base}/?token=${TOKEN_ENV}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await stop.wait()
        log.info("stopping")
    finally:
        await runner.cleanup()
    return 0
