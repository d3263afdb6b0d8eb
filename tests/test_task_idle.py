"""The ends det gives interactive tasks (issue 33): idle ones, ones whose server never
answers, ones asked to stop that do not, and how a task's run is settled once it ended.

The decisions are pure (det.reconciler.tasks) and tested as such; the pass's part is tested
with real rows, the agent played as in test_task_scheduling, and the fault injected in the
rows: an old ``tasks.last_activity`` (no use since), an old ``running_at`` with no address (a
server that never answered), an old stop request.
"""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from conftest import wait_for
from hypothesis import given
from hypothesis import strategies as st
from test_task_scheduling import apply_cluster, converge, experiment, register, task

from det.configs.cluster import load_cluster_config
from det.db import channels
from det.errors import ConfigError
from det.reconciler.passes import TASK_STOP_GRACE, Settings, run_pass
from det.reconciler.tasks import (
    TaskRun,
    end_reason,
    go_duration,
    idle_reason,
    unanswered_reason,
)

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


@pytest.mark.parametrize(("seconds", "text"), [
    (600, "10m0s"), (120, "2m0s"), (20, "20s"), (3600, "1h0m0s"), (5400.5, "1h30m0.5s"),
    (1.5, "1.5s"), (0.5, "500ms"), (0.0015, "1.5ms"), (2e-6, "2µs"), (0, "0s"),
    (86400, "24h0m0s"),
])
def test_go_duration_writes_as_go_does(seconds, text) -> None:
    """Go's time.Duration.String, as Determined prints timeouts."""
    assert go_duration(seconds) == text


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_go_duration_refuses_what_is_no_duration(bad) -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        go_duration(bad)


@given(st.integers(0, 10**6), st.integers(1, 10**5))
def test_idle_exactly_from_the_timeout_on(idle_s, timeout_s) -> None:
    """Idle once the time since the last use reaches the timeout, not a moment before."""
    got = idle_reason(NOW, ago(idle_s), timeout_s)
    assert (got is not None) == (idle_s >= timeout_s)
    if got is not None:
        assert got == f"idle for {go_duration(timeout_s)}"


def test_no_idle_timeout_is_never_idle() -> None:
    assert idle_reason(NOW, ago(10**7), None) is None


def test_an_unanswering_server_is_ended_after_the_start_timeout_from_running() -> None:
    assert unanswered_reason(NOW, ago(119), None, 120) is None
    assert unanswered_reason(NOW, ago(120), None, 120) == (
        "the task's server did not answer within 2m0s")
    assert unanswered_reason(NOW, ago(10**4), "h:1", 120) is None  # it answered
    assert unanswered_reason(NOW, None, None, 120) is None  # not running yet


def run(kind: str, idle_timeout: float | None = None, last: float = 0, running: float = 0,
        address: str | None = "h:1") -> TaskRun:
    return TaskRun(kind, idle_timeout, ago(last), ago(running), address)


@pytest.mark.parametrize(("task_run", "want"), [
    (run("NOTEBOOK", 600, last=600), "idle for 10m0s"),
    (run("NOTEBOOK", 600, last=599), None),
    (run("NOTEBOOK", None, last=10**6), None),
    (run("SHELL", 20, last=21), "idle for 20s"),
    # a TensorBoard: the cluster's tensorboard_timeout (300 here), or its own if shorter
    (run("TENSORBOARD", None, last=300), "idle for 5m0s"),
    (run("TENSORBOARD", None, last=299), None),
    (run("TENSORBOARD", 60, last=60), "idle for 1m0s"),
    (run("TENSORBOARD", 900, last=300), "idle for 5m0s"),
    # not answering yet: the start timeout, not idleness, however old its last use
    (run("NOTEBOOK", 20, last=10**4, running=30, address=None), None),
    (run("NOTEBOOK", 20, last=10**4, running=120, address=None),
     "the task's server did not answer within 2m0s"),
    # a command has no server: neither rule applies
    (run("COMMAND", 20, last=10**4, running=10**4, address=None), None),
])
def test_end_reason_per_kind(task_run, want) -> None:
    assert end_reason(task_run, NOW, tensorboard_timeout=300, start_timeout=120) == want


@pytest.mark.parametrize(("text", "why"), [
    ("tensorboard_timeout: 0", "expected a value > 0.0, got 0"),
    ("tensorboard_timeout: .nan", "expected a finite number"),
    ("tensorboard_timeout: soon", "expected a number"),
])
def test_tensorboard_timeout_is_seconds_and_bad_values_name_the_key(text, why) -> None:
    assert load_cluster_config("").tensorboard_timeout == 300
    with pytest.raises(ConfigError, match=f"cluster.yaml: tensorboard_timeout: {why}"):
        load_cluster_config(text, "cluster.yaml")


# -- the pass, with real rows ------------------------------------------------------------------

