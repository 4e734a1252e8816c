"""A TCP proxy in front of the test server, for faults a real network has: a server that
stops answering (packets swallowed, sockets left open) and an answer lost after a COMMIT
reached the server.

`Proxy(port)` listens on a free port of 127.0.0.1 and relays to 127.0.0.1:`port` on a thread
of its own; `url(base)` rewrites a server URL to go through it. Modes, switched at any time:

- `relay()`: bytes go through both ways (the start);
- `blackhole()`: nothing more goes through either way, every socket stays open: to a client
  the server has stopped answering. After `relay()`, a connection that swallowed bytes is
  closed, both ways: they are never delivered;
- `refuse()`: every open connection is closed and new ones are closed at once: to a client
  the server is down;
- `cut_after_commit()`: the next client message holding a COMMIT is relayed to the server,
  and the client's socket is then closed before any answer comes back: the transaction
  committed, the client cannot know.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from urllib.parse import urlsplit, urlunsplit


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode = "relay"
        self.commits_cut = 0
        self.held = 0  # chunks swallowed by the black hole: requests that will never be answered
        self._writers: set = set()  # every open socket's writer, both sides
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def url(self, base: str) -> str:
        parts = urlsplit(base)
        user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def relay(self) -> None:
        self.mode = "relay"

    def blackhole(self) -> None:
        self.mode = "blackhole"

    def refuse(self) -> None:
        self.mode = "refuse"
        for writer in list(self._writers):
            self._loop.call_soon_threadsafe(writer.close)

    def cut_after_commit(self) -> None:
        self.mode = "cut-after-commit"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    # --- the proxy's thread ---------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        await asyncio.start_server(self._serve, sock=self._sock)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter):
        if self.mode == "refuse":
            client_w.close()
            return
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers |= {client_w, server_w}
        cut = asyncio.Event()

        async def pump(reader, writer, upstream: bool) -> None:
            try:
                while True:
                    data = await reader.read(65536)
                    if not data or self.mode == "refuse":
                        break
                    if self.mode == "blackhole":
                        self.held += 1
                        while self.mode == "blackhole":
                            await asyncio.sleep(0.05)  # swallowed: held, never delivered
                        # Out of the black hole: this connection is dropped, both ways, and
                        # what it swallowed is not delivered late.
                        cut.set()
                    if cut.is_set():
                        break
                    writer.write(data)
                    await writer.drain()
                    if upstream and self.mode == "cut-after-commit" and b"COMMIT" in data:
                        self.mode = "relay"
                        self.commits_cut += 1
                        cut.set()
                        client_w.close()  # the answer to the COMMIT never reaches the client
                        break
            except (ConnectionError, OSError):
                pass
            finally:
                if not upstream or cut.is_set():
                    try:
                        writer.close()
                    except Exception:  # noqa: BLE001 - closing a socket already gone
                        pass

        await asyncio.gather(
            pump(client_r, server_w, True), pump(server_r, client_w, False), return_exceptions=True
        )
