"""Experiments made from an existing one (issue 34; spec run-training-code.rst, "Create an
Experiment": "create an experiment from an existing experiment or trial"): `det experiment fork`
(the experiment's model definition, a new config) and `det trial continue` (one trial that
resumes another from its latest checkpoint, weights and batch count), from the CLI and the API.

The end-to-end test runs real trials (a Core API script whose "weight" grows by its
hyperparameter each batch and lives only in its checkpoints): the continued trial's first
report comes after the checkpoint's batch and its weight goes on from the checkpoint's, which
it can only have read from the checkpoint's files. The refusals inject what would not resume
the trial (a trial with no checkpoint, another searcher, another checkpoint, another storage)
and check that nothing is written.
"""

import re
import sys
from pathlib import Path

import psycopg
import pytest
import yaml
from conftest import Det, EndedExperiments, wait_for
from psycopg.types.json import Jsonb
from test_api import Server

from det import context
from det.configs import load_experiment_config

# A Core API trial: `weight` grows by hparam `scale` each batch and is kept only in its
# checkpoints; each op ends with a checkpoint and a validation.
TRAIN = """
from det.harness import core
with core.init() as ctx:
    step, weight = ctx.info.steps_completed, 0
    if ctx.info.latest_checkpoint:
        with ctx.checkpoint.restore_path(ctx.info.latest_checkpoint) as path:
            weight = int((path / "weight").read_text())
    print(f"start at batch {step}, weight {weight}", flush=True)
    scale = ctx.info.hparams["scale"]
    for op in ctx.searcher.operations():
        while step < op.length:
            step += 1
            weight += scale
            if step % 5 == 0:
                ctx.train.report_training_metrics(step, {"loss": 1 / step, "weight": weight})
                op.report_progress(step)
        with ctx.checkpoint.store_path({"steps_completed": step}) as (path, _):
            (path / "weight").write_text(str(weight))
        ctx.train.report_validation_metrics(step, {"loss": 1 / step, "weight": weight})
        op.report_completed(1 / step)
"""


def train_config(tmp_path: Path) -> tuple[Path, Path]:
    """An experiment of one TRAIN trial of 10 batches with a sampled ``scale``."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"""\
name: original
entrypoint: {sys.executable} train.py
hyperparameters:
  scale: {{type: int, minval: 2, maxval: 9}}
