"""What readers show of a running search beyond its stored rows: progress that counts the
batches its open trials have trained so far, and each trial's rung (adaptive_asha, tpe).

The reads (:mod:`det.queries.experiments`) run no searcher code; ``det experiment``,
det serve and the SDK call these explicitly on what they read, so the searcher's own rules
(:func:`~det.reconciler.searchers.searcher.searcher_progress`,
:func:`~det.reconciler.searchers.asha.trial_rungs`) stay in this room."""

from dataclasses import asdict

import psycopg

from det.errors import ConfigError, DetError
from det.queries.experiments import live_inputs, searcher_of, searcher_state
from det.states import TERMINAL


def live_progress(conn: psycopg.Connection, ids: list[int]) -> dict[int, float]:
    """Progress in [0, 1] of the experiments ``ids`` (those still running), counting the
    batches their open trials have trained so far, not only the lengths they validated at:
    the searcher's own progress rule over its saved state, each open trial's length raised to
    its batches in the unit of ``searcher.max_length``. So a single-trial experiment moves
    before its first validation or checkpoint. An experiment whose saved progress stands
    (no ``max_length``, no searcher state, a config the searcher no longer reads) is absent."""
    if not ids:
        return {}
    from det.harness.lengths import UnitConverter
    from det.reconciler.searchers.searcher import searcher_progress

    out = {}
    for row in live_inputs(conn, ids):
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


def page_with_live_progress(conn: psycopg.Connection, rows: list[dict]) -> list[dict]:
    """``rows`` of :func:`det.queries.experiments.list_experiments` (``progress`` in whole
    percent), each still running raised to its :func:`live_progress`. Returns ``rows``."""
    live = live_progress(conn, [r["id"] for r in rows if r["state"] not in TERMINAL])
    for r in rows:
        if r["id"] in live:
            r["progress"] = max(r["progress"], round(live[r["id"]] * 100))
    return rows


def with_live_progress(conn: psycopg.Connection, exp: dict) -> dict:
    """The experiment row ``exp`` of :func:`det.queries.experiments.get_experiment`
    (``progress`` in [0, 1]) with its :func:`live_progress` while it runs. Returns ``exp``."""
    if exp["state"] not in TERMINAL:
        exp["progress"] = max(exp["progress"],
                              live_progress(conn, [exp["id"]]).get(exp["id"], 0.0))
    return exp


def add_rungs(conn: psycopg.Connection, exp: dict, trials: list[dict]) -> bool:
    """For adaptive_asha and tpe, set each of ``trials``' ``rung`` (bracket, rung, length,
    its status in the search and the metric that decided it; None before its first rung)
    from the searcher's state; returns whether the searcher has rungs. ``exp`` is the
    experiment row of ``det.queries.experiments.get_experiment``."""
    from det.reconciler.searchers.asha import trial_rungs

    if exp["searcher_name"] not in ("adaptive_asha", "tpe"):
        return False
    state = searcher_state(conn, exp["id"])
    try:
        rungs = trial_rungs(exp["config"], state)
    except (DetError, ValueError):
        return False  # an old config the searcher no longer reads: shown without rungs
    for t in trials:
        rung = rungs.get(t["request_id"])
        t["rung"] = asdict(rung) if rung else None
    return True
