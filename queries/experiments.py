"""Reading experiments: the list (filters, sort, paging), one experiment, its trials and
checkpoints."""

from dataclasses import asdict, dataclass

import psycopg
from psycopg import sql

from det.errors import ConfigError, DetError, NotFoundError
from det.states import TERMINAL, TERMINAL_SQL

_LIST_WHERE = """
 WHERE (%(all)s OR NOT archived)
   AND (%(states)s::text[] IS NULL OR state::text = ANY (%(states)s::text[]))
   AND (%(owner)s::text IS NULL OR owner = %(owner)s)
   AND (%(name)s::text IS NULL OR strpos(lower(name), lower(%(name)s)) > 0)
   AND (%(workspace)s::text IS NULL AND %(project)s::text IS NULL
        OR project_id IN (SELECT p.id FROM projects p JOIN workspaces w ON w.id = p.workspace_id
                           WHERE (%(workspace)s::text IS NULL OR w.name = %(workspace)s)
                             AND (%(project)s::text IS NULL OR p.name = %(project)s)))
"""

LIST = """
SELECT id, name, state::text AS state, round(progress * 100)::integer AS progress, trials,
       owner, start_time AS started, end_time AS ended, best_validation, searcher, metric,
       archived, resource_pool, priority, weight, workspace, project
  FROM reporting.experiments""" + _LIST_WHERE + """
 ORDER BY {order} LIMIT %(limit)s OFFSET %(offset)s
"""

# The filters name only experiments' own columns, so the count needs no join.
COUNT = "SELECT count(*) AS n FROM experiments" + _LIST_WHERE

SORTS = {"id": "id", "name": "name", "state": "state", "progress": "progress",
         "started": "start_time", "ended": "end_time", "owner": "owner", "trials": "trials",
         "best_validation": "best_validation"}
"""Columns the list may be sorted by (``?sort=``; a leading ``-`` sorts descending)."""

NULLABLE = {"ended", "best_validation"}
"""Sort keys that may be NULL: NULLs sort last either way."""

EXPERIMENT = """
SELECT e.id, e.name, e.description, e.state::text AS state, e.owner, e.progress, e.config,
       e.start_time, e.end_time, j.resource_pool, j.priority, j.weight, j.id AS job_id,
       e.archived, e.checkpoint_gc_error, e.delete_requested_at, e.original_config,
       e.paused_reason
  FROM experiments e JOIN jobs j ON j.id = e.job_id WHERE e.id = %(id)s
"""

# batches: what the trial has trained so far, from its latest training metrics (reported
# with every batch of metrics), so progress shows before the first checkpoint;
# steps_completed is the batches as of its latest checkpoint (its restart point);
# validation: all the metrics of its best validation, which the trials tables show as columns.
TRIALS = """
SELECT t.id, t.request_id::text AS request_id, t.state::text AS state, t.hparams,
       t.steps_completed, t.best_validation, t.restarts, t.latest_checkpoint, t.exit_reason,
       t.start_time, t.end_time,
       greatest(t.steps_completed,
                (SELECT max(m.steps_completed) FROM metrics m
                  WHERE m.trial_id = t.id AND m."group" = 'training'
                    AND m.superseded_by IS NULL)) AS batches,
       -- The metrics of the validation that gave best_validation (the latest such, on a tie):
       -- det_trial_best_validation's rule picked it, so matching its value finds the row.
       (SELECT det_json_shown(m."values") FROM metrics m, experiments e
         WHERE e.id = t.experiment_id AND m.trial_id = t.id AND m."group" = 'validation'
           AND m.superseded_by IS NULL
           AND CASE WHEN jsonb_typeof(m."values" -> (e.config #>> '{searcher,metric}'))
                         = 'number'
                    THEN (m."values" ->> (e.config #>> '{searcher,metric}'))::double precision
                    END = t.best_validation
         ORDER BY m.steps_completed DESC LIMIT 1) AS validation,
       -- its latest run as the job queue sees it (waiting, starting, running, preempting,
       -- stopping, preempted, ended) and why; NULL before its first run
       det_run_status(r.id) AS run_state, det_run_reason(r.id) AS run_reason
  FROM trials t
  LEFT JOIN LATERAL (SELECT a.id FROM allocations a
                      WHERE a.trial_id = t.id ORDER BY a.run DESC LIMIT 1) r ON true
 WHERE t.experiment_id = %(id)s ORDER BY t.id
"""

# Read only for adaptive_asha, whose describe shows each trial's rung (it holds the RNG state,
# so it stays out of EXPERIMENT).
SEARCHER_STATE = "SELECT searcher_state FROM experiments WHERE id = %(id)s"

CHECKPOINTS = """
SELECT c.uuid::text AS uuid, c.trial_id, c.steps_completed, c.state, c.reported_at,
       (SELECT det_json_shown(m."values") FROM metrics m
         WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
           AND m.steps_completed = c.steps_completed AND m.superseded_by IS NULL
         ORDER BY m.id DESC LIMIT 1) AS validation
  FROM checkpoints c JOIN trials t ON t.id = c.trial_id
 WHERE t.experiment_id = %(id)s ORDER BY c.trial_id, c.steps_completed
"""

STATE = "SELECT state::text AS state FROM experiments WHERE id = %(id)s"

# How many of an experiment's trials have ended, of those its searcher has made so far
# (`det experiment wait`'s bar).
TRIALS_DONE = f"""
SELECT count(*) FILTER (WHERE state IN {TERMINAL_SQL}) AS done,
       count(*) AS total
  FROM trials WHERE experiment_id = %(id)s
"""