searcher: {{name: random, metric: loss, max_trials: 1, max_length: {{batches: 10}}}}
checkpoint_storage: {{type: shared_fs, host_path: {tmp_path / 'checkpoints'}}}
max_restarts: 0
""")
    return cfg, ctx


def created(out: str) -> int:
    return int(re.search(r"Created experiment (\d+)", out).group(1))


def trial_of(conn: psycopg.Connection, exp_id: int) -> dict:
    return conn.execute("SELECT id, hparams, state::text AS state, steps_completed FROM trials "
                        "WHERE experiment_id = %s", (exp_id,)).fetchone()


def test_fork_and_continue_from_the_cli(det: Det, conn, tmp_path: Path) -> None:
    cfg, ctx = train_config(tmp_path)
    first = created(det("experiment", "create", str(cfg), str(ctx)).stdout)
    det.start("reconciler", "reconcile", "--interval", "0.3")
    det.start("agent", "agent", "run", "--id", "a1", "--slots", "1")
    det("experiment", "wait", str(first), timeout=180)
    source = trial_of(conn, first)
    scale = source["hparams"]["scale"]
    ckpt = conn.execute("SELECT uuid::text AS u FROM checkpoints WHERE trial_id = %s",
                        (source["id"],)).fetchone()["u"]

    # continue: 10 more batches from the checkpoint at 10
    out = det("trial", "continue", str(source["id"]),
              "--config", "searcher.max_length.batches=20").stdout
    assert f"continues trial {source['id']}" in out
    cont = created(out)
    det("experiment", "wait", str(cont), timeout=180)
    trial = trial_of(conn, cont)
    assert trial["hparams"] == source["hparams"] and trial["state"] == "COMPLETED"
    assert trial["steps_completed"] == 20
    steps = [r["steps_completed"] for r in conn.execute(
        "SELECT steps_completed FROM metrics WHERE trial_id = %s AND \"group\" = 'training' "
        "ORDER BY steps_completed", (trial["id"],))]
    assert steps == [15, 20]  # counted from the checkpoint's 10, none trained again
    validation = conn.execute("SELECT \"values\" FROM metrics WHERE trial_id = %s AND "
                              "\"group\" = 'validation'", (trial["id"],)).fetchone()["values"]
    assert validation["weight"] == 20 * scale  # the checkpoint's 10 * scale, read from its files
    logs = det("trial", "logs", str(trial["id"])).stdout
    assert f"start at batch 10, weight {10 * scale}" in logs
    config = conn.execute("SELECT config FROM experiments WHERE id = %s",
                          (cont,)).fetchone()["config"]
    assert config["searcher"]["name"] == "single"
    assert config["searcher"]["source_checkpoint_uuid"] == ckpt
    assert conn.execute("SELECT 1 FROM checkpoint_pins WHERE checkpoint_uuid = %s",
                        (ckpt,)).fetchone()  # the source checkpoint is kept

    # fork: the same model definition, a new config (the original's, renamed and shorter)
    data = yaml.safe_load(cfg.read_text())
    data["name"] = "forked"
    data["searcher"]["max_length"] = {"batches": 5}
    new_cfg = tmp_path / "fork.yaml"
    new_cfg.write_text(yaml.safe_dump(data))
    cfg.unlink()  # the fork reads nothing of the first submission's files
    (ctx / "train.py").unlink()
    out = det("experiment", "fork", str(first), "--config-file", str(new_cfg)).stdout
    assert f"forked from experiment {first}" in out
    fork = created(out)
    det("experiment", "wait", str(fork), timeout=180)
    rows = conn.execute("SELECT id, name, context_id FROM experiments WHERE id IN (%s, %s) "
                        "ORDER BY id", (first, fork)).fetchall()
    assert [r["name"] for r in rows] == ["original", "forked"]
    assert rows[0]["context_id"] == rows[1]["context_id"]
    forked = trial_of(conn, fork)
    assert forked["steps_completed"] == 5  # a fork starts from scratch
    assert "start at batch 0, weight 0" in det("trial", "logs", str(forked["id"])).stdout


SINE = """\
name: sine
entrypoint: model_def:SineTrial
hyperparameters: {global_batch_size: 32, hidden: 16, lr: 0.02}
searcher: {name: single, metric: validation_loss, max_length: {batches: 20}}
min_validation_period: {batches: 10}
reproducibility: {experiment_seed: 7}
checkpoint_storage: {type: shared_fs, host_path: CHECKPOINTS}
max_restarts: 0
"""


def validations(conn: psycopg.Connection, exp_id: int) -> dict[int, float]:
    """The validation_loss of the experiment's trial by batch."""
    return {r["steps_completed"]: r["values"]["validation_loss"] for r in conn.execute(
        "SELECT m.steps_completed, m.\"values\" FROM metrics m JOIN trials t ON t.id = m.trial_id "
        "WHERE t.experiment_id = %s AND m.\"group\" = 'validation'", (exp_id,))}


def test_a_continued_pytorch_trial_trains_on_as_if_never_stopped(det: Det, conn,
                                                                 tmp_path: Path) -> None:
    """A PyTorchTrial trained to batch 20, continued to 40, validates at 30 and 40 exactly as
    the same trial (same seed: a fork with the same experiment_seed) trained straight to 40:
    the continuation loaded the weights, optimizer, data position and RNG state."""
    cfg = tmp_path / "sine.yaml"
    cfg.write_text(SINE.replace("CHECKPOINTS", str(tmp_path / "checkpoints")))
    ctx = str(Path(__file__).resolve().parent.parent / "examples" / "determined_compat"
              / "pytorch")
    first = created(det("experiment", "create", str(cfg), ctx).stdout)
    det.start("reconciler", "reconcile", "--interval", "0.3")
    det.start("agent", "agent", "run", "--id", "a1", "--slots", "1")
    det("experiment", "wait", str(first), timeout=300)
    trial = trial_of(conn, first)["id"]
    cont = created(det("trial", "continue", str(trial),
                       "--config", "searcher.max_length.batches=40").stdout)
    straight = created(det("experiment", "fork", str(first),
                           "--config", "searcher.max_length.batches=40").stdout)
    det("experiment", "wait", str(cont), timeout=300)
    det("experiment", "wait", str(straight), timeout=300)
    resumed, whole = validations(conn, cont), validations(conn, straight)
    assert sorted(resumed) == [30, 40] and sorted(whole) == [10, 20, 30, 40]
    assert validations(conn, first)[20] == pytest.approx(whole[20], abs=1e-9)
    for step in (30, 40):
        assert resumed[step] == pytest.approx(whole[step], abs=1e-9), (step, resumed, whole)


