"""A small inbox for the browser tests and the browser screenshot: a few events in every pane
that matters, one approval waiting with hostile text in its action."""

from __future__ import annotations

from pathlib import Path

from onwatch.core import Inbox

from .helpers import HOSTILE_ACTION, HOSTILE_PAYLOAD

APPROVAL = "refund-msg-7"


async def seed(path: Path) -> None:
    async with await Inbox.open(path) as inbox:
        # The hostile event first: it is the Pending pane's first row, where the cursor starts,
        # so its detail opens with one key whatever the browser's key timing.
        await inbox.ingest("chat", "[@click=app.quit]x[/]", {"text": HOSTILE_PAYLOAD})
        for n, text in enumerate(["where is my order?", "refund 40 please", "thanks!"], 5):
            await inbox.ingest("chat", f"msg-{n}", {"text": text})
        await inbox.ingest("github", "delivery-81f2", {"event": "push"})
        await inbox.request_approval(APPROVAL, 4 * 3600, HOSTILE_ACTION)
        await inbox.request_approval("send-digest", 20 * 60, "send the daily digest to 3 users")
