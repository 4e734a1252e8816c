"""The one place that knows textual-serve: an aiohttp app that runs a desk process per browser
tab, and owns those processes' whole lives.

textual-serve (the Textual project's browser server) gives the terminal's scripts, the
websocket protocol and the process per connection running the desk under Textual's web
driver. onwatch uses its app only (`Server.serve()` owns the event loop, logging and an
access log that would write query strings) and replaces what was not safe to keep:

- the page is onwatch's own (pages.py): title, phone viewport, focus, a logout button, no
  font from elsewhere, a strict Content-Security-Policy;
- a desk process is started without a shell, in a session of its own, with an environment
  that holds no token and no webhook secret, and named by the login it serves
  (`ONWATCH_ACTOR=web:<user>/<session>`);
- desks are capped per session (`MAX_DESKS_PER_SESSION`) and overall (`MAX_DESKS`); past a
  cap the tab shows why, in its terminal, and no process starts;
- every desk process ends with its websocket (a closed tab, a logout, an expired session,
  even while it is still starting) and with the server: asked to quit, then SIGTERM to its
  process group, then SIGKILL, each after a grace period.

Private parts used (`Server._make_app`, `Server._process_messages`, `AppService` and its
`_open_app_process`/`_build_environment`/`_task`/`_process`) are pinned by
tests/web/test_serving.py, so an upgrade that moves them fails there, not in a browser.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import signal
from typing import Any, Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Middleware
from textual_serve.app_service import AppService
from textual_serve.server import Server

from .door import NOTE, desk_response
from .pages import desk_page
from .sessions import SESSION, Session

log = logging.getLogger("onwatch.web")

MAX_DESKS_PER_SESSION = 4  # tabs one login may have open at once
MAX_DESKS = 12  # desk processes at once, all logins together (each is a Textual app)
QUIT_GRACE = 3.0  # seconds a desk has to quit when asked, before SIGTERM
TERM_GRACE = 2.0  # seconds after SIGTERM, before SIGKILL
HEARTBEAT = 15.0  # seconds between websocket pings: a vanished browser is noticed


def desk_environment(environ: dict[str, str], actor: str) -> dict[str, str]:
    """What a desk process may see of this process's environment: everything but the web
    token and the webhook secrets, plus who it acts as."""
    from onwatch.core.webhooks.config import is_secret_variable

    from . import TOKEN_ENV

    clean = {
        name: value
        for name, value in environ.items()
        if name != TOKEN_ENV and not is_secret_variable(name)
    }
    clean["ONWATCH_ACTOR"] = actor
    return clean


class _Desk(AppService):
    """One desk process: started without a shell in a process group of its own, ended for
    certain (see `stop`)."""

    def __init__(self, argv: Sequence[str], actor: str, **kwargs: Any) -> None:
        super().__init__(" ".join(argv), **kwargs)
        self.argv, self.actor = list(argv), actor

    async def _open_app_process(self, width: int = 80, height: int = 24) -> Any:
        environment = desk_environment(self._build_environment(width, height), self.actor)
        self._process = process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=environment,
            start_new_session=True,  # its own process group: one signal reaches all of it
        )
        assert process.stdin is not None
        self._stdin = process.stdin
        return process

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def stop(self) -> None:
        """Ask the desk to quit; SIGTERM its process group after QUIT_GRACE seconds, SIGKILL
        after TERM_GRACE more. Returns once the process has exited."""
        process = self._process
        if process is None:
            return
        with contextlib.suppress(Exception):
            await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
        if process.returncode is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send_meta({"type": "quit"}), 1.0)
            for grace, signum in ((QUIT_GRACE, signal.SIGTERM), (TERM_GRACE, signal.SIGKILL)):
                try:
                    await asyncio.wait_for(asyncio.shield(process.wait()), grace)
                    break
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signum)
            await process.wait()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)


class DeskServer(Server):
    """textual-serve's Server with onwatch's page and desk processes (module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        title: str,
        name: str,
        websocket_url: Callable[[], str],
        hold: Callable[[web.Request], None] | None = None,
        user: str | None = None,
    ) -> None:
        super().__init__(
            " ".join(argv), host="127.0.0.1", port=0, title=title, public_url="http://127.0.0.1"
        )
        self.argv = list(argv)
        self.name = name
        self.websocket_url = websocket_url
        self.hold = hold
        self.user = user or _user()
        self.desks: set[web.WebSocketResponse] = set()
        self.processes: set[_Desk] = set()
        self.max_desks, self.max_per_session = MAX_DESKS, MAX_DESKS_PER_SESSION

    async def on_startup(self, app: web.Application) -> None:
        """textual-serve prints a banner here; onwatch says where it listens itself."""

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        static = request.app.router["static"].url_for(filename="/")
        html = desk_page(
            title=self.title,
            name=self.name,
            websocket_url=self.websocket_url(),
            static_url=str(static).rstrip("/") + "/",
            font_size=_int(request.query.get("fontsize"), 16),
        )
        return desk_response(html)

    def _refusal(self, session: Session | None) -> str | None:
        if session is not None and len(session.desks) >= self.max_per_session:
            return (
                f"{len(session.desks)} desks are open under this login already, the most "
                f"one login may have. Close one of those tabs, then open this one again."
            )
        if len(self.desks) >= self.max_desks:
            return (
                f"{len(self.desks)} desks are open already, the most this server runs at "
                f"once. Close a tab somewhere, then open this one again."
            )
        return None

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        session: Session | None = request.get(SESSION)
        websocket = web.WebSocketResponse(heartbeat=HEARTBEAT)
        await websocket.prepare(request)
        if self.hold is not None:
            self.hold(request)  # a websocket lives as long as its tab: no request timeout
        refusal = self._refusal(session)
        if refusal is not None:
            request[NOTE] = f"too many desks (session {_label(session)})"
            await websocket.send_bytes(f"\r\n  onwatch: {refusal}\r\n".encode())
            await websocket.close(code=1008, message=b"too many desks")
            return websocket
        width = _int(request.query.get("width"), 80, low=10, high=1000)
        height = _int(request.query.get("height"), 24, low=5, high=500)
        desk = _Desk(
            self.argv,
            f"web:{self.user}/{_label(session)}",
            write_bytes=websocket.send_bytes,
            write_str=websocket.send_str,
            close=websocket.close,
            download_manager=self.download_manager,
        )
        self.desks.add(websocket)
        self.processes.add(desk)
        if session is not None:
            session.desks.add(websocket)
        try:
            await desk.start(width, height)
            await self._process_messages(websocket, desk)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a browser sending garbage ends its own desk, quietly
            request[NOTE] = f"desk ended: {type(exc).__name__} (session {_label(session)})"
        finally:
            self.desks.discard(websocket)
            if session is not None:
                session.desks.discard(websocket)
            try:
                await desk.stop()
            finally:
                self.processes.discard(desk)
                with contextlib.suppress(Exception):
                    await websocket.close()
        return websocket

    def end_session(self, session: Session) -> None:
        """Close every desk of `session` (logout, expiry): each handler then ends its
        process."""
        for websocket in list(session.desks):
            asyncio.ensure_future(websocket.close(code=1000, message=b"session ended"))

    async def close_all(self, timeout: float = QUIT_GRACE + TERM_GRACE + 5.0) -> None:
        """End every desk and wait for its process to exit (the server is stopping)."""
        for websocket in list(self.desks):
            with contextlib.suppress(Exception):
                await websocket.close(code=1001, message=b"server stopping")
        deadline = asyncio.get_running_loop().time() + timeout
        while self.processes and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for desk in list(self.processes):  # a handler that could not finish: no leftovers
            if desk.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(desk.pid, signal.SIGKILL)


def _label(session: Session | None) -> str:
    return session.label if session is not None else "none"


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def _int(text: str | None, default: int, *, low: int = 6, high: int = 64) -> int:
    try:
        return max(low, min(int(text), high)) if text is not None else default
    except ValueError:
        return default


async def desk_app(
    argv: Sequence[str],
    *,
    title: str,
    name: str | None = None,
    websocket_url: Callable[[], str],
    middlewares: tuple[Middleware, ...] = (),
    hold: Callable[[web.Request], None] | None = None,
) -> tuple[web.Application, DeskServer]:
    """An aiohttp app serving the desk command `argv` to browsers: `/` the page, `/ws` the
    websocket that runs one desk process per connection, `/static/…` its scripts;
    `middlewares` run before every route. Returns the app and its DeskServer (whose
    `close_all` ends every desk)."""
    server = DeskServer(
        argv, title=title, name=name or title, websocket_url=websocket_url, hold=hold
    )
    app = await server._make_app()
    app.middlewares.extend(middlewares)
    return app, server
