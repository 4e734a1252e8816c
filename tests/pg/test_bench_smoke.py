"""CI smoke test of the backend benchmark: it runs quick and prints both columns."""

from __future__ import annotations

import itertools
import os
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


def _bench(pg, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run tests/bench/`script` with `args` against the tests' server; it must exit 0."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "bench" / script), *args],
        cwd=ROOT,
        env=dict(os.environ, ONWATCH_TEST_DATABASE_URL=pg.base_url),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result


def test_round_trip_benchmark_runs_quick_and_prints_both_paths(pg):
    """The round trip's client cost through the connection's thread and on the loop: a line
    for each path at each width, every figure a number, the CPU and the rate above zero."""
    result = _bench(pg, "bench_pg_hops.py", "--quick")
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert [row[:2] for row in rows] == [
        ["1", "thread"],
        ["1", "async"],
        ["5", "thread"],
        ["5", "async"],
    ], result.stdout
    for _, _, cpu, waits, preempted, rate in rows:
        assert float(cpu) > 0 and float(rate) > 0, result.stdout
        assert float(waits) >= 0 and float(preempted) >= 0, result.stdout


def test_queue_benchmark_runs_quick_for_onwatch(pg):
    """The comparison with the job queues, onwatch's side only (the peers would need their
    own environment installed): it runs and prints its table."""
    result = _bench(
        pg, "bench_queues.py", "--quick", "--contestants", "onwatch", "--statements", "3"
    )
    table = [line for line in result.stdout.splitlines() if line.startswith("onwatch ")]
    assert len(table) == 1 and float(table[0].split()[1]) > 0, result.stdout
    # The worker's context switches a job (its column after the CPU's): a worker that waited
    # for the server at all switched.
    assert float(table[0].split()[5]) > 0, result.stdout
    assert "CPU s stolen by the hypervisor" in result.stdout and "load average" in result.stdout
    # --statements: under the round's line, its costliest statements, or why there are none
    # (the tests' server may not have pg_stat_statements loaded).
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.endswith("the costliest statements:"))
    listed = list(itertools.takewhile(lambda line: line.startswith("  "), lines[at + 1 :]))
    none = ["  (no statements: pg_stat_statements is not loaded on this server)"]
    assert listed == none or (listed and all("µs a call" in line for line in listed)), listed


def test_the_costliest_statements_are_what_ran_between_two_readings():
    from tests.bench.bench_queues import busiest

    before = {
        (1, True): (10, 5.0, "SELECT 1"),
        (2, False): (4, 1.0, "UPDATE  t\n   SET x = 1"),
        (4, True): (7, 3.0, "SELECT 4"),  # did not run again: not listed
    }
    after = {
        (1, True): (20, 7.0, "SELECT 1"),
        (2, False): (8, 9.0, "UPDATE  t\n   SET x = 1"),
        (3, True): (5, 0.5, "INSERT 3"),  # new, but third by time
        (4, True): (7, 3.0, "SELECT 4"),
    }
    assert busiest(before, after, jobs=4, n=2) == [
        "    1.00 a job   2000.0 µs a job    2000.0 µs a call  nested  UPDATE t SET x = 1",
        "    2.50 a job    500.0 µs a job     200.0 µs a call  top     SELECT 1",
    ]
    assert len(busiest(before, after, jobs=4, n=10)) == 3


def test_fleet_batch_model_runs_quick_and_checks_what_it_wrote(pg):
    """The model of a cross-inbox batch: each contestant's line, every job done as the engine
    would have done it (the script checks the events, runs and counts after each run, and
    fails otherwise), and a figure (a quick run may be under one clock tick of the server's)
    or "n/a" for the server where it cannot read its CPU."""
    result = _bench(pg, "bench_fleet_batch.py", "--quick")
    rows = {
        line[:16].strip(): line[16:].split()
        for line in result.stdout.splitlines()
        if line.startswith(("engine ", "batch of "))
    }
    assert list(rows) == ["engine", "batch of 1", "batch of 4"], result.stdout
    for figures in rows.values():  # "702 (672–710)" or "n/a", then this process's, with its range
        server, client = figures[0], figures[-2]
        assert server == "n/a" or float(server) >= 0, result.stdout
        assert float(client) > 0, result.stdout


def test_ingest_split_runs_quick_and_checks_every_variant_stored_and_counted(pg):
    """Where a lone ingest's time goes: a line for each server variant and each client path,
    each with its wall time (and "n/a" or a figure for the server's CPU); the script checks
    that every variant stored each event it was given and, where it counts, counted it once,
    and fails otherwise."""
    result = _bench(pg, "bench_pg_ingest.py", "--quick", "--no-peer")
    lines = result.stdout.splitlines()
    labels = [
        "engine",
        "no counting trigger",
        "counted by the statement",
        "... trigger kept for others",
        "no lock, no change count",
        "two indexes fewer",
        "Inbox.ingest",
        "Inbox.ingest, loop_writes",
        "the statement alone",
    ]
    rows = {line[:39].strip(): line[39:].split() for line in lines if line[:39].strip() in labels}
    assert list(rows) == labels, result.stdout
    for figures in rows.values():  # "508 (508–508)", then "500 (500–500)" or "n/a"
        assert float(figures[0]) > 0, result.stdout
        assert figures[-1] == "n/a" or float(figures[-2]) >= 0, result.stdout
