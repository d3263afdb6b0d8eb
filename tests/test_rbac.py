"""Users, workspaces and access control, enforced by PostgreSQL (issue 14): each role allowed
exactly its actions, row-level security in raw SQL, refusals that name role and scope and
write nothing, names stored verbatim."""

import json
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from det.cli.users import password_verifier

CONFIG = {"name": "x", "entrypoint": "true",
          "resources": {"slots_per_trial": 1, "resource_pool": "default", "weight": 1.0},
          "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 1}}}

PASSWORD = "correct horse battery staple"


class Cluster:
    """A det database with users, connecting as each of them (or as its owner)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.owner = psycopg.connect(url, autocommit=True, row_factory=dict_row)

    def user(self, name: str, admin: bool = False) -> None:
        verifier = password_verifier(self.owner, name, PASSWORD)
        self.owner.execute("SELECT det_user.user_create(%s, %s, %s)", (name, verifier, admin))

    def url_of(self, name: str) -> str:
        return make_conninfo(self.url, user=name, password=PASSWORD)

    def connect(self, name: str) -> psycopg.Connection:
        return psycopg.connect(self.url_of(name), autocommit=True, row_factory=dict_row)

    def experiment(self, workspace: str | None = None, project: str | None = None) -> int:
        return self.owner.execute("SELECT det_user.create_experiment(%s, '', NULL, %s, %s) AS id",
                                  (Jsonb(CONFIG), workspace, project)).fetchone()["id"]


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url)
    yield c
    c.owner.close()


def _seed_experiment_data(c: Cluster, exp: int) -> None:
    """A trial with a run, metrics, a checkpoint and a log line, as the reconciler, an agent and
    a task would leave them."""
    c.owner.execute("""
        WITH t AS (INSERT INTO trials (experiment_id, request_id, hparams, seed)
                   VALUES (%(e)s, gen_random_uuid(), '{}', 0) RETURNING id),
             a AS (INSERT INTO allocations (job_id, trial_id, run, resource_pool,
                                            slots_needed, spec)
                   SELECT e.job_id, t.id, 1, 'default', 1, '{}' FROM experiments e, t
                    WHERE e.id = %(e)s RETURNING id, trial_id),
             m AS (INSERT INTO metrics (trial_id, allocation_id, "group", steps_completed,
                                        "values")
                   SELECT a.trial_id, a.id, 'validation', 1, '{"loss": 1}' FROM a),
             k AS (INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed,
                                            storage, resources)
                   SELECT gen_random_uuid(), a.trial_id, a.id, 1, '{}', '{}' FROM a)
        INSERT INTO task_logs (allocation_id, trial_id, stream, line)
        SELECT a.id, a.trial_id, 'stdout', 'hello' FROM a""", {"e": exp})


USER_DATA = ["experiments", "trials", "metrics", "checkpoints", "task_logs", "jobs",
             "allocations", "reporting.experiments", "reporting.trials",
             "reporting.checkpoints", "reporting.job_queue"]


def test_each_user_sees_only_their_workspaces_rows_in_raw_sql(cluster: Cluster) -> None:
    c = cluster
    for name in ("alice", "bob"):
        c.user(name)
        c.owner.execute("SELECT det_user.workspace_create(%s, NULL, NULL, NULL)", (f"ws-{name}",))
        c.owner.execute("SELECT det_user.project_create(%s, 'p', '')", (f"ws-{name}",))
        c.owner.execute("SELECT det_user.role_assign('Editor', %s, NULL, %s, true)",
                        (name, f"ws-{name}"))
        _seed_experiment_data(c, c.experiment(f"ws-{name}", "p"))
    # Uncategorized is everyone's: nothing of alice's or bob's there
    with c.connect("alice") as alice, c.connect("bob") as bob:
        for table in USER_DATA:
            mine = alice.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]
            theirs = bob.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]
            total = c.owner.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"]
            assert mine == theirs == total / 2 > 0, table
        names = [r["name"] for r in alice.execute("SELECT name FROM workspaces ORDER BY id")]
        assert names == ["Uncategorized", "ws-alice"]
        bobs = c.owner.execute("SELECT e.id FROM experiments e JOIN projects p "
                               "ON p.id = e.project_id JOIN workspaces w ON w.id = p.workspace_id "
                               "WHERE w.name = 'ws-bob'").fetchone()["id"]
        # bob's experiment does not exist for alice, whatever she calls
        for call in ("det_user.experiment_action(%s, 'pause')",
                     "det_user.experiment_archive(%s, true)",
                     "det_user.experiment_delete(%s)", "det_user.set_gc_policy(%s, 0, 0, 0)",
                     "det_user.experiment_move(%s, 'ws-alice', 'p')"):
            with pytest.raises(psycopg.errors.NoDataFound, match="not found"):
                alice.execute(f"SELECT {call}", (bobs,))
        # nothing in psql beyond det's own rules: no writes, no audit log, no tokens
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("UPDATE experiments SET state = 'PAUSED'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("SELECT token_hash FROM allocations")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("SELECT * FROM web_sessions")
        assert alice.execute("SELECT count(*) AS n FROM audit_log").fetchone()["n"] == 0


ROLES = ["Viewer", "Editor", "WorkspaceAdmin", "ClusterAdmin", None]

# (action, SQL, the roles allowed). The SQL runs as a user holding the role in workspace
# 'vision' (ClusterAdmin: cluster-wide; None: no role there) inside a transaction that is rolled
# back, so every action meets the same state. {e}: an experiment in vision, {j}: its job.
ACTIONS = [
    ("view", "SELECT 1 / count(*) FROM experiments WHERE id = {e}",
     {"Viewer", "Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("pause", "SELECT det_user.experiment_action({e}, 'pause')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("kill", "SELECT det_user.experiment_action({e}, 'kill')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("priority", "SELECT det_user.job_update({j}, 'priority', '10')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("create experiment",
     f"SELECT det_user.create_experiment('{json.dumps(CONFIG)}', '', NULL, 'vision', 'p')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("move experiment", "SELECT det_user.experiment_move({e}, 'Uncategorized', 'Uncategorized')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("create project", "SELECT det_user.project_create('vision', 'q', '')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("create model", "SELECT det_user.model_create('m', '', NULL, 'vision')",
     {"Editor", "WorkspaceAdmin", "ClusterAdmin"}),
    ("archive workspace", "SELECT det_user.workspace_set_archived('vision', true)",
     {"WorkspaceAdmin", "ClusterAdmin"}),
    ("assign a role in the workspace",
     "SELECT det_user.role_assign('Viewer', 'someone', NULL, 'vision', true)",
     {"WorkspaceAdmin", "ClusterAdmin"}),
    ("create workspace", "SELECT det_user.workspace_create('other', NULL, NULL, NULL)",
     {"ClusterAdmin"}),
    ("create user", "SELECT det_user.user_create('newcomer', NULL, false)", {"ClusterAdmin"}),
    ("disable agent", "SELECT det_user.agent_set_enabled('a1', false)", {"ClusterAdmin"}),
    ("apply cluster config", "SELECT det_user.apply_cluster_config("
     "'{\"resource_pools\": [{\"name\": \"default\"}]}', '')", {"ClusterAdmin"}),
    ("read the audit log", "SELECT 1 / count(*) FROM audit_log", {"ClusterAdmin"}),
]


def test_each_role_is_allowed_exactly_its_actions(cluster: Cluster) -> None:
    c = cluster
    c.owner.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                    (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    c.owner.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    c.owner.execute("SELECT det_user.project_create('vision', 'p', '')")
    c.owner.execute("SELECT det_user.apply_cluster_config(%s, '')", (Jsonb(
        {"resource_manager": {"scheduler": {"type": "priority"}},
         "resource_pools": [{"name": "default"}]}),))
    exp = c.experiment("vision", "p")
    job = c.owner.execute("SELECT job_id FROM experiments WHERE id = %s", (exp,)).fetchone()[
        "job_id"]
    c.user("someone")
    outcome: dict[tuple[str, str | None], bool] = {}
    for i, role in enumerate(ROLES):
        name = f"user{i}"
        c.user(name, admin=role == "ClusterAdmin")
        if role not in (None, "ClusterAdmin"):
            c.owner.execute("SELECT det_user.role_assign(%s, %s, NULL, 'vision', true)",
                            (role, name))
        with c.connect(name) as conn:
            for action, stmt, _ in ACTIONS:
                try:
                    with conn.transaction(force_rollback=True):
                        conn.execute(stmt.replace("{e}", str(exp)).replace("{j}", str(job)))
                    outcome[action, role] = True
                except (psycopg.errors.InsufficientPrivilege, psycopg.errors.NoDataFound,
                        psycopg.errors.DivisionByZero):
                    outcome[action, role] = False
    expected = {(action, role): role in allowed for action, _, allowed in ACTIONS
                for role in ROLES}
    assert outcome == expected


def test_a_refusal_names_role_and_scope_and_writes_nothing(cluster: Cluster, det) -> None:
    c = cluster
    c.user("vic")
    c.owner.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    c.owner.execute("SELECT det_user.project_create('vision', 'p', '')")
    c.owner.execute("SELECT det_user.role_assign('Viewer', 'vic', NULL, 'vision', true)")
    exp = c.experiment("vision", "p")
    audit = c.owner.execute("SELECT count(*) AS n FROM audit_log").fetchone()["n"]
    r = det("experiment", "pause", str(exp), check=False, DET_DB_URL=c.url_of("vic"))
    assert r.returncode == 1
    assert r.stderr.strip() == ("Error: permission denied: needs Editor on workspace 'vision' "
                                f"to pause experiment {exp}")
    r = det("user", "create", "mallory", check=False, DET_DB_URL=c.url_of("vic"))
    assert r.returncode == 1 and "needs ClusterAdmin on the cluster" in r.stderr
    assert c.owner.execute("SELECT state::text AS s FROM experiments WHERE id = %s",
                           (exp,)).fetchone()["s"] == "ACTIVE"
    assert c.owner.execute("SELECT count(*) AS n FROM audit_log").fetchone()["n"] == audit
    assert not c.owner.execute("SELECT 1 FROM pg_roles WHERE rolname = 'mallory'").fetchone()
    # what a Viewer does see: the experiment, its workspace and project
    out = det("experiment", "list", "--json", DET_DB_URL=c.url_of("vic")).stdout
    assert f'"id": {exp}' in out and '"workspace": "vision"' in out and '"project": "p"' in out


def test_the_cli_end_to_end_as_two_users(cluster: Cluster, det, tmp_path) -> None:
    """The admin creates users and a workspace from the CLI; each user works in theirs."""
    c = cluster
    det("user", "create", "alice", "--password", PASSWORD)
    det("user", "create", "bob", "--password", PASSWORD)
    det("workspace", "create", "vision")
    det("project", "create", "vision", "detection", "--description", "boxes")
    det("rbac", "assign-role", "Editor", "--username-to-assign", "alice",
        "--workspace-name", "vision")
    det("user-group", "create", "readers", "--add-user", "bob")
    det("rbac", "assign-role", "Viewer", "-g", "readers", "-w", "vision")
    as_alice, as_bob = {"DET_DB_URL": c.url_of("alice")}, {"DET_DB_URL": c.url_of("bob")}
    (tmp_path / "ctx").mkdir()
    (tmp_path / "exp.yaml").write_text(
        "name: boxes\nentrypoint: 'true'\nworkspace: vision\nproject: detection\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n")
    out = det("experiment", "create", str(tmp_path / "exp.yaml"), str(tmp_path / "ctx"),
              "--force", **as_alice).stdout
    exp = int(out.split()[-1])
    row = c.owner.execute("SELECT e.owner, p.name AS project FROM experiments e "
                          "JOIN projects p ON p.id = e.project_id WHERE e.id = %s",
                          (exp,)).fetchone()
    assert row == {"owner": "alice", "project": "detection"}
    listed = det("experiment", "list", "--workspace", "vision", **as_bob).stdout
    assert "boxes" in listed and "alice" in listed and "detection" in listed
    r = det("experiment", "kill", str(exp), check=False, **as_bob)
    assert r.returncode == 1 and "needs Editor on workspace 'vision'" in r.stderr
    perms = det("rbac", "my-permissions", **as_bob).stdout
    assert "vision" in perms and "view" in perms and "edit" not in perms.split("vision")[1]
    det("experiment", "move", str(exp), "Uncategorized", "Uncategorized", **as_alice)
    assert "boxes" not in det("experiment", "list", "--workspace", "vision", **as_bob).stdout
    r = det("workspace", "delete", "vision", "--yes", check=False)
    assert r.returncode == 0, r.stderr
    log = det("audit", "list", "--json").stdout
    assert '"action": "move"' in log and '"actor": "alice"' in log
    r = det("audit", "list", check=False, **as_alice)
    assert r.returncode == 1 and "needs ClusterAdmin" in r.stderr
    det("user", "deactivate", "bob")
    with pytest.raises(psycopg.OperationalError):
        c.connect("bob")


def test_a_workspace_with_experiments_cannot_be_deleted(cluster: Cluster, det) -> None:
    c = cluster
    c.owner.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
    c.owner.execute("SELECT det_user.project_create('vision', 'p', '')")
    exp = c.experiment("vision", "p")
    r = det("workspace", "delete", "vision", "--yes", check=False)
    assert r.returncode == 1
    assert "still holds 1 experiment(s); move or delete them first" in r.stderr
    assert c.owner.execute("SELECT count(*) AS n FROM workspaces WHERE name = 'vision'"
                           ).fetchone()["n"] == 1
    det("experiment", "move", str(exp), "Uncategorized", "Uncategorized")
    det("workspace", "delete", "vision", "--yes")


def test_bound_pools_serve_only_their_workspaces(cluster: Cluster, det, tmp_path) -> None:
    c = cluster
    c.owner.execute("SELECT det_user.apply_cluster_config(%s, '')", (Jsonb(
        {"resource_pools": [{"name": "default"}, {"name": "gpus"}]}),))
    for ws in ("vision", "nlp"):
        det("workspace", "create", ws, *(["--default-compute-pool", "gpus"]
                                          if ws == "vision" else []))
        det("project", "create", ws, "p")
    det("resource-pool", "bindings", "add", "gpus", "vision")
    (tmp_path / "ctx").mkdir()
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: x\nentrypoint: 'true'\n"
                   "searcher: {name: single, metric: loss, max_length: {batches: 1}}\n")
    out = det("experiment", "create", str(cfg), str(tmp_path / "ctx"), "--force",
              "--workspace", "vision", "--project", "p").stdout
    exp = int(out.split()[-1])
    assert c.owner.execute("SELECT j.resource_pool FROM experiments e JOIN jobs j "
                           "ON j.id = e.job_id WHERE e.id = %s", (exp,)).fetchone()[
        "resource_pool"] == "gpus"
    r = det("experiment", "create", str(cfg), str(tmp_path / "ctx"), "--force",
            "--workspace", "nlp", "--project", "p", "--config", "resources.resource_pool=gpus",
            check=False)
    assert r.returncode == 1
    assert 'resource pool "gpus" is bound to other workspaces than "nlp"' in r.stderr


NASTY = "x'); DROP TABLE experiments;--"


def test_names_are_stored_and_shown_verbatim(cluster: Cluster, det) -> None:
    c = cluster
    det("user", "create", NASTY, "--password", PASSWORD)
    det("workspace", "create", NASTY)
    det("project", "create", NASTY, NASTY)
    det("user-group", "create", NASTY, "--add-user", NASTY)
    det("rbac", "assign-role", "Viewer", "-u", NASTY, "-w", NASTY)
    assert NASTY in det("user", "list").stdout
    assert NASTY in det("workspace", "list").stdout
    assert NASTY in det("project", "list", NASTY).stdout
    assert NASTY in det("user-group", "list").stdout
    with c.connect(NASTY) as conn:
        assert conn.execute("SELECT det_user.caller() AS u").fetchone()["u"] == NASTY
        assert [r["name"] for r in conn.execute("SELECT name FROM workspaces ORDER BY id")] == [
            "Uncategorized", NASTY]
    assert c.owner.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0


def test_passwords_are_postgres_scram_verifiers(cluster: Cluster, det) -> None:
    c = cluster
    det("user", "create", "carol", "--password", PASSWORD)
    stored = c.owner.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'carol'"
                             ).fetchone()["rolpassword"]
    assert stored.startswith("SCRAM-SHA-256$") and PASSWORD not in stored
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="SCRAM-SHA-256 verifier"):
        c.owner.execute("SELECT det_user.user_set_password('carol', 'plain text')")
    det("user", "change-password", "carol", input=f"{PASSWORD}2\n{PASSWORD}2\n")
    with psycopg.connect(make_conninfo(c.url, user="carol", password=f"{PASSWORD}2")) as conn:
        assert conn.execute("SELECT session_user").fetchone()[0] == "carol"


def test_a_bad_workspace_storage_option_is_one_line_naming_it(cluster: Cluster, det,
                                                              tmp_path) -> None:
    """--checkpoint-storage-config with bad JSON, or with the file option too, is an error
    naming the option (it was a TypeError traceback: ConfigError called with one argument)."""
    r = det("workspace", "create", "vision", "--checkpoint-storage-config", "{nope",
            check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("Error: --checkpoint-storage-config: invalid JSON")
    f = tmp_path / "storage.yaml"
    f.write_text("type: shared_fs\nhost_path: /tmp\n")
    r = det("workspace", "create", "vision", "--checkpoint-storage-config", "{}",
            "--checkpoint-storage-config-file", str(f), check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "give it or --checkpoint-storage-config-file, not both" in r.stderr
    assert not cluster.owner.execute("SELECT 1 FROM workspaces WHERE name = 'vision'"
                                     ).fetchone()
