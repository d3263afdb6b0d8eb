"""Logs that say what ran (issue 34): `det trial logs 1` printed only "trial finished" and
"run ended", with no start, validation, checkpoint or preemption line and no run or rank.

The harness logs each workload (start with the hyperparameters, validations to 4 significant
digits, checkpoints with uuid and size, a preemption and why, the end and why); the agent stores
each line's rank beside it (the run is its allocation's); `det trial logs` and `det experiment
logs` print them after ``[run N]`` / ``[trial T run N]`` and ``[rank=R]``; det_user.log_level tells
each line's level for the WebUI's filter.
"""

import re
import time

import psycopg
import pytest
from conftest import wait_for
from psycopg.rows import dict_row
from test_e2e_digits import DIGITS, digits_config, start_cluster
from test_harness_db_faults import claim_allocation

from det import figures
from det.agent.logs import LogShipper
from det.harness import logs as harness_logs

UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


@pytest.mark.parametrize(("line", "level"), [
    ("INFO: [123] det.harness: validated at batch 100", "info"),
    ("WARNING: [123] det.harness: slow storage", "warning"),
    ("WARNING:root:logging's default format", "warning"),
    ("ERROR: [9] root: no data", "error"),
    ("CRITICAL:root:out of memory", "error"),
    ("Traceback (most recent call last):", "error"),
    ("ValueError: bad shape", "error"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory", "error"),
    ("/ctx/model_def.py:12: UserWarning: the dataloader has 0 workers", "warning"),
    ("det.harness: warning: TensorBoard files not stored", "warning"),
    ("DEBUG: [1] det.harness: details", "debug"),
    ("epoch 3 loss 0.25", "info"),
    ("no ERRORS here, just a word", "info"),
])
def test_a_lines_level_is_read_from_its_text(conn: psycopg.Connection, line: str,
                                             level: str) -> None:
    assert conn.execute("SELECT det_user.log_level('stderr', %s) AS l",
                        (line,)).fetchone()["l"] == level


def test_the_agent_stores_each_workers_rank_beside_its_line(db_url: str, tmp_path) -> None:
    """The launcher tags each worker's lines ``[rank=N]``: the agent stores N and the line
    without its tag; an untagged line of a one-slot trial run is its one worker's (rank 0); a
    run on more slots has a launcher whose untagged lines are no rank's, nor are det's notes."""
    alloc = claim_allocation(db_url, tmp_path)  # a trial run on one slot
    shipper = LogShipper(db_url)
    try:
        shipper.add(alloc.id, "stdout", "[rank=1] from the second worker")
        shipper.add(alloc.id, "stderr", "from the one worker")
        shipper.add(alloc.id, "det", "[rank=3] det's note, as written")
        shipper.flush()
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("UPDATE allocations SET slots_needed = 2 WHERE id = %s", (alloc.id,))
        shipper.add(alloc.id, "stderr", "torchrun: starting 2 workers")
        shipper.flush()
    finally:
        shipper.close()
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        rows = c.execute("SELECT rank, stream, line FROM task_logs WHERE allocation_id = %s "
                         "ORDER BY id", (alloc.id,)).fetchall()
    assert rows == [
        {"rank": 1, "stream": "stdout", "line": "from the second worker"},
        {"rank": 0, "stream": "stderr", "line": "from the one worker"},
        {"rank": None, "stream": "det", "line": "[rank=3] det's note, as written"},
        {"rank": None, "stream": "stderr", "line": "torchrun: starting 2 workers"},
    ]


def test_log_figures_follow_the_one_formatting_rule() -> None:
    assert harness_logs.number(0.9747596085071564) == "0.9748"
    assert harness_logs.number(1.2345678e-5) == "1.235e-5"
    assert harness_logs.number(2.0) == "2" and harness_logs.number(123456.7) == "1.235e+5"
    assert harness_logs.number({"lr": 0.0031622776601683794, "hidden": 128,
                                "act": "relu"}) == "{lr: 0.003162, hidden: 128, act: relu}"
    assert [figures.size(n) for n in (512, 1536, 12_940_000, 3 * 2**30)] == [
        "512 B", "1.5 KiB", "12.34 MiB", "3 GiB"]


def _harness_lines(lines: list[str], run: int) -> list[str]:
    """The harness's messages (after ``det.harness: ``) of run ``run``, rank 0."""
    head = re.compile(rf"^\[run {run}\] \[rank=0\] INFO: \[\d+\] det\.harness: (.*)$")
    return [m.group(1) for m in map(head.match, lines) if m]


def _significant_digits(figure: str) -> int:
    return len(re.sub(r"e[+-]\d+$", "", figure).replace("-", "").replace(".", "").lstrip("0"))


@pytest.mark.slow
def test_trial_logs_say_what_ran_in_each_run(det, conn, tmp_path) -> None:
    """A digits trial paused mid-way and activated: its log tells, per run, the start and
    its hyperparameters, each validation (4 significant digits), each checkpoint (uuid and
    size), the preemption and why (the pause), the resumption from the checkpoint and the
    end and why; `det experiment logs` prints the same lines after the trial."""
    cfg = digits_config(tmp_path, **{"searcher.max_length": {"batches": 1200},
                                     "min_validation_period": {"batches": 400},
                                     "scheduling_unit": 10})
    start_cluster(det, slots=1)
    det("experiment", "create", str(cfg), str(DIGITS))
    wait_for(lambda: conn.execute("SELECT 1 FROM metrics WHERE \"group\" = 'training'")
             .fetchone(), 120, "training to start")
    det("experiment", "pause", "1")
    wait_for(lambda: conn.execute("SELECT 1 FROM trials WHERE state = 'PAUSED'").fetchone()
             and not conn.execute("SELECT 1 FROM allocations WHERE state <> 'TERMINATED'")
             .fetchone(), 120, "the trial to checkpoint and stop")
    paused = conn.execute("SELECT steps_completed AS s, latest_checkpoint::text AS uuid "
                          "FROM trials").fetchone()
    det("experiment", "activate", "1")
    assert det("experiment", "wait", "1", timeout=600).returncode == 0, \
        det("trial", "logs", "1").stdout

    lines = det("trial", "logs", "1").stdout.splitlines()
    first, second = _harness_lines(lines, 1), _harness_lines(lines, 2)
    hparams = r"with hyperparameters \{(?=.*lr: 0\.003\b)(?=.*hidden: 128\b)" \
              r"(?=.*dropout: 0\.1\b)(?=.*global_batch_size: 32\b).*\}$"
    assert re.match(r"trial 1 of experiment 1: starting at batch 0 " + hparams, first[0]), first
    # why: the run's stop_reason, as the reconciler wrote it with the pause
    assert f"preempted at batch {paused['s']}: paused: its experiment was paused" in first, first
    assert first[-1] == "trial finished: preempted (paused: its experiment was paused)", first
    assert re.match(rf"trial 1 of experiment 1: resuming from checkpoint {paused['uuid']} "
                    rf"at batch {paused['s']} " + hparams, second[0]), second
    assert second[-1] == ("trial finished: completed (the searcher needs no more training "
                          "from it)"), second

    validations = [m for m in map(re.compile(
        r"validated at batch (\d+) \(epoch ([\d.]+)\) in [\d.e+-]+ s: (.*)$").match,
        first + second) if m]
    assert [int(m.group(1)) for m in validations] == [400, 800, 1200]
    for m in validations:
        values = dict(kv.split("=") for kv in m.group(3).split())
        assert set(values) == {"accuracy", "validation_loss"}, m.group(0)
        assert all(_significant_digits(f) <= 4 for f in [m.group(2), *values.values()]), \
            m.group(0)

    ckpts = conn.execute("SELECT uuid::text AS uuid, steps_completed AS s, resources "
                         "FROM checkpoints ORDER BY steps_completed").fetchall()
    assert paused["uuid"] in [c["uuid"] for c in ckpts]
    for c in ckpts:
        said = [x for x in first + second if x.startswith(f"saved checkpoint {c['uuid']} ")]
        shown = figures.size(sum(c["resources"].values()))
        assert said == [f"saved checkpoint {c['uuid']} at batch {c['s']}: {shown} in "
                        f"{len(c['resources'])} files"], (c, first + second)
        assert re.search(r"\d (KiB|MiB)$", shown)
    assert any(re.match(r"\[run 1\] \[det\] run ended with exit code 0", x) for x in lines)
    assert all(re.match(r"\[run [12]\] ", x) for x in lines), "every line says its run"

    # The experiment's log: the same lines, each after its trial; its tail; -f of an ended one.
    exp_lines = det("experiment", "logs", "1").stdout.splitlines()
    assert exp_lines == [x.replace("[run ", "[trial 1 run ", 1) for x in lines]
    assert det("experiment", "logs", "1", "--tail", "2").stdout.splitlines() == exp_lines[-2:]
    assert det("experiment", "logs", "1", "-f", timeout=60).stdout.splitlines() == exp_lines
    r = det("experiment", "logs", "99", check=False)
    assert r.returncode != 0 and "experiment 99 not found" in r.stderr
    assert {row["level"] for row in conn.execute(
        "SELECT det_user.log_level(stream, line) AS level FROM task_logs "
        "WHERE line LIKE 'INFO: [%%] det.harness: %%'")} == {"info"}
    assert re.match(UUID, paused["uuid"])


def test_experiment_logs_follow_trials_that_start_later(det, conn, tmp_path) -> None:
    """`det experiment logs 1 -f`, started before any trial exists, prints every trial's lines
    (each after its trial) as they come and ends with the experiment."""
    cfg = digits_config(tmp_path, "random.yaml", **{
        "searcher.max_trials": 2, "searcher.max_concurrent_trials": 1,
        "searcher.max_length": {"batches": 40}, "min_validation_period": {"batches": 20}})
    det("experiment", "create", str(cfg), str(DIGITS))
    follower = det.start("follow", "experiment", "logs", "1", "-f")
    time.sleep(1)  # following an experiment with no trial yet
    start_cluster(det, slots=1)
    assert det("experiment", "wait", "1", timeout=300).returncode == 0
    assert follower.wait(60) == 0
    out = det.log("follow")
    trials = [r["id"] for r in conn.execute("SELECT id FROM trials ORDER BY id")]
    assert len(trials) == 2
    for t in trials:
        assert re.search(rf"^\[trial {t} run 1\] \[rank=0\] INFO: \[\d+\] det\.harness: trial "
                         rf"{t} of experiment 1: starting at batch 0 ", out, re.M), out
        assert re.search(rf"^\[trial {t} run 1\] \[rank=0\] .*det\.harness: trial finished: "
                         "completed", out, re.M), out
    assert out.splitlines() == det("experiment", "logs", "1").stdout.splitlines()
