"""One reconciler pass: read the tables, decide, write the difference, in two transactions
(placement on freed slots first, then the rest: :func:`run_pass`).

The steps follow docs/architecture.md ("The reconciler pass"); their SQL is in
sql/reconciler.sql and their decisions in pure modules (trials, searchers,
scheduler). NOTIFYs are queued inside each transaction, so Postgres delivers them at its
commit.

No single object may fail the whole pass: the work on each run, experiment, pool and wake-up
is isolated (:mod:`det.reconciler.isolation`): a savepoint per object, or per batch of objects
with each isolated again when the batch fails.
"""

import logging
import math
from dataclasses import dataclass, field

import psycopg
from psycopg.types.json import Jsonb

from det.configs.storage_policy import stored_cluster_config
from det.db import channels
from det.reasons import EarlyExitReason
from det.reconciler import searchers, tasks
from det.reconciler.batch import Writes
from det.reconciler.contract import Result
from det.reconciler.isolation import isolated, isolated_each
from det.reconciler.placement import place
from det.reconciler.trials import RunEnd, settle
from det.sql import named

Q = named("reconciler")

log = logging.getLogger("det.reconciler")

# GC tasks that may fail (storage errors, kills) after a request to delete checkpoints before
# the reconciler stops starting new ones; the error then waits on the experiment.
GC_MAX_FAILURES = 3

GC_LIVE_BATCH_SECONDS = 30.0
"""Default of ``Settings.gc_batch``: how long (seconds) checkpoints a live experiment's policy
dropped wait for their GC task, so that one task removes what that many seconds of
checkpoints superseded: a task per checkpoint (one every few seconds under a short checkpoint
period) was a process start each. An ended or deleted experiment's GC task starts at once."""

FENCE_SECONDS = 10.0
"""How long (seconds) a lost agent's run keeps its trial from getting a new run
(allocations.fenced_until): the old process may still be alive on a frozen agent, and exits
once its token is revoked (the run ended) within the preemption watcher's poll,
``det.harness.transport.PREEMPT_POLL_SECONDS`` (5 s; tests/test_fencing.py keeps this
longer), so no two processes of one trial run at once."""

TASK_START_TIMEOUT = 120.0
"""Default of ``Settings.task_start_timeout``: seconds a notebook's, shell's or TensorBoard's
run may be RUNNING before its server answers (det_task.ready); then det ends it
(:func:`det.reconciler.tasks.unanswered_reason`). The task's harness gives up after as long
(det.harness.interactive.common.START_TIMEOUT_SECONDS); JupyterLab answers in seconds, and a
cold docker image's pull happens before RUNNING."""

TASK_STOP_GRACE = 20.0
"""Seconds an interactive task asked to stop (idle, or a planned stop: det_user.agent_drain) has
to exit before it is killed: its harness gives its server 10 s to shut down after SIGTERM
(det.harness.interactive.common.STOP_GRACE_SECONDS), and may hear of the stop only at its
5 s poll where the wake-up is lost."""


@dataclass
class Settings:
    """Reconciler settings. ``agent_timeout``: seconds without a heartbeat before an agent is
    lost; ``interval``: seconds between passes when nothing wakes the loop; ``lease``: seconds
    a frozen leader keeps leadership before the server ends its session
    (:mod:`det.reconciler.leader`); ``gc_batch``: seconds a live experiment's checkpoints
    wait to be removed together (:data:`GC_LIVE_BATCH_SECONDS`); ``task_start_timeout``:
    seconds an interactive task's server has to answer once its run runs
    (:data:`TASK_START_TIMEOUT`)."""

    agent_timeout: float = 30.0
    interval: float = 2.0
    lease: float = 10.0
    gc_batch: float = GC_LIVE_BATCH_SECONDS
    task_start_timeout: float = TASK_START_TIMEOUT


