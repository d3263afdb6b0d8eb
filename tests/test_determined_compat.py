"""Issue 13: code and configs written for Determined 0.38 run on det unchanged.

The programs under ``examples/determined_compat/`` are written in the style of Determined's
documentation (Core API steps, a ``PyTorchTrial`` with the ``Trainer``); each runs here
off-cluster (``python3 script.py``) and on a det cluster to COMPLETED, unchanged.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import torch
from conftest import wait_for
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb
from test_asha import reference_stops, searcher_of

from det.configs import parse_experiment_config
from det.harness import core
from det.harness.errors import MissingSearcherMetricError
from det.harness.transport import LocalTransport
from det.reconciler.passes import Settings, run_pass
from det.reconciler.searchers.asha import asha_brackets, trial_rungs

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "determined_compat"
CORE = EXAMPLES / "core_api"

# The order the searcher read its events in: by the pass that consumed them (the transaction
# of the update that marked them, xmin), then by id as each pass reads them. Ids alone are not
# it: an event whose insert commits after a later id's is read by a later pass.
READ_ORDER = " ORDER BY v.xmin::text::bigint, v.id"


def validation_events(conn: psycopg.Connection, experiment: int) -> list[dict]:
    """The validation rows the searcher of ``experiment`` read, in its order: (rid, floor of
    its time metric, its searcher metric)."""
    return conn.execute(
        "SELECT t.request_id::text AS rid, "
        "       floor((m.\"values\" ->> s.time_metric)::numeric)::bigint AS time, "
        "       (m.\"values\" ->> s.metric)::float8 AS metric "
        "  FROM searcher_events v JOIN trials t ON t.id = v.trial_id "
        "  JOIN metrics m ON m.id = (v.payload ->> 'metrics_id')::bigint "
        "  JOIN experiments e ON e.id = v.experiment_id, "
        "       jsonb_to_record(e.config -> 'searcher') AS s(time_metric text, metric text) "
        " WHERE v.experiment_id = %s AND v.kind = 'validation_reported' AND v.consumed "
        + READ_ORDER, (experiment,)).fetchall()


def _python_first(env: dict[str, str]) -> dict[str, str]:
    """Tasks' ``python3`` (entrypoints are shell commands) is this interpreter."""
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def _off_cluster(script: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DET_")}
    env["HOME"] = str(home)
    env.pop("XDG_DATA_HOME", None)
    return subprocess.run([sys.executable, str(script), *args], cwd=script.parent, env=env,
                          capture_output=True, text=True, timeout=300)


# --- off-cluster ---------------------------------------------------------------------------

@pytest.mark.parametrize("step", ["0_start", "1_metrics", "2_checkpoints", "3_hpsearch",
                                  "3_hpsearch_asha", "4_searcher_ops"])
def test_core_api_steps_run_off_cluster(step: str, tmp_path: Path) -> None:
    r = _off_cluster(CORE / f"{step}.py", tmp_path)
    assert r.returncode == 0, r.stderr


def test_off_cluster_core_context_logs_metrics_and_stores_checkpoints_locally(
        tmp_path: Path) -> None:
    """As Determined's dummy contexts: metrics logged, checkpoints under
    ~/.local/share/determined, one searcher op of length 1, no cluster info."""
    r = _off_cluster(CORE / "2_checkpoints.py", tmp_path)
    assert "report_validation_metrics(steps_completed=50, metrics={'total': 25.0})" in r.stderr
    stored = sorted((tmp_path / ".local/share/determined").iterdir())
    assert len(stored) == 5
    state = json.loads((stored[0] / "state.json").read_text())
    assert state["step"] in (10, 20, 30, 40, 50)
    assert json.loads((stored[0] / "metadata.json").read_text())["steps_completed"] == state["step"]
    r = _off_cluster(CORE / "4_searcher_ops.py", tmp_path)
    assert "report_validation_metrics(steps_completed=1, metrics={'total': 1})" in r.stderr


# --- on a det cluster ----------------------------------------------------------------------

def _run_on_cluster(det, conn, config: Path, context: Path, timeout: float = 240) -> int:
    det.env = _python_first(det.env)
    out = det("experiment", "create", str(config), str(context)).stdout
    exp = int(out.split()[-1])
    if not det.procs:
        det.start("reconciler", "reconcile", "--interval", "0.5")
        det.start("agent", "agent", "run", "--slots", "4")
    r = det("experiment", "wait", str(exp), check=False, timeout=timeout)
    logs = "".join(det("trial", "logs", str(t["id"])).stdout for t in conn.execute(
        "SELECT id FROM trials WHERE experiment_id = %s", (exp,)).fetchall())
    assert r.returncode == 0, r.stdout + r.stderr + logs
    return exp


def test_core_api_steps_complete_on_a_det_cluster(det, conn, tmp_path) -> None:
    """Steps 0-4, unchanged, each to COMPLETED; their metrics and checkpoints in the tables."""
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    for step in ("0_start", "1_metrics", "2_checkpoints", "3_hpsearch", "4_searcher_ops"):
        _run_on_cluster(det, conn, ctx / f"{step}.yaml", ctx)
    metrics = conn.execute(
        "SELECT t.experiment_id AS e, m.\"group\" AS g, count(*) AS n FROM metrics m "
        "JOIN trials t ON t.id = m.trial_id GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
    assert {(r["e"], r["g"]): r["n"] for r in metrics} == {
        (2, "training"): 5, (2, "validation"): 1,
        (3, "training"): 5, (3, "validation"): 1,
        (4, "training"): 3 * 4, (4, "validation"): 3 * 4,
        (5, "training"): 4, (5, "validation"): 1,
    }
    checkpoints = conn.execute(
        "SELECT t.experiment_id AS e, count(*) AS n FROM checkpoints c JOIN trials t "
        "ON t.id = c.trial_id GROUP BY 1 ORDER BY 1").fetchall()
    assert [(r["e"], r["n"]) for r in checkpoints] == [(3, 5), (5, 1)]
    trials = conn.execute("SELECT experiment_id AS e, count(*) AS n FROM trials "
                          "GROUP BY 1 ORDER BY 1").fetchall()
    assert [r["n"] for r in trials] == [1, 1, 1, 3, 1]


def test_deleting_an_experiment_without_checkpoints_removes_its_tensorboard_files(
        det, conn, tmp_path) -> None:
    """Step 1 reports metrics and stores no checkpoint; its metrics still became TensorBoard
    files, which `det experiment delete` removes (through a GC task) before the rows go."""
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    exp = _run_on_cluster(det, conn, ctx / "1_metrics.yaml", ctx)
    assert conn.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"] == 0
    files = Path(det.env["DET_HOME"]) / "checkpoints" / f"tensorboard/experiment/{exp}"
    assert any(p.is_file() for p in files.rglob("*"))
    det("experiment", "delete", "--yes", str(exp))
    wait_for(lambda: conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0,
             90, "the experiment's rows to go")
    assert not files.exists()
    gc = conn.execute("SELECT count(*) AS n FROM allocations").fetchone()["n"]
    assert gc == 0, "the GC task's row went with the experiment's"


def test_core_api_asha_with_max_time_stops_trials_through_should_preempt(det, conn, tmp_path
                                                                          ) -> None:
    """0.38's adaptive_asha (max_time + time_metric, no max_length) with a script that trains
    its own length, never reads searcher operations and reports `batches` with each
    validation: the searcher stops the trials below a rung's cut, each stopped run sees
    should_preempt() and exits, and the search completes. Which trials reach max_time is
    what 0.38's rule gives for the reports in the order the searcher read them."""
    ctx = tmp_path / "core_api"
    shutil.copytree(CORE, ctx)
    exp = _run_on_cluster(det, conn, ctx / "3_hpsearch_asha.yaml", ctx)
    assert conn.execute("SELECT state::text AS s FROM experiments WHERE id = %s",
                        (exp,)).fetchone()["s"] == "COMPLETED"
    trials = conn.execute(
        "SELECT t.id, t.request_id::text AS rid, t.state::text AS state, t.closed, "
        "       max(m.steps_completed) AS last, bool_or(a.preempt_acked) AS acked, "
        "       bool_or(a.desired_state = 'STOPPED') AS told "
        "  FROM trials t JOIN allocations a ON a.trial_id = t.id "
        "  JOIN metrics m ON m.trial_id = t.id AND m.\"group\" = 'validation' "
        " WHERE t.experiment_id = %s GROUP BY t.id ORDER BY t.id", (exp,)).fetchall()
    assert len(trials) == 8
    assert all(t["state"] == "COMPLETED" and t["closed"] for t in trials)

    # Each validation row was one searcher event: (trial, batches, loss), in its order.
    events = validation_events(conn, exp)
    rows = conn.execute(
        "SELECT t.request_id::text AS rid, (m.\"values\" ->> 'batches')::int AS time, "
        "       (m.\"values\" ->> 'loss')::float8 AS metric "
        "  FROM metrics m JOIN trials t ON t.id = m.trial_id "
        " WHERE t.experiment_id = %s AND m.\"group\" = 'validation'", (exp,)).fetchall()
    key = lambda r: (r["rid"], r["time"], r["metric"])  # noqa: E731
    assert sorted(map(key, events)) == sorted(map(key, rows))

    config = conn.execute("SELECT config, searcher_state FROM experiments WHERE id = %s",
                          (exp,)).fetchone()
    (bracket,) = asha_brackets(searcher_of(config["config"]))
    assert bracket.rungs == (4, 8, 16, 32)
    stopped, rung_of = reference_stops(bracket.rungs, 2, [key(e) for e in events])
    assert stopped == {t["rid"] for t in trials}  # 0.38 stops every trial, at the top too
    top = {rid for rid, rung in rung_of.items() if rung == len(bracket.rungs) - 1}
    rungs = trial_rungs(config["config"], config["searcher_state"])
    assert {rid for rid, r in rungs.items() if r.status == "done"} == top
    assert {rid: r.rung for rid, r in rungs.items()} == rung_of
    # The trials stopped below the top learned it through should_preempt (acknowledged) and
    # ended before max_time, each saving a checkpoint on its way out.
    early = [t for t in trials if t["rid"] not in top]
    assert early and all(t["told"] and t["acked"] and t["last"] < 32 for t in early)
    assert 1 <= len(top) < 8
    checkpointed = {r["rid"] for r in conn.execute(
        "SELECT DISTINCT t.request_id::text AS rid FROM checkpoints c JOIN trials t "
        "ON t.id = c.trial_id WHERE t.experiment_id = %s", (exp,)).fetchall()}
    assert {t["rid"] for t in early} <= checkpointed


def asha_time_config(**searcher: object) -> dict:
    return parse_experiment_config({
        "name": "x", "entrypoint": "true",
        "hyperparameters": {"rate": {"type": "double", "minval": 0.1, "maxval": 0.5}},
        "searcher": {"name": "adaptive_asha", "metric": "loss", "max_trials": 2,
                     "time_metric": "batches", "max_time": 8, **searcher},
        "reproducibility": {"experiment_seed": 1}}).expanded()


def task_token(conn, config: dict) -> tuple[int, str]:
    """A trial of a new experiment with ``config`` and the token of its claimed run."""
    eid = conn.execute("SELECT det_user.create_experiment(%s, '', NULL) AS id",
                       (Jsonb(config),)).fetchone()["id"]
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": 0, "type": "cpu"}]),))
    trial = conn.execute("INSERT INTO trials (experiment_id, request_id, hparams, seed) "
                         "VALUES (%s, gen_random_uuid(), '{}', 0) RETURNING id",
                         (eid,)).fetchone()["id"]
    alloc = conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id) SELECT job_id, %s, 1, 'default', 1, '{}', 'ASSIGNED', 'a1' "
        "FROM experiments WHERE id = %s RETURNING id", (trial, eid)).fetchone()["id"]
    return trial, conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]


