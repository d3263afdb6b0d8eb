"""Slurm pools (issue 36): each run of a pool whose provider is ``slurm`` is one Slurm job on a
real single-host Slurm (deploy/slurm/slurm.sh: munged, slurmctld, slurmd; one per module),
whose script is a one-shot agent that runs that run alone."""

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml
from conftest import REPO, Det, drop_database, task_url, wait_for
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from test_e2e_digits import DIGITS, digits_config

from det.configs.cluster import load_cluster_config
from det.errors import ConfigError
from det.reconciler.provisioner import (
    ONE_SHOT_EXIT_SECONDS,
    RunInstance,
    StartFailures,
    decide_runs,
)
from det.reconciler.slurm_provider import Job, job_name, job_script, parse_squeue, sbatch_argv
from det.sql import named

SLURM_SH = REPO / "deploy" / "slurm" / "slurm.sh"
INSTANCES = ("SELECT id, agent_id, state::text AS state, reason, provider_id, provider_state, "
             "allocation_id FROM instances ORDER BY id")
# each instance's agent: when it and its instance were marked gone
AGENTS_GONE = ("SELECT i.agent_id, g.state::text AS state, g.gone_at, i.gone_at AS job_gone_at "
               "FROM instances i JOIN agents g ON g.id = i.agent_id ORDER BY i.id")
# the trials' runs (an ended experiment's checkpoint GC task is a run too, with no trial)
RUNS = ("SELECT id, run, agent_id, slots_needed, exit_code, exit_reason FROM allocations "
        "WHERE trial_id IS NOT NULL ORDER BY id")


def test_slurm_provider_config_errors_name_the_field() -> None:
    ok = load_cluster_config("resource_pools: [{name: default}, {name: hpc, provider: {type: "
                             "slurm, partition: gpu, gres: gpu, sbatch_args: [--time=1:00]}}]")
    assert ok.resource_pools[1].provider.partition == "gpu"
    with pytest.raises(ConfigError, match="partition: only for type slurm, not local"):
        load_cluster_config("resource_pools: [{name: default, provider: "
                            "{type: local, partition: gpu}}]")
    with pytest.raises(ConfigError, match="slots_per_instance: not for type slurm"):
        load_cluster_config("resource_pools: [{name: default, provider: "
                            "{type: slurm, slots_per_instance: 2}}]")
    with pytest.raises(ConfigError, match="sbatch_args: '--job-name=x' is set by det"):
        load_cluster_config("resource_pools: [{name: default, provider: "
                            "{type: slurm, sbatch_args: [--job-name=x]}}]")


def test_sbatch_asks_one_node_with_a_task_per_slot_and_the_gres() -> None:
    cfg = {"partition": "p", "account": "a", "qos": "q", "gres": "gpu",
           "sbatch_args": ["--time=5"]}
    argv = sbatch_argv(cfg, "det-instance-3", "hpc", 2, Path("/logs"))
    assert argv == ["sbatch", "--parsable", "--job-name", "det-instance-3", "--nodes", "1",
                    "--ntasks-per-node", "2", "--output", "/logs/det-instance-3.log",
                    "--partition", "p", "--account", "a", "--qos", "q", "--gres", "gpu:2",
                    "--time=5"]
    # a zero-slot task still needs a task of Slurm's, and asks no device
    assert sbatch_argv({"gres": "gpu"}, "det-instance-4", "hpc", 0, Path("/l"))[6:8] == [
        "--ntasks-per-node", "1"]
    assert "--gres" not in sbatch_argv({"gres": "gpu"}, "det-instance-4", "hpc", 0, Path("/l"))


def test_job_names_carry_the_det_cluster_so_two_clusters_never_see_each_others_jobs() -> None:
    """Two det clusters (databases) on one Slurm both have an instance 3: each names its job
    after its own cluster id and finds only its own in squeue's output."""
    a, b = uuid.UUID(int=0xA1B2C3D4 << 96), uuid.UUID(int=0xE5F60718 << 96)
    assert job_name(a, "det-instance-3") == "det-a1b2c3d4-instance-3"
    out = "\n".join([f"{job_name(a, 'det-instance-3')}|12|PENDING|Resources",
                     f"{job_name(b, 'det-instance-3')}|13|RUNNING|None",
                     "det-instance-3|14|RUNNING|None", "other|15|RUNNING|None",
                     f"{job_name(a, 'det-instance-x')}|16|RUNNING|None", ""])
    assert parse_squeue(out, a) == {"det-instance-3": Job("12", "PENDING", "Resources")}
    assert parse_squeue(out, b) == {"det-instance-3": Job("13", "RUNNING", "None")}


