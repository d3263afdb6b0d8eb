"""Checkpoint GC (issue 16): the keep rule, pins, the CLI, and the GC task end to end,
including one killed half-way."""

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from conftest import wait_for

# (name, trials as [(steps, metric or None)], policy (seb, stb, stl), smaller_is_better,
#  deleted as {(trial index, checkpoint index)})
KEEP_RULE = [
    ("defaults keep the best and the latest",
     [[(10, 0.5), (20, 0.3), (30, 0.4)]], (0, 1, 1), True, {(0, 0)}),
    ("no metric anywhere: only the latest",
     [[(10, None), (20, None), (30, None)]], (0, 1, 1), True, {(0, 0), (0, 1)}),
    ("no metric at its step is never best",
     [[(10, 0.1), (20, None), (30, None)]], (0, 1, 1), True, {(0, 1)}),
    ("a metric that is not a number is no metric",
     [[(10, "low"), (20, 0.9), (30, None)]], (0, 1, 0), True, {(0, 0), (0, 2)}),
    ("tied best are all kept",
     [[(10, 0.2), (20, 0.2), (30, 0.5)]], (0, 1, 1), True, set()),
    ("equal metrics everywhere: all tie for best",
     [[(10, 0.3), (20, 0.3), (30, 0.3)]], (0, 1, 0), True, set()),
    ("larger is better",
     [[(10, 0.9), (20, 0.1), (30, 0.5)]], (0, 1, 0), False, {(0, 1), (0, 2)}),
    ("experiment best across trials",
     [[(10, 0.1), (20, 0.9)], [(10, 0.5), (20, 0.6)]], (1, 0, 0), True,
     {(0, 1), (1, 0), (1, 1)}),
    ("experiment best tied across trials",
     [[(10, 0.1)], [(10, 0.1), (20, 0.7)]], (1, 0, 0), True, {(1, 1)}),
    ("0/0/0 deletes everything",
     [[(10, 0.1), (20, 0.2)], [(10, None)]], (0, 0, 0), True, {(0, 0), (0, 1), (1, 0)}),
    ("two latest",
     [[(10, None), (20, None), (30, None)]], (0, 0, 2), True, {(0, 0)}),
    ("the union of the three",
     [[(10, 0.1), (20, 0.5), (30, 0.7), (40, None)], [(10, 0.2), (20, 0.05)]], (1, 1, 1), True,
     {(0, 1), (0, 2), (1, 0)}),
    ("ranks over trials are per trial",
     [[(10, 0.9), (20, 0.8)], [(10, 0.1), (20, 0.2)]], (0, 1, 0), True, {(0, 0), (1, 1)}),
]


@pytest.mark.parametrize(("trials", "policy", "smaller", "deleted"),
                         [case[1:] for case in KEEP_RULE], ids=[case[0] for case in KEEP_RULE])
def test_keep_rule(ended, conn, trials, policy, smaller, deleted) -> None:
    eid, uuids = ended.make(trials, policy=policy, smaller_is_better=smaller)
    want = {uuids[t][i] for t, i in deleted}
    got = {str(r["uuid"]) for r in conn.execute(
        "SELECT uuid FROM det_user.checkpoints_to_delete(%s)", (eid,))}
    assert got == want
    # Applying it marks exactly those DELETING; applying it again decides nothing more.
    assert conn.execute("SELECT det_internal.checkpoint_gc(%s) AS n",
                        (eid,)).fetchone()["n"] == len(want)
    deleting = {str(r["uuid"]) for r in conn.execute(
        "SELECT uuid FROM checkpoints WHERE state = 'DELETING'")}
    assert deleting == want
    assert conn.execute("SELECT count(*) AS n FROM det_user.checkpoints_to_delete(%s)",
                        (eid,)).fetchone()["n"] == 0