def test_validation_metrics_without_the_time_metric_are_refused() -> None:
    """Under max_time + time_metric every validation report is a searcher result: it must
    carry searcher.metric and a number under searcher.time_metric (a tensor counts)."""
    config = asha_time_config()
    with core.init(transport=LocalTransport(config, {}, echo=False)) as ctx:
        with pytest.raises(MissingSearcherMetricError,
                           match=r"time metric 'batches' \(searcher.time_metric\)"):
            ctx.train.report_validation_metrics(4, {"loss": 1.0, "batches": "4"})
        with pytest.raises(MissingSearcherMetricError, match=r"searcher metric 'loss'"):
            ctx.train.report_validation_metrics(4, {"batches": 4})
        ctx.train.report_validation_metrics(4, {"loss": 1.0, "batches": torch.tensor(4)})
        assert ctx.transport.metrics == [("validation", 4, {"loss": 1.0, "batches": 4})]


def test_validation_rows_are_the_searchers_events_under_max_time(conn) -> None:
    """Under max_time + time_metric the searcher's results are the validation rows carrying
    a number under the time metric, at floor(time), a metric that is not a number ranking
    worst; training rows and the op's completion are none. Every row is recorded and the pass
    that reads the events consumes them all; a second pass changes nothing."""
    config = asha_time_config(divisor=2, mode="aggressive")  # rungs at 4 and 8 batches
    conn.execute("SELECT det_user.create_experiment(%s, '', NULL)", (Jsonb(config),))
    conn.execute("SELECT det_agent.register('a1', 'host', 'default', 'process', %s)",
                 (Jsonb([{"slot_id": i, "type": "cpu"} for i in range(2)]),))
    run_pass(conn, Settings(), "test")
    runs = conn.execute(
        "SELECT t.request_id::text AS rid, det_agent.claim('a1', a.id) AS token, o.id AS op "
        "  FROM allocations a JOIN trials t ON t.id = a.trial_id "
        "  JOIN searcher_ops o ON o.trial_id = t.id ORDER BY t.id").fetchall()
    (a, a_token, a_op), (b, b_token, _) = (r.values() for r in runs)

    def report(token: str, rows: list[tuple[str, int, dict]]) -> None:
        conn.execute("SELECT det_task.report_metrics_batch(%s, NULL, NULL, %s, %s, %s::jsonb[])",
                     (token, [r[0] for r in rows], [r[1] for r in rows],
                      [Jsonb(r[2]) for r in rows]))

    # a: at rung 4 alone, so it goes on; the training row and its op's completion (8, the
    # top rung) would stop it if they were results
    report(a_token, [("training", 8, {"loss": 0.1, "batches": 8}),
                     ("validation", 4, {"loss": 1.0, "batches": 4.7}),
                     ("validation", 6, {"loss": 0.5})])
    conn.execute("SELECT det_task.complete_op(%s, %s, 0.5)", (a_token, a_op))
    report(b_token, [("validation", 4, {"loss": "NaN", "batches": 4})])  # behind a: stopped
    run_pass(conn, Settings(), "test")
    state = conn.execute("SELECT config, searcher_state FROM experiments").fetchone()
    rungs = trial_rungs(state["config"], state["searcher_state"])
    assert {rid: (r.rung, r.status) for rid, r in rungs.items()} == {
        a: (1, "promoted"), b: (0, "stopped")}
    assert [(e["id"], e["metric"]) for e in
            state["searcher_state"]["method_state"]["brackets"][0]["rungs"][0]] == [
        (a, 1.0), (b, None)]
    assert [(t["request_id"], t["length"]) for t in state["searcher_state"]["trials"]] == [
        (a, 4), (b, 4)]
    assert conn.execute("SELECT kind, count(*) AS n, bool_and(consumed) AS consumed "
                        "FROM searcher_events GROUP BY kind ORDER BY kind").fetchall() == [
        {"kind": "validation_completed", "n": 1, "consumed": True},
        {"kind": "validation_reported", "n": 3, "consumed": True}]
    run_pass(conn, Settings(), "test")
    assert conn.execute("SELECT searcher_state FROM experiments").fetchone()[
        "searcher_state"] == state["searcher_state"]


