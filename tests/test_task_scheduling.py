"""Interactive tasks in the queue (issue 33), at the level of the pass and placement with real
rows: agents registered with their slots, tasks and experiments submitted as the CLI does,
and an agent played by the test (it claims what is assigned to it, reports it running, and
reports the runs told to stop as ended). No processes: what is checked is what the pass
decides and writes.

The seed's rules (shared/spec/introduction-and-features.txt, "Task Priority", "Resource
Pools"): slot tasks go to the default compute pool, zero-slot tasks to the default auxiliary
pool, at most ``max_aux_containers_per_agent`` a agent; zero-slot tasks start first come,
first served under fair share and by priority under the priority scheduler; interactive tasks
are never preempted, and a new priority has no effect on one already running.
"""

import pytest
from psycopg.types.json import Jsonb

from det.configs import load_experiment_config
from det.configs.cluster import load_cluster_config
from det.reconciler.passes import Settings, run_pass
from det.submission import expand_task_config, submit_task

RUNNING = """
SELECT a.job_id, sum(a.slots_needed)::integer AS slots, count(*)::integer AS runs
  FROM allocations a
 WHERE a.state BETWEEN 'ASSIGNED' AND 'RUNNING' AND a.desired_state = 'RUNNING'
 GROUP BY a.job_id
"""


def apply_cluster(conn, text: str) -> None:
    """Apply a cluster config as ``det cluster config apply`` does."""
    cfg = load_cluster_config(text)
    conn.execute("SELECT det_user.apply_cluster_config(%s, %s)",
                 (Jsonb(cfg.model_dump(mode="json")), text))


def register(conn, agent: str, slots: int, pool: str = "default") -> None:
    """Register ``agent`` in ``pool`` with ``slots`` CPU slots, as an agent does on start."""
    conn.execute("SELECT det_agent.register(%s, 'h', %s, 'process', %s)",
                 (agent, pool, Jsonb([{"slot_id": i, "type": "cpu"} for i in range(slots)])))


def experiment(conn, name: str, *, slots: int = 1, trials: int = 1, priority: int = 42) -> int:
    """Submit an experiment of ``trials`` concurrent trials of ``slots`` slots; its job id."""
    cfg = load_experiment_config(
        f"name: {name}\nentrypoint: 'true'\n"
        f"searcher: {{name: random, metric: loss, max_trials: {trials}, "
        f"max_concurrent_trials: {trials}, max_length: {{batches: 1000}}}}\n"
        f"resources: {{slots_per_trial: {slots}, priority: {priority}}}\n").expanded()
    eid = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                       (Jsonb(cfg),)).fetchone()["id"]
    return conn.execute("SELECT job_id FROM experiments WHERE id = %s", (eid,)).fetchone()[
        "job_id"]


def task(conn, kind: str, text: str = "", workspace: str | None = None, **kw) -> int:
    """Submit a task of ``kind`` (config YAML ``text``) through det.submission, as `det
    notebook start` does; its job id."""
    entrypoint = ["sleep", "600"] if kind == "COMMAND" else None
    expanded = expand_task_config(conn, kind, text, "test", workspace=workspace,
                                  entrypoint=entrypoint)
    return submit_task(conn, kind, expanded, workspace=workspace, force=True, **kw)


def play_agent(conn, agent: str) -> int:
    """One wake-up of ``agent`` as the test plays it: its new runs are claimed and reported
    RUNNING; its runs told to stop end (a trial's checkpoints and exits 0 when asked to stop;
    a kill's exits -9). Returns how many runs it changed."""
    started = [r["id"] for r in conn.execute(
        "SELECT id FROM allocations WHERE agent_id = %s AND state = 'ASSIGNED' "
        "AND desired_state = 'RUNNING'", (agent,))]
    if started:
        conn.execute("SELECT * FROM det_agent.claim_each(%s, %s)", (agent, started))
        conn.execute("SELECT det_agent.report_each(%s, %s, 'RUNNING')", (agent, started))
    stopped = conn.execute(
        "SELECT id, desired_state = 'KILLED' AS killed FROM allocations "
        "WHERE agent_id = %s AND state <> 'TERMINATED' AND desired_state <> 'RUNNING'",
        (agent,)).fetchall()
    for row in stopped:
        conn.execute("SELECT det_agent.report(%s, %s, 'TERMINATED', %s, %s)",
                     (agent, row["id"], -9 if row["killed"] else 0,
                      "killed" if row["killed"] else "preempted: checkpointed and exited"))
    return len(started) + len(stopped)


