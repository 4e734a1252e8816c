#!/usr/bin/env python3
"""Bootstrap: make the project's virtual environment on first use, then run a command in it.

    python3 dev.py demo       the demo on a scratch inbox
    python3 dev.py test       the static checks, then the whole test suite (what CI runs)
    python3 dev.py test -k x  the static checks, then pytest with these arguments
    python3 dev.py test --no-lint -k x
                              pytest only (a quick loop while editing; CI never passes it)
    python3 dev.py bench      the benchmark suite (prints figures)
    python3 dev.py onwatch …  any onwatch command

Needs only Python 3.11+. The environment lives in .venv/ and is rebuilt when pyproject.toml
changes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".onwatch-installed"


def ensure_env() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"onwatch needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted and PYTHON.exists():
        return
    if not PYTHON.exists():
        print("onwatch: creating .venv (first run only) …", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    print("onwatch: installing dependencies into .venv …", file=sys.stderr)
    subprocess.run(
        [
            str(PYTHON),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-e",
            f"{ROOT}[test]",
        ],
        check=True,
    )
    STAMP.write_text(wanted)


def static_checks(env: dict[str, str]) -> bool:
    """Run every static check, one line each; True when all pass (all run even after a failure)."""
    checks = [
        ("mypy (strict)", [str(PYTHON), "-m", "mypy"]),
        ("import-linter (layers)", [str(BIN / "lint-imports"), "--no-cache"]),
        ("ruff (lint)", [str(BIN / "ruff"), "check", "--no-cache", "."]),
        ("ruff (format)", [str(BIN / "ruff"), "format", "--check", "--no-cache", "."]),
    ]
    passed = True
    for name, command in checks:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if result.returncode == 0:
            print(f"onwatch: {name}: ok", file=sys.stderr)
            continue
        passed = False
        print(f"onwatch: {name}: FAILED", file=sys.stderr)
        sys.stderr.write(result.stdout + result.stderr)
    return passed


def main(argv: list[str]) -> int:
    command, *rest = argv or ["demo"]
    ensure_env()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    if command == "test":
        lint = "--no-lint" not in rest
        rest = [arg for arg in rest if arg != "--no-lint"]
        if lint and not static_checks(env):
            print("onwatch: static checks failed; not running pytest", file=sys.stderr)
            return 1
        code = subprocess.call([str(PYTHON), "-m", "pytest", *rest], cwd=ROOT, env=env)
        if code == 5:
            print("onwatch: pytest collected no tests; treating that as a failure", file=sys.stderr)
            return 1
        return code
    if command == "bench":
        return subprocess.call(
            [str(PYTHON), str(ROOT / "tests" / "bench" / "run_all.py"), *rest], cwd=ROOT, env=env
        )
    if command == "onwatch":
        return subprocess.call([str(BIN / "onwatch"), *rest], env=env)
    return subprocess.call([str(BIN / "onwatch"), command, *rest], env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