@dataclass
class PassResult(Result):
    """What a pass changed (:class:`~det.reconciler.contract.Result`), and whom it woke."""

    agents: set[str] = field(default_factory=set)
    allocations: set[int] = field(default_factory=set)
    """Runs to wake because their desired state changed (the task asks det_task.should_preempt)."""
    decided: set[int] = field(default_factory=set)
    """Runs to wake because the searcher read their trial's events: their next op (or none)
    is decided, which their task's ``det_task.current_op`` waits for (payload ``OP_DECIDED``)."""

    def add(self, other: "PassResult") -> None:
        """Count ``other``'s changes and wake-ups in this one's."""
        self.changes += other.changes
        self.agents |= other.agents
        self.allocations |= other.allocations
        self.decided |= other.decided


def prepare_session(conn: psycopg.Connection) -> None:
    """Set the planner costs of ``session_settings`` (sql/reconciler.sql) on ``conn``, the
    session that will run passes (the setting lasts as long as the session)."""
    conn.execute(Q.session_settings)


def run_pass(conn: psycopg.Connection, settings: Settings, holder: str) -> PassResult:
    """Run one pass on ``conn`` (the leader's connection, :func:`prepare_session`'d), in two
    transactions:

    1. lost agents, slots freed by ended runs, what users asked of experiments (pause,
       activate, stop: applied before placement, so a paused experiment's waiting run is not
       placed), and placement of the runs already waiting, committed at once so that the
       agents hear of their new runs while the rest of the pass goes on (settling
       and searching took ~40 ms of a slot's cycle before its next run was placed);
    2. everything else (docs/architecture.md, "The reconciler pass"), then placement again
       where it created runs, so that a new run is placed in the pass that created it.

    Either transaction, replayed or cut short, leaves what the next pass carries on from.
    Returns what changed; a pass that changed nothing means the cluster has converged.
    """
    freed, r = PassResult(), PassResult()
    with conn.transaction():
        _agents(conn, settings, freed)
        _experiment_states(conn, freed)
        _place(conn, freed)
        _wake(conn, freed)
    with conn.transaction():
        _settle(conn, r)
        _tasks(conn, settings, r)
        _finish_closed_trials(conn, r)
        _search(conn, r)
        _finish_closed_trials(conn, r)
        _finish_stopping_trials(conn, r)
        _finish_experiments(conn, r)
        _checkpoint_gc_live(conn, r)
        _checkpoint_gc_tasks(conn, settings, r)
        created = conn.execute(Q.create_allocations).rowcount
        r.changes += created
        if created:
            _place(conn, r)
        _wake(conn, r)
        conn.execute(Q.record_pass, {"holder": holder, "agent_timeout": settings.agent_timeout})
    r.add(freed)
    return r


def _wake(conn: psycopg.Connection, r: PassResult) -> None:
    """NOTIFY the agents and runs ``r`` touched (delivered at the transaction's commit)."""
    wake = [(channels.agent(a), "") for a in sorted(r.agents)]
    wake += [(channels.allocation(a), "") for a in sorted(r.allocations)]
    wake += [(channels.allocation(a), channels.OP_DECIDED)
             for a in sorted(r.decided - r.allocations)]
    isolated_each(conn, wake, lambda w: f"wake {w[0]}",
                  lambda w: channels.notify(conn, w[0], w[1]))


def _agents(conn: psycopg.Connection, settings: Settings, r: PassResult) -> None:
    lost = conn.execute(Q.expire_agents, {"timeout": settings.agent_timeout}).fetchall()
    for row in lost:
        log.warning("agent %s lost: no heartbeat for %.0f s", row["id"], settings.agent_timeout)
    ended = conn.execute(Q.end_lost_allocations, {"fence": FENCE_SECONDS}).fetchall()
    # Woken, a task of a frozen agent finds its token revoked and exits now, not at its poll.
    r.allocations.update(row["id"] for row in ended)
    r.changes += len(lost) + len(ended) + conn.execute(Q.release_slots).rowcount


def _settle(conn: psycopg.Connection, r: PassResult) -> None:
    runs = conn.execute(Q.unsettled_runs).fetchall()
    writes = Writes([Q.update_settled_trials, Q.insert_searcher_events, Q.mark_settled,
                     Q.pause_for_storage_error, Q.log_decisions])
    isolated_each(conn, runs, lambda run: f"settling allocation {run['allocation_id']}",
                  lambda run: _settle_one(writes, run),
                  lambda run, msg: conn.execute(Q.settle_failed, {**run, "message": msg}),
                  writes)
    r.changes += len(runs)


