"""``determined.experimental.core_v2`` (issue 38): unmanaged runs. A plain ``python
script.py`` (no det task: a user's shell with DET_DB_URL naming them) runs the calls of
upstream's examples/features/unmanaged scripts (Config with external ids, train.report_*,
checkpoint.store_path / restore_path, info.latest_checkpoint, close) against a det database
with a reconciler running beside it: the experiment ends COMPLETED with its metrics and
checkpoints in det, a second run with the same external ids resumes the same trial from its
checkpoint, a script that raises ends ERROR, the reconciler places nothing, and only the
trial's owner may report into it (a Viewer, or another Editor, is refused by the database).
Before issue 38 the module did not exist."""

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

PASSWORD = "a long enough password 38"

# upstream's 2_checkpoints.py (0.38.1), with report_progress from 1_singleton.py and a
# script argument that makes it raise half way (1_error.py's point)
SCRIPT = '''
import random, sys
from determined.experimental import core_v2

core_v2.init(config=core_v2.Config(
    name="unmanaged-2-checkpoints", hparams={"lr": 0.1},
    workspace="vision", project="p",
    searcher={"name": "single", "metric": "loss", "smaller_is_better": True},
    checkpoint_storage=sys.argv[1],
    external_experiment_id="test-unmanaged-2-checkpoints",
    external_trial_id="test-unmanaged-2-checkpoints"))

latest_checkpoint = core_v2.info.latest_checkpoint
initial_i = 0
if latest_checkpoint is not None:
    with core_v2.checkpoint.restore_path(latest_checkpoint) as path:
        initial_i = int((path / "state").read_text().split(",")[0])
print("determined experiment id:", core_v2.info._trial_info.experiment_id,
      "trial", core_v2.info.trial.trial_id, "initial step:", initial_i,
      "preempt", core_v2.preempt.should_preempt(), "searcher", core_v2.searcher)
for i in range(initial_i, initial_i + 20):
    core_v2.train.report_training_metrics(steps_completed=i, metrics={"loss": random.random()})
    if (i + 1) % 10 == 0:
        loss = 1.0 / (i + 1)
        core_v2.train.report_validation_metrics(steps_completed=i, metrics={"loss": loss})
        core_v2.train.report_progress((i + 1) / 40)
        with core_v2.checkpoint.store_path({"steps_completed": i}) as (path, uuid):
            (path / "state").write_text(f"{i},{loss}")
    if len(sys.argv) > 2 and i == initial_i + 5:
        raise RuntimeError("the script failed")
core_v2.close()
'''


def _url(db_url: str, user: str) -> str:
    return make_conninfo(db_url, user=user, password=PASSWORD)


def _passes_since(owner: psycopg.Connection, since: float, n: int = 2) -> None:
    """Wait until the reconciler has run ``n`` passes after ``since`` (its leader row's
    last_pass; each pass records itself)."""
    deadline = time.monotonic() + 60
    seen = 0
    last = None
    while seen < n:
        row = owner.execute("SELECT extract(epoch FROM last_pass) AS t FROM reconciler_leader"
                            ).fetchone()
        if row and row["t"] > since and row["t"] != last:
            seen, last = seen + 1, row["t"]
        assert time.monotonic() < deadline, "the reconciler ran no pass"
        time.sleep(0.2)


@pytest.fixture
def world(det, db_url, tmp_path):
    """Users ann (Editor of workspace vision, the script's user), bob (Editor) and vic
    (Viewer); a reconciler running; the owner's connection."""
    from det.cli.users import password_verifier

    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as owner:
        for user in ("ann", "bob", "vic"):
            owner.execute("SELECT det_user.user_create(%s, %s, false)",
                          (user, password_verifier(owner, user, PASSWORD)))
        owner.execute("SELECT det_user.workspace_create('vision', NULL, NULL, NULL)")
        owner.execute("SELECT det_user.project_create('vision', 'p', '')")
        for role, user in (("Editor", "ann"), ("Editor", "bob"), ("Viewer", "vic")):
            owner.execute("SELECT det_user.role_assign(%s, %s, NULL, 'vision', true)", (role, user))
    det.start("reconciler", "reconcile", "--interval", "0.3")
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as owner:
        yield owner