METADATA_SCRIPT = """
import determined as det

with det.core.init() as core_context:
    print("start:", core_context.train.get_metadata())
    core_context.train.set_metadata({"data": {"rows": 100}, "tags": ["a", "b"]})
    merged = core_context.train.set_metadata({"data": {"source": "s3", "rows": 100}})
    print("merged:", merged)
    try:
        core_context.train.set_metadata({"data": {"rows": 5}})
    except Exception as e:  # 0.38 raises its API error type here
        print("refused:", e)
    print("end:", core_context.train.get_metadata())
"""


def test_trial_metadata_is_set_and_read_by_the_trials_code(det, conn, tmp_path) -> None:
    """TrainContext.set_metadata / get_metadata on a det cluster: keys are added and nested
    objects merged into trials.metadata; a key set to another value is refused, naming it;
    `det trial describe` shows it."""
    (tmp_path / "meta.py").write_text(METADATA_SCRIPT)
    (tmp_path / "meta.yaml").write_text(
        "name: metadata\nentrypoint: python3 meta.py\n"
        "searcher: {name: single, metric: loss}\nmax_restarts: 0\n")
    exp = _run_on_cluster(det, conn, tmp_path / "meta.yaml", tmp_path)
    trial = conn.execute("SELECT id, metadata FROM trials WHERE experiment_id = %s",
                         (exp,)).fetchone()
    expected = {"data": {"rows": 100, "source": "s3"}, "tags": ["a", "b"]}
    assert trial["metadata"] == expected
    logs = det("trial", "logs", str(trial["id"])).stdout
    assert "start: {}" in logs and f"merged: {expected}" in logs and f"end: {expected}" in logs
    assert 'refused: metadata key "data.rows" is already set (to 100)' in logs
    described = json.loads(det("trial", "describe", str(trial["id"]), "--json").stdout)
    assert described["metadata"] == expected


