"""Issue 38: ``determined.transformers.DetCallback`` runs Hugging Face's ``Trainer`` on det.

The trial is ``examples/determined_compat/hf_trainer/train.py``: a tiny BERT built from a
config (no hub download) over random token ids. On a det cluster it reports metrics with
``batches``/``epochs``, stores each HF checkpoint, stops on a pause with a checkpoint, and
resumes from det's checkpoint (``global_step`` goes on) to COMPLETED.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from conftest import wait_for
from test_determined_compat import _python_first

from determined.transformers._hf_callback import (
    check_searcher_config,
    metric_type,
    missing_eval_metrics,
    reported_metrics,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "determined_compat" / "hf_trainer"

# The example, held at step 6 of its first run until det asks it to stop: the test pauses the
# experiment there, whatever the machine's speed.
HELD = """\
import time
import determined as det
from transformers import TrainerCallback
import train


class HoldUntilPreempted(TrainerCallback):
    def __init__(self, core_context):
        self.core_context = core_context
        self.first_run = det.get_cluster_info().latest_checkpoint is None

    def on_step_end(self, args, state, control, **kwargs):
        if self.first_run and state.global_step == 6:
            deadline = time.monotonic() + 240
            while not self.core_context.preempt.should_preempt():
                assert time.monotonic() < deadline, "no pause came"
                time.sleep(0.1)


train.main(lambda core_context: [HoldUntilPreempted(core_context)])
"""


def test_metric_types_and_the_metrics_reported() -> None:
    assert metric_type({"eval_loss": 1.0, "epoch": 1}) == "eval_"
    assert metric_type({"test_loss": 1.0}) == "test_"
    assert metric_type({"loss": 1.0, "learning_rate": 0.1}) == "train_"
    logs = {"loss": 0.5, "grad_norm": 1.0, "epoch": 0.25, "train_runtime": 2.0,
            "train_samples_per_second": 3.0, "eval_compilation_time": 1.0}
    assert reported_metrics(logs, None) == {"loss": 0.5, "grad_norm": 1.0}
    assert reported_metrics(logs, ["loss"]) == {"loss": 0.5}
    assert missing_eval_metrics({"eval_loss": 1.0}, "eval_acc", None) == [
        "eval_acc (searcher.metric)"]


@pytest.mark.parametrize(("searcher", "error"), [
    ({"name": "single", "max_length": 12}, "searcher.max_length: HF trainer does not respect"),
    ({"name": "single", "max_length": {"batches": 10}},
     "searcher.max_length: batches=10 does not match the HF trainer's --max_steps"),
    ({"name": "adaptive_asha", "time_metric": "batches", "max_time": 24},
     "searcher.max_time: batches=24 does not match"),
])
def test_a_searcher_length_other_than_the_trainers_is_refused(searcher, error, tmp_path
                                                               ) -> None:
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=12,
                                          use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match=error):
        check_searcher_config(searcher, args)
    check_searcher_config({"name": "single", "max_length": {"batches": 12}}, args)
    check_searcher_config({"name": "adaptive_asha", "time_metric": "eval_loss",
                           "max_time": 3}, args)


def test_importing_without_transformers_names_the_package() -> None:
    r = subprocess.run([sys.executable, "-c", "import sys; sys.modules['transformers'] = None; "
                        "import determined.transformers"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1
    assert ("ImportError: determined.transformers needs the transformers package, which is not "
            "installed") in r.stderr


def test_trainer_with_detcallback_pauses_and_resumes_from_dets_checkpoint(det, conn, tmp_path
                                                                          ) -> None:
    ctx = tmp_path / "hf_trainer"
    shutil.copytree(EXAMPLE, ctx)
    (ctx / "held.py").write_text(HELD)
    config = ctx / "held.yaml"
    config.write_text((EXAMPLE / "const.yaml").read_text().replace("train.py", "held.py"))
    det.env = _python_first(det.env)
    det("experiment", "create", str(config), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM checkpoints WHERE steps_completed = 4")
             .fetchone(), 180, "the checkpoint of step 4")
    det("experiment", "pause", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE state = 'PAUSED'").fetchone()
             and not conn.execute("SELECT 1 FROM allocations WHERE state <> 'TERMINATED'")
             .fetchone(), 120, "the trial to checkpoint and stop")
    paused = conn.execute("SELECT t.steps_completed, c.resources, c.metadata FROM trials t "
                          "JOIN checkpoints c ON c.uuid = t.latest_checkpoint").fetchone()
    assert paused["steps_completed"] == 6, "stopped at the step it was paused at"
    assert paused["metadata"]["trial_id"] == 1
    files = set(paused["resources"])
    assert {"checkpoint-6/trainer_state.json", "checkpoint-6/my_data.json"} <= files, files
    assert not any(f.startswith("checkpoint-4/") for f in files), "only this step's files"

    det("experiment", "activate", "1")
    r = det("experiment", "wait", "1", check=False, timeout=240)
    logs = det("trial", "logs", "1").stdout
    assert r.returncode == 0, r.stdout + r.stderr + logs
    assert "Latest checkpoint downloaded to" in logs and "checkpoint-6" in logs
    rows = conn.execute(
        "SELECT a.run, m.\"group\" AS g, m.steps_completed AS s, m.\"values\" AS v "
        "FROM metrics m JOIN allocations a ON a.id = m.allocation_id "
        "ORDER BY a.run, m.\"group\", m.steps_completed").fetchall()
    steps = {(x["run"], x["g"]): [] for x in rows}
    for x in rows:
        steps[(x["run"], x["g"])].append(x["s"])
    assert steps == {(1, "training"): [2, 4, 6], (1, "validation"): [4],
                     (2, "training"): [8, 10, 12], (2, "validation"): [8, 12]}, steps
    train = rows[-1]["v"] if rows[-1]["g"] == "training" else next(
        x["v"] for x in rows if x["g"] == "training" and x["s"] == 12)
    assert train["batches"] == 12 and "loss" in train and "epoch" not in train, train
    assert not any(k.endswith("_runtime") for x in rows for k in x["v"])
    val = next(x["v"] for x in rows if x["g"] == "validation" and x["s"] == 12)
    assert "eval_loss" in val and val["batches"] == 12 and val["epochs"] > 0, val
    done = conn.execute("SELECT state::text AS s, steps_completed FROM trials").fetchone()
    assert done == {"s": "COMPLETED", "steps_completed": 12}
    assert [r["steps_completed"] for r in conn.execute(
        "SELECT steps_completed FROM checkpoints ORDER BY steps_completed")] == [4, 6, 8, 12]
