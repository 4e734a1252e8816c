"""Fixtures: a scratch inbox and a real receiver on 127.0.0.1 (a free port) serving it."""

from __future__ import annotations

import aiohttp
import pytest

from onwatch.core import Inbox
from onwatch.core.webhooks import Secrets, start_server

from .helpers import GITHUB_SECRET, HOOK_SECRET, STRIPE_SECRET


def default_secrets() -> Secrets:
    return Secrets.of(github=GITHUB_SECRET, stripe=STRIPE_SECRET, ci=HOOK_SECRET)


@pytest.fixture
async def inbox(tmp_path):
    inbox = await Inbox.open(tmp_path / "inbox.db")
    yield inbox
    await inbox.close()


@pytest.fixture
async def serve():
    """serve(inbox, secrets=…, max_body=…, max_connections=…) -> a running server, stopped
    after the test."""
    servers = []

    async def start(
        inbox,
        *,
        secrets: Secrets | None = None,
        max_body: int | None = None,
        max_connections: int | None = None,
    ):
        server = await start_server(
            inbox,
            secrets=secrets or default_secrets(),
            host="127.0.0.1",
            port=0,
            max_body=max_body,
            max_connections=max_connections,
        )
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def server(inbox, serve):
    return await serve(inbox)


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session
