"""CI smoke test of the backend benchmark: it runs quick and prints both columns."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_backend_benchmark_runs_quick_and_prints_both_backends(pg):
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "bench" / "bench_backends.py"),
            "--quick",
            "--url",
            pg.new_database(),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "SQLite" in lines[0] and "PostgreSQL" in lines[0]
    assert any(line.startswith("run cycle") for line in lines)
    assert any(line.startswith("wake latency") for line in lines)


def test_queue_benchmark_runs_quick_for_onwatch(pg):
    """The comparison with the job queues, onwatch's side only (the peers would need their
    own environment installed): it runs and prints its table."""
    import os

    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "bench" / "bench_queues.py"),
            "--quick",
            "--contestants",
            "onwatch",
        ],
        cwd=ROOT,
        env=dict(os.environ, ONWATCH_TEST_DATABASE_URL=pg.base_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith("onwatch ")]
    assert len(table) == 1 and float(table[0].split()[1]) > 0, result.stdout
    assert "CPU s stolen by the hypervisor" in result.stdout and "load average" in result.stdout
