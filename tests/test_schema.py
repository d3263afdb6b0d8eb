"""Rules that live in schema.sql: migrations, invariants, transitions, token checks."""

import psycopg
import pytest
from psycopg.types.json import Jsonb

from det.db import migrate
from det.db.migrate import load_migrations

CONFIG = {"name": "x", "entrypoint": "true",
          "resources": {"slots_per_trial": 1, "resource_pool": "default", "weight": 1.0},
          "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}}}


def test_migrations_are_idempotent_and_recorded(conn) -> None:
    assert migrate(conn) == []
    versions = [r["version"] for r in conn.execute("SELECT version FROM det_migrations")]
    assert versions == [m.version for m in load_migrations()]


def test_reporting_views_answer(conn) -> None:
    for view in ("experiments", "trials", "job_queue", "slot_usage", "checkpoints"):
        conn.execute(f"SELECT * FROM reporting.{view}").fetchall()


def make_experiment(conn) -> int:
    return conn.execute("SELECT det_user.create_experiment(%s, 'name: x', NULL) AS id",
                        (Jsonb(CONFIG),)).fetchone()["id"]


def test_unknown_pool_writes_nothing(conn) -> None:
    bad = {**CONFIG, "resources": {**CONFIG["resources"], "resource_pool": "nope"}}
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match='no resource pool named "nope"'):
        conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (Jsonb(bad),))
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == 0


def test_terminal_states_are_final(conn) -> None:
    eid = make_experiment(conn)
    conn.execute("UPDATE experiments SET state = 'STOPPING_KILLED' WHERE id = %s", (eid,))
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal state change"):
        conn.execute("UPDATE experiments SET state = 'STOPPING_CANCELED' WHERE id = %s", (eid,))
    conn.execute("UPDATE experiments SET state = 'CANCELED', end_time = now() WHERE id = %s",
                 (eid,))
    with pytest.raises(psycopg.errors.CheckViolation, match="illegal state change"):
        conn.execute("UPDATE experiments SET state = 'ACTIVE', end_time = NULL WHERE id = %s",
                     (eid,))
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot pause"):
        conn.execute("SELECT det_user.experiment_action(%s, 'pause')", (eid,))


def setup_run(conn) -> tuple[int, int]:
    """An agent with one slot and two trial allocations of one experiment."""
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    eid = make_experiment(conn)
    ids = []
    for _ in (1, 2):
        conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                     "VALUES (%s, gen_random_uuid(), '{}', 0)", (eid,))
        ids.append(conn.execute(
            "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec) "
            "SELECT e.job_id, max(t.id), 1, 'default', 1, '{}' FROM experiments e "
            "JOIN trials t ON t.experiment_id = e.id WHERE e.id = %s GROUP BY e.job_id "
            "RETURNING id", (eid,)).fetchone()["id"])
    return ids[0], ids[1]


def test_a_slot_has_one_live_holder(conn) -> None:
    a, b = setup_run(conn)
    conn.execute("INSERT INTO allocation_slots (allocation_id, agent_id, slot_id) "
                 "VALUES (%s, 'a1', 0)", (a,))
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("INSERT INTO allocation_slots (allocation_id, agent_id, slot_id) "
                     "VALUES (%s, 'a1', 0)", (b,))
    conn.execute("UPDATE allocations SET state = 'ASSIGNED', agent_id = 'a1' WHERE id = %s", (a,))
    conn.execute("SELECT det_agent.report('a1', %s, 'TERMINATED', 0, NULL)", (a,))
    # released with the run's end, the slot can be held again
    conn.execute("INSERT INTO allocation_slots (allocation_id, agent_id, slot_id) "
                 "VALUES (%s, 'a1', 0)", (b,))


def test_observed_state_only_moves_forward(conn) -> None:
    a, _ = setup_run(conn)
    conn.execute("UPDATE allocations SET state = 'RUNNING', agent_id = 'a1' WHERE id = %s", (a,))
    with pytest.raises(psycopg.errors.CheckViolation, match="RUNNING -> ASSIGNED"):
        conn.execute("UPDATE allocations SET state = 'ASSIGNED' WHERE id = %s", (a,))


METRIC = ("INSERT INTO metrics (trial_id, allocation_id, \"group\", steps_completed, \"values\") "
          "VALUES (%s, %s, 'training', 1, '{}')")


def trial_of(conn, allocation: int) -> int:
    return conn.execute("SELECT trial_id FROM allocations WHERE id = %s",
                        (allocation,)).fetchone()["trial_id"]


