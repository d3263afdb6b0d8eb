"""Checkpoint storage errors (issue 39, item 5): a full disk is one line naming the storage
path and the OS error, stored as the run's exit reason, and pauses the experiment instead of
spending restarts; checkpoints appear in storage only whole, and what crashed runs leave is
swept by the GC task.
"""

import errno
import os
import subprocess
import time
from pathlib import Path

import psycopg
import pytest
from conftest import wait_for
from test_harness_db_faults import claim_allocation
from test_reconciler import state

from det.harness.checkpoint_gc import GcTask
from det.harness.errors import CheckpointStorageError
from det.harness.storage import STAGING, storage_from_config, storage_os_error
from det.reconciler.trials import RunEnd, settle

TRAIN = """
import torch
from det.harness import core
with core.init() as ctx:
    ctx.train.report_training_metrics(1, {"loss": 1.0})
    with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
        torch.save(torch.zeros(1 << 20), path / "model.pt")  # 4 MiB, on a 3 MiB disk
    print("CHECKPOINTED", flush=True)
"""


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 3 MiB tmpfs (root only, as in the issue's fault injection)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_checkpoint_disk_pauses_the_experiment_with_the_reason(
        det, conn, tmp_path: Path, tiny_disk: Path) -> None:
    """Before issue 39 the run ended with torch's `unexpected pos` and no exit reason, and
    each restart failed at the same checkpoint until max_restarts was spent."""
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "train.py").write_text(TRAIN)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("name: full-disk\nentrypoint: python3 train.py\nmax_restarts: 3\n"
                   "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n"
                   f"checkpoint_storage: {{type: shared_fs, host_path: {tiny_disk}}}\n")
    det("experiment", "create", str(cfg), str(ctx))
    det.start("reconciler", "reconcile", "--interval", "0.5")
    det.start("agent", "agent", "run", "--slots", "1")
    wait_for(lambda: state(conn, "experiments") == "PAUSED", 120, "the experiment to pause")
    line = f"checkpoint storage {tiny_disk}: [Errno 28] No space left on device"
    run = conn.execute("SELECT exit_code, storage_error FROM allocations").fetchall()
    assert len(run) == 1 and run[0]["exit_code"] != 0 and run[0]["storage_error"] == line
    trial = conn.execute("SELECT state::text AS s, restarts FROM trials").fetchone()
    assert trial == {"s": "PAUSED", "restarts": 0}
    logs = det("trial", "logs", "1")
    assert f"det.harness: {line}" in logs.stdout + logs.stderr
    assert "the experiment is paused" in logs.stdout
    assert f"paused by the cluster: trial 1: {line}" in det("experiment", "describe",
                                                            "1").stdout
    assert line in det("trial", "describe", "1").stdout
    assert [n for n in os.listdir(tiny_disk) if n != "tensorboard"] == []  # no half one
    time.sleep(2)  # a few passes: nothing restarts it
    assert conn.execute("SELECT count(*) AS n FROM allocations").fetchone()["n"] == 1
    det("experiment", "activate", "1")
    assert conn.execute("SELECT paused_reason FROM experiments").fetchone() == {
        "paused_reason": None}


def test_settle_pauses_on_a_storage_error_without_a_restart() -> None:
    run = RunEnd("ACTIVE", restarts=1, max_restarts=1, exit_code=1, exit_reason="x",
                 storage_error="checkpoint storage /x: [Errno 28] No space left on device")
    assert settle(run).state == "PAUSED" and settle(run).restarts == 1
    assert settle(run).pause_experiment and not settle(run).failed
    planned = RunEnd("ACTIVE", 0, 0, -9, "agent shut down", planned_stop=True,
                     storage_error="checkpoint storage /x: [Errno 5] Input/output error")
    assert not settle(planned).pause_experiment
    stopping = RunEnd("STOPPING_KILLED", 0, 0, 1, None, storage_error="y")
    assert settle(stopping).state == "STOPPING_KILLED"


