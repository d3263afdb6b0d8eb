"""``determined.experimental.client`` (issue 38): upstream's SDK calls against a real det
cluster (a reconciler and a process agent on the test's database), run in this process as a
user's script would: login, create_experiment, get_experiment, wait, get_trial, logs,
iter_metrics, top_checkpoint, list_checkpoints, download, create_model / register_version.
Before issue 38 none of these ran (0 of 7 of the issue's calls: the module did not exist)."""

import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from det.errors import AuthError, DetError, NotFoundError, StateError

CORE = Path(__file__).resolve().parent.parent / "examples" / "determined_compat" / "core_api"
PASSWORD = "a long enough password 38"


@pytest.fixture
def sdk(det, monkeypatch):
    """The client module, this process pointed at the test's cluster as a user's shell would
    be (DET_DB_URL, DET_HOME), with a reconciler and a process agent running."""
    for key, value in det.env.items():
        if key.startswith("DET_"):
            monkeypatch.setenv(key, value)
    det.env = {**det.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
                                  f"{det.env.get('PATH', '')}"}
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2")
    from determined.experimental import _session, client

    monkeypatch.setattr(_session, "_url", None)
    return client


def test_upstream_sdk_calls_run_an_experiment_and_read_it_back(sdk, det, tmp_path,
                                                               monkeypatch) -> None:
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    sdk.login()
    # as a dict (0.38 takes either), keeping all five checkpoints from checkpoint GC
    config = {**yaml.safe_load((ctx / "2_checkpoints.yaml").read_text()),
              "checkpoint_storage": {"save_trial_latest": 5}}
    exp = sdk.create_experiment(config, str(ctx))
    assert exp.state == sdk.ExperimentState.ACTIVE
    assert exp.config["searcher"]["metric"] == "total"

    same = sdk.get_experiment(exp.id)
    assert same.wait(interval=0.5) == sdk.ExperimentState.COMPLETED, det.log("agent")
    trial = exp.await_first_trial()
    assert [t.id for t in exp.list_trials()] == [trial.id]
    trial = sdk.get_trial(trial.id)
    assert trial.state == sdk.TrialState.COMPLETED and trial.experiment_id == exp.id

    training = list(trial.iter_metrics("training"))
    assert [(m.steps_completed, m.metrics["total"]) for m in training] == [
        (10, 5.0), (20, 10.0), (30, 15.0), (40, 20.0), (50, 25.0)]
    assert {m.trial_run_id for m in training} == {1} and training[0].group == "training"
    (validation,) = trial.iter_metrics("validation")
    assert validation.metrics["total"] == 25.0

    lines = list(trial.logs())
    assert list(trial.logs(tail=2)) == lines[-2:]
    assert list(trial.logs(head=1)) == lines[:1]

    with pytest.warns(FutureWarning):
        best = exp.top_checkpoint()
    assert best.training.trial_id == trial.id
    assert best.training.validation_metrics["avgMetrics"]["total"] == 25.0
    assert [c.uuid for c in trial.list_checkpoints(max_results=1)] == [best.uuid]
    by_batches = exp.list_checkpoints(sort_by=sdk.CheckpointSortBy.BATCH_NUMBER,
                                      order_by=sdk.OrderBy.DESC)
    assert len(by_batches) == 5 and by_batches[0].uuid == best.uuid
    # the trial's own log lines: each checkpoint is logged with its uuid
    assert all(any(c.uuid in line for line in lines) for c in by_batches), lines
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert trial.top_checkpoint().uuid == best.uuid

    ckpt = sdk.get_checkpoint(best.uuid)
    assert ckpt.state == sdk.CheckpointState.COMPLETED
    before = ckpt.metadata
    assert before["steps_completed"] == 50
    ckpt.add_metadata({"note": "best", "steps_completed": 50})
    ckpt.add_metadata({"note": "kept"})
    assert sdk.get_checkpoint(best.uuid).metadata == ckpt.metadata == {**before, "note": "kept"}
    with pytest.raises(DetError, match="metadata: expected a JSON object"):
        ckpt.add_metadata(["not", "an object"])
    # the rule a task's metadata obeys (checkpoints_input_check), now on update too
    with pytest.raises(DetError, match="checkpoint metadata"):
        ckpt.add_metadata({"big": "x" * 70_000})
    path = Path(ckpt.download(str(tmp_path / "dl"), mode=sdk.DownloadMode.DIRECT))
    assert json.loads((path / "state.json").read_text()) == {"total": 25.0, "step": 50}
    assert json.loads((path / "metadata.json").read_text())["steps_completed"] == 50
    monkeypatch.chdir(tmp_path)
    assert ckpt.download() == str(Path("checkpoints", best.uuid))
    assert (tmp_path / "checkpoints" / best.uuid / "state.json").exists()

    model = sdk.create_model("digits-sdk", description="from the SDK", metadata={"k": 1})
    assert sdk.get_model("DIGITS-SDK").metadata == {"k": 1}
    version = model.register_version(best.uuid)
    assert (version.model_version, version.checkpoint.uuid) == (1, best.uuid)
    second = by_batches[1]
    model.register_version(second.uuid)
    assert [(v.model_version, v.checkpoint.uuid) for v in model.get_versions()] == [
        (2, second.uuid), (1, best.uuid)]

    assert [e.id for e in sdk.list_experiments(states=[sdk.ExperimentState.COMPLETED])] \
        == [exp.id]
    assert sdk.get_workspace("Uncategorized").name == "Uncategorized"

    # A registered version pins its checkpoint: det's rule, as det's error.
    with pytest.raises(Exception, match="pinned"):
        best.delete()
    oldest = by_batches[-1]
    oldest.delete()
    assert sdk.get_checkpoint(oldest.uuid).state == sdk.CheckpointState.DELETING
    with pytest.raises(StateError, match="DELETING"):
        sdk.get_checkpoint(oldest.uuid).download(str(tmp_path / "gone"))


