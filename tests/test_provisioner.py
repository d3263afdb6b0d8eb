"""Elastic agents (issue 36): the provisioner's decisions (pure), and the ``local`` provider
with the real reconciler: scale up on demand, stop idle agents, adopt after a kill -9, stop an
agent that never registers."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import wait_for
from test_checkpoint_storage import s3_server  # noqa: F401 (moto's server, EC2 included)

from det.reconciler.provisioner import (
    Demand,
    Instance,
    Provider,
    StartFailures,
    backoff,
    decide,
    list_due,
)

P = Provider(min_instances=0, max_instances=2, slots_per_instance=1,
             max_idle_agent_period=5.0, agent_startup_timeout=60.0)


def test_demand_launches_up_to_max_instances_and_says_why_it_stops() -> None:
    d = decide(P, Demand(slots=4), [])
    assert d.launch == 2 and d.terminate == []
    assert d.status == "at max_instances 2: 4 slot(s) and 0 task(s) wait"


def test_instances_still_booting_count_against_the_demand() -> None:
    booting = [Instance(1, "STARTING", age=3.0)]
    assert decide(P, Demand(slots=1), booting).launch == 0
    d = decide(P, Demand(slots=2), booting)
    assert d.launch == 1 and d.status == "waiting for 2 instance(s) to start"


def test_a_waiting_zero_slot_task_wants_one_instance_when_there_is_none() -> None:
    assert decide(P, Demand(aux=3), []).launch == 1
    assert decide(P, Demand(aux=3), [Instance(1, "RUNNING", age=9.0)]).launch == 0


def test_min_instances_are_kept_and_never_more_than_max() -> None:
    p = Provider(1, 3, 2, 5.0, 60.0)
    assert decide(p, Demand(), []).launch == 1
    assert decide(p, Demand(slots=9), []).launch == 3
    idle = [Instance(1, "RUNNING", age=99.0, idle_for=50.0)]
    assert decide(p, Demand(), idle).terminate == []


def test_an_agent_that_never_registers_is_stopped_with_the_reason() -> None:
    d = decide(P, Demand(slots=1), [Instance(7, "STARTING", age=61.0)])
    assert d.terminate == [(7, "agent did not register within 60 s")]


def test_idle_agents_are_stopped_only_when_nothing_waits_longest_idle_first() -> None:
    live = [Instance(1, "RUNNING", 99.0, idle_for=6.0), Instance(2, "RUNNING", 99.0,
                                                                 idle_for=9.0),
            Instance(3, "RUNNING", 99.0, idle_for=None)]
    assert decide(P, Demand(slots=1), live).terminate == []
    p = Provider(1, 3, 1, 5.0, 60.0)
    assert decide(p, Demand(), live).terminate == [(2, "idle for 5 s"), (1, "idle for 5 s")]
    assert decide(Provider(2, 3, 1, 5.0, 60.0), Demand(), live).terminate == [
        (2, "idle for 5 s")]


def test_a_lost_agent_instance_is_stopped_and_replaced() -> None:
    d = decide(P, Demand(slots=1), [Instance(4, "RUNNING", 99.0, agent_lost=True)])
    assert d.terminate == [(4, "agent lost")] and d.launch == 1


# -- The local provider with the real reconciler ------------------------------------------------

INSTANCES = ("SELECT id, agent_id, state::text AS state, reason, provider_id FROM instances "
             "ORDER BY id")


def elastic_pool(det, tmp_path: Path, **provider) -> None:
    cfg = {"resource_pools": [
        {"name": "default"},
        {"name": "elastic", "provider": {"type": "local", "max_instances": 2,
                                         "max_idle_agent_period": "3s", **provider}}]}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cfg))
    det("cluster", "config", "apply", str(tmp_path / "cluster.yaml"))


def four_trials(det, tmp_path: Path, entrypoint: str = "sleep 1") -> None:
    """An experiment of four one-slot trials in the elastic pool."""
    (tmp_path / "ctx").mkdir(exist_ok=True)
    cfg = {"name": "elastic", "entrypoint": entrypoint,
           "searcher": {"name": "grid", "metric": "loss", "max_length": {"batches": 1},
                        "max_concurrent_trials": 4},
           "hyperparameters": {"x": {"type": "categorical", "vals": [1, 2, 3, 4]}},
           "resources": {"resource_pool": "elastic"}, "max_restarts": 0}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(cfg))
    det("experiment", "create", str(tmp_path / "exp.yaml"), str(tmp_path / "ctx"))


def test_four_trials_on_an_empty_pool_get_two_agents_that_stop_when_idle(
        det, conn, tmp_path, leftover_agents) -> None:
    elastic_pool(det, tmp_path)
    four_trials(det, tmp_path)
    det.start("reconciler", "reconcile", "--interval", "0.3")
    wait_for(lambda: "at max_instances 2" in det("resource-pool", "list").stdout, 60,
             "the pool to say it is at max_instances")
    r = det("experiment", "wait", "1", timeout=240, check=False)
    assert r.returncode == 0, r.stdout + r.stderr + det.log("reconciler")
    rows = conn.execute(INSTANCES).fetchall()
    assert [r["agent_id"] for r in rows] == ["det-instance-1", "det-instance-2"]
    ran = conn.execute("SELECT DISTINCT agent_id FROM allocations ORDER BY 1").fetchall()
    assert [r["agent_id"] for r in ran] == ["det-instance-1", "det-instance-2"]
    wait_for(lambda: all(r["state"] == "GONE" for r in conn.execute(INSTANCES).fetchall()),
             60, "both instances to be gone after the idle period")
    assert [r["reason"] for r in conn.execute(INSTANCES).fetchall()] == ["idle for 3 s"] * 2
    assert agent_pid(det, "det-instance-1") is None and agent_pid(det, "det-instance-2") is None
    out = det("resource-pool", "describe", "elastic").stdout
    assert "det-instance-2" in out and "GONE" in out and "idle for 3 s" in out


def test_a_reconciler_killed_between_launch_and_record_launches_nothing_twice(
        det, conn, tmp_path, leftover_agents) -> None:
    elastic_pool(det, tmp_path)
    marker = tmp_path / "killed"
    det.env = {**det.env, "DET_TEST_KILL_AFTER_LAUNCH": str(marker)}
    four_trials(det, tmp_path)
    first = det.start("reconciler", "reconcile", "--interval", "0.3")
    assert first.wait(60) == -signal.SIGKILL and marker.exists()
    assert conn.execute(INSTANCES).fetchall()[0]["state"] == "REQUESTED"
    det.start("reconciler2", "reconcile", "--interval", "0.3")
    r = det("experiment", "wait", "1", timeout=240, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    launches = (det.log("reconciler") + det.log("reconciler2")).count("launched agent process")
    assert launches == 2, "one launch per instance, the killed one's adopted"
    assert "det-instance-1: adopted its running agent" in det.log("reconciler2")
    assert len(conn.execute(INSTANCES).fetchall()) == 2


def test_an_agent_that_never_registers_is_terminated_with_the_reason(
        det, conn, tmp_path, leftover_agents) -> None:
    elastic_pool(det, tmp_path, max_instances=1, agent_startup_timeout="2s")
    four_trials(det, tmp_path, entrypoint="sleep 600")
    det.start("reconciler", "reconcile", "--interval", "0.3")
    # Frozen before it registers (its imports take seconds), the first agent never arrives.
    pid = wait_for(lambda: agent_pid(det, "det-instance-1"), 60, "the first agent's process",
                   interval=0.02)
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: conn.execute(INSTANCES).fetchone()["state"] == "TERMINATING", 30,
             "the instance to be terminated")
    os.kill(pid, signal.SIGCONT)  # now it hears the SIGTERM it was sent
    first = wait_for(lambda: [r for r in conn.execute(INSTANCES).fetchall()
                              if r["id"] == 1 and r["state"] == "GONE"], 30,
                     "the instance to be gone")[0]
    assert first["reason"] == "agent did not register within 2 s"
    assert conn.execute("SELECT count(*) AS n FROM agents WHERE id = 'det-instance-1'"
                        ).fetchone()["n"] == 0
    # No loop of launches that never come up: the next waits out the back-off (10 s).
    assert ("1 instance(s) in a row failed to start (agent did not register within 2 s); "
            "next launch in") in det("resource-pool", "list").stdout
    assert len(conn.execute(INSTANCES).fetchall()) == 1
    det("experiment", "kill", "1")


def agent_pid(det, agent_id: str) -> int | None:
    """The pid of the test cluster's elastic agent ``agent_id`` (its reconciler's det home)."""
    from det.reconciler.local_provider import LocalProvider

    return LocalProvider(Path(det.env["DET_HOME"]) / "instances").running().get(agent_id)


@pytest.fixture
def leftover_agents(det, conn):
    """The elastic agents outlive the reconciler (their own session): stop what a failed test
    left running."""
    yield
    for row in conn.execute(INSTANCES).fetchall():
        pid = agent_pid(det, row["agent_id"])
        if pid:
            os.kill(pid, signal.SIGKILL)


def test_start_failures_in_a_row_back_off_and_say_when_the_next_launch_is() -> None:
    booting = [Instance(1, "STARTING", age=61.0)]
    d = decide(P, Demand(slots=1), booting)
    assert d.launch == 0 and d.status == ("1 instance(s) in a row failed to start (agent did "
                                          "not register within 60 s); next launch in 10 s")
    assert decide(P, Demand(slots=1), [], StartFailures(2, 5.0)).status.endswith("in 15 s")
    assert decide(P, Demand(slots=1), [], StartFailures(2, 21.0)).launch == 1
    assert backoff(0) == 0 and backoff(1) == 10 and backoff(20) == 600


def test_an_instance_whose_agent_holds_a_run_is_not_terminated_as_idle(conn, ended) -> None:
    """The TERMINATE statement checks again, in the transaction that drains the agent, that it
    holds nothing: a run placed after the decision keeps its instance."""
    from det.reconciler import provision

    conn.execute("SELECT det_agent.register('det-instance-1', 'h', 'default', 'process', "
                 "'[{\"slot_id\": 0, \"type\": \"cpu\"}]')")
    conn.execute(provision.Q.request, {"n": 1, "pool": "default", "provider": "local"})
    assert conn.execute(provision.Q.arrived).rowcount == 1
    eid, _ = ended.make([[]], ended=False)
    conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id) SELECT e.job_id, t.id, 2, 'default', 1, '{}', 'RUNNING', "
        "'det-instance-1' FROM experiments e JOIN trials t ON t.experiment_id = e.id "
        "WHERE e.id = %s", (eid,))
    args = {"id": 1, "reason": "idle for 3 s"}
    assert conn.execute(provision.Q.terminate, args).fetchone() is None
    assert conn.execute("SELECT state::text AS s FROM agents").fetchone()["s"] == "ACTIVE"
    conn.execute("UPDATE allocations SET state = 'TERMINATED', ended_at = now() "
                 "WHERE agent_id = 'det-instance-1'")
    assert conn.execute(provision.Q.terminate, args).fetchone() == {"id": 1}
    assert conn.execute("SELECT state::text AS s FROM agents").fetchone()["s"] == "DISABLED"
    with pytest.raises(Exception, match="illegal state change TERMINATING -> RUNNING"):
        conn.execute("UPDATE instances SET state = 'RUNNING'")


def test_the_provider_is_asked_again_when_instances_change_or_the_interval_passes() -> None:
    seen = ((1, "RUNNING", "42"),)
    assert list_due(None, seen, 100.0)
    assert not list_due((100.0, seen), seen, 104.9)
    assert list_due((100.0, seen), seen, 105.0)
    stopping = ((1, "TERMINATING", "42"),)
    assert list_due((100.0, seen), stopping, 100.1)
    assert list_due((100.0, stopping), stopping, 100.2, stopping=True)


class Recording:
    """The test's connection, recording each statement the provisioner sends."""

    def __init__(self, conn) -> None:
        self.conn, self.sent = conn, []

    def execute(self, query, params=None):
        self.sent.append(query)
        return self.conn.execute(query, params)

    def __getattr__(self, name):
        return getattr(self.conn, name)


