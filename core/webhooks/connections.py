"""The connections of onwatch's HTTP servers (`serve`, `run`, `web`): how many, for how long,
and what the log says about them.

aiohttp keeps a connection that never sends a request open for an hour (its keep-alive
default), accepts connections until the process runs out of descriptors, and then logs every
failed accept with a traceback. A `ConnectionGuard` in front of the aiohttp server (a
`GuardedSite` instead of `web.TCPSite`) bounds all of that:

- **Timeouts.** A connection gets `head_timeout` seconds, from its opening or from the end of
  its previous answer, until the head of its next request has arrived (an idle keep-alive
  connection and a head sent a byte at a time run out alike); a request then gets
  `request_timeout` seconds, its answer included. The handlers bound their bodies themselves
  (the receiver's 408). A websocket, once upgraded, is `hold`: its own heartbeat watches it.
- **A cap.** At most `limit` connections are open (sized to the descriptor limit, see
  `connection_limit`). A new connection over the cap closes the connection that has been
  idle the longest, among those that sent nothing since their last answer first, so idle
  connections can never shut a sender out; when none is idle (every connection is in the
  middle of a request), the newcomer gets a 503 with `Retry-After` and is closed.
- **The log says it once.** Reaching a limit is one warning, then at most one line a minute
  counting what happened since; refused accepts (out of descriptors) likewise, never a
  traceback. `ServerLog` replaces aiohttp's server logger: a malformed request is the access
  log's one 400 line, never the exception text (which quotes the request's own bytes:
  cookies, tokens).

Only aiohttp's public surface is used, plus `BaseSite`'s documented subclassing point
(`_runner`, `_server`): `tests/webhook/test_connections.py` pins the behaviour with raw
sockets against real servers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
from typing import Any, Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

HEAD_TIMEOUT = 10.0  # seconds until a request's head has arrived (idle keep-alive included)
REQUEST_TIMEOUT = 60.0  # seconds a request may take, its answer included (not a websocket)
MAX_CONNECTIONS = 1024  # open at once, when the descriptor limit allows
# Bytes of a request's head (request line and headers): aiohttp would hold up to 128 header
# lines of 8 KiB each, a megabyte, for every connection sending one slowly.
MAX_HEAD = 64 * 1024
FD_RESERVE = 64  # descriptors kept for everything else: the database, logs, desk processes
RETRY_AFTER = 5  # seconds, in the 503 of a refused connection
SUMMARY_EVERY = 60.0  # seconds between two lines about the same limit
# Connections the kernel queues before they are accepted; asyncio also accepts up to this
# many at once, before the guard sees any of them, and the connections they push out close a
# moment later: the cap keeps twice this many descriptors spare, as an accept() that fails
# with EMFILE stops all accepting for a second. Not longer: behind a long queue of a crowd's
# connections, a sender's waits its turn (accepts are first come, first served), while a
# short one drops what does not fit and lets it retry.
BACKLOG = 128

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def refusal(body: str, content_type: str = "text/plain; charset=utf-8") -> bytes:
    """The fixed answer written to a connection over the cap (no request is read)."""
    data = body.encode("utf-8")
    return (
        "HTTP/1.1 503 Service Unavailable\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(data)}\r\n"
        f"Retry-After: {RETRY_AFTER}\r\n"
        "Connection: close\r\n\r\n"
    ).encode("ascii") + data


def connection_limit(wanted: int = MAX_CONNECTIONS, reserve: int | None = None) -> int:
    """How many connections this process can hold: `wanted`, or fewer if the descriptor
    limit cannot fit them with `reserve` to spare (default: FD_RESERVE, and twice BACKLOG for
    a burst of accepts and the connections it pushes out). Raises the soft limit toward the
    hard one first, as far as `wanted + reserve` needs (unprivileged, and inherited by
    children)."""
    if reserve is None:
        reserve = FD_RESERVE + 2 * BACKLOG
    try:
        import resource
    except ImportError:  # not POSIX: no descriptor limit to read
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + reserve
    if soft != resource.RLIM_INFINITY and soft < need:
        raised = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - reserve))


class LimitLog:
    """Says that a limit was reached once, then at most one line per `every` seconds
    counting how often it was reached since (nothing while it is not)."""

    def __init__(self, log: logging.Logger, message: str, *, every: float = SUMMARY_EVERY) -> None:
        self.log, self.message, self.every = log, message, every
        self.total = 0
        self._since = 0
        self._timer: asyncio.TimerHandle | None = None

    def hit(self, count: int = 1) -> None:
        self.total += count
        if self._timer is None:
            self.log.warning("%s", self.message)
            self._arm()
        else:
            self._since += count

    def _arm(self) -> None:
        try:
            self._timer = asyncio.get_running_loop().call_later(self.every, self._summarise)
        except RuntimeError:  # no loop (a synchronous caller): say it every time instead
            self._timer = None

    def _summarise(self) -> None:
        if not self._since:
            self._timer = None  # quiet for a whole period: the next hit is news again
            return
        self.log.warning("%s (%d more in the last %g s)", self.message, self._since, self.every)
        self._since = 0
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Connection:
    """What the guard knows of one open connection."""

    __slots__ = (
        "transport",
        "protocol",
        "busy",
        "answering",
        "held",
        "timer",
        "closing",
        "head",
        "tail",
    )

    def __init__(self, transport: asyncio.Transport, protocol: "_GuardedProtocol") -> None:
        self.transport = transport
        self.protocol = protocol
        self.busy = False
        self.answering = False  # aiohttp is sending a file after the handler returned
        self.held = False
        self.closing = False
        self.timer: asyncio.TimerHandle | None = None
        # bytes of the next request's head seen so far (None: its end was seen), and the
        # last three bytes, where the blank line ending the head may begin
        self.head: int | None = 0
        self.tail = b""


class ConnectionGuard:
    """Timeouts and a cap for one server's connections (see the module docstring).

    `protocol_factory(make)` wraps aiohttp's protocol factory; `middleware` must be the
    application's first middleware (it tells the guard when a request starts and ends);
    `hold(request)` exempts an upgraded websocket from the request timeout."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        limit: int | None = None,
        head_timeout: float | None = None,
        request_timeout: float | None = None,
        refused: bytes = refusal("too many connections; retry later\n"),
    ) -> None:
        self.limit = connection_limit() if limit is None else limit
        # None: the module's values, read now (tests shorten them)
        self.head_timeout = HEAD_TIMEOUT if head_timeout is None else head_timeout
        self.request_timeout = REQUEST_TIMEOUT if request_timeout is None else request_timeout
        self._refused = refused
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        # Idle connections (between requests), the longest idle first, in two lots: those that
        # sent nothing since (the first to close when the cap is reached), and those that
        # have begun their next request's head (a sender's, a moment before it is read).
        self._idle: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self._talking: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self.full = LimitLog(
            log,
            f"connection limit ({self.limit}) reached: closing the longest-idle connections, "
            f"refusing new ones (503) while none is idle",
        )
        self.slow = LimitLog(
            log,
            f"closed a connection whose request took over {self.request_timeout:g} s",
        )
        self.large = LimitLog(log, f"refused a request head over {MAX_HEAD} bytes (431)")
        self._too_large = (
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n"
        )

    @property
    def open(self) -> int:
        """Connections open now (those being closed excepted)."""
        return len(self._open)

    # --- the protocol side ------------------------------------------------------------------

    def protocol_factory(
        self, make: Callable[[], asyncio.Protocol]
    ) -> Callable[[], asyncio.Protocol]:
        """A factory for `loop.create_server` that puts every connection `make` serves under
        this guard."""
        return lambda: _GuardedProtocol(self, make)

    def _admit(
        self, transport: asyncio.Transport, protocol: "_GuardedProtocol"
    ) -> _Connection | None:
        if len(self._open) >= self.limit:
            waiting = self._idle or self._talking
            if waiting:
                oldest, _ = waiting.popitem(last=False)
                self._close(oldest)
                self.full.hit()
            else:
                self.full.hit()
                try:
                    transport.write(self._refused)
                finally:
                    transport.close()
                return None
        connection = _Connection(transport, protocol)
        self._open[transport] = connection
        self._set_idle(connection)
        return connection

    def _spoke(self, connection: _Connection, data: bytes) -> bool:
        """`connection` sent `data`: if it was idle, it is starting a request now. False if
        the head of that request is over MAX_HEAD (the connection is closed)."""
        if connection in self._idle:
            del self._idle[connection]
            self._talking[connection] = None
        if connection.head is None:
            return True
        seen = connection.tail + data
        end = seen.find(b"\r\n\r\n")
        if end >= 0:
            connection.head = None  # whole: aiohttp parses it; the request's time starts
            return True
        connection.head += len(data)
        connection.tail = seen[-3:]
        if connection.head > MAX_HEAD:
            self.large.hit()
            try:
                connection.transport.write(self._too_large)
            finally:
                self._close(connection)
            return False
        return True

    def _lost(self, connection: _Connection) -> None:
        self._cancel(connection)
        self._idle.pop(connection, None)
        self._talking.pop(connection, None)
        if self._open.get(connection.transport) is connection:
            del self._open[connection.transport]

    def _close(self, connection: _Connection, *, abort: bool = False) -> None:
        """Close `connection` now; its slot is free at once, whatever the socket still does."""
        self._cancel(connection)
        self._idle.pop(connection, None)
        self._talking.pop(connection, None)
        self._open.pop(connection.transport, None)
        connection.closing = True
        if abort:
            connection.transport.abort()
        else:
            connection.transport.close()

    def _cancel(self, connection: _Connection) -> None:
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def _set_idle(self, connection: _Connection, *, fresh: bool = True) -> None:
        """Between requests. `fresh`: the request's body was read to its end, so the next
        bytes begin a new head (otherwise aiohttp reads away what is left, then closes)."""
        self._cancel(connection)
        connection.busy = connection.answering = False
        connection.head, connection.tail = (0, b"") if fresh else (None, b"")
        self._talking.pop(connection, None)
        self._idle[connection] = None
        self._idle.move_to_end(connection)
        loop = asyncio.get_running_loop()
        connection.timer = loop.call_later(self.head_timeout, self._expired, connection)

    def _set_busy(self, connection: _Connection) -> None:
        self._cancel(connection)
        connection.busy, connection.answering = True, False
        self._idle.pop(connection, None)
        self._talking.pop(connection, None)
        loop = asyncio.get_running_loop()
        connection.timer = loop.call_later(self.request_timeout, self._expired, connection)

    def _expired(self, connection: _Connection) -> None:
        connection.timer = None
        if connection.closing:
            return
        if connection.busy:
            self.slow.hit()
            self._close(connection, abort=True)
        elif connection.answering:
            self._close(connection, abort=True)  # a reader too slow for a file: no news
        else:
            self._close(connection)  # idle or a head too slow: the ordinary end, not news

    # --- the request side -------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the connection busy for the request and sends the answer within its time;
        an answer not sent here (a raised HTTPException) is sent by aiohttp after."""
        connection = self._open.get(request.transport) if request.transport else None
        if connection is None or connection.closing:
            return await handler(request)
        self._set_busy(connection)
        answering = False
        try:
            response = await handler(request)
            if isinstance(response, web.FileResponse):
                # aiohttp prepares a file again after the middlewares (and sends it again):
                # leave it to aiohttp, within what is left of the request's time, but not
                # as a slow request: a file on a slow link is not an attack on the cap.
                answering = True
            elif not connection.held and not response.prepared:
                try:
                    await response.prepare(request)
                    await response.write_eof()
                except ConnectionError:
                    pass  # the client left; aiohttp logs the one access line
            return response
        finally:
            if not connection.closing and self._open.get(connection.transport) is connection:
                connection.held = False
                if answering:
                    connection.busy, connection.answering = False, True  # its timer runs on
                else:
                    self._set_idle(connection, fresh=request.content.is_eof())

    def hold(self, request: web.Request) -> None:
        """The request became a websocket: no request timeout while it stays open."""
        connection = self._open.get(request.transport) if request.transport else None
        if connection is not None:
            self._cancel(connection)
            connection.held = True

    def close(self) -> None:
        """The server stops: close the connections aiohttp never saw (they sent nothing)."""
        self.full.close()
        self.slow.close()
        self.large.close()
        for connection in list(self._open.values()):
            if not connection.protocol.served:
                self._close(connection)


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, created once the guard admitted the connection
    and it sent its first bytes: a crowd of connections that never say anything costs a
    socket and this object each, not an HTTP handler and its task."""

    def __init__(self, guard: ConnectionGuard, make: Callable[[], asyncio.Protocol]) -> None:
        self._guard, self._make = guard, make
        self._inner: asyncio.Protocol | None = None
        self._connection: _Connection | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._connection = self._guard._admit(transport, self)

    @property
    def served(self) -> bool:
        """Whether aiohttp has this connection (it closes it on shutdown, then)."""
        return self._inner is not None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._connection is not None:
            self._guard._lost(self._connection)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._connection is None or self._connection.closing:
            return
        if not self._guard._spoke(self._connection, data):
            return
        if self._inner is None:
            self._inner = self._make()
            self._inner.connection_made(self._transport)  # type: ignore[arg-type]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """`web.TCPSite` with every connection under a ConnectionGuard."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, guard: ConnectionGuard
    ) -> None:
        super().__init__(runner)
        self.host, self.port, self.guard = host, port, guard

    @property
    def name(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self.guard.protocol_factory(server),
            self.host,
            self.port,
            backlog=BACKLOG,
            reuse_address=sys.platform != "win32",
        )

    async def stop(self) -> None:
        await super().stop()
        self.guard.close()


class ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, kept to one line and to what is safe to write.

    aiohttp logs a malformed request with its exception, whose text quotes the request's bytes
    (a header line with a cookie, a request line with a token), and an error in a handler
    with a traceback. Here a malformed request leaves only the access log's 400 line; any
    other error is one line naming the exception's type (the traceback at debug level)."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__(logger, {})

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        error = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(error, (HttpProcessingError, web.RequestPayloadError)):
            return  # the access log has its 400 line; the text would quote the request
        if isinstance(error, ConnectionError):
            return  # the client left mid-answer: nothing anyone can act on
        self.logger.error("internal error: %s (details at debug level)", type(error).__name__)
        self.logger.debug("internal error", exc_info=error)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        kwargs.pop("exc_info", None)  # aiohttp attaches the request's bytes to some
        self.logger.debug(msg, *args, **kwargs)


def quiet_accept_errors(log: logging.Logger) -> LimitLog:
    """Route the event loop's "socket.accept() out of system resource" reports (out of
    descriptors: one traceback per try, several a second) to one line a minute; every other
    report goes where it went. Returns the LimitLog (its `total` counts them)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    limit = LimitLog(log, "cannot accept connections: out of file descriptors (EMFILE)")

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            limit.hit()
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return limit