def test_login_acts_as_that_det_user_under_row_security(sdk, det, tmp_path) -> None:
    """login(user=, password=) connects as that det user: an experiment in a workspace it is
    not a member of is not there for it (RLS) nor may it submit there; what it creates is
    its own; a wrong password is an AuthError naming the user; an HTTP master is refused."""
    det("user", "create", "ann", "--password", PASSWORD)
    det("workspace", "create", "private")
    project_id = int(det("project", "create", "private", "p").stdout.split()[2].rstrip(":"))
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    theirs = sdk.create_experiment(str(ctx / "0_start.yaml"), str(ctx), project_id=project_id)
    with pytest.raises(AuthError, match="ann"):
        sdk.login(user="ann", password="not it")
    sdk.login(user="ann", password=PASSWORD)
    with pytest.raises(NotFoundError):
        sdk.get_experiment(theirs.id)
    with pytest.raises(NotFoundError):
        sdk.create_experiment(str(ctx / "0_start.yaml"), str(ctx), project_id=project_id)
    mine = sdk.create_experiment(str(ctx / "0_start.yaml"), str(ctx))
    assert [e.id for e in sdk.list_experiments(users=["ann"])] == [mine.id]
    assert mine.id not in [e.id for e in sdk.list_experiments(users=["tester"])]
    with pytest.raises(ValueError, match="master"):
        sdk.login(master="http://localhost:8080")


def test_pause_activate_and_kill_act_as_the_cli_does(sdk, det, tmp_path) -> None:
    """Experiment.pause / activate / kill call det_user.experiment_action as `det experiment`
    does; wait() on a PAUSED experiment raises ValueError (0.38's rule), and returns the end
    state once killed."""
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    config = {**yaml.safe_load((ctx / "2_checkpoints.yaml").read_text()),
              "hyperparameters": {"pause": 1}}  # 50 s of steps: long enough to act on
    exp = sdk.create_experiment(config, str(ctx))
    exp.pause()
    with pytest.raises(ValueError, match="paused"):
        exp.wait(interval=0.2)
    exp.activate()
    exp.reload()
    assert exp.state == sdk.ExperimentState.ACTIVE
    exp.await_first_trial()
    exp.kill()
    assert exp.wait(interval=0.5) == sdk.ExperimentState.CANCELED
    with pytest.raises(NotFoundError):
        sdk.get_experiment(exp.id + 100).pause()


def test_the_sdk_and_the_cli_rank_checkpoints_alike(sdk, det, ended) -> None:
    """The SDK's top checkpoint is the one `det experiment download` takes: on a tie of the
    searcher's metric the latest (it took the earliest: the order was written twice, in
    SQL for the CLI and in Python for the SDK)."""
    eid, uuids = ended.make([[(10, 0.5), (20, 0.5), (30, 0.7)]])
    first, tied, worst = uuids[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # 0.38 deprecates top_checkpoint
        top = sdk.get_experiment(eid).top_checkpoint()
    assert top.uuid == tied
    assert [c.uuid for c in sdk.get_experiment(eid).list_checkpoints()] == [tied, first, worst]
    best = json.loads(det("experiment", "list-checkpoints", str(eid), "--best", "1",
                          "--json").stdout)
    assert [c["uuid"] for c in best] == [tied]
    # by a column
    by_steps = sdk.get_trial(sdk.get_experiment(eid).list_trials()[0].id).list_checkpoints(
        sort_by=sdk.CheckpointSortBy.BATCH_NUMBER, order_by=sdk.OrderBy.DESC)
    assert [c.uuid for c in by_steps] == [worst, tied, first]
