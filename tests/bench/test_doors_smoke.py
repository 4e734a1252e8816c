"""CI smoke run of the receiver-under-attack benchmark: every valid delivery must be answered
202 while 1,000 idle connections and the amplification attempts are in flight. How fast is
the benchmark's to print (`python3 dev.py bench`), not this test's to assert."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_deliveries_are_answered_while_the_receiver_is_attacked():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench" / "bench_doors.py"), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("attack: 1000 idle connections"), lines
    assert re.match(r"1024 / \d+ +5/5 ", lines[2]), lines
    assert re.match(r"raised / \d+ +5/5 ", lines[3]), lines
    assert lines[-1].startswith("target: every delivery 202 within 1 s:"), lines