def test_metrics_name_an_allocation_of_their_trial(conn) -> None:
    """metrics' references (checked per statement, migration 0020) refuse what the two
    foreign keys refused, and a row whose trial is not its allocation's."""
    a, b = setup_run(conn)
    ta, tb = trial_of(conn, a), trial_of(conn, b)
    for trial, allocation in ((ta, 999_999), (999_999, a), (tb, a)):
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="does not exist"):
            conn.execute(METRIC, (trial, allocation))
    with pytest.raises(psycopg.errors.ForeignKeyViolation):  # one bad row spoils the statement
        conn.execute("INSERT INTO metrics (trial_id, allocation_id, \"group\", steps_completed, "
                     "\"values\") VALUES (%s, %s, 'training', 1, '{}'), "
                     "(%s, %s, 'training', 1, '{}')", (ta, a, ta, b))
    assert conn.execute("SELECT count(*) AS n FROM metrics").fetchone()["n"] == 0
    conn.execute(METRIC, (ta, a))
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="does not exist"):
        conn.execute("UPDATE metrics SET allocation_id = %s", (b,))

    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still named by metrics"):
        conn.execute("DELETE FROM allocations WHERE id = %s", (a,))
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still named by metrics"):
        conn.execute("UPDATE allocations SET trial_id = %s WHERE id = %s", (tb, a))
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="allocations_trial_id_fkey"):
        conn.execute("DELETE FROM trials WHERE id = %s", (ta,))  # its allocation holds it
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="truncated while metrics"):
        conn.execute("TRUNCATE allocations CASCADE")
    conn.execute("DELETE FROM allocations WHERE id = %s", (b,))  # b has no metrics
    conn.execute("DELETE FROM metrics")
    conn.execute("DELETE FROM allocations WHERE id = %s", (a,))


def test_a_metrics_insert_and_its_allocation_delete_exclude_each_other(db_url, conn) -> None:
    """As a foreign key does, the check locks the allocation until commit: a delete waits for
    an uncommitted insert (then fails), and an insert waits for an uncommitted delete (then
    fails); no metrics row is ever left naming a deleted allocation."""
    a, _ = setup_run(conn)
    ta = trial_of(conn, a)
    with psycopg.connect(db_url) as inserter, psycopg.connect(db_url) as deleter:
        inserter.execute(METRIC, (ta, a))
        deleter.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            deleter.execute("DELETE FROM allocations WHERE id = %s", (a,))
        deleter.rollback()
        inserter.commit()
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            deleter.execute("DELETE FROM allocations WHERE id = %s", (a,))
        deleter.rollback()

        deleter.execute("DELETE FROM metrics")
        deleter.execute("DELETE FROM allocations WHERE id = %s", (a,))
        inserter.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            inserter.execute(METRIC, (ta, a))
        inserter.rollback()
        deleter.commit()
        with pytest.raises(psycopg.errors.ForeignKeyViolation, match="does not exist"):
            inserter.execute(METRIC, (ta, a))
    assert conn.execute("SELECT count(*) AS n FROM metrics").fetchone()["n"] == 0


def test_task_functions_need_the_allocation_token(conn) -> None:
    a, _ = setup_run(conn)
    conn.execute("UPDATE allocations SET state = 'ASSIGNED', agent_id = 'a1' WHERE id = %s", (a,))
    assert conn.execute("SELECT det_agent.claim('other', %s) AS t", (a,)).fetchone()["t"] is None
    token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (a,)).fetchone()["t"]
    info = conn.execute("SELECT det_task.info(%s) AS i", (token,)).fetchone()["i"]
    assert info["allocation_id"] == a and info["config"]["name"] == "x"
    stored = conn.execute("SELECT token_hash FROM allocations WHERE id = %s", (a,)).fetchone()
    assert token.encode() not in bytes(stored["token_hash"]), "only a hash is stored"
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        conn.execute("SELECT det_task.report_metrics('forged', 'training', 1, '{}')")
    conn.execute("SELECT det_agent.report('a1', %s, 'TERMINATED', 0, NULL)", (a,))
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        conn.execute("SELECT det_task.should_preempt(%s)", (token,))


def test_submission_takes_only_an_expanded_config(conn) -> None:
    """Defaults are filled once, by det.configs; SQL supplies none (issue 10)."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="expanded config"):
        conn.execute("SELECT det_user.create_experiment(%s, '', NULL)",
                     (Jsonb({"name": "x", "resources": {}}),))
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == 0