def converge(conn, agents: tuple[str, ...] = ("a1",), settings: Settings | None = None) -> None:
    """Run passes and play the agents until nothing changes."""
    for _ in range(30):
        changed = run_pass(conn, settings or Settings(), "test").changes
        for agent in agents:
            changed += play_agent(conn, agent)
        if not changed:
            return
    raise AssertionError("the pass and the agents did not settle in 30 rounds")


def running(conn) -> dict[int, int]:
    """Slots held per job by runs placed and still wanted."""
    return {r["job_id"]: r["slots"] for r in conn.execute(RUNNING)}


def reason(conn, job: int) -> str | None:
    return conn.execute("SELECT pending_reason FROM allocations WHERE job_id = %s "
                        "AND state = 'PENDING' ORDER BY id LIMIT 1", (job,)).fetchone()[
        "pending_reason"]


# min_run_time 0: the example's runs are preempted in the pass after they start, with no
# checkpoint (issue 34's protection of such runs is tests/test_preemption_waste.py's)
PRIORITY = ("resource_manager:\n  scheduler: {type: priority, preemption: true, min_run_time: 0}\n"
            "resource_pools:\n  - pool_name: default\n")


def test_the_seeds_seven_step_task_priority_example(conn) -> None:
    """The seed's Task Priority example (preemption on, 8 slots), step by step, with real rows:
    the pure scheduler test (test_schedulers) plays the same steps over plain data."""
    apply_cluster(conn, PRIORITY)
    register(conn, "a1", 8)
    # 1. A priority-2 ASHA-like experiment of 20 concurrent one-slot trials: 8 run.
    asha = experiment(conn, "asha", trials=20, priority=2)
    converge(conn)
    assert running(conn) == {asha: 8}
    # 2. A priority-1 distributed experiment of 4 slots: 4 ASHA trials are preempted.
    dist1 = experiment(conn, "dist1", slots=4, priority=1)
    converge(conn)
    assert running(conn) == {asha: 4, dist1: 4}
    # 3. A priority-3 one-slot notebook waits: the two experiments use all 8 slots.
    notebook = task(conn, "NOTEBOOK", "resources: {slots: 1, priority: 3}")
    converge(conn)
    assert running(conn) == {asha: 4, dist1: 4}
    assert "behind" in reason(conn, notebook)
    # 4. Both experiments end: the notebook runs.
    for job in (asha, dist1):
        conn.execute("SELECT det_user.experiment_action(id, 'kill') FROM experiments "
                     "WHERE job_id = %s", (job,))
    converge(conn)
    assert running(conn) == {notebook: 1}
    # 5. A priority-1 experiment of 8 slots cannot run: the notebook is never preempted.
    dist8 = experiment(conn, "dist8", slots=8, priority=1)
    converge(conn)
    assert running(conn) == {notebook: 1}
    assert f"slots are held by job {notebook}" in reason(conn, dist8)
    # 6. A priority-2 experiment of 4 slots is backfilled onto the 7 idle slots.
    dist2 = experiment(conn, "dist2", slots=4, priority=2)
    converge(conn)
    assert running(conn) == {notebook: 1, dist2: 4}
    # 7. The notebook is killed: the priority-2 experiment is preempted, priority 1 runs ...
    conn.execute("SELECT det_user.task_kill(%s)", (notebook,))
    converge(conn)
    assert running(conn) == {dist8: 8}
    preempted = conn.execute(
        "SELECT a.exit_code, t.state::text AS s FROM allocations a JOIN trials t "
        "ON t.id = a.trial_id JOIN experiments e ON e.id = t.experiment_id "
        "WHERE e.job_id = %s AND a.state = 'TERMINATED'", (dist2,)).fetchall()
    assert preempted == [{"exit_code": 0, "s": "ACTIVE"}]
    # ... and once that experiment is done, the priority-2 experiment runs again.
    conn.execute("SELECT det_user.experiment_action(id, 'kill') FROM experiments WHERE job_id = %s",
                 (dist8,))
    converge(conn)
    assert running(conn) == {dist2: 4}
    ended = conn.execute("SELECT end_reason, (SELECT settled FROM allocations a "
                         "WHERE a.job_id = k.job_id) FROM tasks k").fetchone()
    assert ended == {"end_reason": "killed by " + conn.info.user, "settled": True}


