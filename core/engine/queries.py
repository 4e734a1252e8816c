"""Named statements: a dialect's SQL file read into {name: statement}.

A file holds its statements one after another, each under a line `-- name: NAME`; lines
starting with `--` are comments (they say why a statement differs where it must), and a
statement's trailing semicolon is dropped. Names are unique within a file.

A statement whose text changed with a schema migration keeps its former text for the files
(or databases) not migrated yet, under `-- name: NAME before N`: used where the schema is
older than N. Reads never migrate (docs/rules.md#upgrading-a-running-deployment), so a
release reads, and writes events to, an inbox of the previous schema with these.
"""

from __future__ import annotations

from pathlib import Path


class Statements(dict[str, str]):
    """The statements of the newest schema, by name; `older[n]` holds the texts used where
    the schema is older than n."""

    def __init__(self) -> None:
        super().__init__()
        self.older: dict[int, dict[str, str]] = {}

    def for_schema(self, version: int) -> dict[str, str]:
        """The statements to run against a schema of `version`: each name's text for the
        oldest `before N` bound that `version` is still under, else the newest."""
        chosen = dict(self)
        for bound in sorted(self.older, reverse=True):
            if version < bound:
                chosen.update(self.older[bound])
        return chosen


def load(path: Path) -> Statements:
    statements = Statements()
    name: str | None = None
    before: int | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        text = "\n".join(lines).strip().rstrip(";").strip()
        if not text:
            raise ValueError(f"{path.name}: statement {name!r} is empty")
        into = statements if before is None else statements.older.setdefault(before, {})
        if name in into:
            raise ValueError(f"{path.name}: statement {name!r} is named twice")
        into[name] = text

    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("-- name:"):
            close()
            words = stripped.removeprefix("-- name:").split()
            if len(words) == 3 and words[1] == "before" and words[2].isdigit():
                name, before = words[0], int(words[2])
            elif len(words) == 1:
                name, before = words[0], None
            else:
                raise ValueError(f"{path.name}: cannot read {stripped!r}")
            lines = []
        elif not stripped.startswith("--") and name is not None:
            lines.append(line)
    close()
    for bound, texts in statements.older.items():
        for stale in set(texts) - set(statements):
            raise ValueError(f"{path.name}: {stale!r} before {bound} has no current text")
    return statements
