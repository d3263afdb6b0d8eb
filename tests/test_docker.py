"""End to end with the docker runtime: real containers from det's default image (built offline
by the ``task_image`` fixture), the real reconciler, agent, harness and database.

Skipped, with the reason printed, where no Docker engine answers; the process runtime's tests
run everywhere.
"""

import json
import shutil
import signal
import uuid

import pytest
from conftest import wait_for
from test_e2e_digits import DIGITS, digits_config
from test_hosts import (
    _completes,
    _experiment,
    _owner,
    _start_agent,
    _where_trials_ran,
    hosts,  # noqa: F401 (a fixture)
)
from test_hosts import cluster as hosts_cluster  # noqa: F401 (a fixture, by its name)

from det.agent.containers import LABEL_AGENT


def agent_id() -> str:
    return f"dock-{uuid.uuid4().hex[:8]}"


def containers_of(client, agent: str, **filters) -> list:
    # ignore_removed: the SDK inspects each container it listed, and the agent may remove
    # one in between (the state a test waits for)
    return client.containers.list(all=True, ignore_removed=True,
                                  filters={"label": f"{LABEL_AGENT}={agent}", **filters})


def start(det, agent: str, name: str = "agent"):
    det.start("reconciler", "reconcile", "--interval", "0.5")
    return det.start(name, "agent", "run", "--id", agent, "--slots", "1", "--runtime", "docker")


def failure(det, agent_log: str = "agent") -> str:
    """What a failed run left behind: the trial's logs and the agent's."""
    return det("trial", "logs", "1", check=False).stdout + det.log(agent_log)


def run_of(conn, experiment: int) -> dict:
    return conn.execute("SELECT a.* FROM allocations a JOIN trials t ON t.id = a.trial_id "
                        "WHERE t.experiment_id = %s ORDER BY a.id DESC LIMIT 1",
                        (experiment,)).fetchone()


def test_digits_in_a_container_with_env_mounts_and_startup_hook(
        det, conn, tmp_path, docker_client, task_image) -> None:
    context = tmp_path / "context"
    shutil.copytree(DIGITS, context)
    (context / "startup-hook.sh").write_text(
        'echo "hook ran: DET_MARK=$DET_MARK"\n'
        "cat /mnt/probe/hello.txt\n"
        'touch /mnt/probe/x 2>/dev/null && echo "probe writable" || echo "probe read-only"\n')
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "hello.txt").write_text("hello from the host\n")
    cfg = digits_config(tmp_path, **{
        "searcher.max_length": {"batches": 60}, "min_validation_period": {"batches": 30},
        "environment": {"environment_variables": ["DET_MARK=marked"]},
        "bind_mounts": [{"host_path": str(probe), "container_path": "/mnt/probe",
                         "read_only": True}]})
    agent = agent_id()
    start(det, agent)
    det("experiment", "create", str(cfg), str(context))
    assert det("experiment", "wait", "1", timeout=300, check=False).returncode == 0, failure(det)
    [trial] = json.loads(det("experiment", "describe", "1", "--json").stdout)["trials"]
    assert trial["state"] == "COMPLETED" and trial["steps_completed"] == 60
    logs = det("trial", "logs", str(trial["id"])).stdout
    for line in ("hook ran: DET_MARK=marked", "hello from the host", "probe read-only",
                 "run ended with exit code 0"):
        assert line in logs
    assert conn.execute("SELECT runtime FROM agents WHERE id = %s",
                        (agent,)).fetchone()["runtime"] == "docker"
    ckpts = json.loads(det("checkpoint", "list", "1", "--json").stdout)
    det("checkpoint", "download", ckpts[-1]["uuid"], "-o", str(tmp_path / "ckpt"))
    assert (tmp_path / "ckpt" / "metadata.json").is_file()
    # Removed once its logs were collected and its end reported.
    wait_for(lambda: not containers_of(docker_client, agent), 30, "the container's removal")


def test_restarted_agent_adopts_its_running_container(
        det, conn, tmp_path, docker_client, task_image) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 400},
                                     "min_validation_period": {"batches": 100}})
    agent = agent_id()
    first = start(det, agent, "agent1")
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM metrics WHERE \"group\" = 'training'")
             .fetchone(), 180, "the first training metrics")
    first.send_signal(signal.SIGKILL)
    first.wait()
    [container] = containers_of(docker_client, agent, status="running")
    det.start("agent2", "agent", "run", "--id", agent, "--slots", "1", "--runtime", "docker")
    waited = det("experiment", "wait", "1", timeout=300, check=False)
    assert waited.returncode == 0, failure(det, "agent2")
    assert f"adopted container {container.short_id}" in det.log("agent2")
    trial = conn.execute("SELECT runs, state::text, steps_completed FROM trials").fetchone()
    assert trial == {"runs": 1, "state": "COMPLETED", "steps_completed": 400}
    run = run_of(conn, 1)
    assert run["exit_code"] == 0 and run["state"] == "TERMINATED"
    # Output written while no agent watched still reached the logs.
    validations = conn.execute("SELECT count(*) AS n FROM metrics WHERE \"group\" = "
                               "'validation'").fetchone()["n"]
    assert validations == 4
    assert "run ended with exit code 0" in det("trial", "logs", "1").stdout


