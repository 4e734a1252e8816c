"""What the transcript, spend and notify tests share: workers in real processes running the
agents of tests/watch/agents.py, and the steps the `talker` agent takes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.worker.helpers import ROOT, env, wait_for


def start_worker(path: str, agent: str, test_dir: Path, *extra: str, name: str = "worker"):
    """`onwatch worker PATH --agent tests.watch.agents:AGENT` in its own process, its output
    in files of `test_dir`."""
    args = [
        sys.executable,
        "-m",
        "onwatch",
        "worker",
        path,
        "--agent",
        f"tests.watch.agents:{agent}",
        "--poll",
        "0.1",
        "--no-dispatch",
        *extra,
    ]
    with open(test_dir / f"{name}.out", "ab") as out, open(test_dir / f"{name}.err", "ab") as err:
        return subprocess.Popen(args, cwd=ROOT, env=env(test_dir), stdout=out, stderr=err)


def say(test_dir: Path, n: int, what: str) -> None:
    """Ask the talker for step `n` (written whole: the agent never reads half a step)."""
    step = test_dir / f"say-{n}"
    (test_dir / f"say-{n}.tmp").write_text(what)
    os.rename(test_dir / f"say-{n}.tmp", step)


def said(test_dir: Path, n: int) -> float | None:
    """When the talker did step `n` (its time.time()), or None before it has."""
    done = test_dir / f"said-{n}"
    return float(done.read_text()) if done.exists() else None


def log_of(test_dir: Path, name: str = "worker") -> str:
    err = test_dir / f"{name}.err"
    return err.read_text(errors="replace") if err.exists() else ""


__all__ = ["start_worker", "say", "said", "log_of", "wait_for"]


async def die(inbox, source_id: str) -> None:
    """An event that dies at once (the inbox's max_attempts 1), its error with an escape code
    in it (what the notifier says of it must be escaped)."""
    await inbox.ingest("chat", source_id, {})
    gen = await inbox.acquire("w")
    batch = await inbox.claim_batch("w", gen)
    await inbox.finish("w", gen, [e.id for e in batch], error=f"{source_id} failed \x1b[31m")
    await inbox.release("w", gen)