def _tasks(conn: psycopg.Connection, settings: Settings, r: PassResult) -> None:
    """Interactive tasks: settle their ended runs (each ends once, never
    restarted), stop the idle and the unanswering ones (:mod:`det.reconciler.tasks`), and
    kill those asked to stop :data:`TASK_STOP_GRACE` seconds ago. Failing, it is logged and
    the rest of the pass goes on."""
    done = PassResult()

    def work() -> None:
        done.changes = conn.execute(Q.settle_task_runs).fetchone()["n"]
        runs = conn.execute(Q.live_task_runs).fetchall()
        timeout = (stored_cluster_config(conn).tensorboard_timeout
                   if any(run["type"] == "TENSORBOARD" for run in runs) else math.inf)
        ends = {}
        for run in runs:
            reason = tasks.end_reason(
                tasks.TaskRun(run["type"], run["idle_timeout"], run["last_activity"],
                              run["running_at"], run["address"]),
                run["now"], tensorboard_timeout=timeout,
                start_timeout=settings.task_start_timeout)
            if reason is not None:
                ends[run["id"]] = reason
        woken = []
        if ends:
            woken = conn.execute(Q.end_tasks, {"id": list(ends),
                                               "reason": list(ends.values())}).fetchall()
        woken += conn.execute(Q.kill_overdue_tasks, {"grace": TASK_STOP_GRACE}).fetchall()
        done.allocations = {row["id"] for row in woken}
        done.agents = {row["agent_id"] for row in woken if row["agent_id"]}
        done.changes += len(woken)

    if isolated(conn, "interactive tasks", work):
        r.add(done)


def _settle_one(writes: Writes, run: dict) -> None:
    s = settle(RunEnd(run["trial_state"], run["restarts"], run["max_restarts"],
                      run["exit_code"], run["exit_reason"], run["stop_requested"],
                      run["open_op"], run["out_of_work"], run["planned_stop"],
                      run["storage_error"]))
    writes.add(Q.update_settled_trials, trial_id=run["trial_id"], state=s.state,
               restarts=s.restarts, close=s.close)
    writes.add(Q.mark_settled, allocation_id=run["allocation_id"])
    if s.pause_experiment:
        writes.add(Q.pause_for_storage_error, experiment_id=run["experiment_id"],
                   reason=f"trial {run['trial_id']}: {run['storage_error']}")
    how = f"exit code {run['exit_code']}" if run["exit_code"] is not None else "no exit code"
    reason = f" ({run['exit_reason']})" if run["exit_reason"] else ""
    then = ""
    if s.state == "ERROR":
        _event(writes, run, "trial_exited_early", {"reason": EarlyExitReason.ERRORED})
        plural = "" if s.restarts == 1 else "s"
        then = f"; trial failed after {s.restarts} restart{plural}"
    elif s.close:
        then = "; the trial's code finished its own training, so the trial is done"
    elif s.failed and not s.state.startswith("STOPPING_"):
        then = f"; restarting from the latest checkpoint ({s.restarts}/{run['max_restarts']})"
    elif s.pause_experiment:
        then = ("; a checkpoint storage error, not retried: the experiment is paused (fix the "
                "storage, then `det experiment activate`)")
    elif run["planned_stop"]:
        then = "; a planned stop, not a failure: a new run resumes from the latest checkpoint"
    elif run["open_op"] and not run["stop_requested"]:
        then = "; the searcher has new work for it: a new run resumes from its checkpoint"
    _log_decision(writes, run, f"run ended with {how}{reason}{then}")


def _event(writes: Writes, row: dict, kind: str, payload: dict) -> None:
    writes.add(Q.insert_searcher_events, experiment_id=row["experiment_id"],
               trial_id=row["trial_id"], kind=kind, payload=Jsonb(payload))


def _log_decision(writes: Writes, row: dict, line: str) -> None:
    writes.add(Q.log_decisions, allocation_id=row["allocation_id"], trial_id=row["trial_id"],
               line=line)


