"""The locked door of `onwatch web`: one name, one origin, a login, server-side sessions, a
failure limit, security headers on every answer, and a log that writes no secret.

Who can knock, and what stops each (docs/operating.md, "The browser desk", says it for the
operator):

- **Another program on this machine** (any local user) can connect to the port. It gets
  nothing without a session cookie or the token: every route but the login answers 401.
- **Another site open in the operator's browser** can make the browser send requests, with
  the browser's cookies. The desk is served under a host name of its own (a random
  `desk-….localhost`, which browsers resolve to loopback without DNS; or `--public-url`):
  a request under any other `Host` is refused (421), which also closes DNS rebinding, and
  the session cookie, host-only and `SameSite=Strict`, is never sent to another local
  port's name (browsers share cookies across the ports of one name, so under 127.0.0.1 the
  cookie went to every local server). A request that names another `Origin`, or that
  another site caused (`Sec-Fetch-Site: cross-site`/`same-site`) other than the operator
  following a link to the page, is refused (403) before any token is looked at, so another
  site can neither drive the desk nor spend the operator's login attempts. A websocket
  (any `Upgrade`, any request for /ws) and every POST must name this exact origin.
- **Someone guessing the token** gets 401 per wrong token, and 429 (with `Retry-After`) after
  `MAX_FAILURES` wrong tokens from one address or `MAX_FAILURES_TOTAL` from all addresses in
  `WINDOW` seconds, until the window has passed. Only POST /login and `Authorization: Bearer`
  carry a token; a GET never counts. Sessions already open go on working.

How one logs in: the link `onwatch web` prints carries a one-time code in its fragment
(`/#code=…`), which no request carries; the page's script posts it and removes it from the
address bar. The code works once, so the address that stays in the browser's history is not
a credential. The login form takes the token (`$ONWATCH_WEB_TOKEN`, or the generated one
printed at start); scripts may send `Authorization: Bearer <token>` instead. A login starts
a server-side session (sessions.py): random, ending on logout (POST /logout), after
`SESSION_LIFETIME`, and when the server stops. After a login the browser is sent to `/`,
never to an address taken from the request.

The access log names the path only (never the query string), with a short note of what the
door decided; never a header or cookie value.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import math
import time
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, urlsplit

from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger

from onwatch.core.text import printable

from .pages import DEFAULT_POLICY, DESK_POLICY, PAGE_POLICY, login_page, message_page
from .sessions import SESSION, Session, Sessions

log = logging.getLogger("onwatch.web")

COOKIE = "onwatch_desk"
MAX_FAILURES = 5  # wrong tokens per client address and window
MAX_FAILURES_TOTAL = 20  # wrong tokens from all addresses together per window
WINDOW = 60.0  # seconds
MAX_ADDRESSES = 10_000  # addresses remembered at once; the oldest are forgotten first
MAX_FORM = 4096  # bytes of a login form
FORM_TIMEOUT = 10.0  # seconds to receive it
# Request key: what the door decided, for the access log line (a typed RequestKey where this
# aiohttp has one, a plain string in older 3.x).
NOTE: Any = web.RequestKey("onwatch_note", str) if hasattr(web, "RequestKey") else "onwatch_note"
# Sent with every answer; a page sets its own Content-Security-Policy (pages.py).
SECURITY_HEADERS = {
    "Content-Security-Policy": DEFAULT_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on its
    # own form posts, and the door could not tell them from anyone else's
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FailureLimit:
    """Wrong tokens in a sliding window, per client address and over all of them together;
    `clock` is injectable."""

    def __init__(
        self,
        *,
        max_failures: int = MAX_FAILURES,
        max_total: int = MAX_FAILURES_TOTAL,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.max_total = max_failures, max_total
        self.window, self.clock = window, clock
        self._failures: dict[str, collections.deque[float]] = {}
        self._total: collections.deque[float] = collections.deque(maxlen=max_total)

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

    def _wait(self, failures: collections.deque[float], allowed: int) -> int | None:
        horizon = self.clock() - self.window
        while failures and failures[0] <= horizon:
            failures.popleft()
        if len(failures) < allowed:
            return None
        return max(1, math.ceil(failures[-allowed] + self.window - self.clock()))

    def retry_after(self, address: str) -> int | None:
        """Seconds until `address` may try a token again, or None if it may try now."""
        waits = [self._wait(self._total, self.max_total)]
        failures = self._recent(address)
        if failures is not None:
            waits.append(self._wait(failures, self.max_failures))
        found = [wait for wait in waits if wait is not None]
        return max(found) if found else None

    def fail(self, address: str) -> None:
        failures = self._recent(address)
        if failures is None:
            if len(self._failures) >= MAX_ADDRESSES:
                del self._failures[next(iter(self._failures))]
            failures = self._failures[address] = collections.deque()
        now = self.clock()
        failures.append(now)
        while len(failures) > self.max_failures:
            failures.popleft()
        self._total.append(now)


class Door:
    """The aiohttp middleware that admits only holders of a session or of the token, under
    one origin (see the module docstring). `bind(origin)` once the port is known."""

    def __init__(
        self,
        token: str,
        sessions: Sessions,
        *,
        title: str = "onwatch",
        limit: FailureLimit | None = None,
        origin: str | None = None,
    ) -> None:
        if not token:
            raise ValueError("the door needs a token")
        self._token = token.encode("utf-8")
        self.sessions = sessions
        self.title = title
        self.limit = limit or FailureLimit()
        self.origin = ""
        self._host = ""
        self.secure = False
        self.cookie = COOKIE
        if origin is not None:
            self.bind(origin)

    def bind(self, origin: str) -> None:
        """Serve under `origin` (`scheme://host[:port]`, what the browser's address starts
        with): the only Host and Origin accepted from now on."""
        parts = urlsplit(origin)
        self.origin = f"{parts.scheme}://{parts.netloc}".lower()
        self._host = parts.netloc.lower()
        self.secure = parts.scheme == "https"
        # __Host-: a cookie the browser keeps only for this exact host, sent over https only
        self.cookie = "__Host-" + COOKIE if self.secure else COOKIE

    def _is_token(self, presented: str) -> bool:
        return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), self._token)

    # --- the checks, in order ---------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get(hdrs.HOST, "")
        if not self._host or host.lower() != self._host:
            return _refuse(
                request,
                421,
                "wrong Host",
                "Not this address",
                "This desk answers only at the address `onwatch web` printed when it started.",
            )
        foreign = self._foreign(request)
        if foreign is not None:
            return _refuse(
                request,
                403,
                foreign,
                "Refused",
                "This desk takes requests from its own page only.",
            )
        if request.path == "/login":
            return await self._login(request)
        session = self.sessions.find(request.cookies.get(self.cookie))
        if session is not None:
            request[SESSION] = session
            if request.path == "/logout" and request.method == "POST":
                return self._logout(request, session)
            return await handler(request)
        bearer = request.headers.get(hdrs.AUTHORIZATION, "")
        if bearer[:7].lower() == "bearer ":
            return await self._bearer(request, handler, bearer[7:].strip())
        if request.method in ("GET", "HEAD") and request.path == "/":
            request[NOTE] = "login page"
            return _page(login_page(self.title), 401)
        request[NOTE] = "no session"
        return _text(401, "log in first: open the address `onwatch web` printed")

    def _foreign(self, request: web.Request) -> str | None:
        """Why the request is not one this desk's own page (or a script) would make, if so."""
        headers = request.headers
        origin = headers.get(hdrs.ORIGIN)
        if origin is not None and origin.lower() != self.origin:
            return "foreign Origin"
        upgrade = (
            hdrs.UPGRADE in headers
            or "upgrade" in headers.get(hdrs.CONNECTION, "").lower()
            or request.path == "/ws"
        )
        if upgrade and origin is None:
            return "websocket without Origin"
        if request.method not in ("GET", "HEAD") and origin is None:
            return f"{request.method} without Origin"
        site = headers.get("Sec-Fetch-Site", "").lower()
        if site in ("cross-site", "same-site"):
            following_a_link = (
                request.method in ("GET", "HEAD")
                and headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
                and not upgrade
            )
            if not following_a_link:
                return f"caused by another site ({site})"
        return None

    async def _bearer(
        self, request: web.Request, handler: Handler, presented: str
    ) -> web.StreamResponse:
        address = request.remote or "unknown"
        wait = self.limit.retry_after(address)
        if wait is not None:
            request[NOTE] = "too many wrong tokens"
            response = _text(429, "too many wrong tokens; try again later")
            response.headers["Retry-After"] = str(wait)
            return response
        if not self._is_token(presented):
            self.limit.fail(address)
            request[NOTE] = "wrong token"
            return _text(401, "wrong token")
        request[SESSION] = self.sessions.bearer
        return await handler(request)

    # --- logging in and out -----------------------------------------------------------------

    async def _login(self, request: web.Request) -> web.StreamResponse:
        if request.method in ("GET", "HEAD"):
            if self.sessions.find(request.cookies.get(self.cookie)) is not None:
                return _see_other("/")
            request[NOTE] = "login page"
            return _page(login_page(self.title), 401)
        if request.method != "POST":
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])
        form = await _form(request)
        if form is None:
            request[NOTE] = "unreadable login form"
            return _page(login_page(self.title, "The form did not arrive whole."), 400)
        code, token = form.get("code", ""), form.get("token", "")
        if code:
            # 256 random bits, valid once: guessing it is hopeless, so it is not limited,
            # and the operator's link works even while someone guesses tokens.
            if self.sessions.redeem(code):
                return self._admit(request, "login by link")
            request[NOTE] = "used or unknown login link"
            return _page(
                login_page(
                    self.title,
                    "That link has been used already (each works once): enter the token.",
                ),
                401,
            )
        address = request.remote or "unknown"
        wait = self.limit.retry_after(address)
        if wait is not None:
            request[NOTE] = "too many wrong tokens"
            response = _page(
                login_page(self.title, f"Too many wrong tokens: try again in {wait} s."), 429
            )
            response.headers["Retry-After"] = str(wait)
            return response
        if token and self._is_token(token):
            return self._admit(request, "login by token")
        if token:
            self.limit.fail(address)
            request[NOTE] = "wrong token"
            return _page(login_page(self.title, "That is not the token."), 401)
        request[NOTE] = "empty login form"
        return _page(login_page(self.title, "Enter the token."), 401)

    def _admit(self, request: web.Request, how: str) -> web.Response:
        secret, session = self.sessions.start()
        request[NOTE] = f"{how}: session {session.label}"
        response = _see_other("/")
        response.set_cookie(
            self.cookie,
            secret,
            httponly=True,
            samesite="Strict",
            secure=self.secure,
            path="/",
            max_age=int(self.sessions.lifetime),
        )
        return response

    def _logout(self, request: web.Request, session: Session) -> web.Response:
        self.sessions.end(session)
        request[NOTE] = f"logout: session {session.label}"
        response = _see_other("/")
        response.del_cookie(self.cookie, path="/", secure=self.secure, samesite="Strict")
        return response

    # --- every answer -----------------------------------------------------------------------

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """The security headers, on every answer of the app (404s and 405s included)."""
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if request.path.startswith("/static/"):
            response.headers.setdefault("Cache-Control", "private, max-age=86400")
        else:
            response.headers.setdefault("Cache-Control", "no-store")

    def install(self, app: web.Application) -> None:
        """Put the door in front of every route of `app`."""
        app.middlewares.insert(0, self.middleware)
        app.on_response_prepare.append(self.on_response_prepare)


