"""The reconciler and agent as real processes on a real database, with shell entrypoints
(the harness's own end-to-end tests are in test_e2e_digits.py)."""

import os
import signal
from pathlib import Path

import pytest
from conftest import wait_for


def config(tmp_path: Path, entrypoint: str, **extra: str) -> Path:
    p = tmp_path / "exp.yaml"
    lines = ["name: shell", f"entrypoint: {entrypoint!r}",
             "searcher: {name: single, metric: loss, max_length: {batches: 10}}",
             *(f"{k}: {v}" for k, v in extra.items())]
    p.write_text("\n".join(lines) + "\n")
    (tmp_path / "ctx").mkdir(exist_ok=True)
    return p


def state(conn, table: str, id_: int = 1) -> str:
    row = conn.execute(f"SELECT state::text AS s FROM {table} WHERE id = %s", (id_,)).fetchone()
    return row and row["s"]


def test_failing_trial_restarts_then_errors(det, conn, tmp_path) -> None:
    det("experiment", "create", str(config(tmp_path, "echo run; exit 3", max_restarts="1")),
        str(tmp_path / "ctx"))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "1")
    r = det("experiment", "wait", "1", check=False, timeout=120)
    assert r.returncode == 1 and "ERROR" in r.stdout
    trial = conn.execute("SELECT state::text AS s, restarts FROM trials").fetchone()
    # one restart was made (max_restarts: 1); the second failure ended the trial
    assert trial == {"s": "ERROR", "restarts": 1}
    logs = det("trial", "logs", "1").stdout
    assert logs.count("run\n") == 2
    assert "restarting from the latest checkpoint (1/1)" in logs
    assert "trial failed after 1 restart" in logs


def test_reconcile_once_is_idempotent(det, conn, tmp_path) -> None:
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    det("reconcile", "--once")
    snapshot = conn.execute(
        "SELECT (SELECT count(*) FROM trials) AS trials, (SELECT count(*) FROM searcher_ops) "
        "AS ops, (SELECT count(*) FROM allocations WHERE state = 'PENDING') AS pending, "
        "(SELECT searcher_state FROM experiments) AS searcher").fetchone()
    assert (snapshot["trials"], snapshot["ops"], snapshot["pending"]) == (1, 1, 1)
    det("reconcile", "--once")
    assert conn.execute(
        "SELECT (SELECT count(*) FROM trials) AS trials, (SELECT count(*) FROM searcher_ops) "
        "AS ops, (SELECT count(*) FROM allocations WHERE state = 'PENDING') AS pending, "
        "(SELECT searcher_state FROM experiments) AS searcher").fetchone() == snapshot


def test_one_leader_and_a_standby_that_takes_over(det, conn, tmp_path) -> None:
    first = det.start("first", "reconcile", "--interval", "0.5")
    wait_for(lambda: conn.execute("SELECT holder FROM reconciler_leader").fetchone(), 30,
             "the first reconciler to lead")
    assert conn.execute("SELECT holder FROM reconciler_leader").fetchone()["holder"].endswith(
        f":{first.pid}")
    second = det.start("second", "reconcile", "--interval", "0.5")
    wait_for(lambda: "standby" in det.log("second"), 30, "the second to wait as standby")
    r = det("reconcile", "--once", check=False)
    assert r.returncode == 1 and "another reconciler" in r.stderr
    # the standby writes nothing while the first leads
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    wait_for(lambda: conn.execute("SELECT count(*) AS n FROM trials").fetchone()["n"], 30,
             "the leader to create the trial")
    assert conn.execute("SELECT holder FROM reconciler_leader").fetchone()["holder"].endswith(
        f":{first.pid}")
    first.send_signal(signal.SIGKILL)
    wait_for(lambda: conn.execute("SELECT holder FROM reconciler_leader").fetchone()[
        "holder"].endswith(f":{second.pid}"), 30, "the standby to take over")


