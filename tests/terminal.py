"""A real terminal for tests of the desks: a tmux server of the test's own, keys in, screen out."""

from __future__ import annotations

import subprocess
import uuid


class Terminal:
    """One tmux server of our own (its own socket), a window of a given size."""

    def __init__(self, folder: str, env: dict[str, str], size: tuple[int, int] = (100, 30)):
        self.socket = f"onwatch-test-{uuid.uuid4().hex[:12]}"
        self.folder = folder
        self.env = env
        self.size = size

    def tmux(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=20,
        )
        return result.stdout

    def start(self, line: str, exit_file: str) -> None:
        width, height = self.size
        # A newline, not ';': an example may end with a # comment.
        script = f"cd {self.folder} && {line}\necho $? > {exit_file}"
        self.tmux("new-session", "-d", "-s", "desk", "-x", str(width), "-y", str(height), script)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "desk")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "desk", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
