"""Fencing, the agent's and the reconciler's side (issue 39, item 3): a run is re-placed only
once its old process can no longer act.

* An agent that cannot heartbeat for its lease (two thirds of the reconciler's agent timeout,
  which it reads from the database) kills its own tasks before that timeout expires.
* A frozen agent cannot: its task lives on until its preemption watcher finds its token
  revoked. So the reconciler holds the trial's next run for FENCE_SECONDS after it ended the
  lost agent's run, and no two processes of one trial run at any instant.
"""

import os
import signal
import sys
import threading
import time

import psutil
import psycopg
import pytest
from conftest import Det, private_env, processes, wait_for
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from test_reconciler import config

from det.harness.storage import STAGING
from det.harness.transport import PREEMPT_POLL_SECONDS
from det.reconciler.passes import FENCE_SECONDS

SLEEPER = ["sleep", "617"]


def test_the_fence_outlasts_the_watchers_poll() -> None:
    assert FENCE_SECONDS > PREEMPT_POLL_SECONDS + 2


def test_an_agent_that_cannot_heartbeat_kills_its_tasks_before_its_timeout(
        private_pg, det_env, tmp_path) -> None:
    """The database goes away (for this agent it is the same as a partition): the agent kills
    its task within its lease, before the reconciler's agent timeout (6 s here) could have
    declared it lost and placed the run elsewhere; once back, it reports why, and the trial
    spends no restart on it."""
    det = Det(private_env(det_env, private_pg.url), tmp_path)
    try:
        det("experiment", "create", str(config(tmp_path, " ".join(SLEEPER))),
            str(tmp_path / "ctx"))
        det("reconcile", "--once", "--agent-timeout", "6")  # records the timeout
        det.start("agent", "agent", "run", "--id", "a1", "--slots", "1", "--cold-start")
        with psycopg.connect(private_pg.url, autocommit=True) as c:
            wait_for(lambda: c.execute("SELECT 1 FROM agents").fetchone(), 60, "the agent")
        det("reconcile", "--once", "--agent-timeout", "6")
        wait_for(lambda: processes(SLEEPER), 60, "the task to start")
        private_pg.stop()
        stopped = time.monotonic()
        wait_for(lambda: not processes(SLEEPER), 10, "the agent to kill its task")
        took = time.monotonic() - stopped
        assert took < 6.0, f"the task ran on {took:.1f} s without a heartbeat"
        private_pg.start()
        with psycopg.connect(private_pg.url, autocommit=True, row_factory=dict_row) as c:
            wait_for(lambda: c.execute("SELECT 1 FROM allocations WHERE state = 'TERMINATED'"
                                       ).fetchone(), 60, "the end to be reported")
            run = c.execute("SELECT exit_code, exit_reason, planned_stop "
                            "FROM allocations").fetchone()
        assert run["exit_code"] == -9
        assert run["exit_reason"].startswith("self-fenced: agent a1 could not heartbeat for")
        assert "agent timeout is 6 s" in run["exit_reason"]
        # The cluster's doing, not the trial's: no restart is spent on it.
        assert run["planned_stop"]
        det("reconcile", "--once", "--agent-timeout", "6")
        with psycopg.connect(private_pg.url, autocommit=True, row_factory=dict_row) as c:
            trial = c.execute("SELECT state, restarts FROM trials").fetchone()
        assert trial == {"state": "ACTIVE", "restarts": 0}
    finally:
        det.stop_all()
        for pid in processes(SLEEPER):
            os.kill(pid, signal.SIGKILL)


# Trains steps of 0.05 s, checkpointing at step 20 and then every 200 steps, and reporting
# nothing else (a task that talks to the platform rarely: only its preemption watcher's poll
# finds its token revoked), resuming from its latest checkpoint.
SILENT = """
import os, time
from det.harness import core
HOLD = globals().get("HOLD")  # a file the first run waits for after its first checkpoint
with core.init() as ctx:
    step = ctx.info.steps_completed
    for op in ctx.searcher.operations():
        while step < op.length:
            time.sleep(0.05)
            step += 1
            while step == 21 and HOLD and not os.path.exists(HOLD):
                time.sleep(0.05)
            if step == 20 or step % 200 == 0:
                with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                    (path / "weights").write_text("w" * 1000)
        op.report_completed(0.5)
"""


def trial_processes(dbname: str) -> list[psutil.Process]:
    """Live (not zombie) processes of trial 1 of the test's database (by their environment:
    the agents start their tasks cold, so each is an exec with its own)."""
    found = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get("DET_TRIAL_ID") == "1" and "DET_DB_URL" in env \
                    and conninfo_to_dict(env["DET_DB_URL"]).get("dbname") == dbname \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def agent_of(p: psutil.Process) -> str | None:
    """The agent id in a task process's environment (None once the process is gone)."""
    try:
        return p.environ().get("DET_AGENT_ID")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@pytest.mark.slow
