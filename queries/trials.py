"""Reading trials: one trial, its logs, its metrics (whole, or downsampled in SQL)."""

from datetime import UTC

import psycopg

from det.errors import DetError, NotFoundError

TRIAL = """
SELECT t.id, t.experiment_id, t.state::text AS state, t.hparams, t.seed, t.restarts, t.runs,
       t.steps_completed, t.best_validation, t.latest_checkpoint::text AS latest_checkpoint,
       t.exit_reason, t.start_time, t.end_time, det_json_shown(t.metadata) AS metadata,
       greatest(t.steps_completed,
                (SELECT max(m.steps_completed) FROM metrics m
                  WHERE m.trial_id = t.id AND m."group" = 'training'
                    AND m.superseded_by IS NULL)) AS batches
  FROM trials t WHERE t.id = %(id)s
"""

# A trial's log lines after a log id, each with its run (its allocation's), the rank that
# wrote it (NULL: det's notes, a launcher's lines) and its level (det_log_level).
LOGS_AFTER = """
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, det_log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id = %(trial)s AND l.id > %(after)s ORDER BY l.id LIMIT %(limit)s
"""

# The last lines, for a log tail: newest first, reversed by the caller.
LOGS_TAIL = """
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, det_log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id = %(trial)s ORDER BY l.id DESC LIMIT %(limit)s
"""

# An experiment's log lines after a log id (every trial's, in the order written), as LOGS_AFTER
# with the trial of each.
EXPERIMENT_LOGS_AFTER = """
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, l.trial_id,
       det_log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id IN (SELECT id FROM trials WHERE experiment_id = %(experiment)s)
   AND l.id > %(after)s ORDER BY l.id LIMIT %(limit)s
"""

# The experiment's last lines, newest first (reversed by the caller).
EXPERIMENT_LOGS_TAIL = """
SELECT l.id, l.ts, l.stream, l.line, l.rank, a.run, l.trial_id,
       det_log_level(l.stream, l.line) AS level
  FROM task_logs l JOIN allocations a ON a.id = l.allocation_id
 WHERE l.trial_id IN (SELECT id FROM trials WHERE experiment_id = %(experiment)s)
 ORDER BY l.id DESC LIMIT %(limit)s
"""


def line_prefix(row: dict) -> str:
    """What a log row's text follows where det shows it (``det trial logs``, ``det experiment
    logs``, the WebUI's download): its trial (an experiment's rows) and run, ``[trial 5 run 2] ``
    or ``[run 2] ``; the rank that wrote it, as Determined's launcher tags it, ``[rank=0] ``;
    ``[det] `` for det's own notes."""
    where = " ".join(f"{name} {row[key]}" for name, key in (("trial", "trial_id"), ("run", "run"))
                     if row.get(key) is not None)
    prefix = f"[{where}] " if where else ""
    if row.get("rank") is not None:
        prefix += f"[rank={row['rank']}] "
    return prefix + ("[det] " if row["stream"] == "det" else "")


def log_text(row: dict, timestamps: bool = False) -> str:
    """A log row as det prints it: its :func:`line_prefix` and line, after its time with
    ``timestamps`` (UTC, ISO 8601, milliseconds)."""
    text = line_prefix(row) + row["line"]
    if timestamps:
        return f"{row['ts'].astimezone(UTC).isoformat(timespec='milliseconds')} {text}"
    return text


# A trial's runs (its restarts are the runs after the first): where each ran, how it ended
# and why (det_run_end_reason: never blank once ended), and as the queue sees it
# (det_run_status, det_run_reason).
RUNS = """
SELECT run, state::text AS state, agent_id, slots_needed, exit_code,
       det_run_end_reason(a.id) AS exit_reason, created_at, started_at, ended_at,
       pending_reason, det_run_status(a.id) AS run_state, det_run_reason(a.id) AS run_reason
  FROM allocations a WHERE trial_id = %(id)s ORDER BY run
"""

FIRST_TRIAL = "SELECT min(id) AS id FROM trials WHERE experiment_id = %(id)s"

# Every reader of metrics reads the trial's surviving history: rows a later run superseded
# (superseded_by, set when it resumed from an earlier checkpoint) are left out, and values are
# shown through det_json_shown (rows stored before depth was bounded may nest too deep to
# parse). METRICS shows the superseded rows too when asked (%(superseded)s), with the run
# (allocations.run) that superseded each.
METRICS = """
SELECT m."group", m.steps_completed, det_json_shown(m."values") AS "values",
       s.run AS superseded_by_run
  FROM metrics m LEFT JOIN allocations s ON s.id = m.superseded_by
 WHERE m.trial_id = %(id)s AND (m.superseded_by IS NULL OR %(superseded)s)
 ORDER BY m.steps_completed, m.id
"""

