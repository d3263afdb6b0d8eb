"""The harness inside a task and the CLI followers against a database that goes away
(issue 10, item 4): PostgreSQL restarts, lost commit acknowledgements, a task killed right
after a checkpoint. Every metric row arrives exactly once and in order; nothing reported
before a checkpoint is lost.
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from conftest import REPO, PrivateServer, wait_for
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.errors import DetError
from det.harness import core, report_writer, transport
from det.harness.report_writer import MetricsRow, ReportWriter, encode_metrics, json_safe
from det.harness.transport import DbTransport
from det.sql import named

CONFIG = {"name": "faults", "entrypoint": "true",
          "resources": {"slots_per_trial": 1, "resource_pool": "default", "weight": 1.0},
          "searcher": {"name": "single", "metric": "loss", "smaller_is_better": True,
                       "max_length": {"batches": 10**6}}}


@dataclass
class Allocation:
    """A trial allocation claimed as the agent claims it (``det_agent.claim`` gives the token)."""

    url: str
    id: int
    trial_id: int
    experiment_id: int
    token: str

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "DET_DB_URL": self.url, "DET_ALLOCATION_ID": str(self.id),
                "DET_ALLOCATION_TOKEN": self.token, "PYTHONUNBUFFERED": "1", **extra}


def claim_allocation(url: str, storage: Path) -> Allocation:
    """``storage``: the experiment's shared_fs checkpoint directory."""
    config = {**CONFIG, "checkpoint_storage": {"type": "shared_fs", "host_path": str(storage)}}
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        c.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                  (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
        eid = c.execute("SELECT det_user.create_experiment(%s, 'name: faults', NULL) AS id",
                        (Jsonb(config),)).fetchone()["id"]
        tid = c.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                        "VALUES (%s, gen_random_uuid(), '{}', 0) RETURNING id",
                        (eid,)).fetchone()["id"]
        c.execute("INSERT INTO searcher_ops (trial_id, length) VALUES (%s, 1000000)", (tid,))
        aid = c.execute(
            "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
            "state, agent_id) SELECT job_id, %s, 1, 'default', 1, '{}', 'ASSIGNED', 'a1' "
            "FROM experiments WHERE id = %s RETURNING id", (tid, eid)).fetchone()["id"]
        token = c.execute("SELECT det_agent.claim('a1', %s) AS t", (aid,)).fetchone()["t"]
    assert token
    return Allocation(url, aid, tid, eid, token)


def test_a_pass_holding_its_experiment_does_not_hold_up_its_tasks(db_url: str,
                                                                  tmp_path: Path) -> None:
    """While a pass holds the experiments it searches (until it commits), a task of one of
    them completes its op (a searcher event: a foreign-key check on the experiment and the
    trial) and reports validation metrics (a key-share lock on its allocation, and a searcher
    event too) without waiting."""
    alloc = claim_allocation(db_url, tmp_path)
    op_id = query(db_url, "SELECT id FROM searcher_ops WHERE trial_id = %s",
                  alloc.trial_id)[0]["id"]
    with psycopg.connect(db_url, row_factory=dict_row) as pass_conn:
        held = [r["id"] for r in pass_conn.execute(named("reconciler").experiments_to_search)]
        assert alloc.experiment_id in held
        with psycopg.connect(db_url, autocommit=True) as task:
            task.execute("SET lock_timeout = '2s'")
            task.execute("SELECT det_task.complete_op(%s, %s, 0.5)", (alloc.token, op_id))
            task.execute("SELECT det_task.report_metrics(%s, 'validation', 1, %s)",
                         (alloc.token, Jsonb({"loss": 0.5})))
        pass_conn.rollback()
    assert query(db_url, "SELECT kind FROM searcher_events WHERE trial_id = %s ORDER BY id",
                 alloc.trial_id) == [{"kind": "validation_completed"},
                                     {"kind": "validation_reported"}]