def test_a_retired_or_gone_agent_leaves_the_lists_and_its_runs_keep_its_name(conn) -> None:
    """A one-shot agent that retired (det_agent.retire) is LOST and gone: `det agent list`
    (and det serve's list), `det slot list` hide it, nothing is placed on it, its runs still
    name it; registering again lists it again."""
    read = named("queries")
    for agent in ("det-instance-1", "static"):
        conn.execute("SELECT det_agent.register(%s, 'h', 'default', 'process', "
                     "'[{\"slot_id\": 0, \"type\": \"cpu\"}]')", (agent,))
    conn.execute("SELECT det_agent.retire('det-instance-1')")
    row = conn.execute("SELECT state::text AS state, stopping, gone_at FROM agents "
                       "WHERE id = 'det-instance-1'").fetchone()
    assert row["state"] == "LOST" and row["stopping"] and row["gone_at"] is not None
    assert [r["id"] for r in conn.execute(read.agents).fetchall()] == ["static"]
    assert [r["agent_id"] for r in conn.execute(read.slots, {"agent": None})] == ["static"]
    conn.execute("SELECT det_agent.register('det-instance-1', 'h', 'default', 'process', "
                 "'[{\"slot_id\": 0, \"type\": \"cpu\"}]')")
    assert [r["id"] for r in conn.execute(read.agents).fetchall()] == ["det-instance-1", "static"]


def test_the_job_script_is_a_one_shot_agent_of_the_runs_slots() -> None:
    script = job_script("det-instance-3", "hpc", 2, None)
    assert script.startswith("#!/bin/sh\nexec ")
    argv = script.split("\n")[1].split()
    assert argv[argv.index("--id") + 1] == "det-instance-3"
    assert argv[argv.index("--resource-pool") + 1] == "hpc"
    assert argv[argv.index("--slots") + 1] == "2"
    assert argv[argv.index("--slot-type") + 1] == "cpu"
    assert {"--one-shot", "--stop-is-failure"} <= set(argv)
    assert "--slot-type auto" in job_script("det-instance-3", "hpc", 2, "gpu")
    assert "--slot-type none" in job_script("det-instance-3", "hpc", 0, None)


def test_each_waiting_run_gets_a_job_in_queue_order_up_to_max_instances() -> None:
    live = [RunInstance(1, "STARTING", run_wanted=True)]
    d = decide_runs(3, [7, 5, 9], live)
    assert d.submit == [7, 5] and d.terminate == []
    assert d.status == "at max_instances 3: 1 run(s) wait for a Slurm job"
    assert decide_runs(3, [], live).status == ""
    # after a start failure, nothing is submitted for the back-off
    d = decide_runs(3, [7], [], StartFailures(1, 2.0, "launch failed: invalid partition"))
    assert d.submit == [] and "next submission in 8 s" in d.status


def test_a_job_whose_run_no_longer_wants_it_is_cancelled() -> None:
    d = decide_runs(4, [8], [
        # paused or killed before its agent took it: cancelled, and it frees its place
        RunInstance(1, "STARTING", run_wanted=False),
        RunInstance(2, "RUNNING", run_wanted=False),
        # its agent took the run, which ended: the agent exits by itself, or is cancelled
        RunInstance(3, "RUNNING", False, run_taken=True, run_ended_for=1.0),
        RunInstance(4, "RUNNING", False, run_taken=True, run_ended_for=ONE_SHOT_EXIT_SECONDS),
        RunInstance(5, "RUNNING", True, run_taken=True, agent_lost=True),
        RunInstance(6, "RUNNING", True, run_taken=True)])
    assert [i for i, _ in d.terminate] == [1, 2, 4, 5]
    assert d.terminate[0][1] == "its run no longer waits for it"
    assert d.terminate[3][1] == "agent lost"
    assert d.submit == [8]