def start(conn, job: int, *, address: str | None = "127.0.0.1:8888") -> int:
    """Place task ``job``, have the agent run it and, unless ``address`` is None, its server
    answer there (det_task.ready with the run's token); its allocation id."""
    converge(conn)
    alloc = conn.execute("SELECT id, state::text AS s FROM allocations WHERE job_id = %s",
                         (job,)).fetchone()
    assert alloc["s"] == "RUNNING"
    if address is not None:
        # the task's token as the agent got it is not kept by play_agent: mint another
        token = conn.execute("UPDATE allocations SET token_hash = "
                             "sha256(convert_to('t-' || id, 'UTF8'))"
                             " WHERE id = %s RETURNING 't-' || id AS t", (alloc["id"],)
                             ).fetchone()["t"]
        conn.execute("SELECT det_task.ready(%s, %s)", (token, address))
    return alloc["id"]


def unused_for(conn, job: int, seconds: float) -> None:
    """The fault: task ``job`` saw no use for ``seconds`` (nothing reported, nothing proxied)."""
    conn.execute("UPDATE tasks SET last_activity = now() - make_interval(secs => %s) "
                 "WHERE job_id = %s", (seconds, job))


def ended(conn, job: int) -> dict:
    return conn.execute(
        "SELECT a.desired_state::text AS desired, a.state::text AS state, a.settled, "
        "k.end_reason FROM allocations a JOIN tasks k ON k.job_id = a.job_id "
        "WHERE a.job_id = %s", (job,)).fetchone()


def test_an_idle_notebook_is_stopped_with_its_reason_and_its_agent_woken(conn, db_url) -> None:
    register(conn, "a1", 1)
    notebook = task(conn, "NOTEBOOK", "idle_timeout: 20s")
    alloc = start(conn, notebook)
    unused_for(conn, notebook, 19)
    converge(conn)
    assert ended(conn, notebook)["desired"] == "RUNNING", "19 s of 20: not idle yet"
    unused_for(conn, notebook, 21)
    with psycopg.connect(db_url, autocommit=True) as listener:
        channels.listen(listener, channels.agent("a1"))
        run_pass(conn, Settings(), "test")
        woken = list(listener.notifies(timeout=5, stop_after=1))
    assert woken, "the agent hears of the stop at the pass's commit"
    assert ended(conn, notebook) == {"desired": "STOPPED", "state": "RUNNING", "settled": False,
                                     "end_reason": "idle for 20s"}
    assert conn.execute("SELECT line FROM task_logs WHERE allocation_id = %s AND stream = 'det'",
                        (alloc,)).fetchone()["line"] == "det ends the task: idle for 20s"
    converge(conn)  # its server shut down, the run exits 0; settled, the reason kept
    assert ended(conn, notebook) == {"desired": "STOPPED", "state": "TERMINATED",
                                     "settled": True, "end_reason": "idle for 20s"}
    assert run_pass(conn, Settings(), "test").changes == 0, "a second pass changes nothing"


def test_use_keeps_a_task_and_a_command_is_never_idle(conn) -> None:
    register(conn, "a1", 2)
    shell = task(conn, "SHELL", "idle_timeout: 20s")
    command = task(conn, "COMMAND")
    # det.configs.task refuses idle_timeout on a command; one stored from psql is ignored
    conn.execute("UPDATE tasks SET config = jsonb_set(config, '{idle_timeout}', '20') "
                 "WHERE job_id = %s", (command,))
    start(conn, shell)
    unused_for(conn, shell, 21)
    unused_for(conn, command, 10**4)
    conn.execute("SELECT det_task.activity('t-' || id, now()) FROM allocations "
                 "WHERE job_id = %s", (shell,))  # an SSH session open just now
    converge(conn)
    assert ended(conn, shell)["desired"] == ended(conn, command)["desired"] == "RUNNING"


def test_a_tensorboard_ends_after_the_clusters_tensorboard_timeout(conn) -> None:
    register(conn, "a1", 1)
    source = conn.execute("SELECT id FROM experiments WHERE job_id = %s",
                          (experiment(conn, "x"),)).fetchone()["id"]
    tb = task(conn, "TENSORBOARD", experiment_ids=[source])
    start(conn, tb)
    unused_for(conn, tb, 299)
    converge(conn)
    assert ended(conn, tb)["desired"] == "RUNNING", "the default is 300 s"
    apply_cluster(conn, "tensorboard_timeout: 60\n")
    unused_for(conn, tb, 61)
    converge(conn)
    assert ended(conn, tb)["end_reason"] == "idle for 1m0s"


def test_a_server_that_never_answers_is_ended_after_the_start_timeout(conn) -> None:
    register(conn, "a1", 1)
    notebook = task(conn, "NOTEBOOK")
    start(conn, notebook, address=None)
    converge(conn)
    assert ended(conn, notebook)["desired"] == "RUNNING", "it has 120 s"
    conn.execute("UPDATE allocations SET running_at = now() - interval '121 seconds' "
                 "WHERE job_id = %s", (notebook,))
    converge(conn)
    assert ended(conn, notebook) == {
        "desired": "STOPPED", "state": "TERMINATED", "settled": True,
        "end_reason": "the task's server did not answer within 2m0s"}


