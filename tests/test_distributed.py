"""Distributed training (issue 12): real agents, real torchrun workers, real gloo.

A trial with ``slots_per_trial`` > 1 runs one worker per slot through
``det.launch.torch_distributed``; the chief reports, every rank's log lines reach the trial's
logs, a failed worker ends the allocation and the trial restarts from its checkpoint.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, wait_for
from test_e2e_digits import DIGITS, digits_config

LAUNCHER = [sys.executable, "-m", "det.launch.torch_distributed"]


def accuracy(conn, experiment: int) -> float:
    row = conn.execute(
        "SELECT (m.\"values\"->>'accuracy')::float AS acc FROM metrics m "
        "JOIN trials t ON t.id = m.trial_id WHERE t.experiment_id = %s "
        "AND m.\"group\" = 'validation' ORDER BY m.steps_completed DESC LIMIT 1",
        (experiment,)).fetchone()
    return row["acc"]


def test_two_workers_train_digits_as_well_as_one(det, conn, tmp_path) -> None:
    common = {"searcher.max_length": {"batches": 600}, "min_validation_period": {"batches": 300},
              "hyperparameters.global_batch_size": 32}
    one = digits_config(tmp_path, **common)
    one = one.rename(tmp_path / "one.yaml")
    two = digits_config(tmp_path, **{**common, "resources.slots_per_trial": 2})
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "3")
    det("experiment", "create", str(one), str(DIGITS))
    det("experiment", "create", str(two), str(DIGITS))
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    assert det("experiment", "wait", "2", timeout=300).returncode == 0
    for exp in (1, 2):
        described = json.loads(det("experiment", "describe", str(exp), "--json").stdout)
        assert described["state"] == "COMPLETED", described
    acc1, acc2 = accuracy(conn, 1), accuracy(conn, 2)
    print("accuracies", acc1, acc2)
    assert acc1 > 0.9 and abs(acc1 - acc2) <= 0.01, (acc1, acc2)
    # only the chief reports: one row per validation, one per scheduling unit
    validations = conn.execute(
        "SELECT m.steps_completed FROM metrics m JOIN trials t ON t.id = m.trial_id "
        "WHERE t.experiment_id = 2 AND m.\"group\" = 'validation' ORDER BY 1").fetchall()
    assert [v["steps_completed"] for v in validations] == [300, 600]
    steps = conn.execute(
        "SELECT m.steps_completed, count(*) AS n FROM metrics m JOIN trials t "
        "ON t.id = m.trial_id WHERE t.experiment_id = 2 AND m.\"group\" = 'training' "
        "GROUP BY 1").fetchall()
    assert steps and all(s["n"] == 1 for s in steps)
    ckpts = conn.execute("SELECT count(*) AS n FROM checkpoints c JOIN trials t "
                         "ON t.id = c.trial_id WHERE t.experiment_id = 2").fetchone()
    assert ckpts["n"] == 1, "the chief alone writes the checkpoint"
    [trial] = json.loads(det("experiment", "describe", "2", "--json").stdout)["trials"]
    logs = det("trial", "logs", str(trial["id"]))
    out = logs.stdout + logs.stderr
    assert "[rank=0]" in out and "[rank=1]" in out
