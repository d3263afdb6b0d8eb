"""The core path under the faults of issue 10: stops that must end, a pass no single object can
break, leaders that die or freeze, and the truth in what det prints."""

import signal

import pytest
from conftest import private_env, wait_for
from test_reconciler import config, state


def _run_until_paused(det, conn, tmp_path) -> None:
    # A shell task never checkpoints: preemption_timeout ends it soon after the pause.
    det("experiment", "create", str(config(tmp_path, "echo started; sleep 600",
                                           preemption_timeout="1")), str(tmp_path / "ctx"))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "1")
    wait_for(lambda: state(conn, "allocations") == "RUNNING", 60, "the run to start")
    det("experiment", "pause", "1")
    wait_for(lambda: state(conn, "allocations") == "TERMINATED", 60, "the paused run to end")
    wait_for(lambda: state(conn, "trials") == "PAUSED", 30, "the trial to be paused")


@pytest.mark.parametrize(("action", "final"), [("kill", "CANCELED"), ("cancel", "CANCELED")])
def test_stopping_a_paused_experiment_ends_it(det, conn, tmp_path, action, final) -> None:
    """Issue 10, item 1: a trial with no live run reaches its terminal state in the next pass,
    and the experiment's job leaves the queue."""
    _run_until_paused(det, conn, tmp_path)
    det("experiment", action, "1")
    r = det("experiment", "wait", "1", check=False, timeout=60)
    assert state(conn, "experiments") == final, r.stdout + r.stderr
    assert state(conn, "trials") == final
    assert conn.execute("SELECT count(*) AS n FROM reporting.job_queue").fetchone()["n"] == 0
    assert "trial canceled" in det("trial", "logs", "1").stdout


def test_a_paused_experiment_stopped_while_no_reconciler_runs_ends_on_the_next_pass(
        det, conn, tmp_path) -> None:
    _run_until_paused(det, conn, tmp_path)
    det.stop_all()
    det("experiment", "kill", "1")
    det("reconcile", "--once")
    assert (state(conn, "experiments"), state(conn, "trials")) == ("CANCELED", "CANCELED")


def test_restarts_column_and_log_agree(det, conn, tmp_path) -> None:
    """Issue 10, telling the truth: max_restarts 1 means one restart, then the error."""
    det("experiment", "create", str(config(tmp_path, "exit 3", max_restarts="1")),
        str(tmp_path / "ctx"))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "1")
    det("experiment", "wait", "1", check=False, timeout=120)
    trial = conn.execute("SELECT state::text AS s, restarts, runs FROM trials").fetchone()
    assert trial == {"s": "ERROR", "restarts": 1, "runs": 2}
    logs = det("trial", "logs", "1").stdout
    assert "trial failed after 1 restart" in logs and "after 2" not in logs


def test_kill_during_a_run_leaves_no_checkpoint(det, conn, tmp_path) -> None:
    """`det experiment kill` stops trials at once, without a checkpoint (its help says so)."""
    det("experiment", "create", str(config(tmp_path, "trap 'echo term' TERM; sleep 600 & wait")),
        str(tmp_path / "ctx"))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "1")
    wait_for(lambda: state(conn, "allocations") == "RUNNING", 60, "the run to start")
    assert "without a checkpoint" in det("experiment", "kill", "--help").stdout
    det("experiment", "kill", "1")
    det("experiment", "wait", "1", check=False, timeout=60)
    row = conn.execute("SELECT exit_reason, exit_code FROM allocations").fetchone()
    assert row["exit_code"] == -signal.SIGKILL, row
    assert "term" not in det("trial", "logs", "1").stdout


@pytest.fixture
def det_private(private_pg, det_env, tmp_path):
    """A :class:`conftest.Det` runner bound to the test's private, restartable server."""
    from conftest import Det

    d = Det(private_env(det_env, private_pg.url), tmp_path)
    yield d
    d.stop_all()


