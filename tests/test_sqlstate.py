"""Database errors become det's error types, with messages a user can act on."""

import psycopg
import pytest

from det.db.sqlstate import translate
from det.errors import DatabaseError, NotFoundError, StateError


def _error(conn, sql: str, *args) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, args)
    return info.value


def test_missing_object_is_not_found(conn) -> None:
    e = translate(_error(conn, "SELECT det_user.experiment_action(42, 'pause')"))
    assert isinstance(e, NotFoundError) and str(e) == "experiment 42 not found"


def test_illegal_transition_is_a_state_error(conn) -> None:
    conn.execute("INSERT INTO jobs (type, resource_pool, queue_position, owner) "
                 "VALUES ('EXPERIMENT', 'default', 1, 'me')")
    conn.execute("INSERT INTO experiments (job_id, name, config, original_config, owner, state, "
                 "end_time) VALUES (1, 'x', '{}', '', 'me', 'COMPLETED', now())")
    e = translate(_error(conn, "UPDATE experiments SET state = 'ACTIVE', end_time = NULL"))
    assert isinstance(e, StateError) and "illegal state change COMPLETED -> ACTIVE" in str(e)


def test_a_lost_connection_says_the_database_is_unavailable(db_url) -> None:
    c = psycopg.connect(db_url, autocommit=True)
    pid = c.info.backend_pid
    with psycopg.connect(db_url, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))
    e = translate(_error(c, "SELECT 1"))
    assert isinstance(e, DatabaseError) and str(e).startswith("the database is unavailable")


def test_early_exit_reasons_are_one_vocabulary(conn) -> None:
    from det.reasons import EarlyExitReason

    labels = conn.execute("SELECT enum_range(NULL::early_exit_reason)::text[] AS l").fetchone()
    assert labels["l"] == [r.value for r in EarlyExitReason]


@pytest.mark.parametrize("agent_id", ["a" * 64, "", "-x", "has space", "semi;colon"])
def test_agent_ids_are_bounded_and_plain(conn, agent_id) -> None:
    e = translate(_error(conn, "SELECT det_agent.register(%s, 'h', 'default', 'process', "
                               "'[]'::jsonb)", agent_id))
    assert str(e).startswith("agent id: expected 1 to 63 letters")
    assert conn.execute("SELECT count(*) AS n FROM agents").fetchone()["n"] == 0


@pytest.mark.parametrize("weight", ["NaN", "Infinity", "-Infinity", "0", "1e7"])
def test_a_job_weight_is_finite_and_positive(conn, weight) -> None:
    conn.execute("INSERT INTO jobs (type, resource_pool, queue_position, owner) "
                 "VALUES ('EXPERIMENT', 'default', 1, 'me')")
    e = translate(_error(conn, "UPDATE jobs SET weight = %s::double precision", weight))
    assert str(e) == "weight: expected a finite number > 0 and at most 1e6"
