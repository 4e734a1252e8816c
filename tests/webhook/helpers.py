"""Independent signers and small HTTP helpers for the webhook tests.

The signers follow each provider's documentation with hmac/hashlib directly; they do not use
core.webhooks, so a mistake in the receiver cannot cancel itself out.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GITHUB_SECRET = "gh-secret-Ünïcode"  # GitHub secrets are any text; signed as UTF-8
STRIPE_SECRET = "whsec_test_new"
STRIPE_OLD_SECRET = "whsec_test_old"
# Standard Webhooks secrets: whsec_ + base64 of the key bytes (here 24 fixed bytes).
HOOK_KEY = bytes(range(40, 64))
HOOK_SECRET = "whsec_" + base64.b64encode(HOOK_KEY).decode()

LAUNCHER = Path(__file__).with_name("serve_inbox.py")


def github_signature(secret: str, body: bytes) -> str:
    """docs.github.com, "Validating webhook deliveries": sha256= + hex HMAC-SHA256 of the
    raw payload, keyed by the webhook secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def stripe_signature(body: bytes, secrets: list[str], t: int) -> str:
    """docs.stripe.com, "Verify webhook signatures manually": t=<timestamp>, then one
    v1=<hex HMAC-SHA256 of "{t}.{payload}"> per active signing secret."""
    signed = f"{t}.".encode() + body
    return ",".join(
        [f"t={t}"]
        + ["v1=" + hmac.new(s.encode(), signed, hashlib.sha256).hexdigest() for s in secrets]
    )


def github_headers(
    body: bytes, delivery: str | None, *, secret: str = GITHUB_SECRET, event: str = "push"
) -> dict[str, str]:
    headers = {
        "X-Hub-Signature-256": github_signature(secret, body),
        "X-GitHub-Event": event,
        "Content-Type": "application/json",
    }
    if delivery is not None:
        headers["X-GitHub-Delivery"] = delivery
    return headers


def stripe_event(event_id: str, kind: str = "invoice.paid") -> bytes:
    return json.dumps(
        {"id": event_id, "object": "event", "type": kind, "data": {"object": {"id": "in_1"}}}
    ).encode()


def standard_signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """standardwebhooks.com, "Verifying webhook signatures": v1, + base64 HMAC-SHA256 of
    "{id}.{timestamp}.{body}", keyed by the base64-decoded part of the whsec_ secret."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def standard_headers(
    body: bytes, msg_id: str | None, *, secret: str = HOOK_SECRET, timestamp: int | None = None
) -> dict:
    """Standard Webhooks headers for `body` (webhook-id left out when msg_id is None)."""
    timestamp = int(time.time()) if timestamp is None else timestamp
    headers = {
        "webhook-timestamp": str(timestamp),
        "webhook-signature": standard_signature(secret, msg_id or "", timestamp, body),
        "Content-Type": "application/json",
    }
    if msg_id is not None:
        headers["webhook-id"] = msg_id
    return headers


def secrets_env() -> dict[str, str]:
    """The environment the subprocess receiver gets its secrets from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")}
    env.update(
        ONWATCH_GITHUB_SECRET=GITHUB_SECRET,
        ONWATCH_STRIPE_SECRET=f"{STRIPE_SECRET},{STRIPE_OLD_SECRET}",
        ONWATCH_HOOK_SECRET_CI=HOOK_SECRET,
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


class ServerProcess:
    """`onwatch serve` in its own OS process (via the launcher), stderr kept in a file.

    `server = await ServerProcess(db, log).start()` creates the inbox if needed (as
    `onwatch init` would), starts the process and waits for its "listening on" line.
    `nofile` sets the process's descriptor limit (soft and hard), e.g. the common 1024."""

    def __init__(self, db: Path, log: Path, *extra: str, nofile: int | None = None) -> None:
        self.db, self.log, self.extra = db, log, extra
        self.nofile = nofile
        self.env = secrets_env()
        self.command = [sys.executable, str(LAUNCHER), str(db)]
        self.url = ""

    async def start(self, timeout: float = 20.0) -> "ServerProcess":
        from onwatch.core import Inbox

        await (await Inbox.open(self.db)).close()
        self._log_file = open(self.log, "ab")
        log_start = self._log_file.tell()  # a restart appends to the same log
        self.proc = subprocess.Popen(
            [*self.command, "--port", "0", *self.extra],
            stdout=subprocess.DEVNULL,
            stderr=self._log_file,
            env=self.env,
            preexec_fn=self._limit if self.nofile else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[log_start:].decode(errors="replace")
            found = re.findall(r"listening on (http://\S+?);", text)
            if found:
                self.url = found[-1]
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{text}")
            await asyncio.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"server did not start:\n{self.log.read_text()}")

    def _limit(self) -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.url.removeprefix("http://").rpartition(":")
        return host.strip("[]"), int(port)

    def stop(self, sig: int, timeout: float = 20.0) -> int:
        """Send `sig` (harmless if the process already died) and return its exit status."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log_file.close()


async def post(http, url: str, body: bytes, headers: dict) -> tuple[int, dict, dict]:
    """POST and return (status, JSON answer, response headers)."""
    async with http.post(url, data=body, headers=headers) as response:
        return response.status, await response.json(), dict(response.headers)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def stored(inbox, source: str) -> dict[str, Any]:
    """{source_id: payload} of every event of `source` in the inbox, read through its API."""
    found: dict[str, Any] = {}
    after = None
    while page := await inbox.events("pending", limit=1000, after=after):
        found.update((e.source_id, e.payload) for e in page if e.source == source)
        after = page[-1].id
    return found