def test_pinned_checkpoints_survive_0_0_0(ended, conn) -> None:
    """A checkpoint another experiment warm-starts from is never deleted, by policy or user."""
    eid, uuids = ended.make([[(10, 0.1), (20, 0.2)]], policy=(0, 0, 0))
    pinned = uuids[0][0]
    ended.make([[(10, 0.3)]], searcher_extra=f", source_checkpoint_uuid: '{pinned}'")
    got = {str(r["uuid"]) for r in conn.execute(
        "SELECT uuid FROM det_user.checkpoints_to_delete(%s)", (eid,))}
    assert got == {uuids[0][1]}
    with pytest.raises(Exception, match="is pinned"):
        conn.execute("SELECT det_user.delete_checkpoints(%s::uuid[])", ([pinned],))
    with pytest.raises(Exception, match="is pinned"):
        conn.execute("SELECT det_user.experiment_delete(%s)", (eid,))


def test_pin_made_after_marking_is_put_back(ended, conn) -> None:
    """A checkpoint pinned after GC marked it DELETING is never handed to a GC task."""
    eid, uuids = ended.make([[(10, 0.1), (20, 0.2)]], policy=(0, 0, 0))
    conn.execute("SELECT det_internal.checkpoint_gc(%s)", (eid,))
    ended.make([[(10, 0.3)]], searcher_extra=f", source_checkpoint_uuid: '{uuids[0][0]}'")
    assert conn.execute("SELECT det_internal.unpin_deleting() AS n").fetchone()["n"] == 1
    state = conn.execute("SELECT state FROM checkpoints WHERE uuid = %s",
                         (uuids[0][0],)).fetchone()["state"]
    assert state == "COMPLETED"


def states(conn, eid: int) -> dict[str, str]:
    return {str(r["uuid"]): r["state"] for r in conn.execute(
        "SELECT c.uuid, c.state FROM checkpoints c JOIN trials t ON t.id = c.trial_id "
        "WHERE t.experiment_id = %s", (eid,))}


def test_set_gc_policy_previews_asks_and_applies(det, ended, conn) -> None:
    eid, uuids = ended.make([[(10, 0.5), (20, 0.3), (30, 0.4)]], policy=(0, 1, 1))
    args = ("experiment", "set", "gc-policy", "--save-experiment-best", "0",
            "--save-trial-best", "0", "--save-trial-latest", "1", str(eid))
    r = det(*args, check=False, input="n\n")
    assert r.returncode != 0 and uuids[0][0] in r.stdout and uuids[0][1] in r.stdout
    assert uuids[0][2] not in r.stdout  # the latest is kept
    assert set(states(conn, eid).values()) == {"COMPLETED"}  # said no: nothing changed
    r = det(*args, "--yes")
    assert "2 checkpoint(s) DELETING" in r.stdout
    assert states(conn, eid) == {uuids[0][0]: "DELETING", uuids[0][1]: "DELETING",
                                 uuids[0][2]: "COMPLETED"}
    cfg = conn.execute("SELECT config -> 'checkpoint_storage' AS s FROM experiments WHERE id = %s",
                       (eid,)).fetchone()["s"]
    assert (cfg["save_experiment_best"], cfg["save_trial_best"], cfg["save_trial_latest"]) == \
        (0, 0, 1)
    listing = det("checkpoint", "list", str(eid)).stdout
    assert listing.count("DELETING") == 2 and "COMPLETED" in listing and " 64 B " in listing
    r = det(*args[:-1], "-1", check=False)  # a negative count is refused by the option
    assert r.returncode != 0


def test_delete_and_archive_refused_while_running(det, ended) -> None:
    eid, uuids = ended.make([[(10, 0.5)]], ended=False)
    for args in (("checkpoint", "delete", "--yes", uuids[0][0]),
                 ("experiment", "delete", "--yes", str(eid)),
                 ("experiment", "archive", str(eid))):
        r = det(*args, check=False)
        assert r.returncode == 1 and "ACTIVE" in r.stderr and len(r.stderr.splitlines()) == 1
    r = det("checkpoint", "delete", "--yes", "00000000-0000-0000-0000-000000000000",
            check=False)
    assert r.returncode == 1 and "not found" in r.stderr


def test_archive_hides_from_default_list(det, ended) -> None:
    eid, _ = ended.make([[(10, 0.5)]])
    det("experiment", "archive", str(eid))
    assert det("experiment", "list").stdout.count("\n") == 2  # header and rule only
    assert " gc " in det("experiment", "list", "--all").stdout
    det("experiment", "unarchive", str(eid))
    assert " gc " in det("experiment", "list").stdout