def test_lost_agent_run_is_restarted_elsewhere(det, conn, tmp_path) -> None:
    det("experiment", "create", str(config(tmp_path, "echo started; sleep 613")),
        str(tmp_path / "ctx"))
    det.start("reconciler", "reconcile", "--interval", "0.5", "--agent-timeout", "3")
    doomed = det.start("agent1", "agent", "run", "--id", "doomed", "--slots", "1")
    wait_for(lambda: state(conn, "allocations") == "RUNNING" and _sleepers(), 60,
             "the first run to start")
    doomed.send_signal(signal.SIGKILL)
    # the task dies with its agent (PR_SET_PDEATHSIG): no orphan keeps running
    wait_for(lambda: not _sleepers(), 10, "the orphaned task to die")
    wait_for(lambda: conn.execute("SELECT state::text AS s FROM agents WHERE id = 'doomed'")
             .fetchone()["s"] == "LOST", 30, "the agent to be declared lost")
    det.start("agent2", "agent", "run", "--id", "spare", "--slots", "1")
    wait_for(lambda: conn.execute(
        "SELECT agent_id FROM allocations WHERE run = 2 AND state = 'RUNNING'").fetchone(),
        60, "the trial's second run on the spare agent")
    first = conn.execute("SELECT exit_reason, state::text AS s FROM allocations WHERE run = 1"
                         ).fetchone()
    assert first == {"exit_reason": "agent lost", "s": "TERMINATED"}
    assert conn.execute("SELECT restarts FROM trials").fetchone()["restarts"] == 1
    det("experiment", "kill", "1")
    assert det("experiment", "wait", "1", check=False, timeout=60).returncode == 2


