"""Browser sessions of `onwatch web`: random, held by the server only, ending on logout, on
expiry and with the server; plus the one-time login code the start-up link carries.

A session id is 256 random bits that only the browser's cookie holds; the server keeps its
SHA-256, so the table is looked up by a value an attacker cannot steer, and a memory dump of
the server holds no cookie. Nothing about a session can be computed offline from the token
(the cookie used to be an HMAC of it: valid forever, across restarts, with no logout).

Every session has the desks (websockets, one `onwatch tui` process each) opened under it;
ending the session closes them, which ends their processes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

SESSION_LIFETIME = 12 * 3600.0  # seconds from login: a working day, then log in again
MAX_SESSIONS = 64  # at once; the oldest ends first when more log in
# Request key: the Session the door admitted the request under.
SESSION: Any = (
    web.RequestKey("onwatch_session", object) if hasattr(web, "RequestKey") else "onwatch_session"
)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


@dataclass(eq=False)
class Session:
    """One login: `label` names it in logs and the audit trail (never the secret id)."""

    label: str
    started: float
    expires: float
    # the open desks: anything with an async close() (the websockets)
    desks: set[Any] = field(default_factory=set)
    # a script admitted by `Authorization: Bearer`, not a browser login: never expires here
    bearer: bool = False


class Sessions:
    """The server's sessions and its one-time login code; `clock` is injectable."""

    def __init__(
        self,
        *,
        lifetime: float = SESSION_LIFETIME,
        limit: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
        on_end: Callable[[Session], None] | None = None,
    ) -> None:
        self.lifetime, self.limit, self.clock = lifetime, limit, clock
        self.on_end = on_end
        self._by_digest: dict[bytes, Session] = {}  # oldest first
        self._code: bytes | None = None
        self._count = 0
        # Scripts with the token share one pseudo-session, so their desks are capped too.
        self.bearer = Session("bearer", clock(), float("inf"), bearer=True)

    def __len__(self) -> int:
        return len(self._by_digest)

    def issue_code(self) -> str:
        """A new one-time login code (the previous one stops working)."""
        code = secrets.token_urlsafe(32)
        self._code = _digest(code)
        return code

    def redeem(self, code: str) -> bool:
        """True once for the current code, then never again."""
        if self._code is None or not hmac.compare_digest(_digest(code), self._code):
            return False
        self._code = None
        return True

    def start(self) -> tuple[str, Session]:
        """A new session: (the cookie's value, the session)."""
        self.sweep()
        while len(self._by_digest) >= self.limit:
            self.end(next(iter(self._by_digest.values())))
        self._count += 1
        now = self.clock()
        secret = secrets.token_urlsafe(32)
        session = Session(f"{self._count}-{secrets.token_hex(3)}", now, now + self.lifetime)
        self._by_digest[_digest(secret)] = session
        return secret, session

    def find(self, cookie: str | None) -> Session | None:
        """The live session a cookie names, or None (an expired one ends here)."""
        if not cookie:
            return None
        session = self._by_digest.get(_digest(cookie))
        if session is not None and session.expires <= self.clock():
            self.end(session)
            return None
        return session

    def end(self, session: Session) -> None:
        """End `session` (logout, expiry, eviction); its desks are closed by `on_end`."""
        for digest, known in list(self._by_digest.items()):
            if known is session:
                del self._by_digest[digest]
        if self.on_end is not None:
            self.on_end(session)

    def sweep(self) -> int:
        """End every expired session; how many ended."""
        now = self.clock()
        expired = [s for s in self._by_digest.values() if s.expires <= now]
        for session in expired:
            self.end(session)
        return len(expired)

    def end_all(self) -> None:
        for session in list(self._by_digest.values()):
            self.end(session)
        if self.on_end is not None:
            self.on_end(self.bearer)