def gc_processes(agent_dir: Path) -> list[int]:
    """Pids of running GC tasks (python -m det.harness.checkpoint_gc) of the agent whose work
    directory is ``agent_dir`` (a task runs in it; other tests' tasks may run beside)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"det.harness.checkpoint_gc" in Path(f"/proc/{pid}/cmdline").read_bytes() \
                    and Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(agent_dir):
                out.append(int(pid))
        except OSError:
            pass
    return out


def test_gc_task_removes_files_then_delete_removes_rows(det, ended, conn, tmp_path) -> None:
    """End to end through the reconciler and an agent: GC after the experiment ended removes
    the files of what the policy drops, records the bytes freed; `det experiment delete`
    removes the rest and then every row."""
    eid, uuids = ended.make([[(10, 0.5), (20, 0.3), (30, 0.4)], [(10, None), (20, None)]],
                            file_bytes=1000)
    conn.execute("SELECT det_internal.checkpoint_gc(%s)", (eid,))  # as the pass that ended it does
    gone = {uuids[0][0], uuids[1][0]}
    det.start("reconciler", "reconcile", "--interval", "0.2")
    det.start("agent", "agent", "run", "--id", "a1", "--work-dir", str(tmp_path / "agent"))
    wait_for(lambda: set(states(conn, eid).values()) == {"COMPLETED", "DELETED"}, 60,
             "the GC task to finish")
    assert {u for u, s in states(conn, eid).items() if s == "DELETED"} == gone
    for u in gone:
        assert not (ended.storage / u).exists()
    for u in {uuids[0][1], uuids[0][2], uuids[1][1]}:
        assert (ended.storage / u / "state.bin").is_file()
    freed = conn.execute("SELECT sum(freed_bytes) AS b FROM reporting.checkpoints "
                         "WHERE experiment_id = %s AND state = 'DELETED'", (eid,)).fetchone()["b"]
    assert freed == 2000
    gc = conn.execute("SELECT state, exit_code, slots_needed, settled FROM allocations "
                      "WHERE spec ->> 'kind' = 'checkpoint_gc'").fetchall()
    wait_for(lambda: conn.execute("SELECT bool_and(settled) AS s FROM allocations").fetchone()["s"],
             30, "the GC task to be settled")
    assert len(gc) == 1 and gc[0]["slots_needed"] == 0

    det("experiment", "delete", "--yes", str(eid))
    wait_for(lambda: conn.execute("SELECT count(*) AS n FROM experiments").fetchone()["n"] == 0,
             60, "the experiment's rows to go")
    assert not any(ended.storage.iterdir())
    for table in ("trials", "checkpoints", "metrics", "allocations", "jobs", "task_logs"):
        assert conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"] == 0, table


def test_gc_killed_half_way_finishes_on_the_next_run(det, ended, conn, db_url, tmp_path) -> None:
    """A GC task SIGKILLed half-way (first batch DELETED, the second's files removed but its
    rows not yet marked) is finished by the next one; the kept checkpoints stay."""
    eid, uuids = ended.make([[(s, None) for s in range(1, 301)]], policy=(0, 0, 1))
    conn.execute("SELECT det_internal.checkpoint_gc(%s)", (eid,))
    # Hold the lock of a checkpoint in the second batch: the task blocks marking it DELETED.
    hold = psycopg.connect(db_url, autocommit=False)
    hold.execute("SELECT 1 FROM checkpoints WHERE uuid = %s FOR UPDATE", (uuids[0][150],))
    det.start("reconciler", "reconcile", "--interval", "0.2")
    det.start("agent", "agent", "run", "--id", "a1", "--work-dir", str(tmp_path / "agent"))
    try:
        wait_for(lambda: not (ended.storage / uuids[0][199]).exists(), 60,
                 "the second batch's files to be removed")
        assert states(conn, eid)[uuids[0][150]] == "DELETING"
        pids = wait_for(lambda: gc_processes(tmp_path / "agent"), 10, "the GC task's process")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert list(states(conn, eid).values()).count("DELETED") == 100  # the first batch
    finally:
        hold.rollback()
        hold.close()
    wait_for(lambda: list(states(conn, eid).values()).count("DELETED") == 299, 60,
             "the next GC task to finish")
    wait_for(lambda: conn.execute(
        "SELECT bool_and(state = 'TERMINATED') AS done FROM allocations "
        "WHERE spec ->> 'kind' = 'checkpoint_gc'").fetchone()["done"], 30,
        "the GC tasks to end")
    assert (ended.storage / uuids[0][299] / "state.bin").is_file()  # the latest is kept
    assert sorted(p.name for p in ended.storage.iterdir()) == [uuids[0][299]]
    runs = conn.execute("SELECT exit_code FROM allocations WHERE spec ->> 'kind' = "
                        "'checkpoint_gc' ORDER BY id").fetchall()
    assert [r["exit_code"] for r in runs][-1] == 0 and len(runs) == 2
    assert conn.execute("SELECT checkpoint_gc_error FROM experiments WHERE id = %s",
                        (eid,)).fetchone()["checkpoint_gc_error"] is None


@contextmanager
def undeletable(path: Path) -> Iterator[None]:
    """Files in directory ``path`` cannot be removed meanwhile: made read-only, or for root
    (whom permissions do not stop) immutable with chattr."""
    if os.geteuid() != 0:
        path.chmod(0o500)
        try:
            yield
        finally:
            path.chmod(0o700)
        return
    r = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make {path} immutable as root: {r.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_storage_error_is_shown_on_the_experiment(det, ended, conn, tmp_path) -> None:
    """A GC task that cannot remove files says why on the experiment, and is retried only a
    few times; asking again retries."""
    eid, uuids = ended.make([[(10, None), (20, None)]])
    conn.execute("SELECT det_internal.checkpoint_gc(%s)", (eid,))
    locked = ended.storage / uuids[0][0]
    with undeletable(locked):
        det.start("reconciler", "reconcile", "--interval", "0.2")
        det.start("agent", "agent", "run", "--id", "a1", "--work-dir", str(tmp_path / "agent"))
        wait_for(lambda: conn.execute(
            "SELECT count(*) AS n FROM allocations WHERE spec ->> 'kind' = 'checkpoint_gc' "
            "AND state = 'TERMINATED'").fetchone()["n"] == 3, 90, "three failed GC tasks")
        describe = det("experiment", "describe", str(eid)).stdout
        assert "checkpoint GC failed" in describe and uuids[0][0] in describe
        assert "PermissionError" in describe
    det("checkpoint", "delete", "--yes", uuids[0][0])
    wait_for(lambda: states(conn, eid)[uuids[0][0]] == "DELETED", 60, "the retried GC")
    assert not locked.exists()
    assert conn.execute("SELECT checkpoint_gc_error FROM experiments").fetchone()[
        "checkpoint_gc_error"] is None


def test_only_a_gc_task_may_remove_checkpoints(ended, conn) -> None:
    """A trial's token cannot mark checkpoints DELETED or fetch what GC would remove."""
    eid, uuids = ended.make([[(10, None), (20, None)]], policy=(0, 0, 0))
    conn.execute("SELECT det_internal.checkpoint_gc(%s)", (eid,))
    conn.execute("SELECT det_agent.register('a1', 'h', 'default', 'process', '[]')")
    alloc = conn.execute(
        "INSERT INTO allocations (job_id, trial_id, run, resource_pool, slots_needed, spec, "
        "state, agent_id) SELECT e.job_id, t.id, 2, 'default', 0, '{\"kind\": \"trial\"}', "
        "'ASSIGNED', 'a1' FROM experiments e JOIN trials t ON t.experiment_id = e.id "
        "WHERE e.id = %s RETURNING id", (eid,)).fetchone()["id"]
    token = conn.execute("SELECT det_agent.claim('a1', %s) AS t", (alloc,)).fetchone()["t"]
    for sql, args in (("SELECT det_task.gc_task_deleted(%s, %s::uuid[])", (token, uuids[0])),
                      ("SELECT * FROM det_task.gc_task_checkpoints(%s, 10)", (token,)),
                      ("SELECT det_task.gc_task_failed(%s, 'x')", (token,))):
        with pytest.raises(psycopg.Error, match="only a checkpoint GC task"):
            conn.execute(sql, args)
    assert set(states(conn, eid).values()) == {"DELETING"}