def _experiment_states(conn: psycopg.Connection, r: PassResult) -> None:
    for stmt in (Q.pause_trials, Q.activate_trials, Q.stop_trials):
        r.changes += conn.execute(stmt).rowcount
    for stmt in (Q.escalate_desired, Q.kill_overdue):
        for row in conn.execute(stmt).fetchall():
            r.allocations.add(row["id"])
            if row["agent_id"]:
                r.agents.add(row["agent_id"])
            r.changes += 1
    r.changes += conn.execute(Q.end_unstarted).rowcount


def _finish_closed_trials(conn: psycopg.Connection, r: PassResult) -> None:
    writes = Writes([Q.insert_searcher_events])
    for row in conn.execute(Q.finish_closed_trials).fetchall():
        reason = row["exit_reason"]
        if reason in (EarlyExitReason.INVALID_HP, EarlyExitReason.ERRORED):
            _event(writes, row, "trial_exited_early", {"reason": reason})
        else:
            _event(writes, row, "trial_exited", {})
        r.changes += 1
    writes.flush(conn)


def _search(conn: psycopg.Connection, r: PassResult) -> None:
    exps = conn.execute(Q.experiments_to_search).fetchall()
    writes = Writes([Q.create_trials, Q.add_ops, Q.close_trials, Q.save_searchers,
                     Q.consume_events])
    # A searcher that cannot go on ends its experiment; other experiments carry on.
    isolated_each(conn, exps, lambda exp: f"experiment {exp['id']}: searcher",
                  lambda exp: _search_one(writes, exp, exp["events"]),
                  lambda exp, _msg: conn.execute(Q.shutdown_experiments, {
                      "experiment_id": [exp["id"]], "state": ["STOPPING_ERROR"]}),
                  writes)
    r.changes += len(exps)
    events = [v["id"] for exp in exps for v in exp["events"]]
    if events:
        r.decided.update(row["id"] for row in conn.execute(Q.decided_runs, {"ids": events}))


def _finish_stopping_trials(conn: psycopg.Connection, r: PassResult) -> None:
    writes = Writes([Q.insert_searcher_events, Q.log_decisions])
    for row in conn.execute(Q.finish_stopping_trials).fetchall():
        if row["state"] == "ERROR":
            _event(writes, row, "trial_exited_early", {"reason": EarlyExitReason.ERRORED})
        else:
            _event(writes, row, "trial_exited", {})
        if row["allocation_id"] is not None:
            _log_decision(writes, row, f"trial {row['state'].lower()}")
        r.changes += 1
    writes.flush(conn)


def _finish_experiments(conn: psycopg.Connection, r: PassResult) -> None:
    """End the experiments whose trials are all done, set their progress to what they
    trained (searchers.ended_progress), and apply the checkpoint GC policy of each one that
    has checkpoints in the same transaction (Determined 0.38's checkpoint GC rule: GC runs when an
    experiment
    ends; one with none has nothing to apply it to)."""
    ended = conn.execute(Q.finish_experiments).fetchall()
    isolated_each(conn, ended, lambda row: f"experiment {row['id']}: progress",
                  lambda row: conn.execute(Q.set_progress, {
                      "experiment_id": row["id"], "progress": searchers.ended_progress(
                          row["config"], row["searcher_state"], row["trained"])}))
    _apply_gc_policy(conn, [row["id"] for row in ended if row["has_checkpoints"]])
    r.changes += len(ended)


def _checkpoint_gc_live(conn: psycopg.Connection, r: PassResult) -> None:
    """Apply the checkpoint GC policy of each live experiment that has checkpoints new since
    the last look (checkpoints superseded during a run are collected then, not only
    at the experiment's end). Only those experiments are looked at, so a pass with no new
    checkpoint costs one index probe. Each live trial's restart point is pinned
    (checkpoint_pins), so no run loses the checkpoint it resumes from."""
    live = [row["id"] for row in conn.execute(Q.live_experiments_with_new_checkpoints)]
    _apply_gc_policy(conn, live)
    r.changes += len(live)


