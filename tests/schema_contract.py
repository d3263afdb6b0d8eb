"""schema.sql, the schema's contract, read as psql runs it: its own text with each
``\\ir FILE`` line (psql's include, relative to the including file) replaced by that file's."""

import re
from pathlib import Path

from conftest import REPO

SCHEMA_SQL = REPO / "schema.sql"
_INCLUDE = re.compile(r"^\\ir\s+(\S+)\s*$", re.M)


def included(path: Path = SCHEMA_SQL) -> list[Path]:
    """The files ``path`` includes, and those they include, in psql's order.

    Raises:
        FileNotFoundError: an included file does not exist.
    """
    found = []
    for name in _INCLUDE.findall(path.read_text()):
        child = path.parent / name
        if not child.is_file():
            raise FileNotFoundError(f"{path}: \\ir {name}: no such file")
        found += [child, *included(child)]
    return found


def text(path: Path = SCHEMA_SQL) -> str:
    """The whole contract as one SQL text, the includes in place."""
    return _INCLUDE.sub(lambda m: text(path.parent / m.group(1)), path.read_text())


def files(path: Path = SCHEMA_SQL) -> list[Path]:
    """schema.sql and every file it includes: where the contract's lines are."""
    return [path, *included(path)] if path.exists() else []
