"""Checkpoints ranked by a validation metric: an experiment's or a trial's best first, as
Determined 0.38's ``det experiment download`` / ``det trial download --best`` /
``det experiment list-checkpoints --best`` and the SDK's ``top_checkpoint`` pick them."""

import psycopg

from det.sql import named

Q = named("queries")


def ranked_checkpoints(conn: psycopg.Connection, *, experiment: int | None = None,
                       trial: int | None = None, metric: str | None = None,
                       smaller_is_better: bool | None = None,
                       validated: bool = False) -> list[dict]:
    """The COMPLETED checkpoints of ``experiment`` and/or ``trial``, best first: by the
    validation ``metric`` the trial reported at the checkpoint's batch count (default: the
    experiment's searcher metric; ``smaller_is_better`` defaults to the searcher's, else
    true, as in Determined), checkpoints without that value last, then the latest first.
    ``validated``: only those with the value (upstream's ``list-checkpoints --best``). Each
    row has ``metric_value`` (None where there is none). Rows the caller may not read
    (row security) are absent."""
    return conn.execute(Q.ranked_checkpoints,
                        {"experiment": experiment, "trial": trial, "metric": metric,
                         "smaller": smaller_is_better, "validated": validated}).fetchall()


def best_per_trial(rows: list[dict], n: int) -> list[dict]:
    """The best of each trial's ``rows`` (ranked, best first), for the ``n`` best trials:
    upstream's ``det experiment download --top-n N``."""
    seen: set[int] = set()
    best = []
    for row in rows:
        if row["trial_id"] not in seen:
            seen.add(row["trial_id"])
            best.append(row)
    return best[:n]


def checkpoint_sizes(conn: psycopg.Connection, exp_id: int) -> list[dict]:
    """The checkpoints of experiment ``exp_id``'s trials in batch order, each with
    ``size_bytes`` (its files', in bytes) and ``freed_bytes`` (what deleting it gave back)."""
    return conn.execute(Q.checkpoint_sizes, {"id": exp_id}).fetchall()


def describe_checkpoint(conn: psycopg.Connection, uuid: str) -> dict | None:
    """Checkpoint ``uuid`` whole (storage, metadata, ``resources``: file -> bytes) with its
    experiment and the ``validation`` metrics reported at its batch; None when absent."""
    return conn.execute(Q.checkpoint_described, {"uuid": uuid}).fetchone()
