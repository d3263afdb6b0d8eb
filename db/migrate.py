"""Versioned migrations: the steps that bring a database to the schema of ``schema.sql``.

``schema.sql`` (at the package root) is det's schema as it is today, each object defined once
in its final form: the contract to read. ``db/migrations/NNNN_name.sql`` are the steps that
reach it, applied in version order. A database records the versions it has applied in
``det_migrations``; :func:`migrate` applies the missing ones, each in its own transaction, so a
migration that fails rolls back whole and leaves the earlier ones applied and recorded. Every
database, a fresh one included, is built by applying the migrations (one code path);
tests/test_migrations.py asserts that the result has the same catalog as ``schema.sql`` alone.

Each migration's transaction takes an advisory transaction lock and re-reads
``det_migrations`` before applying, so concurrent callers (``det cluster up``, an agent, a
test, each migrating on start) apply each version once.

To change the schema:

1. Add ``db/migrations/NNNN_name.sql`` with the next version (four digits) and a lower-case
   name: ``ALTER TABLE ...``, ``CREATE OR REPLACE FUNCTION ...``, ``DROP VIEW`` and
   ``CREATE VIEW ...``. Never edit a migration that has been released: databases that applied
   it will not apply it again.
2. Fold the change into ``schema.sql`` where the object is defined: a new column goes last in
   its ``CREATE TABLE`` (``ADD COLUMN`` appends, and the catalogs are compared column order
   included), a replaced function or view replaces its definition there, verbatim.
3. Run ``pytest tests/test_migrations.py``: it fails with a diff of the two catalogs if they differ.
"""

import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from det.db.retry import is_connection_lost
from det.errors import DatabaseError
from det.sql import named

Q = named("db")

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x6465745F6D6967  # "det_mig"


def migrations_dir() -> Traversable:
    """The migrations shipped with det (``det/db/migrations``)."""
    return resources.files("det.db").joinpath("migrations")


@dataclass(frozen=True)
class Migration:
    """One migration file: its version, name and SQL statements in order."""

    version: int
    name: str
    statements: list[str]

    @property
    def file(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"


def load_migrations(directory: Traversable | None = None) -> list[Migration]:
    """The migrations of ``directory`` (default :func:`migrations_dir`), in version order.

    Every ``.sql`` file of the directory is a migration; pglast splits each into statements,
    so a syntax error in any of them is reported before any statement runs.

    Raises:
        DatabaseError: a ``.sql`` file not named ``NNNN_name.sql``, two files of one version,
            or a file that does not parse.
    """
    # Imported here: every det process imports this module (through det.db), and only the
    # schema's owner ever parses a migration; the parser is ~60 ms of import and ~3 MB.
    import pglast

    directory = directory if directory is not None else migrations_dir()
    out: list[Migration] = []
    for f in sorted(directory.iterdir(), key=lambda f: f.name):
        if not f.name.endswith(".sql"):
            continue
        m = _FILE.match(f.name)
        if m is None:
            raise DatabaseError(f"migration {f.name}: expected a name like 0007_add_things.sql "
                                "(four-digit version, lower-case name)")
        version, name = int(m.group(1)), m.group(2)
        if out and out[-1].version == version:
            raise DatabaseError(f"migration {f.name}: version {version} is also {out[-1].file}")
        try:
            statements = [s for s in pglast.split(f.read_text()) if s.strip()]
        except pglast.parser.ParseError as e:
            raise DatabaseError(f"migration {f.name}: {e}") from e
        out.append(Migration(version, name, statements))
    return out


def migrate(conn: psycopg.Connection, directory: Traversable | None = None) -> list[int]:
    """Apply the migrations this database lacks, each in its own transaction; returns the
    versions applied, in order (``[]`` when the schema is current: idempotent).

    ``conn`` must not be inside a transaction (autocommit on or off); it is left idle.
    ``directory`` replaces the shipped migrations (tests).

    Raises:
        ValueError: ``conn`` is inside a transaction (its migrations would become savepoints).
        DatabaseError: a migration file is malformed (nothing applied), or a migration failed
            (it is rolled back; the earlier ones stay applied). A lost connection is raised as
            psycopg's error, for ``det.db.retry`` to recognise.
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise ValueError("migrate() needs a connection outside any transaction")
    migrations = load_migrations(directory)
    cur = conn.cursor(row_factory=tuple_row)
    with conn.transaction():
        cur.execute(Q.lock_migrations, (_LOCK_KEY,))
        cur.execute(Q.create_ledger)
        done = {v for (v,) in cur.execute(Q.applied_versions).fetchall()}
    applied: list[int] = []
    for mig in migrations:
        if mig.version in done:
            continue
        try:
            with conn.transaction():
                cur.execute(Q.lock_migrations, (_LOCK_KEY,))
                if cur.execute(Q.is_applied, (mig.version,)).fetchone():
                    continue
                for stmt in mig.statements:
                    cur.execute(stmt)
                cur.execute(Q.record_migration, (mig.version, mig.name))
        except psycopg.Error as e:
            if is_connection_lost(e):
                raise
            raise DatabaseError(f"migration {mig.file}: {e.diag.message_primary or e}") from e
        applied.append(mig.version)
    return applied


def latest_version(directory: Traversable | None = None) -> int:
    """The newest migration det ships (from the file names alone: nothing is parsed)."""
    directory = directory if directory is not None else migrations_dir()
    return max(int(m.group(1)) for f in directory.iterdir() if (m := _FILE.match(f.name)))


def require_current(conn: psycopg.Connection) -> None:
    """Check that the database has every migration this det ships, for the clients that do
    not migrate (the CLI as a det user, agents, det serve): only the schema's owner migrates
    (``det cluster up``, the reconciler). Leaves ``conn`` idle.

    Raises:
        DatabaseError: the schema is behind (or not det's): "run det cluster up". A lost
            connection is raised as psycopg's error.
    """
    latest = latest_version()
    try:
        with conn.transaction():
            (version,) = conn.cursor(row_factory=tuple_row).execute(Q.schema_version).fetchone()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName):
        version = None  # older than migration 0015 (0062: det_schema_version), or not det's
    if version is None or version < latest:
        raise DatabaseError(f"the database's schema is at migration {version or 'none'}, this "
                            f"det needs {latest}: run `det cluster up` (or `det db migrate` as "
                            "the database's owner) to bring it up to date")


def ensure_current(conn: psycopg.Connection) -> None:
    """Make sure the schema is current before a command acts: a schema that is behind is
    migrated (:func:`migrate`) by a session that may create in it (its owner: ``det cluster
    up``, the reconciler, an admin's URL); anyone else (a det user, det serve's role) is told
    to run ``det cluster up``. A current schema costs one query: no migration is parsed.

    Raises:
        DatabaseError: migrations are missing and this session may not apply them, or what
            :func:`migrate` raises.
    """
    try:
        require_current(conn)
    except DatabaseError:
        with conn.transaction():
            may_migrate = conn.cursor(row_factory=tuple_row).execute(Q.may_migrate).fetchone()[0]
        if not may_migrate:
            raise
        migrate(conn)
