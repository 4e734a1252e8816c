"""Named statements: a dialect's SQL file read into {name: statement}.

A file holds its statements one after another, each under a line `-- name: NAME`; lines
starting with `--` are comments (they say why a statement differs where it must), and a
statement's trailing semicolon is dropped. Names are unique within a file.
"""

from __future__ import annotations

from pathlib import Path


def load(path: Path) -> dict[str, str]:
    statements: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        text = "\n".join(lines).strip().rstrip(";").strip()
        if not text:
            raise ValueError(f"{path.name}: statement {name!r} is empty")
        if name in statements:
            raise ValueError(f"{path.name}: statement {name!r} is named twice")
        statements[name] = text

    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("-- name:"):
            close()
            name, lines = stripped.removeprefix("-- name:").strip(), []
        elif not stripped.startswith("--") and name is not None:
            lines.append(line)
    close()
    return statements