# -- A real Slurm -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm(tmp_path_factory) -> dict[str, str]:
    """A single-host Slurm with 4 CPUs; the environment naming it (SLURM_CONF). Skipped,
    saying why, where slurm-wlm is missing or does not start (root is needed)."""
    home = tmp_path_factory.mktemp("slurm")
    r = subprocess.run([str(SLURM_SH), "start", str(home), "4"], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        subprocess.run([str(SLURM_SH), "stop", str(home)], timeout=60)
        pytest.skip(f"no single-host Slurm: {r.stderr.strip()}")
    env = {"SLURM_CONF": str(home / "slurm.conf")}
    yield env
    subprocess.run([str(SLURM_SH), "stop", str(home)], timeout=60)


@pytest.fixture
def sdet(det, slurm, tmp_path):
    """``det`` whose processes reach the module's Slurm. Each test's database is a copy of
    one template, so one det cluster (one cluster_identity) naming its instances from 1 again:
    the jobs a test leaves are cancelled, and gone, before the next (it would adopt them by
    name)."""
    det.env = {**det.env, **slurm}
    yield det
    det.stop_all()
    subprocess.run(["scancel", "--user", "root"], env={**os.environ, **slurm}, timeout=60)
    wait_for(lambda: not squeue(slurm), 60, "the test's Slurm jobs to end")


def squeue(slurm: dict) -> dict[str, Job]:
    """Every job in the module's Slurm (only det's run there), by job name."""
    r = subprocess.run(["squeue", "-h", "-o", "%j|%i|%T|%r"], capture_output=True, text=True,
                       env={**os.environ, **slurm}, timeout=60, check=True)
    return {name: Job(*rest) for name, *rest in (line.split("|")
                                                 for line in r.stdout.splitlines())}


def cluster_id(conn) -> uuid.UUID:
    return conn.execute("SELECT id FROM cluster_identity").fetchone()["id"]


def agents_listed(det) -> list[str]:
    return [a["id"] for a in json.loads(det("agent", "list", "--json").stdout)]


def slurm_pool(det, tmp_path: Path, *more: dict, **provider) -> None:
    cfg = {"resource_pools": [
        {"name": "default"},
        {"name": "hpc", "provider": {"type": "slurm", "max_instances": 2, **provider}}, *more]}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cfg))
    det("cluster", "config", "apply", str(tmp_path / "cluster.yaml"))


def one_job_per_run(conn) -> list[dict]:
    """Each run of the test's database ran in a Slurm job of its own: its instance, tied to
    it, whose agent took it; returns the instances."""
    runs = conn.execute(RUNS).fetchall()
    all_rows = conn.execute(INSTANCES).fetchall()
    by_run = {r["allocation_id"]: r for r in all_rows}
    assert len(by_run) == len(all_rows), "no run was submitted twice"
    for run in runs:
        assert by_run[run["id"]]["agent_id"] == run["agent_id"], (runs, all_rows)
    rows = [by_run[run["id"]] for run in runs]
    jobs = [r["provider_id"] for r in rows]
    assert all(j.isdigit() for j in jobs) and len(set(jobs)) == len(jobs), rows
    return rows


