"""Distributed training (issue 12): real agents, real torchrun workers, real gloo.

A trial with ``slots_per_trial`` > 1 runs one worker per slot through
``det.launch.torch_distributed``; the chief reports, every rank's log lines reach the trial's
logs, a failed worker ends the allocation and the trial restarts from its checkpoint.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, wait_for
from psycopg.conninfo import conninfo_to_dict
from test_e2e_digits import DIGITS, digits_config

LAUNCHER = f"{sys.executable} -m det.launch.torch_distributed"

# A Core API script for the launcher: each worker says where it stands and what allgather
# gave it; the chief reports the allgather as a metric.
CORE_SCRIPT = """
import os, time
from det.harness import core

if os.environ["RANK"] == "1" and os.environ.get("LATE_RANK_SLEEP"):
    time.sleep(float(os.environ["LATE_RANK_SLEEP"]))
with core.init() as ctx:
    d = ctx.distributed
    ranks = d.allgather(d.rank * 10)
    print(f"rank {d.rank} of {d.size}, local {d.local_rank} of {d.local_size}, "
          f"agents {d.cross_size}, chief {d.chief_ip}, allgather {ranks}, "
          f"broadcast {d.broadcast(d.rank + 100)}", flush=True)
    time.sleep(float(os.environ.get("HOLD", "0")))
    for op in ctx.searcher.operations():
        if d.rank == 0:
            ctx.train.report_validation_metrics(op.length, {"loss": 0.5, "ranks": ranks})
        with ctx.checkpoint.store_path({"steps_completed": op.length}, shard=True) as (p, _):
            (p / f"shard-{d.rank}.txt").write_text("x" * (d.rank + 1))
        op.report_completed(0.5)
"""


def core_experiment(tmp_path: Path, slots: int, **env: str) -> tuple[Path, Path]:
    ctx = tmp_path / "ctx"
    ctx.mkdir(exist_ok=True)
    (ctx / "train.py").write_text(CORE_SCRIPT)
    variables = "".join(f"\n    - {k}={v}" for k, v in env.items())
    cfg = tmp_path / "core.yaml"
    cfg.write_text(f"""\
name: core-dist
entrypoint: {LAUNCHER} train.py
searcher: {{name: single, metric: loss, max_length: {{batches: 1}}}}
resources: {{slots_per_trial: {slots}}}
environment:
  environment_variables:{variables or " []"}