def _apply_gc_policy(conn: psycopg.Connection, experiment_ids: list[int]) -> None:
    """det_internal.checkpoint_gc for each experiment, one failing (say, on a malformed checkpoint)
    recorded on it as its GC error without failing the others."""
    isolated_each(conn, experiment_ids, lambda eid: f"experiment {eid}: checkpoint GC",
                  lambda eid: conn.execute(Q.checkpoint_gc, {"experiment_id": eid}),
                  lambda eid, msg: conn.execute(Q.gc_decision_failed,
                                                {"experiment_id": eid, "message": msg}))


def _checkpoint_gc_tasks(conn: psycopg.Connection, settings: Settings, r: PassResult) -> None:
    """Settle ended GC tasks, start one per experiment (never two at once: each removes all
    that is DELETING then) where checkpoints wait to be removed, and remove the rows of
    deleted experiments whose files are gone."""
    r.changes += conn.execute(Q.settle_gc_runs).fetchone()["n"]
    r.changes += conn.execute(Q.create_gc_tasks, {"max_failures": GC_MAX_FAILURES,
                                                  "live_batch": settings.gc_batch}).rowcount
    for row in conn.execute(Q.experiments_to_purge).fetchall():
        eid = row["id"]
        gone: list[bool] = []
        isolated(conn, f"experiment {eid}: delete",
                 lambda eid=eid, gone=gone: gone.append(conn.execute(
                     Q.purge_experiment, {"experiment_id": eid}).fetchone()["gone"]),
                 lambda msg, eid=eid: conn.execute(Q.gc_decision_failed,
                                                   {"experiment_id": eid, "message": msg}))
        r.changes += sum(gone)


def _search_one(writes: Writes, exp: dict, events: list[dict]) -> None:
    stored = exp["searcher_state"]
    if stored is not None:
        stored = {**stored, "rng": exp["searcher_rng"]}
    state, actions = searchers.searcher_step(
        exp["config"], stored, [_to_event(v) for v in events])
    rng = state.pop("rng")
    eid = exp["id"]
    if not actions and state == exp["searcher_state"] and rng == exp["searcher_rng"]:
        # The events meant nothing to this searcher (a validation report where the op's
        # completion is the result): consume them, and leave the experiment's row alone.
        for v in events:
            writes.add(Q.consume_events, id=v["id"])
        return
    outcome = None
    for a in actions:
        match a:
            case searchers.Create():
                writes.add(Q.create_trials, experiment_id=eid, request_id=a.request_id,
                           hparams=Jsonb(a.hparams), seed=a.seed)
            case searchers.ValidateAfter():
                writes.add(Q.add_ops, experiment_id=eid, request_id=a.request_id,
                           length=a.length)
            case searchers.Close():
                writes.add(Q.close_trials, experiment_id=eid, request_id=a.request_id)
            case searchers.Shutdown():
                outcome = ("STOPPING_ERROR" if a.failure else
                           "STOPPING_CANCELED" if a.cancel else "STOPPING_COMPLETED")
    writes.add(Q.save_searchers, experiment_id=eid, state=Jsonb(state),
               rng=None if rng == exp["searcher_rng"] else Jsonb(rng), progress=min(
        1.0, max(0.0, searchers.searcher_progress(exp["config"], state))), outcome=outcome)
    for v in events:
        writes.add(Q.consume_events, id=v["id"])


def _to_event(row: dict) -> searchers.Event:
    p = row["payload"]
    match row["kind"]:
        case "validation_completed":
            # An op completed without a metric (det_task.complete_op's NULL) ranks worst, as
            # NaN does.
            metric = math.nan if p["metric"] is None else float(p["metric"])
            return searchers.ValidationCompleted(row["request_id"], p["length"], metric)
        case "validation_reported":
            return searchers.ValidationReported(row["request_id"], row["values"])
        case "trial_exited":
            return searchers.TrialExited(row["request_id"])
        case _:
            return searchers.TrialExitedEarly(row["request_id"], p["reason"])


def _place(conn: psycopg.Connection, r: PassResult) -> None:
    changes, agents, allocs = place(conn)
    r.changes += changes
    r.agents |= agents
    r.allocations |= allocs