async def _form(request: web.Request) -> dict[str, str] | None:
    """The login form's fields (the last value of each), or None if it is over MAX_FORM
    bytes, slow, or not a form."""
    if request.content_length is not None and request.content_length > MAX_FORM:
        return None
    try:
        async with asyncio.timeout(FORM_TIMEOUT):
            body = await request.content.read(MAX_FORM + 1)
    except (TimeoutError, ConnectionError, ValueError):
        return None
    if len(body) > MAX_FORM:
        return None
    try:
        fields = parse_qs(body.decode("utf-8"), max_num_fields=10)
    except (UnicodeDecodeError, ValueError):
        return None
    return {name: values[-1] for name, values in fields.items()}


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _page(html: str, status: int = 200, *, policy: str = PAGE_POLICY) -> web.Response:
    response = web.Response(status=status, text=html, content_type="text/html")
    response.headers["Content-Security-Policy"] = policy
    return response


def desk_response(html: str) -> web.Response:
    """The desk page, with its own Content-Security-Policy."""
    return _page(html, policy=DESK_POLICY)


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n")


def _refuse(request: web.Request, status: int, note: str, title: str, text: str) -> web.Response:
    request[NOTE] = note
    accepts_html = "text/html" in request.headers.get(hdrs.ACCEPT, "")
    if accepts_html and request.method in ("GET", "HEAD"):
        return _page(message_page(title, text), status)
    return _text(status, text)