def _count(url: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(url) as c:
        return c.execute(sql).fetchone()[0]


def test_reconciler_rides_out_a_database_restart(private_pg, det_private, tmp_path) -> None:
    """Issue 10, item 4: the reconciler reconnects, leads again and carries on."""
    det = det_private
    rec = det.start("reconciler", "reconcile", "--interval", "0.5")
    wait_for(lambda: "leading as" in det.log("reconciler"), 30, "the reconciler to lead")
    private_pg.restart(down=1.0)
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    wait_for(lambda: _count(private_pg.url, "SELECT count(*) FROM allocations"), 60,
             "the reconciler to create the run after the restart")
    private_pg.restart(down=0.2)
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    wait_for(lambda: _count(private_pg.url, "SELECT count(*) FROM allocations") == 2, 60,
             "the reconciler to carry on after a second restart")
    assert rec.poll() is None, det.log("reconciler")
    assert det.log("reconciler").count("leading as") == 3


def test_a_frozen_leader_is_replaced(det, conn, tmp_path) -> None:
    """Issue 10, item 5: a leader stopped with SIGSTOP loses its session after its lease, a
    standby leads, and the old leader comes back as a standby when it wakes."""
    frozen = det.start("first", "reconcile", "--interval", "0.5", "--lease", "3")
    wait_for(lambda: "leading as" in det.log("first"), 30, "the first reconciler to lead")
    standby = det.start("second", "reconcile", "--interval", "0.5", "--lease", "3")
    wait_for(lambda: "standby" in det.log("second"), 30, "the second to wait as standby")
    frozen.send_signal(signal.SIGSTOP)
    try:
        # lease (3 s) + one standby poll (1 s), with room for a slow machine
        wait_for(lambda: "took over" in det.log("second"), 20, "the standby to take over")
        det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
        wait_for(lambda: conn.execute("SELECT count(*) AS n FROM trials").fetchone()["n"], 30,
                 "the new leader to act")
        assert conn.execute("SELECT holder FROM reconciler_leader").fetchone()[
            "holder"].endswith(f":{standby.pid}")
    finally:
        frozen.send_signal(signal.SIGCONT)
    wait_for(lambda: "standby" in det.log("first"), 30, "the old leader to come back as standby")
    assert frozen.poll() is None and standby.poll() is None


@pytest.mark.slow
def test_a_digits_run_completes_through_two_database_restarts(
        private_pg, det_private, tmp_path) -> None:
    """Issue 10, item 4, the proof: PostgreSQL restarts twice while the digits example trains;
    the run completes with no restart counted and every metric row present, once."""
    from test_e2e_digits import DIGITS, digits_config

    det = det_private
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 3000},
                                     "scheduling_unit": 50,
                                     "min_validation_period": {"batches": 500},
                                     "min_checkpoint_period": {"batches": 1000}})
    det.start("reconciler", "reconcile", "--interval", "0.5")
    agent = det.start("agent", "agent", "run", "--slots", "1")
    det("experiment", "create", str(cfg), str(DIGITS))
    training = "SELECT count(*) FROM metrics WHERE \"group\" = 'training'"
    wait_for(lambda: _count(private_pg.url, training) >= 2, 120, "training to start")
    private_pg.restart(down=1.0)
    wait_for(lambda: _count(private_pg.url, training) >= 20, 120, "training to go on")
    private_pg.restart(down=1.0)
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    assert agent.poll() is None, det.log("agent")
    import psycopg

    with psycopg.connect(private_pg.url) as c:
        trial = c.execute("SELECT state::text, restarts, runs FROM trials").fetchone()
        assert trial == ("COMPLETED", 0, 1)
        steps = {g: [s for (s,) in c.execute(
            "SELECT steps_completed FROM metrics WHERE \"group\" = %s ORDER BY id", (g,))]
            for g in ("training", "validation")}
    assert steps["training"] == list(range(50, 3001, 50))
    assert steps["validation"] == list(range(500, 3001, 500))


