"""One history per trial (issue 39, item 4): a run that resumes from the checkpoint at step S
supersedes what earlier runs reported after S, and every reader shows and counts only the
surviving rows.

The fault injected: a run is killed (ended with exit code 137 through det_agent.report_each,
as its agent reports a SIGKILL) after reporting metrics past its last checkpoint; the next
run resumes from that checkpoint and reports the same steps again, with other values.
"""

import json

import psycopg
from conftest import spelled
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config

CONFIG = """\
name: history
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
checkpoint_storage: {type: shared_fs, host_path: /tmp, save_experiment_best: 0,
                     save_trial_best: 1, save_trial_latest: 1}
"""


def a_trial(conn: psycopg.Connection) -> tuple[int, int]:
    """An active one-trial experiment and agent a1. Returns (job id, trial id). On a database
    of any migration (test_migration_0032_...): det's functions as it names them (spelled)."""
    text = CONFIG
    cfg = load_experiment_config(text).expanded()
    eid = conn.execute(spelled(conn, "SELECT det_user.create_experiment(%s, %s, NULL) AS id"),
                       (Jsonb(cfg), text)).fetchone()["id"]
    job = conn.execute("SELECT job_id FROM experiments WHERE id = %s", (eid,)).fetchone()["job_id"]
    tid = conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                       "VALUES (%s, gen_random_uuid(), '{}', 1) RETURNING id",
                       (eid,)).fetchone()["id"]
    conn.execute(spelled(conn, "SELECT det_agent.register('a1', 'h', 'default', 'process', "
                               "'[]')"))
    return job, tid


def start_run(conn: psycopg.Connection, job: int, trial: int, run: int) -> tuple[int, str]:
    """Run ``run`` of the trial placed on a1, claimed as the agent claims it, and started as
    the harness starts (det_task.info). Returns (allocation id, token)."""
    alloc = conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id) VALUES (%s, %s, %s, 'default', 0, '{\"kind\": \"trial\"}', "
        "'ASSIGNED', 'a1') RETURNING id", (job, trial, run)).fetchone()["id"]
    token = conn.execute(spelled(conn, "SELECT det_agent.claim('a1', %s) AS t"),
                         (alloc,)).fetchone()["t"]
    conn.execute(spelled(conn, "SELECT det_task.info(%s)"), (token,))
    return alloc, token


def report(conn: psycopg.Connection, token: str, rows: list[tuple[str, int, dict]]) -> None:
    conn.execute(spelled(conn, "SELECT det_task.report_metrics_batch(%s, NULL, NULL, %s, %s, "
                               "%s::jsonb[])"),
                 (token, [g for g, _, _ in rows], [s for _, s, _ in rows],
                  [json.dumps(v) for _, _, v in rows]))


def checkpoint(conn: psycopg.Connection, token: str, steps: int) -> None:
    conn.execute(spelled(conn, "SELECT det_task.report_checkpoint(%s, gen_random_uuid(), %s, "
                               "%s, '{}')"),
                 (token, steps, Jsonb({"state.bin": 64})))


def kill(conn: psycopg.Connection, alloc: int) -> None:
    """The run's process dies of SIGKILL, as its agent reports."""
    conn.execute(spelled(conn, "SELECT det_agent.report_each('a1', %s, 'TERMINATED', %s, %s)"),
                 ([alloc], [137], ["killed"]))


def test_a_restart_supersedes_what_dead_runs_reported_after_its_checkpoint(det, conn) -> None:
    job, trial = a_trial(conn)
    a1, t1 = start_run(conn, job, trial, 1)
    report(conn, t1, [("training", 1, {"loss": 0.9}), ("training", 2, {"loss": 0.8}),
                      ("validation", 2, {"loss": 0.5})])
    checkpoint(conn, t1, 2)
    # past the checkpoint, then killed: its best validation (0.1) never reaches a checkpoint
    report(conn, t1, [("training", 3, {"loss": 0.7}), ("training", 4, {"loss": 0.6}),
                      ("validation", 4, {"loss": 0.1})])
    kill(conn, a1)
    a2, t2 = start_run(conn, job, trial, 2)
    report(conn, t2, [("training", 3, {"loss": 0.75}), ("training", 4, {"loss": 0.65}),
                      ("training", 5, {"loss": 0.55})])
    kill(conn, a2)  # again, before any checkpoint: a third copy of steps 3 and 4
    _, t3 = start_run(conn, job, trial, 3)
    report(conn, t3, [("training", 3, {"loss": 0.7}), ("training", 4, {"loss": 0.6}),
                      ("validation", 4, {"loss": 0.3})])

    out = json.loads(det("trial", "describe", "--json", str(trial)).stdout)
    assert [(m["group"], m["steps_completed"], m["values"]["loss"]) for m in out["metrics"]] == [
        ("training", 1, 0.9), ("training", 2, 0.8), ("validation", 2, 0.5),
        ("training", 3, 0.7), ("training", 4, 0.6), ("validation", 4, 0.3)]
    assert out["best_validation"] == 0.3  # the dead run's 0.1 does not count
    assert out["batches"] == 4  # run 2's step 5 is not part of the story

    # kept for audit, shown on request with the run that superseded each
    everything = json.loads(det("trial", "describe", "--json", "--superseded",
                                str(trial)).stdout)["metrics"]
    superseded = sorted((m["steps_completed"], m["values"]["loss"], m["superseded_by_run"])
                        for m in everything if m["superseded_by_run"] is not None)
    assert superseded == [(3, 0.7, 2), (3, 0.75, 3), (4, 0.1, 2), (4, 0.6, 2), (4, 0.65, 3),
                          (5, 0.55, 3)]

    # the other readers: reporting views, the API's series, the experiment's best
    latest = conn.execute("SELECT latest_validation AS v FROM reporting.trials WHERE id = %s",
                          (trial,)).fetchone()["v"]
    assert latest == {"loss": 0.3}
    from det.queries.trials import metric_series
    series = metric_series(conn, trial, "validation", None)
    assert [(r["steps_completed"], r["values"]["loss"]) for r in series] == [(2, 0.5), (4, 0.3)]
    best = conn.execute("SELECT det_task.experiment_best_validation(%s) AS b", (t3,)).fetchone()
    assert best["b"] == 0.3