def test_policy_set_while_running_applies_when_the_experiment_ends(det, ended, conn) -> None:
    """GC runs in the pass that ends the experiment, with the policy as last set."""
    eid, uuids = ended.make([[(10, 0.1), (20, 0.5), (30, 0.9)]], ended=False)
    r = det("experiment", "set", "gc-policy", "--save-experiment-best", "0",
            "--save-trial-best", "0", "--save-trial-latest", "1", str(eid), input="y\n")
    assert "when the experiment ends" in r.stdout and "0 checkpoint(s) DELETING" in r.stdout
    assert set(states(conn, eid).values()) == {"COMPLETED"}
    conn.execute("UPDATE experiments SET state = 'STOPPING_COMPLETED' WHERE id = %s", (eid,))
    det("reconcile", "--once")
    assert conn.execute("SELECT state::text AS s FROM experiments WHERE id = %s",
                        (eid,)).fetchone()["s"] == "COMPLETED"
    assert states(conn, eid) == {uuids[0][0]: "DELETING", uuids[0][1]: "DELETING",
                                 uuids[0][2]: "COMPLETED"}
    gc = conn.execute("SELECT slots_needed, state::text AS s FROM allocations "
                      "WHERE spec ->> 'kind' = 'checkpoint_gc'").fetchall()
    assert gc == [{"slots_needed": 0, "s": "PENDING"}]  # waits for an agent to run it