max_restarts: 0
""")
    return cfg, ctx


def task_processes(db_url: str) -> list[psutil.Process]:
    """The live processes of det tasks run against ``db_url`` (launchers, workers and what
    they started: everything with the task's ``DET_ALLOCATION_ID``); they connect to the
    test's own database, directly or through their agent's pooler."""
    dbname = conninfo_to_dict(db_url)["dbname"]
    found = []
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if "DET_ALLOCATION_ID" in env and "DET_DB_URL" in env \
                    and conninfo_to_dict(env["DET_DB_URL"]).get("dbname") == dbname \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def worker(db_url: str, rank: int) -> psutil.Process | None:
    """The training worker of ``rank`` (the harness process, not its wrap_rank)."""
    for p in task_processes(db_url):
        try:
            if "det.harness.run" in p.cmdline() and "det.launch.wrap_rank" not in p.cmdline() \
                    and p.environ().get("RANK") == str(rank):
                return p
        except psutil.NoSuchProcess:
            pass
    return None


def accuracy(conn, experiment: int) -> float:
    row = conn.execute(
        "SELECT (m.\"values\"->>'accuracy')::float AS acc FROM metrics m "
        "JOIN trials t ON t.id = m.trial_id WHERE t.experiment_id = %s "
        "AND m.\"group\" = 'validation' ORDER BY m.steps_completed DESC LIMIT 1",
        (experiment,)).fetchone()
    return row["acc"]


@pytest.mark.slow
def test_two_workers_train_digits_as_well_as_one(det, conn, tmp_path) -> None:
    # One seed for both: each experiment's default seed is the time it was created, and two
    # seeds' runs differed by more than the tolerance once (0.963 and 0.975).
    common = {"searcher.max_length": {"batches": 600}, "min_validation_period": {"batches": 300},
              "hyperparameters.global_batch_size": 32, "reproducibility.experiment_seed": 2026}
    one = digits_config(tmp_path, **common)
    one = one.rename(tmp_path / "one.yaml")
    two = digits_config(tmp_path, **{**common, "resources.slots_per_trial": 2})
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "3")
    det("experiment", "create", str(one), str(DIGITS))
    det("experiment", "create", str(two), str(DIGITS))
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    assert det("experiment", "wait", "2", timeout=300).returncode == 0
    for exp in (1, 2):
        described = json.loads(det("experiment", "describe", str(exp), "--json").stdout)
        assert described["state"] == "COMPLETED", described
    acc1, acc2 = accuracy(conn, 1), accuracy(conn, 2)
    assert acc1 > 0.9 and abs(acc1 - acc2) <= 0.01, (acc1, acc2)
    # only the chief reports: one row per validation, one per scheduling unit
    validations = conn.execute(
        "SELECT m.steps_completed FROM metrics m JOIN trials t ON t.id = m.trial_id "
        "WHERE t.experiment_id = 2 AND m.\"group\" = 'validation' ORDER BY 1").fetchall()
    assert [v["steps_completed"] for v in validations] == [300, 600]
    steps = conn.execute(
        "SELECT m.steps_completed, count(*) AS n FROM metrics m JOIN trials t "
        "ON t.id = m.trial_id WHERE t.experiment_id = 2 AND m.\"group\" = 'training' "
        "GROUP BY 1").fetchall()
    assert steps and all(s["n"] == 1 for s in steps)
    ckpts = conn.execute("SELECT c.steps_completed AS s FROM checkpoints c JOIN trials t "
                         "ON t.id = c.trial_id WHERE t.experiment_id = 2 ORDER BY 1").fetchall()
    # checkpoint_policy best: after the first validation, and at the end; once each
    assert [c["s"] for c in ckpts] == [300, 600], "the chief alone writes each checkpoint"
    [trial] = json.loads(det("experiment", "describe", "2", "--json").stdout)["trials"]
    logs = det("trial", "logs", str(trial["id"]))
    out = logs.stdout + logs.stderr
    assert "[rank=0]" in out and "[rank=1]" in out


@pytest.mark.slow
def test_a_killed_worker_ends_the_allocation_and_the_trial_resumes(det, conn, db_url,
                                                                     tmp_path) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 1200},
                                     "min_validation_period": {"batches": 600},
                                     "min_checkpoint_period": {"batches": 100},
                                     "resources.slots_per_trial": 2, "max_restarts": 1})
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2")
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM checkpoints").fetchone(), 120,
             "a first checkpoint")
    victim = wait_for(lambda: worker(db_url, 1), 30, "the rank 1 worker")
    victim.send_signal(signal.SIGKILL)
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    runs = conn.execute("SELECT run, exit_code, exit_reason FROM allocations "
                        "WHERE trial_id IS NOT NULL ORDER BY run").fetchall()
    assert len(runs) == 2 and runs[0]["exit_code"] not in (0, None), runs
    assert runs[1]["exit_code"] == 0
    trial = conn.execute("SELECT state::text AS state, restarts, steps_completed FROM trials"
                         ).fetchone()
    assert trial == {"state": "COMPLETED", "restarts": 1, "steps_completed": 1200}
    resumed = conn.execute(
        "SELECT min(m.steps_completed) AS first FROM metrics m JOIN allocations a "
        "ON a.id = m.allocation_id WHERE a.run = 2").fetchone()["first"]
    assert resumed > 100, "the second run went on from the checkpoint"
    r = det("trial", "logs", "1")
    logs = r.stdout + r.stderr
    assert ("det.launch: worker failed: rank 1 exited with -9 (SIGKILL); the other "
            "workers were stopped") in logs, logs[-3000:]
    assert task_processes(db_url) == [], "no worker left behind"


def test_core_api_script_under_the_launcher(det, conn, db_url, tmp_path) -> None:
    cfg, ctx = core_experiment(tmp_path, 2)
    det.start("reconciler", "reconcile", "--interval", "0.3")
    det.start("agent", "agent", "run", "--id", "a1", "--slots", "2")
    det("experiment", "create", str(cfg), str(ctx))
    assert det("experiment", "wait", "1", timeout=120).returncode == 0
    logs = det("trial", "logs", "1").stdout
    for rank in (0, 1):
        assert (f"[rank={rank}] rank {rank} of 2, local {rank} of 2, agents 1, chief "
                f"127.0.0.1, allgather [0, 10], broadcast 100") in logs, logs
    [row] = conn.execute("SELECT \"values\" FROM metrics WHERE \"group\" = 'validation'"
                         ).fetchall()
    assert row["values"]["ranks"] == [0, 10]
    [ckpt] = conn.execute("SELECT uuid::text AS uuid, resources FROM checkpoints").fetchall()
    assert set(ckpt["resources"]) == {"shard-0.txt", "shard-1.txt", "metadata.json"}
    assert (ckpt["resources"]["shard-0.txt"], ckpt["resources"]["shard-1.txt"]) == (1, 2)
    out = tmp_path / "download"
    det("checkpoint", "download", ckpt["uuid"], "-o", str(out))
    assert (out / "shard-1.txt").read_text() == "xx", "one checkpoint holds every shard"


def test_a_worker_that_never_arrives_fails_the_run_naming_it(det, conn, db_url,
                                                              tmp_path) -> None:
    cfg, ctx = core_experiment(tmp_path, 2, LATE_RANK_SLEEP="600", DET_RENDEZVOUS_TIMEOUT="3")
    det.start("reconciler", "reconcile", "--interval", "0.3")
    det.start("agent", "agent", "run", "--id", "a1", "--slots", "2")
    det("experiment", "create", str(cfg), str(ctx))
    started = time.monotonic()
    assert det("experiment", "wait", "1", check=False, timeout=120).returncode != 0
    assert time.monotonic() - started < 60, "the timeout ends it, not the sleeper"
    r = det("trial", "logs", "1")
    logs = r.stdout + r.stderr
    assert "rank 1 on agent a1 did not start within 3 s" in logs, logs[-3000:]
    wait_for(lambda: task_processes(db_url) == [], 10, "the sleeping worker to be stopped")


def test_the_launcher_without_a_script_prints_its_usage() -> None:
    r = subprocess.run([sys.executable, "-m", "det.launch.torch_distributed"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and r.stderr.startswith("usage: python -m det.launch")


@pytest.mark.slow
def test_pause_checkpoints_once_frees_every_slot_and_activate_resumes(det, conn,
                                                                       tmp_path) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 3000},
                                     "min_validation_period": {"batches": 1000},
                                     "scheduling_unit": 10, "resources.slots_per_trial": 2})
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2")
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM metrics WHERE \"group\" = 'training'")
             .fetchone(), 120, "training to start")
    det("experiment", "pause", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE state = 'PAUSED'").fetchone()
             and not conn.execute("SELECT 1 FROM allocations WHERE state <> 'TERMINATED'")
             .fetchone(), 120, "the trial to checkpoint and stop")
    paused = conn.execute("SELECT steps_completed, latest_checkpoint FROM trials").fetchone()
    assert 0 < paused["steps_completed"] < 3000
    steps = [c["steps_completed"] for c in conn.execute(
        "SELECT steps_completed FROM checkpoints ORDER BY steps_completed").fetchall()]
    # One checkpoint per step, by the chief: the pause's, and a best validation's (every 1000)
    # where a loaded machine trained that far before the pause arrived.
    assert steps[-1] == paused["steps_completed"] and len(set(steps)) == len(steps), \
        f"one checkpoint per step, by the chief, the last the pause's: {steps}"
    assert set(steps[:-1]) <= {1000, 2000}, steps
    assert conn.execute("SELECT exit_code FROM allocations").fetchone()["exit_code"] == 0
    assert conn.execute("SELECT count(*) AS n FROM allocation_slots WHERE NOT released"
                        ).fetchone()["n"] == 0, "both slots are free"
    det("experiment", "activate", "1")
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    second = conn.execute(
        "SELECT min(m.steps_completed) AS first_step FROM metrics m "
        "JOIN allocations a ON a.id = m.allocation_id WHERE a.run = 2").fetchone()
    # its first report is at the next scheduling unit after the paused batch
    assert paused["steps_completed"] < second["first_step"] <= paused["steps_completed"] + 10
    assert conn.execute("SELECT steps_completed FROM trials").fetchone()["steps_completed"] == 3000


def start_two_agents(det, conn, tmp_path: Path, *reconcile_args: str) -> list:
    det.start("reconciler", "reconcile", "--interval", "0.5", *reconcile_args)
    agents = [det.start(name, "agent", "run", "--id", name, "--slots", "1", "--work-dir",
                        str(tmp_path / name)) for name in ("a1", "a2")]
    wait_for(lambda: conn.execute("SELECT count(*) AS n FROM agents").fetchone()["n"] == 2,
             60, "both agents to register")
    return agents


def test_two_agents_one_slot_each_meet_through_the_database(det, conn, db_url,
                                                             tmp_path) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 300},
                                     "min_validation_period": {"batches": 150},
                                     "resources.slots_per_trial": 2})
    start_two_agents(det, conn, tmp_path)
    det("experiment", "create", str(cfg), str(DIGITS))
    assert det("experiment", "wait", "1", timeout=300).returncode == 0, det.log("a2")
    run = conn.execute("SELECT id, agent_id, rendezvous, exit_code FROM allocations "
                       "WHERE trial_id IS NOT NULL").fetchone()
    assert run["agent_id"] == "a1" and run["exit_code"] == 0
    host, port = run["rendezvous"].rsplit(":", 1)
    assert host and int(port) > 0, "the chief's agent recorded where the gang met"
    # The other agent reports its share's end by itself (after the chief's, at times).
    nodes = wait_for(lambda: [n for n in conn.execute(
        "SELECT agent_id, node_rank, state::text AS state, exit_code FROM allocation_nodes")
        if n["state"] == "TERMINATED"], 30, "node 1's end")
    assert nodes == [{"agent_id": "a2", "node_rank": 1, "state": "TERMINATED",
                      "exit_code": 0}]
    assert accuracy(conn, 1) > 0.9
    r = det("trial", "logs", "1")
    logs = r.stdout + r.stderr
    assert "[rank=0]" in logs and "[rank=1]" in logs
    assert "node 1 of 2 (1 worker(s) here)" in logs and "node 0 of 2" in logs
    assert task_processes(db_url) == []


@pytest.mark.slow
def test_a_failed_worker_on_another_agent_ends_the_whole_run(det, conn, db_url,
                                                             tmp_path) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 1200},
                                     "min_validation_period": {"batches": 600},
                                     "min_checkpoint_period": {"batches": 100},
                                     "resources.slots_per_trial": 2, "max_restarts": 1})
    start_two_agents(det, conn, tmp_path)
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM checkpoints").fetchone(), 120,
             "a first checkpoint")
    wait_for(lambda: worker(db_url, 1), 30, "the rank 1 worker").send_signal(signal.SIGKILL)
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    first = conn.execute("SELECT exit_code, exit_reason FROM allocations WHERE run = 1 "
                         "AND trial_id IS NOT NULL").fetchone()
    assert first["exit_code"] not in (0, None)
    assert first["exit_reason"].startswith("workers of node 1 (agent a2) ended"), first
    assert conn.execute("SELECT restarts FROM trials").fetchone()["restarts"] == 1
    assert task_processes(db_url) == []


# -- the pure parts ----------------------------------------------------------------------------

def test_n_workers_train_on_the_batches_one_worker_would() -> None:
    """Worker r's batch k, over all r, is one worker's batch k at N times the batch size."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from det.harness.trainer import shard_loader

    data = TensorDataset(torch.arange(103))
    one = shard_loader(DataLoader(data, batch_size=12, shuffle=True), 0, 1, 7, True)
    shards = [shard_loader(DataLoader(data, batch_size=4, shuffle=True), r, 3, 7, True)
              for r in range(3)]
    for epoch in (0, 1):
        for loader in (one, *shards):
            loader.sampler.set_epoch(epoch)
        whole = [set(b[0].tolist()) for b in one]
        split = [set().union(*(set(b[0].tolist()) for b in parts))
                 for parts in zip(*shards, strict=False)]
        # the last batch is partial: one worker's holds the rest, N workers' a few repeated
        assert len(split) == len(whole) and whole[:-1] == split[:-1]
    assert all(len(s) == len(shards[0]) for s in shards), "every worker as many batches"


def test_validation_shards_cover_the_set_once() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from det.harness.trainer import shard_loader

    data = TensorDataset(torch.arange(10))
    seen = [i for r in range(3) for b in shard_loader(DataLoader(data, batch_size=4), r, 3, 0,
                                                      False) for i in b[0].tolist()]
    assert sorted(seen) == list(range(10))


def test_a_loader_det_cannot_split_is_refused_with_the_reason() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

    from det.errors import DetError
    from det.harness.trainer import shard_loader

    data = TensorDataset(torch.arange(10))
    loader = DataLoader(data, batch_size=2, sampler=WeightedRandomSampler([1.0] * 10, 10))
    with pytest.raises(DetError, match="custom sampler"):
        shard_loader(loader, 0, 2, 0, True)


@pytest.mark.parametrize(("args", "command"), [
    (["--trial", "model_def:MyTrial"], ["-m", "det.harness.run", "model_def:MyTrial"]),
    (["model_def:MyTrial"], ["-m", "det.harness.run", "model_def:MyTrial"]),
    (["train.py", "--epochs", "3"], ["train.py", "--epochs", "3"]),
    (["-m", "pkg.train", "x"], ["-m", "pkg.train", "x"]),
])
def test_the_launcher_runs_trials_scripts_and_modules_under_this_python(args,
                                                                        command) -> None:
    from det.launch.torch_distributed import worker_command

    assert worker_command(args) == [sys.executable, *command]
    assert worker_command(["python3", "train.py"]) == ["python3", "train.py"]


def test_the_gang_plan_comes_from_the_agents_variables() -> None:
    from det.errors import DetError
    from det.launch.gang import plan_gang

    plan = plan_gang({"DET_SLOT_IDS": "[0, 1, 2]", "DET_NNODES": "2", "DET_NODE_RANK": "1",
                      "DET_MASTER_ADDR": "10.0.0.5", "DET_MASTER_PORT": "29500",
                      "DET_GANG_AGENTS": "a1,a2"})
    assert (plan.nnodes, plan.node_rank, plan.nproc_per_node, plan.master_addr,
            plan.master_port, plan.agents) == (2, 1, 3, "10.0.0.5", 29500, ("a1", "a2"))
    with pytest.raises(DetError, match="DET_NODE_RANK: expected 0 to 1, got 2"):
        plan_gang({"DET_NNODES": "2", "DET_NODE_RANK": "2", "DET_SLOT_IDS": "[0]"})


def test_a_gang_is_running_only_when_every_agent_started_its_share(det, conn,
                                                                   tmp_path) -> None:
    """The agents' SQL contract, step by step: the chief claims and records the rendezvous,
    the other agent claims its node; RUNNING waits for both; a failed share ends the run."""
    slot = '[{"slot_id": 0, "type": "cpu"}]'
    for agent in ("a1", "a2"):
        conn.execute("SELECT det_agent.register(%s, 'h', 'default', 'process', %s)",
                     (agent, slot))
    cfg = digits_config(tmp_path, **{"resources.slots_per_trial": 2})
    det("experiment", "create", str(cfg), str(DIGITS))
    det("reconcile", "--once")

    def state() -> str:
        return conn.execute("SELECT state::text FROM allocations").fetchone()["state"]

    alloc = conn.execute("SELECT id, agent_id FROM allocations").fetchone()
    assert alloc["agent_id"] == "a1" and state() == "ASSIGNED"
    assert conn.execute("SELECT det_agent.gang_agents(%s) AS g", (alloc["id"],)).fetchone()["g"] \
        == ["a1", "a2"]
    claim_node = "SELECT det_agent.claim_node('a2', %s) AS n"
    assert conn.execute(claim_node, (alloc["id"],)).fetchone()["n"] is None, \
        "no share starts before the chief's agent says where to meet"
    assert conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc["id"],)).fetchone()["t"]
    conn.execute("SELECT det_agent.set_rendezvous('a1', %s, '10.0.0.1:29500')", (alloc["id"],))
    conn.execute("SELECT det_agent.report('a1', %s, 'RUNNING')", (alloc["id"],))
    assert state() == "STARTING", "the other agent has not started its share"
    node = conn.execute(claim_node, (alloc["id"],)).fetchone()["n"]
    assert (node["node_rank"], node["nodes"], node["rendezvous"]) == (
        1, ["a1", "a2"], "10.0.0.1:29500")
    conn.execute("SELECT det_agent.report_node('a2', %s, 'RUNNING')", (alloc["id"],))
    assert state() == "RUNNING"
    info = conn.execute("SELECT det_task.info(%s) AS i", (node["token"],)).fetchone()["i"]
    assert info["allocation_id"] == alloc["id"], "the node's token is the allocation's"
    conn.execute("SELECT det_agent.report_node('a2', %s, 'TERMINATED', 1, NULL)",
                 (alloc["id"],))
    ended = conn.execute("SELECT state::text, exit_code, exit_reason FROM allocations"
                         ).fetchone()
    assert ended == {"state": "TERMINATED", "exit_code": 1,
                     "exit_reason": "workers of node 1 (agent a2) ended: exit code 1"}
    assert conn.execute("SELECT count(*) AS n FROM allocation_slots WHERE NOT released"
                        ).fetchone()["n"] == 0