def _sleepers() -> list[str]:
    """Pids of this test's task processes (`sleep 613`)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00613\x00":
                out.append(pid)
        except OSError:
            pass
    return out


def test_the_spec_the_reconciler_writes_is_the_one_agents_read(det, conn, tmp_path) -> None:
    """allocations.spec (written in SQL from the expanded config) parses as AllocationSpec."""
    from det.configs.allocation import AllocationSpec

    det("experiment", "create", str(config(tmp_path, "true", **{
        "bind_mounts": "[{host_path: /data, container_path: data, read_only: true}]",
        "resources": "{slots_per_trial: 1, shm_size: 1G}"})), str(tmp_path / "ctx"))
    det("reconcile", "--once")
    row = conn.execute("SELECT id, spec FROM allocations").fetchone()
    spec = AllocationSpec.parse(row["spec"], row["id"])
    assert (spec.trial_id, spec.experiment_id, spec.entrypoint) == (1, 1, "true")
    assert spec.bind_mounts[0].read_only and spec.resources.shm_size == 2**30


def test_scheduling_pauses_the_collector_and_restores_it() -> None:
    """The scheduling step runs with the cyclic collector paused (issue 11) and leaves it as
    it found it, also when the step raises."""
    import gc

    import pytest

    from det.reconciler.placement import collector_paused

    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failing pool")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_batch_isolates_each_object_only_when_one_fails(conn) -> None:
    """Issue 11 batches a pass's objects in one savepoint (two round trips); issue 10's rule
    still holds: a failing object (a database error, or an error of its decision) is rolled
    back and recorded alone, the others take effect."""
    from det.reconciler.isolation import isolated_each

    conn.execute("CREATE TABLE done (n int CHECK (n <> 2))")

    def work(n: int) -> None:
        if n == 4:
            raise KeyError("no decision for 4")
        conn.execute("INSERT INTO done VALUES (%s)", (n,))

    failed: list[tuple[int, str]] = []
    with conn.transaction():
        isolated_each(conn, [1, 3], str, work, lambda n, m: failed.append((n, m)))
        isolated_each(conn, [5, 2, 6, 4, 7], str, work, lambda n, m: failed.append((n, m)))
        isolated_each(conn, [], str, work)
    assert [r["n"] for r in conn.execute("SELECT n FROM done ORDER BY n")] == [1, 3, 5, 6, 7]
    assert [n for n, _ in failed] == [2, 4]
    assert "done_n_check" in failed[0][1] and failed[1][1] == "'no decision for 4'"


def test_queued_rows_go_as_one_statement_per_kind_for_the_objects_that_succeed(conn) -> None:
    """The rows a pass's objects queue (det.reconciler.batch.Writes) go in one set-based
    statement per kind, in the batch's order whatever the order they came in; a failing
    object's rows are not sent, the others' are; a batch of several MB (as 1,000 searcher
    states are) goes through."""
    from psycopg.types.json import Jsonb

    from det.reconciler.batch import Writes
    from det.reconciler.isolation import isolated_each

    conn.execute("CREATE TABLE parent (id int PRIMARY KEY, blob jsonb)")
    conn.execute("CREATE TABLE child (parent int REFERENCES parent, n int CHECK (n <> 2))")
    parents = "INSERT INTO parent SELECT * FROM unnest(%(id)s::int[], %(blob)s::jsonb[])"
    children = "INSERT INTO child SELECT * FROM unnest(%(parent)s::int[], %(n)s::int[])"
    writes = Writes([parents, children])

    def work(n: int) -> None:
        writes.add(children, parent=n, n=n)  # before its parent: the batch orders them
        if n == 4:
            raise KeyError("no decision for 4")
        conn.execute("SELECT %s", (n,))  # a statement of its own in the pipeline
        writes.add(parents, id=n, blob=Jsonb({"key": ["x" * 64] * 128}))

    failed: list[int] = []
    with conn.transaction():
        isolated_each(conn, [1, 2, 3, 4, 5], str, work, lambda n, _m: failed.append(n),
                      writes)
        isolated_each(conn, range(10, 1010), str, work, writes=writes)
    assert failed == [2, 4]
    assert [r["n"] for r in conn.execute("SELECT n FROM child ORDER BY n")] == [
        1, 3, 5, *range(10, 1010)]
    assert conn.execute("SELECT count(*) AS n FROM parent").fetchone()["n"] == 1003
    with pytest.raises(ValueError):
        writes.add("SELECT 1", x=1)


BURST = """name: burst
entrypoint: 'echo "task $DET_ALLOCATION_ID"; exit $((DET_ALLOCATION_ID % 3))'
searcher: {name: single, metric: loss, max_length: {batches: 1}}
max_restarts: 0
"""


def test_a_burst_of_tiny_tasks_is_claimed_started_and_reported_once_each(det, conn) -> None:
    """Issue 11: a pass's runs are settled and searched in one batch, and the agent claims
    the runs assigned to it in one round trip, starts them, then reports them RUNNING in one
    and their ends in one. 40 one-trial experiments on 8 slots: every run starts once, with
    its own allocation id, and its output, exit code and times are recorded."""
    from psycopg.types.json import Jsonb

    from det.configs import load_experiment_config

    cfg = load_experiment_config(BURST).expanded()
    with conn.transaction():
        for _ in range(40):
            conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (Jsonb(cfg),))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "8", "--runtime", "process")
    wait_for(lambda: conn.execute(
        "SELECT count(*) AS n FROM experiments WHERE state IN ('COMPLETED', 'ERROR')"
    ).fetchone()["n"] == 40, 120, "40 experiments to end")
    runs = conn.execute(
        "SELECT id, state::text AS s, exit_code, started_at <= running_at AND "
        "running_at <= ended_at AS ordered FROM allocations ORDER BY id").fetchall()
    assert len(runs) == 40
    assert all(r["s"] == "TERMINATED" and r["ordered"] for r in runs)
    assert [r["exit_code"] for r in runs] == [r["id"] % 3 for r in runs]
    lines = conn.execute("SELECT allocation_id AS a, line FROM task_logs "
                         "WHERE line LIKE 'task %%'").fetchall()
    assert sorted((r["a"], r["line"]) for r in lines) == [(r["id"], f"task {r['id']}")
                                                          for r in runs]
    ended = conn.execute("SELECT state::text AS s, count(*) AS n FROM experiments "
                         "GROUP BY 1").fetchall()
    zero = sum(1 for r in runs if r["id"] % 3 == 0)
    assert {r["s"]: r["n"] for r in ended} == {"COMPLETED": zero, "ERROR": 40 - zero}
    assert "launch failed" not in det.log("agent")


def test_a_task_waiting_for_its_next_op_is_woken_by_the_pass_that_decides(
        det, conn, db_url, tmp_path, monkeypatch) -> None:
    """The pass that reads a trial's events NOTIFYs its run (payload ``op``): a task waiting
    in ``current_op`` asks again then, not after its poll pause (made 60 s here)."""
    import threading

    import psycopg
    from psycopg.rows import dict_row
    from psycopg.types.json import Jsonb

    from det.harness import transport
    from det.reconciler.passes import Settings, run_pass

    monkeypatch.setattr(transport, "OP_POLL_SECONDS", 60.0)
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as leader:
        run_pass(leader, Settings(), "test")  # the trial, its op, its run placed on a1
        alloc = conn.execute("SELECT id FROM allocations").fetchone()["id"]
        token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
        task = transport.DbTransport(db_url, alloc, token)
        try:
            op = task.current_op()
            task.complete_op(op.id, 0.5)  # the searcher has yet to read it: the task waits
            answers: list = []
            waiting = threading.Thread(target=lambda: answers.append(task.current_op()))
            waiting.start()
            wait_for(lambda: conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity "
                "WHERE query LIKE '%det_task.current_op%'"
                " AND state = 'idle'").fetchone()["n"] > 0, 20, "the task's first wait")
            run_pass(leader, Settings(), "test")  # single: no more ops for the trial
            waiting.join(20)
            assert not waiting.is_alive() and answers == [None]
            assert task.out_of_work
        finally:
            task.close()


def one_ended_one_waiting(det, conn, leader, tmp_path: Path) -> tuple[dict, dict]:
    """Agent a1 with one slot, two one-trial experiments, a pass on ``leader``: one run is
    placed on the slot, claimed and reported ended (its slot released, the end not settled),
    the other waits. Returns the two runs (id, experiment_id)."""
    from psycopg.types.json import Jsonb

    from det.reconciler.passes import Settings, run_pass

    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    for _ in range(2):
        det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    run_pass(leader, Settings(), "test")
    runs = {r["state"]: r for r in conn.execute(
        "SELECT a.id, a.state::text, t.experiment_id FROM allocations a "
        "JOIN trials t ON t.id = a.trial_id")}
    ended, waiting = runs["ASSIGNED"], runs["PENDING"]
    conn.execute("SELECT det_agent.claim('a1', %s)", (ended["id"],))
    conn.execute("SELECT det_agent.report_each('a1', %s, 'TERMINATED', %s, %s)",
                 ([ended["id"]], [0], [None]))
    return ended, waiting


def test_freed_slots_are_placed_and_their_agent_woken_before_the_rest_of_the_pass(
        det, conn, db_url, tmp_path) -> None:
    """A pass places waiting runs on the slots that ended runs freed, and commits that (the
    agent hears of it), before it settles those ends: here the settling waits on a lock
    another session holds, and the next run is already assigned and its agent woken."""
    import threading

    import psycopg
    from psycopg.rows import dict_row

    from det.db import channels
    from det.reconciler.passes import Settings, run_pass

    with (psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as leader,
          psycopg.connect(db_url, autocommit=True) as agent,
          psycopg.connect(db_url, row_factory=dict_row) as holder):
        ended, waiting = one_ended_one_waiting(det, conn, leader, tmp_path)
        first, second = ended["id"], waiting["id"]
        channels.listen(agent, channels.agent("a1"))
        # Settling the first run locks its trial: held here, the pass waits at that step.
        holder.execute("SELECT id FROM trials WHERE id = (SELECT trial_id FROM allocations "
                       "WHERE id = %s) FOR UPDATE", (first,))
        passing = threading.Thread(target=run_pass, args=(leader, Settings(), "test"))
        passing.start()
        try:
            wait_for(lambda: state(conn, "allocations", second) == "ASSIGNED", 20,
                     "the second run placed on the freed slot")
            woken = list(agent.notifies(timeout=10, stop_after=1))
            assert [n.channel for n in woken] == [channels.name(conn, channels.agent("a1"))]
            assert passing.is_alive()
            assert conn.execute("SELECT settled FROM allocations WHERE id = %s",
                                (first,)).fetchone()["settled"] is False
        finally:
            holder.rollback()
            passing.join(20)
        assert not passing.is_alive()
        assert conn.execute("SELECT settled FROM allocations WHERE id = %s",
                            (first,)).fetchone()["settled"] is True


def test_a_pass_does_not_place_the_waiting_run_of_an_experiment_paused_meanwhile(
        det, conn, db_url, tmp_path) -> None:
    """The user's pause is applied before the pass places runs on freed slots: the paused
    experiment's waiting run is not started (and then asked to stop)."""
    import psycopg
    from psycopg.rows import dict_row

    from det.reconciler.passes import Settings, run_pass

    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as leader:
        _, waiting = one_ended_one_waiting(det, conn, leader, tmp_path)
        det("experiment", "pause", str(waiting["experiment_id"]))
        run_pass(leader, Settings(), "test")
        assert state(conn, "allocations", waiting["id"]) != "ASSIGNED"
        assert conn.execute("SELECT count(*) AS n FROM allocation_slots "
                            "WHERE NOT released").fetchone()["n"] == 0