def test_a_task_run_ends_once_settled_with_its_exit_and_no_trial_touched(conn) -> None:
    """A task's run is no trial run: once ended it is settled (not left for every later pass
    to find), the task keeps why it ended, and it is never run again."""
    register(conn, "a1", 1)
    command = task(conn, "COMMAND")
    alloc = start(conn, command, address=None)
    conn.execute("SELECT det_agent.report('a1', %s, 'TERMINATED', 3, NULL)", (alloc,))
    converge(conn)
    assert ended(conn, command) == {"desired": "RUNNING", "state": "TERMINATED",
                                    "settled": True, "end_reason": "exited with code 3"}
    assert conn.execute("SELECT count(*) AS n FROM allocations WHERE job_id = %s",
                        (command,)).fetchone()["n"] == 1, "never restarted"


@pytest.mark.parametrize("why", ["idle", "drain"])
def test_a_task_asked_to_stop_that_does_not_is_killed_after_the_grace(conn, why) -> None:
    """A task stopped for idleness whose server hangs, or one det agent disable --drain asked
    to stop (a command, which nothing asks to exit), is killed TASK_STOP_GRACE seconds after
    the request: it has nothing to checkpoint."""
    register(conn, "a1", 1)
    job = task(conn, "NOTEBOOK", "idle_timeout: 20s") if why == "idle" else task(conn,
                                                                                  "COMMAND")
    alloc = start(conn, job)
    if why == "idle":
        unused_for(conn, job, 21)
    else:
        conn.execute("SELECT det_user.agent_drain('a1')")
    run_pass(conn, Settings(), "test")
    assert ended(conn, job)["desired"] == "STOPPED"
    conn.execute("UPDATE allocations SET stop_requested_at = now() - make_interval(secs => %s)"
                 " WHERE id = %s", (TASK_STOP_GRACE - 1, alloc))
    run_pass(conn, Settings(), "test")
    assert ended(conn, job)["desired"] == "STOPPED", "it has the grace to exit"
    conn.execute("UPDATE allocations SET stop_requested_at = now() - make_interval(secs => %s)"
                 " WHERE id = %s", (TASK_STOP_GRACE + 1, alloc))
    run_pass(conn, Settings(), "test")
    assert ended(conn, job)["desired"] == "KILLED"


def test_a_task_whose_agent_is_lost_ends_with_that_reason_and_is_not_run_again(conn) -> None:
    register(conn, "a1", 1)
    notebook = task(conn, "NOTEBOOK")
    start(conn, notebook)
    # silent for longer than the timeout (counted from the server's start at the earliest)
    conn.execute("UPDATE agents SET last_heartbeat = now() - interval '1 hour'")
    run_pass(conn, Settings(agent_timeout=0.01), "test")
    run_pass(conn, Settings(agent_timeout=0.01), "test")
    assert ended(conn, notebook) == {"desired": "RUNNING", "state": "TERMINATED",
                                     "settled": True, "end_reason": "agent lost"}
    assert conn.execute("SELECT count(*) AS n FROM allocations WHERE job_id = %s",
                        (notebook,)).fetchone()["n"] == 1


def test_a_running_cluster_stops_an_idle_notebook_cleanly_within_the_timeout(det, conn) -> None:
    """End to end, with the reconciler and a process-runtime agent running and a real
    JupyterLab: a notebook with no kernel or terminal open (kernels_or_terminals) and
    ``idle_timeout: 20s`` is ended within idle_timeout + 10 s of its server answering (the
    issue's bound), its server shut down by its harness (exit 0, not a kill), the reason kept."""
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--id", "a1", "--slots", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM agents").fetchone(), 60, "the agent")
    notebook = task(conn, "NOTEBOOK", "idle_timeout: 20s\nresources: {slots: 0}")
    run = "SELECT address, state::text AS s, exit_code, ended_at - ({}) AS took FROM allocations"
    ready = "(SELECT last_activity FROM tasks)"
    wait_for(lambda: conn.execute(run.format(ready)).fetchone()["address"], 120,
             f"JupyterLab to answer:\n{det.log('agent')}")
    wait_for(lambda: conn.execute(run.format(ready)).fetchone()["s"] == "TERMINATED", 60,
             f"the idle notebook to end:\n{det.log('agent')}")
    got = conn.execute(run.format(ready)).fetchone()
    assert got["exit_code"] == 0, det.log("agent")
    print(f"ended {got['took'].total_seconds():.1f} s after the server answered")
    assert timedelta(seconds=20) <= got["took"] <= timedelta(seconds=30), got["took"]
    wait_for(lambda: ended(conn, notebook)["settled"], 30, "the pass to settle the run")
    assert ended(conn, notebook)["end_reason"] == "idle for 20s"
