"""CI smoke test of the benchmark suite: the core benchmark runs in --quick mode, checks its own
results (every workload verifies what it wrote) and prints its table. No timing is asserted:
figures on a shared CI machine mean nothing; `python3 dev.py bench` is the measurement."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_core_benchmark_runs_quick_and_prints_its_table():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench" / "bench_core.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert any(
        line.startswith("workload")
        and "reference" in line
        and "yardstick" in line
        and "async engine" in line
        and "vs yardstick" in line
        for line in lines
    ), result.stdout
    for workload in (
        "sequential ingest",
        "duplicate ingest",
        "run cycle",
        "scheduler pass",
        "dispatch of",
        "concurrent intake",
        "counts",
        "page pending: next",
        "lease",
        "next timers",
        "held messages",
        "approvals waiting",
    ):
        assert any(workload in line for line in lines), f"no row for {workload}:\n{result.stdout}"
    assert re.fullmatch(r"minimum ratio/target: \d+\.\d\d \(.+\)", lines[-1]), lines[-1]


def test_wake_benchmark_runs_quick_and_prints_its_table():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench" / "bench_wake.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    for row in (
        "worker (notifier): commit → agent called",
        "TUI (notifier): commit → row shown",
        "worker (0.5 s poll, before)",
        "idle worker CPU (notifier)",
        "idle TUI CPU (notifier)",
    ):
        assert any(line.startswith(row) for line in lines), f"no row {row}:\n{result.stdout}"
    assert re.fullmatch(r"minimum target/measured: \d+\.\d\d", lines[-1]), lines[-1]
