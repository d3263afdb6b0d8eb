"""Templates are their workspace's and keep their secrets (issue 32): before, any user's
`SELECT * FROM templates` read another user's S3 secret_key. Now a user outside the workspace
sees none of its templates, a member sees the secrets as '********' in SQL and in
`det template describe/list`, and only a submission by an Editor there gets them, into the
experiment's expanded config. Existing templates move to Uncategorized."""

import json
import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from test_cli import one_line_error
from test_rbac import Cluster

from det.db.migrate import load_migrations, migrate, migrations_dir

SECRET_TEMPLATE = """\
description: team settings
max_restarts: 4
checkpoint_storage:
  type: s3
  bucket: team-ckpts
  access_key: AKIATEAMKEY
  secret_key: team-secret-key-123
environment:
  registry_auth: {username: team, password: registry-pass-456}
  environment_variables: [AWS_SECRET_ACCESS_KEY=env-secret-789, LR=0.1]
"""
SECRETS = ("AKIATEAMKEY", "team-secret-key-123", "registry-pass-456", "env-secret-789")

EXPERIMENT = """\
name: with-secrets
entrypoint: model_def:MyTrial
searcher: {name: single, metric: loss, max_length: {batches: 10}}
"""


@pytest.fixture
def team(db_url: str, det, tmp_path: Path):
    """Workspace 'team' (project p) with alice its Editor, carol its Viewer and bob outside;
    alice has set template 'shared' there, with secrets. Yields (cluster, run det as a user)."""
    c = Cluster(db_url)
    c.owner.execute("SELECT det_user.workspace_create('team', NULL, NULL, NULL)")
    c.owner.execute("SELECT det_user.project_create('team', 'p', '')")
    for name, role in (("alice", "Editor"), ("carol", "Viewer"), ("bob", None)):
        c.user(name)
        if role is not None:
            c.owner.execute("SELECT det_user.role_assign(%s, %s, NULL, 'team', true)", (role, name))

    def as_user(user: str, *args: str, check: bool = True):
        return det(*args, check=check, DET_DB_URL=c.url_of(user), DET_USER=user)

    (tmp_path / "t.yaml").write_text(SECRET_TEMPLATE)
    assert as_user("alice", "template", "set", "shared", str(tmp_path / "t.yaml"),
                   "--workspace", "team").stdout == "Created template shared in workspace team\n"
    yield c, as_user
    c.owner.close()


def test_a_user_outside_the_workspace_sees_none_of_its_templates(team) -> None:
    c, as_user = team
    with c.connect("bob") as bob:
        assert bob.execute("SELECT count(*) AS n FROM reporting.templates").fetchone()["n"] == 0
        assert bob.execute("SELECT count(*) AS n FROM templates").fetchone()["n"] == 0
        assert bob.execute("SELECT count(*) AS n FROM templates WHERE workspace_id = "
                           "(SELECT id FROM workspaces WHERE name = 'team')"
                           ).fetchone()["n"] == 0
        for call in ("det_user.template_expand('team', 'shared')",
                     "det_user.template_remove('team', 'shared')",
                     "det_user.template_set('team', 'shared', '{}', '')"):
            with pytest.raises(psycopg.errors.NoDataFound, match="not found"):
                bob.execute(f"SELECT {call}")
    assert json.loads(as_user("bob", "template", "list", "--json").stdout) == []
    r = as_user("bob", "template", "describe", "shared", "--workspace", "team", check=False)
    assert one_line_error(r) == ("Error: template 'shared' not found in workspace 'team' "
                                 "(det template list shows them)")
    # and a workspace that does not exist reads the same as one bob may not see
    with c.connect("bob") as bob, pytest.raises(psycopg.errors.NoDataFound,
                                                 match="cannot use template .* not found"):
        bob.execute("SELECT det_user.template_expand('nowhere', 'shared')")
    assert c.owner.execute("SELECT count(*) AS n FROM templates").fetchone()["n"] == 1


