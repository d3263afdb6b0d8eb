"""det's SQL lives in named statements in ``sql/*.sql`` (det.sql): each one parses, each is
used, each used name is defined, and Python outside ``sql/`` sends no SQL literal of its own."""

import ast
import re
from pathlib import Path

import pglast
import pytest

from det.sql import HERE, Queries, named, parse, rooms

REPO = Path(__file__).resolve().parent.parent
# Run from a checkout: tests and benches keep their own SQL; migrations are SQL files.
NOT_SOURCES = {"tests", "bench", "examples", ".venv", "build", "sql"}

_SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|LISTEN|UNLISTEN|NOTIFY|COPY|SET|"
    r"RESET|BEGIN|COMMIT|ROLLBACK|LOCK|GRANT|REVOKE|TRUNCATE|SHOW|DO|CALL|VALUES|EXPLAIN|"
    r"PREPARE|DISCARD|DECLARE|FETCH|CLOSE|VACUUM|ANALYZE|REINDEX|COMMENT)\b[\s\S]*"
    r"\b(FROM|INTO|SET|TABLE|ROLE|DATABASE|SCHEMA|FUNCTION|NOTIFY|LISTEN|WHERE|\w+\()",
)


def sources() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.py")
                  if not NOT_SOURCES & set(p.relative_to(REPO).parts[:-1])
                  and p.relative_to(REPO).parts[0] not in NOT_SOURCES)


def sql_literals(tree: ast.AST) -> list[int]:
    """Line numbers of string constants (f-string parts included) that read as SQL."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else " x "
                           for v in n.values)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) \
                and id(n) not in docstrings | parts:
            text = n.value
        else:
            continue
        if _SQL_START.match(text):
            lines.append(n.lineno)
    return lines


def uses(tree: ast.AST) -> set[tuple[str, str]]:
    """(room, name) of every ``Q.name`` where ``Q = named("room")``, and of
    ``named("room").name``."""
    def room_of(call: ast.AST) -> str | None:
        if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant):
            f = call.func
            if (isinstance(f, ast.Name) and f.id == "named") or \
                    (isinstance(f, ast.Attribute) and f.attr == "named"):
                return call.args[0].value
        return None

    bound = {t.id: room_of(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             for t in n.targets if isinstance(t, ast.Name) and room_of(n.value)}
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute):
            if isinstance(n.value, ast.Name) and n.value.id in bound:
                out.add((bound[n.value.id], n.attr))
            elif room_of(n.value):
                out.add((room_of(n.value), n.attr))
    return out - {(r, "names") for r in rooms()}


def parseable(statement: str) -> str:
    """``statement`` with psycopg's placeholders (text ``s``, binary ``b``, either ``t``) made
    SQL pglast reads."""
    s = re.sub(r"%\(\w+\)[sbt]|%[sbt]", "$1", statement).replace("%%", "%")
    return re.sub(r"\{\w*\}", "x", s)


@pytest.mark.parametrize("room", rooms())
def test_every_statement_parses(room):
    for name, statement in named(room).__dict__.items():
        if name.startswith("_"):
            continue
        try:
            pglast.parse_sql(parseable(statement))
        except pglast.parser.ParseError as e:
            pytest.fail(f"sql/{room}.sql, {name}: {e}")


def test_every_statement_is_used_and_every_use_defined():
    used = set().union(*(uses(ast.parse(p.read_text())) for p in sources()))
    defined = {(r, n) for r in rooms() for n in named(r).names()}
    assert sorted(used - defined) == [], "used but not defined in sql/<room>.sql"
    assert sorted(defined - used) == [], "defined in sql/<room>.sql but used by no code"


def test_no_sql_literal_outside_sql_files():
    found = {}
    for p in sources():
        lines = sql_literals(ast.parse(p.read_text()))
        if lines:
            found[str(p.relative_to(REPO))] = lines
    assert found == {}, "SQL literals outside sql/*.sql (move them to a named statement)"


def test_parse_rejects_a_name_defined_twice_and_an_unknown_fragment():
    with pytest.raises(ValueError, match="x.sql:3: statement 'a' is defined twice"):
        parse("-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n", "x.sql")
    with pytest.raises(ValueError, match=r"unknown \$\{NOPE\}"):
        parse("-- name: a\nSELECT ${NOPE}\n", "x.sql")
    with pytest.raises(ValueError, match="statement 'a' is empty"):
        parse("-- name: a\n-- only a comment\n-- name: b\nSELECT 1\n", "x.sql")
    assert parse("-- header\n-- name: a\n-- doc\nSELECT 1 WHERE s IN ${TERMINAL}\n",
                 "x.sql")["a"].startswith("SELECT 1 WHERE s IN ('")
    with pytest.raises(ValueError, match="x.sql:3: statement 'F' is defined twice"):
        parse("-- fragment: F\nx > 1\n-- fragment: F\nx < 1\n", "x.sql")


def test_a_files_fragment_is_shared_by_its_statements_and_is_no_statement():
    q = parse("-- fragment: WHERE_X\n-- doc\nx > %(x)s\n-- name: a\nSELECT 1 FROM t WHERE "
              "${WHERE_X}\n-- name: b\nSELECT count(*) FROM t WHERE ${WHERE_X}\n", "x.sql")
    assert q == {"a": "SELECT 1 FROM t WHERE x > %(x)s\n",
                 "b": "SELECT count(*) FROM t WHERE x > %(x)s\n"}


def test_the_loader_names_the_file_of_an_unknown_statement():
    q = Queries(HERE / "x.sql", parse("-- name: a\nSELECT 1\n", "x.sql"))
    assert q.a == "SELECT 1\n" and q.names() == {"a"}
    with pytest.raises(AttributeError, match=r"x\.sql defines no statement 'no_such'"):
        q.no_such  # noqa: B018


def test_the_guard_sees_sql_in_strings_and_fstrings():
    tree = ast.parse('A = "SELECT x FROM t"\nB = f"UPDATE t SET a = {v}"\n'
                     'C = "Select the pool"\nD = "SET the flag"\n')
    assert sql_literals(tree) == [1, 2]
    assert HERE.name == "sql"
