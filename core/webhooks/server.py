"""The webhook receiver: an aiohttp app that verifies, deduplicates and durably stores deliveries.

One route, `POST /hooks/{source}`: `github` and `stripe` use their providers' signing
schemes, any other configured source Standard Webhooks (`webhook-id`, `webhook-timestamp`,
`webhook-signature`; the `svix-` names too), deduplicated on `webhook-id`. The order of checks
for every request:

    404 hook not configured → 413 declared Content-Length over the limit → 401 no signature
    header, or one that is malformed or offers too many signatures → read the body, counting
    bytes and hashing each piece as it arrives (413 past the limit, 408 too slow, 503 too many
    unverified bytes held at once, 400 aborted or badly encoded) → 401 signature or timestamp
    → 400 delivery id / JSON → ingest → 202 stored | 200 duplicate | 503 inbox full or locked
    (Retry-After).

A hook without a configured secret answers 404, like an unknown path, not 401: there is
nothing it could be signed with, so it does not exist; a sender's delivery log then says
"not found" (wrong URL, or the receiver lacks the secret) instead of sending the operator to
hunt for a secret mismatch, and a scanner cannot tell unconfigured names from unknown ones.

Nothing is parsed before the signature is verified, and nothing is answered 2xx before
`Inbox.ingest` has returned, i.e. before the event is committed (concurrent deliveries share
one commit through the inbox's group commit; each still waits for its own).

What an attacker who can connect cannot do (each bounded here, see docs/operating.md,
"Exposing it safely"): make one request cost more than one MAC per secret
(signatures.MAX_SIGNATURES), hold more than `unverified_budget` bytes of unsigned bodies in
memory, hold connections open (connections.ConnectionGuard: timeouts, a cap that closes idle
connections first), fill the log (one line per request, one per limit reached), or read
`/metrics` through a DNS-rebound name (the Host of anything but a hook must be an address,
`localhost`, this machine's name or one given with `--allow-host`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Iterator, Mapping
from urllib.parse import parse_qs

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import ContentLengthError, HttpProcessingError

from onwatch.core import (
    BadInput,
    BudgetExceeded,
    ConnectionLost,
    Inbox,
    InboxBusy,
    InboxError,
    NotAnInbox,
    StorageFull,
    WritesRefused,
)
from onwatch.core.pg import is_url
from onwatch.core.text import LineFormatter, printable

from .config import SOURCE_PATTERN, Secrets
from .connections import (
    HEAD_TIMEOUT,
    ConnectionGuard,
    GuardedSite,
    ServerLog,
    quiet_accept_errors,
    refusal,
)
from .signatures import (
    SignatureError,
    Verifier,
    sha256_header_verifier,
    standard_verifier,
    stripe_verifier,
)


async def _continue(request: web.Request) -> None:
    """Answer `Expect: 100-continue` once the headers passed the checks, with public aiohttp
    API only (aiohttp's own default handler is private): "100 Continue" on HTTP/1.1, 417 for
    any other expectation. tests/webhook/test_limits.py sends both kinds."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {printable(expect)[:100]}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the interim response is not part of the body's size


log = logging.getLogger("onwatch.webhooks")

BODY_TIMEOUT = 30.0  # seconds to receive a whole body before 408
# Bytes of bodies whose signature is not yet checked, held at once across all requests: at
# least this, and never less than two bodies of the largest accepted size.
UNVERIFIED_BYTES = 32 << 20
RETRY_AFTER_BUSY = 5  # seconds: the database was locked past the busy timeout
RETRY_AFTER_FULL = 60  # seconds: max_pending reached (the worker has to drain), or disk full
REFUSED_SAID_EVERY = 60.0  # seconds between two log lines saying writes are refused
# After an early answer (413, 408) aiohttp reads and discards what the client still sends, so
# the client gets to read the answer instead of a connection reset; bound that courtesy.
LINGERING_TIME = 2.0
SHUTDOWN_TIMEOUT = 10.0  # seconds in-flight requests get to finish on SIGTERM
# Request storage key: what the handler decided, for the access log line (a typed RequestKey
# where this aiohttp has one, a plain string in older 3.x).
_NOTE: Any = web.RequestKey("onwatch_note", str) if hasattr(web, "RequestKey") else "onwatch_note"


class Refused(Exception):
    """An answer other than 2xx; `close` ends the connection (body left unread)."""

    def __init__(
        self, status: int, reason: str, *, retry_after: int | None = None, close: bool = False
    ) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason
        self.retry_after, self.close = retry_after, close

    def response(self) -> web.Response:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else None
        response = web.json_response({"error": self.reason}, status=self.status, headers=headers)
        if self.close:
            response.force_close()
        return response


# --- what each kind of hook checks and stores -------------------------------------------------


@dataclass(frozen=True)
class Scheme:
    """A signing scheme and where the delivery's id and payload come from."""

    signature_header: str
    # (request headers, secrets, now) -> the body's Verifier; raises SignatureError when the
    # headers alone already fail (missing, malformed, too many signatures)
    verifier: Callable[[Mapping[str, str], tuple[bytes, ...], int], Verifier]
    # (request headers, verified raw body) -> (source_id, payload); raises Refused (400)
    event: Callable[[Mapping[str, str], bytes], tuple[str, Any]]

    def signed(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries this scheme's signature header at all."""
        return bool(headers.get(self.signature_header))


def _parse_json(body: bytes) -> Any:
    def refuse_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(body, parse_constant=refuse_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise Refused(400, f"malformed JSON: {exc}"[:200]) from None


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise Refused(400, f"missing {name}")
    return value


def _hmac_scheme(
    header: str, event: Callable[[Mapping[str, str], bytes], tuple[str, Any]]
) -> Scheme:
    """GitHub's scheme: `header: sha256=<hex HMAC of the raw body>`."""

    def verifier(headers: Mapping[str, str], secrets: tuple[bytes, ...], now: int) -> Verifier:
        return sha256_header_verifier(headers.get(header), secrets, name=header)

    return Scheme(header, verifier, event)


def _github_event(headers: Mapping[str, str], body: bytes) -> tuple[str, Any]:
    delivery = _header(headers, "X-GitHub-Delivery")
    kind = _header(headers, "X-GitHub-Event")
    if body.startswith(b"payload="):
        # GitHub's other content type, application/x-www-form-urlencoded: the JSON is the
        # form field `payload`. Recognised by the body (JSON never starts so), not by the
        # Content-Type header, which hand-made senders such as curl -d often get wrong.
        try:
            form = parse_qs(body.decode("utf-8"), strict_parsing=True, max_num_fields=10)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "malformed form body") from None
        if len(form.get("payload", ())) != 1:
            raise Refused(400, "form body has no payload field")
        body = form["payload"][0].encode("utf-8")
    return delivery, {"event": kind, "body": _parse_json(body)}


def _stripe_verifier(headers: Mapping[str, str], secrets: tuple[bytes, ...], now: int) -> Verifier:
    return stripe_verifier(headers.get("Stripe-Signature"), secrets, now=now)


def _stripe_event(headers: Mapping[str, str], body: bytes) -> tuple[str, Any]:
    event = _parse_json(body)
    event_id = event.get("id") if isinstance(event, dict) else None
    if not isinstance(event_id, str) or not event_id:
        raise Refused(400, "event has no id")
    return event_id, event


def _standard_names(headers: Mapping[str, str]) -> str:
    """The header prefix the sender used: `webhook-` (the specification's), or `svix-`, which
    Svix-based senders send instead unless told otherwise (the same scheme)."""
    return (
        "svix-"
        if not headers.get("webhook-signature") and headers.get("svix-signature")
        else "webhook-"
    )


def _standard_verifier(
    headers: Mapping[str, str], secrets: tuple[bytes, ...], now: int
) -> Verifier:
    prefix = _standard_names(headers)
    return standard_verifier(
        headers.get(prefix + "id", "").strip(),
        headers.get(prefix + "timestamp", "").strip(),
        headers.get(prefix + "signature"),
        secrets,
        now=now,
    )


def _standard_event(headers: Mapping[str, str], body: bytes) -> tuple[str, Any]:
    # The id is signed (verified above): a replay under a new id fails the signature, a
    # replay under the same id is a duplicate.
    return _header(headers, _standard_names(headers) + "id"), _parse_json(body)


class _StandardScheme(Scheme):
    def signed(self, headers: Mapping[str, str]) -> bool:
        return bool(headers.get("webhook-signature") or headers.get("svix-signature"))


SCHEMES = {
    "github": _hmac_scheme("X-Hub-Signature-256", _github_event),
    "stripe": Scheme("Stripe-Signature", _stripe_verifier, _stripe_event),
}
# Every other hook: Standard Webhooks. The body-only X-Onwatch-Signature scheme it replaces
# signed neither an id nor a time, so a captured request could be replayed forever under a
# fresh Idempotency-Key.
STANDARD = _StandardScheme("webhook-signature", _standard_verifier, _standard_event)


# --- the app ------------------------------------------------------------------------------


class Evicted(ConnectionError):
    """Raised into a request's body read: newer requests needed the unverified bytes it held.
    A ConnectionError, as the connection it ends: aiohttp's reads after the answer raise it
    again, and the server log drops those like any client gone mid-request."""


class _Holder:
    __slots__ = ("taken", "request")

    def __init__(self, request: web.Request) -> None:
        self.taken = 0
        self.request = request


class UnverifiedBytes:
    """Bytes of bodies held before their signature is checked, across every request, at most
    `limit`. A request takes its bytes as they arrive and gives them back once its signature
    is checked or it is refused. When a piece does not fit, the requests that have held bytes
    the longest are refused (503) to make room: a sender's delivery arrives whole in a moment,
    so what is still unverified after the others came is what waits on purpose; a newcomer is
    refused only if nothing else holds anything."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.evicted = 0
        self._holders: dict[_Holder, None] = {}  # oldest first

    @contextlib.contextmanager
    def hold(self, request: web.Request) -> Iterator[Callable[[int], bool]]:
        """A `take(n) -> bool` for `request`, false when `n` more bytes cannot fit; what it
        took is given back when the block ends."""
        holder = _Holder(request)
        self._holders[holder] = None

        def take(size: int) -> bool:
            while self.held + size > self.limit:
                oldest = next((h for h in self._holders if h is not holder and h.taken), None)
                if oldest is None:
                    return False
                self._evict(oldest)
            self.held += size
            holder.taken += size
            return True

        try:
            yield take
        finally:
            self._holders.pop(holder, None)
            self.held -= holder.taken

    def _evict(self, holder: _Holder) -> None:
        # Its bytes count as given back now; they are freed as soon as its read wakes up
        # with Evicted and its request is refused.
        del self._holders[holder]
        self.held -= holder.taken
        holder.taken = 0
        self.evicted += 1
        holder.request.content.set_exception(Evicted())


class Receiver:
    """The request handling of one inbox: `app` is the aiohttp application."""

    def __init__(
        self,
        inbox: Inbox,
        secrets: Secrets,
        *,
        max_body: int | None = None,
        allow_hosts: Iterable[str] = (),
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.inbox = inbox
        self.guard = guard
        self.secrets = secrets
        self.max_body = max_body or inbox.settings.max_payload_bytes
        self.unverified = UnverifiedBytes(max(UNVERIFIED_BYTES, 2 * self.max_body))
        self.allow_hosts = frozenset(_host_name(h) for h in allow_hosts)
        # (monotonic) when the log last said the store refuses writes (a full disk, a server
        # that stopped taking writes)
        self._refused_said = -REFUSED_SAID_EVERY
        first = [guard.middleware] if guard is not None else []
        self.app = web.Application(middlewares=[*first, self._host_check])
        self.app.router.add_post(
            f"/hooks/{{source:{SOURCE_PATTERN}}}", self.handle, expect_handler=self.expect
        )
        # GET /metrics: the inbox's state and this receiver's counts, for Prometheus
        from onwatch.core.metrics import InboxMetrics

        self.metrics = InboxMetrics(inbox)
        self.app.router.add_get("/metrics", self.metrics.handle)

    @web.middleware
    async def _host_check(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Everything but a hook (i.e. /metrics) answers only under a name that cannot be
        rebound: a page at http://evil.example:8787/ whose name an attacker re-points at
        127.0.0.1 would otherwise read /metrics from the victim's browser. Hooks are signed
        and reached through proxies and tunnels under any name, so they are not checked."""
        host = request.headers.get(hdrs.HOST)
        if (
            host is not None
            and not request.path.startswith("/hooks/")
            and not _local_name(_host_name(host), self.allow_hosts)
        ):
            request[_NOTE] = "unknown Host (use an address, localhost or --allow-host)"
            return web.json_response(
                {"error": "this server does not answer under that name (see --allow-host)"},
                status=421,
            )
        return await handler(request)

    def _preflight(self, request: web.Request) -> tuple[str, Scheme, Verifier]:
        """What can be refused from the request line and headers alone."""
        source = request.match_info["source"]
        secrets = self.secrets.for_source(source)
        if not secrets:
            raise Refused(404, "no such hook")
        declared = request.content_length
        if declared is not None and declared > self.max_body:
            raise Refused(413, f"body over {self.max_body} bytes", close=True)
        scheme = SCHEMES.get(source, STANDARD)
        if not scheme.signed(request.headers):
            raise Refused(401, f"missing {scheme.signature_header}")
        try:
            verifier = scheme.verifier(request.headers, secrets, self.inbox.now())
        except SignatureError as exc:
            raise Refused(401, exc.reason) from None
        return source, scheme, verifier

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: refuse before the client sends the body, when we can."""
        try:
            self._preflight(request)
        except Refused as refused:
            request[_NOTE] = refused.reason
            refused.close = True  # the body that the client holds back must not follow
            return refused.response()
        await _continue(request)
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            source, scheme, verifier = self._preflight(request)
            with self.unverified.hold(request) as take:
                body = await self._read_body(request, verifier, take)
                try:
                    verifier.check()
                except SignatureError as exc:
                    raise Refused(401, exc.reason) from None
            source_id, payload = scheme.event(request.headers, body)
            request[_NOTE] = f"{source}/{_log_text(source_id, 80)}"
            stored = await self._store(source, source_id, payload)
            self.metrics.intake.stored(source, stored)
        except Refused as refused:
            note = request.get(_NOTE)
            request[_NOTE] = f"{note} {refused.reason}" if note else refused.reason
            return refused.response()
        request[_NOTE] += " stored" if stored else " duplicate"
        if stored:
            return web.json_response({"stored": True}, status=202)
        return web.json_response({"stored": False, "duplicate": True}, status=200)

    async def _read_body(
        self, request: web.Request, verifier: Verifier, take: Callable[[int], bool]
    ) -> bytes:
        """The raw body, read in pieces, each hashed as it arrives (no step hashes a whole
        body) and counted against max_body and the unverified budget (`take`)."""
        chunks: list[bytes] = []
        try:
            return await self._read_chunks(request, verifier, take, chunks)
        except Evicted:
            refused = Refused(
                503,
                "too many unverified bytes in flight; retry later",
                retry_after=RETRY_AFTER_BUSY,
                close=True,
            )
        except TimeoutError:
            refused = Refused(408, f"body not received within {BODY_TIMEOUT:g} s", close=True)
        except (ContentLengthError, ConnectionError):
            # The client left mid-body (aiohttp says which way it noticed: a reset, or the end
            # of the stream before the declared length). No one reads this answer; the
            # access log line is what is left of the request.
            refused = Refused(400, "aborted: the connection closed mid-body", close=True)
        except (HttpProcessingError, web.RequestPayloadError):  # framing, Content-Encoding
            refused = Refused(400, "malformed body (its framing or encoding)", close=True)
        finally:
            # Free the pieces now: the exception that ended the read stays on the request's
            # stream (aiohttp raises it again), and its traceback would keep them alive.
            chunks.clear()
        raise refused

    async def _read_chunks(
        self,
        request: web.Request,
        verifier: Verifier,
        take: Callable[[int], bool],
        chunks: list[bytes],
    ) -> bytes:
        size = 0
        async with asyncio.timeout(BODY_TIMEOUT):
            while True:
                chunk = await request.content.read(min(1 << 16, self.max_body - size + 1))
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > self.max_body:
                    raise Refused(413, f"body over {self.max_body} bytes", close=True)
                if not take(len(chunk)):
                    raise Evicted()
                verifier.update(chunk)
                chunks.append(chunk)

    async def _store(self, source: str, source_id: str, payload: Any) -> bool:
        replaced = self.inbox.file_replaced()
        if replaced is not None:
            # Acknowledging would store the delivery in a file nobody reads: refuse, so the
            # sender retries once the receiver is restarted on the file now at the path.
            log.error("refusing %s delivery: %s; restart the receiver", source, replaced)
            raise Refused(
                503,
                "inbox file deleted or replaced; restart the receiver",
                retry_after=RETRY_AFTER_BUSY,
            )
        try:
            return await self.inbox.ingest(source, source_id, payload)
        except BudgetExceeded:
            raise Refused(
                503, "inbox full (max_pending); retry later", retry_after=RETRY_AFTER_FULL
            ) from None
        except WritesRefused as exc:
            # The sender retries later; the log says why, once a minute at most: every
            # delivery meanwhile is refused for the same reason (a disk stays full until
            # someone frees space; a failover ends when a primary takes writes again).
            if time.monotonic() - self._refused_said >= REFUSED_SAID_EVERY:
                self._refused_said = time.monotonic()
                log.error("refusing deliveries until the inbox takes writes again: %s", exc)
            if isinstance(exc, StorageFull):
                raise Refused(
                    503,
                    "no room to store the delivery (disk full); retry later",
                    retry_after=RETRY_AFTER_FULL,
                ) from None
            raise Refused(
                503,
                "the database takes no writes for now (a failover?); retry later",
                retry_after=RETRY_AFTER_BUSY,
            ) from None
        except ConnectionLost:
            raise Refused(
                503, "cannot reach the database; retry later", retry_after=RETRY_AFTER_BUSY
            ) from None
        except InboxBusy:
            raise Refused(
                503, "inbox locked by another process; retry later", retry_after=RETRY_AFTER_BUSY
            ) from None
        except BadInput as exc:
            # Either the delivery id (too long, NUL) or the payload over the inbox's
            # max_payload_bytes, which the inbox's message names; --max-body can exceed it.
            status = 413 if "max_payload_bytes" in str(exc) else 400
            raise Refused(status, str(exc)[:200]) from None
        except RecursionError:
            raise Refused(400, "JSON nested too deeply") from None
        except InboxError as exc:
            log.error("could not store %s delivery: %s", source, exc)
            raise Refused(500, "could not store the delivery") from None


def _host_name(host: str) -> str:
    """The name part of a Host header (`name:port`, `[v6]:port`), lower-cased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdigit() else host


def _local_name(name: str, allowed: frozenset[str]) -> bool:
    """Whether a browser can only have reached us under `name` because it means us: an IP
    address, `localhost` and its subdomains (never sent to DNS), this machine's own name,
    or a name the operator allowed. An attacker's DNS can re-point any other name."""
    name = name.rstrip(".")
    if name in allowed or name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    own = socket.gethostname().lower()
    return name in (own, own.split(".")[0])


def _log_text(text: str, limit: int = 200) -> str:
    """`text` safe for one log line: length bounded, escaped like all untrusted text."""
    return printable(text if len(text) <= limit else text[:limit] + "…")


class AccessLog(AbstractAccessLogger):
    """One line per request: peer, method, path, status, outcome, time. Never a header value
    other than the delivery id, never a body."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        note = request.get(_NOTE)
        if note is None and response.status == 400 and _malformed(request):
            note = "malformed request"
        self.logger.info(
            "%s %s %s %d %s %.1fms",
            request.remote,
            _log_text(request.method, 20),
            _log_text(request.raw_path),
            response.status,
            note or "-",
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def _malformed(request: web.BaseRequest) -> bool:
    """A request aiohttp could not parse: it hands the access log a stand-in with method
    UNKNOWN and no headers (the one line such a request leaves; ServerLog drops the rest)."""
    return request.method == "UNKNOWN" and not request.headers


# --- running it -------------------------------------------------------------------------------


@dataclass
class RunningServer:
    """A started receiver: where it listens, and how to stop it (finishing requests)."""

    runner: web.AppRunner
    receiver: Receiver
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def guard(self) -> ConnectionGuard:
        assert self.receiver.guard is not None  # start_server always gives one
        return self.receiver.guard

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_server(
    inbox: Inbox,
    *,
    secrets: Secrets,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body: int | None = None,
    allow_hosts: Iterable[str] = (),
    max_connections: int | None = None,
) -> RunningServer:
    """Serve the hooks in `secrets` for `inbox` on host:port (0 picks a free port), with
    `max_connections` open at most (default: connections.MAX_CONNECTIONS, or what the
    descriptor limit allows)."""
    guard = ConnectionGuard(
        log,
        limit=max_connections,
        refused=refusal(
            json.dumps({"error": "too many connections; retry later"}), "application/json"
        ),
    )
    receiver = Receiver(
        inbox,
        secrets,
        max_body=max_body,
        allow_hosts=allow_hosts,
        guard=guard,
    )
    runner = web.AppRunner(
        receiver.app,
        access_log_class=AccessLog,
        access_log=log,
        logger=ServerLog(log),
        keepalive_timeout=HEAD_TIMEOUT,
        lingering_time=LINGERING_TIME,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    await runner.setup()
    try:
        await GuardedSite(runner, host, port, guard).start()
    except BaseException:
        await runner.cleanup()
        raise
    quiet_accept_errors(log)
    bound_host, bound_port = runner.addresses[0][:2]
    return RunningServer(runner, receiver, bound_host, bound_port)


def run(
    path: str,
    *,
    host: str,
    port: int,
    secrets: Secrets,
    max_body: int | None,
    busy_timeout: float = 5.0,
    name: str = "default",
    allow_hosts: Iterable[str] = (),
) -> int:
    """Serve until SIGINT or SIGTERM. Returns the exit status, as the onwatch CLI counts
    them: 0 after a clean stop; 2 if PATH is not an inbox (missing: `onwatch init` makes one);
    3 if it stayed locked; 1 if it cannot be opened otherwise or the port cannot be bound."""
    # Every onwatch line, the engine's too (a lost connection, a session the server ended
    # while idle): one format, from INFO up. Without a handler of their own they went to
    # Python's last resort, warnings bare and INFO lines dropped.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter("%(asctime)s onwatch serve: %(message)s"))
    ours = logging.getLogger("onwatch")
    saved = ours.level, ours.propagate
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False
    try:
        return asyncio.run(
            _serve(path, host, port, secrets, max_body, busy_timeout, name, tuple(allow_hosts))
        )
    except KeyboardInterrupt:  # platforms without loop signal handlers
        return 0
    finally:
        ours.removeHandler(handler)
        ours.setLevel(saved[0])
        ours.propagate = saved[1]


async def _serve(
    path: str,
    host: str,
    port: int,
    secrets: Secrets,
    max_body: int | None,
    busy_timeout: float,
    name: str = "default",
    allow_hosts: tuple[str, ...] = (),
) -> int:
    # Stop signals are this loop's from its start: one that comes while the inbox opens or
    # the port binds is kept, and the server then stops at once and cleanly (the signal's
    # default would end the process with the port bound and the inbox open).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # Windows: Ctrl-C raises instead
            pass
    try:
        opened = await Inbox.open_when_reachable(
            path,
            stopped=stop.is_set,
            logger=log,
            name=name,
            create=False,
            busy_timeout=busy_timeout,
        )
    except InboxError as exc:
        print(f"onwatch serve: {printable(str(exc))}", file=sys.stderr)
        return (
            2 if isinstance(exc, (NotAnInbox, BadInput)) else 3 if isinstance(exc, InboxBusy) else 1
        )
    except (OSError, ValueError) as exc:  # a path the OS or SQLite cannot take (too long, NUL)
        print(
            f"onwatch serve: cannot open {printable(repr(path))}: "
            f"{printable(str(getattr(exc, 'strerror', None) or exc))}",
            file=sys.stderr,
        )
        return 2
    if opened is None:  # stopped while waiting for the database
        log.info("stopped before listening")
        return 0
    inbox = opened
    try:
        if inbox.read_only is not None:  # every delivery would be refused: say so now
            print(
                f"onwatch serve: cannot store deliveries: {printable(inbox.read_only)}",
                file=sys.stderr,
            )
            return 1
        if stop.is_set():  # stopped while the inbox opened: never listen
            log.info("stopped before listening")
            return 0
        try:
            server = await start_server(
                inbox,
                secrets=secrets,
                host=host,
                port=port,
                max_body=max_body,
                allow_hosts=allow_hosts,
            )
        except OSError as exc:
            print(
                f"onwatch serve: cannot listen on {host}:{port}: "
                f"{printable(str(exc.strerror or exc))}",
                file=sys.stderr,
            )
            return 1
        log.info(
            "%s; listening on %s; max body %d bytes; at most %d connection(s)",
            # A database as the inbox names it ("URL inbox NAME", no password: a log is
            # read by others); a file as an absolute path, escaped.
            inbox.path if is_url(path) else f"inbox {printable(os.path.abspath(path))}",
            server.url,
            server.receiver.max_body,
            server.guard.limit,
        )
        log.info("serving %s", secrets.describe())
        if not _is_loopback(host):
            log.warning(
                "listening beyond this machine (%s): put a TLS reverse proxy in "
                "front, see docs/operating.md",
                host,
            )
        try:
            await stop.wait()
        finally:
            log.info("stopping: finishing requests in flight")
            await server.close()
    finally:
        await inbox.close()
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