@pytest.mark.parametrize("name", ["pause_trials", "activate_trials", "stop_trials",
                                  "finish_closed_trials", "experiments_to_search",
                                  "finish_stopping_trials", "finish_experiments",
                                  "create_allocations", "escalate_desired"])
def test_the_pass_finds_live_experiments_and_trials_by_index(conn, name) -> None:
    """Each pass's look for live experiments and trials can use experiments_live and
    trials_live (issue 11: reading every experiment and trial ever run made an idle pass
    take 220-340 ms over 100,000 ended experiments): with sequential scans priced out, every
    read of either table goes through an index condition, never the whole table, or through
    a partial index (which holds only the rows in the rare state it is for)."""
    from det.sql import named

    q = named("reconciler")

    partial = {r["name"] for r in conn.execute(
        "SELECT indexrelid::regclass::text AS name FROM pg_index WHERE indpred IS NOT NULL")}
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = conn.execute("EXPLAIN (FORMAT JSON) " + getattr(q, name), {}).fetchone()
    whole = []

    def walk(node: dict) -> None:
        if node.get("Relation Name") in ("experiments", "trials") and node["Node Type"] not in (
                "ModifyTable", "Bitmap Heap Scan") and "Index Cond" not in node \
                and node.get("Index Name") not in partial:
            whole.append(f"{node['Node Type']} on {node['Relation Name']}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["QUERY PLAN"][0]["Plan"])
    assert whole == []


# The looks of a pass for rows in a rare state: on a queue where none is in it, each reads
# (nearly) nothing.
IDLE_LOOKS = ["end_lost_allocations", "pause_trials", "activate_trials", "stop_trials",
              "escalate_desired", "end_unstarted", "kill_overdue", "finish_closed_trials",
              "experiments_to_search", "finish_stopping_trials", "finish_experiments",
              "pools_with_pending", "settle_task_runs", "live_task_runs", "kill_overdue_tasks"]


def one_trial_config():
    """The expanded config of a one-trial experiment of one batch, as ``Jsonb``."""
    from psycopg.types.json import Jsonb

    from det.configs import load_experiment_config

    return Jsonb(load_experiment_config(
        "name: q\nentrypoint: 'true'\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n").expanded())


def queue_runs(conn, n: int) -> None:
    """Submit ``n`` one-trial experiments at once (as ``det experiment create`` does) and run
    passes until their runs wait (no agent)."""
    from det.reconciler.passes import Settings, run_pass

    config = one_trial_config()
    with conn.transaction():
        for _ in range(n):
            conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (config,))
    while run_pass(conn, Settings(), "test").changes:
        pass