def test_trial_metadata_functions_check_the_token_and_the_shape(conn) -> None:
    _, token = task_token(conn, asha_time_config())
    with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification):
        conn.execute("SELECT det_task.set_trial_metadata('forged', '{}')")
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match="must be a JSON object, not array"):
        conn.execute("SELECT det_task.set_trial_metadata(%s, '[1]')", (token,))
    assert conn.execute("SELECT det_task.set_trial_metadata(%s, %s) AS m",
                        (token, Jsonb({"a": {"b": 1}}))).fetchone()["m"] == {"a": {"b": 1}}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='key "a" is already set'):
        conn.execute("SELECT det_task.set_trial_metadata(%s, '{\"a\": 2}')", (token,))
    assert conn.execute("SELECT det_task.trial_metadata(%s) AS m", (token,)).fetchone()["m"] == {
        "a": {"b": 1}}


def test_off_cluster_metadata_follows_the_same_rule(tmp_path) -> None:
    """Off-cluster the metadata lives in the process (the reference's dummy context has none
    and raises AttributeError); the merge rule is the database's."""
    (tmp_path / "meta.py").write_text(METADATA_SCRIPT)
    r = _off_cluster(tmp_path / "meta.py", tmp_path)
    assert r.returncode == 0, r.stderr
    expected = {"data": {"rows": 100, "source": "s3"}, "tags": ["a", "b"]}
    assert f"end: {expected}" in r.stdout
    assert 'refused: metadata key "data.rows" is already set (to 100)' in r.stdout


# --- determined.pytorch --------------------------------------------------------------------

PYTORCH = EXAMPLES / "pytorch"


def test_trainer_under_asha_with_max_time_reports_the_time_metric(det, conn, tmp_path) -> None:
    """The Trainer script, unchanged, under 0.38's adaptive_asha form: its validations carry
    `batches` (the time metric), so the searcher ranks them at rungs 16 and 48 and the search
    completes with the trials 0.38's rule sends to the top."""
    ctx = tmp_path / "pytorch"
    shutil.copytree(PYTORCH, ctx)
    exp = _run_on_cluster(det, conn, ctx / "trainer_asha.yaml", ctx)
    config = conn.execute("SELECT config, searcher_state, state::text AS state "
                          "FROM experiments WHERE id = %s", (exp,)).fetchone()
    assert config["state"] == "COMPLETED"
    events = validation_events(conn, exp)
    assert {e["time"] for e in events} <= {16, 32, 48} and len(events) >= 4
    (bracket,) = asha_brackets(searcher_of(config["config"]))
    assert bracket.rungs == (16, 48)
    _, rung_of = reference_stops(bracket.rungs, 3, [
        (e["rid"], e["time"], e["metric"]) for e in events])
    rungs = trial_rungs(config["config"], config["searcher_state"])
    assert {rid: r.rung for rid, r in rungs.items()} == rung_of
    assert {rid for rid, r in rungs.items() if r.status == "done"} == {
        rid for rid, rung in rung_of.items() if rung == 1}


