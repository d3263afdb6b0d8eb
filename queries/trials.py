"""Reading trials: one trial, its logs, its metrics (whole, or downsampled in SQL)."""

from datetime import UTC

import psycopg

from det.errors import DetError, NotFoundError
from det.sql import named

Q = named("queries")


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


MAX_POINTS = 100_000
"""Most rows one metrics series returns; more need ``max_points`` (downsampling)."""


def get_trial(conn: psycopg.Connection, trial_id: int) -> dict:
    """The trial row (queries.sql: trial). Raises NotFoundError."""
    row = conn.execute(Q.trial, {"id": trial_id}).fetchone()
    if row is None:
        raise NotFoundError(f"trial {trial_id} not found")
    return row


def metric_series(conn: psycopg.Connection, trial_id: int, group: str,
                  max_points: int | None) -> list[dict]:
    """The trial's metrics rows of ``group`` (``id``, ``steps_completed``, ``values``,
    ``reported_at``) in batch order: all of them (at most :data:`MAX_POINTS`), or at most
    ``max_points`` spread over the batches (queries.sql: metric_series_sampled).

    Raises:
        DetError: ``max_points`` below 2 or above MAX_POINTS.
    """
    if max_points is None:
        return conn.execute(Q.metric_series_all, {"trial": trial_id, "group": group,
                                                  "limit": MAX_POINTS}).fetchall()
    if not 2 <= max_points <= MAX_POINTS:
        raise DetError(f"max_points: expected 2 to {MAX_POINTS}, not {max_points}")
    return conn.execute(Q.metric_series_sampled, {"trial": trial_id, "group": group,
                                                      "n": max_points}).fetchall()


def trial_checkpoints(conn: psycopg.Connection, trial_id: int) -> list[dict]:
    """Trial ``trial_id``'s checkpoints in batch order (queries.sql: trial_checkpoints):
    state, sizes in bytes, when reported and deleted, storage type."""
    return conn.execute(Q.trial_checkpoints, {"id": trial_id}).fetchall()


def require_trial(conn: psycopg.Connection, trial_id: int) -> None:
    """Raises NotFoundError when trial ``trial_id`` does not exist or the caller may not view
    it."""
    if conn.execute(Q.trial_exists, (trial_id,)).fetchone() is None:
        raise NotFoundError(f"trial {trial_id} not found")