def sleeper(det, tmp_path, agent: str, *reconcile_args: str):
    """A one-trial experiment whose container only sleeps, on agent ``agent``; returns the
    agent's process once the container runs."""
    cfg = digits_config(tmp_path, **{"entrypoint": "echo started; sleep 600", "max_restarts": 0})
    det.start("reconciler", "reconcile", "--interval", "0.5", *reconcile_args)
    first = det.start("agent1", "agent", "run", "--id", agent, "--slots", "1",
                      "--runtime", "docker")
    det("experiment", "create", str(cfg), str(DIGITS))
    return first


def test_kill_stops_the_container_and_removes_it(det, conn, tmp_path, docker_client,
                                                 task_image) -> None:
    agent = agent_id()
    sleeper(det, tmp_path, agent)
    wait_for(lambda: containers_of(docker_client, agent, status="running"), 60, "the container")
    det("experiment", "kill", "1")
    assert det("experiment", "wait", "1", check=False, timeout=60).returncode == 2
    assert run_of(conn, 1)["exit_reason"] == "killed on request"
    wait_for(lambda: not containers_of(docker_client, agent), 30, "the container's removal")


def test_containers_of_runs_that_ended_while_the_agent_was_down_are_removed(
        det, conn, tmp_path, docker_client, task_image) -> None:
    agent = agent_id()
    # Longer than the agent's heartbeat period (5 s), so only the killed agent is lost.
    first = sleeper(det, tmp_path, agent, "--agent-timeout", "8")
    wait_for(lambda: containers_of(docker_client, agent, status="running"), 60, "the container")
    first.send_signal(signal.SIGKILL)
    first.wait()
    wait_for(lambda: run_of(conn, 1)["exit_reason"] == "agent lost", 30,
             "the reconciler to declare the agent lost")
    assert containers_of(docker_client, agent, status="running")  # it outlived its agent
    det.start("agent2", "agent", "run", "--id", agent, "--slots", "1", "--runtime", "docker")
    wait_for(lambda: not containers_of(docker_client, agent), 30, "the leftover's removal")
    assert "removing container" in det.log("agent2")


def test_an_image_that_cannot_be_had_fails_the_run_with_that_reason(
        det, conn, tmp_path, docker_client, task_image) -> None:
    cfg = digits_config(tmp_path, **{"environment": {"image": "det/no-such-image:0"},
                                     "max_restarts": 0})
    start(det, agent_id())
    det("experiment", "create", str(cfg), str(DIGITS))
    assert det("experiment", "wait", "1", timeout=120, check=False).returncode != 0
    run = run_of(conn, 1)
    assert run["exit_code"] is None
    assert run["exit_reason"].startswith("cannot pull image det/no-such-image:0")
    logs = det("trial", "logs", "1").stdout
    assert "pulling image det/no-such-image:0" in logs
    assert "cannot pull image det/no-such-image:0" in logs


def test_out_of_memory_is_reported_as_such(det, conn, tmp_path, docker_client,
                                           task_image) -> None:
    cfg = digits_config(tmp_path, **{
        "entrypoint": "python3 -c 'b = bytearray(1 << 30); print(len(b))'",
        "resources": {"memory_limit": "128M"}, "max_restarts": 0})
    start(det, agent_id())
    det("experiment", "create", str(cfg), str(DIGITS))
    assert det("experiment", "wait", "1", timeout=120, check=False).returncode != 0
    run = run_of(conn, 1)
    assert run["exit_code"] == 137
    assert "out of memory" in run["exit_reason"]


@pytest.fixture(autouse=True)
def _no_leftovers(docker_client):
    """Every container these tests made is gone afterwards, whatever the outcome."""
    yield
    for c in docker_client.containers.list(all=True, filters={"label": LABEL_AGENT}):
        if c.labels[LABEL_AGENT].startswith("dock-"):
            c.remove(force=True)


def test_a_container_task_on_an_agent_of_another_host(hosts_cluster, hosts,  # noqa: F811
                                                      docker_client, task_image,
                                                      tmp_path) -> None:
    """An enrolled agent in another network namespace (another host: its own address, the
    database only through det's TLS gateway) runs a digits trial in a container to COMPLETED:
    the container reaches the gateway over TLS as det_task, verifying it with det's CA, whose
    file the task URL names and the container has at the same path (read-only)."""
    cluster = hosts_cluster
    agent = "remote-dock"
    _start_agent(cluster, hosts[0], agent, slots=1, runtime="docker")
    with _owner(cluster) as c:
        wait_for(lambda: c.execute("SELECT runtime FROM agents WHERE id = %s AND state = "
                                   "'ACTIVE'", (agent,)).fetchone(), 120,
                 "the other host's agent to register")
        assert c.execute("SELECT runtime FROM agents WHERE id = %s", (agent,)).fetchone() == (
            "docker",)
    eid = _experiment(cluster, tmp_path)
    r = cluster("experiment", "wait", str(eid), check=False, timeout=240)
    log = (cluster.logdir / f"{agent}.log").read_text()
    assert r.returncode == 0, cluster("trial", "logs", "1", check=False).stdout + log
    _completes(cluster, eid, 40)
    assert _where_trials_ran(cluster, eid) == [agent]
    assert containers_of(docker_client, agent) == []  # removed once it ended
