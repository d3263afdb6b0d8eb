"""schema.sql is the contract; the migrations in db/migrations reach it, each in its own
transaction (db/migrate.py)."""

import difflib
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pglast
import psycopg
import pytest
import schema_contract
from pglast import ast
from pglast.enums import AlterTableType, FunctionParameterMode, GrantTargetType, ObjectType
from pglast.stream import RawStream
from psycopg.conninfo import make_conninfo

from det.db import migrate
from det.db.migrate import ensure_current, load_migrations
from det.errors import DatabaseError

# Where the user's objects are: every schema but PostgreSQL's own.
_USER_NS = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"

# One query per kind of catalog object; each returns (key, value) rows, keys unique per kind.
_CATALOG: dict[str, str] = {
    "schema": f"SELECT n.nspname, coalesce(n.nspacl::text, '') FROM pg_namespace n "
              f"WHERE {_USER_NS}",
    "extension": "SELECT extname, extversion FROM pg_extension",
    "relation": f"""
        SELECT n.nspname || '.' || c.relname,
               concat_ws(' ', c.relkind, c.relpersistence, c.reloptions::text,
                         c.relrowsecurity, c.relacl::text)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NS}""",
    # Columns in order (ADD COLUMN appends, so a folded column must come last), with their type,
    # NOT NULL, default, identity, generation, collation and column grants (GRANT SELECT (col)).
    # atthasmissing is left out: an ADD COLUMN with a default sets it even on an empty table; it
    # is storage, not schema.
    "column": f"""
        SELECT n.nspname || '.' || c.relname || '.' || a.attname,
               concat_ws(' | ', row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                         format_type(a.atttypid, a.atttypmod),
                         CASE WHEN a.attnotnull THEN 'NOT NULL' END,
                         pg_get_expr(d.adbin, d.adrelid), nullif(a.attidentity, ''),
                         nullif(a.attgenerated, ''), nullif(a.attcollation, 0)::regcollation,
                         a.attacl::text)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE {_USER_NS} AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'c')""",
    "constraint": f"""
        SELECT n.nspname || '.' || coalesce(c.relname, t.typname) || '.' || k.conname,
               pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_namespace n ON n.oid = k.connamespace
        LEFT JOIN pg_class c ON c.oid = k.conrelid
        LEFT JOIN pg_type t ON t.oid = k.contypid
        WHERE {_USER_NS}""",
    "index": f"""
        SELECT n.nspname || '.' || c.relname, pg_get_indexdef(c.oid)
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NS}""",
    "sequence": f"""
        SELECT n.nspname || '.' || c.relname,
               concat_ws(' ', s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin,
                         s.seqmax, s.seqcache, s.seqcycle,
                         'owned by ' || (SELECT oc.relname || '.' || oa.attname
                                           FROM pg_depend dep
                                           JOIN pg_class oc ON oc.oid = dep.refobjid
                                           JOIN pg_attribute oa ON oa.attrelid = dep.refobjid
                                                               AND oa.attnum = dep.refobjsubid
                                          WHERE dep.classid = 'pg_class'::regclass
                                            AND dep.objid = c.oid AND dep.deptype IN ('a', 'i')))
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NS}""",
    "type": f"""
        SELECT n.nspname || '.' || t.typname,
               concat_ws(' ', t.typtype,
                         (SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
                            FROM pg_enum e WHERE e.enumtypid = t.oid),
                         CASE WHEN t.typtype = 'd'
                              THEN format_type(t.typbasetype, t.typtypmod) END,
                         t.typdefault, t.typacl::text)
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        LEFT JOIN pg_class c ON c.oid = t.typrelid
        WHERE {_USER_NS} AND t.typtype IN ('e', 'd', 'r', 'm', 'c')
          AND (t.typtype <> 'c' OR c.relkind = 'c')""",
    # Privileges of objects yet to be created (ALTER DEFAULT PRIVILEGES), per creating role.
    "default privileges": """
        SELECT concat_ws(' ', d.defaclrole::regrole, n.nspname, d.defaclobjtype),
               d.defaclacl::text
        FROM pg_default_acl d LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace""",
    "function": f"""
        SELECT p.oid::regprocedure::text,
               CASE WHEN p.prokind IN ('f', 'p') THEN pg_get_functiondef(p.oid)
                    ELSE p.prokind::text END || coalesce(E'\\nACL ' || p.proacl::text, '')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER_NS}""",
    "view": f"""
        SELECT n.nspname || '.' || c.relname, pg_get_viewdef(c.oid)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE {_USER_NS} AND c.relkind IN ('v', 'm')""",
    "trigger": f"""
        SELECT n.nspname || '.' || c.relname || '.' || g.tgname,
               pg_get_triggerdef(g.oid) || ' enabled=' || g.tgenabled::text
        FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NS} AND NOT g.tgisinternal""",
    "rule": "SELECT schemaname || '.' || tablename || '.' || rulename, definition FROM pg_rules "
            "WHERE schemaname NOT LIKE 'pg\\_%'",
    "policy": "SELECT schemaname || '.' || tablename || '.' || policyname, "
              "concat_ws(' ', permissive, roles::text, cmd, qual, with_check) FROM pg_policies",
    # Comments on anything det created (oids below 16384 are PostgreSQL's own).
    "comment": """
        SELECT pg_describe_object(classoid, objoid, objsubid), description
        FROM pg_description WHERE objoid >= 16384""",
}


