"""What `pip install` puts into site-packages: one package, `onwatch`, that works from there."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # A copy of what the package is made of (the links kept as links): setuptools writes
    # its build/ and *.egg-info folders beside the source, which must stay clean.
    source = out / "source"
    for name in ("pyproject.toml", "README.md", "onwatch", "core", "tui", "cli"):
        if (ROOT / name).is_dir() and not (ROOT / name).is_symlink():
            shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=IGNORED)
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, source / name, follow_symlinks=False)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--wheel-dir",
            str(out),
            str(source),
        ],
        check=True,
        cwd=out,
    )
    [found] = out.glob("onwatch-*.whl")
    return found


def test_the_wheel_installs_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"onwatch"}
    assert "onwatch/core/inbox.py" in names  # the linked folders are in it, as files
    assert "onwatch/tui/app.tcss" in names  # and the desk's stylesheet
    assert not any(name.startswith(("onwatch/examples", "examples/")) for name in names)
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "onwatch = onwatch.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_package_imports_from_anywhere(wheel: Path, tmp_path: Path) -> None:
    """Installed into a folder of its own and imported from another, away from the source
    tree: the engine's names at the top, the command line runs."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", site, wheel],
        check=True,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import onwatch; "
        "from onwatch import Inbox, FakeClock, BadInput; "
        "assert onwatch.__file__.startswith(sys.argv[1]), onwatch.__file__; "
        "import onwatch.tui.app, onwatch.cli; "
        "sys.argv = ['onwatch', '--help']; onwatch.cli.main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(site)], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "usage: onwatch" in result.stdout
