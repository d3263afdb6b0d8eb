"""House rules a reader of det's source relies on, checked over the tree as it is.

* Comments and docstrings stand on their own: they do not point at documents a reader of the
  repo lacks (a tracker's issue numbers, the project's private notes), and every repo file
  they cite exists.
* One vocabulary each: the terminal states are spelled once (:mod:`det.states`), and NOTIFY
  channels are named, listened on and notified only in :mod:`det.db.channels`.
* Ownership: det serve (``api/``) imports no CLI module; what both need lives in a room of its
  own (det.submission, det.queries, the searchers).
"""

import ast
import re
from pathlib import Path

import schema_contract
from conftest import REPO

NOT_DET = {"tests", "bench", "build", ".venv", "examples", "docs", ".git"}
"""Top-level directories that are not det's own sources: tests and benches may name the
issues they reproduce."""

PRIVATE_REFERENCE = re.compile(r"\b[Ii]ssues? #?\d+|reference-facts|\bnotes §")
"""Pointers to documents outside the repo: a tracker's issue, the project's notes."""

CITED_PATH = re.compile(r"(?<![\w./-])(?:det/)?((?:[\w.-]+/)+[\w.-]+\.[a-z]+)\b")
"""A relative path with a directory and an extension, e.g. ``db/channels.py``,
``docs/architecture.md``; ``det/`` is the repo's root (the package is installed as ``det``)."""

CITED_DOC = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
"""A bare Markdown file name, e.g. ``DESIGN.md``: the repo's own are at its root or in docs/."""


TERMINAL_NAMES = {"COMPLETED", "CANCELED", "ERROR"}
"""The terminal states, as a rule re-spelling them would list them (det.states holds them)."""

TERMINAL_SQL_LIST = re.compile(r"\(\s*'(?:COMPLETED|CANCELED|ERROR)'(?:\s*,\s*"
                               r"'(?:COMPLETED|CANCELED|ERROR)'){2}\s*\)")
"""The terminal states written out as an SQL list, in any order."""

CHANNEL_SQL = re.compile(r"\b(?:pg_notify|det_internal\.channel|det_\w+\.listen)\s*\(|"
                         r"(?:^|;)\s*(?:LISTEN|NOTIFY)\s+[\w\"]", re.IGNORECASE | re.MULTILINE)
"""SQL that names, listens on or notifies a channel."""


def det_sources(root: Path) -> list[Path]:
    """det's Python files under ``root``, outside :data:`NOT_DET`."""
    return sorted(p for top in root.iterdir() if top.name not in NOT_DET
                  for p in ([top] if top.is_file() else top.rglob("*.py"))
                  if p.suffix == ".py")


def private_references(root: Path) -> list[str]:
    """``file:line: text`` of each pointer to a document outside the repo in det's sources
    and in ``schema.sql``, whose comments are the catalog's text (function bodies, COMMENT ON)."""
    found = []
    schema = schema_contract.files(root / "schema.sql")
    for path in det_sources(root) + schema:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_REFERENCE.search(line):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return found


def missing_citations(root: Path) -> list[str]:
    """``file: path`` of each repo path or Markdown file det's sources cite that does not
    exist. A path counts as the repo's when its first directory is one of the repo's
    top-level directories (``master/pkg/schemas/merge.go`` is Determined's, not det's);
    placeholders (``NNNN_name.sql``) are not citations."""
    tops = {p.name for p in root.iterdir() if p.is_dir()}
    found = []
    for path in det_sources(root):
        text = path.read_text()
        for m in CITED_PATH.finditer(text):
            cited = m.group(1)
            if (cited.split("/")[0] in tops and "NNNN" not in cited
                    and not (root / cited).exists()):
                found.append(f"{path.relative_to(root)}: {cited}")
        for m in CITED_DOC.finditer(text):
            if not ((root / m.group(1)).exists() or (root / "docs" / m.group(1)).exists()):
                found.append(f"{path.relative_to(root)}: {m.group(1)}")
    return found


def string_constants(tree: ast.AST) -> list[ast.Constant]:
    """The string literals of a module that are not docstrings (an expression statement's)."""
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docstrings]


def respelled_terminal_states(root: Path) -> list[str]:
    """``file:line`` of each set, tuple or list of exactly the terminal states (as strings or
    an enum's members), and each SQL list of them, outside ``states.py``."""
    found = []
    for path in det_sources(root):
        if path == root / "states.py":
            continue
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Set | ast.Tuple | ast.List):
                names = [e.value if isinstance(e, ast.Constant) else getattr(e, "attr", None)
                         for e in n.elts]
                if len(names) == len(TERMINAL_NAMES) and set(names) == TERMINAL_NAMES:
                    found.append(f"{path.relative_to(root)}:{n.lineno}")
        found += [f"{path.relative_to(root)}:{c.lineno}" for c in string_constants(tree)
                  if TERMINAL_SQL_LIST.search(c.value)]
    return sorted(found)