def test_a_member_reads_secrets_redacted_and_a_submission_gets_them(team, ctx,
                                                                     tmp_path) -> None:
    c, as_user = team
    with c.connect("carol") as carol:
        # the attack of issue 32: SELECT * read another user's secret_key
        for sql in ("SELECT * FROM templates", "SELECT config FROM templates",
                    "SELECT original FROM templates"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                carol.execute(sql)
        row = carol.execute("SELECT * FROM reporting.templates").fetchone()
        assert (row["workspace"], row["name"], row["owner"]) == ("team", "shared", "alice")
        assert row["original"] is None  # its text holds secrets: only the redacted config
        assert row["config"]["checkpoint_storage"] == {
            "type": "s3", "bucket": "team-ckpts", "access_key": "********",
            "secret_key": "********"}
        assert row["config"]["environment"] == {
            "registry_auth": {"username": "team", "password": "********"},
            "environment_variables": ["AWS_SECRET_ACCESS_KEY=********", "LR=0.1"]}
        assert carol.execute("SELECT redacted_config AS c FROM templates").fetchone()["c"] == \
            row["config"]
        # a Viewer may not submit there, so may not expand it either
        with pytest.raises(psycopg.errors.InsufficientPrivilege,
                           match="needs Editor on workspace 'team' to use template"):
            carol.execute("SELECT det_user.template_expand('team', 'shared')")
    for user in ("carol", "alice"):  # the CLI shows them redacted, even to its author
        described = as_user(user, "template", "describe", "shared", "-w", "team")
        listed = as_user(user, "template", "list", "--details", "--json").stdout
        for text in (described.stdout, listed):
            assert "secret_key: '********'" in text or '"secret_key": "********"' in text
            assert not any(secret in text for secret in SECRETS), text
        assert "secret fields shown as ********" in described.stderr

    # the one read that is not redacted: alice's submission into the template's workspace
    (tmp_path / "e.yaml").write_text(EXPERIMENT)
    as_user("alice", "experiment", "create", str(tmp_path / "e.yaml"), str(ctx),
            "--template", "shared", "--workspace", "team", "--project", "p")
    config = c.owner.execute("SELECT config FROM experiments").fetchone()["config"]
    assert config["max_restarts"] == 4
    assert (config["checkpoint_storage"]["access_key"],
            config["checkpoint_storage"]["secret_key"]) == ("AKIATEAMKEY", "team-secret-key-123")
    assert config["environment"]["registry_auth"]["password"] == "registry-pass-456"
    # carol may not submit with it; a submission elsewhere does not find it
    r = as_user("carol", "experiment", "create", str(tmp_path / "e.yaml"), str(ctx),
                "--template", "shared", "--workspace", "team", "--project", "p", check=False)
    assert "needs Editor on workspace 'team'" in one_line_error(r)
    r = as_user("alice", "experiment", "create", str(tmp_path / "e.yaml"), str(ctx),
                "--template", "shared", check=False)
    assert one_line_error(r) == ('Error: template "shared" not found in workspace '
                                 '"Uncategorized"')
    assert c.owner.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 1


def test_editors_write_their_workspaces_templates(team, tmp_path) -> None:
    c, as_user = team
    (tmp_path / "plain.yaml").write_text("# shared\nmax_restarts: 9\n")
    r = as_user("carol", "template", "set", "shared", str(tmp_path / "plain.yaml"), "-w", "team",
                check=False)
    assert "needs Editor on workspace 'team' to set template" in one_line_error(r)
    r = as_user("carol", "template", "remove", "shared", "-w", "team", check=False)
    assert "needs Editor on workspace 'team' to remove template" in one_line_error(r)
    # the same name in another workspace is another template
    as_user("bob", "template", "set", "shared", str(tmp_path / "plain.yaml"))
    assert as_user("bob", "template", "describe", "shared").stdout == \
        "# shared\nmax_restarts: 9\n"  # no secret: the YAML as set, comments included
    with c.connect("alice") as alice:
        rows = alice.execute("SELECT workspace, name, owner FROM reporting.templates "
                             "ORDER BY workspace").fetchall()
    assert [tuple(r.values()) for r in rows] == [("Uncategorized", "shared", "bob"),
                                                 ("team", "shared", "alice")]
    assert as_user("alice", "template", "remove", "shared", "-w", "team").stdout == \
        "Removed template shared from workspace team\n"
    actions = c.owner.execute("SELECT actor, action, detail FROM audit_log "
                              "WHERE object_type = 'template' ORDER BY id").fetchall()
    assert [(a["actor"], a["action"]) for a in actions] == [
        ("alice", "create"), ("bob", "create"), ("alice", "delete")]


def test_secret_names(conn) -> None:
    secret = ["secret_key", "access_key", "password", "passwords", "auth", "identitytoken",
              "registrytoken", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "WANDB_API_KEY",
              "db-password", "credentials", "connection_string", "--api_key"]
    plain = ["bucket", "username", "max_tokens", "tokenizer", "author", "LR", "keys",
             "secretariat", "endpoint_url"]
    got = conn.execute("SELECT n, det_user.secret_name(n) AS s FROM unnest(%s::text[]) n",
                       (secret + plain,)).fetchall()
    assert {r["n"]: r["s"] for r in got} == {**dict.fromkeys(secret, True),
                                             **dict.fromkeys(plain, False)}
    nested = {"hyperparameters": {"opt": {"api_key": "k", "lr": 1}},
              "entrypoint": ["python", "--api_key=k", "x=1"], "password": None}
    assert conn.execute("SELECT det_user.redact_secrets(%s) AS r", (Jsonb(nested),)).fetchone()[
        "r"] == {"hyperparameters": {"opt": {"api_key": "********", "lr": 1}},
                 "entrypoint": ["python", "--api_key=********", "x=1"], "password": None}


def test_existing_templates_move_to_uncategorized(pg_server: str, tmp_path: Path) -> None:
    """A database with templates from before 0026 keeps them, in workspace 1, redacted."""
    before = tmp_path / "before"
    before.mkdir()
    for m in load_migrations():
        if m.version < 26:
            shutil.copy(Path(str(migrations_dir().joinpath(m.file))), before / m.file)
    name = f"det_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        with psycopg.connect(make_conninfo(pg_server, dbname=name), autocommit=True,
                             row_factory=dict_row) as conn:
            migrate(conn, before)
            conn.execute("INSERT INTO templates (name, config, original, owner) "
                         "VALUES ('old', %s, 'old yaml', 'someone')",
                         (Jsonb({"checkpoint_storage": {"type": "s3", "bucket": "b",
                                                        "secret_key": "s3cr3t"}}),))
            migrate(conn)
            row = conn.execute("SELECT workspace_id, name, owner, config, redacted_config, "
                               "redacted_original FROM templates").fetchone()
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    assert (row["workspace_id"], row["name"], row["owner"]) == (1, "old", "someone")
    assert row["config"]["checkpoint_storage"]["secret_key"] == "s3cr3t"
    assert row["redacted_config"]["checkpoint_storage"]["secret_key"] == "********"
    assert row["redacted_original"] is None


def test_the_api_submits_with_a_template_of_the_experiments_workspace(det, det_env, conn, ctx,
                                                                      tmp_path) -> None:
    from test_api import Server, error, packed

    (tmp_path / "t.yaml").write_text(SECRET_TEMPLATE)
    det("template", "set", "shared", str(tmp_path / "t.yaml"))  # Uncategorized
    server = Server(det_env, tmp_path)
    try:
        body = {"config": EXPERIMENT, "context": packed(ctx), "template": "shared"}
        r = server.client.post("/api/v1/experiments", json=body)
        assert r.status_code == 201, r.text
        conn.execute("SELECT det_user.workspace_create('team', NULL, NULL, NULL)")
        conn.execute("SELECT det_user.project_create('team', 'p', '')")
        # the template of the experiment's own workspace: none of that name in 'team'
        assert error(server.client.post("/api/v1/experiments", json={
            **body, "workspace": "team", "project": "p"}), 404) == (
            'template "shared" not found in workspace "team"')
    finally:
        server.stop()
    config = conn.execute("SELECT config FROM experiments").fetchone()["config"]
    assert config["checkpoint_storage"]["secret_key"] == "team-secret-key-123"