def test_slot_tasks_go_to_the_compute_pool_zero_slot_tasks_to_the_aux_pool(conn) -> None:
    """Seed, Resource Pools: a task naming no pool goes to the default compute pool when it
    needs slots, to the default auxiliary pool when it needs none; a workspace's defaults come
    before the cluster's."""
    apply_cluster(conn, "resource_manager:\n  default_compute_resource_pool: gpu\n"
                        "  default_aux_resource_pool: cpu\n"
                        "resource_pools:\n  - name: default\n  - name: gpu\n  - name: cpu\n"
                        "  - name: spare\n")
    notebook = task(conn, "NOTEBOOK")
    tensorboard_source = experiment(conn, "x")
    tb = task(conn, "TENSORBOARD", experiment_ids=[conn.execute(
        "SELECT id FROM experiments WHERE job_id = %s", (tensorboard_source,)).fetchone()["id"]])
    conn.execute("SELECT det_user.workspace_create('w', 'gpu', 'spare', NULL)")
    conn.execute("SELECT det_user.project_create('w', 'p', '')")
    aux_in_w = task(conn, "COMMAND", "resources: {slots: 0}", workspace="w", project="p")
    pools = {r["job_id"]: r["resource_pool"] for r in conn.execute(
        "SELECT a.job_id, a.resource_pool FROM allocations a JOIN tasks k ON k.job_id = a.job_id")}
    assert pools == {notebook: "gpu", tb: "cpu", aux_in_w: "spare"}


def test_max_aux_containers_per_agent_holds_for_tasks_and_zero_slot_tasks_start_fifo(conn
                                                                                     ) -> None:
    """Under fair share zero-slot tasks start in submission order, at most
    max_aux_containers_per_agent a agent; the one waiting says why."""
    apply_cluster(conn, "resource_pools:\n  - name: default\n    max_aux_containers_per_agent: 1\n")
    register(conn, "a1", 1)
    first = task(conn, "COMMAND", "resources: {slots: 0, priority: 90}")
    second = task(conn, "COMMAND", "resources: {slots: 0, priority: 1}")
    converge(conn)
    assert running(conn) == {first: 0}
    assert reason(conn, second) == f"waiting for an aux container place; slots are held by " \
                                   f"job {first}"


def test_zero_slot_tasks_start_by_priority_under_the_priority_scheduler(conn) -> None:
    apply_cluster(conn, "resource_manager:\n  scheduler: {type: priority}\n"
                        "resource_pools:\n  - name: default\n    max_aux_containers_per_agent: 1\n")
    register(conn, "a1", 1)
    low = task(conn, "COMMAND", "resources: {slots: 0, priority: 90}")
    high = task(conn, "COMMAND", "resources: {slots: 0, priority: 1}")
    converge(conn)
    assert running(conn) == {high: 0}
    assert reason(conn, low) is not None


@pytest.mark.parametrize("scheduler", ["priority", "fair_share", "round_robin"])
def test_a_running_task_is_never_preempted_and_a_new_priority_changes_nothing(
        conn, scheduler) -> None:
    """A running notebook keeps its slot whatever higher-priority or fairer work waits (the
    seed: notebooks, TensorBoards, shells and commands are not preemptible), and `set
    priority` on it, though accepted, has no effect on it."""
    preemption = ", preemption: true" if scheduler == "priority" else ""
    apply_cluster(conn, f"resource_manager:\n  scheduler: {{type: {scheduler}{preemption}}}\n"
                        "resource_pools:\n  - name: default\n")
    register(conn, "a1", 2)
    notebook = task(conn, "NOTEBOOK", "resources: {slots: 2, priority: 50}")
    converge(conn)
    assert running(conn) == {notebook: 2}
    urgent = experiment(conn, "urgent", slots=2, trials=2, priority=1)
    converge(conn)
    if scheduler == "priority":
        conn.execute("SELECT det_user.job_update(%s, 'priority', '99')", (notebook,))
        converge(conn)
    assert running(conn) == {notebook: 2}
    assert conn.execute("SELECT desired_state::text AS d, preemptible FROM allocations "
                        "WHERE job_id = %s", (notebook,)).fetchone() == {
        "d": "RUNNING", "preemptible": False}
    assert reason(conn, urgent) is not None
