"""Every SQL statement det's Python sends, by name, in one ``.sql`` file per room.

The files beside this module (``reconciler.sql``, ``agent.sql``, ...) are sequences of blocks;
each block opens with a line ``-- name: NAME`` and runs to the next one. Comment lines under
the name say what the statement is for; the text of the file before its first block is the
file's own header; the server is sent a statement from its first line of SQL. A statement
keeps psycopg's placeholders (``%s``, ``%(name)s``, and ``{}`` / ``{name}`` where the caller
composes it with :mod:`psycopg.sql`). ``${TERMINAL}`` stands for
:data:`det.states.TERMINAL_SQL`, the one spelling of the terminal states; a block opened by
``-- fragment: NAME`` (upper case) is a piece of SQL the file's statements share as
``${NAME}`` (e.g. the filters that both a list and its count apply), not a statement itself.

Code reads a file once, at import, and the statements as attributes::

    from det.sql import named

    Q = named("reconciler")
    conn.execute(Q.expire_agents, {"timeout": 30})

``tests/test_sql_files.py`` parses every statement with pglast and fails on a name no code
uses or a name used but not defined. Procrastinate (its named-queries file) and River
(sqlc's ``-- name:``) keep their queries this way.
"""

import functools
import re
from pathlib import Path

from det.states import TERMINAL_SQL

HERE = Path(__file__).resolve().parent
_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$")
_FRAGMENT_NAME = re.compile(r"^-- fragment: ([A-Z_]+)\s*$")
# What ${KEY} stands for in a statement: vocabulary defined once in Python.
FRAGMENTS = {"TERMINAL": TERMINAL_SQL}
_FRAGMENT = re.compile(r"\$\{([A-Z_]+)\}")


class Queries:
    """The statements of one ``.sql`` file, each an attribute (a ``str``) named as in the
    file. An unknown name raises :class:`AttributeError` naming the file."""

    def __init__(self, path: Path, statements: dict[str, str]) -> None:
        self._path = path
        self.__dict__.update(statements)
        self._names = frozenset(statements)

    def __getattr__(self, name: str) -> str:
        raise AttributeError(f"{self._path.name} defines no statement {name!r}")

    def names(self) -> frozenset[str]:
        return self._names


def parse(text: str, origin: str) -> dict[str, str]:
    """The statements of a ``.sql`` file's ``text``, by name, fragments substituted.

    Raises ValueError naming ``origin`` (the file) and the line for a name defined twice,
    an empty statement or fragment, or an unknown ``${KEY}``."""
    blocks: dict[str, list[str]] = {}
    pieces: dict[str, list[str]] = {}
    current: list[str] | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _NAME.match(line) or _FRAGMENT_NAME.match(line)
        if m:
            into = blocks if m.re is _NAME else pieces
            if m[1] in blocks or m[1] in pieces or m[1] in FRAGMENTS:
                raise ValueError(f"{origin}:{lineno}: statement {m[1]!r} is defined twice")
            current = into[m[1]] = []
        elif current is not None:
            current.append(line)
    fragments = {**FRAGMENTS, **{k: _body(v, k, origin, FRAGMENTS) for k, v in pieces.items()}}
    return {name: _body(lines, name, origin, fragments) + "\n" for name, lines in blocks.items()}


def _body(lines: list[str], name: str, origin: str, fragments: dict[str, str]) -> str:
    """A block's SQL: its leading comment lines dropped, its ``${KEY}``s substituted."""
    # The comment lines under the name are for the file's reader: the server gets the
    # statement from its first line of SQL (pg_stat_activity shows what runs).
    lines = list(lines)
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    if not lines:
        raise ValueError(f"{origin}: statement {name!r} is empty")

    def fragment(m: re.Match) -> str:
        if m[1] not in fragments:
            raise ValueError(f"{origin}: statement {name!r} uses unknown ${{{m[1]}}}")
        return fragments[m[1]]

    return _FRAGMENT.sub(fragment, "\n".join(lines).strip())


@functools.cache
def named(room: str) -> Queries:
    """The statements of ``<room>.sql`` beside this module (read once per process).

    Raises FileNotFoundError for a room without a file, ValueError as :func:`parse`."""
    path = HERE / f"{room}.sql"
    return Queries(path, parse(path.read_text(), path.name))


def rooms() -> list[str]:
    """The rooms that have a ``.sql`` file, sorted."""
    return sorted(p.stem for p in HERE.glob("*.sql"))