def test_unknown_sources_are_named(det: Det) -> None:
    r = det("experiment", "fork", "999", check=False)
    assert r.returncode == 1 and "experiment 999 not found" in r.stderr
    r = det("trial", "continue", "999", check=False)
    assert r.returncode == 1 and "trial 999 not found" in r.stderr


# -- the rule in SQL: det_user.trial_continue ---------------------------------------------------

def continuable(ended: EndedExperiments, conn) -> tuple[int, str, dict]:
    """An ended experiment whose trial's latest checkpoint is at batch 10. Returns (trial id,
    checkpoint uuid, the expanded config that continues it)."""
    eid, uuids = ended.make([[(5, 0.4), (10, 0.3)]])
    trial = conn.execute("SELECT id FROM trials WHERE experiment_id = %s", (eid,)).fetchone()["id"]
    conn.execute("UPDATE trials SET latest_checkpoint = %s, steps_completed = 10 WHERE id = %s",
                 (uuids[0][1], trial))
    storage = conn.execute("SELECT storage FROM checkpoints WHERE uuid = %s",
                           (uuids[0][1],)).fetchone()["storage"]
    cfg = load_experiment_config(
        "name: c\nentrypoint: model_def:MyTrial\nsearcher: {name: single, metric: loss, "
        f"max_length: {{batches: 20}}, source_checkpoint_uuid: '{uuids[0][1]}'}}\n").expanded()
    cfg["checkpoint_storage"] = storage
    return trial, uuids[0][1], cfg


def test_a_continued_trial_starts_at_the_checkpoint(ended, conn) -> None:
    trial, ckpt, cfg = continuable(ended, conn)
    eid = conn.execute("SELECT det_user.trial_continue(%s, %s, 'c', NULL, NULL) AS id",
                       (trial, Jsonb(cfg))).fetchone()["id"]
    # the trial the searcher creates (sql/reconciler.sql create_trials)
    conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                 "VALUES (%s, gen_random_uuid(), '{}', 1)", (eid,))
    row = conn.execute("SELECT latest_checkpoint::text AS c, steps_completed FROM trials "
                       "WHERE experiment_id = %s", (eid,)).fetchone()
    assert row == {"c": ckpt, "steps_completed": 10}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="pinned"):
        conn.execute("SELECT det_user.delete_checkpoints(%s::uuid[])", ([ckpt],))


@pytest.mark.parametrize(("change", "error"), [
    (lambda c, u: c["searcher"].update(name="random", max_trials=2), "searcher.name"),
    (lambda c, u: c["searcher"].update(source_checkpoint_uuid=u),
     "searcher.source_checkpoint_uuid: expected"),
    (lambda c, u: c["checkpoint_storage"].update(host_path="/elsewhere"), "checkpoint_storage"),
    (lambda c, u: c["searcher"].update(max_length={"batches": 10}),
     "searcher.max_length: 10 batches is not past the checkpoint's 10"),
])
def test_continue_refuses_what_would_not_resume_the_trial(ended, conn, change, error) -> None:
    trial, ckpt, cfg = continuable(ended, conn)
    other = conn.execute("SELECT uuid::text AS u FROM checkpoints WHERE uuid <> %s",
                         (ckpt,)).fetchone()["u"]
    change(cfg, other)
    before = conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=error):
        conn.execute("SELECT det_user.trial_continue(%s, %s, 'c', NULL, NULL)", (trial, Jsonb(cfg)))
    assert conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == before


