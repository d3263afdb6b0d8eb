"""A frozen database server costs a reconnect, not a hang (issue 35): a call the server never
answers (its backend SIGSTOPped here: the kernel still acknowledges, so TCP sees nothing) fails
after the connection's deadline as a lost connection, and the retry layer carries on on a new
connection. The HA case (the whole primary frozen for 60 s) is tests/test_ha_failover.py."""

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg_pool
import pytest

from det.db import reconnect, retry
from det.db.reconnect import NoAnswer, Reconnecting, open_async_connection, open_connection

DEADLINE = 1.0


@contextmanager
def frozen(pid: int) -> Iterator[None]:
    """The server process ``pid`` stopped (SIGSTOP) inside the block."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def backend(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def test_an_unanswered_call_fails_at_the_deadline_and_the_retry_layer_reconnects(
        db_url: str) -> None:
    with open_connection(db_url, deadline=DEADLINE) as conn, frozen(backend(conn)):
        start = time.monotonic()
        with pytest.raises(NoAnswer, match=r"no answer .* in 1 s") as err:
            conn.execute("SELECT 1")
        assert DEADLINE <= time.monotonic() - start < DEADLINE + 1.5
        assert conn.closed and retry.is_connection_lost(err.value)

    with Reconnecting(db_url, deadline=DEADLINE) as session:
        first = session.run("test", backend)
        with frozen(first):
            start = time.monotonic()
            second = session.run("test", backend)
            took = time.monotonic() - start
        assert second != first
        assert took < DEADLINE + retry.BACKOFF_MAX, took


def test_long_legitimate_waits_keep_their_own_bounds(db_url: str) -> None:
    with open_connection(db_url, deadline=0.3) as conn, pytest.raises(NoAnswer):
        conn.execute("SELECT pg_sleep(1)")
    with open_connection(db_url, deadline=0.3) as conn:
        with reconnect.patience(conn, 5.0):
            conn.execute("SELECT pg_sleep(1)")
        assert conn.deadline == 0.3
        conn.execute("LISTEN nothing_comes")
        # psycopg's own timed wait is not cut by the deadline
        assert list(conn.notifies(timeout=1.0)) == []
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_det_serves_listener_connection_is_bounded_too(db_url: str) -> None:
    async def call_frozen() -> None:
        conn = await open_async_connection(db_url)
        assert conn.deadline == reconnect.CALL_DEADLINE_SECONDS
        conn.deadline = DEADLINE
        pid = (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]
        with frozen(pid), pytest.raises(NoAnswer):
            await conn.execute("SELECT 1")
        await conn.close()

    asyncio.run(call_frozen())


def test_a_host_that_left_a_call_unanswered_is_tried_last_and_briefly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reconnect, "_unanswered", {("db1", "5432"): time.monotonic()})
    params = psycopg.conninfo.conninfo_to_dict(
        reconnect._conninfo("host=db1,db2,db3 dbname=det", {}))
    assert (params["host"], params["target_session_attrs"], params["connect_timeout"]) == (
        "db2,db3,db1", "read-write", str(reconnect.UNANSWERED_CONNECT_TIMEOUT_SECONDS))
    params = psycopg.conninfo.conninfo_to_dict(
        reconnect._conninfo("host=db1,db2 port=5432,5433 dbname=det", {}))
    assert (params["host"], params["port"]) == ("db2,db1", "5433,5432")
    # forgotten after a while; a single host is never reordered
    monkeypatch.setattr(reconnect, "_unanswered", {
        ("db1", "5432"): time.monotonic() - reconnect.UNANSWERED_MEMORY_SECONDS - 1})
    params = psycopg.conninfo.conninfo_to_dict(reconnect._conninfo("host=db1,db2", {}))
    assert (params["host"], params["connect_timeout"]) == (
        "db1,db2", str(reconnect.CONNECT_TIMEOUT_SECONDS))


def twice(url: str) -> str:
    """``url`` naming its one server twice: a replicated cluster's URL to det."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    host, port = params["host"], str(params.get("port", "5432"))
    return psycopg.conninfo.make_conninfo(**{**params, "host": f"{host},{host}",
                                             "port": f"{port},{port}"})


def test_a_deposed_primary_answers_no_connection_of_a_replicated_url(
        private_pg, monkeypatch: pytest.MonkeyPatch) -> None:
    """A primary frozen past a failover says read-write when it wakes, until Patroni demotes
    it; a connection that waited out the freeze was answered from its old state (det serve
    answered a completed experiment ACTIVE). Here a deposed primary is a server whose
    synchronous replica is gone (``synchronous_standby_names`` no replica answers to): on a
    URL of several hosts no connection, new or pooled, is handed out before its commit has
    reached the replica; a one-server URL is not confirmed."""
    monkeypatch.setattr(reconnect, "CALL_DEADLINE_SECONDS", DEADLINE)
    url = twice(private_pg.url)
    with open_connection(url, deadline=DEADLINE) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with open_connection(url, autocommit=False, deadline=DEADLINE) as conn:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    pool = reconnect.open_pool(url, min_size=1, max_size=2)
    try:
        with pool.connection(timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with psycopg.connect(private_pg.url, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'replica_gone'")
            admin.execute("SELECT pg_reload_conf()")
            try:
                time.sleep(0.5)  # the reload reaches the backends
                with pytest.raises(NoAnswer):
                    open_connection(url, deadline=DEADLINE)
                with pytest.raises(psycopg_pool.PoolTimeout), pool.connection(timeout=3):
                    pass
                with open_connection(private_pg.url, deadline=DEADLINE) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
            finally:
                admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
                admin.execute("SELECT pg_reload_conf()")
        with pool.connection(timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()