def test_a_lost_agent_ends_its_gang_and_every_worker_stops(det, conn, db_url,
                                                           tmp_path) -> None:
    cfg, ctx = core_experiment(tmp_path, 2, HOLD="600")
    _, a2 = start_two_agents(det, conn, tmp_path, "--agent-timeout", "8")
    det("experiment", "create", str(cfg), str(ctx))
    wait_for(lambda: conn.execute("SELECT 1 FROM allocations WHERE state = 'RUNNING'")
             .fetchone(), 60, "the gang to run")
    wait_for(lambda: worker_of(db_url, 1), 30, "the rank 1 worker")
    a2.send_signal(signal.SIGSTOP)  # frozen: its workers keep running, its heartbeat stops
    try:
        wait_for(lambda: conn.execute(
            "SELECT exit_reason FROM allocations WHERE state = 'TERMINATED'").fetchone(),
            60, "the run to end")
        ended = conn.execute("SELECT exit_reason FROM allocations").fetchone()
        assert ended["exit_reason"] == "agent lost"
        wait_for(lambda: worker_of(db_url, 0) is None, 30, "a1 to stop the chief's workers")
    finally:
        a2.send_signal(signal.SIGCONT)
    wait_for(lambda: task_processes(db_url) == [], 30, "a2, back, to stop its workers")
    assert det("experiment", "wait", "1", check=False, timeout=60).returncode != 0


def worker_of(db_url: str, rank: int) -> psutil.Process | None:
    """Any worker process of ``rank`` (a Core API script under wrap_rank)."""
    for p in task_processes(db_url):
        try:
            if "det.launch.wrap_rank" not in p.cmdline() and p.environ().get("RANK") == str(rank):
                return p
        except psutil.NoSuchProcess:
            pass
    return None
