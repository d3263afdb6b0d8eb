"""A planned stop is not a failure (issue 39, item 2): an agent's SIGTERM and `det cluster down`
checkpoint the running trials the way pause does, within a grace period, with no reconciler;
their runs end preempted, `restarts` counts only failures, and the trial resumes on `up`.

Before this, the agent SIGKILLed its tasks on SIGTERM: the run ended `-9 (agent shut down)`,
was settled as a failure, and with `max_restarts: 0` the trial went to ERROR.
"""

import json
import sys
import time
from pathlib import Path

import psycopg
import pytest
from conftest import Det, wait_for
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from test_cluster_up import local  # noqa: F401 (the fixture)
from test_reconciler import config, queue_runs

from det.agent.daemon import SHUTDOWN_RETRY_SECONDS, STOP_GRACE_SECONDS
from det.cli.supervisor import STOP_GRACE
from det.db import channels
from det.reconciler.trials import RunEnd, Settlement, settle

# A Core API trial of STEPS steps of STEP_SECONDS each, resuming from its latest checkpoint;
# on a stop request it checkpoints and exits 0 (as pause asks).
TRAIN = """
import os, sys, time
from det.harness import core
with core.init() as ctx:
    step = ctx.info.steps_completed
    print(f"resuming at {step}", flush=True)
    for op in ctx.searcher.operations():
        while step < op.length:
            time.sleep(float(os.environ.get("STEP_SECONDS", "0.05")))
            step += 1
            if step % 10 == 0:
                ctx.train.report_training_metrics(step, {"loss": 1.0 / step})
                op.report_progress(step)
            if ctx.preempt.should_preempt():
                with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
                    (path / "step").write_text(str(step))
                print(f"preempted at {step}", flush=True)
                sys.exit(0)
        with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
            (path / "step").write_text(str(step))
        op.report_completed(0.5)
"""


def train_config(tmp_path: Path, steps: int) -> tuple[Path, Path]:
    """An experiment of one TRAIN trial of ``steps`` batches, ``max_restarts: 0`` (every Core
    API example's), checkpoints under ``tmp_path/checkpoints``."""
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"""\
name: planned-stop
entrypoint: {sys.executable} train.py
searcher: {{name: single, metric: loss, max_length: {{batches: {steps}}}}}
checkpoint_storage: {{type: shared_fs, host_path: {tmp_path / 'checkpoints'}}}
max_restarts: 0
""")
    return cfg, ctx


def trained(conn) -> int:
    """The last training step trial 1 reported (0 before any)."""
    row = conn.execute("SELECT max(steps_completed) AS s FROM metrics WHERE trial_id = 1"
                       ).fetchone()
    return row["s"] or 0


def test_grace_fits_in_the_supervisors_stop_grace() -> None:
    """`det cluster down` waits for the supervisor, which SIGKILLs the agent STOP_GRACE after
    its SIGTERM: the agent's grace and its report of the ends must fit in it."""
    assert STOP_GRACE_SECONDS + SHUTDOWN_RETRY_SECONDS < STOP_GRACE


@pytest.mark.parametrize(("run", "expected"), [
    # a planned stop's run killed after the grace (-9), with no restart left: not a failure
    (RunEnd("ACTIVE", 0, 0, -9, "preempted: planned stop", stop_requested=True,
            open_op=True, planned_stop=True), Settlement("ACTIVE", 0, False)),
    # nor when the agent was lost before it could report the end
    (RunEnd("ACTIVE", 2, 5, None, "agent lost", stop_requested=True, open_op=True,
            planned_stop=True), Settlement("ACTIVE", 2, False)),
    (RunEnd("STOPPING_CANCELED", 0, 5, -9, None, stop_requested=True, planned_stop=True),
     Settlement("STOPPING_CANCELED", 0, False)),
    # a checkpointed clean exit: the trial resumes, not closed though its op is open
    (RunEnd("ACTIVE", 0, 0, 0, None, stop_requested=True, open_op=True, planned_stop=True),
     Settlement("ACTIVE", 0, False)),
])
def test_a_planned_stops_end_is_not_a_failure(run, expected) -> None:
    assert settle(run) == expected