# Rows each database makes at random (the secret of its NOTIFY channel names, issue 32; the
# cluster's identity): their shape is compared, not their value.
_RANDOM_ROWS = {"public.channel_key": "SELECT format('(%s,%s random bytes)', singleton, "
                                      "octet_length(secret)) FROM public.channel_key",
                "public.cluster_identity": "SELECT format('(%s,a uuid,%s)', singleton, "
                                           "created_at IS NOT NULL) FROM public.cluster_identity"}


def catalog(url: str) -> dict[str, str]:
    """The database's schema as ``{"<kind> <name>": definition}``, and the rows of every table
    (a schema seeds some, such as the default resource pool)."""
    out: dict[str, str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for kind, query in _CATALOG.items():
            for key, value in conn.execute(query).fetchall():
                out[f"{kind} {key}"] = value
        tables = conn.execute(
            f"SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c "
            f"JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER_NS} AND c.relkind = 'r'"
        ).fetchall()
        for (table,) in tables:
            rows = conn.execute(_RANDOM_ROWS.get(table, f"SELECT t::text FROM {table} t "
                                                        "ORDER BY 1")).fetchall()
            out[f"rows {table}"] = "\n".join(r for (r,) in rows)
    return out


def render(cat: dict[str, str]) -> list[str]:
    """One line per catalog entry (a multi-line definition indented under its name)."""
    lines = []
    for key in sorted(cat):
        lines.append(f"{key}:")
        lines.extend(f"    {line}" for line in cat[key].splitlines())
    return lines


@pytest.fixture
def new_database(pg_server: str) -> Iterator:
    """Creates empty databases (``new_database()`` returns a URL); drops them after the test."""
    names: list[str] = []

    def create() -> str:
        name = f"det_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        names.append(name)
        return make_conninfo(pg_server, dbname=name)

    yield create
    with psycopg.connect(pg_server, autocommit=True) as admin:
        for name in names:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_migrations_and_schema_sql_build_the_same_catalog(new_database) -> None:
    migrated, from_schema = new_database(), new_database()
    with psycopg.connect(migrated) as conn:
        assert migrate(conn) == [m.version for m in load_migrations()]
        # The bookkeeping of migrate() is no part of the schema's contract.
        conn.execute("DROP TABLE det_migrations")
        conn.commit()
    with psycopg.connect(from_schema) as conn, conn.transaction():
        for stmt in pglast.split(schema_contract.text()):
            conn.execute(stmt)
    a, b = render(catalog(migrated)), render(catalog(from_schema))
    assert any(line.startswith("function det_user.create_experiment(") for line in a)
    if a != b:
        diff = "\n".join(difflib.unified_diff(a, b, "migrations", "schema.sql", lineterm=""))
        pytest.fail(f"schema.sql and db/migrations build different catalogs:\n{diff}")


def test_schema_sql_includes_each_file_of_schema_once_in_order() -> None:
    """schema.sql is an index: each file under schema/ (one concern each) is part of the
    contract, once, in the order of its number; none is left out of what the test above
    compares with the migrations."""
    files = schema_contract.included()
    assert files == sorted((schema_contract.REPO / "schema").glob("*.sql"))
    assert len(files) == len(set(files)) > 1


def test_an_include_of_no_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "schema.sql").write_text("-- head\n\\ir schema/01_gone.sql\n")
    with pytest.raises(FileNotFoundError, match="01_gone.sql"):
        schema_contract.included(tmp_path / "schema.sql")


