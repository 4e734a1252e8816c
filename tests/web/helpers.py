"""`onwatch web` as a real OS process, the system's Chromium, and the terminal's text as seen
by the browser (the websocket frames it received, escape sequences stripped)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The system browser, headless, with nothing that phones home or downloads.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
NO_CHROMIUM = (
    "no Chromium on this machine (Debian/Ubuntu: apt-get install chromium; "
    ".ci/run installs it when run as root); the browser test launches the system's "
    "browser and never downloads one"
)

HOSTILE_ACTION = (
    "refund 40 [@click=app.quit]x[/] <script>window.__pwned=1</script> "
    "\x1b]0;PWNED\x07\x1b[2J<img src=x onerror=window.__pwned=2>"
)
HOSTILE_PAYLOAD = (
    "[@click=app.quit]pay[/] <script>window.__pwned=3</script> "
    "\x1b]0;PAYLOAD\x07 [link=https://evil.example]here[/link]"
)
CSI = re.compile(rb"\x1b\[[0-9;?<>=]*[ -/]*[@-~]")


class WebProcess:
    """`onwatch web DB --port 0 …` in its own process; stdout and stderr kept in files."""

    def __init__(
        self, target: Path, logs: Path, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.target, self.extra = target, extra
        self.out, self.err = logs / "web.out", logs / "web.err"
        base = {k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")}
        self.env = {**base, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        self.url = self.token = ""

    def start(self, timeout: float = 20.0) -> "WebProcess":
        self._out, self._err = open(self.out, "wb"), open(self.err, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onwatch", "web", str(self.target), "--port", "0", *self.extra],
            stdout=self._out,
            stderr=self._err,
            env=self.env,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(
                r"^open (http://\S+?)/\?token=(\S+)$", self.out.read_text(), re.MULTILINE
            )
            if found:
                self.url, self.token = found.group(1), found.group(2)
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"onwatch web did not start:\n{self.err.read_text()}")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()
            self._err.close()


class Screen:
    """What the page's terminal received over its websocket, as text."""

    def __init__(self, page) -> None:
        self.frames: list[bytes] = []
        page.on("websocket", self._watch)

    def _watch(self, socket) -> None:
        socket.on(
            "framereceived",
            lambda payload: self.frames.append(
                payload if isinstance(payload, bytes) else payload.encode()
            ),
        )

    @property
    def raw(self) -> bytes:
        return b"".join(self.frames)

    @property
    def text(self) -> str:
        return CSI.sub(b"", self.raw).decode("utf-8", "replace")

    async def press(self, page, key: str, timeout: float = 10.0) -> None:
        """Press `key` and wait until the app has redrawn something in answer."""
        seen = len(self.frames)
        await page.keyboard.press(key)
        deadline = time.monotonic() + timeout
        while len(self.frames) == seen and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def mark(self) -> int:
        """Where the frames stand now: `wait_for(..., since=mark)` looks only at later ones."""
        return len(self.frames)

    def text_since(self, since: int) -> str:
        return CSI.sub(b"", b"".join(self.frames[since:])).decode("utf-8", "replace")

    async def wait_for(self, *needles: str, timeout: float = 20.0, since: int = 0) -> None:
        """Until every needle was drawn (in the frames after `since`: text drawn before a key
        was pressed cannot then pass for its answer)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(n in self.text_since(since) for n in needles):
                return
            await asyncio.sleep(0.1)
        text = self.text_since(since)
        missing = [n for n in needles if n not in text]
        raise AssertionError(f"never shown: {missing}\n--- screen text ---\n{text[-3000:]}")


async def launch(playwright):
    return await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
