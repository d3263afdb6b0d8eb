"""Reading experiments: the list (filters, sort, paging), one experiment, its trials and
checkpoints."""

from dataclasses import dataclass

import psycopg
from psycopg import sql

from det.errors import DetError, NotFoundError
from det.sql import named

Q = named("queries")

SORTS = {"id": "id", "name": "name", "state": "state", "progress": "progress",
         "started": "start_time", "ended": "end_time", "owner": "owner", "trials": "trials",
         "best_validation": "best_validation"}
"""Columns the list may be sorted by (``?sort=``; a leading ``-`` sorts descending)."""

NULLABLE = {"ended", "best_validation"}
"""Sort keys that may be NULL: NULLs sort last either way."""

MAX_PAGE = 1000
"""Most experiments one list call returns."""


@dataclass(frozen=True)
class ListFilter:
    """What ``det experiment list`` and ``GET /api/v1/experiments`` select: ``archived``
    includes archived ones; ``states`` (experiment_state names), ``owner``, ``name`` (a
    case-insensitive substring), ``workspace`` and ``project`` (exact names) narrow; ``sort``
    is a key of :data:`SORTS`, ``-`` first for descending; ``limit`` (None: all) and
    ``offset`` page."""

    archived: bool = False
    states: tuple[str, ...] | None = None
    owner: str | None = None
    name: str | None = None
    workspace: str | None = None
    project: str | None = None
    sort: str = "id"
    limit: int | None = None
    offset: int = 0

    def params(self) -> dict:
        return {"all": self.archived, "states": list(self.states) if self.states else None,
                "owner": self.owner, "name": self.name, "workspace": self.workspace,
                "project": self.project, "limit": self.limit,
                "offset": self.offset}


def list_experiments(conn: psycopg.Connection, f: ListFilter) -> list[dict]:
    """The experiments ``f`` selects, in its order (ties broken by id), ``progress`` in whole
    percent as stored (det.reconciler.searchers.live.page_with_live_progress adds what
    running trials trained since).

    Raises:
        DetError: an unknown sort key, or a negative limit or offset (naming the field).
    """
    key = f.sort.removeprefix("-")
    if key not in SORTS:
        raise DetError(f"sort: expected one of {', '.join(SORTS)} (with - for descending), "
                       f"not {f.sort!r}")
    if f.limit is not None and not 0 <= f.limit <= MAX_PAGE:
        raise DetError(f"limit: expected 0 to {MAX_PAGE}, not {f.limit}")
    if f.offset < 0:
        raise DetError(f"offset: expected 0 or more, not {f.offset}")
    desc = f.sort.startswith("-")
    # Plain ASC / DESC on the columns that are never NULL, so that an index in that order
    # (the primary key for the default newest-first page) can serve ORDER BY ... LIMIT.
    nulls = " NULLS LAST" if key in NULLABLE else ""
    order = sql.SQL("{}{}, id{}").format(
        sql.Identifier(SORTS[key]), sql.SQL((" DESC" if desc else " ASC") + nulls),
        sql.SQL(" DESC" if desc else " ASC"))
    query = sql.SQL(Q.list_experiments).format(order=order)
    return conn.execute(query, f.params()).fetchall()


def searcher_of(config: object) -> dict:
    """The ``searcher`` section of a stored experiment config, or ``{}`` when it has none.

    Readers take every key of a stored config with a display default (``.get``), never by
    indexing: a config stored before a key existed, or from psql before
    ``det_user.create_experiment`` checked configs, may lack it."""
    searcher = config.get("searcher") if isinstance(config, dict) else None
    return searcher if isinstance(searcher, dict) else {}


def count_experiments(conn: psycopg.Connection, f: ListFilter) -> int:
    """How many experiments ``f`` selects, ignoring its paging."""
    return conn.execute(Q.count_experiments, f.params()).fetchone()["n"]


def get_experiment(conn: psycopg.Connection, exp_id: int) -> dict:
    """The experiment row (queries.sql: experiment), ``progress`` in [0, 1] as stored
    (det.reconciler.searchers.live.with_live_progress adds what running trials trained
    since). Raises NotFoundError."""
    row = conn.execute(Q.experiment, {"id": exp_id}).fetchone()
    if row is None:
        raise NotFoundError(f"experiment {exp_id} not found")
    return row


def live_inputs(conn: psycopg.Connection, ids: list[int]) -> list[dict]:
    """What live progress (det.reconciler.searchers.live) needs of the experiments ``ids``
    that have a searcher state: ``config``, ``searcher_state`` and ``trials`` (each one's
    ``request_id``, ``hparams`` and ``batches`` trained so far)."""
    return conn.execute(Q.live_progress, {"ids": ids}).fetchall()


def searcher_state(conn: psycopg.Connection, exp_id: int) -> dict | None:
    """Experiment ``exp_id``'s saved searcher state (None before its search began)."""
    return conn.execute(Q.searcher_state, {"id": exp_id}).fetchone()["searcher_state"]


def job_of(conn: psycopg.Connection, exp_id: int) -> int:
    """The id of the experiment's job. Raises NotFoundError."""
    row = conn.execute(Q.experiment_job, {"id": exp_id}).fetchone()
    if row is None:
        raise NotFoundError(f"experiment {exp_id} not found")
    return row["job_id"]


def require_experiment(conn: psycopg.Connection, exp_id: int) -> None:
    """Raises NotFoundError when experiment ``exp_id`` does not exist or the caller may not
    view it."""
    if conn.execute(Q.experiment_exists, (exp_id,)).fetchone() is None:
        raise NotFoundError(f"experiment {exp_id} not found")