@pytest.mark.slow
def test_a_digits_search_completes_one_slurm_job_per_trial(sdet, conn, tmp_path,
                                                           slurm) -> None:
    slurm_pool(sdet, tmp_path)
    cfg = digits_config(tmp_path, "random.yaml", **{
        "searcher.max_trials": 3, "searcher.max_concurrent_trials": 3,
        "searcher.max_length": {"batches": 30}, "min_validation_period": {"batches": 30},
        "resources": {"resource_pool": "hpc"}})
    sdet("experiment", "create", str(cfg), str(DIGITS))
    sdet.start("reconciler", "reconcile", "--interval", "0.3")
    # max_instances 2: two jobs in Slurm's queue at most, the third trial waits in det's
    wait_for(lambda: len(squeue(slurm)) == 2, 60, "two Slurm jobs")
    r = sdet("experiment", "wait", "1", timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr + sdet.log("reconciler")
    exp = json.loads(sdet("experiment", "describe", "1", "--json").stdout)
    assert exp["state"] == "COMPLETED"
    assert [t["state"] for t in exp["trials"]] == ["COMPLETED"] * 3
    assert len(one_job_per_run(conn)) == 3
    # each job ended with its run: the one-shot agent exited, det cancelled nothing
    wait_for(lambda: all(r["state"] == "GONE" for r in conn.execute(INSTANCES).fetchall()),
             60, "the three Slurm jobs to end")
    assert not squeue(slurm)
    assert {r["reason"] for r in conn.execute(INSTANCES).fetchall()} == {"slurm job ended"}
    assert all(r["exit_code"] == 0 for r in conn.execute(RUNS).fetchall())
    # each one-shot agent retired itself before its job ended, and is no longer listed
    gone = conn.execute(AGENTS_GONE).fetchall()
    assert all(g["state"] == "LOST" and g["gone_at"] < g["job_gone_at"] for g in gone), gone
    assert agents_listed(sdet) == []


@pytest.mark.slow
def test_two_slots_are_one_slurm_job_with_two_tasks_and_both_ranks_run(sdet, conn, tmp_path,
                                                                      slurm) -> None:
    slurm_pool(sdet, tmp_path)
    cfg = digits_config(tmp_path, **{
        "searcher.max_length": {"batches": 60}, "min_validation_period": {"batches": 60},
        "resources": {"resource_pool": "hpc", "slots_per_trial": 2}})
    sdet("experiment", "create", str(cfg), str(DIGITS))
    sdet.start("reconciler", "reconcile", "--interval", "0.3")
    [job] = wait_for(lambda: list(squeue(slurm).values()) or None, 60, "the Slurm job")
    shown = subprocess.run(["scontrol", "show", "job", job.job_id], capture_output=True,
                           text=True, env={**os.environ, **slurm}, timeout=60).stdout
    assert "NumNodes=1" in shown and "NumTasks=2" in shown, shown
    assert sdet("experiment", "wait", "1", timeout=300).returncode == 0
    [row] = one_job_per_run(conn)
    assert row["provider_id"] == job.job_id
    [run] = conn.execute(RUNS).fetchall()
    assert run["slots_needed"] == 2 and run["exit_code"] == 0
    logs = sdet("trial", "logs", "1")
    out = logs.stdout + logs.stderr
    assert "[rank=0]" in out and "[rank=1]" in out


def test_a_job_waiting_in_slurm_shows_its_state_and_reason_and_a_refusal_is_stored(
        sdet, conn, tmp_path, slurm) -> None:
    # A partition Slurm does not have, in a second pool.
    bad = {"name": "bad", "provider": {"type": "slurm", "partition": "nosuch"}}
    slurm_pool(sdet, tmp_path, bad, max_instances=1, sbatch_args=["--begin=now+1hour"])
    (tmp_path / "ctx").mkdir()
    for pool in ("hpc", "bad"):
        (tmp_path / "exp.yaml").write_text(yaml.safe_dump({
            "name": "w", "entrypoint": "sleep 1", "resources": {"resource_pool": pool},
            "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}}}))
        sdet("experiment", "create", str(tmp_path / "exp.yaml"), str(tmp_path / "ctx"))
    sdet.start("reconciler", "reconcile", "--interval", "0.3")
    row = wait_for(lambda: next((r for r in conn.execute(INSTANCES).fetchall()
                                 if "BeginTime" in r["provider_state"]), None), 60,
                   "the instance to say Slurm holds its job for its begin time")
    assert row["provider_state"] == f"slurm job {row['provider_id']} PENDING (BeginTime)"
    assert row["allocation_id"] == 1, "the job of experiment 1's run"
    assert "PENDING (BeginTime)" in sdet("resource-pool", "describe", "hpc").stdout
    # det's job queue gives Slurm's word for the job that waits on it.
    [job] = json.loads(sdet("job", "list", "--resource-pool", "hpc", "--json").stdout)
    assert row["provider_state"] in job["reasons"], job
    # sbatch's refusal is the instance's reason, and the pool backs off.
    row = wait_for(lambda: next((r for r in conn.execute(INSTANCES).fetchall()
                                 if "launch failed" in r["reason"]), None), 60,
                   "the refused sbatch to be stored")
    assert "invalid partition" in row["reason"] and row["state"] == "GONE"
    assert "next submission in" in sdet("resource-pool", "describe", "bad").stdout
    # Killing the waiting experiment cancels its job in Slurm's queue.
    sdet("experiment", "kill", "1")
    wait_for(lambda: not squeue(slurm), 60, "the waiting job to be cancelled")
    [hpc] = [r for r in conn.execute(INSTANCES).fetchall() if r["allocation_id"] == 1]
    assert hpc["reason"] == "its run no longer waits for it" and hpc["state"] == "GONE", hpc


def long_digits(det, tmp_path: Path, batches: int = 800) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": batches},
                                     "min_validation_period": {"batches": 400},
                                     "scheduling_unit": 10, "max_restarts": 1,
                                     "resources": {"resource_pool": "hpc"}})
    det("experiment", "create", str(cfg), str(DIGITS))
    det.start("reconciler", "reconcile", "--interval", "0.3")


def training(conn) -> bool:
    return bool(conn.execute("SELECT 1 FROM metrics WHERE \"group\" = 'training'").fetchone())


@pytest.mark.slow
def test_pause_ends_the_slurm_job_and_activate_resumes_in_a_new_one(sdet, conn, tmp_path,
                                                                    slurm) -> None:
    slurm_pool(sdet, tmp_path, max_instances=1)
    long_digits(sdet, tmp_path)
    wait_for(lambda: training(conn), 120, "training to start in a Slurm job")
    sdet("experiment", "pause", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE state = 'PAUSED'").fetchone()
             and not squeue(slurm), 120, "the trial to checkpoint and its Slurm job to end")
    paused = conn.execute("SELECT steps_completed, latest_checkpoint FROM trials").fetchone()
    assert 0 < paused["steps_completed"] < 800 and paused["latest_checkpoint"] is not None
    assert conn.execute("SELECT exit_code FROM allocations").fetchone()["exit_code"] == 0
    sdet("experiment", "activate", "1")
    assert sdet("experiment", "wait", "1", timeout=300).returncode == 0
    runs = conn.execute(RUNS).fetchall()
    assert len(runs) == 2 and all(r["exit_code"] == 0 for r in runs), runs
    assert conn.execute("SELECT restarts FROM trials").fetchone()["restarts"] == 0, runs
    assert len(one_job_per_run(conn)) == 2, "the resumed run in a new Slurm job"


@pytest.mark.slow
def test_an_scancel_from_outside_det_is_a_failure_and_the_trial_restarts(sdet, conn, tmp_path,
                                                                          slurm) -> None:
    slurm_pool(sdet, tmp_path, max_instances=1)
    long_digits(sdet, tmp_path)
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE latest_checkpoint IS NOT NULL"
                                  ).fetchone(), 180, "a checkpoint in the Slurm job")
    [job] = squeue(slurm).values()
    subprocess.run(["scancel", job.job_id], env={**os.environ, **slurm}, check=True, timeout=60)
    r = sdet("experiment", "wait", "1", timeout=300, check=False)
    runs = conn.execute(RUNS).fetchall()
    assert r.returncode == 0, (runs, sdet("trial", "logs", "1").stdout[-3000:])
    trial = conn.execute("SELECT state::text AS state, restarts FROM trials").fetchone()
    assert trial == {"state": "COMPLETED", "restarts": 1}
    assert runs[0]["exit_code"] != 0, runs
    rows = one_job_per_run(conn)
    assert len(rows) == 2 and rows[0]["provider_id"] == job.job_id, "the restart a new job"


