"""Scenario 2 (docs/rules.md#scenario-2-simultaneous-acquire) for real: several OS processes
ask for the lease at the same instant."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.worker.helpers import ROOT, env, onwatch, query

pytestmark = pytest.mark.slow
PROCESSES = 6


def race(tmp_path, rounds: int, ttl: int) -> list[list]:
    path = str(tmp_path / "inbox.db")
    assert onwatch("init", path, f"lease_ttl={max(ttl, 60)}").returncode == 0
    t0 = time.time() + 2.5  # every process imported and connected before the start
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.faults.actors",
                "acquire",
                path,
                f"h{i}",
                str(t0),
                str(rounds),
                "0.4",
                str(ttl),
            ],
            cwd=ROOT,
            env=env(tmp_path),
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(PROCESSES)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        results.append(json.loads(out))
    return path, results


def test_simultaneous_acquire_exactly_one_wins_each_generation(tmp_path):
    rounds = 5
    path, results = race(tmp_path, rounds, ttl=60)
    for k in range(rounds):
        winners = [r[k] for r in results if r[k] is not None]
        # Every round's instant is past the previous lease: exactly one process takes over.
        assert winners == [k + 1], (k, results)
    history = query(path, "SELECT gen, how FROM lease_history ORDER BY gen")
    assert history == [(1, "first")] + [(g, "takeover") for g in range(2, rounds + 1)]


def test_simultaneous_acquire_on_the_wall_clock(tmp_path):
    path, results = race(tmp_path, 1, ttl=0)
    assert sorted(r[0] for r in results if r[0] is not None) == [1]
    assert sum(r[0] is None for r in results) == PROCESSES - 1
