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

from tests.waiting import until

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
    """`onwatch web DB --port 0 …` in its own process; stdout and stderr kept in files.

    After `start()`: `link` is the one-time address it printed (`origin/#code=…`),
    `origin` the address the desk answers under (http://desk-….localhost:PORT), `token` the
    generated token it printed (or "" when one was configured), `port` where it listens on
    127.0.0.1. `raw(...)` speaks HTTP to it by socket, with the desk's Host."""

    def __init__(
        self,
        target: Path,
        logs: Path,
        *extra: str,
        env: dict[str, str] | None = None,
        nofile: int | None = None,
    ) -> None:
        self.target, self.extra = target, extra
        self.out, self.err = logs / "web.out", logs / "web.err"
        base = {k: v for k, v in os.environ.items() if not k.startswith("ONWATCH_")}
        self.env = {**base, "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        self.nofile = nofile
        self.link = self.origin = self.code = self.token = ""
        self.port = 0

    @property
    def url(self) -> str:
        return self.origin

    @property
    def host(self) -> str:
        """The Host header the desk answers to."""
        return self.origin.split("://", 1)[1]

    def start(self, timeout: float = 20.0) -> "WebProcess":
        self._out, self._err = open(self.out, "ab"), open(self.err, "ab")
        out_start, err_start = self.out.stat().st_size, self.err.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "onwatch", "web", str(self.target), "--port", "0", *self.extra],
            stdout=self._out,
            stderr=self._err,
            env=self.env,
            preexec_fn=self._limit if self.nofile else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.out.read_bytes()[out_start:].decode(errors="replace")
            found = re.search(r"^open ((http://[^/\s]+)/#code=(\S+))$", text, re.MULTILINE)
            listening = re.search(
                r"listening on http://127\.0\.0\.1:(\d+) ",
                self.err.read_bytes()[err_start:].decode(errors="replace"),
            )
            if found and listening:
                self.link, self.origin, self.code = found.groups()
                token = re.search(
                    r"^token \(login form, Authorization: Bearer\): (\S+)$", text, re.M
                )
                self.token = token.group(1) if token else ""
                self.port = int(listening.group(1))
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"onwatch web did not start:\n{self.err.read_text()}")

    def _limit(self) -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()
            self._err.close()

    def log(self) -> str:
        return self.err.read_text(errors="replace")

    async def raw(
        self, head: str, body: bytes = b"", *, host: str | None = None
    ) -> tuple[int, str]:
        """Send one request (`head` without its Host line: the desk's Host is added) on a new
        connection to 127.0.0.1; (status, the answer's head and body as text)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            first, _, rest = head.partition("\r\n")
            request = f"{first}\r\nHost: {host or self.host}\r\n{rest}"
            if not request.endswith("\r\n\r\n"):
                request = request.rstrip("\r\n") + "\r\n\r\n"
            writer.write(request.encode("latin-1") + body)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(65536), 20)
        finally:
            writer.close()
        text = answer.decode("latin-1")
        return int(text.split(" ", 2)[1]), text

    async def login(self, token: str | None = None) -> str:
        """Log in with the token by the form (as a browser would); the session cookie's value."""
        form = f"token={token or self.token}".encode()
        status, answer = await self.raw(
            "POST /login HTTP/1.1\r\n"
            f"Origin: {self.origin}\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n"
            f"Content-Length: {len(form)}\r\nConnection: close\r\n",
            form,
        )
        assert status == 303, answer
        return re.search(r"Set-Cookie: onwatch_desk=([^;]+);", answer).group(1)


def descendants(pid: int) -> list[int]:
    """Live descendants of `pid` (Linux /proc): the desk processes of a server."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    kids = [int(p) for p in handle.read().split()]
            except FileNotFoundError:
                continue
            found += kids
            queue += kids
    return [pid for pid in found if alive(pid)]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def desk_processes(target: Path) -> list[int]:
    """Every live `onwatch tui TARGET` process under Textual's web driver, by /proc: a desk
    that outlived its server is no longer anyone's child."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read()
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if (
            b"TEXTUAL_DRIVER=" in environ
            and b"\0tui\0" in cmdline
            and os.fsencode(target) in cmdline
            and alive(int(entry))
        ):
            found.append(int(entry))
    return found


async def wait_for(condition, timeout: float = 30.0, what: str = "the condition"):
    """Poll `condition` until it is true (bounded); its value."""
    return await until(condition, timeout=timeout, what=what, interval=0.1)


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