def test_passes_with_nothing_changed_neither_list_the_provider_nor_write_the_status(
        det, conn, tmp_path) -> None:
    """Three passes over a pool whose one instance runs and idles: its provider (``/proc``)
    is read once, and its unchanged status is not written. The provider sees its own agent,
    not another cluster's of the same name on the host (another det home's)."""
    from det.reconciler.provision import Provisioner, Q

    elastic_pool(det, tmp_path)
    # Processes /proc shows as instance 1's agent, registered under its name, and as
    # another cluster's of that name.
    p = Provisioner(tmp_path)
    sleep = [sys.executable, "-c", "import time; time.sleep(120)", "agent", "--id",
             "det-instance-1", "--work-dir"]
    proc = subprocess.Popen([*sleep, str(p.local.work_dir("det-instance-1"))])
    other = subprocess.Popen([*sleep, str(tmp_path / "other" / "det-instance-1")])
    try:
        conn.execute("SELECT det_agent.register('det-instance-1', 'h', 'elastic', 'process', "
                     "'[{\"slot_id\": 0, \"type\": \"cpu\"}]')")
        conn.execute(Q.request, {"n": 1, "pool": "elastic", "provider": "local"})
        conn.execute(Q.launched, {"id": 1, "pid": str(proc.pid)})
        assert p.local.running() == {"det-instance-1": proc.pid}
        listed = []
        running = p.local.running
        p.local.running = lambda: listed.append(1) or running()
        rec = Recording(conn)
        for _ in range(3):
            p.step(rec)
        assert len(listed) == 1
        assert Q.set_status not in rec.sent
        assert conn.execute(INSTANCES).fetchone()["state"] == "RUNNING"
    finally:
        for each in (proc, other):
            each.kill()
            each.wait()