def test_trainer_script_runs_off_cluster_in_determineds_checkpoint_layout(tmp_path) -> None:
    """`python3 train.py`: Trainer.fit(max_length=Epoch(3)) with validations every 16 batches;
    the final checkpoint loads back with load_trial_from_checkpoint_path."""
    r = _off_cluster(PYTORCH / "train.py", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "steps_completed=48" in r.stderr and "'max_error'" in r.stderr
    (ckpt,) = (tmp_path / ".local/share/determined").iterdir()
    assert {"state_dict.pth", "load_data.json", "metadata.json", "code"} <= {
        p.name for p in ckpt.iterdir()}
    assert (ckpt / "code" / "model_def.py").is_file()
    load = subprocess.run(
        [sys.executable, "-c", "import sys, torch; from determined import pytorch; "
         "t = pytorch.load_trial_from_checkpoint_path(sys.argv[1]); "
         "x = torch.tensor([[1.0]]); print(round(float(t.model(x)), 1))",
         str(ckpt)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert load.returncode == 0, load.stderr
    assert abs(float(load.stdout) - 0.84) < 0.25  # sin(1) = 0.84


REDUCER_TRIAL = """
import logging

import torch
from torch.utils.data import TensorDataset

import determined as det
from determined import pytorch


class ReducerTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(1, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.0))

    def build_training_data_loader(self):
        return pytorch.DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=4)

    def build_validation_data_loader(self):
        x = torch.arange(10, dtype=torch.float32).reshape(10, 1)
        return pytorch.DataLoader(TensorDataset(x), batch_size=4)

    def train_batch(self, batch, epoch_idx, batch_idx):
        loss = self.model(batch[0]).sum() * 0
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch, batch_idx):
        return {"mean_x": batch[0].mean(), "max_x": batch[0].max()}

    def evaluation_reducer(self):
        return {"mean_x": pytorch.Reducer.AVG, "max_x": pytorch.Reducer.MAX}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with pytorch.init(hparams={"global_batch_size": 4}) as train_context:
        trainer = pytorch.Trainer(ReducerTrial(train_context), train_context)
        trainer.fit(max_length=pytorch.Batch(1), checkpoint_policy="none")
"""


def test_reducer_avg_is_the_mean_over_batches_as_determineds(tmp_path) -> None:
    """10 validation records in batches of 4, 4 and 2 (means of x 1.5, 5.5, 8.5): AVG is
    their plain mean, 5.1667, the short batch counting as much as a full one; Determined
    0.38.1 reports the same (5.1666665) for this script, where a mean weighted by records
    would be 4.5."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "reducer_trial.py").write_text(REDUCER_TRIAL)
    r = _off_cluster(code / "reducer_trial.py", tmp_path / "home")
    assert r.returncode == 0, r.stderr
    assert "'mean_x': 5.16666666" in r.stderr and "'max_x': 9.0" in r.stderr, r.stderr


def test_legacy_trial_checkpoints_as_the_configs_checkpoint_policy(det, conn, tmp_path
                                                                   ) -> None:
    """`model_def:SineTrial` (det.harness.run) validates at batches 20 and 40: with
    `checkpoint_policy: all` it checkpoints after each, with `none` only at its end."""
    ctx = tmp_path / "pytorch"
    shutil.copytree(PYTORCH, ctx)
    det.env = _python_first(det.env)
    for policy in ("all", "none"):
        det("experiment", "create", str(ctx / "legacy.yaml"), str(ctx), "--config",
            f"checkpoint_policy={policy}", "--config", "searcher.max_trials=1")
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2")
    for exp in (1, 2):
        r = det("experiment", "wait", str(exp), check=False, timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
    rows = conn.execute(
        "SELECT t.experiment_id AS e, array_agg(c.steps_completed ORDER BY c.steps_completed) "
        "AS steps FROM checkpoints c JOIN trials t ON t.id = c.trial_id GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert [(r["e"], r["steps"]) for r in rows] == [(1, [20, 40]), (2, [40])]


def test_pytorch_trials_complete_on_a_det_cluster(det, conn, tmp_path) -> None:
    """The Trainer script (no searcher.max_length: fit's max_length decides; 0.38 keys det
    does not use are warned about) and the same trial as a legacy `model_def:SineTrial`
    entrypoint (bare-int max_length), each to COMPLETED; a downloaded checkpoint loads."""
    ctx = tmp_path / "pytorch"
    shutil.copytree(PYTORCH, ctx)
    det.env = _python_first(det.env)
    r = det("experiment", "create", str(ctx / "trainer.yaml"), str(ctx))
    assert "warning: profiling: accepted for Determined compatibility" in r.stderr
    exp = _run_on_cluster(det, conn, ctx / "legacy.yaml", ctx)
    r = det("experiment", "wait", "1", check=False, timeout=240)
    assert r.returncode == 0, r.stdout + det("trial", "logs", "1").stdout
    rows = conn.execute(
        "SELECT t.experiment_id AS e, max(m.steps_completed) AS steps FROM metrics m "
        "JOIN trials t ON t.id = m.trial_id WHERE m.\"group\" = 'validation' "
        "GROUP BY t.id ORDER BY t.id").fetchall()
    assert [(r["e"], r["steps"]) for r in rows] == [(1, 48), (exp, 40), (exp, 40)]
    uuid = conn.execute("SELECT latest_checkpoint::text AS u FROM trials WHERE id = 1"
                        ).fetchone()["u"]
    det("checkpoint", "download", uuid, "-o", str(tmp_path / "ckpt"))
    load = subprocess.run(
        [sys.executable, "-c", "import sys, torch; from determined import pytorch; "
         "t = pytorch.load_trial_from_checkpoint_path(sys.argv[1]); "
         "print(round(float(t.model(torch.tensor([[1.0]]))), 1))",
         str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert load.returncode == 0, load.stderr
    assert abs(float(load.stdout) - 0.84) < 0.25  # sin(1) = 0.84
    code = subprocess.run(  # Determined's documented way to import a checkpoint's code
        [sys.executable, "-c", "import sys, determined as det\n"
         "with det.import_from_path(sys.argv[1] + '/code'):\n    import model_def\n"
         "print(model_def.SineTrial.__name__, 'model_def' in sys.modules)",
         str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert code.stdout.split() == ["SineTrial", "False"], code.stderr
    # every reported metric and the trial's own SummaryWriter's scalars, as event files in
    # the trial's storage
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    storage = Path(det.env["DET_HOME"]) / "checkpoints" / "tensorboard/experiment/1/trial/1"
    events = EventAccumulator(str(storage))
    events.Reload()
    assert {"loss", "lr", "validation_loss", "val_max_error", "epoch_end_loss"} <= set(
        events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("validation_loss")] == [16, 32, 48]
    assert [e.step for e in events.Scalars("epoch_end_loss")] == [15, 31, 47]
    state = torch.load(tmp_path / "ckpt" / "state_dict.pth", weights_only=False)
    assert state["callbacks"] == {"counter": {"epochs": 3}}
    assert json.loads((tmp_path / "ckpt" / "load_data.json").read_text())["trial_cls_spec"] \
        == "model_def:SineTrial"


# --- configs and `det experiment create` flags ---------------------------------------------

def test_038_config_forms_are_accepted_and_unused_keys_warned_once_each() -> None:
    from det.configs import load_experiment_config
    from det.errors import ConfigError

    warnings: list[str] = []
    cfg = load_experiment_config(
        "entrypoint: python3 train.py\n"
        "searcher: {name: grid, metric: x, max_length: 100}\n"
        "environment: {image: {cpu: a, gpu: b}, proxy_ports: [{proxy_port: 8080}],"
        " add_capabilities: [SYS_ADMIN]}\n"
        "profiling: {enabled: true, begin_on_batch: 0}\n"
        "optimizations: {aggregation_frequency: 1}\n"
        "resources: {devices: [], slots_per_trial: 1}\n", "c.yaml", warnings)
    assert cfg.searcher.max_length.to_json() == {"batches": 100}  # a bare int is batches
    assert (cfg.environment.image.cpu, cfg.environment.image.cuda) == ("a", "b")
    assert sorted(w.split(": ")[2] for w in warnings) == [
        "environment.add_capabilities", "environment.proxy_ports", "optimizations",
        "profiling", "resources.devices"]
    assert all(w.startswith("c.yaml: warning: ") for w in warnings)
    for kind in ("single", "random", "grid"):  # max_length optional: the code decides
        extra = ", max_trials: 2" if kind == "random" else ""
        cfg = load_experiment_config(f"entrypoint: x\nsearcher: {{name: {kind}, metric: x{extra}}}")
        assert cfg.searcher.max_length is None
    with pytest.raises(ConfigError, match="unknown key 'profilng'"):
        load_experiment_config("entrypoint: x\nsearcher: {name: single, metric: x}\n"
                               "profilng: {}")
    with pytest.raises(ConfigError, match="^profiling: expected a mapping"):
        load_experiment_config("entrypoint: x\nsearcher: {name: single, metric: x}\n"
                               "profiling: yes")


def test_config_overrides_and_the_test_config() -> None:
    from det.configs.overrides import apply_overrides, make_test_config
    from det.errors import ConfigError

    config = {"resources": None, "searcher": {"name": "random", "metric": "l"}}
    out = apply_overrides(config, ["resources.slots_per_trial=2", "searcher.max_trials=3",
                                   "labels=a,b", "data={x: 1}"])
    assert out == {"resources": {"slots_per_trial": 2},
                   "searcher": {"name": "random", "metric": "l", "max_trials": 3},
                   "labels": ["a", "b"], "data": {"x": 1}}
    assert config["resources"] is None  # not modified
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        apply_overrides(config, ["resources"])
    with pytest.raises(ConfigError, match="^searcher.metric: --config"):
        apply_overrides(config, ["searcher.metric.x=1"])
    test = make_test_config({**config, "max_restarts": 5}, {"lr": 0.1})
    assert test["searcher"] == {"name": "single", "metric": "l", "smaller_is_better": True,
                                "max_length": {"batches": 1}}
    assert test["hyperparameters"] == {"lr": {"type": "const", "val": 0.1}}
    assert (test["max_restarts"], test["scheduling_unit"]) == (0, 1)


def test_create_flags_config_paused_include_and_test(det, conn, tmp_path) -> None:
    """`--config KEY=VALUE`, `--paused`, `-i` and `--test` as Determined's CLI means them."""
    ctx = tmp_path / "pytorch"
    shutil.copytree(PYTORCH, ctx)
    (ctx / "model_def.py").rename(tmp_path / "model_def.py")  # comes back with -i
    det.env = _python_first(det.env)
    r = det("experiment", "create", str(ctx / "legacy.yaml"), str(ctx), "--paused",
            "--config", "searcher.max_trials=1", "--config", "max_restarts=1",
            "-i", str(tmp_path / "model_def.py"))
    assert r.stdout.strip() == "Created experiment 1"
    row = conn.execute("SELECT state::text AS s, config FROM experiments").fetchone()
    assert row["s"] == "PAUSED"
    assert (row["config"]["searcher"]["max_trials"], row["config"]["max_restarts"]) == (1, 1)
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2")
    det("experiment", "activate", "1")
    assert det("experiment", "wait", "1", check=False, timeout=240).returncode == 0
    shutil.copy(tmp_path / "model_def.py", ctx / "model_def.py")
    r = det("experiment", "create", "--test", str(ctx / "legacy.yaml"), str(ctx), timeout=240)
    assert "Created test experiment 2" in r.stdout
    assert "model definition test succeeded" in r.stdout
    row = conn.execute("SELECT archived, config FROM experiments WHERE id = 2").fetchone()
    assert row["archived"] and row["config"]["searcher"]["max_length"] == {"batches": 1}
    steps = conn.execute("SELECT max(m.steps_completed) AS s FROM metrics m JOIN trials t "
                         "ON t.id = m.trial_id WHERE t.experiment_id = 2").fetchone()["s"]
    assert steps == 1


def test_no_op_fixture_through_determineds_launcher_on_a_det_cluster(det, conn, tmp_path
                                                                     ) -> None:
    """`python3 -m determined.launch.torch_distributed --trial model_def:NoOpTrial` (the form
    Determined rewrites a legacy entrypoint to), with a typeless checkpoint_storage (GC
    settings over the cluster's default storage)."""
    ctx = tmp_path / "no_op"
    shutil.copytree(EXAMPLES / "no_op", ctx)
    _run_on_cluster(det, conn, ctx / "single.yaml", ctx)
    rows = conn.execute("SELECT steps_completed AS s FROM metrics WHERE \"group\" = "
                        "'validation' ORDER BY id").fetchall()
    assert [r["s"] for r in rows] == [10, 20, 30]
    checkpoints = conn.execute("SELECT steps_completed AS s FROM checkpoints "
                               "WHERE state = 'COMPLETED' ORDER BY s").fetchall()
    assert [r["s"] for r in checkpoints] == [10, 20, 30]  # save_trial_best 30 kept them all
    config = conn.execute("SELECT config FROM experiments").fetchone()["config"]
    assert config["checkpoint_storage"]["type"] == "shared_fs"


def test_wrap_rank_prefixes_each_line() -> None:
    r = subprocess.run([sys.executable, "-m", "determined.launch.wrap_rank", "3", "--", "sh",
                        "-c", "echo one; echo two >&2; exit 4"], capture_output=True, text=True)
    assert (r.returncode, r.stdout, r.stderr) == (4, "[rank=3] one\n", "[rank=3] two\n")


def test_trainer_in_process_config_epochs_without_records_per_epoch(tmp_path, monkeypatch
                                                                    ) -> None:
    """Off-cluster pytorch.init(hparams=, exp_conf=) + Trainer in this process: a config period
    in epochs without records_per_epoch (deprecated in 0.38) counts passes over the loader;
    InvalidHP raised by the trial ends it as an early exit."""
    import importlib.util

    import determined as det
    from determined import pytorch

    for name in [k for k in os.environ if k.startswith("DET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = importlib.util.spec_from_file_location("compat_sine", PYTORCH / "model_def.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hparams = {"global_batch_size": 32, "hidden": 4, "lr": 0.01}
    with pytorch.init(hparams=hparams, exp_conf={"min_validation_period": {"epochs": 1}}) as ctx:
        trainer = pytorch.Trainer(module.SineTrial(ctx), ctx)
        trainer.fit(max_length=pytorch.Epoch(2), checkpoint_policy="none")
    transport = ctx.core.transport
    assert [s for g, s, _ in transport.metrics if g == "validation"] == [16, 32]
    assert [c[1] for c in transport.checkpoints] == [32]  # the final one only

    class Invalid(module.SineTrial):
        def train_batch(self, batch, epoch_idx, batch_idx):
            raise det.InvalidHP("lr too small")

    with pytorch.init(hparams=hparams) as ctx:
        pytorch.Trainer(Invalid(ctx), ctx).fit(max_length=pytorch.Batch(2))
    assert ctx.core.transport.early_exit == "invalid_hp"


def test_cluster_info_has_038s_shape_on_a_det_cluster(det, conn, tmp_path) -> None:
    ctx = tmp_path / "info"
    ctx.mkdir()
    (ctx / "info.py").write_text(
        "import json, determined as det\n"
        "i = det.get_cluster_info()\n"
        "print('INFO', json.dumps({'trial': i.trial.trial_id, 'exp': i.trial.experiment_id,\n"
        "    'hparams': i.trial.hparams, 'name': i.trial._config['name'],\n"
        "    'rank': i.container_rank, 'type': i.task_type, 'url': i.master_url,\n"
        "    'latest': i.latest_checkpoint, 'slots': i.slot_ids}))\n")
    (ctx / "info.yaml").write_text(
        "name: info\nentrypoint: python3 info.py\nhyperparameters: {a: 1}\n"
        "searcher: {name: single, metric: x}\nmax_restarts: 0\n")
    _run_on_cluster(det, conn, ctx / "info.yaml", ctx)
    line = next(x for x in det("trial", "logs", "1").stdout.splitlines() if "INFO {" in x)
    info = json.loads(line.split("INFO ", 1)[1])
    url = info.pop("url")  # the task's database URL: its role's, through the agent's pooler

    def role(u: str) -> dict:
        return {k: v for k, v in conninfo_to_dict(u).items() if k not in ("host", "port")}

    assert role(url) == role(det.env["DET_TASK_DB_URL"])
    assert info == {"trial": 1, "exp": 1, "hparams": {"a": 1}, "name": "info", "rank": 0,
                    "type": "TRIAL", "latest": None, "slots": [0]}


def test_context_mixed_precision_accumulation_and_optimizer_step_schedulers(
        tmp_path, monkeypatch) -> None:
    """wrap_optimizer(backward_passes_per_step=2) steps every second batch;
    STEP_EVERY_OPTIMIZER_STEP schedulers follow the optimizer's steps; wrap_scaler and
    autocast_forward_pass run (on the CPU here); is_epoch_start / is_epoch_end; callbacks."""
    from determined import pytorch

    for name in [k for k in os.environ if k.startswith("DET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    seen: list[tuple[int, bool, bool, float]] = []
    hooks: list[str] = []

    class Hooks(pytorch.PyTorchCallback):
        def on_training_epoch_start(self, epoch_idx: int) -> None:
            hooks.append(f"start {epoch_idx}")

        def on_training_epoch_end(self, epoch_idx: int) -> None:
            hooks.append(f"end {epoch_idx}")

        def on_validation_end(self, metrics: dict) -> None:
            hooks.append(f"validated {metrics['batches']}")

    class Amp(pytorch.PyTorchTrial):
        def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
            self.context = context
            self.model = context.autocast_forward_pass(context.wrap_model(torch.nn.Linear(2, 1)))
            self.opt = context.wrap_optimizer(
                torch.optim.SGD(self.model.parameters(), lr=1.0), backward_passes_per_step=2)
            self.sched = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.5),
                step_mode=pytorch.LRScheduler.StepMode.STEP_EVERY_OPTIMIZER_STEP)
            self.scaler = context.wrap_scaler(torch.amp.GradScaler("cpu"))

        def build_training_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.ones(8, 2)),
                                      batch_size=2)

        def build_validation_data_loader(self) -> pytorch.DataLoader:
            return pytorch.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 2)),
                                      batch_size=2)

        def build_callbacks(self) -> dict:
            return {"hooks": Hooks()}

        def train_batch(self, batch, epoch_idx: int, batch_idx: int) -> torch.Tensor:
            loss = self.model(batch[0]).float().pow(2).mean()
            self.context.backward(loss)
            self.context.step_optimizer(self.opt, scaler=self.scaler)
            seen.append((batch_idx, self.context.is_epoch_start(), self.context.is_epoch_end(),
                         self.sched.get_last_lr()[0]))
            return loss

        def evaluate_batch(self, batch, batch_idx: int) -> dict:
            return {"loss": self.model(batch[0]).float().pow(2).mean()}

    with pytorch.init(hparams={"global_batch_size": 2}) as ctx:
        pytorch.Trainer(Amp(ctx), ctx).fit(max_length=pytorch.Batch(6),
                                           validation_period=pytorch.Epoch(1))
    assert [s[0] for s in seen] == [0, 1, 2, 3, 4, 5]
    assert [(s[1], s[2]) for s in seen] == [(True, False), (False, False), (False, False),
                                            (False, True), (True, False), (False, False)]
    assert [s[3] for s in seen] == [1.0, 0.5, 0.5, 0.25, 0.25, 0.125]  # one step per 2 batches
    assert hooks == ["start 0", "end 0", "start 1", "validated 4", "validated 6"]