def _run(det, db_url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python script.py STORAGE [fail]`` as ann, in a plain shell (no det task)."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in det.env.items() if not k.startswith("DET_ALLOCATION")}
    env["DET_DB_URL"] = _url(db_url, "ann")
    return subprocess.run([sys.executable, str(script), str(tmp_path / "ckpts"), *extra],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_an_unmanaged_script_reports_resumes_and_errors(world, det, db_url, tmp_path) -> None:
    owner = world
    r = _run(det, db_url, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "initial step: 0 preempt False searcher None" in r.stdout, r.stdout
    exp = owner.execute("SELECT * FROM experiments").fetchone()
    trial = owner.execute("SELECT * FROM trials").fetchone()
    assert (exp["state"], exp["unmanaged"], exp["owner"], exp["progress"]) == (
        "COMPLETED", True, "ann", 1.0)
    assert (trial["state"], trial["runs"], trial["steps_completed"], trial["best_validation"],
            trial["hparams"]) == ("COMPLETED", 1, 19, 0.05, {"lr": 0.1})
    assert exp["config"]["checkpoint_storage"]["host_path"] == str(tmp_path / "ckpts")
    # it has no searcher: its validation rows are no searcher events
    assert owner.execute("SELECT count(*) AS n FROM searcher_events").fetchone()["n"] == 0

    # det shows it as any experiment: list, describe, its checkpoints, the SDK client
    ann = {"DET_DB_URL": _url(db_url, "ann")}
    assert "unmanaged-2-checkpoints" in det("experiment", "list", **ann).stdout
    described = det("experiment", "describe", str(exp["id"]), "--json", **ann).stdout
    assert '"COMPLETED"' in described
    listed = det("experiment", "list-checkpoints", str(exp["id"]), **ann).stdout
    uuids = [c["uuid"] for c in owner.execute(
        "SELECT uuid::text FROM checkpoints ORDER BY steps_completed")]
    assert len(uuids) == 2 and all(u in listed for u in uuids)
    probe = (f"from determined.experimental import client; e = client.get_experiment("
             f"{exp['id']}); print(e.state.name, e.top_checkpoint(sort_by='loss', "
             f"smaller_is_better=True).uuid)")
    out = subprocess.run([sys.executable, "-c", probe], env={**det.env, **ann},
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["COMPLETED", uuids[1]], out.stderr

    # the WebUI's experiment and trial pages read these (det serve, as an admin)
    from test_api import Server

    server = Server(det.env, tmp_path)
    try:
        for path in (f"experiments/{exp['id']}", f"experiments/{exp['id']}/trials",
                     f"experiments/{exp['id']}/metrics?group=validation&max_points=2000",
                     f"experiments/{exp['id']}/checkpoints", f"trials/{trial['id']}",
                     f"trials/{trial['id']}/metrics?group=training&max_points=2000",
                     f"trials/{trial['id']}/checkpoints", f"trials/{trial['id']}/logs?tail=5000"):
            got = server.client.get(f"/api/v1/{path}")
            assert got.status_code == 200, (path, got.text)
    finally:
        server.stop()

    # the same external ids: the same trial, from its latest checkpoint (step 19)
    r = _run(det, db_url, tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"determined experiment id: {exp['id']} trial {trial['id']} initial step: 19" \
        in r.stdout, r.stdout
    trial = owner.execute("SELECT * FROM trials").fetchone()
    assert (trial["state"], trial["runs"], trial["steps_completed"]) == ("COMPLETED", 2, 29)
    assert owner.execute("SELECT count(*) AS n FROM metrics WHERE \"group\" = 'training' "
                         "AND superseded_by IS NULL").fetchone()["n"] == 40

    # a script that raises: the trial and the experiment end ERROR, the error kept
    r = _run(det, db_url, tmp_path, "fail")
    assert r.returncode == 1 and "the script failed" in r.stderr
    states = owner.execute("SELECT e.state::text AS e, t.state::text AS t, a.exit_reason "
                           "FROM experiments e JOIN trials t ON t.experiment_id = e.id "
                           "JOIN allocations a ON a.trial_id = t.id AND a.run = t.runs"
                           ).fetchone()
    assert states == {"e": "ERROR", "t": "ERROR",
                      "exit_reason": "RuntimeError: the script failed"}
    assert owner.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 1

    # the reconciler beside it placed nothing and searched nothing
    _passes_since(owner, time.time())
    runs = owner.execute("SELECT state::text, slots_needed, agent_id, spec ->> 'kind' AS kind "
                         "FROM allocations").fetchall()
    assert runs == [{"state": "TERMINATED", "slots_needed": 0, "agent_id": None,
                     "kind": "unmanaged"}] * 3
    assert owner.execute("SELECT searcher_state FROM experiments").fetchone() == {
        "searcher_state": None}
    assert owner.execute("SELECT count(*) AS n FROM searcher_ops").fetchone()["n"] == 0


def test_only_the_owner_reports_into_an_unmanaged_trial(world, det, db_url, tmp_path) -> None:
    """The run's own user may; a Viewer of the workspace, or another Editor, is refused by
    the database; a run replaced by a later start, or an ended trial, takes no report."""
    owner = world
    config = json.dumps({"name": "u", "entrypoint": "python x.py", "workspace": "vision",
                         "project": "p", "searcher": {"name": "single", "metric": "loss"}})
    from det.submission import validated_config

    expanded = json.dumps(validated_config(json.loads(config), "test").expanded())
    report = "SELECT det_user.unmanaged_report_metrics(%s, 'training', 1, '{\"loss\": 1}')"
    with psycopg.connect(_url(db_url, "ann"), autocommit=True, row_factory=dict_row) as ann:
        start = ("SELECT det_user.unmanaged_start(%s, '', NULL, NULL, 'x', 't', NULL) "
                 "-> 'allocation_id' AS a")
        first = ann.execute(start, (expanded,)).fetchone()["a"]
        ann.execute(report, (first,))
        # running, it is no job of the queue: det schedules nothing of it
        assert owner.execute("SELECT count(*) AS n FROM reporting.job_queue").fetchone() == {
            "n": 0}
        for user, error in (("vic", psycopg.errors.InsufficientPrivilege),
                            ("bob", psycopg.errors.InsufficientPrivilege)):
            with psycopg.connect(_url(db_url, user), autocommit=True) as other, \
                    pytest.raises(error, match="Editor|only its owner"):
                other.execute(report, (first,))
        second = ann.execute(start, (expanded,)).fetchone()["a"]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replaced"):
            ann.execute(report, (first,))
        ann.execute("SELECT det_user.unmanaged_end(%s, NULL)", (second,))
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="COMPLETED"):
            ann.execute(report, (second,))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="external_experiment"):
            ann.execute("SELECT det_user.unmanaged_start(%s, '', NULL, NULL, NULL, 't', NULL)",
                        (expanded,))
    assert owner.execute("SELECT count(*) AS n FROM metrics").fetchone()["n"] == 1