# One group's rows after a metrics id (what an event stream has not sent yet).
METRICS_AFTER = """
SELECT id, "group", steps_completed, det_json_shown("values") AS "values", reported_at
  FROM metrics
 WHERE trial_id = %(trial)s AND (%(group)s::text IS NULL OR "group" = %(group)s)
   AND id > %(after)s AND superseded_by IS NULL
 ORDER BY id LIMIT %(limit)s
"""

# At most n rows of one group, spread evenly over its range of batches: n probes of the
# (trial, group, steps) index, each taking the first row at or after its point, the last
# at the last batch reported. Its cost grows with n, not with the rows stored (a series of
# millions of rows answers in milliseconds); rows between two probes are skipped, not
# averaged, so every point shown is one that was reported.
SERIES = """
WITH span AS (
    SELECT (SELECT steps_completed FROM metrics
             WHERE trial_id = %(trial)s AND "group" = %(group)s AND superseded_by IS NULL
             ORDER BY steps_completed LIMIT 1) AS lo,
           (SELECT steps_completed FROM metrics
             WHERE trial_id = %(trial)s AND "group" = %(group)s AND superseded_by IS NULL
             ORDER BY steps_completed DESC LIMIT 1) AS hi
)
SELECT DISTINCT m.id, m.steps_completed, det_json_shown(m."values") AS "values", m.reported_at
  FROM span, generate_series(0, %(n)s - 1) k
 CROSS JOIN LATERAL (
       SELECT x.id, x.steps_completed, x."values", x.reported_at FROM metrics x
        WHERE x.trial_id = %(trial)s AND x."group" = %(group)s AND x.superseded_by IS NULL
          AND x.steps_completed >= span.lo + (span.hi - span.lo) * k / (%(n)s - 1)
        ORDER BY x.steps_completed LIMIT 1) m
 WHERE span.lo IS NOT NULL
 ORDER BY m.steps_completed, m.id
"""

SERIES_ALL = """
SELECT id, steps_completed, det_json_shown("values") AS "values", reported_at FROM metrics
 WHERE trial_id = %(trial)s AND "group" = %(group)s AND superseded_by IS NULL
 ORDER BY steps_completed, id LIMIT %(limit)s
"""

CHECKPOINT = """
SELECT uuid::text AS uuid, state, storage FROM checkpoints WHERE uuid::text = %(uuid)s
"""

# The checkpoints whose uuid starts with a prefix a user typed (two, to tell an ambiguous one).
CHECKPOINTS_BY_PREFIX = """
SELECT uuid::text AS uuid, state, storage FROM checkpoints
 WHERE uuid::text LIKE replace(replace(lower(%(prefix)s), '%%', ''), '_', '') || '%%'
 ORDER BY uuid LIMIT 2
"""

MAX_POINTS = 100_000
"""Most rows one metrics series returns; more need ``max_points`` (downsampling)."""


def get_trial(conn: psycopg.Connection, trial_id: int) -> dict:
    """The trial row (TRIAL). Raises NotFoundError."""
    row = conn.execute(TRIAL, {"id": trial_id}).fetchone()
    if row is None:
        raise NotFoundError(f"trial {trial_id} not found")
    return row


def metric_series(conn: psycopg.Connection, trial_id: int, group: str,
                  max_points: int | None) -> list[dict]:
    """The trial's metrics rows of ``group`` (``id``, ``steps_completed``, ``values``,
    ``reported_at``) in batch order: all of them (at most :data:`MAX_POINTS`), or at most
    ``max_points`` spread over the batches (SERIES).

    Raises:
        DetError: ``max_points`` below 2 or above MAX_POINTS.
    """
    if max_points is None:
        return conn.execute(SERIES_ALL, {"trial": trial_id, "group": group,
                                         "limit": MAX_POINTS}).fetchall()
    if not 2 <= max_points <= MAX_POINTS:
        raise DetError(f"max_points: expected 2 to {MAX_POINTS}, not {max_points}")
    return conn.execute(SERIES, {"trial": trial_id, "group": group,
                                 "n": max_points}).fetchall()

# Metrics rows of some trials reported after a metrics id: what an event stream has not sent
# yet. The primary key's range from ``after`` holds only the rows written since (all trials'),
# so this stays cheap however long the series are.
METRICS_SINCE = """
SELECT id, trial_id, "group", steps_completed, det_json_shown("values") AS "values",
       reported_at
  FROM metrics
 WHERE id > %(after)s AND trial_id = ANY (%(trials)s) AND superseded_by IS NULL
 ORDER BY id LIMIT 10000
"""

LAST_METRIC_ID = "SELECT coalesce(max(id), 0) AS id FROM metrics"

LAST_LOG_ID = "SELECT coalesce(max(id), 0) AS id FROM task_logs WHERE trial_id = %(trial)s"
