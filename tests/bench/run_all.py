#!/usr/bin/env python3
"""Run every benchmark, one after another: what `python3 dev.py bench` calls.

    python3 dev.py bench            the full suite (prints the tables; takes a few minutes)
    python3 dev.py bench --quick    small sizes, a smoke run (no meaningful figures)

Each tests/bench/bench_*.py runs in its own process (so one benchmark's threads and caches
cannot skew the next), with the arguments given here passed through. The exit status is the
first non-zero one, or 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def main(argv: list[str]) -> int:
    benchmarks = sorted(HERE.glob("bench_*.py"))
    if not benchmarks:
        print("no benchmarks found in tests/bench/", file=sys.stderr)
        return 1
    status = 0
    for path in benchmarks:
        print(f"=== {path.relative_to(ROOT)} {' '.join(argv)}".rstrip(), flush=True)
        code = subprocess.call([sys.executable, str(path), *argv], cwd=ROOT)
        if code != 0:
            print(f"=== {path.name} exited with status {code}", flush=True)
            status = status or code
        print(flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