def one_shot_agent_pid(name: str) -> int:
    """The pid of the one-shot agent ``name`` (a Slurm job's batch script)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--one-shot" in argv and name.encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no process of agent {name}")


@pytest.mark.slow
def test_a_job_killed_under_its_run_ends_the_run_as_failed_and_the_trial_restarts(
        sdet, conn, tmp_path, slurm) -> None:
    slurm_pool(sdet, tmp_path, max_instances=1)
    long_digits(sdet, tmp_path)
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE latest_checkpoint IS NOT NULL"
                                  ).fetchone(), 180, "a checkpoint in the Slurm job")
    [job] = squeue(slurm).values()
    # SIGKILL to the job's agent, its batch script: it cannot report, and Slurm ends the job
    # and kills what is left of it (as a lost node would)
    os.kill(one_shot_agent_pid("det-instance-1"), signal.SIGKILL)
    r = sdet("experiment", "wait", "1", timeout=300, check=False)
    runs = conn.execute(RUNS).fetchall()
    assert r.returncode == 0, (runs, sdet.log("reconciler")[-3000:])
    assert conn.execute("SELECT restarts FROM trials").fetchone()["restarts"] == 1
    assert runs[0]["exit_code"] is None and runs[0]["exit_reason"] == (
        f"slurm job {job.job_id} ended before its run reported an end (cancelled, failed or "
        "its node lost)"), runs
    assert len(one_job_per_run(conn)) == 2
    # the killed agent could not retire: the provisioner marked it gone with its job
    killed = conn.execute(AGENTS_GONE).fetchone()
    assert killed["state"] == "LOST" and killed["gone_at"] == killed["job_gone_at"], killed
    assert "det-instance-1" not in agents_listed(sdet)


@pytest.mark.slow
def test_a_reconciler_killed_between_sbatch_and_its_record_submits_nothing_twice(
        sdet, conn, tmp_path, slurm) -> None:
    slurm_pool(sdet, tmp_path)
    marker = tmp_path / "killed"
    sdet.env = {**sdet.env, "DET_TEST_KILL_AFTER_LAUNCH": str(marker)}
    cfg = digits_config(tmp_path, **{
        "searcher.max_length": {"batches": 30}, "min_validation_period": {"batches": 30},
        "resources": {"resource_pool": "hpc"}})
    sdet("experiment", "create", str(cfg), str(DIGITS))
    first = sdet.start("reconciler", "reconcile", "--interval", "0.3")
    assert first.wait(60) == -signal.SIGKILL and marker.exists()
    [row] = conn.execute(INSTANCES).fetchall()
    assert row["state"] == "REQUESTED" and row["provider_id"] is None
    assert list(squeue(slurm)) == [job_name(cluster_id(conn), "det-instance-1")]
    sdet.start("reconciler2", "reconcile", "--interval", "0.3")
    assert sdet("experiment", "wait", "1", timeout=300).returncode == 0
    assert "det-instance-1: adopted its running agent" in sdet.log("reconciler2")
    logs = sdet.log("reconciler") + sdet.log("reconciler2")
    assert logs.count("launched agent process") == 1, "one sbatch, adopted after the kill"
    assert len(one_job_per_run(conn)) == 1


def test_two_det_clusters_on_one_slurm_never_take_each_others_jobs(
        sdet, conn, tmp_path, slurm, pg_server, template_db) -> None:
    """Two det clusters (databases A and B) on one Slurm: each one's experiment waits as its
    instance 1, a job Slurm holds. B's reconciler, started once A's job is queued, submits its
    own job (it does not adopt A's by name), and cancelling B's leaves A's waiting."""
    name_b = f"det_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(make_conninfo(pg_server, dbname="postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name_b), sql.Identifier(template_db)))
    url_b = make_conninfo(pg_server, dbname=name_b)
    det_b = Det({**sdet.env, "DET_DB_URL": url_b, "DET_TASK_DB_URL": task_url(url_b),
                 "DET_HOME": str(tmp_path / "home_b")}, tmp_path)
    try:
        with psycopg.connect(url_b, autocommit=True, row_factory=dict_row) as conn_b:
            # Both databases are copies of the tests' template: B becomes a cluster of its own,
            # as a database det creates is.
            conn_b.execute("UPDATE cluster_identity SET id = gen_random_uuid()")
            jobs = {}
            for d, c, name in ((sdet, conn, "a"), (det_b, conn_b, "b")):
                (tmp_path / name).mkdir()
                slurm_pool(d, tmp_path / name, max_instances=1,
                           sbatch_args=["--begin=now+1hour"])
                (tmp_path / name / "exp.yaml").write_text(yaml.safe_dump({
                    "name": name, "entrypoint": "sleep 1", "resources": {"resource_pool": "hpc"},
                    "searcher": {"name": "single", "metric": "loss",
                                 "max_length": {"batches": 1}}}))
                d("experiment", "create", str(tmp_path / name / "exp.yaml"), str(tmp_path / name))
                d.start(f"reconciler_{name}", "reconcile", "--interval", "0.3")
                jobs[name] = wait_for(
                    lambda c=c: (c.execute(INSTANCES).fetchone() or {}).get("provider_id"), 60,
                    f"cluster {name}'s job")
            logs = sdet.log("reconciler_a") + det_b.log("reconciler_b")
            assert jobs["a"] != jobs["b"] and "adopted" not in logs, (jobs, logs)
            names = {"a": job_name(cluster_id(conn), "det-instance-1"),
                     "b": job_name(cluster_id(conn_b), "det-instance-1")}
            assert {n: j.job_id for n, j in squeue(slurm).items()} == {
                names["a"]: jobs["a"], names["b"]: jobs["b"]}
            # B's experiment killed: B cancels its own job, and A's still waits in Slurm
            det_b("experiment", "kill", "1")
            wait_for(lambda: list(squeue(slurm)) == [names["a"]], 60, "B's job to be cancelled")
            [a] = conn.execute(INSTANCES).fetchall()
            assert a["state"] == "STARTING" and a["provider_id"] == jobs["a"], a
    finally:
        det_b.stop_all()
        drop_database(pg_server, url_b)
