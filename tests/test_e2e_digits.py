"""End to end: the digits example through the real reconciler, agent, harness and database."""

import json
import re
import signal
from pathlib import Path

import pytest
import yaml
from conftest import REPO, wait_for

DIGITS = REPO / "examples" / "digits"


def digits_config(tmp_path: Path, name: str = "const.yaml", **overrides) -> Path:
    """The example's config with ``overrides`` (dotted keys) applied, written to tmp_path."""
    cfg = yaml.safe_load((DIGITS / name).read_text())
    for dotted, value in overrides.items():
        *parents, last = dotted.split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    out = tmp_path / f"test-{name}"
    out.write_text(yaml.safe_dump(cfg))
    return out


def start_cluster(det, slots: int = 2) -> None:
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", str(slots))


def test_const_experiment_completes(det, conn, tmp_path) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 60},
                                     "min_validation_period": {"batches": 30}})
    start_cluster(det)
    det("experiment", "create", str(cfg), str(DIGITS))
    assert det("experiment", "wait", "1", timeout=240).returncode == 0
    exp = json.loads(det("experiment", "describe", "1", "--json").stdout)
    assert exp["state"] == "COMPLETED"
    [trial] = exp["trials"]
    assert trial["state"] == "COMPLETED" and trial["steps_completed"] == 60
    assert trial["best_validation"] is not None
    validations = conn.execute("SELECT steps_completed FROM metrics WHERE \"group\" = "
                               "'validation' ORDER BY steps_completed").fetchall()
    assert [v["steps_completed"] for v in validations] == [30, 60]
    ckpts = json.loads(det("checkpoint", "list", "1", "--json").stdout)
    assert ckpts and ckpts[-1]["steps_completed"] == 60
    out = tmp_path / "download"
    det("checkpoint", "download", ckpts[-1]["uuid"], "-o", str(out))
    assert (out / "metadata.json").is_file()
    assert json.loads((out / "metadata.json").read_text())["steps_completed"] == 60
    r = det("trial", "logs", str(trial["id"]))
    assert "run ended with exit code 0" in r.stdout
    # the searcher closing the trial is its completion, not a preemption (issue 10); every
    # line of the task, its harness's stderr included, is on stdout (issue 34: `det trial
    # logs 1 | grep` lost them)
    assert "trial finished: completed" in r.stdout and "preempted" not in r.stdout + r.stderr
    assert r.stderr == ""
    lines = r.stdout.splitlines()
    trial_logs = ("trial", "logs", str(trial["id"]))
    assert det(*trial_logs, "--head", "2").stdout.splitlines() == lines[:2]
    assert det(*trial_logs, "--tail", "2").stdout.splitlines() == lines[-2:]
    assert det(*trial_logs, "--tail", "0").stdout == ""
    stamped = det(*trial_logs, "--timestamps").stdout.splitlines()
    assert [re.sub(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00 ", "", x)
            for x in stamped] == lines
    r = det(*trial_logs, "--head", "1", "--tail", "1", check=False)
    assert r.returncode == 1 and "--head" in r.stderr


def test_killed_reconciler_is_replaced_and_the_search_finishes(det, conn, tmp_path) -> None:
    cfg = digits_config(tmp_path, "random.yaml", **{
        "searcher.max_trials": 3, "searcher.max_length": {"batches": 40},
        "min_validation_period": {"batches": 20}, "reproducibility": {"experiment_seed": 7}})
    first = det.start("reconciler1", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "2")
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM allocations WHERE state = 'RUNNING'")
             .fetchone(), 120, "a trial to run")
    first.send_signal(signal.SIGKILL)
    det.start("reconciler2", "reconcile", "--interval", "0.5")
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    trials = conn.execute("SELECT state::text AS s, hparams FROM trials ORDER BY id").fetchall()
    assert [t["s"] for t in trials] == ["COMPLETED"] * 3, "no trial created twice or lost"
    ops = conn.execute("SELECT count(*) AS n, bool_and(completed) AS done FROM searcher_ops"
                       ).fetchone()
    assert ops == {"n": 3, "done": True}
    assert conn.execute("SELECT count(*) AS n FROM searcher_events WHERE NOT consumed"
                        ).fetchone()["n"] == 0


@pytest.mark.slow
def test_pause_and_activate_resume_at_the_same_step(det, conn, tmp_path) -> None:
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 3000},
                                     "min_validation_period": {"batches": 1000},
                                     "scheduling_unit": 10})
    start_cluster(det, slots=1)
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM metrics WHERE \"group\" = 'training'")
             .fetchone(), 120, "training to start")
    det("experiment", "pause", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE state = 'PAUSED'").fetchone()
             and not conn.execute("SELECT 1 FROM allocations WHERE state <> 'TERMINATED'")
             .fetchone(), 120, "the trial to checkpoint and stop")
    paused = conn.execute("SELECT steps_completed, latest_checkpoint FROM trials").fetchone()
    assert 0 < paused["steps_completed"] < 3000 and paused["latest_checkpoint"] is not None
    first_run = conn.execute("SELECT exit_code, slots_needed FROM allocations").fetchone()
    assert first_run["exit_code"] == 0, "a preempted run exits cleanly"
    assert conn.execute("SELECT count(*) AS n FROM allocation_slots WHERE NOT released"
                        ).fetchone()["n"] == 0, "its slot is free"
    det("experiment", "activate", "1")
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    second = conn.execute(
        "SELECT min(m.steps_completed) AS first_step FROM metrics m "
        "JOIN allocations a ON a.id = m.allocation_id WHERE a.run = 2").fetchone()
    assert second["first_step"] > paused["steps_completed"], "training went on, not over"
    assert conn.execute("SELECT steps_completed FROM trials").fetchone()["steps_completed"] == 3000
