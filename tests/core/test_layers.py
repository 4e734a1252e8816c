"""The layers hold: import-linter's contracts in pyproject.toml pass here, and bite on a breach.

The contracts: core imports no UI and no front end (tui, cli, textual, rich, textual_serve,
playwright), even inside a function; tui and cli reach the database only through core (no
sqlite3, aiosqlite or psycopg of their own). `python3 dev.py test` runs the same check before
pytest.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_project_keeps_its_layer_contracts():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_catch_an_engine_that_imports_ui_and_a_desk_that_opens_sqlite(tmp_path):
    """The same contracts, run on a small tree that breaks each of them."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    files = {
        "onwatch/__init__.py": "",
        "onwatch/core/__init__.py": "from onwatch.core import engine\n",
        "onwatch/core/sqlite/__init__.py": "",  # (every module a contract names exists)
        "onwatch/core/pg/__init__.py": "",
        # imports inside a function count: a lazy UI import is still a UI import
        "onwatch/core/engine.py": (
            "def show():\n    import textual\n    from onwatch.cli import main\n"
        ),
        "onwatch/tui/__init__.py": "import onwatch.core\n",
        "onwatch/tui/desk.py": "import aiosqlite\n",
        "onwatch/tui/fleet/__init__.py": "",
        "onwatch/tui/fleet/seed.py": "import sqlite3\n",  # the documented exception
        "onwatch/cli/__init__.py": "",
        "onwatch/cli/commands.py": "from psycopg import connect\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    result = lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert "onwatch.core is not allowed to import textual" in out
    assert "onwatch.core.engine -> textual" in out
    assert "onwatch.core is not allowed to import onwatch.cli" in out
    assert "onwatch.tui is not allowed to import aiosqlite" in out
    assert "onwatch.tui.desk -> aiosqlite" in out
    assert "onwatch.cli.commands -> psycopg" in out
    assert "not allowed to import sqlite3" not in out
    assert "2 broken" in out