def test_an_idle_pass_reads_what_it_finds_not_the_queue(conn) -> None:
    """With 300 runs queued and nothing to do, each of the pass's looks for rows in a rare
    state (a stop, a pause, a closed trial, an unread event, a lost agent) reads at most a
    row of experiments, trials and allocations per scan (a pool with runs waiting finds the
    first), whatever the queue's length (issue 11: at 1,000 queued, those looks made up half
    of an idle pass). Planned from fresh statistics (det.reconciler.statistics sees to them
    after a burst), as EXPLAIN ANALYZE counts the rows each scan returned."""
    from det.sql import named

    q = named("reconciler")

    queue_runs(conn, 300)
    assert conn.execute("SELECT count(*) AS n FROM allocations "
                        "WHERE state = 'PENDING'").fetchone()["n"] == 300
    conn.execute("ANALYZE")
    read = {}
    for name in IDLE_LOOKS:
        with conn.transaction(force_rollback=True):
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + getattr(q, name),
                                {"timeout": 30.0, "fence": 10.0, "grace": 10.0}
                                ).fetchone()["QUERY PLAN"][0]["Plan"]
        most = 0

        def walk(node: dict) -> None:
            nonlocal most
            if node.get("Relation Name") in ("experiments", "trials", "allocations") \
                    and node["Node Type"] != "ModifyTable":
                most = max(most, node["Actual Rows"] * node["Actual Loops"])
            for child in node.get("Plans", []):
                walk(child)

        walk(plan)
        read[name] = most
    assert {name: n for name, n in read.items() if n > 1} == {}


