"""The interactive task model (issue 33): one submission path (det.submission) storing a job,
its task and its one never-preempted run in one transaction; who may submit, see, open and
kill a task (row-level security and det_task_* functions)."""

import psycopg
import pytest
from psycopg.rows import dict_row

from det.configs.allocation import AllocationSpec
from det.errors import ConfigError
from det.submission import expand_task_config, submit_task
from tests.test_rbac import Cluster


@pytest.fixture
def cluster(db_url: str):
    c = Cluster(db_url)
    yield c
    c.owner.close()


def _notebook(conn, **kw) -> int:
    expanded = expand_task_config(conn, "NOTEBOOK", "idle_timeout: 20s\n", "notebook.yaml")
    return submit_task(conn, "NOTEBOOK", expanded, **kw)


def test_a_notebook_is_one_job_one_task_one_unpreemptible_run(conn) -> None:
    job = _notebook(conn)
    row = conn.execute("SELECT j.type, j.resource_pool, t.description, t.config, "
                       "a.slots_needed, a.preemptible, a.state::text, a.spec "
                       "FROM jobs j JOIN tasks t ON t.job_id = j.id "
                       "JOIN allocations a ON a.job_id = j.id WHERE j.id = %s", (job,)).fetchall()
    assert len(row) == 1
    r = row[0]
    assert (r["type"], r["resource_pool"], r["slots_needed"], r["preemptible"], r["state"]) == (
        "NOTEBOOK", "default", 1, False, "PENDING")
    assert r["description"] == f"Notebook {job}"
    assert r["config"]["idle_timeout"] == 20.0
    spec = AllocationSpec.parse(r["spec"], 0)
    assert spec.kind == "notebook" and spec.task is not None and spec.task.job_id == job
    assert spec.argv("python3") == ["python3", "-m", "det.harness.interactive", "notebook"]
    secrets = conn.execute("SELECT * FROM task_secrets WHERE job_id = %s", (job,)).fetchone()
    assert secrets["ssh_private_key"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert secrets["ssh_public_key"].startswith("ssh-ed25519 ")
    assert len(secrets["jupyter_token"]) >= 40


def test_zero_slot_tasks_go_to_the_default_aux_pool(conn) -> None:
    conn.execute("INSERT INTO resource_pools (name) VALUES ('aux'), ('gpu')")
    conn.execute("UPDATE workspaces SET default_aux_pool = 'aux', default_compute_pool = 'gpu' "
                 "WHERE name = 'Uncategorized'")
    tb = expand_task_config(conn, "TENSORBOARD", None, "tb")
    nb = expand_task_config(conn, "NOTEBOOK", None, "nb")
    zero = expand_task_config(conn, "COMMAND", None, "cmd", ["resources.slots=0"],
                              entrypoint=["true"])
    assert (tb["resources"], nb["resources"]["resource_pool"],
            zero["resources"]["resource_pool"]) == (
        {**tb["resources"], "slots": 0, "resource_pool": "aux"}, "gpu", "aux")


def test_bad_task_configs_name_the_key(conn) -> None:
    with pytest.raises(ConfigError, match="notebook_idle_type"):
        expand_task_config(conn, "NOTEBOOK", "notebook_idle_type: sometimes\n", "nb.yaml")
    with pytest.raises(ConfigError, match="idle_timeout.*duration.*got 'soon'"):
        expand_task_config(conn, "NOTEBOOK", "idle_timeout: soon\n", "nb.yaml")
    with pytest.raises(ConfigError, match="unknown key 'searcher'"):
        expand_task_config(conn, "SHELL", "searcher: {}\n", "sh.yaml")
    with pytest.raises(ConfigError, match="entrypoint.*command to run"):
        expand_task_config(conn, "COMMAND", None, "cmd")
    with pytest.raises(ConfigError, match="idle_timeout.*never idle"):
        expand_task_config(conn, "COMMAND", "idle_timeout: 1m\n", "cmd", entrypoint=["true"])


def test_slots_no_agent_can_hold_are_refused_and_nothing_is_written(conn) -> None:
    conn.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', "
                 "'[{\"slot_id\": 0, \"type\": \"cpu\"}]'::jsonb)")
    big = expand_task_config(conn, "COMMAND", None, "cmd", ["resources.slots=4"],
                             entrypoint=["true"])
    with pytest.raises(ConfigError, match="resources.slots"):
        submit_task(conn, "COMMAND", big)
    assert conn.execute("SELECT count(*) AS n FROM tasks").fetchone()["n"] == 0
    assert submit_task(conn, "COMMAND", big, force=True) > 0