def test_stop_runs_marks_the_agents_runs_and_wakes_their_tasks(conn, db_url) -> None:
    """det_agent.stop_runs, what the agent calls on SIGTERM: its live run becomes desired
    STOPPED and planned_stop, its task's channel is notified at once (no reconciler, no
    poll), the agent is stopping until it registers again, and other agents' runs are left."""
    conn.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    queue_runs(conn, 2)  # one placed on a1's slot, one waiting
    placed = conn.execute("SELECT id FROM allocations WHERE agent_id = 'a1'").fetchone()["id"]
    with psycopg.connect(db_url, autocommit=True) as listener:
        channels.listen(listener, channels.allocation(placed))
        ids = conn.execute("SELECT det_agent.stop_runs('a1') AS ids").fetchone()["ids"]
        woken = list(listener.notifies(timeout=5, stop_after=1))
    assert ids == [placed] and len(woken) == 1
    rows = conn.execute("SELECT id, desired_state::text AS d, planned_stop FROM allocations "
                        "ORDER BY id").fetchall()
    assert {r["id"]: (r["d"], r["planned_stop"]) for r in rows} == {
        placed: ("STOPPED", True),
        **{r["id"]: ("RUNNING", False) for r in rows if r["id"] != placed}}
    stopping = "SELECT stopping FROM agents WHERE id = 'a1'"
    assert conn.execute(stopping).fetchone()["stopping"]
    conn.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    assert not conn.execute(stopping).fetchone()["stopping"]


def test_sigterm_checkpoints_the_trial_without_a_reconciler(det, conn, tmp_path) -> None:
    """The agent's SIGTERM with no reconciler running: the task checkpoints and exits 0, the
    run ends preempted (planned stop); once a reconciler and an agent are back the trial
    resumes from that checkpoint and completes, 0 restarts."""
    cfg, ctx = train_config(tmp_path, 300)
    det("experiment", "create", str(cfg), str(ctx))
    reconciler = det.start("reconciler", "reconcile", "--interval", "0.5")
    agent = det.start("agent", "agent", "run", "--id", "a1", "--slots", "1")
    wait_for(lambda: trained(conn) >= 20, 120, "the trial to train 20 steps")
    reconciler.terminate()
    reconciler.wait(20)
    started = time.monotonic()
    agent.terminate()
    assert agent.wait(STOP_GRACE) == 0, det.log("agent")
    took = time.monotonic() - started
    run = conn.execute("SELECT exit_code, exit_reason, planned_stop, desired_state::text AS d "
                       "FROM allocations WHERE run = 1").fetchone()
    assert run == {"exit_code": 0, "planned_stop": True, "d": "STOPPED",
                   "exit_reason": "preempted: planned stop (agent a1 shut down), "
                                  "checkpointed and exited"}, det.log("agent")
    assert took < STOP_GRACE_SECONDS, f"the checkpoint took {took:.1f} s"
    ckpt = conn.execute("SELECT steps_completed FROM checkpoints").fetchone()["steps_completed"]
    assert ckpt >= 20
    assert conn.execute("SELECT stopping FROM agents WHERE id = 'a1'").fetchone()["stopping"]

    det.start("reconciler2", "reconcile", "--interval", "0.5")
    det.start("agent2", "agent", "run", "--id", "a1", "--slots", "1")
    r = det("experiment", "wait", "1", check=False, timeout=240)
    logs = det("trial", "logs", "1").stdout
    assert r.returncode == 0, r.stdout + logs
    trial = conn.execute("SELECT state::text AS s, restarts, runs FROM trials").fetchone()
    assert trial == {"s": "COMPLETED", "restarts": 0, "runs": 2}
    assert f"resuming at {ckpt}" in logs
    assert "a planned stop, not a failure" in logs


def test_a_task_that_ignores_the_stop_is_killed_after_the_grace_and_not_failed(
        det, conn, tmp_path) -> None:
    """A task that never checkpoints (a shell loop ignoring SIGTERM and the stop request) is
    killed STOP_GRACE_SECONDS after the agent's SIGTERM; its trial (max_restarts 0) is not
    failed: it stays ACTIVE with 0 restarts, ready for a new run."""
    det("experiment", "create", str(config(tmp_path, "trap '' TERM; echo started; "
                                                     "while :; do sleep 0.1; done",
                                           max_restarts="0")), str(tmp_path / "ctx"))
    agent = det.start("agent", "agent", "run", "--id", "a1", "--slots", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = 'a1'").fetchone(), 60,
             "the agent to register")
    det("reconcile", "--once")
    wait_for(lambda: "started" in det("trial", "logs", "1").stdout, 60, "the task to start")
    started = time.monotonic()
    agent.terminate()
    assert agent.wait(STOP_GRACE) == 0, det.log("agent")
    assert STOP_GRACE_SECONDS <= time.monotonic() - started < STOP_GRACE
    run = conn.execute("SELECT exit_code, exit_reason, planned_stop FROM allocations"
                       ).fetchone()
    assert run == {"exit_code": -9, "planned_stop": True,
                   "exit_reason": "preempted: planned stop (agent a1 shut down), killed "
                                  f"after the {STOP_GRACE_SECONDS:.0f} s grace"}
    det("reconcile", "--once")
    trial = conn.execute("SELECT state::text AS s, restarts FROM trials").fetchone()
    assert trial == {"s": "ACTIVE", "restarts": 0}
    # the next run waits: nothing is placed on the agent that stopped
    assert conn.execute("SELECT state::text AS s FROM allocations WHERE run = 2"
                        ).fetchone()["s"] == "PENDING"
    det("experiment", "kill", "1")