def test_download_errors_are_one_line(det, ended, conn, tmp_path) -> None:
    eid, uuids = ended.make([[(10, None), (20, None)]])
    out = tmp_path / "out"
    det("checkpoint", "download", uuids[0][1], "-o", str(out))
    assert (out / "state.bin").read_bytes() == b"x" * 64
    # issue 34: the start of the uuid will do, and the directory defaults to
    # ./checkpoints/UUID
    r = subprocess.run([sys.executable, "-m", "det.cli.main", "checkpoint", "download",
                        uuids[0][1][:8].upper()], cwd=tmp_path, env=det.env,
                       capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout.strip() == f"Checkpoint {uuids[0][1]} downloaded to checkpoints/{uuids[0][1]}"
    assert (tmp_path / "checkpoints" / uuids[0][1] / "state.bin").read_bytes() == b"x" * 64
    r = det("checkpoint", "download", "", check=False)
    assert r.returncode == 1 and r.stderr.strip() == "Error: checkpoint  not found"
    conn.execute("SELECT det_internal.checkpoint_gc(%s)", (eid,))
    r = det("checkpoint", "download", uuids[0][0], "-o", str(out), check=False)
    assert r.returncode == 1 and r.stderr.strip() == f"Error: checkpoint {uuids[0][0]} is DELETING"
    for child in (ended.storage / uuids[0][1]).iterdir():
        child.unlink()
    (ended.storage / uuids[0][1]).rmdir()
    r = det("checkpoint", "download", uuids[0][1], "-o", str(out), check=False)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "not found at" in r.stderr


def test_delete_without_files_is_immediate(det, ended, conn) -> None:
    """With no checkpoint files left to remove, `det experiment delete` removes the rows at
    once, in its own transaction; answering no changes nothing."""
    eid, _ = ended.make([[], []])
    r = det("experiment", "delete", str(eid), check=False, input="n\n")
    assert r.returncode != 0
    assert conn.execute("SELECT delete_requested_at FROM experiments WHERE id = %s",
                        (eid,)).fetchone()["delete_requested_at"] is None
    assert det("experiment", "delete", str(eid), input="y\n").stdout.strip().endswith(
        f"Experiment {eid}: deleted")
    for table in ("experiments", "trials", "allocations", "jobs"):
        assert conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()["n"] == 0, table
