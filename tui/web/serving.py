"""The one place that knows textual-serve: an aiohttp app that runs a command per browser tab.

textual-serve (the Textual project's browser server) gives the page, its xterm.js front end,
the websocket protocol and one process per connection running `command` under Textual's web
driver. Its `Server.serve()` owns the event loop, logging and the access log (which would
write query strings, tokens included), so onwatch uses the app only: `Server._make_app()` is
private API, pinned by `tests/web/test_serving.py`, and so is the page's template context
rebuilt in `_DeskServer.handle_index`.
"""

from __future__ import annotations

from typing import Any

import aiohttp_jinja2
from aiohttp import web
from aiohttp.typedefs import Middleware
from textual_serve.server import Server


class _DeskServer(Server):
    """textual-serve's Server, quiet, with page URLs that follow the browser's address."""

    def __init__(self, command: str, *, title: str, public_url: str | None) -> None:
        super().__init__(
            command,
            host="127.0.0.1",
            port=0,
            title=title,
            public_url=public_url or "http://127.0.0.1",
        )
        self._fixed_url = public_url.rstrip("/") if public_url else None

    async def on_startup(self, app: web.Application) -> None:
        """textual-serve prints a banner here; onwatch says where it listens itself."""

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        # textual-serve writes absolute URLs from one fixed public_url; without --public-url
        # they follow the address the browser used (localhost or 127.0.0.1 or a LAN name),
        # so the websocket goes to the origin that holds the session cookie.
        base = self._fixed_url or f"{request.scheme}://{request.host}"
        websocket = request.app.router["websocket"].url_for()
        static = request.app.router["static"].url_for(filename="/")
        scheme = "wss" if base.startswith("https:") else "ws"
        context: dict[str, Any] = {
            "font_size": _int(request.query.get("fontsize"), 16),
            "app_websocket_url": f"{scheme}:{base.split(':', 1)[1]}{websocket}",
            "config": {"static": {"url": f"{base}{static}".rstrip("/") + "/"}},
            "application": {"name": self.title},
        }
        return aiohttp_jinja2.render_template("app_index.html", request, context)


def _int(text: str | None, default: int) -> int:
    try:
        return max(6, min(int(text), 64)) if text is not None else default
    except ValueError:
        return default


async def desk_app(
    command: str,
    *,
    title: str,
    public_url: str | None = None,
    middlewares: tuple[Middleware, ...] = (),
) -> web.Application:
    """An aiohttp app serving `command` (a shell command line, already quoted) to browsers:
    `/` the page, `/ws` the websocket that runs one `command` process per connection,
    `/static/…` its scripts. `middlewares` run before every route."""
    app = await _DeskServer(command, title=title, public_url=public_url)._make_app()
    app.middlewares.extend(middlewares)
    return app