def test_a_trial_without_a_checkpoint_is_not_continued(ended, conn) -> None:
    trial, _, cfg = continuable(ended, conn)
    conn.execute("UPDATE trials SET latest_checkpoint = NULL WHERE id = %s", (trial,))
    with pytest.raises(psycopg.errors.CheckViolation, match="no checkpoint to continue from"):
        conn.execute("SELECT det_user.trial_continue(%s, %s, 'c', NULL, NULL)", (trial, Jsonb(cfg)))


# -- the API ------------------------------------------------------------------------------------

def test_fork_and_continue_through_the_api(det_env, tmp_path: Path, conn, ctx: Path) -> None:
    text = ("name: api\nentrypoint: model_def:MyTrial\nhyperparameters: {lr: 0.1}\n"
            f"checkpoint_storage: {{type: shared_fs, host_path: {tmp_path / 'ck'}}}\n"
            "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n")
    cfg = load_experiment_config(text).expanded()
    eid = conn.execute("SELECT det_user.create_experiment(%s, %s, %s) AS id",
                       (Jsonb(cfg), text, context.pack(ctx))).fetchone()["id"]
    trial = conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) VALUES "
                         "(%s, gen_random_uuid(), '{\"lr\": 0.1}', 1) RETURNING id",
                         (eid,)).fetchone()["id"]
    server = Server(det_env, tmp_path)
    try:
        api = server.client
        # not taken by POST /experiments/{id}/{action}
        assert api.get(f"/api/v1/experiments/{eid}/fork").json()["config"] == text
        r = api.post(f"/api/v1/experiments/{eid}/fork",
                     json={"config": text.replace("name: api", "name: forked")})
        assert r.status_code == 201, r.text
        assert conn.execute("SELECT name FROM experiments WHERE id = %s",
                            (r.json()["id"],)).fetchone()["name"] == "forked"
        r = api.post(f"/api/v1/experiments/{eid}/fork",
                     json={"config": text.replace("max_length", "max_lenght")})
        assert r.status_code == 400 and "max_lenght" in r.json()["error"]
        assert api.post("/api/v1/experiments/999/fork", json={}).status_code == 404

        r = api.get(f"/api/v1/trials/{trial}/continue")
        assert r.status_code == 409 and "no checkpoint" in r.json()["error"]
        alloc = conn.execute(
            "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
            "state, ended_at, exit_code, settled) SELECT job_id, %s, 1, 'default', 1, '{}', "
            "'TERMINATED', now(), 0, true FROM experiments WHERE id = %s RETURNING id",
            (trial, eid)).fetchone()["id"]
        uuid = conn.execute(
            "INSERT INTO checkpoints (uuid, trial_id, allocation_id, steps_completed, storage, "
            "resources) SELECT gen_random_uuid(), %s, %s, 10, config -> 'checkpoint_storage', "
            "'{}' FROM experiments WHERE id = %s RETURNING uuid::text AS u",
            (trial, alloc, eid)).fetchone()["u"]
        conn.execute("UPDATE trials SET latest_checkpoint = %s, steps_completed = 10 "
                     "WHERE id = %s", (uuid, trial))
        preview = api.get(f"/api/v1/trials/{trial}/continue").json()["config"]
        data = yaml.safe_load(preview)
        assert data["searcher"]["source_checkpoint_uuid"] == uuid
        assert data["hyperparameters"] == {"lr": {"type": "const", "val": 0.1}}
        r = api.post(f"/api/v1/trials/{trial}/continue",
                     json={"config": preview.replace("batches: 10", "batches: 30")})
        assert r.status_code == 201, r.text
        new = conn.execute("SELECT config FROM experiments WHERE id = %s",
                           (r.json()["id"],)).fetchone()["config"]
        assert new["searcher"]["max_length"] == {"batches": 30}
        assert conn.execute("SELECT checkpoint_uuid::text AS u FROM continuations "
                            "WHERE experiment_id = %s", (r.json()["id"],)).fetchone()["u"] == uuid
    finally:
        server.stop()
    wait_for(lambda: server.proc.poll() is not None, 30, "det serve to stop")