def _path(request: web.BaseRequest) -> str:
    path = request.path
    return printable(path if len(path) <= 200 else path[:200] + "…")


class AccessLog(AbstractAccessLogger):
    """One line per request: peer, method, path (no query string), status, what the door
    decided, time."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        note = request.get(NOTE)
        if note is None and response.status == 400 and request.method == "UNKNOWN":
            note = "malformed request"  # aiohttp's stand-in for a request it could not parse
        self.logger.info(
            "%s %s %s %d %s%.1fms",
            printable(request.remote or "-"),
            printable(request.method[:20]),
            _path(request),
            response.status,
            f"{printable(note)} " if note else "",
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def token_bits(token: str) -> float:
    """A conservative estimate of the entropy of a chosen token, in bits: each character is
    worth log2 of the alphabet its kinds of character span, except one that repeats the one
    before, continues a run (abc, 987) or repeats three characters seen before, which is
    worth one bit. A floor against obvious tokens (aaaa…, 1234…, a word twice), not a
    strength meter."""
    pool = 0
    if any(c.islower() and c.isascii() for c in token):
        pool += 26
    if any(c.isupper() and c.isascii() for c in token):
        pool += 26
    if any(c.isdigit() and c.isascii() for c in token):
        pool += 10
    if any(not c.isalnum() and c.isascii() for c in token):
        pool += 33
    if any(not c.isascii() for c in token):
        pool += 100
    per_character = math.log2(max(pool, 2))
    bits = 0.0
    for i, c in enumerate(token):
        predictable = i > 0 and (
            c == token[i - 1]
            or (
                i > 1
                and ord(c) - ord(token[i - 1]) == ord(token[i - 1]) - ord(token[i - 2])
                and abs(ord(c) - ord(token[i - 1])) <= 1
            )
            or (i > 1 and token[i - 2 : i + 1] in token[:i])
        )
        bits += 1.0 if predictable else per_character
    return bits
