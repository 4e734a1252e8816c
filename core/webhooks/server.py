"""The webhook receiver: an aiohttp app that verifies, deduplicates and durably stores deliveries.

One route, `POST /hooks/{source}`: `github` and `stripe` use their providers' signing
schemes, any other configured source Standard Webhooks (`webhook-id`, `webhook-timestamp`,
`webhook-signature`; the `svix-` names too), deduplicated on `webhook-id`. The order of checks
for every request:

    404 hook not configured → 413 declared Content-Length over the limit → 401 no signature
    header → read the body, counting bytes (413 past the limit, 408 too slow) → 401 signature
    or Stripe timestamp → 400 delivery id / JSON → ingest → 202 stored | 200 duplicate |
    503 inbox full or locked (Retry-After).

A hook without a configured secret answers 404, like an unknown path, not 401: there is
nothing it could be signed with, so it does not exist; a sender's delivery log then says
"not found" (wrong URL, or the receiver lacks the secret) instead of sending the operator to
hunt for a secret mismatch, and a scanner cannot tell unconfigured names from unknown ones.

Nothing is parsed before the signature is verified, and nothing is answered 2xx before
`Inbox.ingest` has returned, i.e. before the event is committed (concurrent deliveries share
one commit through the inbox's group commit; each still waits for its own).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.abc import AbstractAccessLogger

from onwatch.core import BadInput, BudgetExceeded, Inbox, InboxBusy, InboxError, NotAnInbox
from onwatch.core.text import printable

from .config import SOURCE_PATTERN, Secrets
from .signatures import SignatureError, verify_sha256_header, verify_standard, verify_stripe


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
RETRY_AFTER_BUSY = 5  # seconds: the database was locked past the busy timeout
RETRY_AFTER_FULL = 60  # seconds: max_pending reached; the worker has to drain first
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
    # (raw body, request headers, secrets, now) -> None; raises SignatureError
    verify: Callable[[bytes, Mapping[str, str], tuple[bytes, ...], int], None]
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

    def verify(
        body: bytes, headers: Mapping[str, str], secrets: tuple[bytes, ...], now: int
    ) -> None:
        verify_sha256_header(body, headers.get(header), secrets, name=header)

    return Scheme(header, verify, event)


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


def _stripe_verify(
    body: bytes, headers: Mapping[str, str], secrets: tuple[bytes, ...], now: int
) -> None:
    verify_stripe(body, headers.get("Stripe-Signature"), secrets, now=now)


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


def _standard_verify(
    body: bytes, headers: Mapping[str, str], secrets: tuple[bytes, ...], now: int
) -> None:
    prefix = _standard_names(headers)
    verify_standard(
        body,
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
    "stripe": Scheme("Stripe-Signature", _stripe_verify, _stripe_event),
}
# Every other hook: Standard Webhooks. The body-only X-Onwatch-Signature scheme it replaces
# signed neither an id nor a time, so a captured request could be replayed forever under a
# fresh Idempotency-Key.
STANDARD = _StandardScheme("webhook-signature", _standard_verify, _standard_event)


# --- the app ------------------------------------------------------------------------------


class Receiver:
    """The request handling of one inbox: `app` is the aiohttp application."""

    def __init__(self, inbox: Inbox, secrets: Secrets, *, max_body: int | None = None) -> None:
        self.inbox = inbox
        self.secrets = secrets
        self.max_body = max_body or inbox.settings.max_payload_bytes
        self.app = web.Application()
        self.app.router.add_post(
            f"/hooks/{{source:{SOURCE_PATTERN}}}", self.handle, expect_handler=self.expect
        )
        # GET /metrics: the inbox's state and this receiver's counts, for Prometheus
        from onwatch.core.metrics import InboxMetrics

        self.metrics = InboxMetrics(inbox)
        self.app.router.add_get("/metrics", self.metrics.handle)

    def _preflight(self, request: web.Request) -> tuple[str, Scheme, tuple[bytes, ...]]:
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
        return source, scheme, secrets

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
            source, scheme, secrets = self._preflight(request)
            body = await self._read_body(request)
            try:
                scheme.verify(body, request.headers, secrets, self.inbox.now())
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

    async def _read_body(self, request: web.Request) -> bytes:
        """The raw body, read in pieces and never held past max_body + 1 bytes."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                while True:
                    chunk = await request.content.read(min(1 << 16, self.max_body - size + 1))
                    if not chunk:
                        return b"".join(chunks)
                    size += len(chunk)
                    if size > self.max_body:
                        raise Refused(413, f"body over {self.max_body} bytes", close=True)
                    chunks.append(chunk)
        except TimeoutError:
            raise Refused(408, f"body not received within {BODY_TIMEOUT:g} s", close=True) from None

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


def _log_text(text: str, limit: int = 200) -> str:
    """`text` safe for one log line: length bounded, escaped like all untrusted text."""
    return printable(text if len(text) <= limit else text[:limit] + "…")


class AccessLog(AbstractAccessLogger):
    """One line per request: peer, method, path, status, outcome, time. Never a header value
    other than the delivery id, never a body."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.logger.info(
            "%s %s %s %d %s %.1fms",
            request.remote,
            request.method,
            _log_text(request.raw_path),
            response.status,
            request.get(_NOTE, "-"),
            time * 1000,
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


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

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_server(
    inbox: Inbox,
    *,
    secrets: Secrets,
    host: str = "127.0.0.1",
    port: int = 0,
    max_body: int | None = None,
) -> RunningServer:
    """Serve the hooks in `secrets` for `inbox` on host:port (0 picks a free port)."""
    receiver = Receiver(inbox, secrets, max_body=max_body)
    runner = web.AppRunner(
        receiver.app,
        access_log_class=AccessLog,
        access_log=log,
        lingering_time=LINGERING_TIME,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
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
) -> int:
    """Serve until SIGINT or SIGTERM. Returns the exit status, as the onwatch CLI counts
    them: 0 after a clean stop; 2 if PATH is not an inbox (missing: `onwatch init` makes one);
    3 if it stayed locked; 1 if it cannot be opened otherwise or the port cannot be bound."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s onwatch serve: %(message)s"))
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        return asyncio.run(_serve(path, host, port, secrets, max_body, busy_timeout, name))
    except KeyboardInterrupt:  # platforms without loop signal handlers
        return 0
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]


async def _serve(
    path: str,
    host: str,
    port: int,
    secrets: Secrets,
    max_body: int | None,
    busy_timeout: float,
    name: str = "default",
) -> int:
    try:
        inbox = await Inbox.open(path, name=name, create=False, busy_timeout=busy_timeout)
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
    try:
        try:
            server = await start_server(
                inbox, secrets=secrets, host=host, port=port, max_body=max_body
            )
        except OSError as exc:
            print(
                f"onwatch serve: cannot listen on {host}:{port}: "
                f"{printable(str(exc.strerror or exc))}",
                file=sys.stderr,
            )
            return 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(signum, stop.set)
            except (NotImplementedError, RuntimeError):  # Windows: Ctrl-C raises instead
                pass
        log.info(
            "inbox %s; listening on %s; max body %d bytes",
            os.path.abspath(path),
            server.url,
            server.receiver.max_body,
        )
        log.info("serving %s", secrets.describe())
        if not _is_loopback(host):
            log.warning(
                "listening beyond this machine (%s): put a TLS reverse proxy in "
                "front, see the README",
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