def test_a_pass_reads_the_runs_and_jobs_of_its_queue_not_every_one_ever_submitted(
        conn) -> None:
    """With 1,000 runs queued and 100,000 ended experiments, the reconciler's session
    (prepare_session) reads the queued runs and their jobs for the scheduler's input and the
    fallback look, not the whole tables (issue 11: at PostgreSQL's default planner costs the
    scheduler's input read every job ever submitted, 36 ms a pass)."""
    from det.sql import named

    q = named("reconciler")
    from det.reconciler.passes import prepare_session

    queue_runs(conn, 1000)
    ids = {"first": 1_000_001, "last": 1_100_000, "config": one_trial_config()}
    series = " FROM generate_series(%(first)s::integer, %(last)s) i"
    with conn.transaction():  # ended one-trial experiments, each with its job, trial and run
        conn.execute("INSERT INTO jobs (id, type, resource_pool, queue_position, owner) "
                     "SELECT i, 'EXPERIMENT', 'default', i, 'admin'" + series, ids)
        conn.execute("INSERT INTO experiments (id, job_id, name, config, original_config, "
                     "owner, state, end_time) SELECT i, i, 'h', %(config)s, '', 'admin', "
                     "'COMPLETED', now()" + series, ids)
        conn.execute("INSERT INTO trials (id, experiment_id, request_id, hparams, seed, state, "
                     "closed, end_time) SELECT i, i, gen_random_uuid(), '{}', i, 'COMPLETED', "
                     "true, now()" + series, ids)
        conn.execute("INSERT INTO allocations (job_id, trial_id, run, resource_pool, "
                     "slots_needed, spec, state, exit_code, settled, ended_at) SELECT i, i, 1, "
                     "'default', 1, '{\"kind\": \"trial\"}', 'TERMINATED', 0, true, now()"
                     + series, ids)
    conn.execute("ANALYZE")
    prepare_session(conn)
    for name, params in (("pool_tasks", {"pool": "default"}), ("fall_back", {})):
        with conn.transaction(force_rollback=True):
            plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + getattr(q, name),
                                params).fetchone()["QUERY PLAN"][0]["Plan"]
        read = 0

        def walk(node: dict) -> None:
            nonlocal read
            if node.get("Relation Name") in ("jobs", "allocations") \
                    and node["Node Type"] != "ModifyTable":  # rows scanned, kept or not
                read += (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) \
                    * node["Actual Loops"]
            for child in node.get("Plans", []):
                walk(child)

        walk(plan)
        assert read < 5000, f"{name} read {read:.0f} rows of jobs and allocations"


def test_the_leader_analyzes_the_tables_a_burst_changed(conn) -> None:
    """After a burst (600 experiments submitted at once and their runs queued) the leader
    analyzes the tables that changed by more than half (500 changes and more), once,
    between passes; prepared plans made from the statistics of nearly empty tables had an
    idle pass at 1,000 queued take 45-53 ms instead of 22-31 (issue 11,
    bench/queued_pass.py)."""
    from det.reconciler.statistics import Statistics

    # Only the leader analyzes here: an autovacuum worker that visits this new database
    # between the inserts and the passes' updates resets the count the rule reads, and the
    # burst's updates alone are under its threshold (so the leader rightly does nothing).
    for table in ("experiments", "trials"):
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    queue_runs(conn, 600)
    stats = Statistics()
    analyzed: list[str] = []

    def refreshed() -> bool:
        stats.due = 0.0  # the server's counters lag by up to a second: look again
        analyzed.extend(stats.refresh(conn))
        return {"experiments", "trials"} <= set(analyzed)

    wait_for(refreshed, 30, "the burst's tables analyzed")
    last = {r["relname"]: r["last_analyze"] for r in conn.execute(
        "SELECT relname, last_analyze FROM pg_stat_user_tables "
        "WHERE relname IN ('experiments', 'trials')")}
    assert all(last.values()), last
    assert stats.refresh(conn) == []  # not due again yet
    stats.due = 0.0
    assert stats.refresh(conn) == []  # and nothing changed since