def test_a_storage_errno_is_found_in_the_chain(tmp_path: Path) -> None:
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "model.pt"))
        except OSError as inner:
            raise RuntimeError("[enforce fail at inline_container.cc:595] . unexpected pos") \
                from inner
    except RuntimeError as e:
        assert storage_os_error(e, tmp_path) == errno.EROFS
    assert storage_os_error(RuntimeError("unrelated"), tmp_path) is None
    assert storage_os_error(OSError(errno.ENOENT, "gone"), tmp_path) is None
    elsewhere = PermissionError(errno.EACCES, "Permission denied", "/data/train.csv")
    assert storage_os_error(elsewhere, tmp_path) is None


def test_a_failed_checkpoint_leaves_nothing_and_a_good_one_appears_whole(
        tmp_path: Path) -> None:
    storage = storage_from_config({"type": "shared_fs", "host_path": str(tmp_path)})
    with pytest.raises(ValueError), \
            storage.store_dir("11111111-1111-1111-1111-111111111111") as path:
        (path / "a").write_text("half")
        assert not Path(storage.url("11111111-1111-1111-1111-111111111111")).exists()
        raise ValueError("the user's code failed")
    assert not (tmp_path / "11111111-1111-1111-1111-111111111111").exists()
    assert os.listdir(tmp_path) == []
    with storage.store_dir("22222222-2222-2222-2222-222222222222") as path:
        (path / "a").write_text("whole")
    assert (tmp_path / "22222222-2222-2222-2222-222222222222" / "a").read_text() == "whole"


def test_a_full_disk_under_torch_is_one_storage_error(tiny_disk: Path) -> None:
    torch = pytest.importorskip("torch")
    storage = storage_from_config({"type": "shared_fs", "host_path": str(tiny_disk)})
    with pytest.raises(CheckpointStorageError) as raised, \
            storage.store_dir("33333333-3333-3333-3333-333333333333") as path:
        torch.save(torch.zeros(1 << 20), path / "model.pt")
    assert str(raised.value) == (f"checkpoint storage {tiny_disk}: [Errno 28] No space left "
                                 "on device")
    assert os.listdir(tiny_disk) == []


def test_gc_sweeps_what_crashed_runs_left(db_url: str, tmp_path: Path) -> None:
    """A published directory no row names and a staging directory, both old, are removed;
    a recorded checkpoint, a young leftover and other files stay."""
    storage_dir = tmp_path / "storage"
    alloc = claim_allocation(db_url, storage_dir)
    recorded = "44444444-4444-4444-4444-444444444444"
    orphan = "55555555-5555-5555-5555-555555555555"
    young = "66666666-6666-6666-6666-666666666666"
    staged = "77777777-7777-7777-7777-777777777777"
    for d in (recorded, orphan, young, STAGING + staged, "tensorboard/1"):
        (storage_dir / d).mkdir(parents=True)
        (storage_dir / d / "f").write_text("x")
    old = time.time() - 7200
    for d in (recorded, orphan, STAGING + staged, "tensorboard/1"):
        for p in (storage_dir / d, storage_dir / d / "f"):
            os.utime(p, (old, old))
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT det_task.report_checkpoint(%s, %s, 1, '{}', '{}')",
                  (alloc.token, recorded))
        gc_id = c.execute(
            "INSERT INTO allocations (job_id, run, resource_pool, slots_needed, spec, state, "
            "agent_id) SELECT job_id, 1, 'default', 0, '{\"kind\": \"checkpoint_gc\"}', "
            "'ASSIGNED', 'a1' FROM experiments WHERE id = %s RETURNING id",
            (alloc.experiment_id,)).fetchone()[0]
        token = c.execute("SELECT det_agent.claim('a1', %s)", (gc_id,)).fetchone()[0]
    task = GcTask(db_url, token)
    try:
        task._storage({"type": "shared_fs", "host_path": str(storage_dir)})
        removed = task.sweep()
    finally:
        task.close()
    assert sorted(removed) == sorted([str(storage_dir / orphan),
                                      str(storage_dir / (STAGING + staged))])
    assert sorted(os.listdir(storage_dir)) == sorted([recorded, young, "tensorboard"])