def test_drain_checkpoints_the_trial_and_it_resumes_on_another_agent(det, conn,
                                                                   tmp_path) -> None:
    """`det agent disable --drain a1`: its max_restarts 0 trial checkpoints and exits, and
    resumes on a2 from that checkpoint; 0 restarts."""
    cfg, ctx = train_config(tmp_path, 300)
    det("experiment", "create", str(cfg), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("a1", "agent", "run", "--id", "a1", "--slots", "1")
    wait_for(lambda: trained(conn) >= 20, 120, "the trial to train 20 steps")
    det.start("a2", "agent", "run", "--id", "a2", "--slots", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM agents WHERE id = 'a2'").fetchone(), 60,
             "a2 to register")
    out = det("agent", "disable", "--drain", "a1").stdout
    assert "1 run(s) asked to checkpoint and stop" in out
    r = det("experiment", "wait", "1", check=False, timeout=240)
    logs = det("trial", "logs", "1").stdout
    assert r.returncode == 0, r.stdout + logs
    runs = conn.execute("SELECT agent_id, exit_code, planned_stop FROM allocations "
                        "WHERE trial_id = 1 ORDER BY run").fetchall()
    assert [tuple(x.values()) for x in runs] == [("a1", 0, True), ("a2", 0, False)]
    assert conn.execute("SELECT restarts FROM trials").fetchone()["restarts"] == 0
    ckpt = conn.execute("SELECT min(steps_completed) AS s FROM checkpoints").fetchone()["s"]
    assert f"resuming at {ckpt}" in logs and ckpt >= 20


@pytest.mark.slow
def test_cluster_down_then_up_resumes_the_trial(local: Det, tmp_path) -> None:  # noqa: F811
    """Through the real CLI: a max_restarts 0 trial trains under `det cluster up`; `det
    cluster down` mid-training checkpoints it (within the supervisor's grace); after `det
    cluster up` it resumes from that checkpoint and completes with 0 restarts, its first run
    ended preempted by a planned stop."""
    cfg, ctx = train_config(tmp_path, 400)
    local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port", "0")
    local("experiment", "create", str(cfg), str(ctx))
    url = _owner_url(local)

    def steps() -> int:
        with psycopg.connect(url, row_factory=dict_row) as c:
            return trained(c)
    wait_for(lambda: steps() >= 20, 180, "the trial to train 20 steps")
    started = time.monotonic()
    local("cluster", "down", timeout=120)
    took = time.monotonic() - started
    assert took < STOP_GRACE + 5, f"`det cluster down` took {took:.0f} s"

    local("cluster", "up", "--runtime", "process", "--slots", "1", "--web-port", "0")
    r = local("experiment", "wait", "1", check=False, timeout=300)
    logs = local("trial", "logs", "1").stdout
    assert r.returncode == 0, r.stdout + r.stderr + logs
    with psycopg.connect(url, row_factory=dict_row) as c:
        trial = c.execute("SELECT state::text AS s, restarts FROM trials").fetchone()
        first = c.execute("SELECT exit_code, exit_reason, planned_stop FROM allocations "
                          "WHERE run = 1").fetchone()
        ckpt = c.execute("SELECT min(steps_completed) AS s FROM checkpoints").fetchone()["s"]
    assert trial == {"s": "COMPLETED", "restarts": 0}
    assert first["planned_stop"] and first["exit_code"] == 0, first
    assert first["exit_reason"].startswith("preempted: planned stop"), first
    assert f"resuming at {ckpt}" in logs and ckpt >= 20


def _owner_url(det: Det) -> str:
    """The embedded database's URL, from `det cluster status --json`."""
    return json.loads(det("cluster", "status", "--json").stdout)["database"]