def test_who_may_submit_see_open_and_kill(cluster: Cluster) -> None:
    owner = cluster.owner
    owner.execute("SELECT det_user.workspace_create('team', NULL, NULL, NULL)")
    owner.execute("SELECT det_user.project_create('team', 'p', '')")
    for name in ("ed", "viewer", "outsider"):
        cluster.user(name)
    owner.execute("SELECT det_user.role_assign('Editor', 'ed', NULL, 'team', true)")
    owner.execute("SELECT det_user.role_assign('Viewer', 'viewer', NULL, 'team', true)")
    ed, viewer, outsider = (cluster.connect(n) for n in ("ed", "viewer", "outsider"))
    exp = cluster.experiment("team", "p")
    nb = _notebook(ed, workspace="team", project="p")
    tb = submit_task(ed, "TENSORBOARD", expand_task_config(ed, "TENSORBOARD", None, "tb"),
                     workspace="team", project="p", experiment_ids=[exp])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        _notebook(viewer, workspace="team", project="p")
    with pytest.raises(psycopg.errors.NoDataFound, match="experiment 999999: not found"):
        submit_task(ed, "TENSORBOARD", expand_task_config(ed, "TENSORBOARD", None, "tb"),
                    workspace="team", project="p", experiment_ids=[999999])
    # outsiders see nothing of it, in SQL or through the functions
    assert outsider.execute("SELECT count(*) AS n FROM tasks").fetchone()["n"] == 0
    with pytest.raises(psycopg.errors.NoDataFound):
        outsider.execute("SELECT * FROM det_user.task_open(%s)", (tb,))
    with pytest.raises(psycopg.errors.NoDataFound):
        outsider.execute("SELECT det_user.task_kill(%s)", (nb,))
    # TensorBoard submissions by an outsider over the team's experiment are refused
    with pytest.raises(psycopg.errors.NoDataFound):
        submit_task(outsider, "TENSORBOARD",
                    expand_task_config(outsider, "TENSORBOARD", None, "tb"),
                    experiment_ids=[exp])
    # a Viewer sees both and opens the TensorBoard, not the notebook (it runs code)
    assert viewer.execute("SELECT count(*) AS n FROM tasks").fetchone()["n"] == 2
    opened = viewer.execute("SELECT * FROM det_user.task_open(%s)", (tb,)).fetchone()
    assert (opened["type"], opened["state"], opened["address"]) == ("TENSORBOARD", "PENDING",
                                                                     None)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="Editor"):
        viewer.execute("SELECT * FROM det_user.task_open(%s)", (nb,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        viewer.execute("SELECT det_user.task_kill(%s)", (nb,))
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        viewer.execute("SELECT * FROM task_secrets")
    assert ed.execute("SELECT jupyter_token FROM det_user.task_open(%s)",
                      (nb,)).fetchone()["jupyter_token"]
    ed.execute("SELECT det_user.task_kill(%s)", (nb,))
    row = owner.execute("SELECT a.desired_state::text, t.end_reason FROM allocations a "
                        "JOIN tasks t ON t.job_id = a.job_id WHERE a.job_id = %s",
                        (nb,)).fetchone()
    assert row == {"desired_state": "KILLED", "end_reason": "killed by ed"}
    for c in (ed, viewer, outsider):
        c.close()


def test_the_task_reports_its_address_and_activity_with_its_token(conn, db_url) -> None:
    job = _notebook(conn)
    conn.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', "
                 "'[{\"slot_id\": 0, \"type\": \"cpu\"}]'::jsonb)")
    alloc = conn.execute("SELECT id FROM allocations WHERE job_id = %s", (job,)).fetchone()["id"]
    conn.execute("UPDATE allocations SET state = 'ASSIGNED', agent_id = 'a1', assigned_at = now()"
                 " WHERE id = %s", (alloc,))
    token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as task:
        secrets = task.execute("SELECT det_task.secrets(%s) AS s", (token,)).fetchone()["s"]
        assert set(secrets) == {"job_id", "jupyter_token", "ssh_public_key"}
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="host:port"):
            task.execute("SELECT det_task.ready(%s, 'no port')", (token,))
        task.execute("SELECT det_task.ready(%s, '127.0.0.1:8888')", (token,))
        task.execute("SELECT det_task.activity(%s, now() + interval '1 hour')", (token,))
    row = conn.execute("SELECT a.address, t.last_activity <= now() AS sane FROM allocations a "
                       "JOIN tasks t ON t.job_id = a.job_id WHERE a.id = %s", (alloc,)).fetchone()
    assert row == {"address": "127.0.0.1:8888", "sane": True}
