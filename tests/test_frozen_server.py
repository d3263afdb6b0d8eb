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
