"""CI smoke test of the TUI benchmark: --quick runs end to end and prints its table.

No timing is asserted (a shared CI machine's figures mean nothing); `python3 dev.py bench`
is the measurement.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_tui_benchmark_runs_quick_and_prints_its_table():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench" / "bench_tui.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for row in (
        "first full paint",
        "resident memory",
        "refresh after one row changed",
        "idle tick",
        "keypress to committed action",
    ):
        assert any(line.startswith(row) for line in result.stdout.splitlines()), (
            f"no row for {row}:\n{result.stdout}"
        )
