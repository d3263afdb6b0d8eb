"""Checkpoint GC during a run (issue 39, item 5): checkpoints that supersede each other are
collected while the experiment runs, by the experiment's policy (default: each trial's best
and latest), never the restart point of a live trial; pause and activate still resume."""

import pytest
from conftest import wait_for
from test_e2e_digits import DIGITS, digits_config


def _checkpoints(conn) -> list[dict]:
    return conn.execute("SELECT uuid::text, steps_completed, state FROM checkpoints "
                        "ORDER BY steps_completed").fetchall()


def _kept_beyond_policy(conn) -> list[int]:
    """Steps of COMPLETED checkpoints that are neither the trial's latest nor best: ones with
    no validation at their step (validations may tie for best; ties are all kept)."""
    return [r["steps_completed"] for r in conn.execute(
        "SELECT c.steps_completed FROM checkpoints c JOIN trials t ON t.id = c.trial_id "
        " WHERE c.state = 'COMPLETED' AND c.uuid <> t.latest_checkpoint "
        "   AND NOT EXISTS (SELECT 1 FROM metrics m WHERE m.trial_id = c.trial_id "
        "                     AND m.\"group\" = 'validation' "
        "                     AND m.steps_completed = c.steps_completed)")]


@pytest.mark.slow
def test_superseded_checkpoints_are_collected_while_the_trial_runs(det, conn, tmp_path) -> None:
    storage = tmp_path / "checkpoints"
    cfg = digits_config(tmp_path, **{
        "searcher.max_length": {"batches": 4000}, "min_validation_period": {"batches": 400},
        "min_checkpoint_period": {"batches": 100}, "scheduling_unit": 10,
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)}})
    # GC tasks batch 2 s of checkpoints here (30 s by default: a fast run could end first)
    det.start("reconciler", "reconcile", "--interval", "0.5", "--gc-batch", "2")
    det.start("agent", "agent", "run", "--slots", "1")
    det("experiment", "create", str(cfg), str(DIGITS))

    # While the first run still trains, superseded checkpoints are DELETED and their files gone.
    def collected_while_running() -> bool:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE c.state = 'DELETED') AS deleted, "
            "       bool_and(a.state = 'RUNNING') AS running "
            "  FROM checkpoints c, allocations a "
            " WHERE a.spec ->> 'kind' = 'trial' AND a.run = 1").fetchone()
        return row["deleted"] >= 3 and bool(row["running"])
    try:
        wait_for(collected_while_running, 240, "three checkpoints collected during the first run")
    except AssertionError as e:
        runs = conn.execute("SELECT id, spec ->> 'kind' AS kind, state, exit_code, exit_reason "
                            "FROM allocations ORDER BY id").fetchall()
        exp = conn.execute("SELECT state, checkpoint_gc_error FROM experiments").fetchall()
        raise AssertionError(f"{e}; runs {runs}; checkpoints {_checkpoints(conn)}; "
                             f"experiment {exp}") from e
    rows = _checkpoints(conn)
    for c in rows:
        if c["state"] == "DELETED":
            assert not (storage / c["uuid"]).exists(), f"files of DELETED {c['uuid']} remain"
    # best + latest, and at most the one the newest superseded, not yet looked at
    assert len(_kept_beyond_policy(conn)) <= 1, rows
    latest = conn.execute("SELECT latest_checkpoint::text AS u FROM trials").fetchone()["u"]
    assert (storage / latest).is_dir(), "the restart point's files are kept"

    det("experiment", "pause", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE state = 'PAUSED'").fetchone()
             and not conn.execute("SELECT 1 FROM allocations WHERE spec ->> 'kind' = 'trial' "
                                  "AND state <> 'TERMINATED'").fetchone(),
             120, "the trial to checkpoint and stop")
    paused = conn.execute("SELECT steps_completed, latest_checkpoint::text AS u FROM trials"
                          ).fetchone()
    # GC may still run while the trial is paused: never on its restart point.
    wait_for(lambda: not conn.execute("SELECT 1 FROM checkpoints WHERE state = 'DELETING'")
             .fetchone(), 60, "the GC task to finish")
    state = conn.execute("SELECT state FROM checkpoints WHERE uuid = %s",
                         (paused["u"],)).fetchone()["state"]
    assert state == "COMPLETED" and (storage / paused["u"]).is_dir()

    det("experiment", "activate", "1")
    assert det("experiment", "wait", "1", timeout=600).returncode == 0
    resumed = conn.execute(
        "SELECT min(m.steps_completed) AS first FROM metrics m "
        "JOIN allocations a ON a.id = m.allocation_id WHERE a.run = 2").fetchone()
    assert resumed["first"] > paused["steps_completed"], "the second run resumed, not restarted"
    wait_for(lambda: not conn.execute("SELECT 1 FROM checkpoints WHERE state = 'DELETING'")
             .fetchone(), 60, "the last GC task to finish")
    rows = _checkpoints(conn)
    kept = [c for c in rows if c["state"] == "COMPLETED"]
    assert kept[-1]["steps_completed"] == 4000 and _kept_beyond_policy(conn) == [], rows
    assert conn.execute("SELECT count(*) AS n FROM det_user.checkpoints_to_delete(1)"
                        ).fetchone()["n"] == 0
    on_disk = {c["uuid"] for c in rows if (storage / c["uuid"]).exists()}
    assert on_disk == {c["uuid"] for c in kept}, "only what is kept has files"
    gc_runs = conn.execute("SELECT count(*) AS n, count(*) FILTER (WHERE exit_code = 0) AS ok "
                           "FROM allocations WHERE spec ->> 'kind' = 'checkpoint_gc'").fetchone()
    sizes = conn.execute("SELECT sum(freed_bytes) AS freed, sum((SELECT sum(r.value::bigint) "
                         "FROM jsonb_each_text(resources) r)) FILTER (WHERE state = 'COMPLETED') "
                         "AS kept FROM checkpoints").fetchone()
    kept_mb, freed_mb = (float(sizes[k]) / 1e6 for k in ("kept", "freed"))
    print(f"\n{len(rows)} checkpoints over 4,000 batches, {len(kept)} kept ({kept_mb:.2f} MB), "
          f"{freed_mb:.2f} MB freed during the run and at its end, by {gc_runs['n']} GC tasks")
    assert gc_runs["n"] == gc_runs["ok"], "every GC task succeeded"
    # one GC task at a time, each removing what was marked while it waited and ran
    assert gc_runs["n"] < len(rows) - len(kept), "a GC task removes several checkpoints"