def test_a_run_starting_twice_keeps_its_own_rows(conn) -> None:
    """det_task.info called again by the same run (a gang's other workers, the compat path)
    supersedes nothing of that run's own reports."""
    job, trial = a_trial(conn)
    _, t1 = start_run(conn, job, trial, 1)
    report(conn, t1, [("training", 1, {"loss": 0.9}), ("validation", 1, {"loss": 0.4})])
    conn.execute("SELECT det_task.info(%s)", (t1,))
    rows = conn.execute("SELECT count(*) AS n FROM metrics WHERE superseded_by IS NULL"
                        ).fetchone()["n"]
    assert rows == 2
    assert conn.execute("SELECT best_validation AS b FROM trials WHERE id = %s",
                        (trial,)).fetchone()["b"] == 0.4


def test_migration_0032_supersedes_what_earlier_restarts_left(pg_server, tmp_path) -> None:
    """A database whose trial restarted twice before migration 0032 (three copies of steps
    3 and 4, the dead run's 0.1 its best) has one history once migrated."""
    import shutil
    import uuid

    from conftest import _admin, drop_database
    from psycopg.conninfo import make_conninfo
    from psycopg.rows import dict_row

    from det.db.migrate import migrate, migrations_dir

    before = tmp_path / "migrations"
    before.mkdir()
    for f in migrations_dir().iterdir():
        if f.name.endswith(".sql") and f.name < "0032":
            shutil.copyfile(str(f), before / f.name)
    name = f"det_test_{uuid.uuid4().hex[:12]}"
    with _admin(pg_server) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(pg_server, dbname=name)
    try:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            migrate(conn, before)
            job, trial = a_trial(conn)
            a1, t1 = start_run(conn, job, trial, 1)
            report(conn, t1, [("training", 2, {"loss": 0.8}), ("validation", 2, {"loss": 0.5})])
            checkpoint(conn, t1, 2)
            report(conn, t1, [("training", 3, {"loss": 0.7}), ("validation", 4, {"loss": 0.1})])
            kill(conn, a1)
            a2, t2 = start_run(conn, job, trial, 2)
            report(conn, t2, [("training", 3, {"loss": 0.75}), ("training", 5, {"loss": 0.5})])
            kill(conn, a2)
            _, t3 = start_run(conn, job, trial, 3)
            report(conn, t3, [("training", 3, {"loss": 0.7}), ("validation", 4, {"loss": 0.3})])
            assert conn.execute("SELECT best_validation AS b FROM trials").fetchone()["b"] == 0.1
            assert migrate(conn)[0] == 32
            rows = conn.execute(
                "SELECT m.steps_completed AS s, m.\"values\" ->> 'loss' AS loss, a.run, "
                "s.run AS superseded_by FROM metrics m JOIN allocations a "
                "ON a.id = m.allocation_id LEFT JOIN allocations s ON s.id = m.superseded_by "
                "ORDER BY m.id").fetchall()
            assert [(r["s"], r["loss"], r["run"], r["superseded_by"]) for r in rows] == [
                (2, "0.8", 1, None), (2, "0.5", 1, None), (3, "0.7", 1, 2), (4, "0.1", 1, 2),
                (3, "0.75", 2, 3), (5, "0.5", 2, 3), (3, "0.7", 3, None), (4, "0.3", 3, None)]
            assert conn.execute("SELECT best_validation AS b FROM trials").fetchone()["b"] == 0.3
    finally:
        drop_database(pg_server, url)
