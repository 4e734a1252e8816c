"""The locked door of `onwatch web`: a token, a session cookie, a failure limit, a quiet log.

How the token travels: the operator opens `/?token=…` once; the door answers with a 303
redirect to the same path without the token and sets a session cookie (HttpOnly, so page
scripts cannot read it; SameSite=Strict, so no other site's page can make the browser send
it; Secure behind https). Every later request, the websocket upgrade included, carries the
cookie. Scripts may send `Authorization: Bearer <token>` instead. The cookie holds an HMAC
of the token, not the token, so a cookie seen in a proxy's log is not the token itself (it is
still a credential for as long as the token stands).

Every comparison is constant-time (`hmac.compare_digest`). A request without valid
credentials gets 401; one that presented a wrong token also counts as a failure for its
client address (a bare request, such as the browser's favicon fetch, guesses nothing). After
`MAX_FAILURES` within `WINDOW` seconds that address gets 429 (with Retry-After) for anything
but a valid session cookie, the right token included, until the window has passed: guessing
is capped at a few tries a minute. Behind a reverse proxy every client shares the proxy's
address, so a guesser locks everyone out who has no session yet, which is the safe way round.

A websocket upgrade must also come from the desk's own origin (an `Origin` header naming this
server), so a page elsewhere cannot drive the desk through the browser's cookie.

The access log names the path only: never the query string (where the token travels once),
never a header or cookie value.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import math
import time
from typing import Awaitable, Callable, TypeVar
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from onwatch.core.text import printable

log = logging.getLogger("onwatch.web")

COOKIE = "onwatch_desk"
MAX_FAILURES = 5  # per client address and window
WINDOW = 60.0  # seconds
MAX_ADDRESSES = 10_000  # addresses remembered at once; the oldest are forgotten first
# The page is textual-serve's: its own scripts and styles (inline ones included), a websocket
# back to this server, nothing from elsewhere (it asks for a web font, which stays blocked),
# and it may not be framed (a framed desk could be clicked through by another page).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_Response = TypeVar("_Response", bound=web.StreamResponse)


class FailureLimit:
    """Failed attempts per client address in a sliding window; `clock` is injectable."""

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.window, self.clock = max_failures, window, clock
        self._failures: dict[str, collections.deque[float]] = {}

    def _recent(self, address: str) -> collections.deque[float] | None:
        failures = self._failures.get(address)
        if failures is None:
            return None
        horizon = self.clock() - self.window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if not failures:
            del self._failures[address]
            return None
        return failures

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may try again, or None if it may try now."""
        failures = self._recent(address)
        if failures is None or len(failures) < self.max_failures:
            return None
        return max(1, math.ceil(failures[-self.max_failures] + self.window - self.clock()))

    def fail(self, address: str) -> None:
        failures = self._recent(address)
        if failures is None:
            if len(self._failures) >= MAX_ADDRESSES:
                del self._failures[next(iter(self._failures))]
            failures = self._failures[address] = collections.deque()
        failures.append(self.clock())
        while len(failures) > self.max_failures:
            failures.popleft()


class Door:
    """The aiohttp middleware that admits only holders of the token (see the module doc)."""

    def __init__(
        self, token: str, *, public_url: str | None = None, limit: FailureLimit | None = None
    ) -> None:
        if not token:
            raise ValueError("the door needs a token")
        self._token = token.encode("utf-8")
        self._session = (
            hmac.new(self._token, b"onwatch web session", hashlib.sha256)
            .hexdigest()
            .encode("ascii")
        )
        self.public_url = public_url
        self.secure = bool(public_url and public_url.startswith("https:"))
        self.limit = limit or FailureLimit()

    def _is_token(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), self._token)

    def _has_session(self, request: web.Request) -> bool:
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and hmac.compare_digest(
            cookie.encode("utf-8", "surrogatepass"), self._session
        )

    def _origin_ok(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:
            return False
        ours = urlsplit(self.public_url) if self.public_url else None
        expected = (
            f"{ours.scheme}://{ours.netloc}" if ours else f"{request.scheme}://{request.host}"
        )
        return hmac.compare_digest(
            origin.lower().encode("utf-8", "surrogatepass"),
            expected.lower().encode("utf-8", "surrogatepass"),
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if self._has_session(request):
            if upgrade and not self._origin_ok(request):
                return _plain(403, "this desk takes websockets from its own page only")
            return _secured(await handler(request))
        address = request.remote or "unknown"
        wait = self.limit.retry_after(address)
        if wait is not None:
            response = _plain(429, "too many failed attempts; try again later")
            response.headers["Retry-After"] = str(wait)
            return response
        presented = request.query.get("token")
        bearer = request.headers.get("Authorization", "")
        if presented is None and bearer[:7].lower() == "bearer ":
            presented = bearer[7:].strip()
        if presented is None or not self._is_token(presented):
            if presented is not None:  # a guess; a bare request (a favicon) guesses nothing
                self.limit.fail(address)
                log.warning("%s %s: wrong token", printable(address), _path(request))
            return _plain(
                401,
                "a valid token is needed: open the address `onwatch web` "
                "printed, or send Authorization: Bearer <token>",
            )
        if upgrade and not self._origin_ok(request):
            return _plain(403, "this desk takes websockets from its own page only")
        if "token" in request.query and request.method == "GET" and not upgrade:
            return self._admit(request)
        return _secured(await handler(request))

    def _admit(self, request: web.Request) -> web.Response:
        """303 to the same address without the token, with the session cookie set."""
        query = request.url.query.copy()
        query.popall("token")
        location = request.rel_url.with_query(query)
        response = web.Response(status=303, headers={"Location": str(location)})
        response.set_cookie(
            COOKIE,
            self._session.decode("ascii"),
            httponly=True,
            samesite="Strict",
            secure=self.secure,
            path="/",
        )
        return _secured(response)


def _plain(status: int, text: str) -> web.Response:
    return _secured(web.Response(status=status, text=text + "\n"))


def _secured(response: _Response) -> _Response:
    if not response.prepared:  # a websocket's headers went out with the upgrade
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    return response


def _path(request: web.BaseRequest) -> str:
    path = request.path
    return printable(path if len(path) <= 200 else path[:200] + "…")


class AccessLog(AbstractAccessLogger):
    """One line per request: peer, method, path (no query string), status, time."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %s %d %.1fms",
            printable(request.remote or "-"),
            printable(request.method),
            _path(request),
            response.status,
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
