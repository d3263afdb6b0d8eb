"""A control plane that survives losing its database server (issue 35), on one plain database:
a write whose commit acknowledgement was lost (a failover) is retried without being written
twice (task log lines: det_agent.append_logs, keyed by the shipper's uuid and each line's number),
a replica answering a write (SQLSTATE 25006) sends the retry layer to a new connection, and
the task pooler refuses a URL of several hosts (PgBouncer cannot fail over between them)."""

import uuid

import psycopg
import pytest
from test_harness_db_faults import claim_allocation

from det.agent import pooler
from det.agent.logs import LogShipper
from det.db import retry
from det.db.reconnect import Reconnecting
from det.errors import DetError


def stored(url: str, alloc: int) -> list[str]:
    with psycopg.connect(url) as c:
        return [r[0] for r in c.execute(
            "SELECT line FROM task_logs WHERE allocation_id = %s ORDER BY id", (alloc,))]


def test_a_log_batch_sent_again_is_written_once(db_url: str, tmp_path) -> None:
    alloc = claim_allocation(db_url, tmp_path).id
    writer, other = uuid.uuid4(), uuid.uuid4()
    append = ("SELECT det_agent.append_logs(%s, %s, %s, NULL, %s, %s::bigint[])")
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(append, (alloc, ["stdout"] * 2, ["a", "b"], writer, [1, 2]))
        c.execute(append, (alloc, ["stdout"] * 2, ["a", "b"], writer, [1, 2]))  # replayed
        # the retry of a batch that grew meanwhile: only its new line is written
        c.execute(append, (alloc, ["stdout"] * 3, ["a", "b", "c"], writer, [1, 2, 3]))
        c.execute(append, (alloc, ["stdout"], ["x"], other, [1]))  # another shipper's 1
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_seqs"):
            c.execute(append, (alloc, ["stdout"] * 2, ["d", "e"], writer, [5, 4]))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_seqs"):
            c.execute(append, (alloc, ["stdout"] * 2, ["d", "e"], writer, [4]))
    assert stored(db_url, alloc) == ["a", "b", "c", "x"]


def test_the_shipper_resends_a_batch_whose_acknowledgement_was_lost(db_url: str, tmp_path,
                                                                     monkeypatch) -> None:
    """Injected: the first write commits, then its connection is lost before the answer
    (what a failover right after the commit looks like to the client)."""
    alloc = claim_allocation(db_url, tmp_path).id
    shipper = LogShipper(db_url)
    real_write = LogShipper._write
    lost: list[int] = []

    def write_then_lose_the_answer(self, a, lines):
        real_write(self, a, lines)
        if not lost:
            lost.append(len(lines))
            self._conn.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(LogShipper, "_write", write_then_lose_the_answer)
    try:
        shipper.add(alloc, "stdout", "one")
        shipper.add(alloc, "stdout", "two")
        with pytest.raises(psycopg.OperationalError):
            shipper.flush()
        shipper.add(alloc, "stdout", "three")
        shipper.flush()
    finally:
        shipper.close()
    assert lost == [2]
    assert stored(db_url, alloc) == ["one", "two", "three"]


def test_a_write_refused_by_a_replica_is_retried_on_a_new_connection(db_url: str) -> None:
    """Injected: the first connection is read-only, as a demoted primary or a replica
    reached first would be (SQLSTATE 25006)."""
    opened: list[psycopg.Connection] = []

    def on_connect(c: psycopg.Connection) -> None:
        if not opened:
            c.execute("SET default_transaction_read_only = on")
        opened.append(c)

    def write(c: psycopg.Connection) -> int:
        c.execute("CREATE TABLE written_once (x int)")
        return c.execute("SELECT count(*) FROM written_once").fetchone()[0]

    with Reconnecting(db_url, on_connect=on_connect) as db:
        assert db.run("a write", write) == 0
    assert len(opened) == 2
    assert retry.is_connection_lost(psycopg.errors.ReadOnlySqlTransaction("read-only"))


def test_the_task_pooler_refuses_several_hosts(tmp_path) -> None:
    with pytest.raises(DetError, match="several hosts"):
        pooler.config("host=a,b port=5432,5433 user=det_task dbname=det", tmp_path, 4)


def test_lines_of_an_allocation_that_is_gone_do_not_stop_the_shipper(db_url: str,
                                                                       tmp_path) -> None:
    """A run whose rows were deleted (its experiment deleted) while its last lines waited: they
    are dropped, and the lines of the agent's other runs are still written (log_batches'
    foreign key failed the whole flush, and the shipping thread stopped on it)."""
    alloc = claim_allocation(db_url, tmp_path).id
    with psycopg.connect(db_url) as c:
        gone = c.execute("SELECT max(id) + 1000 FROM allocations").fetchone()[0]
    shipper = LogShipper(db_url)
    try:
        shipper.add(gone, "stdout", "lost")
        shipper.add(alloc, "stdout", "kept")
        shipper.flush()
        shipper.add(alloc, "stdout", "later")
        shipper.flush()
    finally:
        shipper.close()
    assert stored(db_url, alloc) == ["kept", "later"]
    assert stored(db_url, gone) == []