def _defined_object(stmt: ast.Node) -> tuple[str, str] | None:
    """(kind, name) of what a statement of schema.sql defines; None for data (INSERT)."""

    def name(node: ast.Node) -> str:
        return RawStream()(node)  # a RawStream accumulates: one per node
    match stmt:
        case ast.CreateEnumStmt():
            return "type", ".".join(n.sval for n in stmt.typeName)
        case ast.CreateStmt():
            return "table", name(stmt.relation)
        case ast.ViewStmt():
            return "view", name(stmt.view)
        case ast.IndexStmt():
            return "index", stmt.idxname
        case ast.CreateTrigStmt():
            return "trigger", f"{stmt.trigname} ON {name(stmt.relation)}"
        case ast.CreateSchemaStmt():
            return "schema", stmt.schemaname
        case ast.CreateFunctionStmt():
            inputs = [name(p.argType) for p in stmt.parameters or ()
                      if p.mode not in (FunctionParameterMode.FUNC_PARAM_OUT,
                                        FunctionParameterMode.FUNC_PARAM_TABLE)]
            return "function", f"{'.'.join(n.sval for n in stmt.funcname)}({', '.join(inputs)})"
        case ast.CommentStmt():
            target = (".".join(n.sval for n in stmt.object) if isinstance(stmt.object, tuple)
                      else name(stmt.object))
            return "comment", f"{stmt.objtype.name} {target}"
        case ast.CreatePolicyStmt():
            return "policy", f"{stmt.policy_name} ON {name(stmt.table)}"
        case ast.AlterTableStmt() if all(
                c.subtype == AlterTableType.AT_EnableRowSecurity for c in stmt.cmds):
            return "row security", name(stmt.relation)
        # Data and privileges, not objects: the seed rows, who may do what, and det's roles
        # (the server's, created when absent: DO is their only idempotent form).
        case ast.InsertStmt() | ast.GrantStmt() | ast.AlterDefaultPrivilegesStmt() | ast.DoStmt():
            return None
    raise AssertionError(f"schema.sql defines objects, it does not alter them: {name(stmt)}")


def test_schema_sql_defines_each_object_once() -> None:
    seen: set[tuple[str, str]] = set()
    for raw in pglast.parse_sql(schema_contract.text()):
        stmt = raw.stmt
        assert not getattr(stmt, "replace", False), (
            f"schema.sql: {RawStream()(stmt)[:80]}...: CREATE OR REPLACE belongs in a migration; "
            "schema.sql defines each object once")
        obj = _defined_object(stmt)
        assert obj not in seen, f"schema.sql defines {obj[0]} {obj[1]} twice"
        if obj is not None:
            seen.add(obj)
    assert ("function", "det_user.create_experiment(jsonb, text, bytea, text, text)") in seen


def _granted_objects(stmt: ast.GrantStmt) -> list[str]:
    """Names of the objects a GRANT or REVOKE of schema.sql is about, as ``_defined_object``
    names them ("name(argtypes)" for a function)."""
    if stmt.targtype != GrantTargetType.ACL_TARGET_OBJECT:
        raise AssertionError(f"schema.sql: {RawStream()(stmt)[:80]}...: grant each object "
                             "beside its definition, not all of a schema's at once")
    if stmt.objtype == ObjectType.OBJECT_FUNCTION:
        return [f"{'.'.join(n.sval for n in o.objname)}"
                f"({', '.join(RawStream()(a) for a in o.objargs or ())})" for o in stmt.objects]
    if stmt.objtype == ObjectType.OBJECT_SCHEMA:
        return [o.sval for o in stmt.objects]
    return [RawStream()(o) for o in stmt.objects]


def test_schema_sql_grants_each_object_beside_its_definition() -> None:
    """A grant follows the definition of its one object (and that object's comments and
    indexes), so who may call a function or read a table is read where it is defined."""
    current = None  # the name of the object the last definition defined
    grants = 0
    for raw in pglast.parse_sql(schema_contract.text()):
        stmt = raw.stmt
        obj = _defined_object(stmt)
        if obj is not None and obj[0] in ("function", "table", "view", "schema"):
            current = obj[1]
        if isinstance(stmt, ast.GrantStmt):
            objects = _granted_objects(stmt)
            assert objects == [current], (
                f"schema.sql: {RawStream()(stmt)[:80]}...: grant {', '.join(objects)} "
                f"alone, right after its definition (it follows {current})")
            grants += 1
    assert grants > 100