def test_a_search_resumed_from_the_database_draws_as_one_kept_in_memory(conn) -> None:
    """The searcher's generator is stored apart from its state (searcher_rng: written only at
    the steps that draw, issue 11); a pass that resumes the search from both draws the trial
    that a search kept in memory draws."""
    from psycopg.types.json import Jsonb

    from det.configs import load_experiment_config
    from det.reconciler.passes import Settings, run_pass
    from det.reconciler.searchers import TrialExited, ValidationCompleted, searcher_step

    expanded = load_experiment_config(
        "name: r\nentrypoint: 'true'\nhyperparameters: {lr: {type: double, minval: 0, maxval: 1}}"
        "\nsearcher: {name: random, metric: loss, max_trials: 3, max_concurrent_trials: 2,"
        " max_length: {batches: 5}}\n").expanded()
    conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (Jsonb(expanded),))
    run_pass(conn, Settings(), "test")  # trials 1 and 2: two draws each
    stored = conn.execute("SELECT searcher_state, searcher_rng FROM experiments").fetchone()
    assert "rng" not in stored["searcher_state"] and stored["searcher_rng"] is not None

    def event(trial: int, kind: str, payload: dict) -> None:
        conn.execute("INSERT INTO searcher_events (experiment_id, trial_id, kind, payload) "
                     "VALUES (1, %s, %s, %s)", (trial, kind, Jsonb(payload)))

    first, second = (r["request_id"] for r in conn.execute(
        "SELECT request_id::text FROM trials ORDER BY id").fetchall())
    event(2, "validation_completed", {"length": 5, "metric": 0.5})  # draws nothing
    run_pass(conn, Settings(), "test")
    assert conn.execute("SELECT searcher_rng FROM experiments").fetchone()["searcher_rng"] \
        == stored["searcher_rng"]
    event(1, "trial_exited", {})  # room for the third trial: drawn from the stored generator
    run_pass(conn, Settings(), "test")
    third = conn.execute("SELECT request_id::text, seed, hparams FROM trials WHERE id = 3"
                         ).fetchone()

    memory, _ = searcher_step(expanded, None, [])
    memory, _ = searcher_step(expanded, memory, [ValidationCompleted(second, 5, 0.5)])
    _, actions = searcher_step(expanded, memory, [TrialExited(first)])
    create = actions[0]
    assert (third["request_id"], third["seed"], third["hparams"]) == \
        (create.request_id, create.seed, create.hparams)


def test_events_that_mean_nothing_are_consumed_without_rewriting_the_experiment(conn) -> None:
    """A validation report to a searcher whose results are its ops' completions (every
    validation row records one) is consumed, and the experiment's row is not written again."""
    from psycopg.types.json import Jsonb

    from det.configs import load_experiment_config
    from det.reconciler.passes import Settings, run_pass

    expanded = load_experiment_config(
        "name: r\nentrypoint: 'true'\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 5}}\n").expanded()
    conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (Jsonb(expanded),))
    run_pass(conn, Settings(), "test")
    version = conn.execute("SELECT xmin::text AS v FROM experiments").fetchone()["v"]
    conn.execute("INSERT INTO searcher_events (experiment_id, trial_id, kind, payload) "
                 "VALUES (1, 1, 'validation_reported', '{\"metrics_id\": 0}')")
    run_pass(conn, Settings(), "test")
    assert conn.execute("SELECT bool_and(consumed) AS c FROM searcher_events").fetchone()["c"]
    assert conn.execute("SELECT xmin::text AS v FROM experiments").fetchone()["v"] == version