def test_the_queue_says_why_a_job_waits_without_agents_or_reconciler(det, conn, tmp_path):
    """Issue 10, telling the truth: 0/1 slots, and the reasons `det job explain` knows."""
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    out = det("job", "list", "-v").stdout
    assert "0/1" in out and "no reconciler is running" in out and "has no agents" in out
    det("reconcile", "--once")
    out = det("job", "list", "-v").stdout
    assert "0/1" in out and "pool has no agents" in out
    det("experiment", "kill", "1")
    det("reconcile", "--once")
    r = det("job", "explain", "1")
    assert r.stdout.strip() == "Job 1 (experiment 1) is CANCELED: it is no longer queued"
    r = det("job", "update", "1", "--weight", "2", check=False)
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: job 1 (experiment 1) is CANCELED: it is no longer queued"


def test_a_63_character_agent_id_runs_trials(det, conn, tmp_path) -> None:
    """Issue 10, item 3: the longest valid id makes a channel name PostgreSQL refuses as it
    is (agent_ + 63 characters); det's channels are bounded, so passes go on."""
    agent_id = "a" * 63
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--id", agent_id, "--slots", "1")
    det("experiment", "create", str(config(tmp_path, "echo ran")), str(tmp_path / "ctx"))
    assert det("experiment", "wait", "1", timeout=120).returncode == 0
    assert conn.execute("SELECT agent_id FROM allocations").fetchone()["agent_id"] == agent_id
    assert "failed" not in det.log("reconciler")


def test_a_pool_whose_scheduling_fails_says_why_and_others_go_on(det, conn, tmp_path) -> None:
    """Issue 10, item 3: a pass isolates the faulty object, records why on it, and goes on."""
    conn.execute("INSERT INTO resource_pools (name, scheduler) "
                 "VALUES ('broken', '{\"type\": \"no-such-scheduler\"}')")
    conn.execute("SELECT det_agent.register('ok', 'h', 'default', 'process', "
                 "'[{\"slot_id\": 0, \"type\": \"cpu\"}]')")
    det("experiment", "create", str(config(tmp_path, "true", **{
        "resources": "{resource_pool: broken}"})), str(tmp_path / "ctx"), "--force")
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    det("reconcile", "--once")
    rows = {r["resource_pool"]: r for r in conn.execute(
        "SELECT resource_pool, state::text AS state, pending_reason FROM allocations")}
    assert rows["default"]["state"] == "ASSIGNED"
    assert rows["broken"]["state"] == "PENDING"
    assert rows["broken"]["pending_reason"].startswith("scheduling failed: ")


def test_a_search_whose_writes_fail_ends_its_experiment_and_others_go_on(det, conn,
                                                                          tmp_path) -> None:
    """Issue 10, item 3, for the searcher step, whose writes go in one pipeline (issue 11):
    a statement that fails there rolls back that experiment's savepoint only."""
    conn.execute("""
        CREATE FUNCTION refuse_experiment_1() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.experiment_id = 1 THEN RAISE EXCEPTION 'injected: no trials for 1'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_experiment_1 BEFORE INSERT ON trials
            FOR EACH ROW EXECUTE FUNCTION refuse_experiment_1();
    """)
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    det("experiment", "create", str(config(tmp_path, "true")), str(tmp_path / "ctx"))
    r = det("reconcile", "--once")
    states = {row["id"]: row["s"] for row in conn.execute(
        "SELECT id, state::text AS s FROM experiments")}
    assert states[1] in ("STOPPING_ERROR", "ERROR")
    assert states[2] == "ACTIVE"
    trials = conn.execute("SELECT experiment_id FROM trials").fetchall()
    assert [t["experiment_id"] for t in trials] == [2]
    assert "injected: no trials for 1" in r.stdout + r.stderr