def test_a_frozen_agents_run_is_replaced_only_once_its_process_is_gone(
        det, conn, db_url, tmp_path) -> None:
    """Agent a1 is SIGSTOPped past the reconciler's agent timeout (4 s) with a2 beside it:
    sampled every ~100 ms, at no instant do two processes of the trial run; the trial
    completes on a2, and every checkpoint directory has its row. The first run holds after its
    first checkpoint until a1 is frozen: on a loaded host (CI, three workers) a2's start took
    longer than the whole training, and a1 was frozen with nothing running."""
    storage = tmp_path / "checkpoints"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    hold = tmp_path / "go"  # run 1 waits after its first checkpoint until a1 is frozen
    (ctx / "train.py").write_text(f"HOLD = {str(hold)!r}\n{SILENT}")
    cfg = tmp_path / "silent.yaml"
    cfg.write_text(f"""\
name: silent
entrypoint: {sys.executable} train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 600}}}}
checkpoint_storage: {{type: shared_fs, host_path: {storage}}}
max_restarts: 1
""")
    det("experiment", "create", str(cfg), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.5", "--agent-timeout", "4")
    a1 = det.start("a1", "agent", "run", "--id", "a1", "--slots", "1", "--cold-start")
    wait_for(lambda: conn.execute("SELECT 1 FROM checkpoints").fetchone(), 120,
             "the first run's first checkpoint")
    det.start("a2", "agent", "run", "--id", "a2", "--slots", "1", "--cold-start")
    wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = 'a2'").fetchone(), 60,
             "a2 to register")

    dbname = conninfo_to_dict(db_url)["dbname"]
    most: list[tuple[int, list[str]]] = []
    a1_seen = []  # when a sample last saw a1's task (epoch seconds)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            seen = trial_processes(dbname)
            names = [f"{p.pid} {agent_of(p)}" for p in seen]
            most.append((len(seen), names))
            if any(n.endswith(" a1") for n in names):
                a1_seen.append(time.time())

    sampler = threading.Thread(target=sample, daemon=True)
    # the premise: a1's task runs (it holds until the freeze) when a1 is frozen
    wait_for(lambda: any(agent_of(p) == "a1" for p in trial_processes(dbname)), 60,
             "a1's task to be found by its environment")
    a1.send_signal(signal.SIGSTOP)
    hold.touch()
    sampler.start()
    try:
        r = det("experiment", "wait", "1", check=False, timeout=240)
    finally:
        done.set()
        sampler.join()
        a1.send_signal(signal.SIGCONT)
    assert r.returncode == 0, r.stdout + det("trial", "logs", "1").stdout
    runs = conn.execute("SELECT run, agent_id, exit_reason, fenced_until IS NOT NULL AS fenced "
                        "FROM allocations WHERE trial_id = 1 ORDER BY run").fetchall()
    assert [(x["run"], x["agent_id"], x["exit_reason"], x["fenced"]) for x in runs] == [
        (1, "a1", "agent lost", True), (2, "a2", None, False)], runs
    twice = [s for s in most if s[0] > 1]
    assert twice == [], f"two processes of the trial at once: {twice[:3]}"
    assert max(n for n, _ in most) == 1 and len(most) > 50
    rows = {r["uuid"] for r in conn.execute("SELECT uuid::text FROM checkpoints")}
    left = {d.name for d in storage.iterdir() if d.is_dir()} - rows - {"tensorboard", STAGING}
    assert left == set(), f"checkpoint directories without a row: {left}"
    staged = list((storage / STAGING).iterdir()) if (storage / STAGING).exists() else []
    assert staged == [], "a fenced run's staged checkpoint was left behind"
    # The figure (not a bound): the pass that ends the lost agent's run wakes its task.
    (ended,) = conn.execute("SELECT extract(epoch FROM ended_at) FROM allocations "
                            "WHERE trial_id = 1 AND run = 1").fetchone().values()
    if a1_seen:  # a sweep of every process's environment takes seconds on a loaded host
        print(f"a1's task exited {max(a1_seen) - float(ended):.2f} s after its run was ended "
              f"(fence {FENCE_SECONDS:.0f} s, watcher poll {PREEMPT_POLL_SECONDS:.0f} s)")



@pytest.mark.slow
def test_an_agent_started_before_the_reconciler_learns_a_short_timeout_in_time(
        det, conn) -> None:
    """An agent that beat before any reconciler recorded its agent timeout beats every second
    until one has: with its 5 s interval it learnt a reconciler's 3 s timeout only at its next
    beat, and was declared lost first (as a1 was in a CI run of the frozen-agent test)."""
    det.start("a1", "agent", "run", "--id", "a1", "--slots", "0")
    wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = 'a1'").fetchone(), 60,
             "a1 to register")
    det.start("reconciler", "reconcile", "--interval", "0.3", "--agent-timeout", "3")
    wait_for(lambda: conn.execute("SELECT 1 FROM reconciler_leader WHERE agent_timeout = 3"
                                  ).fetchone(), 60, "the reconciler's first pass")
    time.sleep(7)  # past two timeouts of 3 s
    assert "lost" not in det.log("reconciler")
    assert conn.execute("SELECT state::text FROM agents WHERE id = 'a1'").fetchone() == {
        "state": "ACTIVE"}


def test_after_a_database_restart_agents_get_the_timeout_to_heartbeat_again(
        private_pg, det_env, tmp_path) -> None:
    """A long outage leaves every heartbeat old: the first pass after the server's restart
    does not declare every agent lost at once; silence counts from the server's start."""
    det = Det(private_env(det_env, private_pg.url), tmp_path)
    with psycopg.connect(private_pg.url, autocommit=True) as c:
        c.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', '[]')")
        c.execute("UPDATE agents SET last_heartbeat = now() - interval '1 hour'")
    private_pg.restart()
    restarted = time.monotonic()
    # A timeout that a pass started on a loaded machine is still inside (a 5 s one was not,
    # once: the pass's own start took longer), far below the heartbeat's hour of age.
    det("reconcile", "--once", "--agent-timeout", "60")

    def agent_state() -> str:
        with psycopg.connect(private_pg.url) as c:
            return c.execute("SELECT state::text FROM agents").fetchone()[0]
    assert agent_state() == "ACTIVE"
    time.sleep(max(0.0, 2.5 - (time.monotonic() - restarted)))
    det("reconcile", "--once", "--agent-timeout", "2")
    assert agent_state() == "LOST"
