"""Checkpoints ranked by a validation metric: an experiment's or a trial's best first, as
Determined 0.38's ``det experiment download`` / ``det trial download --best`` /
``det experiment list-checkpoints --best`` and the SDK's ``top_checkpoint`` pick them."""

import psycopg

RANKED = """
SELECT c.uuid::text AS uuid, c.trial_id, t.experiment_id, c.steps_completed, c.state,
       c.reported_at, c.storage, c.metadata, c.resources, v.value AS metric_value
  FROM checkpoints c
  JOIN trials t ON t.id = c.trial_id
  JOIN experiments e ON e.id = t.experiment_id
  CROSS JOIN LATERAL (SELECT coalesce(%(metric)s, e.config #>> '{searcher,metric}') AS metric,
                             coalesce(%(smaller)s, e.config #>> '{searcher,smaller_is_better}'
                                                   <> 'false', true) AS smaller) s
  -- the validation the trial reported at the checkpoint's batch count (its latest such row)
  LEFT JOIN LATERAL (
       SELECT CASE WHEN jsonb_typeof(m."values" -> s.metric) = 'number'
                   THEN (m."values" ->> s.metric)::double precision END AS value
         FROM metrics m
        WHERE m.trial_id = c.trial_id AND m."group" = 'validation'
          AND m.superseded_by IS NULL AND m.steps_completed = c.steps_completed
        ORDER BY m.id DESC LIMIT 1) v ON true
 WHERE c.state = 'COMPLETED'
   AND (%(experiment)s::integer IS NULL OR t.experiment_id = %(experiment)s::integer)
   AND (%(trial)s::integer IS NULL OR c.trial_id = %(trial)s::integer)
   AND (NOT %(validated)s OR v.value IS NOT NULL)
 ORDER BY CASE WHEN s.smaller THEN v.value END ASC NULLS LAST,
          CASE WHEN NOT s.smaller THEN v.value END DESC NULLS LAST,
          c.steps_completed DESC, c.reported_at DESC
"""


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
    return conn.execute(RANKED, {"experiment": experiment, "trial": trial, "metric": metric,
                                 "smaller": smaller_is_better,
                                 "validated": validated}).fetchall()


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
