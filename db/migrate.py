"""Versioned migrations from ``schema.sql``.

``schema.sql`` is a sequence of sections, each opened by ``-- migration: <N> <name>``. A
database records applied versions in ``det_migrations``; :func:`migrate` applies the missing
sections in order, each in one transaction, under an advisory lock so concurrent callers
(``det cluster up`` and a test, two agents) apply each version once.
"""

import re
from dataclasses import dataclass
from importlib import resources

import pglast
import psycopg
from psycopg.rows import tuple_row

from det.errors import DatabaseError

_MARKER = re.compile(r"^-- migration: (\d+) (\S+)\s*$", re.MULTILINE)
_LOCK_KEY = 0x6465745F6D6967  # "det_mig"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: list[str]


def load_migrations(text: str | None = None) -> list[Migration]:
    """Split ``schema.sql`` (or ``text``) into migrations of single statements.

    pglast parses each section, so a syntax error is reported with its migration before any
    statement runs.

    Raises:
        DatabaseError: versions not strictly increasing, or a section that does not parse.
    """
    if text is None:
        text = resources.files("det").joinpath("schema.sql").read_text()
    marks = list(_MARKER.finditer(text))
    out: list[Migration] = []
    for i, m in enumerate(marks):
        version, name = int(m.group(1)), m.group(2)
        if out and version <= out[-1].version:
            raise DatabaseError(
                f"schema.sql: migration {version} does not follow {out[-1].version}")
        body = text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        try:
            statements = [s for s in pglast.split(body) if s.strip()]
        except pglast.parser.ParseError as e:
            raise DatabaseError(f"schema.sql: migration {version} {name}: {e}") from e
        out.append(Migration(version, name, statements))
    return out


def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply the migrations this database lacks; returns the versions applied (idempotent).

    ``conn`` must not be in a transaction; it is used with autocommit off.
    """
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS det_migrations (version integer PRIMARY KEY, "
            "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = conn.cursor(row_factory=tuple_row)
        done = {v for (v,) in cur.execute("SELECT version FROM det_migrations").fetchall()}
        for mig in load_migrations():
            if mig.version in done:
                continue
            with conn.transaction():
                for stmt in mig.statements:
                    conn.execute(stmt)
                conn.execute(
                    "INSERT INTO det_migrations (version, name) VALUES (%s, %s)",
                    (mig.version, mig.name),
                )
            applied.append(mig.version)
    return applied