JOB_OF = "SELECT job_id FROM experiments WHERE id = %(id)s"

# What live progress needs of experiments still running: the config, the searcher's state and
# each trial's batches trained so far (its latest training metrics).
LIVE = """
SELECT e.id, e.config, e.searcher_state,
       coalesce(jsonb_agg(jsonb_build_object(
           'request_id', t.request_id::text, 'hparams', t.hparams,
           'batches', greatest(t.steps_completed,
                               (SELECT max(m.steps_completed) FROM metrics m
                                 WHERE m.trial_id = t.id AND m."group" = 'training'
                                   AND m.superseded_by IS NULL))))
                FILTER (WHERE t.id IS NOT NULL), '[]') AS trials
  FROM experiments e LEFT JOIN trials t ON t.experiment_id = e.id
 WHERE e.id = ANY (%(ids)s) AND e.searcher_state IS NOT NULL
 GROUP BY e.id
"""

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
    """The experiments ``f`` selects, in its order (ties broken by id).

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
    query = sql.SQL(LIST).format(order=order)
    rows = conn.execute(query, f.params()).fetchall()
    live = live_progress(conn, [r["id"] for r in rows if r["state"] not in TERMINAL])
    for r in rows:
        if r["id"] in live:
            r["progress"] = max(r["progress"], round(live[r["id"]] * 100))
    return rows


def searcher_of(config: object) -> dict:
    """The ``searcher`` section of a stored experiment config, or ``{}`` when it has none.

    Readers take every key of a stored config with a display default (``.get``), never by
    indexing: a config stored before a key existed, or from psql before
    ``det_create_experiment`` checked configs, may lack it."""
    searcher = config.get("searcher") if isinstance(config, dict) else None
    return searcher if isinstance(searcher, dict) else {}


def live_progress(conn: psycopg.Connection, ids: list[int]) -> dict[int, float]:
    """Progress in [0, 1] of the experiments ``ids`` (those still running), counting the
    batches their open trials have trained so far, not only the lengths they validated at:
    the searcher's own progress rule (det.reconciler.searchers) over its saved state, each
    open trial's length raised to its batches in the unit of ``searcher.max_length``. So a
    single-trial experiment moves before its first validation or checkpoint."""
    if not ids:
        return {}
    from det.harness.lengths import UnitConverter
    from det.reconciler.searchers import searcher_progress

    out = {}
    for row in conn.execute(LIVE, {"ids": ids}).fetchall():
        config, state = row["config"], dict(row["searcher_state"])
        max_length = searcher_of(config).get("max_length")
        if not isinstance(max_length, dict) or not max_length:
            continue  # each trial's code decides its length: the saved progress stands
        unit = next(iter(max_length))
        trials = {t["request_id"]: t for t in row["trials"]}
        records = []
        for rec in state["trials"]:
            t = trials.get(rec["request_id"])
            if t is not None and t["batches"] and not rec["closed"] and rec["exit"] is None:
                try:
                    units = UnitConverter.from_config(config, t["hparams"]).from_batches(
                        t["batches"], unit)
                except ConfigError:  # no global_batch_size: the saved progress stands
                    units = 0
                rec = {**rec, "length": max(rec["length"], int(units))}
            records.append(rec)
        try:
            out[row["id"]] = searcher_progress(config, {**state, "trials": records})
        except (DetError, ValueError):
            continue  # an old config the searcher no longer reads: the saved progress stands
    return out


def count_experiments(conn: psycopg.Connection, f: ListFilter) -> int:
    """How many experiments ``f`` selects, ignoring its paging."""
    return conn.execute(COUNT, f.params()).fetchone()["n"]


def get_experiment(conn: psycopg.Connection, exp_id: int) -> dict:
    """The experiment row (EXPERIMENT), its progress live (:func:`live_progress`) while it
    runs. Raises NotFoundError."""
    row = conn.execute(EXPERIMENT, {"id": exp_id}).fetchone()
    if row is None:
        raise NotFoundError(f"experiment {exp_id} not found")
    if row["state"] not in TERMINAL:
        row["progress"] = max(row["progress"], live_progress(conn, [exp_id]).get(exp_id, 0.0))
    return row


def add_rungs(conn: psycopg.Connection, exp: dict, trials: list[dict]) -> bool:
    """For adaptive_asha and tpe, set each of ``trials``' ``rung`` (bracket, rung, length,
    its status in the search and the metric that decided it; None before its first rung)
    from the searcher's state; returns whether the searcher has rungs."""
    from det.reconciler.searchers import trial_rungs

    if searcher_of(exp["config"]).get("name") not in ("adaptive_asha", "tpe"):
        return False
    state = conn.execute(SEARCHER_STATE, {"id": exp["id"]}).fetchone()["searcher_state"]
    try:
        rungs = trial_rungs(exp["config"], state)
    except (DetError, ValueError):
        return False  # an old config the searcher no longer reads: shown without rungs
    for t in trials:
        rung = rungs.get(t["request_id"])
        t["rung"] = asdict(rung) if rung else None
    return True


def job_of(conn: psycopg.Connection, exp_id: int) -> int:
    """The id of the experiment's job. Raises NotFoundError."""
    row = conn.execute(JOB_OF, {"id": exp_id}).fetchone()
    if row is None:
        raise NotFoundError(f"experiment {exp_id} not found")
    return row["job_id"]