def _write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(exist_ok=True)
    for name, sql in files.items():
        (directory / name).write_text(sql)
    return directory


def test_each_migration_is_its_own_transaction(new_database, tmp_path: Path) -> None:
    migrations = _write(tmp_path / "migrations", {
        "0001_a.sql": "CREATE TABLE a (x integer);",
        "0002_b.sql": "CREATE TABLE b (x integer);\nINSERT INTO b VALUES (1);",
        # Parses, fails when run: after its first statement has run.
        "0003_broken.sql": "CREATE TABLE c (x integer);\nSELECT 1 / 0;",
    })
    with psycopg.connect(new_database(), autocommit=True) as conn:
        with pytest.raises(DatabaseError, match=r"migration 0003_broken\.sql: division by zero"):
            migrate(conn, migrations)
        assert [v for (v,) in conn.execute("SELECT version FROM det_migrations ORDER BY 1")] \
            == [1, 2]
        assert conn.execute("SELECT count(*) FROM b").fetchone() == (1,)
        assert conn.execute("SELECT to_regclass('c')").fetchone() == (None,)

        _write(migrations, {"0003_broken.sql": "CREATE TABLE c (x integer);"})
        assert migrate(conn, migrations) == [3]
        assert migrate(conn, migrations) == []


def test_concurrent_callers_apply_each_version_once(new_database) -> None:
    url = new_database()
    results: list[list[int]] = []
    errors: list[Exception] = []
    start = threading.Barrier(3)

    def run() -> None:
        with psycopg.connect(url) as conn:
            start.wait()
            try:
                results.append(migrate(conn))
            except Exception as e:  # collected, asserted absent below
                errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(v for r in results for v in r) == [m.version for m in load_migrations()]


@pytest.mark.parametrize(("files", "error"), [
    ({"1_a.sql": "SELECT 1;"}, r"1_a\.sql: expected a name like 0007_add_things\.sql"),
    ({"0001_a.sql": "SELECT 1;", "0001_b.sql": "SELECT 2;"}, r"0001_b\.sql: version 1 is also "
                                                             r"0001_a\.sql"),
    ({"0001_a.sql": "SELECT 1;", "0002_b.sql": "CREATE TABLE ("}, r"0002_b\.sql: syntax error"),
])
def test_malformed_migrations_apply_nothing(new_database, tmp_path: Path, files: dict[str, str],
                                            error: str) -> None:
    with psycopg.connect(new_database(), autocommit=True) as conn:
        with pytest.raises(DatabaseError, match=error):
            migrate(conn, _write(tmp_path / "migrations", files))
        assert conn.execute("SELECT to_regclass('det_migrations')").fetchone() == (None,)


def test_migrate_refuses_a_connection_inside_a_transaction(conn) -> None:
    with conn.transaction(), pytest.raises(ValueError, match="outside any transaction"):
        migrate(conn)


def test_a_command_migrates_a_new_database_and_only_checks_a_current_one(
        new_database, monkeypatch) -> None:
    """ensure_current (before every command) applies what is missing as the schema's owner,
    and parses no migration when nothing is (issue 11: each command parsed them all)."""
    with psycopg.connect(new_database(), autocommit=True) as conn:
        ensure_current(conn)
        latest = conn.execute("SELECT max(version) FROM det_migrations").fetchone()[0]
        assert latest == load_migrations()[-1].version

        def unexpected(*_):
            raise AssertionError("a current schema's migrations were parsed")
        monkeypatch.setattr(sys.modules["det.db.migrate"], "load_migrations", unexpected)
        ensure_current(conn)


def test_a_user_who_may_not_migrate_is_told_to_run_cluster_up(new_database, pg_server) -> None:
    url = new_database()
    role = f"det_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        user_url = make_conninfo(url, user=role, password="pw")
        with psycopg.connect(user_url, autocommit=True) as conn, \
                pytest.raises(DatabaseError, match="run `det cluster up`"):
            ensure_current(conn)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT to_regclass('det_migrations')").fetchone() == (None,)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {role}")