def query(url: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as c:
        return c.execute(sql, args).fetchall()


def training_steps(alloc: Allocation) -> list[int]:
    return [r["steps_completed"] for r in query(
        alloc.url, "SELECT steps_completed FROM metrics WHERE trial_id = %s "
        "AND \"group\" = 'training' ORDER BY id", alloc.trial_id)]


def checkpoints(alloc: Allocation) -> list[dict[str, Any]]:
    return query(alloc.url, "SELECT uuid::text AS uuid, steps_completed FROM checkpoints "
                 "WHERE trial_id = %s ORDER BY steps_completed", alloc.trial_id)


@dataclass
class CoreLoop:
    """A Core API training loop on a thread: one training metric per step (a step takes a
    couple of milliseconds), progress every 25 steps, a validation and a checkpoint whenever
    the test asks for one, until the platform asks it to stop (then a last checkpoint)."""

    alloc: Allocation
    step: int = 0
    reported: list[tuple[int, str]] = field(default_factory=list)
    checkpoint_wanted: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        transport = DbTransport(self.alloc.url, self.alloc.id, self.alloc.token)
        try:
            with core.init(transport=transport) as ctx:
                op = next(iter(ctx.searcher.operations()))
                while not ctx.preempt.should_preempt():
                    self.step += 1
                    ctx.train.report_training_metrics(self.step, {"step": self.step})
                    if self.step % 25 == 0:
                        op.report_progress(self.step)
                    if self.checkpoint_wanted.is_set():
                        self.checkpoint_wanted.clear()
                        self._checkpoint(ctx)
                    time.sleep(0.002)
                self._checkpoint(ctx)
        except BaseException as e:  # the test reports it
            self.error = e

    def _checkpoint(self, ctx: core.Context) -> None:
        ctx.train.report_validation_metrics(self.step, {"loss": 1 / self.step})
        with ctx.checkpoint.store_path({"steps_completed": self.step}) as (path, uuid):
            (path / "weights").write_text(str(self.step))
        self.reported.append((self.step, uuid))

    def checkpoint(self) -> None:
        """Ask for a checkpoint and wait until it is recorded in the database."""
        n = len(checkpoints(self.alloc))
        self.checkpoint_wanted.set()
        wait_for(lambda: self.error or len(checkpoints(self.alloc)) > n, 60,
                 "the requested checkpoint to be recorded")
        assert self.error is None, self.error

    def advance(self, steps: int) -> None:
        """Wait until the loop trained ``steps`` more steps (whether or not the database is
        there to take its reports)."""
        target = self.step + steps
        wait_for(lambda: self.error or self.step >= target, 60, f"the loop to reach {target}")
        assert self.error is None, self.error


def test_core_api_loop_trains_through_two_database_restarts(
    private_pg: PrivateServer, tmp_path: Path
) -> None:
    alloc = claim_allocation(private_pg.url, tmp_path / "ckpt")
    loop = CoreLoop(alloc)
    wait_for(lambda: len(training_steps(alloc)) >= 50, 60, "the first training rows")
    loop.checkpoint()

    private_pg.stop()
    loop.advance(50)  # training goes on while the database is away; the reports wait
    loop.checkpoint_wanted.set()  # this one blocks until the database is back
    private_pg.start()
    wait_for(lambda: loop.error or len(checkpoints(alloc)) == 2, 60, "the second checkpoint")

    loop.advance(50)
    private_pg.restart(down=1.0)  # while the loop runs freely
    loop.advance(50)
    loop.checkpoint()

    query(alloc.url, "UPDATE allocations SET desired_state = 'STOPPED' WHERE id = %s "
          "RETURNING pg_notify(det_internal.channel('alloc', %s), '')", alloc.id, str(alloc.id))
    loop.thread.join(60)
    assert not loop.thread.is_alive() and loop.error is None, loop.error

    assert training_steps(alloc) == list(range(1, loop.step + 1))
    validations = query(alloc.url, "SELECT steps_completed FROM metrics WHERE trial_id = %s "
                        "AND \"group\" = 'validation' ORDER BY id", alloc.trial_id)
    assert [r["steps_completed"] for r in validations] == [s for s, _ in loop.reported]
    assert [(c["steps_completed"], c["uuid"]) for c in checkpoints(alloc)] == loop.reported
    trial, = query(alloc.url, "SELECT latest_checkpoint::text AS c, steps_completed, "
                   "best_validation FROM trials WHERE id = %s", alloc.trial_id)
    assert (trial["c"], trial["steps_completed"]) == (loop.reported[-1][1], loop.step)
    assert trial["best_validation"] == pytest.approx(1 / loop.step)
    allocation, = query(alloc.url, "SELECT preempt_acked FROM allocations WHERE id = %s",
                        alloc.id)
    assert allocation["preempt_acked"]
    op, = query(alloc.url, "SELECT progress FROM searcher_ops WHERE trial_id = %s",
                alloc.trial_id)
    assert op["progress"] == loop.step // 25 * 25


KILLED_AFTER_CHECKPOINT = """
import os, signal, sys
from det.harness import core

n = int(sys.argv[1])
with core.init() as ctx:
    for i in range(1, n + 1):
        ctx.train.report_training_metrics(i, {"i": i})
    with ctx.checkpoint.store_path({"steps_completed": n}) as (path, uuid):
        (path / "weights").write_text("w")
    for i in range(n + 1, 2 * n + 1):
        ctx.train.report_training_metrics(i, {"i": i})
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_task_killed_right_after_a_checkpoint_loses_nothing_reported_before_it(
    db_url: str, tmp_path: Path
) -> None:
    alloc = claim_allocation(db_url, tmp_path / "ckpt")
    script = tmp_path / "task.py"
    script.write_text(KILLED_AFTER_CHECKPOINT)
    n = 3000
    r = subprocess.run([sys.executable, str(script), str(n)],
                       env=alloc.env(), cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert [c["steps_completed"] for c in checkpoints(alloc)] == [n]
    steps = training_steps(alloc)
    # Everything before the checkpoint; of what came after, an unbroken prefix at most.
    assert steps == list(range(1, len(steps) + 1)) and n <= len(steps) <= 2 * n


def test_each_record_waits_for_the_metrics_reported_before_it(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alloc = claim_allocation(db_url, tmp_path)
    write = DbTransport._write_reports

    def slow_database(self: DbTransport, *args: Any) -> None:
        time.sleep(0.2)
        write(self, *args)

    monkeypatch.setattr(DbTransport, "_write_reports", slow_database)
    with core.init(transport=DbTransport(alloc.url, alloc.id, alloc.token)) as ctx:
        op = next(iter(ctx.searcher.operations()))
        ctx.train.report_training_metrics(1, {"loss": 1.0})
        with ctx.checkpoint.store_path({"steps_completed": 1}):
            pass
        assert training_steps(alloc) == [1]
        ctx.train.report_validation_metrics(2, {"loss": 0.5})
        assert ctx.train.get_experiment_best_validation() == 0.5
        ctx.train.report_training_metrics(3, {"loss": 0.25})
        op.report_completed(0.25)
        assert training_steps(alloc) == [1, 3]
        ctx.train.report_training_metrics(4, {"loss": 0.1})
        ctx.preempt.acknowledge_preemption_signal()
        assert training_steps(alloc) == [1, 3, 4]
        ctx.train.report_training_metrics(5, {"loss": 0.1})
        ctx.train.report_early_exit(core.EarlyExitReason.USER_REQUESTED_STOP)
        assert training_steps(alloc) == [1, 3, 4, 5]
        ctx.train.report_training_metrics(6, {"loss": 0.1})
    assert training_steps(alloc) == [1, 3, 4, 5, 6]


def lose_first_ack(monkeypatch: pytest.MonkeyPatch, function: str) -> list[int]:
    """Make the first statement calling ``function`` commit and then lose its answer, as when
    the server goes away between the commit and the reply; returns a list that counts the
    answers lost."""
    real = psycopg.Connection.execute
    lost: list[int] = []

    def execute(self: psycopg.Connection, q: Any, *args: Any, **kwargs: Any) -> Any:
        cur = real(self, q, *args, **kwargs)
        if isinstance(q, str) and function in q and not lost:
            lost.append(1)
            self.close()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return cur

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    return lost


@pytest.mark.parametrize("function",
                         ["det_task.report_metrics_batch", "det_task.report_checkpoint"])
def test_a_report_resent_after_a_lost_acknowledgement_is_recorded_once(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str
) -> None:
    alloc = claim_allocation(db_url, tmp_path)
    lost = lose_first_ack(monkeypatch, function)
    with core.init(transport=DbTransport(alloc.url, alloc.id, alloc.token)) as ctx:
        for i in (1, 2, 3):
            ctx.train.report_training_metrics(i, {"i": i})
        with ctx.checkpoint.store_path({"steps_completed": 3}) as (path, uuid):
            (path / "weights").write_text("w")
    assert lost == [1]
    assert training_steps(alloc) == [1, 2, 3]
    assert checkpoints(alloc) == [{"uuid": uuid, "steps_completed": 3}]


# The buffer alone (no database).

def rows(n: int, start: int = 1) -> list[MetricsRow]:
    return [encode_metrics("training", i, {"i": i}) for i in range(start, start + n)]


def test_reports_block_when_the_buffer_is_full_and_are_all_written_in_order() -> None:
    written: list[tuple[int, list[int], dict[int, float]]] = []
    release = threading.Event()

    def write(seq: int, batch: list[MetricsRow], progress: dict[int, float]) -> None:
        release.wait()
        written.append((seq, [r.steps_completed for r in batch], progress))

    one = rows(1)[0].size
    writer = ReportWriter(write, max_bytes=5 * one, batch_rows=4)
    done: list[int] = []

    def produce() -> None:
        for r in rows(20):
            writer.put_metrics(r)
            done.append(r.steps_completed)
        writer.put_progress(7, 20.0)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    # The buffer counts the batch being written too: five rows fit, the sixth waits.
    wait_for(lambda: len(done) == 5, 30, "the buffer to fill")
    producer.join(0.2)
    assert producer.is_alive() and len(done) == 5, "a full buffer holds the reporter back"
    release.set()
    producer.join(30)
    writer.close()
    assert [s for _, steps, _ in written for s in steps] == list(range(1, 21))
    assert [seq for seq, _, _ in written] == sorted({seq for seq, _, _ in written})
    assert written[-1][2] == {7: 20.0}


def test_a_failed_write_is_raised_to_the_reporter() -> None:
    def write(seq: int, batch: list[MetricsRow], progress: dict[int, float]) -> None:
        raise psycopg.errors.InvalidAuthorizationSpecification("invalid or expired token")

    writer = ReportWriter(write)
    writer.put_metrics(rows(1)[0])
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        writer.flush()
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        writer.put_metrics(rows(1, 2)[0])
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        writer.close()


@pytest.mark.parametrize(("group", "steps", "metrics", "expected"), [
    ("training", -1, {"x": 1}, "steps_completed"),
    ("training", 1, {"x": "a\x00b"}, "NUL"),
    ("training", 1, {"x": "\ud800"}, "UTF-8"),
    ("training", 1, {"x": object()}, "JSON"),
])
def test_unstorable_metrics_are_refused_when_reported(
    group: str, steps: int, metrics: dict[str, Any], expected: str
) -> None:
    with pytest.raises(DetError, match=expected):
        encode_metrics(group, steps, metrics)


@pytest.mark.parametrize("metrics", [
    {"loss": 0.25, "n": 3, "ok": True, "none": None, "s": "é\\u0000"},
    {"f32": np.float32(0.1), "f64": np.float64(0.1), "i": np.int64(-7),
     "arr": np.array([np.float32(0.1), 2.5], dtype=np.float32)},
    {"big": 2**70, "f32": np.float32(0.1), "f64": np.float64(1e300), "arr": np.eye(2)},
    {"nan": float("nan"), "list": [1.5, float("-inf")], "tuple": (1, "x")},
    {1: 2, "nested": {"deep": {"x": np.int64(-7)}}},
], ids=["plain", "numpy-fast", "numpy", "non-finite", "non-string-keys"])
def test_fast_and_standard_encodings_agree(metrics: dict[Any, Any], monkeypatch) -> None:
    """orjson encodes a report where it can; what it writes decodes to what ``json_safe`` and
    the standard encoder give, and where it cannot (NaN, keys, big integers) they are used,
    as they are where orjson is not installed (a task image made before det needed it)."""
    torch = pytest.importorskip("torch")
    metrics = {**metrics, "tensor": torch.tensor([0.5, 2.0]), "scalar": torch.tensor(3)}
    row = encode_metrics("training", 1, metrics)
    assert json.loads(row.values) == json.loads(json.dumps(json_safe(metrics)))
    # a NaN beside them sends the whole report down the standard path: the others are stored
    # as they would be without it
    slow = json.loads(encode_metrics("training", 1, {**metrics, "NaN too": math.nan}).values)
    assert slow.pop("NaN too") == "NaN"
    assert slow == json.loads(row.values)

    monkeypatch.setattr(report_writer, "orjson", None)
    assert json.loads(encode_metrics("training", 1, metrics).values) == json.loads(row.values)


def test_metric_values_are_stored_as_reported(db_url: str, tmp_path: Path) -> None:
    """Whatever the encoding on the way (json_safe's fast paths, the binary array parameter),
    the database holds the reported values: escapes, non-ASCII, non-finite floats, numpy."""
    alloc = claim_allocation(db_url, tmp_path)
    reported = {"quote": 'a"b', "backslash": "c\\d", "braces": "{x,y}", "unicode": "é ☃",
                "nan": float("nan"), "inf": float("inf"), "ninf": -float("inf"),
                "nested": {1: (1, 2.5, None, True)}, "f32": np.float32(1.5),
                "array": np.arange(3), "big": 2**62, "huge": 2**70}
    stored = {"quote": 'a"b', "backslash": "c\\d", "braces": "{x,y}", "unicode": "é ☃",
              "nan": "NaN", "inf": "Infinity", "ninf": "-Infinity",
              "nested": {"1": [1, 2.5, None, True]}, "f32": 1.5, "array": [0, 1, 2],
              "big": 2**62, "huge": 2**70}
    with core.init(transport=DbTransport(alloc.url, alloc.id, alloc.token)) as ctx:
        ctx.train.report_training_metrics(1, reported)
        ctx.train.report_metrics('my "group"', 2, {"x": 1})
    rows = query(alloc.url, 'SELECT "group", steps_completed, "values" FROM metrics '
                 "WHERE trial_id = %s ORDER BY id", alloc.trial_id)
    assert rows == [{"group": "training", "steps_completed": 1, "values": stored},
                    {"group": 'my "group"', "steps_completed": 2, "values": {"x": 1}}]


# The CLI followers.

def start_cli(tmp_path: Path, url: str, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.out"
    env = {**os.environ, "DET_DB_URL": url, "DET_HOME": str(tmp_path / "home"),
           "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as f, (tmp_path / f"{name}.err").open("wb") as err:
        p = subprocess.Popen([sys.executable, "-m", "det.cli.main", *args], cwd=REPO, env=env,
                             stdout=f, stderr=err)
    return p, out


@pytest.fixture
def stop_procs() -> Iterator[Callable[[subprocess.Popen], subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield lambda p: procs.append(p) or p
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_wait_and_log_followers_ride_out_a_database_restart(
    private_pg: PrivateServer, tmp_path: Path, stop_procs: Callable
) -> None:
    alloc = claim_allocation(private_pg.url, tmp_path / "ckpt")
    url = alloc.url

    def log(*lines: str) -> None:
        query(url, "SELECT det_agent.append_logs(%s, %s, %s)", alloc.id, ["stdout"] * len(lines),
              list(lines))

    log("line 1", "line 2", "line 3")
    waiter, _ = start_cli(tmp_path, url, "wait", "experiment", "wait",
                          str(alloc.experiment_id), "--interval", "0.2")
    follower, out = start_cli(tmp_path, url, "logs", "trial", "logs", "-f",
                              str(alloc.trial_id))
    stop_procs(waiter), stop_procs(follower)
    wait_for(lambda: out.read_text().count("line") == 3, 60, "the follower's first lines")
    wait_for(lambda: query(url, "SELECT 1 FROM pg_stat_activity WHERE query LIKE "
                           "'SELECT state::text AS state FROM experiments%%'"), 60,
             "det experiment wait to poll")

    private_pg.restart(down=1.0)
    log("line 4", "line 5")
    log("line 6")
    query(url, "UPDATE trials SET state = 'COMPLETED', end_time = now() WHERE id = %s "
          "RETURNING id", alloc.trial_id)
    query(url, "UPDATE experiments SET state = 'COMPLETED', end_time = now() WHERE id = %s "
          "RETURNING id", alloc.experiment_id)

    assert waiter.wait(60) == 0, (tmp_path / "wait.err").read_text()
    assert f"Experiment {alloc.experiment_id}: COMPLETED" in (tmp_path / "wait.out").read_text()
    assert follower.wait(60) == 0, (tmp_path / "logs.err").read_text()
    # each after its run and rank (a one-slot trial's untagged lines are rank 0; issue 34)
    assert out.read_text().splitlines() == [f"[run 1] [rank=0] line {i}" for i in range(1, 7)]


def test_close_wakes_the_preemption_watcher_instead_of_waiting_out_its_poll(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watcher waits a minute for a NOTIFY; close() joins it for one second only, so
    # only a wake-up ends it in time (every task exit used to wait out a slice).
    monkeypatch.setattr(transport, "PREEMPT_POLL_SECONDS", 60.0)
    alloc = claim_allocation(db_url, tmp_path / "ckpt")
    t = DbTransport(db_url, alloc.id, alloc.token)
    wait_for(lambda: query(db_url, "SELECT 1 FROM pg_stat_activity WHERE state = 'idle' "
                                   "AND query LIKE 'SELECT det_task.should_preempt%%'"),
             10, "the watcher waiting for a NOTIFY", interval=0.02)
    monkeypatch.setattr(transport, "PREEMPT_POLL_SECONDS", 1.0)
    t.close()
    assert not t._watcher.is_alive()
