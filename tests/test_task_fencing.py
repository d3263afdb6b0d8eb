"""Fencing, the task's side (issue 39, item 3): a task whose allocation the cluster ended (its
agent declared lost, the run killed: the token revoked) stops at once with one line, and a
checkpoint of a fenced run leaves no files behind.
"""

import subprocess
import sys
import time
from pathlib import Path

import psycopg
from psycopg.rows import dict_row
from test_harness_db_faults import Allocation, claim_allocation

from det.harness.transport import FENCED_EXIT_STATUS, PREEMPT_POLL_SECONDS

CORE_TASK = """
import pathlib, sys, time
from det.harness import core
with core.init() as ctx:
    print("STARTED", flush=True)
    go = pathlib.Path(sys.argv[1])
    while not go.exists():  # trains without a word to the platform
        time.sleep(0.05)
    {after}
    time.sleep(120)
"""


def start_task(alloc: Allocation, tmp_path: Path, after: str = "pass") -> subprocess.Popen:
    """A Core API task of ``alloc`` that, once it started, waits for the file ``go``, then
    runs ``after`` and idles for two minutes."""
    script = tmp_path / "task.py"
    script.write_text(CORE_TASK.format(after=after))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "go")],
                            env=alloc.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "STARTED"
    return proc


def end_allocation(alloc: Allocation) -> None:
    """What the reconciler does to a lost agent's allocation: TERMINATED, so det_internal.auth
    refuses its token from now on."""
    with psycopg.connect(alloc.url, autocommit=True) as c:
        c.execute("UPDATE allocations SET state = 'TERMINATED', ended_at = now(), "
                  "exit_reason = 'agent lost' WHERE id = %s", (alloc.id,))


def assert_fenced(proc: subprocess.Popen, alloc: Allocation, within: float) -> None:
    """``proc`` ends within ``within`` seconds with the fenced status and one line."""
    try:
        _, err = proc.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the fenced task ran on past {within} s; stderr:\n{err}") from None
    assert proc.returncode == FENCED_EXIT_STATUS, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines == [f"det.harness: allocation {alloc.id} was ended by the cluster (invalid "
                     "or expired allocation token); stopping this process"], err


def test_a_task_whose_allocation_was_ended_stops_within_a_watcher_poll(
        db_url: str, tmp_path: Path) -> None:
    """The task reports nothing after the revocation: only the preemption watcher can see it
    (before issue 39 it printed the error and watched on, so the task trained on)."""
    alloc = claim_allocation(db_url, tmp_path / "storage")
    proc = start_task(alloc, tmp_path)
    (tmp_path / "go").touch()
    started = time.monotonic()
    end_allocation(alloc)
    assert_fenced(proc, alloc, within=PREEMPT_POLL_SECONDS + 10)
    assert time.monotonic() - started < PREEMPT_POLL_SECONDS + 10


def test_a_report_of_an_ended_allocation_ends_the_task_with_one_line(
        db_url: str, tmp_path: Path) -> None:
    """A checkpoint report refused for the token is the same one line, not psycopg's
    traceback."""
    alloc = claim_allocation(db_url, tmp_path / "storage")
    proc = start_task(alloc, tmp_path, after=(
        "ctx.train.report_training_metrics(1, {'loss': 1.0}); "
        "ctx.checkpoint._transport.report_checkpoint("
        "'00000000-0000-0000-0000-000000000001', 1, {}, {})"))
    end_allocation(alloc)
    (tmp_path / "go").touch()
    assert_fenced(proc, alloc, within=PREEMPT_POLL_SECONDS + 10)
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        assert c.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"] == 0


def leftovers(storage: Path) -> list[str]:
    """Every file under ``storage`` (checkpoints, staged ones), relative."""
    return sorted(str(p.relative_to(storage)) for p in storage.rglob("*") if p.is_file())


def test_a_fenced_run_writes_no_checkpoint_file(db_url: str, tmp_path: Path) -> None:
    """The run was ended before it began a checkpoint: det_task.checkpoint_begin refuses it before
    a file is written (before issue 39 the files were written, then the record refused: an
    orphan directory that no GC removed)."""
    alloc = claim_allocation(db_url, tmp_path / "storage")
    proc = start_task(alloc, tmp_path, after=(
        "with ctx.checkpoint.store_path({'steps_completed': 1}) as (p, _):\n"
        "        (p / 'model.bin').write_bytes(b'x' * 1000)"))
    end_allocation(alloc)
    (tmp_path / "go").touch()
    assert_fenced(proc, alloc, within=PREEMPT_POLL_SECONDS + 10)
    assert leftovers(tmp_path / "storage") == []


def test_a_checkpoint_whose_record_is_refused_is_removed(db_url: str, tmp_path: Path) -> None:
    """The run is ended while it writes a checkpoint: its files are removed before the
    process ends, so none is left without a row."""
    alloc = claim_allocation(db_url, tmp_path / "storage")
    proc = start_task(alloc, tmp_path, after=(
        "with ctx.checkpoint.store_path({'steps_completed': 1}) as (p, _):\n"
        "        (p / 'model.bin').write_bytes(b'x' * 1000)\n"
        "        print('WRITTEN', flush=True)\n"
        "        while not (go.parent / 'go2').exists(): time.sleep(0.02)"))
    (tmp_path / "go").touch()
    assert proc.stdout is not None and proc.stdout.readline().strip() == "WRITTEN"
    assert [f.rsplit("/", 1)[-1] for f in leftovers(tmp_path / "storage")] == ["model.bin"]
    end_allocation(alloc)
    (tmp_path / "go2").touch()
    assert_fenced(proc, alloc, within=PREEMPT_POLL_SECONDS + 10)
    assert leftovers(tmp_path / "storage") == []
    with psycopg.connect(db_url, row_factory=dict_row) as c:
        assert c.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"] == 0