def channels_named_elsewhere(root: Path) -> list[str]:
    """``file:line`` of each SQL string outside ``db/channels.py`` that names, LISTENs on or
    NOTIFYs a channel."""
    return [f"{path.relative_to(root)}:{c.lineno}" for path in det_sources(root)
            if path != root / "db" / "channels.py"
            for c in string_constants(ast.parse(path.read_text()))
            if CHANNEL_SQL.search(c.value)]


def imports_of(root: Path, folder: str, package: str) -> list[str]:
    """``file:line`` of each import of ``package`` (or a module under it) under ``folder``."""
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                modules = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module:
                modules = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            else:
                continue
            if any(m == package or m.startswith(f"{package}.") for m in modules):
                found.append(f"{path.relative_to(root)}:{n.lineno}")
    return found


def test_comments_point_at_no_document_outside_the_repo() -> None:
    assert private_references(REPO) == []


def test_every_file_a_comment_cites_exists() -> None:
    assert missing_citations(REPO) == []


def test_the_terminal_states_are_spelled_once() -> None:
    assert respelled_terminal_states(REPO) == []


def test_only_db_channels_names_a_channel() -> None:
    assert channels_named_elsewhere(REPO) == []


def test_the_api_imports_no_cli_module() -> None:
    assert imports_of(REPO, "api", "det.cli") == []


def test_the_reads_run_no_searcher_code() -> None:
    """det.queries only reads: live progress and rungs are the searcher room's, called by
    the readers (det.reconciler.searchers.live)."""
    assert imports_of(REPO, "queries", "det.reconciler.searchers") == []


def test_the_rules_catch_what_they_are_for(tmp_path: Path) -> None:
    """Each rule finds its fault in a tree made for it, and passes the forms that are fine."""
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "channels.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text('"""Reproduces issue 7."""\n')
    (tmp_path / "a.py").write_text(
        '"""Checked (issue 32). As upstream does (reference-facts §1.2; notes §2.4).\n\n'
        "One place: db/channels.py, det/db/channels.py; not db/gone.py nor DESIGN.md.\n"
        "Determined's master/pkg/schemas/merge.go; db/migrations/NNNN_name.sql.\n"
        'An issue to fix, the notes of a release."""\n')
    (tmp_path / "schema.sql").write_text("-- A rule.\n-- Checked (issue 5).\n")
    assert [":".join(r.split(":")[:2]) for r in private_references(tmp_path)] == [
        "a.py:1", "schema.sql:2"]
    assert missing_citations(tmp_path) == ["a.py: db/gone.py", "a.py: DESIGN.md"]

    (tmp_path / "db" / "channels.py").write_text(
        'X = "SELECT pg_notify(det_internal.channel(%s))"\n')
    (tmp_path / "states.py").write_text('TERMINAL = {"COMPLETED", "CANCELED", "ERROR"}\n')
    (tmp_path / "b.py").write_text(
        '"""Ends in COMPLETED, CANCELED or ERROR; LISTENs (pg_notify(...)) on its channel."""\n'
        'DONE = {"ERROR", "COMPLETED", "CANCELED"}\n'
        'ENDED = (State.COMPLETED, State.CANCELED, State.ERROR)\n'
        'FINE = ("COMPLETED", "CANCELED")\n'
        'Q = "SELECT 1 WHERE state NOT IN (\'CANCELED\', \'ERROR\', \'COMPLETED\')"\n'
        'L = "LISTEN det_reconciler"\n'
        'N = "SELECT 1; NOTIFY x"\n'
        'R = "UNLISTEN *; SELECT det_agent.listen(%s)"\n'
        'OK = "UNLISTEN *; DISCARD TEMP"\n')
    assert respelled_terminal_states(tmp_path) == ["b.py:2", "b.py:3", "b.py:5"]
    assert channels_named_elsewhere(tmp_path) == ["b.py:6", "b.py:7", "b.py:8"]
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "r.py").write_text(
        "from det.cli.preview import search_preview\nimport det.cli.output\n"
        "from det import cli\nfrom det.client import x\nfrom det.queries import trials\n"
        "def f():\n    from det.cli import output\n")
    assert imports_of(tmp_path, "api", "det.cli") == ["api/r.py:1", "api/r.py:2", "api/r.py:3",
                                                      "api/r.py:7"]
    (tmp_path / "queries").mkdir()
    (tmp_path / "queries" / "q.py").write_text(
        "from det.reconciler import searchers\nfrom det.reconciler import leader\n"
        "def f():\n    from det.reconciler.searchers import searcher_progress\n")
    assert imports_of(tmp_path, "queries", "det.reconciler.searchers") == ["queries/q.py:1",
                                                                           "queries/q.py:4"]