# -- The aws provider against moto's EC2 --------------------------------------------------------


def test_aws_launches_tagged_instances_stops_them_and_backs_off_after_errors(
        s3_server, det, conn, tmp_path, leftover_agents) -> None:  # noqa: F811 (the fixture)
    """moto's server runs no VM, so the agent never registers: the instance is terminated
    after the startup timeout; a launch EC2 refuses (a wrong subnet) is stored with the pool's
    back-off, and nothing is launched meanwhile."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=s3_server)
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    aws = {"type": "aws", "endpoint_url": s3_server, "image_id": ami, "max_instances": 1,
           "agent_startup_timeout": "2s", "master_url": "postgresql://10.0.0.1:5433/det"}
    elastic_pool(det, tmp_path, **aws)
    four_trials(det, tmp_path, entrypoint="sleep 600")
    det.start("reconciler", "reconcile", "--interval", "0.3")
    first = wait_for(lambda: conn.execute(INSTANCES).fetchone(), 60, "an instance")
    ec2_id = wait_for(lambda: conn.execute(INSTANCES).fetchone()["provider_id"], 60,
                      "the instance to be launched")

    def ec2_state() -> tuple[str, dict]:
        inst = ec2.describe_instances(InstanceIds=[ec2_id])["Reservations"][0]["Instances"][0]
        return inst["State"]["Name"], {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert ec2_state()[1] == {"Name": first["agent_id"], "det:instance": first["agent_id"],
                              "det:pool": "elastic"}
    wait_for(lambda: ec2_state()[0] == "terminated", 60, "EC2 to terminate the instance")
    wait_for(lambda: conn.execute(INSTANCES).fetchone()["state"] == "GONE", 30,
             "the instance to be gone")
    assert conn.execute(INSTANCES).fetchone()["reason"] == "agent did not register within 2 s"
    elastic_pool(det, tmp_path, **aws, subnet_id="subnet-nope")
    second = wait_for(lambda: [r for r in conn.execute(INSTANCES).fetchall()
                               if r["id"] > first["id"] and r["state"] == "GONE"], 60,
                      "the second launch, after the back-off, to fail")[0]
    assert second["reason"] == ("launch failed: AWS: InvalidSubnetID.NotFound: The subnet ID "
                                "'subnet-nope' does not exist")
    out = det("resource-pool", "list").stdout
    assert "2 instance(s) in a row failed to start (launch failed: AWS: InvalidSubnetID" in out
    assert "next launch in" in out
    assert len(conn.execute(INSTANCES).fetchall()) == 2, "nothing launched during the back-off"
    det("experiment", "kill", "1")


def test_local_agents_connect_as_the_agent_role_not_as_the_reconciler(tmp_path,
                                                                      monkeypatch) -> None:
    """The reconciler connects as the schema's owner; an agent it starts must not inherit that
    (its tasks get the agent's URL unless DET_TASK_DB_URL says otherwise): `det cluster up`
    hands the reconciler the agent role's URL in DET_AGENT_DB_URL for the agents it starts."""
    from det.reconciler.local_provider import LocalProvider

    monkeypatch.setenv("DET_DB_URL", "postgresql://owner@/det?host=/nowhere")
    monkeypatch.setenv("DET_AGENT_DB_URL", "postgresql://det_agent@/det?host=/nowhere")
    # The launched "interpreter" writes the environment it was given: a real agent exits at once
    # on this URL, and a reaped or zombie process's /proc/<pid>/environ reads empty.
    dump = tmp_path / "environ"
    interpreter = tmp_path / "python"
    interpreter.write_text(f"#!/bin/sh\nenv -0 > {dump}.part && mv {dump}.part {dump}\n")
    interpreter.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(interpreter))
    provider = LocalProvider(tmp_path / "agents")
    provider.launch("det-instance-1", "default", 1)
    wait_for(dump.exists, 30, "the launched process to write its environment", 0.05)
    environ = dict(kv.split("=", 1) for kv in dump.read_bytes().decode().split("\0") if kv)
    assert environ["DET_DB_URL"] == "postgresql://det_agent@/det?host=/nowhere"
