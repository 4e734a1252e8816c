"""CI smoke test of the benchmark against the peer queues (tests/bench/bench_peers.py): its
--quick mode for onwatch alone, so no peer is installed and nothing is fetched. Every onwatch
workload checks what it did (every job stored, every job run, one run each when one per run
is asked); the table and the JSON carry every row. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg.server import ENV_URL, cluster_or_skip

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

ROWS = {
    "sqlite": [
        "sqlite-enqueue",
        "sqlite-enqueue-thread",
        "sqlite-batch",
        "sqlite-drain",
        "sqlite-wake",
    ],
    "postgresql": ["pg-enqueue", "pg-enqueue-loop", "pg-batch", "pg-drain", "pg-drain-batched"],
}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_peers_benchmark_runs_quick_for_onwatch_alone(backend: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if backend == "postgresql":
        env[ENV_URL] = cluster_or_skip().base_url  # the tests' server, left as it is
    out = tmp_path / "peers.json"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "bench" / "bench_peers.py"),
            "--quick",
            "--contestants",
            "onwatch",
            "--rows",
            ",".join(ROWS[backend]),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "installing" not in result.stderr  # onwatch alone needs no peers' environment
    document = json.loads(out.read_text())
    assert [row["key"] for row in document["rows"]] == ROWS[backend]
    assert len(document["load_before"]) == 3 and len(document["load_after"]) == 3
    lines = result.stdout.splitlines()
    assert lines[0].startswith("peers: ") and " load " in lines[0]
    for row in document["rows"]:
        onwatch = row["contestants"]["onwatch"]
        if row["unit"] == "ms":
            assert 0 < onwatch["p50"]["median"] <= onwatch["p99"]["median"], row
        else:
            assert onwatch["rate"]["median"] > 0 and onwatch["cpu_ms"]["median"] > 0, row
        assert row["durability"], row
        assert any(line.startswith(f"| {row['workload']} | ") for line in lines), result.stdout
